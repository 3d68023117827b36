"""Benchmark: DCNv2 in ONNX Runtime — the kit's ``dcnkit::DeformConv2d`` vs ONNX Runtime's built-in
``DeformConv`` (opset 19) vs the PyTorch path (``dcnkit.ops.deform_conv2d``), in one run.

    python benchmarks/bench_ort_deform_conv.py [--threads 2] [--repeat 7] [--json out.json]

Shapes: N1 C64 64x64 and N4 C256 32x32 (Cout = Cin), 3x3, pad 1, with mask and bias, float32 on the CPU.
ONNX Runtime sessions use ``--threads`` intra-op threads, PyTorch ``torch.set_num_threads(--threads)``.
Each timing is the median of ``--repeat`` runs after warm-up; the outputs of the three paths are checked
against each other before timing. Prints milliseconds and the ratios built-in / kit and torch / kit
(> 1: the kit is faster).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

SHAPES = [(1, 64, 64, 64), (4, 256, 32, 32)]


def _inputs(n, c, h, w, seed=0):
    rng = np.random.default_rng(seed)
    k = 3
    return {
        "x": rng.standard_normal((n, c, h, w)).astype(np.float32),
        "offset": (rng.standard_normal((n, 2 * k * k, h, w)) * 2).astype(np.float32),
        "mask": rng.uniform(0, 1, (n, k * k, h, w)).astype(np.float32),
        "weight": (rng.standard_normal((c, c, k, k)) / (c * k * k) ** 0.5).astype(np.float32),
        "bias": rng.standard_normal(c).astype(np.float32),
    }


def _model(kit: bool, c: int):
    shapes = {"x": ["N", c, "H", "W"], "offset": ["N", 18, "H", "W"], "mask": ["N", 9, "H", "W"],
              "weight": [c, c, 3, 3], "bias": [c]}
    if kit:
        names = ["x", "offset", "weight", "bias", "mask"]
        node = helper.make_node("DeformConv2d", names, ["y"], domain="dcnkit", padding=[1, 1])
        opsets = [helper.make_opsetid("", 19), helper.make_opsetid("dcnkit", 1)]
    else:
        names = ["x", "weight", "offset", "bias", "mask"]
        node = helper.make_node("DeformConv", names, ["y"], pads=[1, 1, 1, 1], kernel_shape=[3, 3])
        opsets = [helper.make_opsetid("", 19)]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, shapes[n]) for n in names],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def _time(fn, repeat: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args(argv)

    import torch

    import dcnkit
    from dcnkit.runtime import ort_session

    torch.set_num_threads(args.threads)
    print(f"onnxruntime {ort.__version__}, torch {torch.__version__}, {args.threads} threads, "
          f"library {dcnkit.ort_library()}")
    header = f"{'shape':>22} | {'kit ORT ms':>10} | {'ORT DeformConv ms':>17} | {'torch ms':>9} | " \
             f"{'builtin/kit':>11} | {'torch/kit':>9}"
    print(header)
    print("-" * len(header))
    results = []
    for n, c, h, w in SHAPES:
        feeds = _inputs(n, c, h, w)
        kit = ort_session(_model(True, c), providers=["CPUExecutionProvider"], intra_op_num_threads=args.threads,
                          inter_op_num_threads=1)
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        builtin = ort.InferenceSession(_model(False, c), so, providers=["CPUExecutionProvider"])
        t = {k: torch.from_numpy(v) for k, v in feeds.items()}

        def run_torch():
            with torch.inference_mode():
                return dcnkit.ops.deform_conv2d(t["x"], t["offset"], t["weight"], t["bias"], padding=(1, 1),
                                                mask=t["mask"])

        y_kit = kit.run(None, feeds)[0]
        y_builtin = builtin.run(None, feeds)[0]
        y_torch = run_torch().numpy()
        np.testing.assert_allclose(y_kit, y_builtin, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(y_kit, y_torch, rtol=1e-4, atol=1e-4)

        ms_kit = _time(lambda: kit.run(None, feeds), args.repeat)
        ms_builtin = _time(lambda: builtin.run(None, feeds), args.repeat)
        ms_torch = _time(run_torch, args.repeat)
        shape = f"N{n} C{c} {h}x{w}"
        print(f"{shape:>22} | {ms_kit:10.2f} | {ms_builtin:17.2f} | {ms_torch:9.2f} | "
              f"{ms_builtin / ms_kit:11.2f} | {ms_torch / ms_kit:9.2f}")
        results.append({"shape": [n, c, h, w], "threads": args.threads, "kit_ort_ms": ms_kit,
                        "ort_deformconv_ms": ms_builtin, "torch_ms": ms_torch,
                        "builtin_over_kit": ms_builtin / ms_kit, "torch_over_kit": ms_torch / ms_kit})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
