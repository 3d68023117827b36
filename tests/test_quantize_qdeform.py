"""dcnkit::QDeformConv2d, the quantized DeformConv2d: the ONNX Runtime kernel (8-bit columns, oneDNN's int8 GEMM)
against the reference runner's dequantize -> float DeformConv2d -> quantize, its errors, and `dcnkit quantize`
writing it."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dcnkit import reference
from dcnkit.runtime import ort_session
from dcnkit.runtime.reference_runner import reference_evaluator

CPU = ["CPUExecutionProvider"]


def _onednn_available() -> bool:
    try:
        from dcnkit.runtime.quantize_qdeform import qdeform_available

        return qdeform_available()
    except Exception:  # noqa: BLE001
        return False


needs_onednn = pytest.mark.skipif(not _onednn_available(), reason="oneDNN (libdnnl) is not installed: "
                                  "bash scripts/onednn_fetch.sh .deps, apt install libdnnl2 or DCNKIT_ONEDNN_LIB")


def _qmodel(x, x_scale, x_zp, w, w_scale, offset, mask, bias, y_scale, y_zp, attrs, w_const=True):
    """A one-node QDeformConv2d model; X, offset and mask are graph inputs, the rest initializers (W optionally
    an input too)."""
    qt = helper.np_dtype_to_tensor_dtype(x.dtype)
    inits = [numpy_helper.from_array(np.array(x_scale, np.float32), "x_scale"),
             numpy_helper.from_array(np.array(x_zp, x.dtype), "x_zp"),
             numpy_helper.from_array(np.asarray(w_scale, np.float32), "w_scale"),
             numpy_helper.from_array(np.zeros(w.shape[0], np.int8), "w_zp"),
             numpy_helper.from_array(np.array(y_scale, np.float32), "y_scale"),
             numpy_helper.from_array(np.array(y_zp, x.dtype), "y_zp")]
    ins = [helper.make_tensor_value_info("x", qt, list(x.shape)),
           helper.make_tensor_value_info("offset", TensorProto.FLOAT, list(offset.shape))]
    feeds = {"x": x, "offset": offset}
    if w_const:
        inits.append(numpy_helper.from_array(w, "w"))
    else:
        ins.append(helper.make_tensor_value_info("w", TensorProto.INT8, list(w.shape)))
        feeds["w"] = w
    if mask is not None:
        ins.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, list(mask.shape)))
        feeds["mask"] = mask
    if bias is not None:
        inits.append(numpy_helper.from_array(bias, "bias"))
    node = helper.make_node("QDeformConv2d", ["x", "x_scale", "x_zp", "w", "w_scale", "w_zp", "offset",
                                              "mask" if mask is not None else "", "bias" if bias is not None else "",
                                              "y_scale", "y_zp"], ["y"], domain="dcnkit", **attrs)
    g = helper.make_graph([node], "q", ins, [helper.make_tensor_value_info("y", qt, None)], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dcnkit", 1)],
                          ir_version=10)
    return m, feeds


def _out_hw(h, k, s, p, d):
    return (h + 2 * p - (d * (k - 1) + 1)) // s + 1


CASES = [  # cin, cout, k, h, w, stride, pad, dil, groups, dgroups, mask, bias, dtype
    (8, 16, 3, 9, 11, 1, 1, 1, 1, 1, True, "float", np.uint8),
    (12, 8, 3, 10, 7, 2, 1, 1, 2, 3, False, "int32", np.uint8),
    (6, 9, 2, 8, 8, 1, 2, 2, 3, 2, True, None, np.int8),
    (16, 32, 3, 7, 7, 1, 1, 1, 1, 4, True, "int32", np.int8),
    (4, 4, 1, 6, 5, 1, 0, 1, 1, 1, False, "float", np.uint8),
]


def _case(rng, cin, cout, k, h, w, stride, pad, dil, groups, dgroups, mask, bias, dtype, n=2):
    info = np.iinfo(dtype)
    ho, wo = _out_hw(h, k, stride, pad, dil), _out_hw(w, k, stride, pad, dil)
    x = rng.integers(info.min, info.max + 1, (n, cin, h, w)).astype(dtype)
    x_zp = int(rng.integers(info.min + 20, info.max - 20))
    # 7-bit weights, as `dcnkit quantize` writes them by default (reduce_range: no 16-bit saturation without VNNI)
    wq = rng.integers(-63, 64, (cout, cin // groups, k, k)).astype(np.int8)
    w_scale = rng.uniform(0.002, 0.02, cout).astype(np.float32)
    offset = rng.normal(0, 2.0, (n, 2 * dgroups * k * k, ho, wo)).astype(np.float32)
    m = rng.uniform(0, 1, (n, dgroups * k * k, ho, wo)).astype(np.float32) if mask else None
    x_scale = 0.05
    b = None
    if bias == "float":
        b = rng.normal(0, 1, cout).astype(np.float32)
    elif bias == "int32":
        b = rng.integers(-3000, 3000, cout).astype(np.int32)
    return x, x_scale, x_zp, wq, w_scale, offset, m, b


def _reference_and_kernel(model, feeds):
    ref = reference_evaluator(model).run(None, feeds)[0]
    sess = ort_session(model.SerializeToString(), providers=CPU, intra_op_num_threads=2)
    return ref, sess.run(None, feeds)[0]


@needs_onednn
@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_kernel_matches_dequantize_deform_conv_quantize(case):
    rng = np.random.default_rng(CASES.index(case))
    cin, cout, k, h, w, stride, pad, dil, groups, dgroups, mask, bias, dtype = case
    x, x_scale, x_zp, wq, w_scale, offset, m, b = _case(rng, *case)
    attrs = dict(stride=[stride, stride], padding=[pad, pad], dilation=[dil, dil], groups=groups,
                 deformable_groups=dgroups)
    info = np.iinfo(dtype)
    # y_scale from the float output's range, as calibration would set it
    yf = reference.deform_conv2d((x.astype(np.float64) - x_zp) * x_scale, offset, wq * w_scale.reshape(-1, 1, 1, 1),
                                 None, stride, pad, dil, mask=m)
    y_scale = float(np.abs(yf).max() * 2 / (info.max - info.min))
    y_zp = 0 if dtype == np.int8 else 128
    model, feeds = _qmodel(x, x_scale, x_zp, wq, w_scale, offset, m, b, y_scale, y_zp, attrs, w_const=bool(groups % 2))
    ref, got = _reference_and_kernel(model, feeds)
    assert got.dtype == dtype and got.shape == ref.shape
    # The kernel rounds each sampled value to the input's grid once (8-bit columns) where the definition keeps it
    # exact: about a tenth of the outputs land one step away, a rare one two (sums of many rounding errors).
    steps = np.abs(got.astype(np.int32) - ref.astype(np.int32))
    assert steps.max() <= 2, steps.max()
    assert (steps > 1).mean() < 1e-3
    assert (steps > 0).mean() < 0.15
    assert abs(float((got.astype(np.int32) - ref.astype(np.int32)).mean())) < 0.05  # unbiased
    assert np.unique(got).size > 20  # not a saturated or constant output


@needs_onednn
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_bilinear_sampling_of_quantized_values_within_one_step(dtype):
    """A 1x1 identity convolution outputs the 8-bit columns themselves: they match dequantize -> bilinear sample
    (torchvision's deform_conv2d, the peer library) -> quantize within one quantization step."""
    import torch
    import torchvision

    rng = np.random.default_rng(7)
    info = np.iinfo(dtype)
    c, h, w = 5, 9, 8
    x = rng.integers(info.min, info.max + 1, (2, c, h, w)).astype(dtype)
    x_scale, x_zp = 0.1, int(rng.integers(info.min + 10, info.max - 10))
    offset = rng.normal(0, 3.0, (2, 2, h, w)).astype(np.float32)
    mask = rng.uniform(0, 1, (2, 1, h, w)).astype(np.float32)
    wq = (np.eye(c, dtype=np.int8) * 127).reshape(c, c, 1, 1)
    model, feeds = _qmodel(x, x_scale, x_zp, wq, np.full(c, 1 / 127, np.float32), offset, mask, None, x_scale, x_zp,
                           {})
    got = ort_session(model.SerializeToString(), providers=CPU).run(None, feeds)[0]
    xf = torch.from_numpy((x.astype(np.float64) - x_zp) * x_scale)
    yf = torchvision.ops.deform_conv2d(xf, torch.from_numpy(offset).double(), torch.eye(c).double().view(c, c, 1, 1),
                                       mask=torch.from_numpy(mask).double()).numpy()
    want = np.clip(np.rint(yf / x_scale) + x_zp, info.min, info.max)
    steps = np.abs(got.astype(np.int32) - want.astype(np.int32))
    assert steps.max() <= 1
    assert (steps == 0).mean() > 0.95  # the columns are rounded once, as the definition's quantize does


@needs_onednn
def test_bad_inputs_name_the_argument():
    rng = np.random.default_rng(0)
    x, x_scale, x_zp, wq, w_scale, offset, m, b = _case(rng, *CASES[0])

    def run(**kw):
        args = dict(x=x, x_scale=x_scale, x_zp=x_zp, w=wq, w_scale=w_scale, offset=offset, mask=m, bias=b,
                    y_scale=0.1, y_zp=128, attrs=dict(padding=[1, 1]))
        args.update(kw)
        attrs = args.pop("attrs")
        model, feeds = _qmodel(args.pop("x"), *args.values(), attrs)
        ort_session(model.SerializeToString(), providers=CPU).run(None, feeds)

    with pytest.raises(Exception, match=r"QDeformConv2d: x_scale: expected positive finite scales, got -0\.5"):
        run(x_scale=-0.5)
    with pytest.raises(Exception, match=r"QDeformConv2d: w_scale: expected 1 or 16 values \(per output channel\), "
                                        r"got shape \(3,\)"):
        run(w_scale=w_scale[:3])
    with pytest.raises(Exception, match=r"QDeformConv2d: y_scale: expected positive finite scales, got 0"):
        run(y_scale=0.0)
    with pytest.raises(Exception, match=r"QDeformConv2d: bias: expected element type float32 or int32, got"):
        run(bias=np.zeros(16, np.float64))
    with pytest.raises(Exception, match=r"QDeformConv2d: offset: expected"):
        run(offset=offset[:, :4])


# ---- `dcnkit quantize` writing QDeformConv2d ----


def _exported(tmp_path):
    """The demo-like model of tests/test_quantize.py (DeformConv2d -> Relu -> MaxPool -> Reshape -> Gemm) in the
    kit's and the standard domain."""
    from test_quantize import export_kit_and_standard

    return export_kit_and_standard(tmp_path)


@needs_onednn
@pytest.mark.parametrize("kind", ["kit", "standard"])
def test_quantize_writes_qdeformconv2d_and_follows_float(tmp_path, kind):
    from test_quantize import _digits

    from dcnkit.runtime.quantize import quantize

    src = _exported(tmp_path)[kind]
    name = onnx.load(str(src)).graph.input[0].name
    calib = [{name: _digits(16, s)} for s in range(2)]
    q8 = quantize(src, tmp_path / "q.onnx", calib)
    proto = onnx.load(str(q8))
    nodes = [n for n in proto.graph.node if (n.domain, n.op_type) == ("dcnkit", "QDeformConv2d")]
    assert len(nodes) == 1 and not [n for n in proto.graph.node if n.op_type in ("DeformConv", "DeformConv2d")]
    # the Relu is folded (output zero point 0), MaxPool and Reshape run on uint8
    assert "Relu" not in {n.op_type for n in proto.graph.node}
    x = _digits(32, 99)  # not used for calibration

    def run(p):
        s = ort_session(str(p), providers=CPU, intra_op_num_threads=1)
        return s.run(None, {name: x})[0]

    y32, y8 = run(src), run(q8)
    cos = lambda a, b: float(a.ravel() @ b.ravel() / np.linalg.norm(a) / np.linalg.norm(b))  # noqa: E731
    assert cos(y8, y32) >= 0.99
    if kind == "kit":  # as close as the int8 model with the float DeformConv2d between Q/DQ
        y8f = run(quantize(src, tmp_path / "qf.onnx", calib, qdeform=False))
        assert np.abs(y8 - y8f).max() < 0.05 * np.abs(y32).max()
    # and the whole quantized model against the reference runner (QDeformConv2d: dequantize -> conv -> quantize)
    ref = reference_evaluator(str(q8)).run(None, {name: x[:4]})[0]
    np.testing.assert_allclose(run(q8)[:4], ref, atol=0.05 * np.abs(ref).max())


@needs_onednn
def test_cli_quantize_reports_qdeformconv2d(tmp_path):
    import subprocess
    import sys

    from test_quantize import _digits

    src = _exported(tmp_path)["kit"]
    name = onnx.load(str(src)).graph.input[0].name
    npz = tmp_path / "calib.npz"
    np.savez(npz, **{name: _digits(16, 5)})
    p = subprocess.run([sys.executable, "-m", "dcnkit", "quantize", str(src), "-o", str(tmp_path / "q.onnx"),
                        "--calibration", str(npz)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    # the deformable convolution is int8 (a QDeformConv2d); only its offset predictor stays float
    assert p.stdout.strip().splitlines()[-1] == (
        "int8: 3 of 4 Conv/MatMul/DeformConv nodes (1 Conv, 1 MatMul, 1 DeformConv); "
        "float: 1 excluded (offset predictor: node_conv2d_1)")


def test_fuse_leaves_a_deformable_convolution_without_quantized_neighbours_float():
    """No DequantizeLinear before it: nothing to fuse (runs without oneDNN: a graph rewrite only)."""
    from dcnkit.runtime.quantize_qdeform import fuse_qdeform_conv

    node = helper.make_node("DeformConv2d", ["x", "off", "w"], ["y"], domain="dcnkit")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4]),
                                        helper.make_tensor_value_info("off", TensorProto.FLOAT, [1, 18, 2, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          initializer=[numpy_helper.from_array(np.ones((3, 2, 3, 3), np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dcnkit", 1)])
    assert fuse_qdeform_conv(m) == 0
    assert [n.op_type for n in m.graph.node] == ["DeformConv2d"]


def test_missing_onednn_is_a_clear_error():
    """DCNKIT_ONEDNN_LIB naming no library: the node fails with one message saying what is missing and how to get
    it, and `dcnkit quantize` would leave the deformable convolutions float (qdeform_available() is False)."""
    import subprocess
    import sys

    code = (
        "import numpy as np, sys\n"
        "sys.path.insert(0, 'tests')\n"
        "from test_quantize_qdeform import CASES, _case, _qmodel\n"
        "from dcnkit.runtime import ort_session\n"
        "from dcnkit.runtime.quantize_qdeform import qdeform_available\n"
        "x, xs, xz, w, ws, off, m, b = _case(np.random.default_rng(0), *CASES[0])\n"
        "model, feeds = _qmodel(x, xs, xz, w, ws, off, m, b, 0.1, 128, dict(padding=[1, 1]))\n"
        "print('available', qdeform_available())\n"
        "try:\n"
        "    ort_session(model.SerializeToString(), providers=['CPUExecutionProvider']).run(None, feeds)\n"
        "except Exception as e:\n"
        "    print('error', e)\n")
    import os

    env = dict(os.environ, DCNKIT_ONEDNN_LIB="/nonexistent/libdnnl.so.2")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert p.returncode == 0, p.stderr
    assert "available False" in p.stdout
    assert "QDeformConv2d node" in p.stdout and "oneDNN (libdnnl) is needed" in p.stdout
    assert "/nonexistent/libdnnl.so.2" in p.stdout and "DCNKIT_ONEDNN_LIB" in p.stdout and "libdnnl2" in p.stdout


@needs_onednn
def test_fuse_takes_an_int8_weight_behind_dequantize_and_matches_the_qdq_graph():
    """DequantizeLinear(x) -> DeformConv2d(weight = DequantizeLinear(int8, per channel)) -> QuantizeLinear: one
    QDeformConv2d with that int8 weight (its DequantizeLinear gone), equal to the reference runner's QDQ graph
    within the kernel's rounding."""
    from dcnkit.runtime.quantize_qdeform import fuse_qdeform_conv

    rng = np.random.default_rng(3)
    x, x_scale, x_zp, wq, w_scale, offset, m, b = _case(rng, *CASES[0])
    inits = [numpy_helper.from_array(v, k) for k, v in {
        "xs": np.array(x_scale, np.float32), "xz": np.array(x_zp, np.uint8), "wq": wq, "ws": w_scale,
        "wz": np.zeros(len(w_scale), np.int8), "b": b, "ys": np.array(0.2, np.float32),
        "yz": np.array(128, np.uint8)}.items()]
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wf"], axis=0),
             helper.make_node("DeformConv2d", ["xf", "offset", "wf", "b", "mask"], ["yf"], domain="dcnkit",
                              padding=[1, 1], name="dcn"),
             helper.make_node("QuantizeLinear", ["yf", "ys", "yz"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x.shape)),
                                       helper.make_tensor_value_info("offset", TensorProto.FLOAT, list(offset.shape)),
                                       helper.make_tensor_value_info("mask", TensorProto.FLOAT, list(m.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], initializer=inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("dcnkit", 1)],
                              ir_version=10)
    feeds = {"x": x, "offset": offset, "mask": m}
    want = reference_evaluator(model).run(None, feeds)[0]
    assert fuse_qdeform_conv(model) == 1
    assert [(n.domain, n.op_type) for n in model.graph.node] == [("dcnkit", "QDeformConv2d")]
    assert {t.name for t in model.graph.initializer} >= {"dcn.q.w", "xs", "ys"} and "wq" not in {
        t.name for t in model.graph.initializer}
    got = ort_session(model.SerializeToString(), providers=CPU).run(None, feeds)[0]
    steps = np.abs(got.astype(np.int32) - want.astype(np.int32))
    assert steps.max() <= 2 and (steps > 0).mean() < 0.15
    assert np.unique(got).size > 20


def _qdq_dcn_graph(domain, op, order, attrs, relu=False, y_zp=0):
    """DequantizeLinear(x) -> a deformable convolution (float weight initializer) -> [Relu] -> QuantizeLinear."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(v, k) for k, v in {
        "xs": np.array(0.05, np.float32), "xz": np.array(3, np.uint8),
        "w": rng.normal(0, 0.1, (4, 2, 3, 3)).astype(np.float32), "b": rng.normal(0, 1, 4).astype(np.float32),
        "ys": np.array(0.1, np.float32), "yz": np.array(y_zp, np.uint8)}.items()]
    names = {"x": "xf", "offset": "offset", "mask": "mask", "weight": "w", "bias": "b"}
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"]),
             helper.make_node(op, [names[k] for k in order], ["yf"], domain=domain, name="dcn", **attrs)]
    if relu:
        nodes.append(helper.make_node("Relu", ["yf"], ["yr"]))
    nodes.append(helper.make_node("QuantizeLinear", ["yr" if relu else "yf", "ys", "yz"], ["y"]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 2, 5, 5]),
                                       helper.make_tensor_value_info("offset", TensorProto.FLOAT, [1, 18, 5, 5]),
                                       helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 9, 5, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(domain or "", 1)])


@pytest.mark.parametrize("domain, op, order, attrs", [
    ("dcnkit", "DeformConv2d", ["x", "offset", "weight", "bias", "mask"], dict(padding=[1, 1])),
    ("", "DeformConv", ["x", "weight", "offset", "bias", "mask"], dict(pads=[1, 1, 1, 1], kernel_shape=[3, 3])),
    ("mmdeploy", "MMCVModulatedDeformConv2d", ["x", "offset", "mask", "weight", "bias"], dict(padding=[1, 1])),
])
def test_fuse_reads_every_domain_and_folds_relu_only_at_the_minimum_zero_point(domain, op, order, attrs):
    """A graph rewrite only (no oneDNN needed): the same QDeformConv2d from every domain's node; a Relu folded
    where the output's zero point is the uint8 minimum, the node left float otherwise."""
    from dcnkit.runtime.quantize_qdeform import fuse_qdeform_conv

    m = _qdq_dcn_graph(domain, op, order, attrs, relu=True, y_zp=0)
    assert fuse_qdeform_conv(m) == 1
    (n,) = m.graph.node
    assert (n.domain, n.op_type) == ("dcnkit", "QDeformConv2d")
    assert list(n.input) == ["x", "xs", "xz", "dcn.q.w", "dcn.q.w_scale", "dcn.q.w_zp", "offset", "mask", "b", "ys",
                             "yz"] and list(n.output) == ["y"]
    a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
    assert a["padding"] == [1, 1] and a["stride"] == [1, 1] and a["groups"] == 1 and a["deformable_groups"] == 1
    w = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    assert w["dcn.q.w"].dtype == np.int8 and np.abs(w["dcn.q.w"]).max() == 63  # 7-bit by default
    want = _qdq_dcn_graph(domain, op, order, attrs).graph.initializer
    wf = [numpy_helper.to_array(t) for t in want if t.name == "w"][0]
    np.testing.assert_allclose(w["dcn.q.w"] * w["dcn.q.w_scale"].reshape(-1, 1, 1, 1), wf,
                               atol=float(w["dcn.q.w_scale"].max()) / 2 + 1e-7)
    kept = _qdq_dcn_graph(domain, op, order, attrs, relu=True, y_zp=128)
    assert fuse_qdeform_conv(kept) == 0 and "QDeformConv2d" not in {x.op_type for x in kept.graph.node}
