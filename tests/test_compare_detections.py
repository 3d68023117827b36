"""``dcnkit compare --detections``: detections paired by label and IoU (dcnkit/runtime/detections.py), so that
rows of equal score in another order, or other members of a tie at a top-k cut-off, are not failures, while a
missing detection or a moved box is."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from dcnkit.runtime.detections import as_detections, match_detections

BOXES = np.array([[0, 0, 10, 10], [20, 20, 30, 30], [5, 5, 15, 15], [40, 40, 50, 60]], dtype=np.float32)
SCORES = np.array([0.9, 0.5, 0.5, 0.2], dtype=np.float32)
LABELS = np.array([1, 2, 2, 3])


def _dets(boxes=BOXES, scores=SCORES, labels=LABELS):
    return as_detections(boxes, scores, labels)


def test_rows_of_equal_score_swapped_match():
    order = [0, 2, 1, 3]
    rep = match_detections(_dets(), _dets(BOXES[order], SCORES[order], LABELS[order]))
    assert rep.passed and rep.matched == 4 and rep.max_box_diff == 0
    # Elementwise, the same outputs are 15 px apart:
    assert np.abs(BOXES[order] - BOXES).max() == 15


def test_a_missing_detection_and_a_moved_box_fail():
    rep = match_detections(_dets(), _dets(BOXES[:3], SCORES[:3], LABELS[:3]))
    assert not rep.passed and [r[1] for r in rep.unmatched_ref] == [3]
    moved = BOXES.copy()
    moved[1] += 1.0  # IoU 0.68: still the same detection, 1 px off
    rep = match_detections(_dets(), _dets(moved), box_atol=0.5)
    assert not rep.passed and rep.box_failures == 1 and rep.max_box_diff == 1.0
    rep = match_detections(_dets(), _dets(scores=SCORES + np.float32(0.01)), score_atol=1e-3, score_rtol=0)
    assert not rep.passed and rep.score_failures == 4


def test_another_label_is_not_a_match():
    rep = match_detections(_dets(), _dets(labels=np.array([4, 2, 2, 3])))
    assert not rep.passed and len(rep.unmatched_ref) == 1 and len(rep.unmatched_got) == 1


def test_other_members_of_a_tie_at_the_cut_off_are_reported_not_failed():
    """A top-2 of four with the 2nd score shared by three: the two runs keep different members."""
    boxes = np.array([[0, 0, 10, 10], [20, 20, 30, 30], [50, 50, 60, 60]], dtype=np.float32)
    scores = np.array([0.9, 0.5, 0.5], dtype=np.float32)
    labels = np.array([1, 1, 1])
    ref = as_detections(boxes[[0, 1]], scores[[0, 1]], labels[[0, 1]])
    got = as_detections(boxes[[0, 2]], scores[[0, 2]], labels[[0, 2]])
    rep = match_detections(ref, got)
    assert rep.passed and rep.matched == 1 and len(rep.tied_ref) == len(rep.tied_got) == 1
    assert any("cut-off score" in line for line in rep.lines())


def test_detr_outputs_class_scores_and_centre_boxes():
    logits = np.array([[[0.1, 2.0], [3.0, 0.0]]], dtype=np.float32)  # (N, Q, C): labels 1, 0
    boxes = np.array([[[0.5, 0.5, 0.2, 0.4], [0.1, 0.1, 0.2, 0.2]]], dtype=np.float32)
    (b, s, lab), = as_detections(boxes, logits, box_format="cxcywh")
    np.testing.assert_allclose(b, [[0.4, 0.3, 0.6, 0.7], [0.0, 0.0, 0.2, 0.2]], atol=1e-7)
    assert lab.tolist() == [1, 0] and s.tolist() == pytest.approx([2.0, 3.0])
    with pytest.raises(ValueError, match="boxes: expected \\(K, 4\\) or \\(N, K, 4\\), got shape \\(2, 3\\)"):
        as_detections(np.zeros((2, 3)), np.zeros(2), np.zeros(2))


def test_cli_detection_mode(tmp_path):
    """A detector-shaped model (identity outputs) on two backends: PASSED, with the matched count printed; a bad
    --detections names the argument."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["b"], ["boxes"]), helper.make_node("Identity", ["s"], ["scores"]),
         helper.make_node("Identity", ["l"], ["labels"])], "det",
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [4, 4]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("l", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [4, 4]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("labels", TensorProto.INT64, [4])])
    model = tmp_path / "det.onnx"
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    proto.ir_version = 9
    onnx.save(proto, str(model))
    feeds = tmp_path / "in.npz"
    np.savez(feeds, b=BOXES, s=SCORES, l=LABELS)
    cmd = [sys.executable, "-m", "dcnkit", "compare", str(model), "--backends", "ort-cpu,reference", "--inputs",
           str(feeds)]
    r = subprocess.run(cmd + ["--detections", "boxes,scores,labels"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "matched 4 detection(s)" in r.stdout and "PASSED" in r.stdout
    r = subprocess.run(cmd + ["--detections", "boxes,nope"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--detections: expected output names among" in r.stderr
