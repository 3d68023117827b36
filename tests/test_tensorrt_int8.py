"""``dcnkit build --int8`` without TensorRT: the QDQ model of ``dcnkit quantize`` rewritten into TensorRT's symmetric
int8 Q/DQ (checked against a NumPy fake quantization and run in ONNX Runtime with the kit's library), the CLI's
checks before TensorRT is needed, and ``build_engine_bytes(precision="int8")`` up to the Polygraphy loaders (stood
in for: no TensorRT builder on any machine this project reaches; see docs/tensorrt.md)."""
from __future__ import annotations

import sys
import types

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from dcnkit.runtime import runners
from dcnkit.runtime import tensorrt as dk_trt
from dcnkit.runtime.tensorrt_int8 import require_qdq, tensorrt_qdq
from test_tensorrt_tools import _call

TRT_REASON = runners.available_backends()["tensorrt"]


def _pair_model(scale, zero_point, n=64):
    """x -> QuantizeLinear(uint8) -> DequantizeLinear -> y, per tensor."""
    inits = [numpy_helper.from_array(np.float32(scale), "s"), numpy_helper.from_array(np.uint8(zero_point), "z")]
    g = helper.make_graph([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"),
                           helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq")], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [n])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [n])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _run(proto, feeds):
    from dcnkit.runtime import ort_session

    sess = ort_session(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.mark.parametrize("zero_point", [0, 37, 128, 250])
def test_a_uint8_pair_becomes_the_symmetric_int8_pair_over_the_same_range(zero_point):
    s = 0.05
    lo, hi = s * (0 - zero_point), s * (255 - zero_point)
    x = np.random.default_rng(zero_point).uniform(lo - 1, hi + 1, 64).astype(np.float32)
    converted, report = tensorrt_qdq(_pair_model(s, zero_point))
    zps = [numpy_helper.to_array(t) for t in converted.graph.initializer if t.name.endswith("zero_point")]
    assert len(zps) == 1 and zps[0].dtype == np.int8 and zps[0] == 0
    # Independent reference: clipped to the uint8 grid's range [lo, hi] (as the uint8 QuantizeLinear clips), then
    # symmetric int8 fake quantization with the step that covers [lo, hi] in 127 steps.
    step = np.float32(max(-lo, hi) / 127)
    want = np.clip(np.round(np.clip(x, lo, hi) / step), -128, 127).astype(np.float32) * step
    got = _run(converted, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    inside = (x >= lo) & (x <= hi)
    assert inside.sum() > 10 and (~inside).sum() > 2
    assert np.abs(got - x)[inside].max() <= step / 2 * 1.0001  # the calibrated range is kept
    assert np.abs(got - _run(_pair_model(s, zero_point), {"x": x})[0]).max() <= step  # as the uint8 pair, +- a step
    assert report.activations[0][1] == zero_point and report.activations[0][2] == pytest.approx(step / s, rel=1e-6)


def _float_model():
    """Conv -> Relu -> the kit's DeformConv2d (offsets and mask from convolutions) -> Conv, 1x4x10x10."""
    from dcnkit.export.schemas import register_onnx_schemas

    register_onnx_schemas()
    rng = np.random.default_rng(0)

    def w(*shape, k=1.0):
        scale = k / np.sqrt(np.prod(shape[1:]))
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32))

    inits = {"w1": w(6, 4, 3, 3), "b1": w(6, k=0.1), "woff": w(18, 6, 3, 3, k=0.5), "wm": w(9, 6, 3, 3),
             "w2": w(6, 6, 3, 3), "b2": w(6, k=0.1), "w3": w(5, 6, 1, 1), "b3": w(5, k=0.1)}
    for name, t in inits.items():
        t.name = name
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "woff"], ["offset"], pads=[1, 1, 1, 1], name="conv_offset"),
             helper.make_node("Conv", ["r1", "wm"], ["mlogit"], pads=[1, 1, 1, 1], name="conv_mask"),
             helper.make_node("Sigmoid", ["mlogit"], ["mask"], name="sigmoid"),
             helper.make_node("DeformConv2d", ["r1", "offset", "w2", "b2", "mask"], ["d"], domain="dcnkit",
                              name="dcn", padding=[1, 1]),
             helper.make_node("Relu", ["d"], ["r2"], name="relu2"),
             helper.make_node("Conv", ["r2", "w3", "b3"], ["y"], name="conv3")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, 4, 10, 10])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [1, 5, 10, 10])], list(inits.values()))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dcnkit", 1)],
                             ir_version=9)


@pytest.fixture(scope="module")
def qdq(tmp_path_factory):
    """(float model path, the QDQ model ``dcnkit quantize`` writes for it, held-out inputs)."""
    from dcnkit.runtime.quantize import quantize

    tmp = tmp_path_factory.mktemp("int8")
    src = tmp / "float.onnx"
    onnx.save(_float_model(), str(src))
    rng = np.random.default_rng(1)
    calib = [{"x": rng.uniform(-1, 1, (1, 4, 10, 10)).astype(np.float32)} for _ in range(8)]
    out = quantize(src, tmp / "int8.onnx", calib, qdeform=False)  # TensorRT's plugins: float between Q/DQ
    held_out = [rng.uniform(-1, 1, (1, 4, 10, 10)).astype(np.float32) for _ in range(4)]
    return src, out, held_out


def test_a_quantized_deformconv_node_is_refused_naming_the_flag(qdq):
    from dcnkit.runtime.quantize_qdeform import fuse_qdeform_conv, qdeform_available

    if not qdeform_available():
        pytest.skip("oneDNN not found: dcnkit quantize writes no QDeformConv2d here")
    _, path, _ = qdq
    fused = onnx.load(str(path))
    assert fuse_qdeform_conv(fused) == 1
    with pytest.raises(ValueError, match=r"QDeformConv2d.*--no-qdeformconv"):
        tensorrt_qdq(fused)


def test_dcnkit_quantize_output_becomes_tensorrt_qdq(qdq):
    src, path, held_out = qdq
    before = onnx.load(str(path))
    inits = {t.name: numpy_helper.to_array(t) for t in before.graph.initializer}
    # What TensorRT would refuse in the tool's output: uint8 zero points and int32 biases behind a DequantizeLinear.
    assert any(v.dtype == np.uint8 for v in inits.values())
    assert any(n.op_type == "DequantizeLinear" and inits.get(n.input[0], np.zeros(0, np.int8)).dtype == np.int32
               for n in before.graph.node)
    converted, report = tensorrt_qdq(before)
    assert report.biases == 2 and len(report.activations) >= 3  # conv1's and conv3's biases; several activations
    after = {t.name: numpy_helper.to_array(t) for t in converted.graph.initializer}
    for n in converted.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            assert len(n.input) == 3 and after[n.input[2]].dtype == np.int8 and not after[n.input[2]].any(), n.name
            assert n.input[0] not in after or after[n.input[0]].dtype == np.int8, n.name  # int8 weights only
    assert sum(n.op_type == "DeformConv2d" for n in converted.graph.node) == 1  # the kit's node, float between Q/DQ
    onnx.checker.check_model(converted, full_check=True)
    # It computes what the tool's model computes, on the coarser symmetric grid: both near float32.
    for x in held_out:
        want = _run(onnx.load(str(src)), {"x": x})[0]
        uint8 = _run(before, {"x": x})[0]
        got = _run(converted, {"x": x})[0]
        span = float(np.abs(want).max())
        assert np.abs(uint8 - want).max() < 0.05 * span
        assert np.abs(got - want).max() < 0.1 * span
        cos = float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want))
        assert cos > 0.995
        assert not np.array_equal(got, uint8)  # the grid did change


def test_models_tensorrt_cannot_take_are_refused_naming_the_node():
    float_model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", T.FLOAT, [2])],
        [helper.make_tensor_value_info("y", T.FLOAT, [2])]), opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ValueError, match=r"model: expected a QDQ model .*dcnkit quantize 'f.onnx'.* got 'f.onnx' "
                                         r"with none"):
        require_qdq(float_model, "'f.onnx'")
    asym = _pair_model(0.1, 0)
    asym.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.int8(3), "z"))
    with pytest.raises(ValueError, match=r"expected zero point 0 in QuantizeLinear 'q'.*got \[3\]"):
        tensorrt_qdq(asym)
    computed = _pair_model(0.1, 0)
    computed.graph.node[0].input[1] = "x_scale"
    computed.graph.node.insert(0, helper.make_node("ReduceMax", ["x"], ["x_scale"], keepdims=0))
    with pytest.raises(ValueError, match=r"scale of QuantizeLinear 'q' to be a constant.*'x_scale'"):
        tensorrt_qdq(computed)


def test_build_int8_refuses_a_float_model_before_tensorrt_is_needed(qdq, tmp_path, capsys):
    src, _, _ = qdq
    rc, err = _call(capsys, "build", src, "-o", tmp_path / "m.engine", "--int8")
    assert rc == 2 and "--int8: expected a QDQ model" in err and f"got '{src}' with none" in err
    rc, err = _call(capsys, "build", src, "-o", tmp_path / "m.engine", "--int8", "--fp16")
    assert rc == 2 and "not allowed with argument" in err


@pytest.mark.skipif(TRT_REASON is None, reason="TensorRT can run here: the 'missing' path does not apply")
def test_build_int8_of_a_qdq_model_without_tensorrt_says_what_is_missing(qdq, tmp_path, capsys):
    _, path, _ = qdq
    rc, err = _call(capsys, "build", path, "-o", tmp_path / "m.engine", "--int8")
    assert rc == 1 and "tensorrt:" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m.engine").exists()


@pytest.mark.parametrize("major", [10, 11])
def test_build_engine_bytes_int8_hands_the_converted_model_to_the_parser(qdq, monkeypatch, major):
    """Stand-ins for ``tensorrt`` and Polygraphy's loaders record what the build would give TensorRT: the QDQ
    model in symmetric int8, and BuilderFlag.INT8 on TensorRT 10 only (TensorRT 11 has no such flag)."""
    import polygraphy.backend.trt as pg

    _, path, _ = qdq
    flag_names = ("FP16", "BF16", "INT8") if major == 10 else ()
    fake = types.SimpleNamespace(__version__=f"{major}.1.0", BuilderFlag=types.SimpleNamespace(
        **{f: f for f in flag_names}))
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    monkeypatch.setattr(dk_trt, "load_plugins", lambda extra=(), log=None: [])
    seen = {}
    monkeypatch.setattr(pg, "NetworkFromOnnxBytes", lambda data: seen.setdefault("onnx", data))
    monkeypatch.setattr(pg, "CreateConfig", lambda **kw: seen.setdefault("config", kw))
    monkeypatch.setattr(pg, "EngineBytesFromNetwork", lambda network, config, save_timing_cache: lambda: b"plan")
    lines = []
    assert dk_trt.build_engine_bytes(str(path), precision="int8", log=lines.append) == b"plan"
    parsed = onnx.load_from_string(seen["onnx"])
    zps = [numpy_helper.to_array(t) for t in parsed.graph.initializer if t.name.endswith("zero_point")]
    assert zps and all(z.dtype == np.int8 and not z.any() for z in zps)
    assert seen["config"] == ({"int8": True} if major == 10 else {})
    assert any(line.startswith("int8: ") and "made symmetric int8" in line for line in lines)
    assert any(("BuilderFlag.INT8" in line) == (major == 10) and "--int8" in line for line in lines)
    with pytest.raises(ValueError, match="expected a QDQ model"):
        dk_trt.build_engine_bytes(str(qdq[0]), precision="int8")
