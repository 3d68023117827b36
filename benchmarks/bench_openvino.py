"""The openvino backend against the kit on ONNX Runtime: single DCNv2 layers and whole models, three sides each.

    python benchmarks/bench_openvino.py [--threads 2] [--repeat 15] [--models resnet50,frcnn] [--layers] [--bf16]

docs/performance.md's and docs/openvino.md's tables: ``python benchmarks/bench_openvino.py --repeat 20 --bf16``.

Sides (the same ONNX file, interleaved rounds in an order that turns by one side each round, fastest of ``--repeat``;
ONNX Runtime's intra-op spinning off, and a pause after each ONNX Runtime call, so that its idle threads do not slow
the next side):

* ``ov native``  OpenVINO, every standard ``DeformConv`` on OpenVINO's DeformableConvolution-8
                 (``deform_conv="openvino"``);
* ``ov kit``     OpenVINO's default (``make_runner(path, "openvino")``): every ``DeformConv`` on the kit's kernel through
                 ``libdcnkit_ov.so``, its weight packed once for its GEMM;
* ``ort kit``    ONNX Runtime with the kit's library, its default path (``make_runner(path, "ort-cpu")``).

``--bf16`` adds, reported apart (outside the float32 contract; the largest difference from ``ort kit`` printed):

* ``ov kit bf16``           ``inference_precision="bf16"``: OpenVINO's layers in bf16 and the kit's DCN GEMM in bf16
                            (its default there, ``dcn_gemm_precision`` following the model's precision);
* ``ov kit bf16 f32 gemm``  the same with ``dcn_gemm_precision="f32"``: the kit's DCN in float32 inside the bf16 model.

Models: ResNet-50-DCN (DCNv2 in layer3-4, 1x3x224x224, benchmarks/bench_resnet50_dcn.py) and the Faster R-CNN-DCN
example with the fused pooler (examples/faster_rcnn_dcn.py, 320x320). ``--layers``: the DCNv2 layers of
benchmarks/bench_ort_deform_conv.py. Ratios are against ``ort kit``.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, str(ROOT / "examples"))
import _common as C  # noqa: E402

PAUSE_S = 0.15  # after an ONNX Runtime call (docs: its idle threads spin for a while)


def _resnet(quick, out):
    import torch

    import bench_resnet50_dcn as r
    from dcnkit.export import to_onnx

    model, _ = r.resnet50_dcn(quick)
    size = 64 if quick else 224
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0))
    path = out / "resnet50_dcn.onnx"
    to_onnx(model, (x,), str(path), input_names=["x"])
    with torch.no_grad():
        want = model(x).numpy()
    return path, {"x": x.numpy()}, want


def _frcnn(quick, out):
    import faster_rcnn_dcn as ex

    size = 128 if quick else 320
    model = ex.build(size, seed=0, rpn_top_n=50 if quick else 1000)
    image = ex.make_image(size, seed=ex.IMAGE_SEED)
    path = ex.export(model, image, out / "frcnn.onnx")
    return path, {"images": image}, None


def _layer(n, c, h, w, stride, out):
    import bench_ort_deform_conv as b

    data = b._inputs(n, c, h, w, stride)
    model = b._model(False, data, stride)  # the standard DeformConv node, weight and bias as initializers (bytes)
    path = out / f"dcn_{n}x{c}x{h}x{w}_s{stride}.onnx"
    path.write_bytes(model)
    return path, {k: v for k, v in data.items() if k in ("x", "offset", "mask")}, None


def _sides(path, threads, names):
    from dcnkit.runtime.registry import make_runner

    ov = dict(num_threads=threads)
    runners = {
        "ov native": lambda: make_runner(path, "openvino", deform_conv="openvino", **ov),
        "ov kit": lambda: make_runner(path, "openvino", **ov),
        "ort kit": lambda: make_runner(path, "ort-cpu", intra_op_num_threads=threads, inter_op_num_threads=1,
                                       session_config=C.NO_SPIN),
        "ov kit bf16": lambda: make_runner(path, "openvino", inference_precision="bf16", **ov),
        "ov kit bf16 f32 gemm": lambda: make_runner(path, "openvino", inference_precision="bf16",
                                                    dcn_gemm_precision="f32", **ov),
    }
    return {k: runners[k]() for k in names}


def measure(name, path, feeds, args, sides=("ov native", "ov kit", "ort kit")) -> dict:
    import numpy as np

    runners = _sides(path, args.threads, sides)
    outs = {k: r.run(feeds) for k, r in runners.items()}
    base = outs["ort kit"]
    for k, o in outs.items():  # every side computes the same outputs (detections: the same boxes)
        for key in base:
            if "bf16" in k:
                same = base[key].shape == o[key].shape
                diff = float(np.max(np.abs(o[key] - base[key]))) if same and o[key].size else float("nan")
                scale = float(np.max(np.abs(base[key]))) if base[key].size else float("nan")
                print(f"  {name}: {k} output {key}: " + (f"max |diff| {diff:.3g} (largest |value| {scale:.3g})"
                      if same else f"shape {o[key].shape} vs {base[key].shape}"))
                continue
            if base[key].shape != o[key].shape or not np.allclose(o[key], base[key], rtol=1e-3, atol=1e-3):
                print(f"  note: {name}: {k} output {key} differs from ort kit "
                      f"(shape {o[key].shape} vs {base[key].shape})")

    # C.interleaved's rounds, with the pause after an ONNX Runtime call outside the timed region
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    best = {k: float("inf") for k in runners}
    names = list(runners)
    for i in range(args.warmup + max(1, args.repeat)):
        # The order turns each round, so that no side always runs first after ONNX Runtime's pause: with a fixed
        # order the side after it took 2.81 ms on the 1x256x28x28 s2 layer, 1.40 ms with the order turning.
        for k in names[i % len(names):] + names[:i % len(names)]:
            r = runners[k]
            t0 = clock()
            r.run(feeds)
            dt = (clock() - t0) * 1e3
            if i >= args.warmup:
                best[k] = min(best[k], dt)
            if k.startswith("ort"):
                time.sleep(PAUSE_S)
    for r in runners.values():
        r.close()
    ref = best["ort kit"]
    return {"case": name, "ms": best, "ratio_vs_ort_kit": {k: v / ref for k, v in best.items()}}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    C.add_common_args(ap, repeat=15)
    ap.add_argument("--models", default="resnet50,frcnn", help="comma-separated: resnet50, frcnn (default both)")
    ap.add_argument("--layers", action="store_true", help="also the single DCNv2 layers")
    ap.add_argument("--bf16", action="store_true", help="also ov kit with inference_precision=bf16, its DCN GEMM in bf16 and in "
                    "float32 (reported apart)")
    args = ap.parse_args(argv)
    if args.quick:
        args.repeat, args.warmup = 1, 0
    import torch

    torch.set_num_threads(args.threads)
    out = Path(tempfile.mkdtemp())
    rows = []
    sides = ("ov native", "ov kit", "ort kit") + (("ov kit bf16", "ov kit bf16 f32 gemm") if args.bf16 else ())
    if args.layers:
        import bench_ort_deform_conv as b

        for shape in (b.QUICK_SHAPES if args.quick else b.SHAPES):
            path, feeds, _ = _layer(*shape, out)
            rows.append(measure("DCNv2 {}x{}x{}x{} s{}".format(*shape), path, feeds, args, sides))
    builders = {"resnet50": ("ResNet-50-DCN 224", _resnet), "frcnn": ("Faster R-CNN-DCN 320 (fused pooler)", _frcnn)}
    for key in [m.strip() for m in args.models.split(",") if m.strip()]:
        if key not in builders:
            raise SystemExit(f"--models: expected resnet50 or frcnn, got {key!r}")
        title, build = builders[key]
        path, feeds, _ = build(args.quick, out)
        rows.append(measure(title, path, feeds, args, sides))
    sides = list(rows[0]["ms"]) if rows else []
    print(f"threads {args.threads}, {args.clock} clock, fastest of {args.repeat} interleaved rounds; "
          "ratio = time / ort kit's time")
    C.print_table(["case", *[f"{s} ms" for s in sides], *[f"{s} ratio" for s in sides if s != "ort kit"]],
                  [[r["case"], *[f"{r['ms'][s]:.2f}" for s in sides],
                    *[f"{r['ratio_vs_ort_kit'][s]:.2f}" for s in sides if s != "ort kit"]] for r in rows])
    return C.write_json(args, rows)


if __name__ == "__main__":
    main()
