"""INT8 on the CPU: ResNet-50-DCN quantized by ``dcnkit quantize`` vs its float32 model, on ONNX Runtime's CPU EP.

    python benchmarks/bench_int8.py [--threads 2] [--repeat 10] [--calibration 16] [--quick]

The model is benchmarks/bench_resnet50_dcn.py's (torchvision's ResNet-50, DCNv2 in the 3x3 convolutions of layer3
and layer4, 1x3x224x224), and, for the machine's own int8 gain, plain ResNet-50. Each is exported once, quantized
statically (QDQ, int8 weights per channel, uint8 activations, MinMax calibration on ``--calibration`` random
images: :func:`dcnkit.runtime.quantize.quantize`), and run interleaved on ONNX Runtime (the kit's library, its
DeformConv2d float between DequantizeLinear and QuantizeLinear). Accuracy: cosine similarity of the int8 logits to
the float32 logits on 8 images not used for calibration. Times are the fastest of interleaved rounds.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from bench_resnet50_dcn import resnet50_dcn  # noqa: E402


def _cosines(a, b):
    import numpy as np

    a, b = a.reshape(len(a), -1).astype(np.float64), b.reshape(len(b), -1).astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    C.add_common_args(ap, repeat=10)
    ap.add_argument("--calibration", type=int, default=16, help="random calibration images (default 16)")
    args = ap.parse_args(argv)
    import numpy as np
    import torch
    import torchvision

    import dcnkit.export
    from dcnkit.runtime import ort_session
    from dcnkit.runtime.quantize import quantize

    size = 64 if args.quick else 224
    rng = np.random.default_rng(0)
    calib = rng.standard_normal((args.calibration, 3, size, size)).astype(np.float32)
    held_out = rng.standard_normal((8, 3, size, size)).astype(np.float32)
    x = held_out[:1]
    torch.manual_seed(0)
    plain = torchvision.models.resnet50(weights=None).eval()
    models = {"ResNet-50-DCN": resnet50_dcn(args.quick)[0]}
    if not args.quick:  # the machine's own int8 gain on a model without the kit's nodes
        models["ResNet-50"] = plain
    tmp = tempfile.mkdtemp(prefix="dcnkit-int8-")
    opts = dict(providers=["CPUExecutionProvider"], intra_op_num_threads=args.threads, inter_op_num_threads=1)
    fns, acc = {}, {}
    for name, model in models.items():
        f32 = os.path.join(tmp, f"{name}.onnx")
        dcnkit.export.to_onnx(model, (torch.from_numpy(x),), f32, dynamic_batch=True, verbose=False)
        n = _input_name(f32)
        i8 = str(quantize(f32, os.path.join(tmp, f"{name}.int8.onnx"), [{n: c[None]} for c in calib]))
        s32, s8 = ort_session(f32, **opts), ort_session(i8, **opts)
        fns[f"{name} fp32"] = C.ort_call(s32, {n: x})
        fns[f"{name} int8"] = C.ort_call(s8, {n: x})
        y32 = np.concatenate([s32.run(None, {n: h[None]})[0] for h in held_out])
        y8 = np.concatenate([s8.run(None, {n: h[None]})[0] for h in held_out])
        acc[name] = float(_cosines(y8, y32).min())
    ms = C.interleaved(fns, args.repeat, args.warmup)
    print(f"int8 vs fp32 on ONNX Runtime's CPU EP, input 1x3x{size}x{size}, {args.threads} threads, fastest of "
          f"{args.repeat} rounds, {args.calibration} calibration images")
    rows = []
    for name in models:
        a, b = ms[f"{name} fp32"], ms[f"{name} int8"]
        rows.append([name, f"{a:.1f}", f"{b:.1f}", f"{b / a:.2f}x", f"{acc[name]:.4f}"])
    C.print_table(["model", "fp32 ms", "int8 ms", "int8 / fp32", "min cosine (8 held-out)"], rows)
    C.write_json(args, {"threads": args.threads, "ms": ms, "cosine_min": acc})
    return ms


def _input_name(path):
    import onnx

    m = onnx.load(path, load_external_data=False)
    init = {t.name for t in m.graph.initializer}
    return [i.name for i in m.graph.input if i.name not in init][0]


if __name__ == "__main__":
    main()
