"""`dcnkit quantize` gives the same int8 model whatever wrote the file (issue 41): torch's TorchScript exporter at
opsets 16-20 (dynamic and fixed batch), its dynamo exporter, `dcnkit export` with standard and custom ops, and
mmdeploy's node names (benchmarks/onnx_writers.py), on a small DCN network (tests/quant_writers_model.py).

Checked: the int8 structure (how many Conv / MatMul / DeformConv nodes run in int8, read from the written graph as
ONNX Runtime fuses it), the accuracy (int8 vs fp32 cosine on held-out inputs; each writer's int8 output within a
tenth of the int8 error of the dynamo file's), the pre-processing steps on their own (the kit's shape rules, shape
arithmetic and BatchNorm folded, fp32 outputs unchanged), and the report: a node that cannot be normalised is one
warning, a model where nothing became int8 is an error."""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dcnkit.runtime import ort_session
from dcnkit.runtime.quantize import QuantizationError, QuantizationWarning, quantize_with_summary
from dcnkit.runtime.quantize_qdeform import qdeform_available

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import onnx_writers  # noqa: E402

pytest.importorskip("onnxscript")
FACTORY = f"{ROOT / 'tests' / 'quant_writers_model.py'}:build"
SHAPE = (1, 3, 16, 16)
CPU = ["CPUExecutionProvider"]


def _images(n, seed):
    return np.random.default_rng(seed).standard_normal((n, *SHAPE[1:])).astype(np.float32)


CALIB, HELD_OUT = _images(8, 0), _images(16, 1)


def _run(model, xs):
    s = ort_session(model if isinstance(model, bytes) else str(model), providers=CPU, intra_op_num_threads=1)
    return np.concatenate([s.run(None, {"x": x[None]})[0] for x in xs]).astype(np.float64)


def _error(a, b):
    """1 - cosine similarity of two output sets (0: the same direction)."""
    return 1.0 - float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return onnx_writers.write_all(FACTORY, SHAPE, str(tmp_path_factory.mktemp("writers")))


@pytest.fixture(scope="module")
def quantized(files, tmp_path_factory):
    d = tmp_path_factory.mktemp("int8")
    out = {}
    for writer, path in files.items():
        with warnings.catch_warnings():
            warnings.simplefilter("error", QuantizationWarning)  # every writer's file is normalised
            q, summary = quantize_with_summary(path, d / f"{writer}.onnx", [{"x": c[None]} for c in CALIB])
        out[writer] = (summary, _run(path, HELD_OUT), _run(q, HELD_OUT))
    return out


@pytest.mark.parametrize("writer", onnx_writers.WRITERS)
def test_every_writer_gives_the_same_int8_graph(quantized, writer):
    summary = quantized[writer][0]
    # the model: conv, DCN, conv, strided conv (Conv x3 + the offset predictor), Linear (Gemm)
    deform = 1 if qdeform_available() else 0
    assert summary.int8 == {"Conv": 3, "MatMul": 1, "DeformConv": deform}, summary.line()
    assert summary.total == 6
    assert [d for _, d in summary.float["excluded"]] == ["offset predictor"]
    assert set(summary.float) == ({"excluded"} if deform else {"excluded", "no int8 kernel"})


@pytest.mark.parametrize("writer", onnx_writers.WRITERS)
def test_every_writer_gives_the_same_accuracy(quantized, writer):
    _, ref32, ref8 = quantized["dynamo"]
    _, y32, y8 = quantized[writer]
    np.testing.assert_allclose(y32, ref32, rtol=1e-4, atol=1e-5)  # one model, whatever wrote it
    assert _error(y8, y32) < 1e-3  # cosine > 0.999 to its own fp32 output
    # int8 vs int8 of the dynamo file: within a tenth of the int8 error (a Conv left float is about a third)
    assert _error(y8, ref8) <= 0.1 * _error(ref8, ref32), (_error(y8, ref8), _error(ref8, ref32))


def test_without_preprocessing_torchscript_convolutions_stay_float(files, tmp_path):
    """The defect the pre-processing removes: the TorchScript file's BatchNorm-folded biases hide behind Identity
    nodes, ONNX Runtime's tool leaves them float, and the convolutions run in float between Q/DQ pairs."""
    calib = [{"x": c[None]} for c in CALIB]
    _, summary = quantize_with_summary(files["ts17"], tmp_path / "raw.onnx", calib, preprocess=False)
    assert summary.int8["Conv"] < 3
    assert "unsupported pattern (its bias is not quantized: " in summary.line()
    _, dyn = quantize_with_summary(files["dynamo"], tmp_path / "dyn.onnx", calib, preprocess=False)
    assert dyn.int8["Conv"] == 3  # the dynamo exporter folds them itself


def test_preprocess_normalises_the_torchscript_graph(files):
    from dcnkit.runtime.quantize_prep import preprocess, weight_inputs

    src = onnx.load(files["ts17"])
    before = {n.op_type for n in src.graph.node}
    shape_ops = {"Shape", "Gather", "Div", "ConstantOfShape", "Identity", "BatchNormalization"}
    assert shape_ops <= before
    model, report = preprocess(src)
    assert not shape_ops & {n.op_type for n in model.graph.node}
    assert not report.problems and not report.not_constant
    assert any("BatchNormalization folded into deformable convolutions" in s for s in report.steps)
    init = {t.name for t in model.graph.initializer}
    checked = 0
    for n in model.graph.node:
        for role, i in weight_inputs(n):  # Conv / Gemm / DeformConv2d weights and biases are initializers
            assert i >= len(n.input) or not n.input[i] or n.input[i] in init, (n.name, role)
            checked += 1
    assert checked == 2 * 6
    onnx.checker.check_model(model)
    np.testing.assert_allclose(_run(model.SerializeToString(), HELD_OUT[:4]), _run(files["ts17"], HELD_OUT[:4]),
                               rtol=1e-4, atol=1e-5)


def test_kit_shape_rules_and_shape_values_through_dynamic_dimensions():
    """mmdeploy's DCN with dynamic batch and size (a node ONNX's own inference knows nothing of): its output is
    (N, Cout, Ho, Wo) with the offsets' Ho, Wo; a convolution after it has a shape; Shape(y)[1] is 8 and Shape(y)[0]
    stays unknown; a division of the known channel count is evaluated (C semantics: toward zero)."""
    from dcnkit.runtime.quantize_shapes import infer

    inits = [numpy_helper.from_array(np.zeros((8, 4, 3, 3), np.float32), "w"),
             numpy_helper.from_array(np.zeros((6, 8, 1, 1), np.float32), "w2"),
             numpy_helper.from_array(np.array(1, np.int64), "one"), numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([-3], np.int64), "minus3")]
    nodes = [helper.make_node("MMCVModulatedDeformConv2d", ["x", "off", "mask", "w"], ["y"], domain="mmdeploy",
                              stride=[2, 2], padding=[1, 1], dilation=[1, 1], groups=1, deform_groups=1),
             helper.make_node("Conv", ["y", "w2"], ["z"]),
             helper.make_node("Shape", ["z"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["c"]), helper.make_node("Gather", ["s", "zero"], ["n"]),
             helper.make_node("Div", ["c", "minus3"], ["q"])]
    g = helper.make_graph(nodes, "g", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, "H", "W"]),
        helper.make_tensor_value_info("off", TensorProto.FLOAT, ["N", 18, "Ho", "Wo"]),
        helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["N", 9, "Ho", "Wo"])],
        [helper.make_tensor_value_info(o, TensorProto.INT64, None) for o in ("n", "q")], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("mmdeploy", 1)])
    walk = infer(m)
    assert walk.dims["y"] == ["N", 8, "Ho", "Wo"] and walk.types["y"] == TensorProto.FLOAT
    assert walk.dims["z"][:2] == ["N", 6]
    assert walk.values["s"][:2] == [None, 6] and walk.values["c"] == [6] and walk.values["q"] == [-2]
    assert walk.values["n"] == [None]


def _conv_with_bias_input(tmp_path):
    """x -> Conv(w0, b0) -> Conv(w1, bias fed as a model input) -> y: the second bias cannot become a constant."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w0", (4, 3, 3, 3)), ("b0", (4,)), ("w1", (4, 4, 3, 3)))]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["h"], name="fixed", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["h", "w1", "b"], ["y"], name="dynamic", pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
                                       helper.make_tensor_value_info("b", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    p = tmp_path / "bias_input.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(p))
    feeds = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32),
              "b": rng.standard_normal(4).astype(np.float32)} for _ in range(2)]
    return p, feeds


def test_a_node_that_cannot_be_normalised_is_one_warning(tmp_path):
    p, feeds = _conv_with_bias_input(tmp_path)
    why = "its bias 'b' is computed from the model input 'b'"
    with pytest.warns(QuantizationWarning) as record:
        _, summary = quantize_with_summary(p, tmp_path / "q.onnx", feeds)
    assert len([r for r in record if r.category is QuantizationWarning]) == 1
    assert f"nodes that stay float: dynamic: {why}" in str(record[0].message)
    assert summary.int8["Conv"] == 1  # ONNX Runtime's tool leaves a bias that is not an initializer float
    assert summary.float == {"not constant": [("dynamic", why)]}


def test_nothing_quantized_is_an_error(files, tmp_path, capsys):
    out = tmp_path / "none.onnx"
    with pytest.raises(QuantizationError, match=r"nothing in '.*ts17.onnx' was quantized to int8 \(float: .*excluded"):
        quantize_with_summary(files["ts17"], out, [{"x": CALIB[:1]}], exclude_op_types=["Conv", "Gemm"],
                              qdeform=False)
    assert not out.exists()
    from dcnkit.cli.parser import main

    npz = tmp_path / "calib.npz"
    np.savez(npz, x=CALIB[:2])
    rc = main(["quantize", files["ts17"], "-o", str(out), "--calibration", str(npz), "--exclude-op-type", "Conv",
               "--exclude-op-type", "Gemm", "--no-qdeformconv"])
    assert rc == 1 and "QuantizationError: nothing in" in capsys.readouterr().err
    rc = main(["quantize", files["ts17"], "-o", str(out), "--calibration", str(npz), "--no-preprocess"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and lines[-1].startswith("int8: ") and "Conv/MatMul/DeformConv nodes" in lines[-1]
    assert "unsupported pattern (its bias is not quantized" in lines[-1]


def test_an_excluded_node_folded_away_is_a_warning(files, tmp_path):
    bn = [n.name for n in onnx.load(files["ts17"]).graph.node if n.op_type == "BatchNormalization"]
    assert len(bn) == 1
    with pytest.warns(QuantizationWarning, match=r"exclude_nodes: the pre-processing fused /4/BatchNormalization "
                      r"\(into /3/DeformConv2d\): exclude the node it went into"):
        quantize_with_summary(files["ts17"], tmp_path / "q.onnx", [{"x": CALIB[:1]}], exclude_nodes=bn)
