"""Benchmark: dcnkit deform_conv2d (DCNv2, 3x3, pad 1) vs dense conv2d and torchvision, same run.

    python benchmarks/bench_deform_conv2d.py [--threads 2] [--repeat 7] [--json out.json] [--device cpu]

For every shape: forward and forward+backward (gradients for input, offset, mask, weight, bias) of
dcnkit, of ``torch.nn.functional.conv2d`` with the same shapes (what a deformable layer replaces), and of
``torchvision.ops.deform_conv2d``. Each timing is the median of ``--repeat`` runs after warm-up;
milliseconds and ratios are printed as a table. ``--stat min`` reports the best run instead (useful
on a machine shared with other work).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = [(1, 64, 64, 64), (4, 256, 32, 32), (8, 32, 128, 128)]


_STAT = statistics.median


def _time(fn, repeat: int, warmup: int, sync) -> float:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return _STAT(times) * 1e3


def _inputs(n, c, h, w, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = 3
    x = torch.randn(n, c, h, w, generator=g)
    weight = torch.randn(c, c, k, k, generator=g) / (c * k * k) ** 0.5
    bias = torch.randn(c, generator=g)
    offset = torch.randn(n, 2 * k * k, h, w, generator=g) * 2.0
    mask = torch.rand(n, k * k, h, w, generator=g)
    return [t.to(device) for t in (x, offset, weight, bias, mask)]


def bench_shape(shape, repeat, device, skip_torchvision=False):
    import dcnkit.ops as dops

    tv = None
    if not skip_torchvision:
        try:
            import torchvision.ops as tv
        except ImportError:
            tv = None
    x, offset, weight, bias, mask = _inputs(*shape, device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def dcn(x, offset, weight, bias, mask):
        return dops.deform_conv2d(x, offset, weight, bias, 1, 1, 1, mask)

    def tvf(x, offset, weight, bias, mask):
        return tv.deform_conv2d(x, offset, weight, bias, (1, 1), (1, 1), (1, 1), mask)

    def conv(x, offset, weight, bias, mask):
        return F.conv2d(x, weight, bias, 1, 1)

    impls = {"dcnkit": dcn, "conv2d": conv}
    if tv is not None:
        impls["torchvision"] = tvf
    row = {"shape": list(shape)}
    warm = 10  # steady state: first calls pay for thread start-up and allocator growth
    for name, f in impls.items():
        with torch.no_grad():
            row[f"{name}_fwd_ms"] = _time(lambda: f(x, offset, weight, bias, mask), repeat, warm, sync)
        leaves = [t.detach().clone().requires_grad_() for t in (x, offset, weight, bias, mask)]
        gout = torch.ones(x.shape[0], weight.shape[0], x.shape[2], x.shape[3], device=device)

        def fb():
            y = f(*leaves)
            y.backward(gout)
            for t in leaves:
                t.grad = None

        row[f"{name}_fwdbwd_ms"] = _time(fb, repeat, warm, sync)
    for what in ("fwd", "fwdbwd"):
        row[f"dcnkit_vs_conv2d_{what}"] = row[f"dcnkit_{what}_ms"] / row[f"conv2d_{what}_ms"]
        if tv is not None:
            row[f"torchvision_vs_dcnkit_{what}"] = row[f"torchvision_{what}_ms"] / row[f"dcnkit_{what}_ms"]
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--repeat", type=int, default=7, help="timed runs per measurement (median)")
    ap.add_argument("--stat", choices=["median", "min"], default="median",
                    help="statistic over the timed runs (min: best case on a shared machine)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shapes", default=None, help="indices of SHAPES to run, e.g. 0,1")
    ap.add_argument("--no-torchvision", action="store_true")
    ap.add_argument("--json", default=None, help="write the rows as JSON to this file")
    args = ap.parse_args(argv)
    global _STAT
    _STAT = min if args.stat == "min" else statistics.median
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = SHAPES if args.shapes is None else [SHAPES[int(i)] for i in args.shapes.split(",")]
    rows = []
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {args.device}, "
          f"{args.stat} of {args.repeat} runs")
    hdr = (f"{'shape (N,C,H,W)':<20}{'pass':<8}{'dcnkit ms':>11}{'conv2d ms':>11}{'tv ms':>11}"
           f"{'dcn/conv':>10}{'tv/dcn':>9}")
    print(hdr)
    print("-" * len(hdr))
    for s in shapes:
        r = bench_shape(s, args.repeat, args.device, args.no_torchvision)
        rows.append(r)
        for what, label in (("fwd", "fwd"), ("fwdbwd", "fwd+bwd")):
            tvms = r.get(f"torchvision_{what}_ms")
            tvr = r.get(f"torchvision_vs_dcnkit_{what}")
            print(f"{str(tuple(s)):<20}{label:<8}{r[f'dcnkit_{what}_ms']:>11.2f}{r[f'conv2d_{what}_ms']:>11.2f}"
                  f"{(f'{tvms:.2f}' if tvms is not None else '-'):>11}"
                  f"{r[f'dcnkit_vs_conv2d_{what}']:>9.2f}x{(f'{tvr:.2f}x' if tvr is not None else '-'):>9}",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "threads": torch.get_num_threads(), "device": args.device,
                       "repeat": args.repeat, "stat": args.stat, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
