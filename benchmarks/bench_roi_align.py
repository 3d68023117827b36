"""RoI operator timings on the CPU (or CUDA with --device cuda): dcnkit vs torchvision in the same run.

roi_align on (N=2, C=256, 64x64), 512 RoIs, 7x7 output, sampling_ratio 2, aligned, spatial_scale 1/16:
forward and forward+backward, dcnkit vs torchvision.ops.roi_align (median of --repeat runs after
--warmup runs), plus dcnkit's max mode, deform_roi_pool and deform_psroi_pool.

    python benchmarks/bench_roi_align.py [--threads 2] [--repeat 7] [--warmup 5] [--device cpu]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import dcnkit  # noqa: F401
from dcnkit.ops import deform_psroi_pool, deform_roi_pool, roi_align


def make_rois(k: int, n: int, image: float, gen: torch.Generator, device) -> torch.Tensor:
    size = 32 + torch.rand(k, 2, generator=gen) * (image / 2 - 32)
    start = torch.rand(k, 2, generator=gen) * (image - size)
    bi = torch.randint(0, n, (k, 1), generator=gen).float()
    return torch.cat([bi, start, start + size], 1).to(device)


def timeit(fn, warmup: int, repeat: int, device: str) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeat):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = args.device
    gen = torch.Generator().manual_seed(0)

    N, C, H, W, K, P, SR, S = 2, 256, 64, 64, 512, 7, 2, 1.0 / 16
    x = torch.randn(N, C, H, W, generator=gen).to(dev)
    rois = make_rois(K, N, H / S, gen, dev)
    grad = torch.randn(K, C, P, P, generator=gen).to(dev)
    xg = x.clone().requires_grad_()

    def fwd_bwd(f):
        def run():
            xg.grad = None
            f(xg).backward(grad)
        return run

    rows = []
    try:
        import torchvision

        tv = torchvision.ops.roi_align
    except ImportError:  # pragma: no cover
        tv = None

    def pair(name, ours, theirs):
        with torch.no_grad():
            a = timeit(lambda: ours(x), args.warmup, args.repeat, dev)
            b = timeit(lambda: theirs(x), args.warmup, args.repeat, dev) if theirs else float("nan")
        rows.append((f"{name} forward", a, b))
        a = timeit(fwd_bwd(ours), args.warmup, args.repeat, dev)
        b = timeit(fwd_bwd(theirs), args.warmup, args.repeat, dev) if theirs else float("nan")
        rows.append((f"{name} forward+backward", a, b))

    ours = lambda t: roi_align(t, rois, P, S, SR, True)  # noqa: E731
    theirs = (lambda t: tv(t, rois, P, S, SR, True)) if tv else None  # noqa: E731
    if tv is not None:
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    pair("roi_align avg", ours, theirs)
    pair("roi_align max", lambda t: roi_align(t, rois, P, S, SR, True, "max"), None)
    offset = (torch.randn(K, 2, P, P, generator=gen) * 0.1).to(dev)
    pair("deform_roi_pool", lambda t: deform_roi_pool(t, rois, offset, P, S, SR, 0.1), None)

    D, G = 8, 4  # C' = D * G^2 = 128 channels
    xp = torch.randn(N, D * G * G, H, W, generator=gen).to(dev)
    trans = (torch.randn(K, 2, P, P, generator=gen) * 0.1).to(dev)
    gp = torch.randn(K, D, P, P, generator=gen).to(dev)
    xpg = xp.clone().requires_grad_()
    with torch.no_grad():
        a = timeit(lambda: deform_psroi_pool(xp, rois, trans, S, P, D, G, None, 2, 0.1), args.warmup,
                   args.repeat, dev)
    rows.append(("deform_psroi_pool forward", a, float("nan")))

    def ps_fb():
        xpg.grad = None
        deform_psroi_pool(xpg, rois, trans, S, P, D, G, None, 2, 0.1).backward(gp)

    rows.append(("deform_psroi_pool forward+backward", timeit(ps_fb, args.warmup, args.repeat, dev),
                 float("nan")))

    print(f"device {dev}, torch threads {torch.get_num_threads()}, median of {args.repeat} "
          f"(after {args.warmup} warm-up)")
    print(f"roi_align/deform_roi_pool: input ({N}, {C}, {H}, {W}), {K} RoIs, {P}x{P}, sampling_ratio {SR}; "
          f"deform_psroi_pool: input ({N}, {D * G * G}, {H}, {W}), output_dim {D}, group_size {G}, "
          f"sample_per_part 2")
    print(f"| {'case':<36} | {'dcnkit ms':>10} | {'torchvision ms':>14} | {'tv / dcnkit':>11} |")
    print(f"|{'-' * 38}|{'-' * 12}|{'-' * 16}|{'-' * 13}|")
    for name, a, b in rows:
        ratio = b / a if b == b else float("nan")
        bs = f"{b:14.2f}" if b == b else f"{'-':>14}"
        rs = f"{ratio:11.2f}" if ratio == ratio else f"{'-':>11}"
        print(f"| {name:<36} | {a:10.2f} | {bs} | {rs} |")


if __name__ == "__main__":
    main()
