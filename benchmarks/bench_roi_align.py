"""RoI operator timings: dcnkit (PyTorch and ONNX Runtime) vs ONNX Runtime's built-in RoiAlign vs torchvision.

    python benchmarks/bench_roi_align.py [--device cpu|cuda] [--threads 2] [--repeat 15] [--warmup 3]

roi_align on (N=2, C=256, 64x64), 512 RoIs, 7x7 output, sampling_ratio 2, aligned, spatial_scale 1/16:

* forward: dcnkit's torch op, torchvision.ops.roi_align, the kit's ``dcnkit::RoIAlign`` node in ONNX Runtime and
  ONNX Runtime's built-in ``RoiAlign`` (opset 16, ``half_pixel``; the RoIs as boxes + int64 batch indices, split
  before timing), plus TensorRT (the kit's plugin, float32 and float16) when TensorRT is importable;
* forward+backward of the torch ops; dcnkit's max mode, deform_roi_pool and deform_psroi_pool.

The implementations of a case run interleaved, round after round; each reports its fastest round. On CUDA the
torch ops run on the GPU and ONNX Runtime uses its CUDA execution provider when onnxruntime has it.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402


def make_rois(k: int, n: int, image: float, gen, device):
    import torch

    size = 32 + torch.rand(k, 2, generator=gen) * (image / 2 - 32)
    start = torch.rand(k, 2, generator=gen) * (image - size)
    bi = torch.randint(0, n, (k, 1), generator=gen).float()
    return torch.cat([bi, start, start + size], 1).to(device)


def _ort_models(C_, P, S, SR):
    """(kit model, built-in model) bytes: dcnkit::RoIAlign(input, rois) and RoiAlign(input, boxes, batch)."""
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    kit = helper.make_node("RoIAlign", ["input", "rois"], ["y"], domain="dcnkit", output_size=[P, P],
                           spatial_scale=S, sampling_ratio=SR, aligned=1, plugin_namespace="dcnkit")
    g = helper.make_graph([kit], "kit", [helper.make_tensor_value_info("input", f, ["N", C_, "H", "W"]),
                                         helper.make_tensor_value_info("rois", f, ["K", 5])],
                          [helper.make_tensor_value_info("y", f, None)])
    kit_model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dcnkit", 1)],
                                  ir_version=10)
    std = helper.make_node("RoiAlign", ["input", "boxes", "batch"], ["y"], coordinate_transformation_mode="half_pixel",
                           mode="avg", output_height=P, output_width=P, sampling_ratio=SR, spatial_scale=S)
    g = helper.make_graph([std], "std", [helper.make_tensor_value_info("input", f, ["N", C_, "H", "W"]),
                                         helper.make_tensor_value_info("boxes", f, ["K", 4]),
                                         helper.make_tensor_value_info("batch", TensorProto.INT64, ["K"])],
                          [helper.make_tensor_value_info("y", f, None)])
    std_model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return kit_model.SerializeToString(), std_model.SerializeToString()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    C.add_common_args(ap)
    args = ap.parse_args(argv)
    dev = C.resolve_device(args)
    import numpy as np
    import torch

    from dcnkit.ops import deform_psroi_pool, deform_roi_pool, roi_align
    from dcnkit.runtime import ort_session

    gen = torch.Generator().manual_seed(0)
    sync = C.synchronizer(dev)
    if args.quick:
        N, C_, H, W, K = 1, 8, 16, 16, 16
    else:
        N, C_, H, W, K = 2, 256, 64, 64, 512
    P, SR, S = 7, 2, 1.0 / 16
    x = torch.randn(N, C_, H, W, generator=gen).to(dev)
    rois = make_rois(K, N, H / S, gen, dev)
    grad = torch.randn(K, C_, P, P, generator=gen).to(dev)
    xg = x.clone().requires_grad_()
    try:
        import torchvision

        tv = torchvision.ops.roi_align
    except ImportError:  # pragma: no cover
        tv = None

    rows = []  # (case, dcnkit ms, torchvision ms, ORT kit ms, ORT built-in ms)
    nan = float("nan")

    def fwd_bwd(f):
        def run():
            xg.grad = None
            f(xg).backward(grad)
        return run

    def pair(name, ours, theirs, extra=None):
        with torch.no_grad():
            fns = {"ours": lambda: ours(x)}
            if theirs:
                fns["theirs"] = lambda: theirs(x)
            fns.update(extra or {})
            ms = C.interleaved(fns, args.repeat, args.warmup, sync)
        rows.append((f"{name} forward", ms["ours"], ms.get("theirs", nan), ms.get("ort kit", nan),
                     ms.get("ort built-in", nan), {k: v for k, v in ms.items() if k.startswith("TensorRT")}))
        fns = {"ours": fwd_bwd(ours)}
        if theirs:
            fns["theirs"] = fwd_bwd(theirs)
        ms = C.interleaved(fns, args.repeat, args.warmup, sync)
        rows.append((f"{name} forward+backward", ms["ours"], ms.get("theirs", nan), nan, nan, {}))

    # ONNX Runtime sessions (their inputs prepared once, outside the timing).
    providers = C.ort_providers(dev)
    opts = dict(intra_op_num_threads=args.threads, inter_op_num_threads=1, session_config=C.NO_SPIN)
    kit_bytes, std_bytes = _ort_models(C_, P, S, SR)
    kit_sess = ort_session(kit_bytes, providers=providers, **opts)
    std_sess = ort_session(std_bytes, providers=providers, **opts)
    xn, rn = x.cpu().numpy(), rois.cpu().numpy()
    kit_feeds = {"input": xn, "rois": rn}
    std_feeds = {"input": xn, "boxes": np.ascontiguousarray(rn[:, 1:]), "batch": rn[:, 0].astype(np.int64)}

    ours = lambda t: roi_align(t, rois, P, S, SR, True)  # noqa: E731
    theirs = (lambda t: tv(t, rois, P, S, SR, True)) if tv else None  # noqa: E731
    ref = ours(x).cpu().numpy()
    # float32 sums of the same samples in another order (GPU, ONNX Runtime): reported, within float32's rounding.
    if tv is not None:
        C.check_accuracy(f"torchvision vs dcnkit, {dev}", theirs(x), ref)
    C.check_accuracy(f"ORT kit vs dcnkit, {dev}", kit_sess.run(None, kit_feeds)[0], ref)
    C.check_accuracy(f"ORT RoiAlign vs dcnkit, {dev}", std_sess.run(None, std_feeds)[0], ref)
    extra = {"ort kit": C.ort_call(kit_sess, kit_feeds), "ort built-in": C.ort_call(std_sess, std_feeds)}
    trt_reason = C.tensorrt_available()
    trt_runners = []
    if trt_reason is None:
        from dcnkit.runtime.tensorrt import TensorRTRunner

        for prec in (None, "fp16"):
            r = TensorRTRunner(kit_bytes, precision=prec)
            trt_runners.append(r)
            extra[f"TensorRT {prec or 'fp32'}"] = lambda r=r: r.run(kit_feeds)
    pair("roi_align avg", ours, theirs, extra)
    for r in trt_runners:
        r.close()
    pair("roi_align max", lambda t: roi_align(t, rois, P, S, SR, True, "max"), None)
    offset = (torch.randn(K, 2, P, P, generator=gen) * 0.1).to(dev)
    pair("deform_roi_pool", lambda t: deform_roi_pool(t, rois, offset, P, S, SR, 0.1), None)

    D, G = (2, 2) if args.quick else (8, 4)  # C' = D * G^2 channels
    xp = torch.randn(N, D * G * G, H, W, generator=gen).to(dev)
    trans = (torch.randn(K, 2, P, P, generator=gen) * 0.1).to(dev)
    gp = torch.randn(K, D, P, P, generator=gen).to(dev)
    xpg = xp.clone().requires_grad_()

    def ps_f():
        with torch.no_grad():
            deform_psroi_pool(xp, rois, trans, S, P, D, G, None, 2, 0.1)

    def ps_fb():
        xpg.grad = None
        deform_psroi_pool(xpg, rois, trans, S, P, D, G, None, 2, 0.1).backward(gp)

    ms = C.interleaved({"f": ps_f, "fb": ps_fb}, args.repeat, args.warmup, sync)
    rows.append(("deform_psroi_pool forward", ms["f"], nan, nan, nan, {}))
    rows.append(("deform_psroi_pool forward+backward", ms["fb"], nan, nan, nan, {}))

    print(f"device {dev} (ONNX Runtime: {providers[0]}), {args.threads} threads, fastest of {args.repeat} "
          f"interleaved rounds (after {args.warmup} warm-up)")
    print(f"roi_align/deform_roi_pool: input ({N}, {C_}, {H}, {W}), {K} RoIs, {P}x{P}, sampling_ratio {SR}; "
          f"deform_psroi_pool: input ({N}, {D * G * G}, {H}, {W}), output_dim {D}, group_size {G}, sample_per_part 2")
    if trt_reason:
        print(f"TensorRT skipped: {trt_reason}")

    def f(v):
        return "-" if v != v else f"{v:.2f}"

    trt_cols = sorted({k for r in rows for k in r[5]})
    C.print_table(["case", "dcnkit torch ms", "torchvision ms", "dcnkit ORT ms", "ORT RoiAlign ms",
                   "ORT RoiAlign / dcnkit ORT", "torchvision / dcnkit"] + [f"{k} ms" for k in trt_cols],
                  [[name, f(a), f(b), f(c), f(d), f(d / c), f(b / a)] + [f(t.get(k, nan)) for k in trt_cols]
                   for name, a, b, c, d, t in rows])
    result = {"device": dev, "threads": args.threads,
              "rows": [dict(case=r[0], dcnkit_ms=r[1], torchvision_ms=r[2], ort_kit_ms=r[3], ort_builtin_ms=r[4],
                            **{f"{k} ms": v for k, v in r[5].items()}) for r in rows]}
    return C.write_json(args, result, default=lambda v: None)


if __name__ == "__main__":
    main()
