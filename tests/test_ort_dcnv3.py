"""DCNv3 / DCNv4 in ONNX and ONNX Runtime: both exporters write one dcnkit::DCNv3 / dcnkit::DCNv4 node with
InternImage's attribute names, strict shape inference gives (N, Ho, Wo, C), ORT equals the op and the
grid_sample formulation; mmdeploy::TRTDCNv3 built with onnx.helper exactly as InternImage's exporter writes it
(im2col_step included) runs too; bad nodes and bad inputs give errors naming the attribute or input; the
reference runner runs the nodes."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

import dcnkit  # noqa: E402
import dcnkit.export  # noqa: E402
from dcnkit.ops import dcnv3, dcnv4  # noqa: E402
from dcnkit.runtime import ort_session  # noqa: E402

from dcnv3_cases import ATTRS, dcnv4_offset_mask, grid_sample_dcnv3, make_inputs  # noqa: E402
from ort_cuda_skip import ort_cuda_or_skip  # noqa: E402

RTOL, ATOL = 1e-5, 1e-5
F32 = TensorProto.FLOAT
# InternImage's names, in DCNv3Function's argument order (im2col_step comes before remove_center there).
ATTR_NAMES = ("kernel_h", "kernel_w", "stride_h", "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w", "group",
              "group_channels", "offset_scale")
STRIDED = (3, 3, 2, 1, 1, 0, 1, 2, 3, 2, 0.75)  # stride 2 x 1, pad 1 x 0, dilation 1 x 2, 3 groups


def session(model):
    data = model if isinstance(model, (str, bytes)) else model.SerializeToString()
    return ort_session(data, providers=["CPUExecutionProvider"], intra_op_num_threads=2)


def inputs32(attrs=ATTRS, remove_center=0, **kw):
    return tuple(t.float() for t in make_inputs(attrs=attrs, remove_center=remove_center, dtype=torch.float64, **kw))


class V3(torch.nn.Module):
    def __init__(self, attrs=ATTRS, remove_center=0):
        super().__init__()
        self.attrs, self.remove_center = attrs, remove_center

    def forward(self, x, offset, mask):
        return dcnv3(x, offset, mask, *self.attrs, 256, self.remove_center)


class V4(V3):
    def forward(self, x, offset_mask):
        return dcnv4(x, offset_mask, *self.attrs, 256, self.remove_center, softmax=True)


def v4_inputs(attrs, remove_center=0, seed=0):
    x, off, m = inputs32(attrs, remove_center, seed=seed)
    points = attrs[0] * attrs[1] - remove_center
    return x, dcnv4_offset_mask(off, torch.randn_like(m), attrs[8], points).float()


@pytest.mark.parametrize("dynamo", [pytest.param(True, id="dynamo"), pytest.param(False, id="torchscript")])
@pytest.mark.parametrize("attrs, remove_center", [(ATTRS, 0), (STRIDED, 0), (ATTRS, 1)])
def test_export_one_node_and_ort_equals_op(dynamo, attrs, remove_center, tmp_path):
    for name, module, args, names in (
        ("DCNv3", V3(attrs, remove_center), inputs32(attrs, remove_center), ["input", "offset", "mask"]),
        ("DCNv4", V4(attrs, remove_center), v4_inputs(attrs, remove_center), ["value", "offset_mask"]),
    ):
        path = tmp_path / f"{name}.onnx"
        dcnkit.export.to_onnx(module.eval(), args, path, dynamo=dynamo, input_names=names)
        proto = onnx.load(str(path))
        nodes = [n for n in proto.graph.node if n.op_type != "Constant"]
        assert [(n.domain, n.op_type) for n in nodes] == [("dcnkit", name)]
        got_attrs = {a.name: helper.get_attribute_value(a) for a in nodes[0].attribute}
        assert [got_attrs[a] for a in ATTR_NAMES[:-1]] == list(attrs[:-1])
        assert got_attrs["offset_scale"] == pytest.approx(attrs[-1])
        assert got_attrs["remove_center"] == remove_center
        assert got_attrs.get("softmax", 1) == 1
        inferred = dcnkit.export.check_model(path)
        dims = [d.dim_param or d.dim_value for d in inferred.graph.output[0].type.tensor_type.shape.dim]
        expected = module(*args)
        assert dims[1:] == list(expected.shape[1:])
        fresh = v4_inputs(attrs, remove_center, seed=5) if name == "DCNv4" else inputs32(attrs, remove_center, seed=5)
        got = session(str(path)).run(None, {n: t.numpy() for n, t in zip(names, fresh)})[0]
        np.testing.assert_allclose(got, module(*fresh).numpy(), rtol=RTOL, atol=ATOL)


def test_ort_equals_grid_sample_formulation(tmp_path):
    """Against the independent grid_sample formulation (float64), not only against our own op."""
    path = tmp_path / "v3.onnx"
    dcnkit.export.to_onnx(V3(STRIDED).eval(), inputs32(STRIDED), path, input_names=["input", "offset", "mask"])
    x, off, m = make_inputs(attrs=STRIDED, seed=9)
    got = session(str(path)).run(None, {"input": x.float().numpy(), "offset": off.float().numpy(),
                                        "mask": m.float().numpy()})[0]
    np.testing.assert_allclose(got, grid_sample_dcnv3(x, off, m, *STRIDED).numpy(), rtol=1e-4, atol=1e-5)


def test_schema_infers_and_rejects():
    from dcnkit.export import register_onnx_schemas

    register_onnx_schemas()
    vi = helper.make_tensor_value_info

    def model(offset_shape, mask_shape, **attrs):
        node = helper.make_node("DCNv3", ["input", "offset", "mask"], ["y"], domain="dcnkit", **attrs)
        graph = helper.make_graph([node], "g", [vi("input", F32, ["N", 9, 8, 8]), vi("offset", F32, offset_shape),
                                                vi("mask", F32, mask_shape)], [vi("y", F32, None)])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dcnkit", 1)])

    attrs = dict(kernel_h=3, kernel_w=3, stride_h=2, stride_w=1, pad_h=1, pad_w=1, group=2, group_channels=4)
    ok = onnx.shape_inference.infer_shapes(model(["N", 5, 8, 36], ["N", 5, 8, 18], **attrs), strict_mode=True)
    dims = [d.dim_param or d.dim_value for d in ok.graph.output[0].type.tensor_type.shape.dim]
    assert dims == ["N", 5, 8, 8]
    with pytest.raises(Exception, match=r"DCNv3: offset.shape\[3\]: expected 36, got 34"):
        onnx.shape_inference.infer_shapes(model(["N", 5, 8, 34], ["N", 5, 8, 18], **attrs), strict_mode=True)
    with pytest.raises(Exception, match=r"DCNv3: input.shape\[3\]: expected 12, got 8"):
        onnx.shape_inference.infer_shapes(model(["N", 5, 8, 54], ["N", 5, 8, 27], **{**attrs, "group": 3}),
                                          strict_mode=True)
    with pytest.raises(Exception, match=r"DCNv3: stride_h: expected an int >= 1, got 0"):
        onnx.shape_inference.infer_shapes(model(["N", 5, 8, 36], ["N", 5, 8, 18], **{**attrs, "stride_h": 0}),
                                          strict_mode=True)


# ------------------------------------------------------------------------------------------------
# mmdeploy::TRTDCNv3 as InternImage's DCNv3Function.symbolic writes it


def trt_dcnv3_model(attrs=ATTRS, remove_center=0, im2col_step=256, domain="mmdeploy", op_type="TRTDCNv3"):
    ints = dict(zip(ATTR_NAMES[:-1], attrs[:-1]))
    node = helper.make_node(op_type, ["input", "offset", "mask"], ["output"], domain=domain, name="dcnv3",
                            **ints, offset_scale=float(attrs[-1]), im2col_step=im2col_step,
                            remove_center=remove_center)
    vi = helper.make_tensor_value_info
    graph = helper.make_graph([node], "g", [vi("input", F32, None), vi("offset", F32, None), vi("mask", F32, None)],
                              [vi("output", F32, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11), helper.make_opsetid(domain, 1)],
                             ir_version=8)


@pytest.mark.parametrize("attrs, remove_center", [(ATTRS, 0), (STRIDED, 0), (ATTRS, 1)])
def test_internimage_trt_dcnv3_node_equals_op(attrs, remove_center):
    sess = session(trt_dcnv3_model(attrs, remove_center))
    for seed, n in ((1, 2), (2, 1)):
        x, off, m = inputs32(attrs, remove_center, seed=seed, n=n)
        got = sess.run(None, {"input": x.numpy(), "offset": off.numpy(), "mask": m.numpy()})[0]
        np.testing.assert_allclose(got, dcnv3(x, off, m, *attrs, 256, remove_center).numpy(), rtol=RTOL, atol=ATOL)


def test_bad_nodes_and_inputs():
    with pytest.raises(Exception, match=r"TRTDCNv3: group: expected an int in \[1, 2\^24\], got 0"):
        session(trt_dcnv3_model(ATTRS[:8] + (0,) + ATTRS[9:]))
    with pytest.raises(Exception, match=r"remove_center: expected odd kernel_h and kernel_w"):
        session(trt_dcnv3_model((2, 3) + ATTRS[2:], remove_center=1))
    node = helper.make_node("DCNv4", ["value", "offset_mask"], ["y"], domain="dcnkit", softmax=2)
    vi = helper.make_tensor_value_info
    bad = helper.make_model(helper.make_graph([node], "g", [vi("value", F32, None), vi("offset_mask", F32, None)],
                                              [vi("y", F32, None)]),
                            opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dcnkit", 1)], ir_version=8)
    with pytest.raises(Exception, match=r"DCNv4: softmax: expected 0 or 1, got 2"):
        session(bad)
    sess = session(trt_dcnv3_model())
    x, off, m = inputs32()
    with pytest.raises(Exception, match=r"TRTDCNv3: input: expected C = group \* group_channels = 8 channels"):
        sess.run(None, {"input": x[..., :6].numpy(), "offset": off.numpy(), "mask": m.numpy()})
    with pytest.raises(Exception, match=r"TRTDCNv3: mask: expected size 18 at dim 3"):
        sess.run(None, {"input": x.numpy(), "offset": off.numpy(), "mask": m[..., :17].numpy()})


def test_huge_offsets_are_zero_samples_not_hangs():
    sess = session(trt_dcnv3_model())
    x, off, m = inputs32()
    off[0, 0, 0, :] = float("nan")
    off[1, 2, 3, :] = 1e30
    got = sess.run(None, {"input": x.numpy(), "offset": off.numpy(), "mask": m.numpy()})[0]
    assert np.all(got[0, 0, 0] == 0) and np.all(got[1, 2, 3] == 0)
    np.testing.assert_allclose(got, dcnv3(x, off, m, *ATTRS).numpy(), rtol=RTOL, atol=ATOL)


def test_reference_runner_runs_the_nodes(tmp_path):
    from dcnkit.runtime.reference_runner import ReferenceRunner

    x, off, m = inputs32(seed=4)
    path = tmp_path / "trt_dcnv3.onnx"
    onnx.save(trt_dcnv3_model(STRIDED), str(path))
    x, off, m = inputs32(STRIDED, seed=4)
    with ReferenceRunner(str(path)) as runner:
        got = runner.run({"input": x.numpy(), "offset": off.numpy(), "mask": m.numpy()})
    got = got[0] if isinstance(got, (list, tuple)) else next(iter(got.values()))
    np.testing.assert_allclose(got, dcnv3(x, off, m, *STRIDED).numpy(), rtol=RTOL, atol=ATOL)
    path = tmp_path / "dcnv4.onnx"
    args = v4_inputs(ATTRS, 1)
    dcnkit.export.to_onnx(V4(ATTRS, 1).eval(), args, path, input_names=["value", "offset_mask"])
    with ReferenceRunner(str(path)) as runner:
        got = runner.run({"value": args[0].numpy(), "offset_mask": args[1].numpy()})
    got = got[0] if isinstance(got, (list, tuple)) else next(iter(got.values()))
    np.testing.assert_allclose(got, V4(ATTRS, 1)(*args).numpy(), rtol=RTOL, atol=ATOL)


@pytest.mark.cuda
def test_cuda_ep_equals_op(tmp_path):
    ort_cuda_or_skip()
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    sess = ort_session(trt_dcnv3_model(STRIDED).SerializeToString(), providers=providers)
    x, off, m = inputs32(STRIDED, seed=6)
    got = sess.run(None, {"input": x.numpy(), "offset": off.numpy(), "mask": m.numpy()})[0]
    np.testing.assert_allclose(got, dcnv3(x, off, m, *STRIDED).numpy(), rtol=RTOL, atol=ATOL)
    path = tmp_path / "dcnv4.onnx"  # DCNv4 with softmax, exported
    args = v4_inputs(STRIDED, 1)
    dcnkit.export.to_onnx(V4(STRIDED, 1).eval(), args, path, input_names=["value", "offset_mask"])
    got = ort_session(str(path), providers=providers).run(None, {"value": args[0].numpy(),
                                                                 "offset_mask": args[1].numpy()})[0]
    np.testing.assert_allclose(got, V4(STRIDED, 1)(*args).numpy(), rtol=RTOL, atol=ATOL)
