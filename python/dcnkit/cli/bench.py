"""``dcnkit bench m.onnx``: latency percentiles (p50/p90/p99) and throughput per backend."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from dcnkit.cli.backend_args import (FAST_BACKENDS, add_device_arg, add_kit_kernels_arg, make_runner_cli, parse_backends,
                                     require_backends)
from dcnkit.cli.feeds import add_input_args, feeds_for
from dcnkit.cli.shared import CliError, check_model_path, progress


def bench_runner(runner, feeds, warmup: int, iterations: int, desc: str = "") -> np.ndarray:
    for _ in range(warmup):
        runner.run(feeds)
    times = []
    for _ in progress(range(iterations), desc=desc, unit="it"):
        t0 = time.perf_counter()
        runner.run(feeds)
        times.append(time.perf_counter() - t0)
    return np.asarray(times)


def cmd_bench(args) -> int:
    from dcnkit.runtime.registry import available_backends

    check_model_path(args.model)
    if args.iterations < 1:
        raise CliError("--iterations", f"expected >= 1, got {args.iterations}")
    if args.warmup < 0:
        raise CliError("--warmup", f"expected >= 0, got {args.warmup}")
    if args.batch < 1:
        raise CliError("--batch", f"expected >= 1, got {args.batch}")
    avail = available_backends()
    requested = parse_backends(args.backends)
    from dcnkit.runtime.tensorrt import is_engine_file

    if requested is None and is_engine_file(args.model):
        requested = ["tensorrt"]
    require_backends(requested, avail)
    if requested is None:
        requested = [b for b in FAST_BACKENDS if avail[b] is None] or ["ort-cpu"]
    rows = []
    for b in requested:
        if avail.get(b) is not None:
            print(f"{b} skipped: {avail[b]}")
            continue
        with make_runner_cli(args.model, b, "--backends", kit_kernels=args.kit_kernels, device=args.device) as runner:
            feeds = feeds_for(args, runner.inputs())
            times = bench_runner(runner, feeds, args.warmup, args.iterations, desc=b)
        batch = next(iter(feeds.values())).shape[0] if feeds and next(iter(feeds.values())).ndim else 1
        p50, p90, p99 = np.percentile(times, [50, 90, 99]) * 1e3
        rows.append(dict(backend=b, batch=int(batch), iterations=len(times), p50_ms=p50, p90_ms=p90, p99_ms=p99,
                         mean_ms=float(times.mean() * 1e3), throughput=float(batch / times.mean())))
    if not rows:
        raise CliError("--backends", f"expected at least one usable backend, got none of {requested}")
    print(f"{'backend':<12} {'batch':>5} {'iters':>6} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} {'samples/s':>11}")
    for r in rows:
        print(f"{r['backend']:<12} {r['batch']:>5} {r['iterations']:>6} {r['p50_ms']:>9.3f} {r['p90_ms']:>9.3f} "
              f"{r['p99_ms']:>9.3f} {r['throughput']:>11.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


def register(sub) -> None:
    """Adds the command to the CLI's subparsers."""
    p = sub.add_parser("bench", help="latency percentiles and throughput per backend",
                       description="Time model inference: p50/p90/p99 latency and throughput per backend.")
    p.add_argument("model", help="ONNX file")
    p.add_argument("--backends", help="comma-separated (default: every available fast backend)")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs first (default 5)")
    p.add_argument("--iterations", type=int, default=50, help="timed runs (default 50)")
    p.add_argument("--json", help="also write the results to this JSON file")
    add_kit_kernels_arg(p)
    add_device_arg(p)
    add_input_args(p)
    p.set_defaults(func=cmd_bench)
