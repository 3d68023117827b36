"""``dcnkit build --fp16 / --bf16`` (dcnkit.runtime.precision.convert_float_tensors, which every TensorRT engine the
kit builds goes through): the RoI input of every RoI operator the plugins run stays float32 in the converted ONNX,
while the features become 16-bit. Checked on the converted model: onnx.checker with strict shape inference, the
inferred types, and the values of a RoIAlign on boxes of a 1333-pixel image against torchvision's roi_align with
float32 boxes on the float16-rounded map."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from dcnkit.export.schemas import register_onnx_schemas
from dcnkit.runtime import precision


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _roi_ops_model():
    """Every RoI operator the plugins run, the kit's and mmcv's / mmdeploy's names, with RoIs fed by the caller
    (``rois``) and computed in the graph (``rois_in`` * 1 + 0: ``rois_calc``)."""
    register_onnx_schemas()
    one = helper.make_tensor("one", T.FLOAT, [], [1.0])
    nodes = [
        helper.make_node("Relu", ["x"], ["f"], name="relu"),
        helper.make_node("Mul", ["rois_in", "one"], ["rois_calc"], name="calc"),
        helper.make_node("RoIAlign", ["f", "rois"], ["a"], domain="dcnkit", name="ra", output_size=[2, 2]),
        helper.make_node("DeformRoIPool", ["f", "rois_calc"], ["b"], domain="dcnkit", name="dr", output_size=[2, 2]),
        helper.make_node("DeformPSRoIPool", ["f", "rois"], ["c", "c_count"], domain="dcnkit", name="ps",
                         output_dim=1, group_size=2, output_size=2, no_trans=1),
        helper.make_node("MultiLevelRoIAlign", ["rois_calc", "f", "f"], ["d"], domain="dcnkit", name="ml",
                         output_size=[2, 2], featmap_strides=[1.0, 2.0]),
        helper.make_node("MMCVRoiAlign", ["f", "rois"], ["e"], domain="mmcv", name="mmcv_ra", output_height=2,
                         output_width=2),
        helper.make_node("MMCVMultiLevelRoiAlign", ["rois", "f", "f"], ["g"], domain="mmdeploy", name="mmdeploy_ml",
                         output_height=2, output_width=2, featmap_strides=[1.0, 2.0]),
    ]
    outs = [_vi(n, T.FLOAT, None) for n in ("a", "b", "c", "c_count", "d", "e", "g")]
    graph = helper.make_graph(nodes, "g", [_vi("x", T.FLOAT, [1, 4, 16, 16]), _vi("rois", T.FLOAT, ["K", 5]),
                                           _vi("rois_in", T.FLOAT, ["K", 5])], outs, initializer=[one])
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid(d, v) for d, v in (
        ("", 17), ("dcnkit", 1), ("mmcv", 1), ("mmdeploy", 1))])


@pytest.mark.parametrize("dtype,elem", [("float16", T.FLOAT16), ("bfloat16", T.BFLOAT16)])
def test_rois_of_every_roi_operator_stay_float32(dtype, elem):
    conv, report = precision.convert_float_tensors(_roi_ops_model(), dtype)
    inferred = onnx.shape_inference.infer_shapes(conv, strict_mode=True)
    types = {v.name: v.type.tensor_type.elem_type for v in list(inferred.graph.input) + list(inferred.graph.value_info)
             + list(inferred.graph.output)}
    nodes = {n.name: n for n in conv.graph.node}
    for name, rois_at, features_at in (("ra", 1, 0), ("dr", 1, 0), ("ps", 1, 0), ("ml", 0, 1), ("mmcv_ra", 1, 0),
                                       ("mmdeploy_ml", 0, 1)):
        n = nodes[name]
        assert types[n.input[rois_at]] == T.FLOAT, (name, n.input[rois_at])
        assert types[n.input[features_at]] == elem, name
        assert f"{n.op_type} {name}: input {rois_at}" in report.kept_float32
    for name in ("ra", "dr", "ps", "ml"):  # the kit's outputs take the features' type, not the RoIs'
        assert types[nodes[name].output[0]] == elem, name
    # The caller's RoIs are used as they are (no Cast to 16 bits and back), and RoIs computed from them are
    # computed in float32 (rois_in * one: graph input and initializer stay float32).
    assert nodes["ra"].input[1] == "rois" and nodes["mmdeploy_ml"].input[0] == "rois"
    assert nodes["dr"].input[1] == nodes["ml"].input[0] == "rois_calc" == nodes["calc"].output[0]
    assert list(nodes["calc"].input) == ["rois_in", "one"]
    assert types["rois_in"] == T.FLOAT and next(t for t in conv.graph.initializer if t.name == "one").data_type == T.FLOAT
    assert not any(n.op_type == "Cast" and n.input[0] in ("rois", "rois_in") for n in conv.graph.node)
    onnx.checker.check_model(onnx.shape_inference.infer_shapes(_only_kit_nodes(conv)), full_check=True)


def _only_kit_nodes(model):
    """The model without the mmcv / mmdeploy nodes (onnx has no schemas for them) for onnx.checker."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = [n for n in out.graph.node if n.domain not in ("mmcv", "mmdeploy")]
    dropped = {o for n in out.graph.node if n.domain in ("mmcv", "mmdeploy") for o in n.output}
    del out.graph.node[:]
    out.graph.node.extend(n for n in keep if not (n.op_type == "Cast" and n.input[0] in dropped))
    outputs = [o for o in out.graph.output if o.name in {x for n in out.graph.node for x in n.output}]
    del out.graph.output[:]
    out.graph.output.extend(outputs)
    return out


def test_roi_work_read_by_a_subgraph_is_left_to_the_conversion():
    """An If branch reads the computed RoIs (torchvision's batched NMS does): the branch is converted on its own,
    reading the target type, so that result stays converted (a Cast to float32 in front of the RoI node)."""
    register_onnx_schemas()

    def branch(out):
        return helper.make_graph([helper.make_node("Add", ["rois_calc", "rois_calc"], [out])], out, [],
                                 [_vi(out, T.FLOAT, None)])

    nodes = [
        helper.make_node("Relu", ["x"], ["f"], name="relu"),
        helper.make_node("Mul", ["rois_in", "one"], ["rois_calc"], name="calc"),
        helper.make_node("RoIAlign", ["f", "rois_calc"], ["a"], domain="dcnkit", name="ra", output_size=[2, 2]),
        helper.make_node("If", ["cond"], ["z"], name="if", then_branch=branch("t"), else_branch=branch("e")),
    ]
    graph = helper.make_graph(nodes, "g", [_vi("x", T.FLOAT, [1, 4, 16, 16]), _vi("rois_in", T.FLOAT, [3, 5]),
                                           _vi("cond", T.BOOL, [])],
                              [_vi("a", T.FLOAT, [3, 4, 2, 2]), _vi("z", T.FLOAT, [3, 5])],
                              initializer=[helper.make_tensor("one", T.FLOAT, [], [1.0])])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17),
                                                                   helper.make_opsetid("dcnkit", 1)])
    conv, _ = precision.convert_float_tensors(model, "float16")
    onnx.checker.check_model(conv, full_check=True)
    ra = next(n for n in conv.graph.node if n.name == "ra")
    cast = next(n for n in conv.graph.node if n.output[0] == ra.input[1])
    assert cast.op_type == "Cast" and cast.input[0] == "rois_calc" and cast.attribute[0].i == T.FLOAT


def _decoded_rois_model(anchors):
    """RoIs decoded in the graph: rois = Concat(0, anchors + Relu(deltas) * 0.5) -> RoIAlign(Relu(x), rois); the
    decoded boxes also feed a converted node (Relu -> graph output ``boxes_relu``)."""
    register_onnx_schemas()
    k = anchors.shape[0]
    nodes = [
        helper.make_node("Relu", ["x"], ["f"], name="relu_x"),
        helper.make_node("Relu", ["deltas"], ["d"], name="relu_d"),  # a converted tensor entering the RoI work
        helper.make_node("Constant", [], ["half"], name="half", value_float=0.5),
        helper.make_node("Mul", ["d", "half"], ["scaled"], name="scale"),
        helper.make_node("Add", ["anchors", "scaled"], ["boxes"], name="decode"),
        helper.make_node("Concat", ["batch", "boxes"], ["rois"], name="concat", axis=1),
        helper.make_node("RoIAlign", ["f", "rois"], ["y"], domain="dcnkit", name="ra", output_size=[3, 3],
                         spatial_scale=1.0, sampling_ratio=2, aligned=1),
        helper.make_node("Relu", ["boxes"], ["boxes_relu"], name="relu_boxes"),
    ]
    inits = [onnx.numpy_helper.from_array(anchors, "anchors"),
             onnx.numpy_helper.from_array(np.zeros((k, 1), np.float32), "batch")]
    graph = helper.make_graph(nodes, "g", [_vi("x", T.FLOAT, [1, 2, 8, 1340]), _vi("deltas", T.FLOAT, [k, 4])],
                              [_vi("y", T.FLOAT, [k, 2, 3, 3]), _vi("boxes_relu", T.FLOAT, [k, 4])],
                              initializer=inits)
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17),
                                                                  helper.make_opsetid("dcnkit", 1)])


def test_rois_decoded_in_the_graph_are_decoded_in_float32():
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    from dcnkit.runtime.reference_runner import ReferenceRunner

    x1 = np.array([1100.3, 1203.7, 1290.45, 1311.2], np.float32)
    anchors = np.stack([x1, np.full(4, 1.25), x1 + 2.6, np.full(4, 6.5)], 1).astype(np.float32)
    conv, report = precision.convert_float_tensors(_decoded_rois_model(anchors), "float16")
    onnx.checker.check_model(conv, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(conv, strict_mode=True)
    types = {v.name: v.type.tensor_type.elem_type for v in list(inferred.graph.value_info) + list(inferred.graph.input)}
    nodes = {n.name: n for n in conv.graph.node}
    for t in ("half", "scaled", "boxes", "rois"):  # the decoding runs in float32...
        assert types[t] == T.FLOAT, t
    assert {t.name: t.data_type for t in conv.graph.initializer} == {"anchors": T.FLOAT, "batch": T.FLOAT}
    assert types[nodes["relu_d"].output[0]] == T.FLOAT16 and types[nodes["relu_x"].output[0]] == T.FLOAT16
    entering = next(n for n in conv.graph.node if n.output[0] == nodes["scale"].input[0])  # ...from a Cast in
    assert entering.op_type == "Cast" and entering.input[0] == nodes["relu_d"].output[0]
    leaving = next(n for n in conv.graph.node if n.output[0] == nodes["relu_boxes"].input[0])  # ...and a Cast out
    assert leaving.op_type == "Cast" and leaving.input[0] == "boxes" and types[leaving.output[0]] == T.FLOAT16
    assert "Mul scale: input 0" in report.kept_float32 and "RoIAlign ra: input 1" in report.kept_float32

    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 8, 1340)).astype(np.float32)
    deltas = rng.uniform(0.1, 0.9, (4, 4)).astype(np.float32)
    with ReferenceRunner(conv) as r:
        got = r.run({"x": x, "deltas": deltas})["y"]
    # The decoding in float32 of the float16 deltas (what the converted Relu gives), on the float16 Relu(x).
    boxes = torch.from_numpy(anchors) + torch.from_numpy(deltas).half().float() * 0.5
    rois = torch.cat([torch.zeros(4, 1), boxes], 1)
    want = torchvision.ops.roi_align(torch.from_numpy(x).half().float().relu(), rois, (3, 3), 1.0, 2, aligned=True)
    np.testing.assert_allclose(got, want.half().float().numpy(), rtol=0, atol=2e-3)


def test_float16_engine_pools_boxes_of_a_large_image_at_their_float32_place():
    """Boxes of a 1333-pixel image: float16 steps by 1 px above 1024 px, float32 keeps them. The converted model's
    RoIAlign equals torchvision's roi_align of float32 boxes on the float16-rounded map (float16 output)."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    from dcnkit.runtime.reference_runner import ReferenceRunner

    register_onnx_schemas()
    node = helper.make_node("RoIAlign", ["x", "rois"], ["y"], domain="dcnkit", name="ra", output_size=[3, 3],
                            spatial_scale=1.0, sampling_ratio=2, aligned=1)
    graph = helper.make_graph([node], "g", [_vi("x", T.FLOAT, [1, 2, 8, 1340]), _vi("rois", T.FLOAT, ["K", 5])],
                              [_vi("y", T.FLOAT, ["K", 2, 3, 3])])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17),
                                                                   helper.make_opsetid("dcnkit", 1)])
    conv, _ = precision.convert_float_tensors(model, "float16")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 8, 1340)).astype(np.float32)
    x1 = np.array([1100.3, 1203.7, 1290.45, 1311.2], np.float32)
    rois = np.stack([np.zeros(4), x1, np.full(4, 1.25), x1 + 2.6, np.full(4, 6.5)], 1).astype(np.float32)
    with ReferenceRunner(conv) as r:
        got = r.run({"x": x, "rois": rois})["y"]
    x16 = torch.from_numpy(x).half().float()
    want = torchvision.ops.roi_align(x16, torch.from_numpy(rois), (3, 3), 1.0, 2, aligned=True).half().float()
    np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=2e-3)
