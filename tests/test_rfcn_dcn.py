"""The deformable R-FCN example end to end: the authors' head (two DeformPSRoIPool passes per branch) against a
float64 reference built from F.conv2d and the NumPy reference pooling, gradients through both passes (float64
gradcheck, and SGD steps on synthetic data reaching every head parameter), the whole detector exported with one
dcnkit::DeformPSRoIPool node per pass and branch, its detections in ONNX Runtime (in process, ``dcnkit run``,
``dcnkit serve``) equal to eager PyTorch's, ``dcnkit compare`` against the reference runner, and the head alone
with a dynamic image batch and RoI count."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("onnxruntime")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import rfcn_dcn as ex  # noqa: E402
from detector_checks import assert_empty_on_every_backend, unread_initializers  # noqa: E402

SIZE, TOP_N = 128, 50  # 8x8 maps at stride 16, 50 proposals: a short test
CLASSES = 4  # with the background
RPN_SCORE_THRESH = 0.6  # above every objectness of a blank image (0.5: ex.blank_image): it gets no proposal


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = ex.build(SIZE, rpn_top_n=TOP_N, rpn_score_thresh=RPN_SCORE_THRESH)
    image = ex.make_image(SIZE, seed=ex.IMAGE_SEED)
    want = ex.eager_detections(model, image)
    path = ex.export(model, image, tmp_path_factory.mktemp("rfcn") / "rfcn.onnx")
    return model, image, want, path


def test_model_is_the_deformable_rfcn(exported):
    import dcnkit.nn

    model = exported[0]
    dcn = {n: m for n, m in model.named_modules() if isinstance(m, dcnkit.nn.ModulatedDeformConv2dPack)}
    assert sorted(dcn) == [f"backbone.layer4.{i}.conv2" for i in range(3)]
    # Dilated instead of strided (torchvision's replace_stride_with_dilation: the first block keeps dilation 1).
    assert [(m.stride, m.dilation) for m in dcn.values()] == [((1, 1), (1, 1))] + [((1, 1), (2, 2))] * 2
    assert all(m.conv_offset.weight.abs().sum() > 0 for m in dcn.values())  # the deformable sampling is exercised
    head = model.roi_heads.rfcn
    k2 = ex.K * ex.K
    assert [head.get_submodule(n).out_channels for n in (
        "conv_new_1", "rfcn_cls", "rfcn_bbox", "rfcn_cls_offset_t", "rfcn_bbox_offset_t")] == [
        1024, k2 * CLASSES, k2 * 8, k2 * 2 * CLASSES, k2 * 2]
    pools = [head.rfcn_cls_offset, head.rfcn_bbox_offset, head.psroipooled_cls_rois, head.psroipooled_loc_rois]
    assert [(p.output_dim, p.no_trans, p.trans_std) for p in pools] == [
        (2 * CLASSES, True, 0.0), (2, True, 0.0), (CLASSES, False, 0.1), (8, False, 0.1)]
    for p in pools:
        assert (p.output_size, p.group_size, p.part_size, p.sample_per_part, p.spatial_scale) == (7, 7, 7, 4, 1 / 16)
    with torch.no_grad():
        feats = model.backbone(torch.zeros(1, 3, SIZE, SIZE))
    assert feats["c4"].shape[-2:] == feats["c5"].shape[-2:] == (SIZE // 16, SIZE // 16)


def _reference_head(head, features: np.ndarray, rois: np.ndarray):
    """The head in float64: convolutions by F.conv2d, pooling by dcnkit.reference (NumPy loops), votes by mean."""
    from dcnkit import reference as ref

    def conv(name, x):
        m = head.get_submodule(name)
        return F.conv2d(x, m.weight.detach().double(), m.bias.detach().double())

    x = torch.relu(conv("conv_new_1", torch.from_numpy(features).double()))
    out = []
    for maps, offset_maps, dim, offset_dim in (("rfcn_cls", "rfcn_cls_offset_t", CLASSES, 2 * CLASSES),
                                               ("rfcn_bbox", "rfcn_bbox_offset_t", 8, 2)):
        trans, _ = ref.deform_psroi_pool(conv(offset_maps, x).numpy(), rois, None, 1 / 16, 7, offset_dim, 7, 7, 4, 0.0)
        pooled, _ = ref.deform_psroi_pool(conv(maps, x).numpy(), rois, trans, 1 / 16, 7, dim, 7, 7, 4, 0.1)
        out.append(pooled.mean(axis=(2, 3)))
    return out


def test_head_equals_a_float64_reference(exported):
    model, image = exported[:2]
    features, rois = ex.head_inputs(model, image)
    rois = rois[:: max(1, len(rois) // 4)][:4]  # four of the proposals: the reference is slow
    with torch.no_grad():
        got = [t.numpy() for t in model.roi_heads.rfcn(features, rois)]
    want = _reference_head(model.roi_heads.rfcn, features.numpy(), rois.numpy().astype(np.float64))
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=1e-4 * max(1.0, np.abs(w).max()), rtol=1e-4)
    # The offsets matter: with them zeroed the votes differ.
    head = model.roi_heads.rfcn
    with torch.no_grad():
        plain = head.psroipooled_cls_rois(head.rfcn_cls(torch.relu(head.conv_new_1(features))), rois,
                                          torch.zeros(len(rois), 2 * CLASSES, 7, 7)).mean((2, 3))
    assert np.abs(plain.numpy() - got[0]).max() > 1e-3


def test_head_gradients_through_both_passes_float64():
    """float64 gradcheck of a small head's outputs with respect to the features and both offset convolutions'
    weights: the gradient flows through the second pass into the first pass's output and on to the offset maps."""
    torch.manual_seed(0)
    head = ex.RFCNHead(in_channels=4, num_classes=2, mid_channels=4).double()
    with torch.no_grad():
        for conv in (head.rfcn_cls_offset_t, head.rfcn_bbox_offset_t, head.rfcn_cls, head.rfcn_bbox):
            conv.weight.normal_(std=0.5)
    x = torch.randn(2, 4, 6, 6, dtype=torch.float64, requires_grad=True)
    rois = torch.tensor([[0, 10.2, 12.7, 70.1, 60.3], [1, 3.1, 2.2, 90.4, 88.0], [1, 40.6, 20.3, 60.2, 95.1]],
                        dtype=torch.float64)
    names = ["rfcn_cls_offset_t.weight", "rfcn_bbox_offset_t.weight", "conv_new_1.weight"]
    weights = [head.get_submodule(n.rsplit(".", 1)[0]).weight.detach().clone().requires_grad_() for n in names]

    def f(x, *ws):
        return torch.func.functional_call(head, dict(zip(names, ws)), (x, rois))

    assert torch.autograd.gradcheck(f, (x, *weights), eps=1e-6, atol=1e-5, fast_mode=True)
    cls, box = f(x, *weights)
    grads = torch.autograd.grad(cls.sum() + box.sum(), weights[:2])
    assert all(g.abs().max() > 0 for g in grads)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"RFCNHead: num_classes: expected an int >= 2 .*got 1"):
        ex.RFCNHead(8, num_classes=1, mid_channels=4)
    with pytest.raises(ValueError, match=r"RFCNHead: k: expected an int >= 1, got 0"):
        ex.RFCNHead(8, num_classes=3, k=0, mid_channels=4)
    with pytest.raises(ValueError, match=r"build: image_size: expected an int >= 32 .*got 16"):
        ex.build(16)
    head = ex.RFCNHead(8, num_classes=3, mid_channels=4)
    with pytest.raises(ValueError, match="rois"):  # the operator names its argument
        head(torch.zeros(1, 8, 4, 4), torch.zeros(2, 4))


def test_training_steps_lower_the_loss_and_reach_every_head_parameter():
    import dcnkit.nn

    model = ex.build(SIZE, rpn_top_n=TOP_N)
    images, targets = ex.make_training_batch(SIZE, n=1, num_classes=CLASSES)  # one image: a short test
    assert images.shape == (1, 3, SIZE, SIZE) and len(targets[0]["boxes"]) == 3
    assert ((targets[0]["labels"] >= 1) & (targets[0]["labels"] < CLASSES)).all()
    losses, grads = ex.train(model, images, targets, steps=2)
    assert losses[1] < losses[0], losses
    head = dict(model.roi_heads.rfcn.named_parameters())
    assert len(head) == 10  # five convolutions, weight and bias
    for name in head:
        g = grads[f"roi_heads.rfcn.{name}"]
        assert g.abs().max() > 0, name
    for n, m in model.named_modules():  # the DCN layers' offset convolutions learn too
        if isinstance(m, dcnkit.nn.ModulatedDeformConv2dPack):
            assert grads[f"{n}.conv_offset.weight"].abs().max() > 0, n
    assert not model.training


def test_exported_graph_has_one_psroi_node_per_pass(exported):
    import onnx

    *_, path = exported
    s = ex.graph_summary(path)
    assert s["outputs"] == ["boxes", "labels", "scores"]
    assert ex.psroi_nodes(path) == [(2 * CLASSES, False), (2, False), (CLASSES, True), (8, True)]
    assert s["counts"].get("ai.onnx::DeformConv", 0) + s["counts"].get("dcnkit::DeformConv2d", 0) == 3
    m = onnx.load(str(path), load_external_data=False)
    assert {n.domain for n in m.graph.node} <= {"", "dcnkit"}  # no fallback (ATen, PythonOp)
    assert not [n.op_type for n in m.graph.node if n.op_type in ("ATen", "PythonOp")]
    for node in (n for n in m.graph.node if n.op_type == "DeformPSRoIPool"):
        a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
        assert (a["output_size"], a["group_size"], a["part_size"], a["sample_per_part"]) == (7, 7, 7, 4)
        assert a["spatial_scale"] == pytest.approx(1 / 16)
        assert a.get("no_trans", 0) == (len(node.input) < 3 or not node.input[2])
        assert a.get("trans_std", 0.0) == pytest.approx(0.0 if a.get("no_trans", 0) else 0.1)


def test_ort_detections_equal_eager(exported):
    from dcnkit.runtime import ort_session

    model, image, want, path = exported
    assert len(want["scores"]) >= 10 and len(np.unique(want["labels"])) >= 2  # a meaningful comparison
    sess = ort_session(str(path), providers=["CPUExecutionProvider"])
    got = ex.ort_detections(sess, image)
    assert ex.check_detections(got, want, box_atol=0.05, score_atol=5e-4)["detections"] == len(want["scores"])
    other = ex.make_image(SIZE, seed=ex.IMAGE_SEED + 1)
    want2 = ex.eager_detections(model, other)
    ex.check_detections(ex.ort_detections(sess, other), want2, box_atol=0.05, score_atol=5e-4)
    assert len(want2["scores"]) != len(want["scores"]) or not np.allclose(want2["boxes"], want["boxes"])


def test_head_exports_with_a_dynamic_image_batch(exported, tmp_path):
    import onnx

    from dcnkit.runtime import ort_session

    model, image = exported[:2]
    features, rois = ex.head_inputs(model, np.concatenate([image, ex.make_image(SIZE, seed=ex.IMAGE_SEED + 1)]))
    assert set(rois[:, 0].tolist()) == {0.0, 1.0}
    path = ex.export_head(model.roi_heads.rfcn, features[:1], rois[rois[:, 0] == 0][:5], tmp_path / "head.onnx")
    g = onnx.load(str(path)).graph
    assert [d.dim_param for d in g.input[0].type.tensor_type.shape.dim][:1] == ["batch"]
    assert [d.dim_param for d in g.input[1].type.tensor_type.shape.dim][:1] == ["num_rois"]
    assert len(ex.psroi_nodes(path)) == 4
    sess = ort_session(str(path), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        want = [t.numpy() for t in model.roi_heads.rfcn(features, rois)]
    got = sess.run(None, {"features": features.numpy(), "rois": rois.numpy()})
    for gg, w in zip(got, want):
        assert gg.shape == w.shape == (len(rois), w.shape[1])
        np.testing.assert_allclose(gg, w, atol=1e-4, rtol=1e-4)


def test_dcnkit_run_compare_and_serve(exported, tmp_path, capsys):
    _, image, want, path = exported
    report = ex.cli_checks(path, image, want, tmp_path, compare_reference=True, name="rfcn")
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:2] in (
        ["boxes", "reference"], ["scores", "reference"], ["labels", "reference"])}
    assert float(rows["boxes"][3]) < 0.05 and float(rows["scores"][3]) < 1e-3 and float(rows["labels"][3]) == 0
    assert report["compare"] == "PASSED"
    for key in ("cli_run", "serve"):
        assert report[key]["detections"] == len(want["scores"])


def test_blank_image_gives_empty_outputs_on_every_backend(exported):
    """Issue 35: the R-FCN file, exported on an image with detections, fed a blank image (no proposal, so no
    detection): empty outputs in eager PyTorch, ONNX Runtime (which failed at /roi_heads/Reshape, "Input
    shape:{0,16}, requested shape:{0,-1}", before the exporter made such reshapes explicit) and the reference runner."""
    model, _, want, path = exported
    assert len(want["scores"]) > 0
    blank = ex.blank_image(SIZE)
    assert_empty_on_every_backend(ex, model, path, blank)


def test_exported_file_has_no_unread_initializer(exported):
    """Every initializer of the exported file is read by a node (the exporter's own rewrites make none that is not:
    ONNX Runtime warns about each such one at every session start)."""
    assert unread_initializers(exported[3]) == []
