"""The kit's TensorRT plugins against the NumPy references, on a machine with a GPU and TensorRT.

    python scripts/check_tensorrt.py                 # TensorRT engines, float32 and float16 (.ci/gpu runs this)
    python scripts/check_tensorrt.py --backend ort-cpu --precisions fp32   # the same models and checks on ONNX Runtime

On TensorRT it first runs the checks of scripts/tensorrt_tool_checks.py (trtexec --dynamicPlugins and
--useCudaGraph, serialize/deserialize of every creator with a dynamic profile, min and max dims under
compute-sanitizer, an fp16 FPN detector's RoI level with float32 RoIs, two execution contexts' memory), one line
each (``--only-tools`` / ``--skip-tools``).

Small models, one node each, in the `dcnkit` domain (DeformConv2d, RoIAlign avg/max, DeformRoIPool,
DeformPSRoIPool (also the deformable R-FCN head's three node kinds), MultiLevelRoIAlign,
MultiScaleDeformableAttention, DCNv3, DCNv4) and under mmdeploy's names
(MMCVModulatedDeformConv2d, MMCVRoiAlign, MMCVMultiLevelRoiAlign, MMCVMultiScaleDeformableAttention, InternImage's
TRTDCNv3), and on
TensorRT only TensorRT's own MultiscaleDeformableAttnPlugin_TRT (int32 level tables, output (N, Lq, M, D); TensorRT's
plugin serves it where its plugin library is initialised, as the kit's tools do), with dynamic dims and an optimization profile, are built with ``dcnkit.runtime.tensorrt`` (``--fp16`` as ``dcnkit build --fp16``: converted
ONNX on TensorRT 11, builder flag on TensorRT 10) and run through Polygraphy's TrtRunner. Each output is compared
with ``dcnkit.reference`` (float64 NumPy loops); on the GPU the RoI inputs include a RoI whose batch index is out
of range, which must give zeros. Prints a table (max error, tolerance, median run time including host<->device copies) and exits 1
on a mismatch. Without TensorRT: one line saying why, exit 0. ``--backend ort-cpu`` runs the same cases on the kit's
ONNX Runtime library (how the cases themselves are checked on machines without a GPU).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto as T
from onnx import helper, numpy_helper

TOL = {"fp32": (1e-4, 1e-4), "fp16": (2e-2, 2e-2)}  # (atol, rtol) relative to the reference's magnitude


def _model(domain, op, inputs, outputs, weights=(), order=None, **attrs):
    """One node; ``inputs`` are graph inputs (name, shape), ``weights`` initializers, ``order`` the node's inputs
    (default: inputs then weights). Domain "": a TensorRT plugin name (no opset of its own)."""
    names = order or [n for n, _ in inputs] + [n for n, _ in weights]
    node = helper.make_node(op, names, [n for n, _ in outputs], domain=domain, name=op.lower(), **attrs)
    g = helper.make_graph([node], op, [helper.make_tensor_value_info(n, T.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, T.FLOAT, s) for n, s in outputs],
                          initializer=[numpy_helper.from_array(a, n) for n, a in weights])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(g, opset_imports=opsets, ir_version=9)


def _rois(rng, k, n, h, w, bad=True):
    """k valid RoIs [b, x1, y1, x2, y2] plus (``bad``) one whose batch index is n (out of range: zeros)."""
    b = rng.integers(0, n, k)
    x = np.sort(rng.uniform(0, w - 1, (k, 2)), axis=1)
    y = np.sort(rng.uniform(0, h - 1, (k, 2)), axis=1)
    r = np.stack([b, x[:, 0], y[:, 0], x[:, 1], y[:, 1]], 1)
    if bad:
        r = np.concatenate([r, [[n, 1, 1, 3, 3]]])
    return r.astype(np.float32)


def _with_zero_rows(fn, rois, n, *args):
    """The reference over the valid RoIs, zeros for a RoI whose batch index is outside [0, n)."""
    ok = (rois[:, 0] >= 0) & (rois[:, 0] < n)
    got = fn(rois[ok], *args)
    got = got if isinstance(got, tuple) else (got,)
    outs = []
    for g in got:
        full = np.zeros((rois.shape[0],) + g.shape[1:])
        full[ok] = g
        outs.append(full)
    return outs


def msda_cases(rng, tensorrt_only=True):
    """Multi-scale deformable attention: levels 6x5 and 3x3 (S = 39), 2 heads of 4 channels, 2 points, Lq queries
    with some locations outside [0, 1]; the level tables are initializers (int64; int32 for TensorRT's own name)."""
    from dcnkit import reference as ref

    n, s, m, d, lq, p = 2, 39, 2, 4, 5, 2
    shapes = np.array([[6, 5], [3, 3]], np.int64)
    starts = np.array([0, 30], np.int64)
    value = rng.standard_normal((n, s, m, d)).astype(np.float32)
    loc = rng.uniform(-0.1, 1.1, (n, lq, m, 2, p, 2)).astype(np.float32)
    attn = rng.uniform(0, 1, (n, lq, m, 2, p)).astype(np.float32)
    want = ref.multi_scale_deformable_attn(value, shapes, starts, loc, attn)
    inputs = [("value", ["N", s, m, d]), ("loc", ["N", "Q", m, 2, p, 2]), ("attn", ["N", "Q", m, 2, p])]
    order = ["value", "shapes", "starts", "loc", "attn"]
    feeds = {"value": value, "loc": loc, "attn": attn}
    prof = {"value": ((1, s, m, d), (n, s, m, d), (4, s, m, d)), "loc": ((1, 1, m, 2, p, 2), (n, lq, m, 2, p, 2),
            (4, 64, m, 2, p, 2)), "attn": ((1, 1, m, 2, p), (n, lq, m, 2, p), (4, 64, m, 2, p))}
    out = []
    for domain, op in (("dcnkit", "MultiScaleDeformableAttention"), ("mmdeploy", "MMCVMultiScaleDeformableAttention")):
        extra = {"im2col_step": 64} if domain == "mmdeploy" else {}
        model = _model(domain, op, inputs, [("y", ["N", "Q", m * d])], [("shapes", shapes), ("starts", starts)],
                       order=order, **extra)
        out.append((op, model, dict(feeds), [want], prof))
    if tensorrt_only:
        model = _model("", "MultiscaleDeformableAttnPlugin_TRT", inputs, [("y", ["N", "Q", m, d])],
                       [("shapes", shapes.astype(np.int32)), ("starts", starts.astype(np.int32))], order=order)
        out.append(("MultiscaleDeformableAttnPlugin_TRT", model, dict(feeds), [want.reshape(n, lq, m, d)], prof))
    return out


def dcnv3_cases(rng):
    """DCNv3 / DCNv4, channels last: a (2, 9, 11, 8) map, 2 groups of 4 channels, 3x3, stride 1, pad 1 (Ho, Wo = H, W),
    offset_scale 0.5, offsets up to a few pixels; DCNv4 with softmax; InternImage's TRTDCNv3 with its im2col_step."""
    from dcnkit import reference as ref

    n, h, w, g, gc, k = 2, 9, 11, 2, 4, 9
    c, cp = g * gc, (g * 3 * k + 7) // 8 * 8
    attrs = dict(kernel_h=3, kernel_w=3, stride_h=1, stride_w=1, pad_h=1, pad_w=1, dilation_h=1, dilation_w=1,
                 group=g, group_channels=gc, offset_scale=0.5, remove_center=0)
    args = list(attrs.values())
    x = rng.standard_normal((n, h, w, c)).astype(np.float32)
    off = (rng.standard_normal((n, h, w, g * k * 2)) * 2).astype(np.float32)
    mask = rng.uniform(0, 1, (n, h, w, g * k)).astype(np.float32)
    om = rng.standard_normal((n, h, w, cp)).astype(np.float32)

    def prof(ch):
        return ((1, 4, 4, ch), (n, h, w, ch), (4, 32, 32, ch))

    d3_in = [("x", ["N", "H", "W", c]), ("offset", ["N", "H", "W", g * k * 2]), ("mask", ["N", "H", "W", g * k])]
    d3_prof = {"x": prof(c), "offset": prof(g * k * 2), "mask": prof(g * k)}
    want = [ref.dcnv3(x, off, mask, *args)]
    y = [("y", ["N", "H", "W", c])]
    return [("DCNv3", _model("dcnkit", "DCNv3", d3_in, y, **attrs), {"x": x, "offset": off, "mask": mask}, want,
             d3_prof),
            ("TRTDCNv3", _model("mmdeploy", "TRTDCNv3", d3_in, y, im2col_step=256, **attrs),
             {"x": x, "offset": off, "mask": mask}, want, d3_prof),
            ("DCNv4", _model("dcnkit", "DCNv4", [("x", d3_in[0][1]), ("offset_mask", ["N", "H", "W", cp])], y,
                             softmax=1, **attrs),
             {"x": x, "offset_mask": om}, [ref.dcnv4(x, om, *args, softmax=True)],
             {"x": prof(c), "offset_mask": prof(cp)})]


def rfcn_cases(rng, bad_roi=True):
    """The deformable R-FCN head's nodes (examples/rfcn_dcn.py; k = 7, sample_per_part 4, spatial_scale 1/16, two
    classes with the background): the first pass without offsets (output_dim 2·(C+1), no ``trans`` input), the
    deformable second pass of the scores fed with the first pass's output (output_dim C+1, trans_std 0.1) and the
    class-agnostic box pass (output_dim 8, one offset pair for all 8 channels)."""
    from dcnkit import reference as ref

    n, h, w, k, classes = 2, 6, 5, 7, 2
    rois = _rois(rng, 5, n, h * 16, w * 16, bad_roi)
    ok = rois[:, 0] < n
    attrs = dict(spatial_scale=1 / 16, output_size=k, group_size=k, part_size=k, sample_per_part=4)

    def case(name, dim, trans):
        x = rng.standard_normal((n, dim * k * k, h, w)).astype(np.float32)
        inputs = [("x", ["N", dim * k * k, "H", "W"]), ("rois", ["K", 5])]
        feeds = {"x": x, "rois": rois}
        prof = {"x": ((1, dim * k * k, 2, 2), (n, dim * k * k, h, w), (4, dim * k * k, 16, 16)),
                "rois": ((1, 5), (6, 5), (64, 5))}
        if trans is not None:
            inputs.append(("trans", ["K", trans.shape[1], k, k]))
            feeds["trans"] = trans
            prof["trans"] = tuple((m, trans.shape[1], k, k) for m in (1, 6, 64))
        extra = dict(trans_std=0.1) if trans is not None else dict(no_trans=1)
        model = _model("dcnkit", "DeformPSRoIPool", inputs, [("y", ["K", dim, k, k]), ("count", ["K", dim, k, k])],
                       output_dim=dim, **attrs, **extra)
        tr = None if trans is None else trans[ok]
        want = _with_zero_rows(lambda r: ref.deform_psroi_pool(x, r, tr, 1 / 16, k, dim, k, k, 4, 0.1), rois, n)
        return name, model, feeds, want, prof

    first = case("DeformPSRoIPool R-FCN offsets", 2 * classes, None)
    trans = first[3][0].astype(np.float32)  # the first pass's output drives the second
    boxes = (rng.standard_normal((rois.shape[0], 2, k, k)) * 0.5).astype(np.float32)
    return [first, case("DeformPSRoIPool R-FCN scores", classes, trans), case("DeformPSRoIPool R-FCN boxes", 8, boxes)]


def cases(rng, bad_roi=True, tensorrt_only=True):
    """(name, model, feeds, expected outputs, profile shapes) for every plugin checked. ``bad_roi`` adds a RoI
    with an out-of-range batch index (zeros on the GPU; the CPU kernels reject it with an error instead);
    ``tensorrt_only`` adds the cases only TensorRT runs (TensorRT's own plugin names)."""
    from dcnkit import reference as ref

    n, c, h, w = 2, 8, 12, 10
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    out = []
    # DeformConv2d (DCNv2, 2 offset groups) with weights as initializers.
    wt = (rng.standard_normal((6, c, 3, 3)) * 0.2).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    off = (rng.standard_normal((n, 36, h, w)) * 1.5).astype(np.float32)
    mask = rng.uniform(0, 1, (n, 18, h, w)).astype(np.float32)
    dims = ["N", c, "H", "W"]
    dcn_inputs = [("x", dims), ("offset", ["N", 36, "H", "W"]), ("mask", ["N", 18, "H", "W"])]
    m = _model("dcnkit", "DeformConv2d", dcn_inputs, [("y", ["N", 6, "H", "W"])], [("w", wt), ("b", bias)],
               order=["x", "offset", "w", "b", "mask"], padding=[1, 1], deformable_groups=2)
    feeds = {"x": x, "offset": off, "mask": mask}
    prof = {"x": ((1, c, 4, 4), (n, c, h, w), (4, c, 32, 32)), "offset": ((1, 36, 4, 4), (n, 36, h, w), (4, 36, 32, 32)),
            "mask": ((1, 18, 4, 4), (n, 18, h, w), (4, 18, 32, 32))}
    out.append(("DeformConv2d", m, feeds, [ref.deform_conv2d(x, off, wt, bias, (1, 1), (1, 1), (1, 1), mask)], prof))
    # mmdeploy's MMCVModulatedDeformConv2d: inputs (input, offset, mask, weight, bias).
    m = _model("mmdeploy", "MMCVModulatedDeformConv2d", dcn_inputs, [("y", ["N", 6, "H", "W"])],
               [("w", wt), ("b", bias)],
               stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1, deform_groups=2)
    out.append(("MMCVModulatedDeformConv2d", m, dict(feeds), [out[0][3][0]], prof))

    rois = _rois(rng, 5, n, h * 2, w * 2, bad_roi)  # image coordinates, spatial_scale 0.5
    roi_prof = {"x": ((1, c, 4, 4), (n, c, h, w), (4, c, 32, 32)), "rois": ((1, 5), (6, 5), (64, 5))}
    for mode in ("avg", "max"):
        m = _model("dcnkit", "RoIAlign", [("x", dims), ("rois", ["K", 5])], [("y", ["K", c, 3, 2])],
                   output_size=[3, 2], spatial_scale=0.5, sampling_ratio=2, aligned=1, pool_mode=mode)
        want = _with_zero_rows(lambda r: ref.roi_align(x, r, (3, 2), 0.5, 2, True, mode), rois, n)
        out.append((f"RoIAlign {mode}", m, {"x": x, "rois": rois}, want, roi_prof))
    m = _model("mmcv", "MMCVRoiAlign", [("x", dims), ("rois", ["K", 5])], [("y", ["K", c, 3, 2])],
               output_height=3, output_width=2, spatial_scale=0.5, sampling_ratio=2, mode="max", aligned=1)
    out.append(("MMCVRoiAlign max", m, {"x": x, "rois": rois}, out[-1][3], roi_prof))

    roff = (rng.standard_normal((rois.shape[0], 2, 3, 3)) * 0.3).astype(np.float32)
    m = _model("dcnkit", "DeformRoIPool", [("x", dims), ("rois", ["K", 5]), ("offset", ["K", 2, 3, 3])],
               [("y", ["K", c, 3, 3])], output_size=[3, 3], spatial_scale=0.5, sampling_ratio=2, gamma=0.1)
    ok = rois[:, 0] < n
    want = _with_zero_rows(lambda r: ref.deform_roi_pool(x, r, roff[ok], (3, 3), 0.5, 2, 0.1), rois, n)
    prof = dict(roi_prof, offset=((1, 2, 3, 3), (6, 2, 3, 3), (64, 2, 3, 3)))
    out.append(("DeformRoIPool", m, {"x": x, "rois": rois, "offset": roff}, want, prof))

    xp = rng.standard_normal((n, 2 * 2 * 2, h, w)).astype(np.float32)  # output_dim 2, group_size 2
    trans = (rng.standard_normal((rois.shape[0], 2, 2, 2)) * 0.5).astype(np.float32)
    m = _model("dcnkit", "DeformPSRoIPool", [("x", ["N", 8, "H", "W"]), ("rois", ["K", 5]),
               ("trans", ["K", 2, 2, 2])], [("y", ["K", 2, 2, 2]), ("count", ["K", 2, 2, 2])], spatial_scale=0.5,
               output_size=2, output_dim=2, group_size=2, part_size=2, sample_per_part=2, trans_std=0.1)
    want = _with_zero_rows(lambda r: ref.deform_psroi_pool(xp, r, trans[ok], 0.5, 2, 2, 2, 2, 2, 0.1), rois, n)
    prof = {"x": ((1, 8, 4, 4), (n, 8, h, w), (4, 8, 32, 32)), "rois": roi_prof["rois"],
            "trans": ((1, 2, 2, 2), (6, 2, 2, 2), (64, 2, 2, 2))}
    out.append(("DeformPSRoIPool", m, {"x": xp, "rois": rois, "trans": trans}, want, prof))
    out += rfcn_cases(rng, bad_roi)

    # MultiLevelRoIAlign: rois then two maps (strides 4 and 8 of a 64x64 image); finest_scale 16 sends the
    # larger boxes to level 1. mmdeploy's node: the same with pool_mode as an int (1: avg).
    feats = [rng.standard_normal((n, c, 16, 16)).astype(np.float32), rng.standard_normal((n, c, 8, 8)).astype(np.float32)]
    mrois = _rois(rng, 6, n, 64, 64, bad_roi)
    ml_in = [("rois", ["K", 5]), ("f0", ["N", c, "H0", "W0"]), ("f1", ["N", c, "H1", "W1"])]
    feeds = {"rois": mrois, "f0": feats[0], "f1": feats[1]}
    want = _with_zero_rows(lambda r: ref.multi_level_roi_align(feats, r, (3, 3), [4.0, 8.0], 2, 16, 1.0, True, "avg"),
                           mrois, n)
    prof = {"rois": roi_prof["rois"], "f0": ((1, c, 4, 4), (n, c, 16, 16), (4, c, 32, 32)),
            "f1": ((1, c, 2, 2), (n, c, 8, 8), (4, c, 16, 16))}
    m = _model("dcnkit", "MultiLevelRoIAlign", ml_in, [("y", ["K", c, 3, 3])], output_size=[3, 3],
               featmap_strides=[4.0, 8.0], sampling_ratio=2, finest_scale=16, roi_scale_factor=1.0, aligned=1,
               pool_mode="avg")
    out.append(("MultiLevelRoIAlign", m, feeds, want, prof))
    m = _model("mmdeploy", "MMCVMultiLevelRoiAlign", ml_in, [("y", ["K", c, 3, 3])], output_height=3,
               output_width=3, featmap_strides=[4.0, 8.0], sampling_ratio=2, finest_scale=16, roi_scale_factor=1.0,
               aligned=1, pool_mode=1)
    out.append(("MMCVMultiLevelRoiAlign", m, dict(feeds), want, prof))
    return out + msda_cases(rng, tensorrt_only) + dcnv3_cases(rng)


def _runner(backend, model, precision, shapes):
    if backend == "tensorrt":
        from dcnkit.runtime.tensorrt import TensorRTRunner

        return TensorRTRunner(model, precision=None if precision == "fp32" else precision, shapes=shapes)
    from dcnkit.runtime.runners import make_runner

    return make_runner(model, backend)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="tensorrt", choices=("tensorrt", "ort-cpu", "ort-cuda"))
    p.add_argument("--precisions", default="fp32,fp16", help="comma-separated: fp32, fp16 (tensorrt only)")
    p.add_argument("--iterations", type=int, default=20, help="timed runs per case (default 20)")
    tools = p.add_mutually_exclusive_group()
    tools.add_argument("--only-tools", action="store_true", help="only the TensorRT tool checks (tensorrt_tool_checks.py)")
    tools.add_argument("--skip-tools", action="store_true", help="skip the TensorRT tool checks")
    tools.add_argument("--min-max-dims", action="store_true",
                       help="run every case at its profile's min and max dims and exit (compute-sanitizer's child)")
    args = p.parse_args(argv)
    from dcnkit.runtime.runners import available_backends

    reason = available_backends()[args.backend]
    if reason:
        print(f"{args.backend}: skipped: {reason}")
        return 0
    failures = 0
    if args.backend == "tensorrt" and (args.min_max_dims or not args.skip_tools):
        import tensorrt_tool_checks as tools_

        all_cases = cases(np.random.default_rng(0), bad_roi=True)
        if args.min_max_dims:
            return tools_.run_min_max_dims(all_cases)
        failures += tools_.run_all(all_cases, Path(__file__).resolve(), np.random.default_rng(1))
        if args.only_tools:
            print("PASSED" if failures == 0 else f"FAILED: {failures} check(s)")
            return 1 if failures else 0
    precisions = [s.strip() for s in args.precisions.split(",") if s.strip()]
    bad = [s for s in precisions if s not in TOL or (s != "fp32" and args.backend != "tensorrt")]
    if bad:
        p.error(f"--precisions: expected fp32 (and fp16 for tensorrt), got {bad}")
    print(f"{'case':<36} {'precision':<9} {'max err':>10} {'allowed':>10} {'median ms':>10}  result")
    for name, model, feeds, want, shapes in cases(np.random.default_rng(0), bad_roi=args.backend != "ort-cpu",
                                                  tensorrt_only=args.backend == "tensorrt"):
        for prec in precisions:
            atol, rtol = TOL[prec]
            try:
                with _runner(args.backend, model, prec, shapes) as r:
                    got = list(r.run(feeds).values())
                    times = []
                    for _ in range(args.iterations):
                        t0 = time.perf_counter()
                        r.run(feeds)
                        times.append(time.perf_counter() - t0)
            except Exception as e:  # one failing plugin must not hide the others
                failures += 1
                print(f"{name:<36} {prec:<9} {'-':>10} {'-':>10} {'-':>10}  ERROR {type(e).__name__}: "
                      f"{(str(e).splitlines() or [''])[0]}")
                continue
            err, allowed = 0.0, np.inf
            for g, w in zip(got, want):
                diff = np.abs(g.astype(np.float64) - w)
                lim = atol + rtol * np.abs(w)
                err = max(err, float(diff.max(initial=0)))
                allowed = min(allowed, float(lim.min(initial=np.inf)))
                ok_case = g.shape == w.shape and bool(np.all(diff <= lim))
                if not ok_case:
                    break
            failures += not ok_case
            print(f"{name:<36} {prec:<9} {err:>10.3g} {allowed:>10.3g} {np.median(times) * 1e3:>10.3f}  "
                  f"{'ok' if ok_case else 'MISMATCH'}")
    print("PASSED" if failures == 0 else f"FAILED: {failures} case(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
