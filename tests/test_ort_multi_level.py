"""multi_level_roi_align in ONNX and ONNX Runtime: both exporters write one dcnkit::MultiLevelRoIAlign node
(inputs rois, feat_0 .. feat_{L-1}; the op table's attributes) whose ORT result equals eager at several RoI
counts; strict shape inference keeps the dynamic RoI axis; mmdeploy's MMCVMultiLevelRoiAlign node built with
onnx.helper runs in ORT and equals the op; bad nodes give errors naming the attribute or input."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

import dcnkit  # noqa: E402
import dcnkit.export  # noqa: E402
from dcnkit.ops import multi_level_roi_align  # noqa: E402
from dcnkit.runtime import ort_session  # noqa: E402
from ort_cuda_skip import ort_cuda_or_skip  # noqa: E402

STRIDES = [4.0, 8.0, 16.0, 32.0]
RTOL, ATOL = 1e-5, 1e-6
F32 = TensorProto.FLOAT


def features(n=2, c=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, c, 128 // int(s), 96 // int(s), generator=g) for s in STRIDES]


def rois(k, n=2, seed=1):
    """K RoIs of sizes 8..300 px on a 128 x 96 image (every level of finest_scale 56)."""
    g = torch.Generator().manual_seed(seed)
    side = torch.exp(torch.empty(k).uniform_(np.log(8), np.log(300), generator=g))
    x1 = torch.empty(k).uniform_(-5, 90, generator=g)
    y1 = torch.empty(k).uniform_(-5, 120, generator=g)
    b = torch.randint(0, n, (k,), generator=g).float()
    return torch.stack([b, x1, y1, x1 + side * 0.8, y1 + side * 1.2], 1)


class Pooler(torch.nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, rois, f0, f1, f2, f3):
        return multi_level_roi_align([f0, f1, f2, f3], rois, (7, 6), STRIDES, **self.kw)


@pytest.mark.parametrize("dynamo", [pytest.param(True, id="dynamo"), pytest.param(False, id="torchscript")])
@pytest.mark.parametrize("kw", [dict(), dict(sampling_ratio=2, roi_scale_factor=1.25, aligned=False, pool_mode="max")],
                         ids=["defaults", "max-rescaled"])
def test_export_one_node_and_ort_equals_eager(dynamo, kw, tmp_path):
    model = Pooler(**kw).eval()
    path = tmp_path / "pooler.onnx"
    dcnkit.export.to_onnx(model, (rois(5), *features()), path, dynamo=dynamo,
                          input_names=["rois", "f0", "f1", "f2", "f3"])
    proto = onnx.load(str(path))
    nodes = [n for n in proto.graph.node if n.op_type not in ("Constant",)]
    assert [(n.domain, n.op_type) for n in nodes] == [("dcnkit", "MultiLevelRoIAlign")]
    node = nodes[0]
    assert list(node.input) == ["rois", "f0", "f1", "f2", "f3"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["output_size"] == [7, 6]
    assert attrs["featmap_strides"] == pytest.approx(STRIDES)
    assert attrs["sampling_ratio"] == kw.get("sampling_ratio", 0)
    assert attrs["finest_scale"] == 56
    assert attrs["roi_scale_factor"] == pytest.approx(kw.get("roi_scale_factor", 1.0))
    assert attrs["aligned"] == int(kw.get("aligned", True))
    assert attrs["pool_mode"] == kw.get("pool_mode", "avg").encode()
    assert attrs["plugin_namespace"] == b"dcnkit"
    assert {a.type for a in node.attribute if a.name == "featmap_strides"} == {onnx.AttributeProto.FLOATS}

    inferred = dcnkit.export.check_model(path)
    dims = [d.dim_param or d.dim_value for d in inferred.graph.output[0].type.tensor_type.shape.dim]
    assert dims == ["num_rois", 8, 7, 6]

    sess = ort_session(str(path), providers=["CPUExecutionProvider"], intra_op_num_threads=2)
    for n, k in [(2, 5), (3, 40), (1, 1), (2, 0)]:
        r, fs = rois(k, n, seed=k + 7), features(n, seed=n)
        with torch.no_grad():
            expected = model(r, *fs).numpy()
        got = sess.run(None, {"rois": r.numpy(), **{f"f{i}": f.numpy() for i, f in enumerate(fs)}})[0]
        assert got.shape == expected.shape == (k, 8, 7, 6)
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


def test_reference_runner_runs_the_node(tmp_path):
    """dcnkit's ONNX reference runner (onnx.reference + NumPy, no native code) runs the exported node too."""
    from dcnkit.runtime.reference_runner import ReferenceRunner

    model = Pooler(roi_scale_factor=1.1).eval()
    path = tmp_path / "pooler.onnx"
    dcnkit.export.to_onnx(model, (rois(5), *features()), path, input_names=["rois", "f0", "f1", "f2", "f3"])
    r, fs = rois(6, seed=3), features(seed=4)
    feeds = {"rois": r.numpy(), **{f"f{i}": f.numpy() for i, f in enumerate(fs)}}
    with ReferenceRunner(str(path)) as runner:
        got = runner.run(feeds)
    got = got[0] if isinstance(got, (list, tuple)) else next(iter(got.values()))
    with torch.no_grad():
        expected = model(r, *fs).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_exported_schema_rejects_inconsistent_nodes():
    from dcnkit.export import register_onnx_schemas

    register_onnx_schemas()
    vi = helper.make_tensor_value_info

    def model(strides, shapes):
        node = helper.make_node("MultiLevelRoIAlign", ["rois"] + [f"f{i}" for i in range(len(shapes))], ["y"],
                                domain="dcnkit", output_size=[2, 2], featmap_strides=strides)
        graph = helper.make_graph([node], "g", [vi("rois", F32, ["K", 5])] +
                                  [vi(f"f{i}", F32, s) for i, s in enumerate(shapes)], [vi("y", F32, None)])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dcnkit", 1)])

    ok = onnx.shape_inference.infer_shapes(model([4.0, 8.0], [[1, 3, 8, 8], [1, 3, 4, 4]]), strict_mode=True)
    dims = [d.dim_param or d.dim_value for d in ok.graph.output[0].type.tensor_type.shape.dim]
    assert dims == ["K", 3, 2, 2]
    with pytest.raises(Exception, match=r"MultiLevelRoIAlign: featmap_strides: expected one stride per feature map"):
        onnx.shape_inference.infer_shapes(model([4.0], [[1, 3, 8, 8], [1, 3, 4, 4]]), strict_mode=True)
    with pytest.raises(Exception, match=r"MultiLevelRoIAlign: feat_1.shape\[1\]: expected 3"):
        onnx.shape_inference.infer_shapes(model([4.0, 8.0], [[1, 3, 8, 8], [1, 5, 4, 4]]), strict_mode=True)


# ------------------------------------------------------------------------------------------------
# Nodes built by hand: the kit's own and mmdeploy's


def hand_model(domain, op_type, levels, **attrs):
    vi = helper.make_tensor_value_info
    names = ["rois"] + [f"feat_{i}" for i in range(levels)]
    node = helper.make_node(op_type, names, ["y"], domain=domain, name="pool", **attrs)
    graph = helper.make_graph([node], "g", [vi("rois", F32, ["K", 5])] +
                              [vi(n, F32, None) for n in names[1:]], [vi("y", F32, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11), helper.make_opsetid(domain, 1)],
                             ir_version=8)


def run(model, r, fs):
    sess = ort_session(model.SerializeToString(), providers=["CPUExecutionProvider"], intra_op_num_threads=2)
    return sess.run(None, {"rois": r.numpy(), **{f"feat_{i}": f.numpy() for i, f in enumerate(fs)}})[0]


@pytest.mark.parametrize("pool_mode", [0, 1])
@pytest.mark.parametrize("aligned", [0, 1])
@pytest.mark.parametrize("roi_scale_factor", [-1.0, 1.0, 2.0])
def test_mmdeploy_node_equals_op(pool_mode, aligned, roi_scale_factor):
    model = hand_model("mmdeploy", "MMCVMultiLevelRoiAlign", 4, output_height=7, output_width=5, pool_mode=pool_mode,
                       sampling_ratio=2, finest_scale=56, aligned=aligned, roi_scale_factor=roi_scale_factor,
                       featmap_strides=STRIDES)
    r, fs = rois(30), features()
    got = run(model, r, fs)
    expected = multi_level_roi_align(fs, r, (7, 5), STRIDES, 2, 56, roi_scale_factor, bool(aligned),
                                     "avg" if pool_mode == 1 else "max")
    np.testing.assert_allclose(got, expected.numpy(), rtol=RTOL, atol=ATOL)


def test_mmdeploy_node_defaults_and_three_levels():
    """Absent attributes take the op table's defaults (finest_scale 56, roi_scale_factor 1, aligned 1, avg)."""
    model = hand_model("mmdeploy", "MMCVMultiLevelRoiAlign", 3, output_height=3, output_width=3,
                       featmap_strides=STRIDES[:3])
    r, fs = rois(12), features()[:3]
    np.testing.assert_allclose(run(model, r, fs), multi_level_roi_align(fs, r, 3, STRIDES[:3]).numpy(),
                               rtol=RTOL, atol=ATOL)


def test_dcnkit_node_by_hand_single_level():
    model = hand_model("dcnkit", "MultiLevelRoIAlign", 1, output_size=[2, 3], featmap_strides=[8.0],
                       pool_mode="max", aligned=0)
    r, fs = rois(9), features()[1:2]
    np.testing.assert_allclose(run(model, r, fs),
                               multi_level_roi_align(fs, r, (2, 3), [8.0], aligned=False, pool_mode="max").numpy(),
                               rtol=RTOL, atol=ATOL)


def test_bad_nodes():
    r, fs = rois(4), features()
    with pytest.raises(Exception, match=r"MMCVMultiLevelRoiAlign: attribute pool_mode: expected an int: 0 \(max\), "
                                         r"1 \(avg\), got int 2"):
        run(hand_model("mmdeploy", "MMCVMultiLevelRoiAlign", 4, output_height=2, output_width=2, pool_mode=2,
                       featmap_strides=STRIDES), r, fs)
    with pytest.raises(Exception, match=r"MultiLevelRoIAlign: featmap_strides: expected 1 to 8 floats"):
        run(hand_model("dcnkit", "MultiLevelRoIAlign", 4, output_size=[2, 2]), r, fs)
    with pytest.raises(Exception, match=r"MMCVMultiLevelRoiAlign: featmap_strides\[2\]: expected a finite stride "
                                         r"> 0, got 0"):
        run(hand_model("mmdeploy", "MMCVMultiLevelRoiAlign", 4, output_height=2, output_width=2,
                       featmap_strides=[4.0, 8.0, 0.0, 32.0]), r, fs)
    with pytest.raises(Exception, match=r"featmap_strides: expected one stride per feature map \(4 values\), "
                                         r"got 3 values"):
        run(hand_model("dcnkit", "MultiLevelRoIAlign", 4, output_size=[2, 2], featmap_strides=STRIDES[:3]), r, fs)
    bad = list(fs)
    bad[3] = bad[3][:, :5].contiguous()
    with pytest.raises(Exception, match=r"features\[3\]: expected 8 channels \(those of features\[0\]\), got 5"):
        run(hand_model("dcnkit", "MultiLevelRoIAlign", 4, output_size=[2, 2], featmap_strides=STRIDES), r, bad)
    with pytest.raises(Exception, match=r"rois\[0, 0\] \(batch index\): expected a value in \[0, 2\)"):
        r2 = r.clone()
        r2[0, 0] = 7
        run(hand_model("dcnkit", "MultiLevelRoIAlign", 4, output_size=[2, 2], featmap_strides=STRIDES), r2, fs)


# ------------------------------------------------------------------------------------------------
# CUDA execution provider (skipped without onnxruntime-gpu and a GPU)


@pytest.mark.cuda
@pytest.mark.parametrize("op", ["dcnkit", "mmdeploy"])
def test_cuda_ep_equals_op(op):
    ort_cuda_or_skip()
    if op == "dcnkit":
        model = hand_model("dcnkit", "MultiLevelRoIAlign", 4, output_size=[7, 7], featmap_strides=STRIDES,
                           sampling_ratio=2)
    else:
        model = hand_model("mmdeploy", "MMCVMultiLevelRoiAlign", 4, output_height=7, output_width=7, pool_mode=1,
                           sampling_ratio=2, aligned=1, featmap_strides=STRIDES)
    r, fs = rois(50), features()
    r[3, 0] = 9  # a batch index outside [0, N): zeros on CUDA, never a read out of bounds
    sess = ort_session(model.SerializeToString(), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    got = sess.run(None, {"rois": r.numpy(), **{f"feat_{i}": f.numpy() for i, f in enumerate(fs)}})[0]
    good = torch.ones(50, dtype=torch.bool)
    good[3] = False
    expected = multi_level_roi_align(fs, r[good], 7, STRIDES, 2)
    np.testing.assert_allclose(got[good.numpy()], expected.numpy(), rtol=1e-4, atol=1e-5)
    assert not got[3].any()
