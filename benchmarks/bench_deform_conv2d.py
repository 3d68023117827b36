"""Benchmark: dcnkit deform_conv2d (DCNv2, 3x3, pad 1) vs dense conv2d and torchvision, same run.

    python benchmarks/bench_deform_conv2d.py [--device cpu|cuda] [--threads 2] [--repeat 15] [--json out.json]

For every shape and dtype (float32; float16 too on CUDA): forward and forward+backward (gradients for input,
offset, mask, weight, bias) of dcnkit, of ``torch.nn.functional.conv2d`` with the same shapes (what a deformable
layer replaces; cuDNN on CUDA) and of ``torchvision.ops.deform_conv2d``. The implementations run interleaved,
round after round, and each reports its fastest round (benchmarks/_common.py).

Memory: peak memory allocated by one forward and one forward+backward beyond what existed before the call
(outputs, gradients, workspaces) for batches 1, 2, 4, 8 of the first shape, measured in a child process
(CPU: resident-set high-water mark; CUDA: torch.cuda.max_memory_allocated). ``--no-memory`` skips it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

SHAPES = [(1, 64, 64, 64), (4, 256, 32, 32), (8, 32, 128, 128)]
QUICK_SHAPES = [(1, 8, 12, 12), (2, 16, 8, 8)]
MEMORY_BATCHES = [1, 2, 4, 8]


def _inputs(n, c, h, w, device, dtype, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    k = 3
    x = torch.randn(n, c, h, w, generator=g)
    weight = torch.randn(c, c, k, k, generator=g) / (c * k * k) ** 0.5
    bias = torch.randn(c, generator=g)
    offset = torch.randn(n, 2 * k * k, h, w, generator=g) * 2.0
    mask = torch.rand(n, k * k, h, w, generator=g)
    return [t.to(device=device, dtype=dtype) for t in (x, offset, weight, bias, mask)]


def _impls(skip_torchvision: bool):
    import torch.nn.functional as F

    import dcnkit.ops as dops

    impls = {
        "dcnkit": lambda x, offset, weight, bias, mask: dops.deform_conv2d(x, offset, weight, bias, 1, 1, 1, mask),
        "conv2d": lambda x, offset, weight, bias, mask: F.conv2d(x, weight, bias, 1, 1),
    }
    if not skip_torchvision:
        try:
            import torchvision.ops as tv

            impls["torchvision"] = lambda x, offset, weight, bias, mask: tv.deform_conv2d(
                x, offset, weight, bias, (1, 1), (1, 1), (1, 1), mask)
        except ImportError:
            pass
    return impls


def _calls(f, args):
    """(forward, forward+backward) closures of one implementation."""
    import torch

    x, offset, weight, bias, mask = args
    leaves = [t.detach().clone().requires_grad_() for t in args]
    gout = torch.ones(x.shape[0], weight.shape[0], x.shape[2], x.shape[3], device=x.device, dtype=x.dtype)

    def fwd():
        with torch.no_grad():
            return f(*args)

    def fwdbwd():
        f(*leaves).backward(gout)
        for t in leaves:
            t.grad = None

    return fwd, fwdbwd


def bench_shape(shape, dtype, args, device):
    import torch

    inputs = _inputs(*shape, device, dtype)
    impls = _impls(args.no_torchvision)
    calls = {name: _calls(f, inputs) for name, f in impls.items()}
    sync = C.synchronizer(device)
    row = {"shape": list(shape), "dtype": str(dtype).replace("torch.", "")}
    for name in [n for n in calls if n != "dcnkit"]:  # a baseline without this dtype (torchvision: bfloat16)
        try:
            calls[name][1]()
        except RuntimeError as e:
            row[f"{name}_unsupported"] = str(e).splitlines()[0][-200:]
            del calls[name]
    for i, what in enumerate(("fwd", "fwdbwd")):
        ms = C.interleaved({k: c[i] for k, c in calls.items()}, args.repeat, args.warmup, sync)
        for k, v in ms.items():
            row[f"{k}_{what}_ms"] = v
        if "conv2d" in ms:
            row[f"dcnkit_vs_conv2d_{what}"] = ms["dcnkit"] / ms["conv2d"]
        if "torchvision" in ms:
            row[f"torchvision_vs_dcnkit_{what}"] = ms["torchvision"] / ms["dcnkit"]
    del torch
    return row


def memory_rows(shape, dtype_name, device, batches, skip_torchvision) -> list[dict]:
    """Peak extra bytes per batch and implementation (run in this process: call it in a child)."""
    import torch

    dtype = getattr(torch, dtype_name)
    impls = _impls(skip_torchvision)
    rows = []
    for n in batches:
        inputs = _inputs(n, *shape[1:], device, dtype)
        row = {"batch": n, "output_bytes": n * shape[1] * shape[2] * shape[3] * inputs[0].element_size()}
        for name, f in impls.items():
            fwd, fwdbwd = _calls(f, inputs)
            try:
                fwd()  # first calls: thread pools, lazy initialisation
                fwdbwd()
            except RuntimeError as e:  # a baseline without this dtype (torchvision: bfloat16): no figure
                if name == "dcnkit":
                    raise
                row[f"{name}_unsupported"] = str(e).splitlines()[0][-200:]
                continue
            row[f"{name}_fwd_bytes"] = C.peak_extra_bytes(fwd, device)
            row[f"{name}_fwdbwd_bytes"] = C.peak_extra_bytes(fwdbwd, device)
        rows.append(row)
    return rows


def measure_memory(shape, dtype_name, device, batches, skip_torchvision, threads) -> list[dict] | None:
    """memory_rows in a child process (CPU: glibc told to unmap freed blocks at once, see _common)."""
    env = dict(os.environ, **{C.MMAP_ENV: "65536", "MALLOC_TRIM_THRESHOLD_": "65536"})
    cmd = [sys.executable, os.path.abspath(__file__), "--memory-child",
           json.dumps([list(shape), dtype_name, device, batches, skip_torchvision, threads])]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"memory: the child process failed: {r.stderr.strip().splitlines()[-1:]}")
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def _memory_child(spec: str) -> None:
    import torch

    shape, dtype_name, device, batches, skip_tv, threads = json.loads(spec)
    torch.set_num_threads(threads)
    import dcnkit  # noqa: F401

    print(json.dumps(memory_rows(shape, dtype_name, device, batches, skip_tv)))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--memory-child"]:
        return _memory_child(argv[1])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    C.add_common_args(ap)
    ap.add_argument("--shapes", default=None, help="indices of SHAPES to run, e.g. 0,1")
    ap.add_argument("--no-torchvision", action="store_true")
    ap.add_argument("--no-memory", action="store_true", help="skip the memory table")
    ap.add_argument("--dtypes", default=None, help="comma-separated, e.g. float32,float16,bfloat16 (default: "
                    "float32, and float16 on CUDA)")
    args = ap.parse_args(argv)
    device = C.resolve_device(args)
    import torch

    import dcnkit  # noqa: F401

    shapes = QUICK_SHAPES if args.quick else SHAPES
    if args.shapes is not None:
        shapes = [shapes[int(i)] for i in args.shapes.split(",")]
    dtypes = [torch.float32] + ([torch.float16] if device == "cuda" else [])
    if args.dtypes:
        names = args.dtypes.split(",")
        bad = [d for d in names if d not in ("float32", "float16", "bfloat16", "float64")]
        if bad:
            ap.error(f"--dtypes: expected float32, float16, bfloat16 or float64, got {', '.join(bad)}")
        dtypes = [getattr(torch, d) for d in names]
    print(f"torch {torch.__version__}, device {device}"
          f"{' (' + torch.cuda.get_device_name(0) + ')' if device == 'cuda' else f', {torch.get_num_threads()} threads'}"
          f", fastest of {args.repeat} interleaved rounds, {args.clock} clock")
    rows = []
    table = []
    for dt in dtypes:
        for s in shapes:
            r = bench_shape(s, dt, args, device)
            rows.append(r)
            for what, label in (("fwd", "fwd"), ("fwdbwd", "fwd+bwd")):
                tv = r.get(f"torchvision_{what}_ms")
                tvr = r.get(f"torchvision_vs_dcnkit_{what}")
                cv, cvr = r.get(f"conv2d_{what}_ms"), r.get(f"dcnkit_vs_conv2d_{what}")
                table.append([str(tuple(s)), r["dtype"], label, f"{r[f'dcnkit_{what}_ms']:.2f}",
                              "-" if cv is None else f"{cv:.2f}", "-" if tv is None else f"{tv:.2f}",
                              "-" if cvr is None else f"{cvr:.2f}x", "-" if tvr is None else f"{tvr:.2f}x"])
    conv_name = "cuDNN conv2d ms" if device == "cuda" else "conv2d ms"
    C.print_table(["shape (N,C,H,W)", "dtype", "pass", "dcnkit ms", conv_name, "torchvision ms", "dcnkit/conv2d",
                   "torchvision/dcnkit"], table)
    result = {"torch": torch.__version__, "threads": torch.get_num_threads(), "device": device,
              "repeat": args.repeat, "rows": rows}

    if not args.no_memory:
        shape = shapes[0]
        batches = [1, 2] if args.quick else MEMORY_BATCHES
        mem = measure_memory(shape, "float32", device, batches, args.no_torchvision, torch.get_num_threads())
        if mem is not None:
            print(f"\npeak extra memory (MiB) of one call, float32, shape (N, {shape[1]}, {shape[2]}, {shape[3]}); "
                  f"'out' is the output's size")
            names = [n for n in ("dcnkit", "conv2d", "torchvision") if f"{n}_fwd_bytes" in mem[0]]
            header = ["N", "out"] + [f"{n} fwd" for n in names] + [f"{n} fwd+bwd" for n in names]
            C.print_table(header, [[m["batch"], C.mib(m["output_bytes"])]
                                   + [C.mib(m[f"{n}_fwd_bytes"]) for n in names]
                                   + [C.mib(m[f"{n}_fwdbwd_bytes"]) for n in names] for m in mem])
            result["memory"] = {"shape": list(shape), "rows": mem}
    return C.write_json(args, result)


if __name__ == "__main__":
    main()
