"""Models as mmdeploy and mmcv 1.x export them run unchanged with the kit's ONNX Runtime library.

Input orders and attribute names follow those tools' ONNX symbolics:
- ``{mmdeploy,mmcv}::MMCVModulatedDeformConv2d(input, offset, mask, weight[, bias])``: stride, padding,
  dilation, groups, deform_groups.
- ``mmdeploy::MMCVDeformConv2d(input, offset, weight)``: padding written as [ph, ph, pw, pw];
  ``mmcv::MMCVDeformConv2d``: padding (ph, pw), plus bias=0 and im2col_step (ignored).
- ``mmcv::MMCVRoiAlign(input, rois)``: output_height, output_width, spatial_scale, sampling_ratio, mode, aligned.
- ``mmcv::MMCVDeformRoIPool(input, rois[, offset])``: pooled_height, pooled_width, spatial_scale,
  sampling_ratio (a float attribute in mmcv's symbolic), gamma.
Checked against the NumPy references of docs/operators.md.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from dcnkit import reference as ref
from dcnkit.runtime import ort_session

F32 = TensorProto.FLOAT


def make_model(domain, op_type, inputs, name="mm_node", **attrs):
    node_inputs, graph_inputs = [], []
    for item in inputs:
        if item is None:
            node_inputs.append("")
            continue
        n, shape = item
        node_inputs.append(n)
        graph_inputs.append(helper.make_tensor_value_info(n, F32, shape))
    node = helper.make_node(op_type, node_inputs, ["y"], domain=domain, name=name, **attrs)
    graph = helper.make_graph([node], "g", graph_inputs, [helper.make_tensor_value_info("y", F32, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11), helper.make_opsetid(domain, 1)],
                             ir_version=8)


def run(model, feeds):
    sess = ort_session(model, providers=["CPUExecutionProvider"], intra_op_num_threads=2)
    return sess.run(None, feeds)[0]


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def random_rois(rng, k, n, h, w, scale=1.0):
    x1 = rng.uniform(-2, w / scale, k)
    y1 = rng.uniform(-2, h / scale, k)
    x2 = x1 + rng.uniform(0.5, w / scale, k)
    y2 = y1 + rng.uniform(0.5, h / scale, k)
    return np.stack([rng.integers(0, n, k), x1, y1, x2, y2], axis=1).astype(np.float32)


def close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def dcn_data(rng, n=2, cin=4, cout=6, k=(3, 3), h=7, w=8, stride=(1, 1), padding=(1, 1), dilation=(1, 1),
             groups=1, dg=1):
    kh, kw = k
    ho = (h + 2 * padding[0] - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
    wo = (w + 2 * padding[1] - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1
    return {
        "x": rand(rng, n, cin, h, w),
        "offset": rand(rng, n, 2 * dg * kh * kw, ho, wo, scale=2.0),
        "mask": rng.uniform(0, 1, (n, dg * kh * kw, ho, wo)).astype(np.float32),
        "weight": rand(rng, cout, cin // groups, kh, kw),
        "bias": rand(rng, cout),
    }


@pytest.mark.parametrize("domain", ["mmdeploy", "mmcv"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_modulated_deform_conv2d(domain, with_bias):
    rng = np.random.default_rng(1)
    stride, padding, dilation, groups, dg = (2, 1), (1, 2), (1, 2), 2, 2
    d = dcn_data(rng, cin=4, cout=4, k=(3, 3), h=9, w=10, stride=stride, padding=padding, dilation=dilation,
                 groups=groups, dg=dg)
    inputs = [("x", ["N", 4, "H", "W"]), ("offset", ["N", 36, "Ho", "Wo"]), ("mask", ["N", 18, "Ho", "Wo"]),
              ("weight", [4, 2, 3, 3])] + ([("bias", [4])] if with_bias else [])
    model = make_model(domain, "MMCVModulatedDeformConv2d", inputs, stride=list(stride), padding=list(padding),
                       dilation=list(dilation), groups=groups, deform_groups=dg)
    feeds = {k: d[k] for k in ("x", "offset", "mask", "weight")}
    if with_bias:
        feeds["bias"] = d["bias"]
    y = run(model, feeds)
    close(y, ref.deform_conv2d(d["x"], d["offset"], d["weight"], d["bias"] if with_bias else None, stride, padding,
                               dilation, d["mask"]))


def test_mmdeploy_deform_conv2d_four_element_padding():
    rng = np.random.default_rng(2)
    padding = (1, 2)
    d = dcn_data(rng, padding=padding)
    model = make_model("mmdeploy", "MMCVDeformConv2d",
                       [("x", ["N", 4, "H", "W"]), ("offset", ["N", 18, "Ho", "Wo"]), ("weight", [6, 4, 3, 3])],
                       stride=[1, 1], padding=[1, 1, 2, 2], dilation=[1, 1], groups=1, deform_groups=1)
    y = run(model, {k: d[k] for k in ("x", "offset", "weight")})
    close(y, ref.deform_conv2d(d["x"], d["offset"], d["weight"], None, (1, 1), padding, (1, 1)))


def test_mmcv_deform_conv2d_with_mmcv_extra_attributes():
    rng = np.random.default_rng(3)
    d = dcn_data(rng, stride=(2, 2), padding=(1, 1))
    model = make_model("mmcv", "MMCVDeformConv2d",
                       [("x", ["N", 4, "H", "W"]), ("offset", ["N", 18, "Ho", "Wo"]), ("weight", [6, 4, 3, 3])],
                       stride=[2, 2], padding=[1, 1], dilation=[1, 1], groups=1, deform_groups=1, bias=0,
                       im2col_step=32)
    y = run(model, {k: d[k] for k in ("x", "offset", "weight")})
    close(y, ref.deform_conv2d(d["x"], d["offset"], d["weight"], None, (2, 2), (1, 1), (1, 1)))


def test_mmcv_deform_conv2d_scalar_attributes():
    """mmcv's functional API passes ints straight through: stride_i=1 is an INT attribute."""
    rng = np.random.default_rng(4)
    d = dcn_data(rng)
    model = make_model("mmcv", "MMCVDeformConv2d",
                       [("x", ["N", 4, "H", "W"]), ("offset", ["N", 18, "Ho", "Wo"]), ("weight", [6, 4, 3, 3])],
                       stride=1, padding=1, dilation=1, groups=1, deform_groups=1)
    y = run(model, {k: d[k] for k in ("x", "offset", "weight")})
    close(y, ref.deform_conv2d(d["x"], d["offset"], d["weight"], None, (1, 1), (1, 1), (1, 1)))


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("aligned", [0, 1])
def test_mmcv_roi_align(mode, aligned):
    rng = np.random.default_rng(5)
    x = rand(rng, 2, 3, 10, 12)
    rois = random_rois(rng, 5, 2, 10, 12, scale=0.5)
    model = make_model("mmcv", "MMCVRoiAlign", [("x", ["N", 3, "H", "W"]), ("rois", ["K", 5])], output_height=3,
                       output_width=2, spatial_scale=0.5, sampling_ratio=2, mode=mode, aligned=aligned)
    close(run(model, {"x": x, "rois": rois}), ref.roi_align(x, rois, (3, 2), 0.5, 2, bool(aligned), mode))


@pytest.mark.parametrize("offset_kind", ["given", "absent", "empty"])
def test_mmcv_deform_roi_pool(offset_kind):
    rng = np.random.default_rng(6)
    x = rand(rng, 2, 3, 9, 8)
    rois = random_rois(rng, 4, 2, 9, 8, scale=0.25)
    offset = rand(rng, 4, 2, 2, 3, scale=0.5)
    inputs = [("x", ["N", 3, "H", "W"]), ("rois", ["K", 5])]
    feeds = {"x": x, "rois": rois}
    if offset_kind == "given":
        inputs.append(("offset", ["K", 2, 2, 3]))
        feeds["offset"] = offset
    elif offset_kind == "empty":  # mmcv turns offset=None into an empty tensor
        inputs.append(("offset", [0]))
        feeds["offset"] = np.zeros((0,), np.float32)
    model = make_model("mmcv", "MMCVDeformRoIPool", inputs, pooled_height=2, pooled_width=3, spatial_scale=0.25,
                       sampling_ratio=2.0, gamma=0.2)
    expected = ref.deform_roi_pool(x, rois, offset if offset_kind == "given" else None, (2, 3), 0.25, 2, 0.2)
    close(run(model, feeds), expected)


@pytest.mark.parametrize(
    "domain,op_type,inputs,attrs,fragments",
    [
        ("mmcv", "MMCVRoiAlign", [("x", ["N", 3, "H", "W"]), ("rois", ["K", 5])],
         {"output_height": 2, "output_width": 2, "mode": "mean"}, ["mean"]),
        ("mmcv", "MMCVRoiAlign", [("x", ["N", 3, "H", "W"]), ("rois", ["K", 5])],
         {"output_height": 2.5, "output_width": 2}, ["output_height", "2.5"]),
        ("mmdeploy", "MMCVDeformConv2d", [("x", ["N", 4, "H", "W"]), ("o", ["N", 18, "H", "W"]), ("w", [6, 4, 3, 3])],
         {"padding": [1, 2, 3, 4]}, ["padding", "[1, 2, 3, 4]"]),
        ("mmcv", "MMCVModulatedDeformConv2d",
         [("x", ["N", 4, "H", "W"]), ("o", ["N", 18, "H", "W"]), ("m", ["N", 9, "H", "W"]), ("w", [6, 4, 3, 3])],
         {"deform_groups": 0}, ["deformable_groups"]),
        ("mmcv", "MMCVDeformRoIPool", [("x", ["N", 3, "H", "W"]), ("rois", ["K", 5])],
         {"pooled_height": 0, "pooled_width": 2}, ["output_size"]),
    ],
)
def test_bad_mm_attributes_name_node_and_attribute(domain, op_type, inputs, attrs, fragments):
    model = make_model(domain, op_type, inputs, name="mm_bad", **attrs)
    with pytest.raises(Exception) as info:
        ort_session(model, providers=["CPUExecutionProvider"])
    msg = str(info.value)
    assert "mm_bad" in msg, msg
    for f in fragments:
        assert f in msg, msg


def test_mmcv_roi_align_out_of_range_batch_index():
    rng = np.random.default_rng(7)
    rois = random_rois(rng, 3, 2, 6, 6)
    rois[0, 0] = 7
    model = make_model("mmcv", "MMCVRoiAlign", [("x", ["N", 3, "H", "W"]), ("rois", ["K", 5])], name="mm_roi",
                       output_height=2, output_width=2, spatial_scale=1.0, sampling_ratio=0, mode="avg", aligned=1)
    with pytest.raises(Exception) as info:
        run(model, {"x": rand(rng, 2, 3, 6, 6), "rois": rois})
    assert "mm_roi" in str(info.value) and "batch" in str(info.value)
