"""INT8 on the CPU: `dcnkit quantize` / dcnkit.runtime.quantize (ONNX Runtime's static QDQ quantization,
calibrated through the kit's library) and quantized features in dcnkit.ops.roi_align (torchvision's semantics)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
import torchvision

import dcnkit.export as dk_export
from dcnkit import demo
from dcnkit.runtime import ort_session
from dcnkit.runtime.quantize import QuantizationError, calibration_feeds, offset_branch_nodes, quantize

CPU = ["CPUExecutionProvider"]


def _model(channels=8):
    torch.manual_seed(0)
    m = demo.build_model(channels).eval()
    with torch.no_grad():  # non-zero offsets and masks, so the deformable sampling matters
        dcn = m[2]
        dcn.conv_offset.weight.normal_(0, 0.05)
        dcn.conv_offset.bias.normal_(0, 0.5)
    return m


def _digits(n, seed):
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, (n, 1, 8, 8)).astype(np.float32)


def export_kit_and_standard(d):
    """The model above exported into folder d with the kit's DeformConv2d and with standard DeformConv."""
    m = _model()
    x = torch.from_numpy(_digits(2, 0))
    paths = {}
    for kind, std in (("kit", False), ("standard", True)):
        p = d / f"{kind}.onnx"
        dk_export.to_onnx(m, (x,), str(p), standard_ops=std, dynamic_batch=True, verbose=False)
        paths[kind] = p
    return paths


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("quant")
    paths = export_kit_and_standard(d)
    # mmdeploy's name for the same node (input order input, offset, mask, weight, bias)
    proto = onnx.load(str(paths["kit"]))
    for n in proto.graph.node:
        if n.domain == "dcnkit" and n.op_type == "DeformConv2d":
            x_, off, w, b, mask = n.input
            del n.input[:]
            n.input.extend([x_, off, mask, w, b])
            n.domain, n.op_type = "mmdeploy", "MMCVModulatedDeformConv2d"
            keep = [a for a in n.attribute if a.name in ("stride", "padding", "dilation", "groups")]
            dg = [a for a in n.attribute if a.name == "deformable_groups"][0].i
            del n.attribute[:]
            n.attribute.extend(keep + [onnx.helper.make_attribute("deform_groups", dg)])
    proto.opset_import.append(onnx.helper.make_opsetid("mmdeploy", 1))
    paths["mmdeploy"] = d / "mmdeploy.onnx"
    onnx.save(proto, str(paths["mmdeploy"]))
    return paths


def _name(path):
    return onnx.load(str(path)).graph.input[0].name


def _run(path, x):
    s = ort_session(str(path), providers=CPU, intra_op_num_threads=1)
    return s.run(None, {s.get_inputs()[0].name: x})[0]


def _cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_onnx_runtime_alone_cannot_calibrate_a_kit_model(exported, tmp_path):
    """The defect the command fixes: ORT's calibrator opens a session without the kit's library."""
    from onnxruntime import quantization as q

    class Reader(q.CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{_name(exported["kit"]): _digits(4, 1)}])

        def get_next(self):
            return next(self.feeds, None)

    with pytest.raises(Exception, match="not a registered function/op"):
        q.quantize_static(str(exported["kit"]), str(tmp_path / "plain.onnx"), Reader(),
                          quant_format=q.QuantFormat.QDQ)


@pytest.mark.parametrize("kind", ["kit", "standard", "mmdeploy"])
def test_quantized_model_runs_and_follows_the_float_model(exported, tmp_path, kind):
    src = exported[kind]
    name = _name(src)
    calib = [{name: _digits(16, s)} for s in range(4)]
    out = quantize(src, tmp_path / "q.onnx", calib, qdeform=False)  # QDeformConv2d: tests/test_quantize_qdeform.py
    proto = onnx.load(str(out))
    ops = [(n.domain, n.op_type) for n in proto.graph.node]
    deform = [n for n in proto.graph.node if "DeformConv" in n.op_type]
    src_deform = [n for n in onnx.load(str(src)).graph.node if "DeformConv" in n.op_type]
    assert len(deform) == 1 and (deform[0].domain, deform[0].op_type) == (src_deform[0].domain, src_deform[0].op_type)
    assert ("", "QuantizeLinear") in ops and ("", "DequantizeLinear") in ops
    producers = {o: n for n in proto.graph.node for o in n.output}
    # the deformable node stays float: its feature input comes out of a DequantizeLinear
    feature = deform[0].input[0]
    assert producers[feature].op_type == "DequantizeLinear"
    # the trunk's convolutions and the classifier are quantized (their weights come through DequantizeLinear)
    quantized = [n for n in proto.graph.node if n.op_type in ("Conv", "Gemm")
                 and producers.get(n.input[1]) is not None and producers[n.input[1]].op_type == "DequantizeLinear"]
    assert {n.op_type for n in quantized} == {"Conv", "Gemm"}
    x = _digits(32, 99)  # not used for calibration
    y32, y8 = _run(src, x), _run(out, x)
    assert y8.shape == y32.shape
    assert _cosine(y8, y32) >= 0.99
    assert np.abs(y8 - y32).max() < 0.1 * np.abs(y32).max()


def test_offset_branch_stays_float_unless_asked(exported, tmp_path):
    src = exported["kit"]
    proto = onnx.load(str(src))
    branch = offset_branch_nodes(proto)
    convs = [n for n in proto.graph.node if n.op_type == "Conv"]
    assert len(convs) == 2
    offset_conv = [c for c in convs if c.name in branch]
    assert len(offset_conv) == 1 and convs[0].name not in branch  # the trunk's first conv is not in it
    calib = [{_name(src): _digits(16, 3)}]

    def weight_is_quantized(path, conv_name):
        q = onnx.load(str(path))
        prod = {o: n for n in q.graph.node for o in n.output}
        conv = [n for n in q.graph.node if n.name == conv_name][0]
        return conv.input[1] in prod and prod[conv.input[1]].op_type == "DequantizeLinear"

    a = quantize(src, tmp_path / "a.onnx", calib)
    assert not weight_is_quantized(a, offset_conv[0].name)
    assert weight_is_quantized(a, convs[0].name)
    b = quantize(src, tmp_path / "b.onnx", calib, quantize_offsets=True)
    assert weight_is_quantized(b, offset_conv[0].name)


def test_excluded_op_types_and_nodes_stay_float(exported, tmp_path):
    src = exported["kit"]
    calib = [{_name(src): _digits(8, 4)}]
    out = quantize(src, tmp_path / "q.onnx", calib, exclude_op_types=["Gemm"], per_channel=False)
    q = onnx.load(str(out))
    prod = {o: n for n in q.graph.node for o in n.output}
    gemm = [n for n in q.graph.node if n.op_type == "Gemm"][0]
    assert gemm.input[1] not in prod  # the float initializer, no DequantizeLinear
    np.testing.assert_allclose(_run(out, calib[0][_name(src)]).shape, (8, 10))


def test_demo_model_accuracy_in_int8_within_one_point():
    torch.manual_seed(0)
    np.random.seed(0)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x_tr, y_tr, x_te, y_te = demo.load_digits_split(0)
        m = demo.build_model()
        demo.train(m, x_tr, y_tr, 15, 64, 3e-3, 0, log=lambda *a: None)
    finally:
        torch.set_num_threads(old)
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "digits.onnx"
        dk_export.to_onnx(m, (torch.from_numpy(x_te[:2]),), str(p), dynamic_batch=True, verbose=False)
        name = _name(p)
        calib = [{name: x_tr[i:i + 64]} for i in range(0, len(x_tr) - 63, 64)]
        q = quantize(p, Path(d) / "digits.int8.onnx", calib)
        from dcnkit.runtime.quantize_qdeform import qdeform_available

        ops = {n.op_type for n in onnx.load(str(q)).graph.node}
        assert ("QDeformConv2d" in ops) == qdeform_available()  # the int8 kernel where oneDNN is found
        acc32 = float((_run(p, x_te).argmax(1) == y_te).mean())
        acc8 = float((_run(q, x_te).argmax(1) == y_te).mean())
    assert acc32 > 0.9
    assert acc8 >= acc32 - 0.01, (acc32, acc8)


def test_calibration_feeds_cut_fixed_batches(exported, tmp_path):
    m = _model()
    p = tmp_path / "b2.onnx"
    dk_export.to_onnx(m, (torch.from_numpy(_digits(2, 0)),), str(p), dynamic_batch=False, verbose=False)
    name = _name(p)
    feeds = calibration_feeds(str(p), {name: _digits(8, 0)})
    assert len(feeds) == 4 and all(f[name].shape == (2, 1, 8, 8) for f in feeds)
    np.testing.assert_array_equal(np.concatenate([f[name] for f in feeds]), _digits(8, 0))
    dyn = calibration_feeds(str(exported["kit"]), {_name(exported["kit"]): _digits(8, 0)})
    assert len(dyn) == 1 and dyn[0][_name(exported["kit"])].shape == (8, 1, 8, 8)
    with pytest.raises(ValueError, match=r"calibration: expected arrays for the model inputs .*missing"):
        calibration_feeds(str(p), {"other": _digits(2, 0)})


def test_bad_arguments_name_the_argument(exported, tmp_path):
    src = exported["kit"]
    calib = [{_name(src): _digits(4, 0)}]
    with pytest.raises(ValueError, match=r"method: expected one of .*got 'kl'"):
        quantize(src, tmp_path / "q.onnx", calib, method="kl")
    with pytest.raises(ValueError, match=r"exclude_nodes: expected node names of the model, got unknown \['nope'\]"):
        quantize(src, tmp_path / "q.onnx", calib, exclude_nodes=["nope"])
    with pytest.raises(ValueError, match="model: expected an existing ONNX file"):
        quantize(tmp_path / "missing.onnx", tmp_path / "q.onnx", calib)
    with pytest.raises(ValueError, match="calibration: expected at least one feed"):
        quantize(src, tmp_path / "q.onnx", [])
    unequal = [{_name(src): _digits(4, 0)}, {_name(src): _digits(3, 0)}]
    with pytest.raises(ValueError, match="calibration: the entropy method needs feeds of one shape"):
        quantize(src, tmp_path / "q.onnx", unequal, method="entropy")


def test_a_model_onnx_runtime_cannot_quantize_is_a_clear_error(tmp_path):
    from onnx import TensorProto, helper

    node = helper.make_node("Unknown", ["x"], ["y"], domain="nowhere")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("nowhere", 1)])
    p = tmp_path / "bad.onnx"
    onnx.save(m, str(p))
    with pytest.raises(QuantizationError, match=r"ONNX Runtime cannot quantize '.*bad.onnx'"):
        quantize(p, tmp_path / "q.onnx", [{"x": np.ones((1, 4), np.float32)}])


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "dcnkit", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def test_cli_quantize_then_run(exported, tmp_path):
    src = exported["kit"]
    npz = tmp_path / "calib.npz"
    np.savez(npz, **{_name(src): _digits(16, 5)})
    out = tmp_path / "q.onnx"
    p = _cli("quantize", src, "-o", out, "--calibration", npz, "--calibration", npz, "--no-qdeformconv")
    assert p.returncode == 0, p.stderr
    assert "QuantizeLinear nodes, calibrated on 2 feeds (minmax" in p.stdout
    # the last line: what became int8, and why the rest stayed float
    assert p.stdout.strip().splitlines()[-1] == (
        "int8: 2 of 4 Conv/MatMul/DeformConv nodes (1 Conv, 1 MatMul); "
        "float: 2 excluded (offset predictor: node_conv2d_1 | QDeformConv2d off: node_deform_conv2d)")
    inputs = tmp_path / "x.npz"
    np.savez(inputs, **{_name(src): _digits(3, 6)})
    r = _cli("run", out, "--inputs", inputs)
    assert r.returncode == 0, r.stderr
    bad = _cli("quantize", src, "-o", tmp_path / "q2.onnx", "--calibration", tmp_path / "missing.npz")
    assert bad.returncode == 2 and "--calibration: expected an existing .npz file" in bad.stderr
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, other=_digits(2, 0))
    bad = _cli("quantize", src, "-o", tmp_path / "q2.onnx", "--calibration", wrong)
    assert bad.returncode == 2 and "--calibration:" in bad.stderr and "missing" in bad.stderr


# ---- quantized features in roi_align (torchvision's QuantizedCPU kernel) ----


@pytest.mark.parametrize("dtype", [torch.quint8, torch.qint8])
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [2, -1])
def test_quantized_roi_align_matches_torchvision(dtype, aligned, sampling_ratio):
    from dcnkit.ops import roi_align

    g = torch.Generator().manual_seed(0)
    x = torch.rand(1, 4, 12, 10, generator=g) * 5 - (1 if dtype == torch.qint8 else 0)
    boxes = torch.tensor([[0, 1.0, 1.0, 6.0, 7.0], [0, 0.0, 2.0, 9.0, 11.0], [0, 3.25, 2.5, 5.0, 8.75]])
    qx = torch.quantize_per_tensor(x, 0.04, 10 if dtype == torch.quint8 else 0, dtype)
    qb = torch.quantize_per_tensor(boxes, 0.25, 0, dtype)
    want = torchvision.ops.roi_align(qx, qb, (3, 4), 0.5, sampling_ratio, aligned)
    got = roi_align(qx, qb, (3, 4), 0.5, sampling_ratio, aligned)
    assert got.is_quantized and got.dtype == dtype
    assert got.q_scale() == qx.q_scale() and got.q_zero_point() == qx.q_zero_point()
    steps = (got.int_repr().int() - want.int_repr().int()).abs()
    assert steps.max() <= 1  # the same samples; rounding of the last step may differ
    assert (steps > 0).float().mean() < 0.05
    # and the float kernel on the dequantized values, quantized: the definition
    ref = torch.quantize_per_tensor(roi_align(qx.dequantize(), qb.dequantize(), (3, 4), 0.5, sampling_ratio,
                                              aligned), qx.q_scale(), qx.q_zero_point(), dtype)
    assert torch.equal(got.int_repr(), ref.int_repr())


def test_quantized_roi_align_batches_float_boxes_and_module():
    from dcnkit.nn import RoIAlign
    from dcnkit.ops import roi_align

    x = torch.rand(2, 3, 8, 8) * 2
    qx = torch.quantize_per_tensor(x, 0.02, 0, torch.quint8)
    boxes = torch.tensor([[1, 0.5, 0.5, 6.0, 7.0], [0, 1.0, 2.0, 7.5, 7.5]])
    got = roi_align(qx, boxes, 2, 1.0, 2, True)  # float boxes and a batch of 2: beyond torchvision's kernel
    want = torch.quantize_per_tensor(roi_align(qx.dequantize(), boxes, 2, 1.0, 2, True), 0.02, 0, torch.quint8)
    assert torch.equal(got.int_repr(), want.int_repr())
    mod = RoIAlign(2, spatial_scale=1.0, sampling_ratio=2, aligned=True)
    assert torch.equal(mod(qx, boxes).int_repr(), got.int_repr())
    per_channel = torch.quantize_per_channel(x, torch.full((3,), 0.02), torch.zeros(3, dtype=torch.long), 1,
                                             torch.quint8)
    with pytest.raises(ValueError, match="roi_align: input: expected a per-tensor quantized tensor"):
        roi_align(per_channel, boxes, 2, 1.0, 2, True)
