"""A deformable R-FCN from PyTorch to ONNX Runtime, end to end.

The system deformable convolution was first shown on (Dai et al., "Deformable Convolutional Networks", 2017),
with the layout of the authors' R-FCN: a ResNet-50 whose last stage (``layer4``) is dilated (stride 16) and
deformable (DCNv2, ``dcnkit.nn.deformable_resnet``); torchvision's RPN on ``layer3`` (stride 16); the R-FCN head
on ``layer4``:

- ``conv_new_1``: 1x1 convolution to 1024 channels + ReLU;
- position-sensitive score maps ``rfcn_cls`` (k·k·(C+1) channels) and class-agnostic box maps ``rfcn_bbox``
  (k·k·8: 2 classes x 4 deltas), 1x1 convolutions;
- offset maps ``rfcn_cls_offset_t`` (k·k·2·(C+1)) and ``rfcn_bbox_offset_t`` (k·k·2), pooled by a first
  ``DeformPSRoIPool`` pass without offsets (``output_dim`` 2·(C+1) and 2) into per-RoI offsets (K, 2·(C+1), k, k)
  and (K, 2, k, k);
- the second, deformable pass pools the score and box maps with those offsets (``trans_std`` 0.1, ``output_dim``
  C+1 and 8);
- every pass: ``group_size`` = ``output_size`` = ``part_size`` = k = 7, ``sample_per_part`` 4, ``spatial_scale``
  1/16; position-sensitive voting averages the k·k bins; torchvision's box decoding, score threshold and per-class
  NMS turn the votes into detections (the foreground box of the class-agnostic pair serves every class).

It trains (``train``: SGD on synthetic images and boxes, with torchvision's RPN and Fast R-CNN losses, gradients
through both pooling passes and the DCN layers), exports whole with the exporter the Faster R-CNN example uses
(one ``dcnkit::DeformPSRoIPool`` node per pass and branch, outputs ``boxes``, ``labels``, ``scores``) and runs with
the kit's tools:

    python examples/rfcn_dcn.py --out /tmp/rfcn        # build, export, check, run, compare, serve

which does what these commands do (the factory ``build`` below works with ``dcnkit export`` too):

    dcnkit export examples/rfcn_dcn.py:build -o rfcn.onnx --input images:1x3x256x256 --legacy --no-dynamic-batch
    dcnkit run rfcn.onnx --inputs image.npz -o detections.npz
    dcnkit compare rfcn.onnx --inputs image.npz --backends ort-cpu,reference --atol boxes:0.05 --rtol scores:1e-3
    dcnkit serve rfcn.onnx --port 8000

torchvision's transform and RPN loop over the images, so the whole detector is traced at batch 1; the head alone
(``export_head``: features (N, 2048, H, W) and RoIs (K, 5) in, class logits and box deltas out) has a dynamic
image batch and RoI count. The detector is untrained (random weights from a fixed seed; the offset convolutions
get small random weights so that the deformable sampling is exercised, as the Faster R-CNN example does).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torchvision.models.detection.roi_heads import RoIHeads, fastrcnn_loss
from torchvision.models.detection.rpn import RegionProposalNetwork

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faster_rcnn_dcn import (OUTPUTS, blank_image, check_detections, cli_checks, detector_parser,  # noqa: E402,F401
                             eager_detections, export, graph_summary, make_image, ort_detections,
                             reference_detections, runner_detections)

K = 7  # group_size = output_size = part_size of every DeformPSRoIPool (the authors' 7x7 bins)
STRIDE = 16
# A synthetic image on which no detection is borderline (a box coordinate a hair from x.5, which DeformPSRoIPool
# rounds; a score on the threshold; an overlap on NMS's): see faster_rcnn_dcn.check_detections.
IMAGE_SEED = 0


class RFCNHead(nn.Module):
    """The deformable R-FCN head: ``forward(features (N, in_channels, H, W) at stride 16, rois (K, 5))`` ->
    ``(class_logits (K, C+1), box_deltas (K, 8))``, the votes (averages over the k·k bins) of the deformable
    position-sensitive pooling. ``num_classes`` counts the background (C+1). Module names are the authors'."""

    def __init__(self, in_channels: int = 2048, num_classes: int = 21, k: int = K, mid_channels: int = 1024,
                 spatial_scale: float = 1.0 / STRIDE, sample_per_part: int = 4, trans_std: float = 0.1):
        import dcnkit.nn

        super().__init__()
        for arg, value, lo in (("in_channels", in_channels, 1), ("num_classes", num_classes, 2), ("k", k, 1),
                               ("mid_channels", mid_channels, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValueError(f"RFCNHead: {arg}: expected an int >= {lo}"
                                 f"{' (the background and at least one class)' if arg == 'num_classes' else ''}, "
                                 f"got {value!r}")
        self.num_classes = num_classes
        self.conv_new_1 = nn.Conv2d(in_channels, mid_channels, 1)
        self.rfcn_cls = nn.Conv2d(mid_channels, k * k * num_classes, 1)
        self.rfcn_bbox = nn.Conv2d(mid_channels, k * k * 8, 1)
        self.rfcn_cls_offset_t = nn.Conv2d(mid_channels, k * k * 2 * num_classes, 1)
        self.rfcn_bbox_offset_t = nn.Conv2d(mid_channels, k * k * 2, 1)

        def pool(output_dim, no_trans):
            return dcnkit.nn.DeformPSRoIPool(spatial_scale, k, output_dim, group_size=k, part_size=k,
                                             sample_per_part=sample_per_part, trans_std=0.0 if no_trans else trans_std,
                                             no_trans=no_trans)

        # First pass (no offsets): the per-RoI offsets of the second pass, one (x, y) pair per class and bin.
        self.rfcn_cls_offset = pool(2 * num_classes, True)
        self.rfcn_bbox_offset = pool(2, True)
        # Second pass: the deformable position-sensitive pooling of the score and box maps.
        self.psroipooled_cls_rois = pool(num_classes, False)
        self.psroipooled_loc_rois = pool(8, False)
        for conv in (self.rfcn_cls, self.rfcn_bbox):  # the authors' initialisation
            nn.init.normal_(conv.weight, std=0.01)
            nn.init.zeros_(conv.bias)
        for conv in (self.rfcn_cls_offset_t, self.rfcn_bbox_offset_t):  # zero offsets until trained
            nn.init.zeros_(conv.weight)
            nn.init.zeros_(conv.bias)

    def forward(self, features: torch.Tensor, rois: torch.Tensor):
        x = torch.relu(self.conv_new_1(features))
        cls_offset = self.rfcn_cls_offset(self.rfcn_cls_offset_t(x), rois)
        bbox_offset = self.rfcn_bbox_offset(self.rfcn_bbox_offset_t(x), rois)
        cls = self.psroipooled_cls_rois(self.rfcn_cls(x), rois, cls_offset)
        box = self.psroipooled_loc_rois(self.rfcn_bbox(x), rois, bbox_offset)
        return cls.mean((2, 3)), box.mean((2, 3))  # position-sensitive voting


def boxes_to_rois(boxes: list) -> torch.Tensor:
    """Per-image (Ki, 4) boxes -> (sum Ki, 5) ``[batch_index, x1, y1, x2, y2]``."""
    return torch.cat([torch.cat([b.new_full((b.shape[0], 1), i), b], 1) for i, b in enumerate(boxes)])


class RFCNRoIHeads(RoIHeads):
    """torchvision's ``RoIHeads`` (proposal sampling and matching, Fast R-CNN losses, box decoding, score threshold,
    per-class NMS) around an :class:`RFCNHead` on ``features[feature]``. The class-agnostic foreground box (deltas
    4:8) is every class's box; the background box (0:4) is never used, as in the authors' training."""

    def __init__(self, head: RFCNHead, feature: str = "c5", **kw):
        super().__init__(None, None, None, **kw)
        self.rfcn = head
        self.feature = feature

    def forward(self, features, proposals, image_shapes, targets=None):
        if self.training:
            if targets is None:
                raise ValueError("RFCNRoIHeads: targets: expected boxes and labels in training, got None")
            proposals, _, labels, regression_targets = self.select_training_samples(proposals, targets)
        class_logits, deltas = self.rfcn(features[self.feature], boxes_to_rois(proposals))
        box_regression = deltas[:, 4:].repeat(1, class_logits.shape[1])
        if self.training:
            loss_cls, loss_box = fastrcnn_loss(class_logits, box_regression, labels, regression_targets)
            return [], {"loss_classifier": loss_cls, "loss_box_reg": loss_box}
        boxes, scores, labels = self.postprocess_detections(class_logits, box_regression, proposals, image_shapes)
        return [{"boxes": b, "labels": lb, "scores": s} for b, lb, s in zip(boxes, labels, scores)], {}


class C4RegionProposalNetwork(RegionProposalNetwork):
    """torchvision's RPN on one of the backbone's maps (``layer3``'s, stride 16, as the authors')."""

    def __init__(self, *args, feature: str = "c4", **kw):
        super().__init__(*args, **kw)
        self.feature = feature

    def forward(self, images, features, targets=None):
        return super().forward(images, {self.feature: features[self.feature]}, targets)


def build(image_size: int = 256, seed: int = 0, num_classes: int = 4, rpn_top_n: int = 100, detections: int = 100,
          score_thresh: float = 0.3, nms_thresh: float = 0.3, cls_std: float = 0.1, offset_std: float = 0.1,
          anchor_sizes=(32, 64, 128), rpn_score_thresh: float = 0.0) -> nn.Module:
    """The detector in eval mode, deterministic for a ``seed``: ``num_classes`` counts the background; images of
    ``image_size`` stay at that size. ``cls_std``: standard deviation of the untrained score maps' weights (larger
    than the authors' 0.01, so that the untrained scores spread over the classes); ``offset_std``: of the offset
    convolutions' weights (DCN layers and both R-FCN offset maps), relative to their fan-in. ``rpn_score_thresh``:
    the objectness a proposal needs (0: every image gets proposals; above a blank image's, it gets none)."""
    from torchvision.models import resnet50
    from torchvision.models._utils import IntermediateLayerGetter
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.models.detection.generalized_rcnn import GeneralizedRCNN
    from torchvision.models.detection.rpn import RPNHead
    from torchvision.models.detection.transform import GeneralizedRCNNTransform
    from torchvision.ops.misc import FrozenBatchNorm2d

    import dcnkit.nn

    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 2 * STRIDE:
        raise ValueError(f"build: image_size: expected an int >= {2 * STRIDE} (maps of 2x2 at stride {STRIDE}), "
                         f"got {image_size!r}")
    torch.manual_seed(seed)
    resnet = resnet50(weights=None, norm_layer=FrozenBatchNorm2d, replace_stride_with_dilation=[False, False, True])
    for name, p in resnet.named_parameters():  # the authors keep conv1 and res2 fixed
        if name.startswith(("conv1.", "layer1.")):
            p.requires_grad_(False)
    backbone = IntermediateLayerGetter(resnet, {"layer3": "c4", "layer4": "c5"})
    dcnkit.nn.deformable_resnet(backbone, stages=(4,), modulated=True)
    anchors = AnchorGenerator((tuple(anchor_sizes),), ((0.5, 1.0, 2.0),))
    pre, post = dict(training=2000, testing=1000), dict(training=2 * rpn_top_n, testing=rpn_top_n)
    rpn = C4RegionProposalNetwork(anchors, RPNHead(1024, anchors.num_anchors_per_location()[0]), 0.7, 0.3, 256, 0.5,
                                  pre, post, 0.7, score_thresh=rpn_score_thresh)
    head = RFCNHead(2048, num_classes)
    roi_heads = RFCNRoIHeads(head, fg_iou_thresh=0.5, bg_iou_thresh=0.5, batch_size_per_image=128,
                             positive_fraction=0.25, bbox_reg_weights=None, score_thresh=score_thresh,
                             nms_thresh=nms_thresh, detections_per_img=detections)
    transform = GeneralizedRCNNTransform(image_size, image_size, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    model = GeneralizedRCNN(backbone, rpn, roi_heads, transform)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        nn.init.normal_(head.rfcn_cls.weight, std=cls_std, generator=g)
        offsets = [m.conv_offset for m in model.modules() if isinstance(m, dcnkit.nn.ModulatedDeformConv2dPack)]
        for conv in offsets + [head.rfcn_cls_offset_t, head.rfcn_bbox_offset_t]:
            w = conv.weight
            w.copy_(torch.randn(w.shape, generator=g) * (offset_std / w[0].numel() ** 0.5))
    return model.eval()


def make_training_batch(size: int, n: int = 2, num_classes: int = 4, objects: int = 3, seed: int = 0):
    """``n`` synthetic images (N, 3, size, size) in [0, 1] with ``objects`` filled rectangles each, their colour
    set by their label (1 .. num_classes-1), and the targets torchvision's detectors train on."""
    rng = np.random.default_rng(seed)
    colours = rng.uniform(0, 1, (num_classes, 3)).astype(np.float32)
    images = make_image(size, seed)[[0] * n].copy()
    targets = []
    for i in range(n):
        boxes, labels = [], []
        for _ in range(objects):
            w, h = rng.integers(size // 5, size // 2, size=2)
            x0, y0 = rng.integers(0, size - w), rng.integers(0, size - h)
            label = int(rng.integers(1, num_classes))
            images[i, :, y0:y0 + h, x0:x0 + w] = colours[label][:, None, None]
            boxes.append([x0, y0, x0 + w, y0 + h])
            labels.append(label)
        targets.append({"boxes": torch.tensor(boxes, dtype=torch.float32), "labels": torch.tensor(labels)})
    return torch.from_numpy(images), targets


def train(model, images: torch.Tensor, targets: list, steps: int = 3, lr: float = 3e-4, seed: int = 0):
    """``steps`` SGD steps (momentum 0.9) on one batch, the proposal sampling reseeded each step (the same RoIs,
    so that the losses compare); returns the total losses, the gradients of the first step (name -> tensor) and
    leaves the model in eval mode."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=lr, momentum=0.9)
    model.train()
    losses, first_grads = [], {}
    for step in range(steps):
        torch.manual_seed(seed)
        parts = model(list(images), targets)
        loss = sum(parts.values())
        opt.zero_grad()
        loss.backward()
        if step == 0:
            first_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses, first_grads


def head_inputs(model, image: np.ndarray):
    """The head's inputs for ``image`` (N, 3, H, W): the ``layer4`` features and the RPN's proposals as RoIs."""
    with torch.no_grad():
        images, _ = model.transform(list(torch.from_numpy(image)))
        feats = model.backbone(images.tensors)
        proposals, _ = model.rpn(images, feats)
    return feats["c5"], boxes_to_rois(proposals)


def export_head(head: RFCNHead, features: torch.Tensor, rois: torch.Tensor, path: Path) -> Path:
    """The R-FCN head alone (``features``, ``rois`` -> ``class_logits``, ``box_deltas``), image batch and RoI count
    dynamic, with the exporter of the whole detector."""
    import dcnkit.export

    with torch.no_grad():
        dcnkit.export.to_onnx(head, (features, rois), path, dynamo=False, dynamic_batch=True,
                              input_names=["features", "rois"], output_names=["class_logits", "box_deltas"])
    return path


def psroi_nodes(path: Path) -> list:
    """(output_dim, has trans) of each ``dcnkit::DeformPSRoIPool`` node of the graph at ``path``, in order."""
    import onnx

    out = []
    for n in onnx.load(str(path), load_external_data=False).graph.node:
        if n.domain == "dcnkit" and n.op_type == "DeformPSRoIPool":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            out.append((attrs["output_dim"], len(n.input) > 2 and bool(n.input[2])))
    return out


def main(argv=None) -> int:
    p = detector_parser(__doc__, "rfcn_dcn", IMAGE_SEED)
    p.add_argument("--train-steps", type=int, default=3, help="SGD steps on synthetic data first (0: none)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    report: dict = {}
    if args.train_steps:  # on a model of its own: a few steps teach the untrained detector "background" only
        t0 = time.perf_counter()
        losses, _ = train(build(args.image_size, args.seed), *make_training_batch(args.image_size),
                          steps=args.train_steps)
        report["train_losses"] = losses
        print(f"train: losses {[round(v, 4) for v in losses]} ({time.perf_counter() - t0:.2f} s)")
    model = build(args.image_size, args.seed)
    image = make_image(args.image_size, args.image_seed)
    want = eager_detections(model, image)
    print(f"eager: {len(want['scores'])} detections of {len(np.unique(want['labels']))} labels")
    path = export(model, image, args.out / "rfcn_dcn.onnx")
    summary = graph_summary(path)
    report.update(summary=summary, psroi_nodes=psroi_nodes(path))
    print(f"exported {path}: outputs {summary['outputs']}, {summary['nodes']} nodes, DeformPSRoIPool "
          f"(output_dim, offsets) {report['psroi_nodes']}")

    report["ort"] = check_detections(ort_detections(path, image), want, args.box_atol, args.score_atol)
    print(f"ONNX Runtime vs eager: {report['ort']}")

    features, rois = head_inputs(model, np.concatenate([image, make_image(args.image_size, args.image_seed + 1)]))
    head_path = export_head(model.roi_heads.rfcn, features[:1], rois[rois[:, 0] == 0], args.out / "rfcn_head.onnx")
    from dcnkit.runtime import ort_session

    head = ort_session(str(head_path), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        want_head = [t.numpy() for t in model.roi_heads.rfcn(features, rois)]
    got_head = head.run(None, {"features": features.numpy(), "rois": rois.numpy()})
    for name, g, w in zip(("class_logits", "box_deltas"), got_head, want_head):
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4, err_msg=f"head at batch 2: {name}")
    report["head_batch2"] = [float(np.abs(g - w).max()) for g, w in zip(got_head, want_head)]
    print(f"head (exported at batch 1) at batch 2, {len(rois)} RoIs, ORT vs eager: max diff "
          f"{report['head_batch2']}")

    if not args.skip_cli:
        report.update(cli_checks(path, image, want, args.out, args.box_atol, args.score_atol,
                                 compare_reference=args.compare_reference, name="rfcn"))
    (args.out / "report.json").write_text(json.dumps(report, indent=2))
    print("PASSED: ONNX Runtime's detections equal eager PyTorch's")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    sys.exit(main())
