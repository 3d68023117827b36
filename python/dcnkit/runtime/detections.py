"""Comparing two detectors' outputs as detections, not element by element.

Two runs of one detector can list the same detections in another order: rows of equal score swap (a sort is not
stable across runtimes), and a top-k whose cut-off falls inside a group of equal scores keeps different members of
the group (RT-DETR under random weights: 535 scores equal to the 300th). An elementwise comparison then fails
although every detection is there. :func:`match_detections` pairs the detections of one image by label and IoU
and compares the pairs' scores and boxes.

Formats: boxes ``(K, 4)`` or ``(N, K, 4)``, as ``xyxy`` (torchvision) or ``cxcywh`` (DETR's normalised
``pred_boxes``); scores ``(K,)`` / ``(N, K)`` with labels ``(K,)`` / ``(N, K)``, or class scores / logits
``(K, C)`` / ``(N, K, C)``, whose arg-max over the classes is the label and max the score (logits are compared as
given; a monotonic sigmoid or softmax does not change the label).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["DetectionReport", "match_detections", "as_detections"]


@dataclass
class DetectionReport:
    """The result of :func:`match_detections` over all images."""

    matched: int = 0
    # (image, index, label, score) of detections without a partner, per side
    unmatched_ref: list = field(default_factory=list)
    unmatched_got: list = field(default_factory=list)
    # unmatched detections whose score ties the lowest score kept (a top-k cut-off inside equal scores): reported,
    # not failures
    tied_ref: list = field(default_factory=list)
    tied_got: list = field(default_factory=list)
    max_score_diff: float = 0.0
    max_box_diff: float = 0.0
    score_failures: int = 0
    box_failures: int = 0

    @property
    def passed(self) -> bool:
        return not (self.unmatched_ref or self.unmatched_got or self.score_failures or self.box_failures)

    def lines(self) -> list[str]:
        out = [f"matched {self.matched} detection(s); max |score diff| {self.max_score_diff:.3g}, max |box diff| "
               f"{self.max_box_diff:.3g} ({self.score_failures} score(s) and {self.box_failures} box(es) beyond "
               "tolerance)"]
        for side, rows, tied in (("reference", self.unmatched_ref, self.tied_ref),
                                 ("compared", self.unmatched_got, self.tied_got)):
            if rows:
                shown = ", ".join(f"image {i} #{k} label {lab} score {s:.4g}" for i, k, lab, s in rows[:5])
                out.append(f"unmatched in the {side} run: {len(rows)} ({shown}{', ...' if len(rows) > 5 else ''})")
            if tied:
                out.append(f"unmatched in the {side} run at the cut-off score (ties of a top-k, not failures): "
                           f"{len(tied)}")
        return out


def _per_image(a: np.ndarray, rank: int) -> np.ndarray:
    return a[None] if a.ndim == rank else a


def as_detections(boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray | None = None,
                  box_format: str = "xyxy") -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``[(boxes xyxy (K, 4), scores (K,), labels (K,)), ...]``, one per image, from a detector's outputs."""
    boxes = np.asarray(boxes, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    if box_format not in ("xyxy", "cxcywh"):
        raise ValueError(f"as_detections: box_format: expected 'xyxy' or 'cxcywh', got {box_format!r}")
    if boxes.ndim not in (2, 3) or boxes.shape[-1] != 4:
        raise ValueError(f"as_detections: boxes: expected (K, 4) or (N, K, 4), got shape {boxes.shape}")
    boxes = _per_image(boxes, 2)
    if labels is None:
        if scores.ndim != boxes.ndim:
            raise ValueError(f"as_detections: scores: expected class scores {boxes.shape[:-1] + ('C',)} when no "
                             f"labels are given, got shape {scores.shape}")
        scores = _per_image(scores, 2)
        labels_a, scores_a = scores.argmax(-1), scores.max(-1)
    else:
        labels_a = _per_image(np.asarray(labels), 1)
        scores_a = _per_image(scores, 1)
    if scores_a.shape != boxes.shape[:-1] or labels_a.shape != boxes.shape[:-1]:
        raise ValueError(f"as_detections: scores / labels: expected shape {boxes.shape[:-1]} (one per box), got "
                         f"{scores_a.shape} / {labels_a.shape}")
    if box_format == "cxcywh":
        c, wh = boxes[..., :2], boxes[..., 2:]
        boxes = np.concatenate([c - wh / 2, c + wh / 2], -1)
    return [(boxes[i], scores_a[i], labels_a[i]) for i in range(boxes.shape[0])]


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix (len(a), len(b)) of xyxy boxes."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(-1)
    area = lambda x: np.clip(x[:, 2:] - x[:, :2], 0, None).prod(-1)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(union > 0, inter / np.where(union > 0, union, 1), (np.abs(a[:, None] - b[None]).max(-1) == 0))
    return iou


def match_detections(ref: list, got: list, iou: float = 0.5, score_atol: float = 1e-4, score_rtol: float = 1e-4,
                     box_atol: float = 1e-4, box_rtol: float = 1e-4, score_threshold: float | None = None,
                     tie_tol: float = 1e-6) -> DetectionReport:
    """Pairs the detections of ``ref`` and ``got`` (lists from :func:`as_detections`, one entry per image).

    Per image and label, reference detections in decreasing score take the unmatched detection of the same label
    with the highest IoU (>= ``iou``; among equal IoUs the closest score). A pair fails when its scores or boxes
    differ by more than ``atol + rtol * |reference|``. Detections below ``score_threshold`` (when given) are left
    out on both sides. When both runs' lowest scores agree within ``tie_tol``, an unmatched detection at that score
    is a member of a tie at a top-k cut-off and reported apart, not as a failure.
    """
    if len(ref) != len(got):
        raise ValueError(f"match_detections: expected the same number of images, got {len(ref)} and {len(got)}")
    rep = DetectionReport()
    for image, ((rb, rs, rl), (gb, gs, gl)) in enumerate(zip(ref, got)):
        keep_r = np.arange(len(rs)) if score_threshold is None else np.flatnonzero(rs >= score_threshold)
        keep_g = np.arange(len(gs)) if score_threshold is None else np.flatnonzero(gs >= score_threshold)
        low_r = rs[keep_r].min() if len(keep_r) else np.inf
        low_g = gs[keep_g].min() if len(keep_g) else np.inf
        cut_tied = abs(low_r - low_g) <= tie_tol  # both runs cut at the same score: members of one tie
        used = np.zeros(len(gs), bool)
        used[np.setdiff1d(np.arange(len(gs)), keep_g)] = True
        ious = _iou(rb[keep_r], gb) if len(keep_r) and len(gs) else np.zeros((len(keep_r), len(gs)))
        order = sorted(range(len(keep_r)), key=lambda j: -rs[keep_r[j]])
        for j in order:
            k = keep_r[j]
            cand = np.flatnonzero((~used) & (gl == rl[k]) & (ious[j] >= iou))
            if not len(cand):
                (rep.tied_ref if abs(rs[k] - low_r) <= tie_tol and cut_tied else rep.unmatched_ref).append(
                    (image, int(k), int(rl[k]), float(rs[k])))
                continue
            best = max(cand, key=lambda c: (ious[j, c], -abs(gs[c] - rs[k])))
            used[best] = True
            rep.matched += 1
            ds, db = abs(gs[best] - rs[k]), np.abs(gb[best] - rb[k])
            rep.max_score_diff = max(rep.max_score_diff, float(ds))
            rep.max_box_diff = max(rep.max_box_diff, float(db.max()))
            rep.score_failures += int(ds > score_atol + score_rtol * abs(rs[k]))
            rep.box_failures += int(np.any(db > box_atol + box_rtol * np.abs(rb[k])))
        for c in np.flatnonzero(~used):
            (rep.tied_got if abs(gs[c] - low_g) <= tie_tol and cut_tied else rep.unmatched_got).append(
                (image, int(c), int(gl[c]), float(gs[c])))
    return rep
