"""INT8 on the CPU: ResNet-50-DCN quantized by ``dcnkit quantize`` vs its float32 model, on ONNX Runtime's CPU EP,
and the quantized DeformConv2d (``dcnkit::QDeformConv2d``) alone vs the kit's float kernel.

    python benchmarks/bench_int8.py [--threads 2] [--repeat 10] [--calibration 16] [--quick] [--layers-only]

The model is benchmarks/bench_resnet50_dcn.py's (torchvision's ResNet-50, DCNv2 in the 3x3 convolutions of layer3
and layer4, 1x3x224x224), and, for the machine's own int8 gain, plain ResNet-50. Each is exported once, quantized
statically (QDQ, int8 weights per channel, uint8 activations, MinMax calibration on ``--calibration`` random
images: :func:`dcnkit.runtime.quantize.quantize`), and run interleaved on ONNX Runtime (the kit's library, its
DeformConv2d float between DequantizeLinear and QuantizeLinear: "int8 float-DCN"; or, where the library finds
oneDNN, each DCN as one ``dcnkit::QDeformConv2d``: "int8"). Accuracy: cosine similarity of the int8 logits to the
float32 logits on 8 images not used for calibration. Times are the fastest of interleaved rounds.

Layers: bench_ort_deform_conv.py's SHAPES (3x3, pad 1, mask and bias), the kit's float ``DeformConv2d`` node vs a
``QDeformConv2d`` node on the same values quantized (uint8 input and output per tensor, int8 weights per channel,
7-bit as ``dcnkit quantize`` writes them), interleaved per shape.
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
    ap.add_argument("--layers-only", action="store_true", help="only the QDeformConv2d vs DeformConv2d layers")
    args = ap.parse_args(argv)
    from dcnkit.runtime.quantize_qdeform import qdeform_available

    layers = _layers(args) if qdeform_available() else {}
    if args.layers_only:
        C.write_json(args, {"threads": args.threads, "layers": layers})
        return layers
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
        feeds = [{n: c[None]} for c in calib]
        variants = {"fp32": f32, "int8": str(quantize(f32, os.path.join(tmp, f"{name}.int8.onnx"), feeds))}
        if name != "ResNet-50" and qdeform_available():  # int8 with the kit's float DeformConv2d between Q/DQ
            variants["int8 float-DCN"] = str(quantize(f32, os.path.join(tmp, f"{name}.int8f.onnx"), feeds,
                                                      qdeform=False))
        sessions = {v: ort_session(p, **opts) for v, p in variants.items()}
        ys = {v: np.concatenate([s.run(None, {n: h[None]})[0] for h in held_out]) for v, s in sessions.items()}
        for v, s in sessions.items():
            fns[f"{name} {v}"] = C.ort_call(s, {n: x})
            if v != "fp32":
                acc[f"{name} {v}"] = float(_cosines(ys[v], ys["fp32"]).min())
    ms = C.interleaved(fns, args.repeat, args.warmup)
    print(f"int8 vs fp32 on ONNX Runtime's CPU EP, input 1x3x{size}x{size}, {args.threads} threads, fastest of "
          f"{args.repeat} rounds, {args.calibration} calibration images")
    rows = []
    for key in acc:
        name = key.rsplit(" int8", 1)[0]
        a, b = ms[f"{name} fp32"], ms[key]
        rows.append([key, f"{a:.1f}", f"{b:.1f}", f"{b / a:.2f}x", f"{acc[key]:.4f}"])
    C.print_table(["model", "fp32 ms", "int8 ms", "int8 / fp32", "min cosine (8 held-out)"], rows)
    C.write_json(args, {"threads": args.threads, "ms": ms, "cosine_min": acc, "layers": layers})
    return ms


def _layers(args) -> dict:
    """QDeformConv2d vs the kit's float DeformConv2d node on bench_ort_deform_conv.py's shapes."""
    import numpy as np
    from bench_ort_deform_conv import QUICK_SHAPES, SHAPES, _inputs, _model
    from onnx import TensorProto, helper, numpy_helper

    from dcnkit.runtime import ort_session
    from dcnkit.runtime.quantize_qdeform import quantize_weight_per_channel

    opts = dict(providers=["CPUExecutionProvider"], intra_op_num_threads=args.threads, inter_op_num_threads=1)
    fns, rows, out = {}, [], {}
    for n, c, h, w, stride in (QUICK_SHAPES if args.quick else SHAPES):
        d = _inputs(n, c, h, w, stride)
        key = f"{n}x{c}x{h}x{w}/s{stride}"
        f32 = ort_session(_model(True, d, stride), **opts)
        xs = float(np.abs(d["x"]).max() * 2 / 255)
        xq = np.clip(np.rint(d["x"] / xs) + 128, 0, 255).astype(np.uint8)
        wq, ws = quantize_weight_per_channel(d["weight"], reduce_range=True)
        yf = f32.run(None, {k: d[k] for k in ("x", "offset", "mask")})[0]
        ys = float(np.abs(yf).max() * 2 / 255)
        inits = {"xs": np.float32(xs), "xz": np.uint8(128), "w": wq, "ws": ws, "wz": np.zeros(c, np.int8),
                 "b": d["bias"], "ys": np.float32(ys), "yz": np.uint8(128)}
        node = helper.make_node("QDeformConv2d", ["x", "xs", "xz", "w", "ws", "wz", "offset", "mask", "b", "ys", "yz"],
                                ["y"], domain="dcnkit", padding=[1, 1], stride=[stride, stride])
        ins = [helper.make_tensor_value_info("x", TensorProto.UINT8, list(xq.shape))] + [
            helper.make_tensor_value_info(k, TensorProto.FLOAT, list(d[k].shape)) for k in ("offset", "mask")]
        g = helper.make_graph([node], "q", ins, [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
        q8 = ort_session(helper.make_model(g, opset_imports=[helper.make_opsetid("", 19),
                                                             helper.make_opsetid("dcnkit", 1)],
                                           ir_version=10).SerializeToString(), **opts)
        qfeeds = {"x": xq, "offset": d["offset"], "mask": d["mask"]}
        yq = (q8.run(None, qfeeds)[0].astype(np.float64) - 128) * ys
        out[key] = {"max_err_steps": float(np.abs(yq - yf).max() / ys)}
        fns[f"{key} float"] = C.ort_call(f32, {k: d[k] for k in ("x", "offset", "mask")})
        fns[f"{key} int8"] = C.ort_call(q8, qfeeds)
    ms = C.interleaved(fns, args.repeat, args.warmup)
    for key in out:
        a, b = ms[f"{key} float"], ms[f"{key} int8"]
        out[key].update(float_ms=a, int8_ms=b, ratio=b / a)
        rows.append([key, f"{a:.2f}", f"{b:.2f}", f"{b / a:.2f}x", f"{out[key]['max_err_steps']:.2f}"])
    print(f"QDeformConv2d (uint8, oneDNN u8s8s32) vs DeformConv2d (float32, OpenBLAS) on ONNX Runtime, "
          f"{args.threads} threads, fastest of {args.repeat} interleaved rounds")
    C.print_table(["N x C x H x W / stride", "float ms", "int8 ms", "int8 / float", "max |int8 - float32| (y steps)"],
                  rows)
    return out


def _input_name(path):
    import onnx

    m = onnx.load(path, load_external_data=False)
    init = {t.name for t in m.graph.initializer}
    return [i.name for i in m.graph.input if i.name not in init][0]


if __name__ == "__main__":
    main()
