"""ONNX schemas of the dcnkit domain: checker (full check) and strict shape inference on hand-built
graphs, symbolic dims kept, inconsistent inputs rejected with the core's message format.

(Our inference functions are Python: onnx raises their InferenceError in strict and non-strict mode.)"""
from __future__ import annotations

import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

import dcnkit  # noqa: E402
from dcnkit.export import register_onnx_schemas  # noqa: E402

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16


@pytest.fixture(scope="module", autouse=True)
def _schemas():
    register_onnx_schemas()


def _model(op_type, inputs, outputs, elem=F32, **attrs):
    """inputs: [(name, shape)] (None name: omitted optional input); outputs: names."""
    node = helper.make_node(op_type, [n or "" for n, _ in inputs], outputs, domain="dcnkit", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, elem, s) for n, s in inputs if n],
        [helper.make_tensor_value_info(o, elem, [None] * 4) for o in outputs],  # rank only
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("dcnkit", 1)])


def _infer(model):
    onnx.checker.check_model(model, full_check=False)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    out = {}
    for vi in inferred.graph.output:
        t = vi.type.tensor_type
        if t.HasField("shape"):
            out[vi.name] = (t.elem_type, [d.dim_param if d.HasField("dim_param") else
                                          (d.dim_value if d.HasField("dim_value") else None) for d in t.shape.dim])
    return out


def test_schemas_come_from_the_op_table():
    table = dcnkit.op_defs()
    for d in table["ops"]:
        s = onnx.defs.get_schema(d["onnx_type"], table["opset"], table["domain"])
        assert [i.name for i in s.inputs] == [i["name"] for i in d["inputs"]]
        assert [o.name for o in s.outputs] == [o["name"] for o in d["outputs"]]
        # The op's attributes, plus the two TensorRT's ONNX parser reads to find the plugin.
        assert sorted(s.attributes) == sorted([a["name"] for a in d["attrs"]] + ["plugin_namespace", "plugin_version"])
        assert s.attributes["plugin_namespace"].default_value.s == table["domain"].encode()
        assert s.attributes["plugin_version"].default_value.s == b"1"
        assert s.has_type_and_shape_inference_function


def test_deform_conv2d_shapes():
    m = _model("DeformConv2d",
               [("x", ["N", 6, 10, 12]), ("offset", ["N", 36, 5, 6]), ("w", [8, 3, 3, 3]), ("b", [8]),
                ("mask", ["N", 18, 5, 6])],
               ["y"], stride=[2, 2], padding=[1, 1], dilation=[1, 1], groups=2, deformable_groups=2)
    onnx.checker.check_model(m, full_check=True)
    assert _infer(m)["y"] == (F32, ["N", 8, 5, 6])


def test_deform_conv2d_symbolic_spatial_dims_from_offset():
    m = _model("DeformConv2d", [("x", ["N", 4, "H", "W"]), ("offset", ["N", 18, "Ho", "Wo"]), ("w", [5, 4, 3, 3])],
               ["y"], elem=F16)
    assert _infer(m)["y"] == (F16, ["N", 5, "Ho", "Wo"])


def test_deform_conv2d_optional_bias_absent_mask_present():
    m = _model("DeformConv2d",
               [("x", [2, 4, 7, 7]), ("offset", [2, 18, 7, 7]), ("w", [4, 4, 3, 3]), (None, None),
                ("mask", [2, 9, 7, 7])], ["y"], padding=[1, 1])
    onnx.checker.check_model(m, full_check=True)
    assert _infer(m)["y"] == (F32, [2, 4, 7, 7])


@pytest.mark.parametrize("op_type, extra", [("RoIAlign", {}), ("DeformRoIPool", {})])
def test_roi_ops_shapes(op_type, extra):
    m = _model(op_type, [("x", ["batch", 7, "H", "W"]), ("rois", ["num_rois", 5])], ["y"], output_size=[3, 4])
    onnx.checker.check_model(m, full_check=True)
    assert _infer(m)["y"] == (F32, ["num_rois", 7, 3, 4])


def test_deform_roi_pool_with_offset():
    m = _model("DeformRoIPool", [("x", [1, 2, 8, 8]), ("rois", ["K", 5]), ("offset", ["K", 2, 2, 2])], ["y"],
               output_size=[2, 2], gamma=0.2)
    assert _infer(m)["y"] == (F32, ["K", 2, 2, 2])


def test_deform_psroi_pool_shapes_both_outputs():
    m = _model("DeformPSRoIPool", [("x", ["N", 2 * 9, 8, 8]), ("rois", ["K", 5]), ("trans", ["K", 4, 3, 3])],
               ["y", "count"], output_size=3, output_dim=2, group_size=3, part_size=3, trans_std=0.1)
    onnx.checker.check_model(m, full_check=True)
    got = _infer(m)
    assert got["y"] == (F32, ["K", 2, 3, 3]) and got["count"] == (F32, ["K", 2, 3, 3])


@pytest.mark.parametrize(
    "op_type, inputs, attrs, message",
    [
        ("DeformConv2d", [("x", [1, 4, 8, 8]), ("offset", [1, 9, 8, 8]), ("w", [4, 4, 3, 3])], dict(padding=[1, 1]),
         "DeformConv2d: offset.shape[1]: expected 18, got 9"),
        ("DeformConv2d", [("x", [1, 4, 8, 8]), ("offset", [1, 18, 7, 8]), ("w", [4, 4, 3, 3])], dict(padding=[1, 1]),
         "DeformConv2d: offset.shape[2]: expected 8, got 7"),
        ("DeformConv2d", [("x", [1, 4, 8, 8]), ("offset", [1, 18, 6, 6]), ("w", [4, 3, 3, 3])], {},
         "DeformConv2d: weight.shape[1]: expected 4, got 3"),
        ("DeformConv2d", [("x", [1, 6, 8, 8]), ("offset", [1, 18, 6, 6]), ("w", [4, 6, 3, 3])], dict(deformable_groups=4),
         "DeformConv2d: deformable_groups: expected a divisor of Cin=6, got 4"),
        ("DeformConv2d", [("x", [1, 4, 8, 8]), ("offset", [1, 18, 6, 6]), ("w", [4, 4, 3, 3])], dict(stride=[0, 1]),
         "DeformConv2d: stride: expected 2 values >= 1, got [0, 1]"),
        ("DeformConv2d", [("x", [1, 4, 8]), ("offset", [1, 18, 6, 6]), ("w", [4, 4, 3, 3])], {},
         "DeformConv2d: input: expected rank 4, got rank 3"),
        ("RoIAlign", [("x", [1, 4, 8, 8]), ("rois", [3, 4])], {}, "RoIAlign: rois.shape[1]: expected 5, got 4"),
        ("RoIAlign", [("x", [1, 4, 8, 8]), ("rois", [3, 5])], dict(pool_mode="min"),
         "RoIAlign: pool_mode: expected avg or max, got 'min'"),
        ("RoIAlign", [("x", [1, 4, 8, 8]), ("rois", [3, 5])], dict(output_size=[0, 2]),
         "RoIAlign: output_size: expected 2 values >= 1, got [0, 2]"),
        ("DeformRoIPool", [("x", [1, 4, 8, 8]), ("rois", [3, 5]), ("offset", [3, 2, 3, 3])], dict(output_size=[2, 2]),
         "DeformRoIPool: offset.shape[2]: expected 2, got 3"),
        ("DeformPSRoIPool", [("x", [1, 10, 8, 8]), ("rois", [3, 5])], dict(output_dim=2, group_size=2, no_trans=1),
         "DeformPSRoIPool: input.shape[1]: expected 8, got 10"),
        ("DeformPSRoIPool", [("x", [1, 8, 8, 8]), ("rois", [3, 5]), ("trans", [3, 2, 7, 7])],
         dict(output_dim=2, group_size=2, no_trans=1), "DeformPSRoIPool: trans: expected absent when no_trans=1"),
    ],
)
def test_strict_inference_rejects_inconsistent_inputs(op_type, inputs, attrs, message):
    m = _model(op_type, inputs, ["y"], **attrs)
    with pytest.raises(onnx.shape_inference.InferenceError) as info:
        onnx.shape_inference.infer_shapes(m, strict_mode=True)
    assert message in str(info.value)


def test_checker_rejects_unknown_attribute():
    m = _model("RoIAlign", [("x", [1, 4, 8, 8]), ("rois", [3, 5])], ["y"], pooled_h=2)
    with pytest.raises(onnx.checker.ValidationError, match="pooled_h"):
        onnx.checker.check_model(m, full_check=True)


def test_register_is_idempotent():
    register_onnx_schemas()
    register_onnx_schemas()
    assert onnx.defs.has("DeformConv2d", "dcnkit")
