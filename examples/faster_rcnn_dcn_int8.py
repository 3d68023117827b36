"""The deformable Faster R-CNN example in INT8 on ONNX Runtime's CPU: ``dcnkit quantize``, end to end, detections
compared with float32.

    python examples/faster_rcnn_dcn_int8.py --out /tmp/frcnn_int8

builds the detector of ``faster_rcnn_dcn.py`` (DCNv2 in ResNet stages 4-5, the kit's fused pooler), exports it,
quantizes it as these commands do, and compares the two models' detections on scenes not used for calibration:

    dcnkit quantize frcnn.onnx -o frcnn.int8.onnx --calibration calib.npz --exclude-node NAME ...  # k 1x3xSxS images
    dcnkit run frcnn.int8.onnx --inputs image.npz -o detections.npz

**Why the heads are fitted.** The untrained example detector (random weights) is no test of int8: its objectness
and class scores sit a hair apart over thousands of anchors and proposals, so the perturbation int8 makes to its
features (FPN maps at a cosine similarity of about 0.99 to float32's) reorders them, and only 3 to 5 of its top-10
detections survive (measured). A trained detector separates objects from background by wide margins. This example
gets such margins deterministically and in seconds: on synthetic scenes whose objects are known (rectangles,
label 1; discs, label 2), the detector's last linear layers -- the RPN's objectness and box deltas, the box head's
class scores and box deltas -- are fitted by ridge regression to their training targets (torchvision's own
anchor/proposal matching and box coding) on the frozen random backbone's features. Backbone, FPN, RPN and box-head
convolutions stay as the seed made them.

**What is quantized.** ``dcnkit quantize`` (calibrated on 16 other scenes) quantizes the backbone, the FPN, the
RPN's convolutions and the box head's matrix products, and writes each DeformConv as one QDeformConv2d (where oneDNN
is at hand); MultiLevelRoIAlign and the offset predictors stay float between Q/DQ, and so do the pre/post-processing
and the box arithmetic (``--exclude-node``
for every other node: normalisation, box decoding, clipping, top-k, NMS, the RoIs' batch-index column). Quantized, the
box coordinates would step by 0.75 px on a 192-pixel image, and ONNX Runtime 1.31.1 crashed (segmentation fault
inside onnxruntime_pybind11_state.so, found with gdb) running the detector with that arithmetic quantized.

**The comparison.** Detections are a discontinuous function of the network (a threshold, NMS, top-k), so they are
compared by matching, not element by element, on scenes not used for calibration (those the heads were fitted
on, where the detector is as sure of itself as a trained one is on its own data): the scene's objects found by
each model (a detection of the object's label with IoU >= 0.5), each model's confident detections (score >= 0.9)
matched to the other's detection of the same label with the highest IoU (a match: IoU >= 0.5, scores within
``SCORE_TOLERANCE``), and the cosine similarity of the two models' FPN maps.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import faster_rcnn_dcn as ex  # noqa: E402

CLASSES = ("background", "rectangle", "disc")
FIT_SEEDS = range(100, 106)  # scenes the heads are fitted on
CALIBRATION_SEEDS = range(200, 216)  # scenes int8 is calibrated on
COMPARE_SEEDS = tuple(FIT_SEEDS)[:3]  # scenes the two models are compared on (not calibration scenes)


def make_scene(size: int = 256, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(image 1x3xSxS in [0, 1], boxes (n, 4) x0 y0 x1 y1, labels (n,)): 2 to 4 rectangles (1) and discs (2) on a
    smooth background, drawn in order (a later object may cover part of an earlier one)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    img = np.stack([0.3 + 0.4 * xx / size, 0.2 + 0.5 * yy / size, 0.5 + 0.2 * xx * yy / size**2]).astype(np.float32)
    boxes, labels = [], []
    for _ in range(rng.integers(2, 5)):
        color = rng.uniform(0, 1, size=3).astype(np.float32)
        w, h = rng.integers(size // 8, size // 3, size=2)
        if rng.random() < 0.5:
            x0, y0 = rng.integers(0, size - w), rng.integers(0, size - h)
            img[:, y0:y0 + h, x0:x0 + w] = color[:, None, None]
            labels.append(1)
        else:
            w = h = min(w, h)
            x0, y0 = rng.integers(0, size - w), rng.integers(0, size - h)
            r = w / 2
            img[:, (xx - x0 - r + 0.5) ** 2 + (yy - y0 - r + 0.5) ** 2 < r * r] = color[:, None]
            labels.append(2)
        boxes.append([x0, y0, x0 + w, y0 + h])
    img += rng.normal(0, 0.02, size=img.shape).astype(np.float32)
    return np.clip(img, 0, 1)[None], np.asarray(boxes, np.float32), np.asarray(labels, np.int64)


def _ridge(x: torch.Tensor, y: torch.Tensor, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights (outputs, features) and bias minimising |[x 1] W - y|^2 + lam * trace-scaled |W|^2 (float64)."""
    x = torch.cat([x.double(), torch.ones(len(x), 1, dtype=torch.float64)], 1)
    gram = x.T @ x
    reg = lam * gram.diagonal().mean() * torch.eye(len(gram), dtype=torch.float64)
    reg[-1, -1] = 0
    w = torch.linalg.solve(gram + reg, x.T @ y.double())
    return w[:-1].T.float(), w[-1].float()


def _balanced(labels: torch.Tensor, ratio: int, gen: torch.Generator) -> torch.Tensor:
    """Indices: every positive (label >= 1) and ``ratio`` times as many negatives (label 0), drawn with ``gen``."""
    pos = torch.nonzero(labels >= 1).flatten()
    neg = torch.nonzero(labels == 0).flatten()
    neg = neg[torch.randperm(len(neg), generator=gen)[:max(ratio * len(pos), 64)]]
    return torch.cat([pos, neg])


@torch.no_grad()
def fit_heads(model, scenes, margin: float = 4.0, lam: float = 1e-3, seed: int = 0) -> dict:
    """Fits the detector's last linear layers to ``scenes`` [(image, boxes, labels)] by ridge regression (see the
    module doc): RPN objectness to +-``margin`` logits, RPN box deltas, box-head class logits (``margin`` for the
    true class, 0 for the others) and per-class box deltas. The rest of the model is left as it is. Returns counts."""
    from torchvision.ops import boxes as box_ops

    gen = torch.Generator().manual_seed(seed)
    model.eval()
    images, targets = model.transform([torch.from_numpy(s[0][0]) for s in scenes],
                                      [{"boxes": torch.from_numpy(b), "labels": torch.from_numpy(lb)}
                                       for _, b, lb in scenes])
    features = model.backbone(images.tensors)
    levels = list(features.values())
    rpn = model.rpn
    t = [rpn.head.conv(f) for f in levels]
    n_anchor = rpn.head.cls_logits.out_channels
    # Rows in torchvision's anchor order: per image, level by level, (H, W, A).
    rows = torch.cat([torch.cat([f[i].permute(1, 2, 0).reshape(-1, 1, f.shape[1]).expand(-1, n_anchor, -1)
                                 .reshape(-1, f.shape[1]) for f in t]) for i in range(len(scenes))])
    anchors = rpn.anchor_generator(images, levels)
    labels, matched = rpn.assign_targets_to_anchors(anchors, targets)
    labels = torch.cat(labels)
    deltas = rpn.box_coder.encode(matched, anchors)
    deltas = torch.cat(deltas) if isinstance(deltas, (list, tuple)) else deltas
    which = torch.arange(len(rows)) % n_anchor
    for a in range(n_anchor):  # one row of the 1x1 convolutions per anchor shape
        sel = _balanced(torch.where(which == a, labels, torch.full_like(labels, -1)), 3, gen)
        w, b = _ridge(rows[sel], (labels[sel] * 2 - 1).unsqueeze(1) * margin, lam)
        rpn.head.cls_logits.weight[a] = w[0].view(-1, 1, 1)
        rpn.head.cls_logits.bias[a] = b[0]
        pos = sel[labels[sel] >= 1]
        if len(pos) > 0:
            w, b = _ridge(rows[pos], deltas[pos], lam)
            rpn.head.bbox_pred.weight[4 * a:4 * a + 4] = w.view(4, -1, 1, 1)
            rpn.head.bbox_pred.bias[4 * a:4 * a + 4] = b
    # The box head on the fitted RPN's proposals (and the true boxes, as torchvision trains it).
    proposals, _ = rpn(images, features)
    proposals = [torch.cat([p, tg["boxes"]]) for p, tg in zip(proposals, targets)]
    heads = model.roi_heads
    x = heads.box_head(heads.box_roi_pool(features, proposals, images.image_sizes))
    cls, box_targets = [], []
    for p, tg in zip(proposals, targets):
        iou = box_ops.box_iou(tg["boxes"], p)
        best, idx = iou.max(0)
        cls.append(torch.where(best >= 0.5, tg["labels"][idx], torch.zeros_like(idx)))
        box_targets.append(heads.box_coder.encode_single(tg["boxes"][idx], p))
    cls, box_targets = torch.cat(cls), torch.cat(box_targets)
    n_cls = heads.box_predictor.cls_score.out_features
    sel = _balanced(cls, 3, gen)
    w, b = _ridge(x[sel], torch.nn.functional.one_hot(cls[sel], n_cls).float() * margin, lam)
    heads.box_predictor.cls_score.weight.copy_(w)
    heads.box_predictor.cls_score.bias.copy_(b)
    for c in range(1, n_cls):
        pos = torch.nonzero(cls == c).flatten()
        if len(pos) > 0:
            w, b = _ridge(x[pos], box_targets[pos], lam)
            heads.box_predictor.bbox_pred.weight[4 * c:4 * c + 4] = w
            heads.box_predictor.bbox_pred.bias[4 * c:4 * c + 4] = b
    return dict(rpn_positives=int((labels >= 1).sum()), box_positives=int((cls >= 1).sum()), images=len(scenes))


def detector(size: int = 256, seed: int = 0) -> torch.nn.Module:
    """The example's detector (three classes, at most 20 detections over score 0.5) with its heads fitted on the
    scenes of ``FIT_SEEDS``."""
    model = ex.build(size, seed, num_classes=len(CLASSES), score_thresh=0.5, detections=20, cls_scale=1.0)
    fit_heads(model, [make_scene(size, s) for s in FIT_SEEDS], seed=seed)
    return model


def match(want: dict, got: dict, iou: float = 0.5) -> dict:
    """Each of ``want``'s detections matched to ``got``'s detection of the same label with the highest IoU (a
    match: IoU >= ``iou``). Returns the matched count, the smallest IoU and the largest score difference of the
    matched pairs."""
    from torchvision.ops import box_iou

    n = len(want["scores"])
    if n == 0 or len(got["scores"]) == 0:
        return dict(detections=n, matched=0, min_iou=None, max_score_diff=None)
    ious = box_iou(torch.from_numpy(want["boxes"]), torch.from_numpy(got["boxes"])).numpy()
    ious = ious * (want["labels"][:, None] == got["labels"][None, :])
    j, best = ious.argmax(1), ious.max(1)
    ok = best >= iou
    return dict(detections=n, matched=int(ok.sum()), min_iou=float(best[ok].min()) if ok.any() else None,
                max_score_diff=float(np.abs(want["scores"][ok] - got["scores"][j[ok]]).max()) if ok.any() else None)


FPN_OUTPUTS = tuple(f"/backbone/fpn/layer_blocks.{i}/layer_blocks.{i}.0/Conv_output_0" for i in range(4))


def _session(path: Path):
    """An ONNX Runtime session (the kit's library) that also outputs the FPN maps the pooler reads."""
    import onnx

    from dcnkit.runtime import ort_session

    m = onnx.load(str(path))
    m.graph.output.extend(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None) for t in FPN_OUTPUTS)
    return ort_session(m.SerializeToString(), providers=["CPUExecutionProvider"])


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


CONFIDENT = 0.9  # detections at or over this score are compared one to one
SCORE_TOLERANCE = 0.5  # the largest score difference of a matched pair (it may pair with a weaker duplicate)


def compare_models(fp32: Path, int8: Path, seeds, size: int) -> list[dict]:
    """Per scene of ``seeds``: the scene's objects found by each model (a detection of the object's label with IoU
    >= 0.5), each model's confident detections (score >= ``CONFIDENT``) matched in the other's detections, and the
    cosine similarity of the two models' FPN maps (the features the box head pools), finest first."""
    sessions = [_session(fp32), _session(int8)]
    out = []
    for seed in seeds:
        image, boxes, labels = make_scene(size, seed)
        a, b = (dict(zip([o.name for o in s.get_outputs()], s.run(None, {"images": image}))) for s in sessions)
        objects = dict(boxes=boxes, labels=labels, scores=np.ones(len(labels), np.float32))
        out.append(dict(
            scene=seed, objects=len(labels), found_fp32=match(objects, a)["matched"],
            found_int8=match(objects, b)["matched"], fp32_in_int8=match(_confident(a), b),
            int8_in_fp32=match(_confident(b), a), fpn_cosine=[round(_cosine(a[t], b[t]), 5) for t in FPN_OUTPUTS]))
    return out


def _confident(d: dict) -> dict:
    keep = d["scores"] >= CONFIDENT
    return {k: d[k][keep] for k in ex.OUTPUTS}


# What is quantized: the backbone (ResNet and FPN), the RPN's convolutions, the box head's and predictor's matrix
# products. Everything else is box arithmetic or pre/post-processing (the transform's normalisation and resizing,
# box decoding, clipping, top-k, NMS, the RoIs' batch-index column, boxes scaled back to the image): on a uint8 grid
# a 192-pixel image's box coordinates would step by 0.75 px; it stays float.
QUANTIZED_PREFIXES = ("/backbone/", "/rpn/head/", "/roi_heads/box_head/", "/roi_heads/box_predictor/")


def box_arithmetic_nodes(path: Path) -> list[str]:
    """The names of the nodes outside ``QUANTIZED_PREFIXES`` (see above)."""
    import onnx

    nodes = onnx.load(str(path), load_external_data=False).graph.node
    return [n.name for n in nodes if not n.name.startswith(QUANTIZED_PREFIXES)]


def quantize_detector(path: Path, size: int, out: Path) -> Path:
    """``dcnkit quantize PATH -o OUT --calibration calib.npz --exclude-node ...`` (its Python API, in this process)
    with the scenes of ``CALIBRATION_SEEDS`` and the box arithmetic left float."""
    from dcnkit.runtime.quantize import calibration_feeds, quantize

    images = np.concatenate([make_scene(size, s)[0] for s in CALIBRATION_SEEDS])
    np.savez(out / "calibration.npz", images=images)  # for the command line above
    return quantize(path, out / (path.stem + ".int8.onnx"), calibration_feeds(str(path), {"images": images}),
                    exclude_nodes=box_arithmetic_nodes(path))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("faster_rcnn_dcn_int8"), help="folder for models and arrays")
    p.add_argument("--image-size", type=int, default=256)
    p.add_argument("--seed", type=int, default=0, help="seed of the detector's weights")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model = detector(args.image_size, args.seed)
    path = ex.export(model, make_scene(args.image_size, COMPARE_SEEDS[0])[0], args.out / "faster_rcnn_dcn.onnx")
    q = quantize_detector(path, args.image_size, args.out)
    report = compare_models(path, q, COMPARE_SEEDS, args.image_size)
    for r in report:
        print(r)
    (args.out / "report.json").write_text(json.dumps(report, indent=2))
    print(f"done in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    sys.exit(main())
