"""CUDA fuzz run of the kit's sampling operators: random cases (10^4 by default) of RoIAlign, MultiLevelRoIAlign,
DeformRoIPool, DeformPSRoIPool and DeformConv2d, forward and backward on the GPU (float32, and float16 for a share of
them), each held against the CPU path (float32 for float32, float64 for float16, from the same rounded inputs; the
CPU kernels are the reference the CPU tests check), in default
and deterministic mode (torch.use_deterministic_algorithms: the atomic-free backwards; run twice, bit-identical).
Shapes and boxes are drawn to hit the edges: empty batches and RoI lists, maps of one row or column, boxes partly and
wholly outside, inverted, tiny and huge (adaptive grids of 10^5 samples per bin), explicit grids past 16 samples per
bin, offsets far outside, NaN boxes; a batch index outside the batch is left out (the torch ops assert on it).

    python scripts/cuda_fuzz.py [--cases 10000] [--seed 0] [--time-limit 480]

Prints one line per failure and a summary; exit 1 on a failure, 0 otherwise (and when no GPU is usable: it says so).
Run by .ci/gpu on a GPU machine, first (with compute-sanitizer over the cuda tests)."""
from __future__ import annotations

import argparse
import math
import sys
import time


def _rois(g, torch, k, n, h, w, scale):
    """k RoI rows in image coordinates (the map is h x w at `scale`): a mix of ordinary, edge and huge boxes."""
    rows = []
    for _ in range(k):
        kind = int(torch.randint(0, 8, (1,), generator=g))
        b = float(torch.randint(0, max(n, 1), (1,), generator=g))
        x1, y1 = (float(v) for v in torch.rand(2, generator=g) * torch.tensor([w / scale, h / scale]))
        side = float(torch.rand(1, generator=g)) * 2 * max(h, w) / scale
        if kind == 0:    # huge: adaptive grids of ~1e5 samples per bin
            x1, y1, side = -1e5, -1e5, 2e5
        elif kind == 1:  # wholly outside
            x1, y1 = x1 + 4 * w / scale, y1 + 4 * h / scale
        elif kind == 2:  # inverted
            side = -side
        elif kind == 3:  # tiny
            side = 0.3
        elif kind == 4:  # large, partly outside
            x1, y1, side = x1 - w / scale, y1 - h / scale, 3 * max(h, w) / scale
        rows.append([b, x1, y1, x1 + side, y1 + side * float(0.5 + torch.rand(1, generator=g))])
    if k and float(torch.rand(1, generator=g)) < 0.05:
        rows[0][1] = math.nan  # a NaN box: an empty grid
    return torch.tensor(rows, dtype=torch.float64).reshape(k, 5)


def draw(g, torch):
    """One case: (name, fn(*tensors), tensors (float64, CPU), which are differentiable)."""
    from dcnkit.ops import deform_conv2d, deform_psroi_pool, deform_roi_pool, multi_level_roi_align, roi_align

    ri = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))  # noqa: E731
    op = ri(0, 4)
    n, c, h, w = ri(0, 2), ri(1, 9), ri(1, 13), ri(1, 13)
    x = torch.randn(n, c, h, w, generator=g, dtype=torch.float64)
    nroi = lambda: ri(0, 6) if n > 0 else 0  # noqa: E731 - no RoI on an empty batch (its index would be outside)
    ratio = [0, -1, 1, 2, 5][ri(0, 4)]
    size = (ri(1, 4), ri(1, 4))
    if op == 0:
        rois = _rois(g, torch, nroi(), n, h, w, 0.5)
        mode, aligned = ["avg", "max"][ri(0, 1)], bool(ri(0, 1))
        return (f"roi_align {size} ratio {ratio} {mode} aligned {aligned}",
                lambda x, r: roi_align(x, r, size, 0.5, ratio, aligned, mode), [x, rois], [True, False])
    if op == 1:
        maps = [torch.randn(n, c, max(1, h // s), max(1, w // s), generator=g, dtype=torch.float64) for s in (1, 2, 4)]
        rois = _rois(g, torch, nroi(), n, h, w, 0.5)
        mode = ["avg", "max"][ri(0, 1)]
        return (f"multi_level_roi_align {size} ratio {ratio} {mode}",
                lambda a, b, d, r: multi_level_roi_align([a, b, d], r, size, [2.0, 4.0, 8.0], ratio, 4, 1.0, True,
                                                         mode), [*maps, rois], [True, True, True, False])
    if op == 2:
        k = nroi()
        rois, off = _rois(g, torch, k, n, h, w, 0.5), torch.randn(k, 2, *size, generator=g, dtype=torch.float64) * 0.3
        return (f"deform_roi_pool {size} ratio {ratio}",
                lambda x, r, o: deform_roi_pool(x, r, o, size, 0.5, ratio, 0.1), [x, rois, off], [True, False, True])
    if op == 3:
        k, gs, dim, classes = nroi(), ri(1, 3), ri(1, 3), ri(1, 2)
        dim *= classes
        xp = torch.randn(n, dim * gs * gs, h, w, generator=g, dtype=torch.float64)
        rois = _rois(g, torch, k, n, h, w, 0.5)
        trans = torch.randn(k, 2 * classes, 3, 3, generator=g, dtype=torch.float64) * 0.3
        spp = [1, 2, 4, 5][ri(0, 3)]
        return (f"deform_psroi_pool group {gs} dim {dim} classes {classes} spp {spp}",
                lambda x, r, t: deform_psroi_pool(x, r, t, 0.5, 3, dim, gs, 3, spp, 0.2), [xp, rois, trans],
                [True, False, True])
    kh, kw, gd, stride, pad = ri(1, 3), ri(1, 3), [1, c][ri(0, 1)], ri(1, 2), ri(0, 2)
    ho, wo = (h + 2 * pad - kh) // stride + 1, (w + 2 * pad - kw) // stride + 1
    if ho < 1 or wo < 1:
        pad = kh
        ho, wo = (h + 2 * pad - kh) // stride + 1, (w + 2 * pad - kw) // stride + 1
    cout = ri(1, 6)
    wt = torch.randn(cout, c, kh, kw, generator=g, dtype=torch.float64) * 0.5
    off = torch.randn(n, 2 * gd * kh * kw, ho, wo, generator=g, dtype=torch.float64) * [0.5, 3.0, 50.0][ri(0, 2)]
    mask = torch.rand(n, gd * kh * kw, ho, wo, generator=g, dtype=torch.float64)
    bias = torch.randn(cout, generator=g, dtype=torch.float64)
    return (f"deform_conv2d {kh}x{kw} stride {stride} pad {pad} deform_groups {gd}",
            lambda x, o, wt, b, m: deform_conv2d(x, o, wt, b, stride, pad, 1, m), [x, off, wt, bias, mask],
            [True] * 5)


def grads(torch, fn, tensors, diff, gy_seed):
    leaves = [t.detach().clone().requires_grad_(d) for t, d in zip(tensors, diff)]
    y = fn(*leaves)
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(gy_seed), dtype=torch.float64).to(y)
    if y.numel():
        y.backward(gy)
    return [y.detach()] + [t.grad if d else None for t, d in zip(leaves, diff)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=480.0, help="seconds; stops drawing new cases after it")
    ap.add_argument("--cpu-check", type=int, default=0, metavar="N",
                    help="no GPU: draw N cases and run each on the CPU (forward and backward), to check the generator")
    args = ap.parse_args(argv)
    import torch

    if args.cpu_check:
        import dcnkit  # noqa: F401 - registers the ops

        g = torch.Generator().manual_seed(args.seed)
        names = set()
        for i in range(args.cpu_check):
            name, fn, tensors, diff = draw(g, torch)
            names.add(name.split()[0])
            out = grads(torch, fn, tensors, diff, i)
            assert out[0].dtype == torch.float64, name
        print(f"cuda_fuzz --cpu-check: {args.cpu_check} cases of {sorted(names)} ran on the CPU")
        return 0

    if not torch.cuda.is_available():
        print("cuda_fuzz: no CUDA device usable (torch.cuda.is_available() is false): nothing run")
        return 0
    import dcnkit

    if not dcnkit.cuda_compiled():
        print("cuda_fuzz: dcnkit was built without its CUDA kernels: nothing run")
        return 0
    g = torch.Generator().manual_seed(args.seed)
    failures, run, start = 0, 0, time.time()
    for i in range(args.cases):
        if time.time() - start > args.time_limit:
            print(f"cuda_fuzz: time limit reached after {run} cases")
            break
        name, fn, tensors, diff = draw(g, torch)
        half = i % 5 == 4
        dtype, tol = (torch.float16, 3e-2) if half else (torch.float32, 2e-4)
        deterministic = i % 2 == 1
        try:
            # The reference on the CPU from the same rounded inputs: float32 for float32 (the same arithmetic, so max
            # mode picks the same winners), float64 for float16.
            ref_dtype = torch.float32 if dtype == torch.float32 else torch.float64
            ref = grads(torch, fn, [t.to(dtype).to(ref_dtype) for t in tensors], diff, i)
            ref = [None if r is None else r.double() for r in ref]
            cuda = [t.cuda().to(dtype) for t in tensors]
            torch.use_deterministic_algorithms(deterministic)
            got = grads(torch, fn, cuda, diff, i)
            again = grads(torch, fn, cuda, diff, i) if deterministic else got
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - every failure is reported, the run goes on
            failures += 1
            print(f"FAIL case {i} ({name}, {dtype}, deterministic {deterministic}): {type(e).__name__}: {e}")
            if "CUDA" in str(e) and "error" in str(e).lower():
                print("cuda_fuzz: the CUDA context is lost; stopping")
                return 1
            continue
        finally:
            torch.use_deterministic_algorithms(False)
        run += 1
        for j, (r, a, b) in enumerate(zip(ref, got, again)):
            if r is None:
                continue
            a64, b64 = a.double().cpu(), b.double().cpu()
            scale = max(1.0, float(r[r.isfinite()].abs().max()) if r.isfinite().any() else 1.0)
            bad = not torch.allclose(a64, r, rtol=tol, atol=tol * scale, equal_nan=True)
            a_nan, b_nan = a.isnan(), b.isnan()  # bit for bit, NaN where NaN (torch.equal takes NaN for unequal)
            if deterministic and not (torch.equal(a_nan, b_nan) and torch.equal(a.nan_to_num(0), b.nan_to_num(0))):
                bad = True
                print(f"FAIL case {i} ({name}, {dtype}): deterministic run not bit-identical (tensor {j})")
            if bad:
                failures += 1
                err = float((a64 - r).abs().nan_to_num(0).max()) if r.numel() else 0.0
                print(f"FAIL case {i} ({name}, {dtype}, deterministic {deterministic}): tensor {j} max |err| {err:.3g}")
    print(f"cuda_fuzz: {run} cases run in {time.time() - start:.0f} s, {failures} failures "
          f"({torch.cuda.get_device_name(0)})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
