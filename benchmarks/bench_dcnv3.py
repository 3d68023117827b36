"""DCNv3 / DCNv4 timings: dcnkit's ``dcnv3`` and ``dcnv4`` vs the grid_sample formulation (InternImage's
pure-PyTorch core, what users run without a compiled op), forward and forward+backward, in one run.

    python benchmarks/bench_dcnv3.py [--device cpu|cuda] [--threads 2] [--repeat 10] [--json out.json]

Shapes: InternImage-T stage 2 and 3 at a 224x224 input (N=2; 28x28 with C=160 in 10 groups, 14x14 with C=320 in
20 groups; 3x3, pad 1), offsets ~N(0, 1.5) pixels, softmaxed weights. ``dcnv4`` reads the same offsets and weights
laid out as DCNv4's offset_mask (so all three compute the same output, checked first). The grid_sample formulation
is the one the tests check the op against (tests/dcnv3_cases.py). Implementations run interleaved, round after
round; each reports its fastest round. A second table times the whole layers (``dcnkit.nn.DCNv3`` vs
``dcnkit.nn.DCNv4``, forward) at the same shapes.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

# (name, N, H, W, group, group_channels)
SHAPES = [("InternImage-T stage 2", 2, 28, 28, 10, 16), ("InternImage-T stage 3", 2, 14, 14, 20, 16)]
QUICK_SHAPES = [("quick", 1, 6, 5, 2, 4)]


def layer_forward(n, h, w, g, gc, dev, args, sync) -> dict:
    """The whole layers' forward: DCNv3 (depthwise conv + LayerNorm + GELU, offset and mask projections, softmax,
    the op, input/output projections) vs DCNv4 (one offset_mask projection, no softmax, the op, value/output
    projections) at the same width, groups and map; offset projections given small random weights (both
    initialise them to zero)."""
    import torch

    import dcnkit.nn

    torch.manual_seed(0)
    c = g * gc
    v3 = dcnkit.nn.DCNv3(channels=c, group=g).to(dev).eval()
    v4 = dcnkit.nn.DCNv4(channels=c, group=g).to(dev).eval()
    with torch.no_grad():
        for lin in (v3.offset, v3.mask, v4.offset_mask):
            lin.weight.normal_(0, 0.05)
    x = torch.randn(n, h, w, c, device=dev)
    seq = x.reshape(n, h * w, c)
    with torch.inference_mode():
        ms = C.interleaved({"dcnv3": lambda: v3(x), "dcnv4": lambda: v4(seq, (h, w))}, args.repeat, args.warmup,
                           sync)
    return {"dcnv3_layer_ms": ms["dcnv3"], "dcnv4_layer_ms": ms["dcnv4"],
            "dcnv4_over_dcnv3_layer": ms["dcnv4"] / ms["dcnv3"]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    C.add_common_args(ap, repeat=10)
    args = ap.parse_args(argv)
    dev = C.resolve_device(args)
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from dcnv3_cases import dcnv4_offset_mask, grid_sample_dcnv3, make_inputs

    from dcnkit.ops import dcnv3, dcnv4

    rows, layer_rows = [], []
    for name, n, h, w, g, gc in (QUICK_SHAPES if args.quick else SHAPES):
        attrs = (3, 3, 1, 1, 1, 1, 1, 1, g, gc, 1.0)
        x, off, m = (t.float().to(dev) for t in make_inputs(n=n, h=h, w=w, attrs=attrs, seed=0))
        om = dcnv4_offset_mask(off.cpu(), m.cpu(), g, 9).clamp(-1e4, 1e4).to(dev)
        impls = {"dcnv3": lambda a, b, c: dcnv3(a, b, c, *attrs),
                 "dcnv4": lambda a, b, c: dcnv4(a, om if b is off else b, *attrs),
                 "grid_sample": lambda a, b, c: grid_sample_dcnv3(a, b, c, *attrs)}
        ref = impls["dcnv3"](x, off, m)
        accuracy = [C.check_accuracy(f"{k} vs dcnv3, {name}, {dev}", impls[k](x, off, m), ref)
                    for k in ("dcnv4", "grid_sample")]
        fwd = {k: (lambda f=f: f(x, off, m)) for k, f in impls.items()}

        def fwd_bwd(f):
            leaves = [t.clone().requires_grad_() for t in (x, off, m)]

            def run():
                for t in leaves:
                    t.grad = None
                f(*leaves).sum().backward()

            return run

        def v4_fwd_bwd():
            xv, omv = x.clone().requires_grad_(), om.clone().requires_grad_()

            def run():
                xv.grad = omv.grad = None
                dcnv4(xv, omv, *attrs).sum().backward()

            return run

        sync = C.synchronizer(dev)
        with torch.inference_mode():
            ms_f = C.interleaved(fwd, args.repeat, args.warmup, sync)
        ms_fb = C.interleaved({"dcnv3": fwd_bwd(impls["dcnv3"]), "dcnv4": v4_fwd_bwd(),
                               "grid_sample": fwd_bwd(impls["grid_sample"])}, args.repeat, args.warmup, sync)
        for case, ms in (("forward", ms_f), ("forward+backward", ms_fb)):
            rows.append({"shape": name, "case": case, **{f"{k}_ms": v for k, v in ms.items()},
                         "dcnv4_over_dcnv3": ms["dcnv4"] / ms["dcnv3"],
                         "dcnv3_over_grid_sample": ms["dcnv3"] / ms["grid_sample"], "accuracy": accuracy})
        layer_rows.append({"shape": name, **layer_forward(n, h, w, g, gc, dev, args, C.synchronizer(dev))})
    print(f"device {dev}, {args.threads} threads, fastest of {args.repeat} interleaved rounds (after {args.warmup} "
          f"warm-up), float32")
    C.print_table(["shape", "pass", "dcnv3 ms", "dcnv4 ms", "grid_sample ms", "dcnv4 / dcnv3", "dcnv3 / grid_sample"],
                  [[r["shape"], r["case"], f"{r['dcnv3_ms']:.2f}", f"{r['dcnv4_ms']:.2f}", f"{r['grid_sample_ms']:.2f}",
                    f"{r['dcnv4_over_dcnv3']:.2f}", f"{r['dcnv3_over_grid_sample']:.2f}"] for r in rows])
    print("layers (dcnkit.nn.DCNv3 with InternImage's defaults vs dcnkit.nn.DCNv4 with the DCNv4 package's), forward:")
    C.print_table(["shape", "DCNv3 layer ms", "DCNv4 layer ms", "DCNv4 / DCNv3 layer"],
                  [[r["shape"], f"{r['dcnv3_layer_ms']:.2f}", f"{r['dcnv4_layer_ms']:.2f}",
                    f"{r['dcnv4_over_dcnv3_layer']:.2f}"] for r in layer_rows])
    result = {"device": dev, "threads": args.threads, "rows": rows, "layer_rows": layer_rows}
    return C.write_json(args, result)


if __name__ == "__main__":
    main()
