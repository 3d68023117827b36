"""Benchmark: DCNv2 in ONNX Runtime — the kit's ``dcnkit::DeformConv2d`` vs ONNX Runtime's built-in
``DeformConv`` (opset 19) vs the PyTorch path (``dcnkit.ops.deform_conv2d``), in one run.

    python benchmarks/bench_ort_deform_conv.py [--device cpu|cuda] [--threads 2] [--repeat 15] [--json out.json]
                                               [--shape N,C,H,W[,STRIDE] ...] [--set default|acceptance|detectors]
                                               [--spin]

docs/performance.md's tables: ``python benchmarks/bench_ort_deform_conv.py --device cpu --no-spin --repeat 20 --set
acceptance`` (issue 46's acceptance layers) and ``... --set detectors`` (the stage 3-5 layers of ResNet-50/101-DCN and
a Faster R-CNN-DCN at 224-1333 px).

Shapes (``SHAPES``): issue 31's four detector layers, the earlier C64 one and the DCN layers of ResNet-50-DCN at
224x224 and of the Faster R-CNN-DCN at 320x320 (C_out = C_in, 3x3, pad 1, stride 1 or 2), with mask and bias,
float32; the models have static shapes and the weight and bias as initializers, as an exported network. Sessions:
``kit`` a model with the ``dcnkit::DeformConv2d`` node; ``kit (rewrite)`` the standard ``DeformConv`` model through
``dcnkit.runtime.ort_session`` (its default: rewritten in memory onto the kit's kernel where
every node); ``built-in`` the same standard model with
``kit_kernels=False``. ONNX Runtime uses ``--threads`` intra-op threads, PyTorch
``torch.set_num_threads(--threads)``; on CUDA the CUDA execution provider (when onnxruntime has it) and the
PyTorch CUDA op, and TensorRT engines (the kit's plugin; float32 and float16) when TensorRT is importable.
Outputs are checked against the kit's (accuracy per dtype, reported; only a gross mismatch stops it) before
timing; on the CUDA EP with TF32 off and IO binding (inputs and outputs on the GPU); times are the fastest of interleaved rounds; the ratios
are kit / built-in and default / built-in (< 1: the kit is faster) and torch / kit.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

# (N, C, H, W, stride), C_out = C: issue 31's four detector layers, the earlier two, and the DCN layers of the
# examples: ResNet-50-DCN at 224x224 (bench_resnet50_dcn.py) and the Faster R-CNN-DCN at 320x320
# (examples/faster_rcnn_dcn.py), layer3 (C256) and layer4 (C512), first block stride 2.
ISSUE_SHAPES = [(1, 256, 20, 20, 1), (1, 512, 10, 10, 1), (1, 256, 40, 40, 1), (4, 256, 32, 32, 1)]
EARLIER_SHAPES = [(1, 64, 64, 64, 1)]
RESNET50_224 = [(1, 256, 28, 28, 2), (1, 256, 14, 14, 1), (1, 512, 14, 14, 2), (1, 512, 7, 7, 1)]
FASTER_RCNN_320 = [(1, 256, 40, 40, 2), (1, 512, 20, 20, 2)]  # + (1, 256, 20, 20) and (1, 512, 10, 10) above
SHAPES = ISSUE_SHAPES + EARLIER_SHAPES + RESNET50_224 + FASTER_RCNN_320
QUICK_SHAPES = [(1, 8, 12, 12, 1), (1, 8, 12, 12, 2)]
# Issue 46's acceptance layers, and the C1024 8x8 map at batch 1.
ACCEPTANCE_SHAPES = [(1, 256, 20, 20, 1), (1, 512, 10, 10, 1), (1, 256, 40, 40, 1), (4, 256, 32, 32, 1),
                     (2, 1024, 8, 8, 1), (1, 1024, 8, 8, 1)]
# Stage 3-5 DCN layers of ResNet-50/101-DCN and Faster R-CNN-DCN at 224-1333 px (C256 14-84, C512 7-42, C1024/2048
# 7-21), batch 1, and batch 4 on the small maps.
DETECTOR_SHAPES = [(1, 256, 14, 14, 1), (1, 256, 28, 28, 1), (1, 256, 56, 56, 1), (1, 256, 84, 84, 1),
                   (1, 512, 7, 7, 1), (1, 512, 14, 14, 1), (1, 512, 28, 28, 1), (1, 512, 42, 42, 1),
                   (1, 1024, 7, 7, 1), (1, 1024, 14, 14, 1), (1, 1024, 21, 21, 1), (1, 2048, 7, 7, 1),
                   (1, 2048, 14, 14, 1), (4, 256, 14, 14, 1), (4, 512, 7, 7, 1), (4, 1024, 7, 7, 1)]
SETS = {"default": SHAPES, "acceptance": ACCEPTANCE_SHAPES, "detectors": DETECTOR_SHAPES}


def _out_size(size: int, stride: int) -> int:
    return (size + 2 - 3) // stride + 1  # 3x3, padding 1


def _inputs(n, c, h, w, stride=1, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    k = 3
    ho, wo = _out_size(h, stride), _out_size(w, stride)
    return {
        "x": rng.standard_normal((n, c, h, w)).astype(np.float32),
        "offset": (rng.standard_normal((n, 2 * k * k, ho, wo)) * 2).astype(np.float32),
        "mask": rng.uniform(0, 1, (n, k * k, ho, wo)).astype(np.float32),
        "weight": (rng.standard_normal((c, c, k, k)) / (c * k * k) ** 0.5).astype(np.float32),
        "bias": rng.standard_normal(c).astype(np.float32),
    }


WEIGHTS = ("weight", "bias")  # initializers in the models, as in an exported network


def _model(kit: bool, data: dict, stride: int = 1):
    """The one-node model; ``data`` (``_inputs``) gives the weight and bias, stored as initializers."""
    from onnx import TensorProto, helper, numpy_helper

    # Static shapes, as a detector exported at a fixed input size: ort_session's rule sees each node's output map.
    shapes = {k: list(data[k].shape) for k in ("x", "offset", "mask")}
    if kit:
        names = ["x", "offset", "weight", "bias", "mask"]
        node = helper.make_node("DeformConv2d", names, ["y"], domain="dcnkit", padding=[1, 1],
                                stride=[stride, stride], plugin_namespace="dcnkit")
        opsets = [helper.make_opsetid("", 19), helper.make_opsetid("dcnkit", 1)]
    else:
        names = ["x", "weight", "offset", "bias", "mask"]
        node = helper.make_node("DeformConv", names, ["y"], pads=[1, 1, 1, 1], kernel_shape=[3, 3],
                                strides=[stride, stride])
        opsets = [helper.make_opsetid("", 19)]
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, shapes[n]) for n in names if n in shapes],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(data[n], n) for n in WEIGHTS])
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def _shape_arg(text: str) -> tuple[int, int, int, int, int]:
    try:
        v = [int(t) for t in text.split(",")]
    except ValueError:
        v = []
    if len(v) not in (4, 5) or min(v) < 1:
        raise argparse.ArgumentTypeError(f"--shape: expected N,C,H,W[,STRIDE] (positive integers), got {text!r}")
    return (*v, 1)[:5] if len(v) == 4 else tuple(v)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    C.add_common_args(ap)
    ap.add_argument("--shape", action="append", type=_shape_arg, metavar="N,C,H,W[,STRIDE]",
                    help="only this shape (repeatable); default: all of SHAPES")
    ap.add_argument("--set", choices=sorted(SETS), default="default", help="the shapes when no --shape is given")
    C.add_no_spin_arg(ap)
    args = ap.parse_args(argv)
    no_spin = C.no_spin_options(args)
    device = C.resolve_device(args)
    import onnxruntime as ort
    import torch

    import dcnkit
    from dcnkit.runtime import ort_session

    providers = C.ort_providers(device)  # CUDA EP with TF32 off: float32 kernels exact on both sides
    if device == "cuda":
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    trt_reason = C.tensorrt_available()
    ep = providers[0][0] if isinstance(providers[0], tuple) else providers[0]
    print(f"onnxruntime {ort.__version__} ({ep}), torch {torch.__version__} on {device}, {args.threads} "
          f"threads, fastest of {args.repeat} interleaved rounds; library {dcnkit.ort_library()}")
    if trt_reason:
        print(f"TensorRT skipped: {trt_reason}")
    opts = dict(intra_op_num_threads=args.threads, inter_op_num_threads=1, **no_spin)
    table, results = [], []
    for n, c, h, w, stride in args.shape or (QUICK_SHAPES if args.quick else SETS[args.set]):
        data = _inputs(n, c, h, w, stride)
        feeds = {k: v for k, v in data.items() if k not in WEIGHTS}
        kit = ort_session(_model(True, data, stride), providers=providers, **opts)
        rewrite = ort_session(_model(False, data, stride), providers=providers, **opts)
        builtin = ort_session(_model(False, data, stride), providers=providers, kit_kernels=False, **opts)
        t = {k: torch.from_numpy(v).to(device) for k, v in data.items()}

        def run_torch():
            with torch.inference_mode():
                return dcnkit.ops.deform_conv2d(t["x"], t["offset"], t["weight"], t["bias"], stride=stride, padding=1,
                                                mask=t["mask"])

        y_kit = kit.run(None, feeds)[0]
        accuracy = [C.check_accuracy(f"{label} vs kit, {device}", y, y_kit) for label, y in
                    (("kit (rewrite)", rewrite.run(None, feeds)[0]), ("built-in", builtin.run(None, feeds)[0]),
                     ("torch", run_torch()))]
        fns = {"kit": C.ort_call(kit, feeds), "kit (rewrite)": C.ort_call(rewrite, feeds),
               "built-in": C.ort_call(builtin, feeds), "torch": run_torch}
        ms = C.interleaved(fns, args.repeat, args.warmup, C.synchronizer(device))
        if trt_reason is None:
            from dcnkit.runtime.tensorrt import TensorRTRunner

            for prec in (None, "fp16"):
                with TensorRTRunner(_model(True, data, stride), precision=prec) as r:
                    ms[f"TensorRT {prec or 'fp32'}"] = C.interleaved({"t": lambda: r.run(feeds)}, args.repeat,
                                                                     args.warmup)["t"]
        shape = f"N{n} C{c} {h}x{w}" + (f" s{stride}" if stride != 1 else "")
        table.append([shape, f"{ms['kit']:.2f}", f"{ms['kit (rewrite)']:.2f}", f"{ms['built-in']:.2f}",
                      f"{ms['torch']:.2f}", f"{ms['kit'] / ms['built-in']:.2f}x",
                      f"{ms['kit (rewrite)'] / ms['built-in']:.2f}x", f"{ms['torch'] / ms['kit']:.2f}"]
                     + [f"{ms[k]:.2f}" for k in ("TensorRT fp32", "TensorRT fp16") if k in ms])
        results.append({"shape": [n, c, h, w], "stride": stride, "threads": args.threads, "device": device, "providers": providers,
                        "ms": ms, "kit_over_builtin": ms["kit"] / ms["built-in"], "accuracy": accuracy})
    header = ["shape", "kit ORT ms", "default ms", "ORT DeformConv ms", "torch ms", "kit/built-in",
              "default/built-in", "torch/kit"]
    if trt_reason is None:
        header += ["TensorRT fp32 ms", "TensorRT fp16 ms"]
    C.print_table(header, table)
    return C.write_json(args, results)


if __name__ == "__main__":
    main()
