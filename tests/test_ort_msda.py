"""multi_scale_deformable_attn in ONNX and ONNX Runtime: both exporters write one
dcnkit::MultiScaleDeformableAttention node (inputs value, spatial_shapes, level_start_index, sampling_locations,
attention_weights) whose ORT result equals eager; strict shape inference; the names mmdeploy and mmcv write
(MMCVMultiScaleDeformableAttention with im2col_step), built with onnx.helper as those exporters write them, run
in ORT and equal the op; the Deformable DETR layer exported whole equals eager; bad nodes and bad level tables
give errors naming the input."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

import dcnkit  # noqa: E402
import dcnkit.export  # noqa: E402
from dcnkit.nn import MultiScaleDeformableAttention  # noqa: E402
from dcnkit.ops import multi_scale_deformable_attn as msda  # noqa: E402
from dcnkit.runtime import ort_session  # noqa: E402

from msda_cases import level_tables, make_inputs  # noqa: E402
from ort_cuda_skip import ort_cuda_or_skip  # noqa: E402

RTOL, ATOL = 1e-5, 1e-6
F32, I64 = TensorProto.FLOAT, TensorProto.INT64
NAMES = ["value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"]


def inputs32(**kw):
    return make_inputs(dtype=torch.float32, **kw)


def feeds(inputs):
    return {n: t.numpy() for n, t in zip(NAMES, inputs)}


def session(model):
    data = model if isinstance(model, (str, bytes)) else model.SerializeToString()
    return ort_session(data, providers=["CPUExecutionProvider"], intra_op_num_threads=2)


class Attn(torch.nn.Module):
    def forward(self, value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
        return msda(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)


@pytest.mark.parametrize("dynamo", [pytest.param(True, id="dynamo"), pytest.param(False, id="torchscript")])
def test_export_one_node_and_ort_equals_eager(dynamo, tmp_path):
    path = tmp_path / "msda.onnx"
    dcnkit.export.to_onnx(Attn().eval(), inputs32(), path, dynamo=dynamo, dynamic_batch=False, input_names=NAMES)
    proto = onnx.load(str(path))
    nodes = [n for n in proto.graph.node if n.op_type != "Constant"]
    assert [(n.domain, n.op_type) for n in nodes] == [("dcnkit", "MultiScaleDeformableAttention")]
    assert list(nodes[0].input) == NAMES
    inferred = dcnkit.export.check_model(path)
    dims = [d.dim_param or d.dim_value for d in inferred.graph.output[0].type.tensor_type.shape.dim]
    assert dims == [2, 7, 12]
    inputs = inputs32(seed=3)
    got = session(str(path)).run(None, feeds(inputs))[0]
    np.testing.assert_allclose(got, msda(*inputs).numpy(), rtol=RTOL, atol=ATOL)


def test_schema_infers_and_rejects(tmp_path):
    from dcnkit.export import register_onnx_schemas

    register_onnx_schemas()
    vi = helper.make_tensor_value_info

    def model(loc_shape, table_type=I64):
        node = helper.make_node("MultiScaleDeformableAttention", NAMES, ["y"], domain="dcnkit")
        graph = helper.make_graph([node], "g", [vi("value", F32, ["N", 44, 3, 4]), vi("spatial_shapes", table_type, [3, 2]),
                                                vi("level_start_index", I64, [3]), vi("sampling_locations", F32, loc_shape),
                                                vi("attention_weights", F32, ["N", "Q", 3, 3, 2])], [vi("y", F32, None)])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dcnkit", 1)])

    ok = onnx.shape_inference.infer_shapes(model(["N", "Q", 3, 3, 2, 2]), strict_mode=True)
    dims = [d.dim_param or d.dim_value for d in ok.graph.output[0].type.tensor_type.shape.dim]
    assert dims == ["N", "Q", 12]
    assert ok.graph.output[0].type.tensor_type.elem_type == F32
    with pytest.raises(Exception, match=r"MultiScaleDeformableAttention: sampling_locations.shape\[2\]: expected 3, "
                                         r"got 4"):
        onnx.shape_inference.infer_shapes(model(["N", "Q", 4, 3, 2, 2]), strict_mode=True)
    with pytest.raises(Exception, match=r"sampling_locations: expected rank 6, got rank 5"):
        onnx.shape_inference.infer_shapes(model(["N", "Q", 3, 3, 2]), strict_mode=True)
    with pytest.raises(Exception):  # float level tables are not of the schema's int64 type
        onnx.checker.check_model(model(["N", "Q", 3, 3, 2, 2], F32), full_check=True)


# ------------------------------------------------------------------------------------------------
# Nodes as mmdeploy and mmcv write them


def hand_model(domain, op_type, **attrs):
    """One node with the five inputs as graph inputs; mmdeploy writes `im2col_step` as an int attribute."""
    vi = helper.make_tensor_value_info
    node = helper.make_node(op_type, NAMES, ["output"], domain=domain, name="msda", **attrs)
    graph = helper.make_graph([node], "g", [vi("value", F32, None), vi("spatial_shapes", I64, None),
                                            vi("level_start_index", I64, None), vi("sampling_locations", F32, None),
                                            vi("attention_weights", F32, None)], [vi("output", F32, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11), helper.make_opsetid(domain, 1)],
                             ir_version=8)


@pytest.mark.parametrize("domain, op_type, attrs", [
    ("mmdeploy", "MMCVMultiScaleDeformableAttention", {"im2col_step": 64}),
    ("mmcv", "MMCVMultiScaleDeformableAttention", {"im2col_step": 64}),
    ("mmdeploy", "MMCVMultiScaleDeformableAttention", {}),
    ("dcnkit", "MultiScaleDeformableAttention", {}),
])
def test_foreign_and_own_nodes_equal_op(domain, op_type, attrs):
    sess = session(hand_model(domain, op_type, **attrs))
    for kw in ({}, {"sizes": ((9, 7), (5, 4), (3, 2), (1, 1)), "channels": 32, "queries": 20, "points": 4, "n": 1},
               {"queries": 0}):
        inputs = inputs32(seed=4, **kw)
        got = sess.run(None, feeds(inputs))[0]
        np.testing.assert_allclose(got, msda(*inputs).numpy(), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("domain", ["nvidia", "trt", "TRT"])
def test_tensorrt_plugin_name_as_torch_symbolics_write_it(domain, tmp_path):
    """TensorRT's MultiscaleDeformableAttnPlugin_TRT, as the torch symbolics of TensorRT users write it (domain
    nvidia / trt / TRT, no attributes, int64 tables): output (N, Lq, M, D), the op's values split per head; the
    reference runner agrees."""
    from dcnkit.runtime.reference_runner import ReferenceRunner

    model = hand_model(domain, "MultiscaleDeformableAttnPlugin_TRT")
    sess = session(model)
    for kw in ({}, {"sizes": ((9, 7), (5, 4), (3, 2), (1, 1)), "channels": 32, "queries": 20, "points": 4, "n": 1}):
        inputs = inputs32(seed=5, **kw)
        got = sess.run(None, feeds(inputs))[0]
        value, loc = inputs[0], inputs[3]
        assert got.shape == (loc.shape[0], loc.shape[1], value.shape[2], value.shape[3])
        np.testing.assert_allclose(got.reshape(got.shape[0], got.shape[1], -1), msda(*inputs).numpy(), rtol=RTOL,
                                   atol=ATOL)
    path = tmp_path / "trt_msda.onnx"
    onnx.save(model, str(path))
    inputs = inputs32(seed=6)
    with ReferenceRunner(str(path)) as runner:
        ref = runner.run(feeds(inputs))
    ref = ref[0] if isinstance(ref, (list, tuple)) else next(iter(ref.values()))
    np.testing.assert_allclose(ref, sess.run(None, feeds(inputs))[0], rtol=RTOL, atol=ATOL)
    with pytest.raises(Exception, match=r"INVALID_ARGUMENT|Unexpected input data type"):  # int64 tables, as torch
        sess.run(None, feeds((inputs[0], inputs[1].int(), inputs[2].int(), *inputs[3:])))


def test_bad_inputs_and_level_tables():
    sess = session(hand_model("mmdeploy", "MMCVMultiScaleDeformableAttention", im2col_step=64))
    value, shapes, starts, loc, attn = inputs32()
    with pytest.raises(Exception, match=r"spatial_shapes: expected sum of H\*W equal to S = 44 \(value's dim 1\), "
                                         r"got 43"):
        sess.run(None, feeds((value, torch.tensor([[6, 5], [3, 4], [1, 1]]), starts, loc, attn)))
    with pytest.raises(Exception, match=r"level_start_index\[1\]: expected a start with start \+ H\*W <= S = 44"):
        sess.run(None, feeds((value, shapes, torch.tensor([0, 40, 42]), loc, attn)))
    with pytest.raises(Exception, match=r"sampling_locations: expected size 3 at dim 2 \(M, the heads of value\)"):
        sess.run(None, feeds((value, shapes, starts, loc[:, :, :2].contiguous(), attn)))
    with pytest.raises(Exception, match=r"INVALID_ARGUMENT|Unexpected input data type"):
        sess.run(None, feeds((value, shapes.int(), starts, loc, attn)))


def test_deformable_detr_layer_exported_whole_equals_eager(tmp_path):
    """The module (projections, softmax, reference points, the fused op) in both exporters, with no warning from
    dcnkit's code; the level tables are constants of the graph."""
    torch.manual_seed(0)
    sizes = ((8, 6), (4, 3), (2, 2))
    shapes, starts = level_tables(sizes)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = MultiScaleDeformableAttention(32, 4, 3, 2, batch_first=True, dropout=0.0)
            self.register_buffer("shapes", shapes)
            self.register_buffer("starts", starts)

        def forward(self, query, value, reference_points):
            return self.attn(query, value=value, reference_points=reference_points, spatial_shapes=self.shapes,
                             level_start_index=self.starts)

    layer = Layer().eval()
    S = 48 + 12 + 4
    args = (torch.randn(2, 9, 32), torch.randn(2, S, 32), torch.rand(2, 9, 3, 2))
    ours = Path(dcnkit.__file__).resolve().parent
    for dynamo in (True, False):
        path = tmp_path / f"layer_{dynamo}.onnx"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dcnkit.export.to_onnx(layer, args, path, dynamo=dynamo, input_names=["query", "value", "reference_points"])
        # (torch's DeprecationWarning about the legacy exporter points at dcnkit's call of it.)
        assert [str(w.message) for w in caught if Path(w.filename).resolve().is_relative_to(ours)
                and w.category is not DeprecationWarning] == []
        proto = onnx.load(str(path))
        assert [n.op_type for n in proto.graph.node if n.domain == "dcnkit"] == ["MultiScaleDeformableAttention"]
        sess = session(str(path))
        new = (torch.randn(2, 9, 32), torch.randn(2, S, 32), torch.rand(2, 9, 3, 2))
        got = sess.run(None, {"query": new[0].numpy(), "value": new[1].numpy(), "reference_points": new[2].numpy()})[0]
        with torch.no_grad():
            np.testing.assert_allclose(got, layer(*new).numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
def test_cuda_ep_equals_op():
    ort_cuda_or_skip()
    model = hand_model("mmdeploy", "MMCVMultiScaleDeformableAttention", im2col_step=64)
    sess = ort_session(model.SerializeToString(), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    inputs = inputs32(channels=32, seed=6)
    np.testing.assert_allclose(sess.run(None, feeds(inputs))[0], msda(*inputs).numpy(), rtol=RTOL, atol=ATOL)


@pytest.mark.cuda
def test_cuda_ep_bad_level_tables_give_zeros():
    """The CUDA EP reads the tables on the device and cannot raise without synchronising: a table the CPU rejects
    (see test_bad_inputs_and_level_tables) gives zeros, without an error."""
    ort_cuda_or_skip()
    model = hand_model("mmdeploy", "MMCVMultiScaleDeformableAttention", im2col_step=64)
    sess = ort_session(model.SerializeToString(), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    value, shapes, starts, loc, attn = inputs32()
    for bad in ((value, torch.tensor([[6, 5], [3, 4], [1, 1]]), starts, loc, attn),
                (value, shapes, torch.tensor([0, 40, 42]), loc, attn)):
        got = sess.run(None, feeds(bad))[0]
        assert got.shape == msda(value, shapes, starts, loc, attn).shape and not got.any()


def test_reference_runner_runs_the_node(tmp_path):
    """dcnkit's ONNX reference runner (onnx.reference + NumPy, no native code) runs the exported node too."""
    from dcnkit.runtime.reference_runner import ReferenceRunner

    path = tmp_path / "msda.onnx"
    dcnkit.export.to_onnx(Attn().eval(), inputs32(), path, dynamic_batch=False, input_names=NAMES)
    inputs = inputs32(seed=8)
    with ReferenceRunner(str(path)) as runner:
        got = runner.run(feeds(inputs))
    got = got[0] if isinstance(got, (list, tuple)) else next(iter(got.values()))
    np.testing.assert_allclose(got, msda(*inputs).numpy(), rtol=1e-5, atol=1e-6)
