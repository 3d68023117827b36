"""The deformable Faster R-CNN example end to end: DCNv2 in layer3-4, dcnkit's fused pooler, the whole detector
exported (legacy exporter, named outputs) with one MultiLevelRoIAlign node and no ScatterElements, and its
detections in ONNX Runtime (in process, ``dcnkit run`` and ``dcnkit serve``) equal to eager PyTorch's."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import faster_rcnn_dcn as ex  # noqa: E402
from detector_checks import assert_empty_on_every_backend, unread_initializers  # noqa: E402

SIZE = 256  # the example's default; 1x3x256x256 keeps the test short
# Above the objectness of a blank image's anchors (0.5: ex.blank_image) and below that of the example image's 100
# proposals (>= 0.87): the example image's detections are those of torchvision's default, a blank image gets no
# proposal.
RPN_SCORE_THRESH = 0.6


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = ex.build(SIZE, seed=0, rpn_score_thresh=RPN_SCORE_THRESH)
    image = ex.make_image(SIZE, seed=ex.IMAGE_SEED)
    want = ex.eager_detections(model, image)
    path = ex.export(model, image, tmp_path_factory.mktemp("frcnn") / "frcnn.onnx")
    return model, image, want, path


def test_model_is_deformable_and_fused(exported):
    import dcnkit.nn

    model = exported[0]
    dcn = [n for n, m in model.named_modules() if isinstance(m, dcnkit.nn.ModulatedDeformConv2dPack)]
    assert len(dcn) == 9 and all(n.startswith(("backbone.body.layer3.", "backbone.body.layer4.")) for n in dcn)
    assert isinstance(model.roi_heads.box_roi_pool, dcnkit.nn.MultiScaleRoIAlign)
    # The offsets are not zero: the deformable sampling is exercised.
    assert model.backbone.body.layer3[0].conv2.conv_offset.weight.abs().sum() > 0


def test_exported_graph_has_one_fused_pooler_and_named_outputs(exported):
    import onnx

    *_, path = exported
    s = ex.graph_summary(path)
    assert s["outputs"] == ["boxes", "labels", "scores"]
    assert s["counts"].get("dcnkit::MultiLevelRoIAlign", 0) == 1  # the box head's one pooler
    assert s["counts"].get("ai.onnx::ScatterElements", 0) == 0
    assert s["counts"].get("ai.onnx::RoiAlign", 0) == 0
    n_dcn = s["counts"].get("ai.onnx::DeformConv", 0) + s["counts"].get("dcnkit::DeformConv2d", 0)
    assert n_dcn == 9
    m = onnx.load(str(path), load_external_data=False)
    for out in m.graph.output:
        assert out.type.tensor_type.shape.dim[0].dim_param == "num_detections"
    node = next(n for n in m.graph.node if n.op_type == "MultiLevelRoIAlign")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert list(attrs["featmap_strides"]) == [4.0, 8.0, 16.0, 32.0]
    assert attrs["finest_scale"] == 56 and attrs["aligned"] == 0 and list(attrs["output_size"]) == [7, 7]
    assert len(node.input) == 5  # rois, feat_0..feat_3


def test_ort_detections_equal_eager(exported):
    from dcnkit.runtime import ort_session

    model, image, want, path = exported
    assert len(want["scores"]) >= 20  # a meaningful comparison: many detections of several labels
    assert len(np.unique(want["labels"])) >= 2
    sess = ort_session(str(path), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"images": image})))
    diff = ex.check_detections(got, want, box_atol=0.05, score_atol=5e-4)
    assert diff["detections"] == len(want["scores"])
    # A different image gives different detections (the comparison is not vacuous), equal again.
    other = ex.make_image(SIZE, seed=6)  # another image without borderline detections
    want2 = ex.eager_detections(model, other)
    got2 = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"images": other})))
    ex.check_detections(got2, want2, box_atol=0.05, score_atol=5e-4)
    assert len(want2["scores"]) != len(want["scores"]) or not np.allclose(want2["boxes"], want["boxes"])


def test_check_detections_fails_on_a_difference(exported):
    want = exported[2]
    moved = dict(want, boxes=want["boxes"] + np.float32(0.1))
    with pytest.raises(AssertionError, match="boxes differ by"):
        ex.check_detections(moved, want, 0.05, 1e-4)
    with pytest.raises(AssertionError, match="detections: ORT found"):
        ex.check_detections({k: v[1:] for k, v in want.items()}, want, 0.05, 1e-4)
    relabeled = dict(want, labels=np.where(want["labels"] == want["labels"][0], 99, want["labels"]))
    with pytest.raises(AssertionError, match="has no partner"):
        ex.check_detections(relabeled, want, 0.05, 1e-4)
    # Two detections swapped (scores a hair apart in another backend) still match.
    swapped = {k: v[[1, 0] + list(range(2, len(v)))] for k, v in want.items()}
    assert ex.check_detections(swapped, want, 0.0, 0.0)["reordered"] == 2


def test_fused_detector_equals_torchvision_pooler_detector(exported):
    """Swapping the pooler changes nothing in eager PyTorch: same detections."""
    model, image, want, _ = exported
    tv = ex.build(SIZE, fused=False)
    assert type(tv.roi_heads.box_roi_pool).__module__.startswith("torchvision")
    ex.check_detections(ex.eager_detections(tv, image), want, box_atol=1e-3, score_atol=1e-5)


def test_dcnkit_run_compare_and_serve(exported, tmp_path, capsys):
    """``dcnkit run``, ``dcnkit compare`` (ORT vs the NumPy reference backend, per-output tolerances) and
    ``dcnkit serve`` (a subprocess, queried over HTTP): detections equal to eager."""
    _, image, want, path = exported
    report = ex.cli_checks(path, image, want, tmp_path, compare_reference=True)
    out = capsys.readouterr().out
    assert "boxes: atol=0.05, rtol=0.0001; scores: atol=0.0001, rtol=0.001" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:2] in (
        ["boxes", "reference"], ["scores", "reference"], ["labels", "reference"])}
    assert float(rows["boxes"][3]) < 0.05 and float(rows["scores"][3]) < 1e-3 and float(rows["labels"][3]) == 0
    assert report["compare"] == "PASSED"
    for key in ("cli_run", "serve"):
        assert report[key]["detections"] == len(want["scores"])
        assert report[key]["max_box_diff"] <= 0.05 and report[key]["max_score_diff"] <= 5e-4
    with np.load(tmp_path / "detections.npz") as d:
        assert sorted(d.files) == ["boxes", "labels", "scores"]


def test_served_on_tritonserver(exported, tmp_path):
    """The detector in a Python-backend repository on a real tritonserver (127.0.0.1, free ports): HTTP and gRPC
    detections equal to the kit's ORT runner here and to eager PyTorch."""
    pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is not installed")
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from dcnkit.runtime import triton
    from dcnkit.runtime.base import BackendUnavailable
    from dcnkit.runtime.registry import make_runner
    from dcnkit.runtime.triton_server import TritonServer

    _, image, want, path = exported
    model_dir = triton.write_repository(path, tmp_path / "repo", name="frcnn", backend="python")
    assert triton.parse_config((model_dir / "config.pbtxt").read_text()).max_batch_size == 0  # no shared batch dim
    try:
        server = TritonServer(tmp_path / "repo", log_file=tmp_path / "server.log")
    except BackendUnavailable as e:
        pytest.skip(f"tritonserver cannot run here: {e}")
    with make_runner(path, "ort-cpu") as runner:
        direct = runner.run({"images": image})
    with server:
        server.wait_ready(timeout=180, model="frcnn")
        outputs = ("boxes", "labels", "scores")
        with httpclient.InferenceServerClient(server.http_url) as c:
            i = httpclient.InferInput("images", list(image.shape), "FP32")
            i.set_data_from_numpy(image)
            r = c.infer("frcnn", [i])
            by_http = {k: r.as_numpy(k) for k in outputs}
        g = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            i = grpcclient.InferInput("images", list(image.shape), "FP32")
            i.set_data_from_numpy(image)
            r = g.infer("frcnn", [i])
            by_grpc = {k: r.as_numpy(k) for k in outputs}
        finally:
            g.close()
    assert not server.group_alive()
    for got in (by_http, by_grpc):
        for k in outputs:
            np.testing.assert_allclose(got[k], direct[k], rtol=1e-5, atol=1e-4)
        assert ex.check_detections(got, want, box_atol=0.05, score_atol=5e-4)["detections"] == len(want["scores"])


def test_blank_image_gives_empty_outputs_on_every_backend(exported):
    """Issue 35: the file exported on an image with detections, fed an image that yields no proposal (so no
    detection), returns empty outputs in eager PyTorch, ONNX Runtime and the reference runner (ONNX Runtime failed on
    the box decoding's reshape of zero rows before the exporter made such reshapes explicit)."""
    model, _, want, path = exported
    assert len(want["scores"]) > 0
    blank = ex.blank_image(SIZE)
    with torch.no_grad():
        images, _ = model.transform(torch.from_numpy(blank))
        proposals, _ = model.rpn(images, model.backbone(images.tensors))
    assert [len(p) for p in proposals] == [0]
    assert_empty_on_every_backend(ex, model, path, blank)


def test_exported_file_has_no_unread_initializer(exported):
    """Every initializer of the exported file is read by a node (the exporter's own rewrites make none that is not:
    ONNX Runtime warns about each such one at every session start)."""
    assert unread_initializers(exported[3]) == []
