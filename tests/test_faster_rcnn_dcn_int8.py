"""The deformable Faster R-CNN example in INT8 (examples/faster_rcnn_dcn_int8.py): heads fitted on synthetic scenes,
``dcnkit quantize`` end to end with the box arithmetic left float, and the int8 detections matched to float32's by
label and IoU (the stated tolerances) on scenes not used for calibration."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import faster_rcnn_dcn_int8 as q8  # noqa: E402

SIZE = 128  # small: the whole module (fit, export, quantize, six detector runs) stays short


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = tmp_path_factory.mktemp("frcnn_int8")
    model = q8.detector(SIZE)
    path = q8.ex.export(model, q8.make_scene(SIZE, q8.COMPARE_SEEDS[0])[0], out / "frcnn.onnx")
    return model, path, q8.quantize_detector(path, SIZE, out)


def test_scenes_know_their_objects():
    image, boxes, labels = q8.make_scene(SIZE, 7)
    assert image.shape == (1, 3, SIZE, SIZE) and 2 <= len(boxes) <= 4 and set(labels) <= {1, 2}
    for (x0, y0, x1, y1), label in zip(boxes.astype(int), labels):
        assert 0 <= x0 < x1 <= SIZE and 0 <= y0 < y1 <= SIZE
        inside = image[0, :, y0:y1, x0:x1].reshape(3, -1)
        # The object is one color (+ noise): most of its box holds it (a rectangle all of it, a disc pi/4).
        share = (np.abs(inside - np.median(inside, axis=1, keepdims=True)).max(axis=0) < 0.1).mean()
        assert share > (0.9 if label == 1 else 0.7), (label, share)


def test_quantized_model_keeps_the_pooler_and_the_box_arithmetic_float(models):
    import onnx

    _, path, qpath = models
    m = onnx.load(str(qpath), load_external_data=False)
    q_inputs = {n.input[0] for n in m.graph.node if n.op_type == "QuantizeLinear"}
    assert len(q_inputs) > 90  # backbone, FPN, heads (the BatchNorms after the DCNs are folded into them first)
    producers = {o: n for n in m.graph.node for o in n.output}
    quantized = {producers[t].name for t in q_inputs if t in producers}
    assert any(n.startswith("/backbone/body/layer4") for n in quantized)
    assert any(n.startswith("/roi_heads/box_head/") for n in quantized)
    # The box arithmetic is float: the pooler's RoIs and the detected boxes come from no DequantizeLinear.
    pooler = next(n for n in m.graph.node if n.op_type == "MultiLevelRoIAlign")
    assert producers[pooler.input[0]].op_type != "DequantizeLinear"
    assert producers["boxes"].op_type != "DequantizeLinear"
    kit = [n.op_type for n in m.graph.node
           if n.op_type in ("DeformConv", "DeformConv2d", "QDeformConv2d", "MultiLevelRoIAlign")]
    assert len(kit) == 10  # 9 deformable convolutions and the pooler (float between Q/DQ)
    # Where oneDNN is at hand, `dcnkit quantize` writes each deformable convolution as one QDeformConv2d.
    from dcnkit.runtime.quantize_qdeform import qdeform_available

    assert kit.count("QDeformConv2d") == (9 if qdeform_available() else 0)


def test_int8_detections_against_float32(models, capsys):
    """On scenes not used for calibration: the FPN maps agree (cosine), int8 finds the objects float32 finds but
    at most one per three scenes, and every confident int8 detection but at most one per three scenes has a
    float32 partner (same label, IoU >= 0.5) within the score tolerance (0.5: a confident detection may pair with a
    weaker duplicate of the other model). The measured figures are in docs/quantization.md."""
    _, path, qpath = models
    report = q8.compare_models(path, qpath, q8.COMPARE_SEEDS, SIZE)
    with capsys.disabled():
        print("\n".join(map(str, report)))
    assert sum(r["found_fp32"] for r in report) >= sum(r["objects"] for r in report) - 1  # the fitted detector works
    assert sum(r["found_int8"] for r in report) >= sum(r["found_fp32"] for r in report) - 1
    conf = [r["int8_in_fp32"] for r in report]
    assert sum(c["matched"] for c in conf) >= sum(c["detections"] for c in conf) - 1, report
    for r, c in zip(report, conf):
        assert min(r["fpn_cosine"]) >= 0.98, r
        if c["matched"]:
            assert c["min_iou"] >= 0.5 and c["max_score_diff"] <= q8.SCORE_TOLERANCE, r


def test_match_fails_on_moved_or_relabeled_detections(models):
    model, path, _ = models
    want = q8.ex.ort_detections(path, q8.make_scene(SIZE, q8.COMPARE_SEEDS[0])[0])
    assert q8.match(want, want)["matched"] == len(want["scores"]) > 0
    moved = dict(want, boxes=want["boxes"] + np.float32(SIZE / 2))
    assert q8.match(want, moved)["matched"] < len(want["scores"])
    relabeled = dict(want, labels=3 - want["labels"])
    assert q8.match(want, relabeled)["matched"] < len(want["scores"])


def test_blank_image_gives_empty_outputs_on_every_backend(models):
    """Issue 35: the fitted detector sees nothing on a blank image (its proposals all score under 0.5): empty outputs
    in eager PyTorch, for the float32 and the int8 file in ONNX Runtime, and for the int8 file in the reference runner
    (the float32 detector's reference run is test_faster_rcnn_dcn's)."""
    model, path, qpath = models
    blank = q8.ex.blank_image(SIZE)
    runs = [("eager", q8.ex.eager_detections(model, blank)), ("ort-cpu float32", q8.ex.ort_detections(path, blank)),
            ("ort-cpu int8", q8.ex.ort_detections(qpath, blank)),
            ("reference int8", q8.ex.reference_detections(qpath, blank))]
    for backend, got in runs:
        assert {k: (got[k].shape, got[k].dtype) for k in q8.ex.OUTPUTS} == {
            "boxes": ((0, 4), np.float32), "labels": ((0,), np.int64), "scores": ((0,), np.float32)}, backend
