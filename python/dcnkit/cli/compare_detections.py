"""``dcnkit compare m.onnx --detections BOXES,SCORES[,LABELS]``: backends compared as detectors. Each backend's
detections are paired with the first backend's by label and IoU (:mod:`dcnkit.runtime.detections`): unmatched
detections are reported, matched ones compare scores and boxes within ``--atol`` / ``--rtol`` (the values for the
scores and boxes outputs). Elementwise comparison fails where rows of equal score swap or a top-k cut-off falls
inside equal scores."""
from __future__ import annotations

from dcnkit.cli.shared import CliError


def parse_detection_outputs(spec: str, outputs: list[str]) -> tuple[str, str, str | None]:
    """``BOXES,SCORES[,LABELS]`` checked against the model's output names."""
    names = [s.strip() for s in spec.split(",")]
    if len(names) not in (2, 3) or not all(names):
        raise CliError("--detections", f"expected BOXES,SCORES or BOXES,SCORES,LABELS (output names), got {spec!r}")
    unknown = [n for n in names if n not in outputs]
    if unknown:
        raise CliError("--detections", f"expected output names among {outputs}, got {unknown}")
    return names[0], names[1], (names[2] if len(names) == 3 else None)


def _tol(table: dict, name: str) -> float:
    return float(table.get(name, table.get("", 1e-4)))


def compare_detections(args, model: str, backends: list[str], feeds: list[dict], atol: dict, rtol: dict,
                       outputs: list[str]) -> int:
    from dcnkit.runtime.detections import as_detections, match_detections
    from dcnkit.runtime.registry import make_runner

    boxes, scores, labels = parse_detection_outputs(args.detections, outputs)
    if not 0.0 < args.iou <= 1.0:
        raise CliError("--iou", f"expected a value in (0, 1], got {args.iou}")
    runs = {}
    for b in backends:
        with make_runner(model, b) as r:
            runs[b] = [r.run(f) for f in feeds]
    ref_name = backends[0]
    passed = True
    for b in backends[1:]:
        for i, (ref_out, out) in enumerate(zip(runs[ref_name], runs[b])):
            dets = [as_detections(o[boxes], o[scores], None if labels is None else o[labels], args.box_format)
                    for o in (ref_out, out)]
            rep = match_detections(*dets, iou=args.iou, score_atol=_tol(atol, scores), score_rtol=_tol(rtol, scores),
                                   box_atol=_tol(atol, boxes), box_rtol=_tol(rtol, boxes),
                                   score_threshold=args.score_threshold)
            print(f"{b} vs {ref_name}, input set {i}:")
            for line in rep.lines():
                print(f"  {line}")
            passed = passed and rep.passed
    print("PASSED" if passed else "FAILED: detections differ (unmatched, or matched beyond atol/rtol)")
    return 0 if passed else 1


def add_args(p) -> None:
    p.add_argument("--detections", metavar="BOXES,SCORES[,LABELS]",
                   help="compare as detections: the boxes, scores and (optional) labels outputs; without LABELS the "
                   "scores output holds class scores (..., K, C) whose arg-max is the label (DETR's logits)")
    p.add_argument("--box-format", choices=["xyxy", "cxcywh"], default="xyxy",
                   help="with --detections: boxes as x1,y1,x2,y2 (default; torchvision) or cx,cy,w,h (DETR)")
    p.add_argument("--iou", type=float, default=0.5, help="with --detections: IoU for a match (default 0.5)")
    p.add_argument("--score-threshold", type=float, default=None,
                   help="with --detections: leave out detections scoring below this on both sides")
