"""INT8 on the CPU: ResNet-50-DCN quantized by ``dcnkit quantize`` vs its float32 model, on ONNX Runtime's CPU EP,
one row per ONNX writer, and the quantized DeformConv2d (``dcnkit::QDeformConv2d``) alone vs the kit's float kernel.

    python benchmarks/bench_int8.py [--threads 2] [--repeat 10] [--calibration 16] [--writers ts17,dynamo,...]
                                    [--quick] [--layers-only]

The model is benchmarks/bench_resnet50_dcn.py's (torchvision's ResNet-50, DCNv2 in the 3x3 convolutions of layer3
and layer4, 1x3x224x224). It is written by each writer of benchmarks/onnx_writers.py (torch's TorchScript exporter at
opsets 16-20 and with a fixed batch, its dynamo exporter, ``dcnkit export`` with standard and custom ops, mmdeploy's
node names; ``--writers``), each file is quantized statically (QDQ, int8 weights per channel, uint8 activations,
MinMax calibration on the same ``--calibration`` random images: :func:`dcnkit.runtime.quantize.quantize`, with its
pre-processing), and every fp32 and int8 file runs interleaved on ONNX Runtime in one run. Where the kit's library
finds oneDNN each DCN is one ``dcnkit::QDeformConv2d`` ("int8"); the ``dcnkit`` file is also quantized with the
kit's float DeformConv2d between DequantizeLinear and QuantizeLinear ("int8 float-DCN"). Plain ResNet-50 gives the
machine's own int8 gain. Accuracy: cosine similarity of the int8 logits to the file's float32 logits on 8 images not
used for calibration. Times are the fastest of interleaved rounds.

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
import onnx_writers  # noqa: E402

QUICK_WRITERS = ("dcnkit", "ts17")


def _cosines(a, b):
    import numpy as np

    a, b = a.reshape(len(a), -1).astype(np.float64), b.reshape(len(b), -1).astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _writers(text, quick):
    if text is None:
        return QUICK_WRITERS if quick else onnx_writers.WRITERS
    ws = tuple(w for w in text.split(",") if w)
    bad = [w for w in ws if w not in onnx_writers.WRITERS]
    if bad or not ws:
        raise SystemExit(f"--writers: expected names of {', '.join(onnx_writers.WRITERS)}, got {text!r}")
    return ws


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    C.add_common_args(ap, repeat=10)
    ap.add_argument("--calibration", type=int, default=16, help="random calibration images (default 16)")
    ap.add_argument("--writers", help=f"comma-separated ONNX writers (default all: {','.join(onnx_writers.WRITERS)}; "
                    f"--quick: {','.join(QUICK_WRITERS)})")
    ap.add_argument("--layers-only", action="store_true", help="only the QDeformConv2d vs DeformConv2d layers")
    args = ap.parse_args(argv)
    writers = _writers(args.writers, args.quick)
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
    from dcnkit.runtime.quantize import quantize, quantize_with_summary

    size = 64 if args.quick else 224
    rng = np.random.default_rng(0)
    calib = rng.standard_normal((args.calibration, 3, size, size)).astype(np.float32)
    held_out = rng.standard_normal((8, 3, size, size)).astype(np.float32)
    x = held_out[:1]
    tmp = tempfile.mkdtemp(prefix="dcnkit-int8-")
    opts = dict(providers=["CPUExecutionProvider"], intra_op_num_threads=args.threads, inter_op_num_threads=1,
                log_severity_level=3, session_config=C.NO_SPIN)  # ONNX Runtime's notes on the TorchScript files' CastLike nodes
    factory = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_resnet50_dcn.py:resnet50_dcn_model")
    files = {f"ResNet-50-DCN {w}": p for w, p in onnx_writers.write_all(
        factory, (1, 3, size, size), tmp, writers, quick=args.quick).items()}
    if not args.quick:  # the machine's own int8 gain on a model without the kit's nodes
        torch.manual_seed(0)
        files["ResNet-50"] = os.path.join(tmp, "resnet50.onnx")
        dcnkit.export.to_onnx(torchvision.models.resnet50(weights=None).eval(), (torch.from_numpy(x),),
                              files["ResNet-50"], dynamic_batch=True, input_names=["x"], verbose=False)
    fns, acc, nodes = {}, {}, {}
    for name, f32 in files.items():
        feeds = [{"x": c[None]} for c in calib]
        q8, summary = quantize_with_summary(f32, f32.replace(".onnx", ".int8.onnx"), feeds)
        nodes[name] = summary.int8
        variants = {"fp32": f32, "int8": str(q8)}
        if name.endswith(" dcnkit") and qdeform_available():  # int8 with the kit's float DeformConv2d between Q/DQ
            variants["int8 float-DCN"] = str(quantize(f32, f32.replace(".onnx", ".int8f.onnx"), feeds, qdeform=False))
        for v, p in variants.items():
            s = ort_session(p, **opts)
            y = np.concatenate([s.run(None, {"x": h[None]})[0] for h in held_out])
            fns[f"{name} {v}"] = C.ort_call(s, {"x": x})
            if v == "fp32":
                ref = y
            else:
                acc[f"{name} {v}"] = float(_cosines(y, ref).min())
    ms = C.interleaved(fns, args.repeat, args.warmup)
    print(f"int8 vs fp32 on ONNX Runtime's CPU EP, input 1x3x{size}x{size}, {args.threads} threads, fastest of "
          f"{args.repeat} interleaved rounds, {args.calibration} calibration images")
    rows, ratios = [], {}
    for key in acc:
        name = key.rsplit(" int8", 1)[0]
        a, b = ms[f"{name} fp32"], ms[key]
        writer = name.split(" ", 1)[1] if name.startswith("ResNet-50-DCN ") else None
        label = f"ResNet-50-DCN, {onnx_writers.LABELS[writer]}" if writer else name
        n = nodes[name]
        rows.append([label + key[len(name) + len(" int8"):], f"{a:.1f}", f"{b:.1f}", f"{b / a:.2f}x",
                     f"{acc[key]:.4f}", f"{n['Conv']}/{n['MatMul']}/{n['DeformConv'] if key.endswith('int8') else 0}"])
        if writer and key.endswith(" int8"):
            ratios[writer] = b / a
    C.print_table(["model, ONNX writer", "fp32 ms", "int8 ms", "int8 / fp32", "min cosine (8 held-out)",
                   "int8 Conv/MatMul/DCN"], rows)
    if len(ratios) > 1:
        lo, hi = min(ratios.values()), max(ratios.values())
        print(f"int8 / fp32 across {len(ratios)} writers: {lo:.2f}x .. {hi:.2f}x (largest / smallest {hi / lo:.2f})")
    C.write_json(args, {"threads": args.threads, "ms": ms, "cosine_min": acc, "int8_nodes": nodes,
                        "writer_ratio": ratios, "layers": layers})
    return ms


def _layers(args) -> dict:
    """QDeformConv2d vs the kit's float DeformConv2d node on bench_ort_deform_conv.py's shapes."""
    import numpy as np
    from bench_ort_deform_conv import QUICK_SHAPES, SHAPES, _inputs, _model
    from onnx import TensorProto, helper, numpy_helper

    from dcnkit.runtime import ort_session
    from dcnkit.runtime.quantize_qdeform import quantize_weight_per_channel

    opts = dict(providers=["CPUExecutionProvider"], intra_op_num_threads=args.threads, inter_op_num_threads=1,
                session_config=C.NO_SPIN)
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


if __name__ == "__main__":
    main()
