"""Hugging Face transformers' RT-DETR on the kit: patched with one call, exported, run in ONNX Runtime, served and
compared as detections.

    python examples/hf_rt_detr.py --out /tmp/hf_rt_detr [--size small|default] [--dynamo]

1. ``RTDetrForObjectDetection`` from its config (random weights, no download; examples/hf_models.py) and
   ``dcnkit.integrations.transformers.patch(model)``: every ``MultiScaleDeformableAttention`` now runs
   ``dcnkit.ops.multi_scale_deformable_attn``; eager outputs equal transformers' own.
2. ``dcnkit.export.to_onnx``: one ``dcnkit::MultiScaleDeformableAttention`` node per decoder layer, no GridSample.
3. ONNX Runtime with the kit's library (``dcnkit.runtime.ort_session``): the encoder's class scores equal eager
   PyTorch's elementwise; the detections (``logits``, ``pred_boxes``) are compared by matching, as
   ``dcnkit compare --detections`` does: under random weights the encoder's top-k has exact ties, and ONNX Runtime
   and torch keep different members of the tie.
4. ``dcnkit serve`` (one KServe v2 request) and ``dcnkit compare --detections pred_boxes,logits --box-format cxcywh``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hf_models  # noqa: E402
from faster_rcnn_dcn import _dcnkit, serve_and_query  # noqa: E402

OUTPUTS = ("logits", "pred_boxes", "enc_outputs_class")


class Detector(torch.nn.Module):
    """RT-DETR with plain tensor outputs: logits (N, Q, C), pred_boxes (N, Q, 4: cx, cy, w, h in [0, 1]) and the
    encoder's class scores before the top-k (N, S, C)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        out = self.model(pixel_values=pixel_values)
        return tuple(out[k] for k in OUTPUTS)


def build(size: str = "small", seed: int = 0):
    """(patched detector, original detector, image (1, 3, H, W) as NumPy)."""
    import copy

    from dcnkit.integrations import transformers as hf

    model, inputs = hf_models.build("rt_detr", size, seed)
    original = Detector(copy.deepcopy(model)).eval()
    hf.patch(model)
    return Detector(model).eval(), original, inputs["pixel_values"].numpy()


def match_report(want: dict, got: dict) -> dict:
    from dcnkit.runtime.detections import as_detections, match_detections

    rep = match_detections(as_detections(want["pred_boxes"], want["logits"], box_format="cxcywh"),
                           as_detections(got["pred_boxes"], got["logits"], box_format="cxcywh"))
    return {"matched": rep.matched, "unmatched": len(rep.unmatched_ref) + len(rep.unmatched_got),
            "max_score_diff": rep.max_score_diff, "max_box_diff": rep.max_box_diff,
            "matched_within_tolerance": rep.score_failures == 0 and rep.box_failures == 0,
            "encoder_scores_max_abs": float(np.abs(got["enc_outputs_class"] - want["enc_outputs_class"]).max())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="hf_rt_detr_out", help="folder for the ONNX file, inputs and report")
    ap.add_argument("--size", choices=["small", "default"], default="small")
    ap.add_argument("--dynamo", action="store_true", help="the dynamo exporter (default: TorchScript)")
    ap.add_argument("--skip-serve", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import collections

    import onnx

    import dcnkit
    from dcnkit.runtime import ort_session

    model, original, image = build(args.size)
    x = torch.from_numpy(image)
    with torch.no_grad():
        want = {k: v.numpy() for k, v in zip(OUTPUTS, model(x))}
        ref = {k: v.numpy() for k, v in zip(OUTPUTS, original(x))}
    report = {"eager patched vs original (max abs)": {k: float(np.abs(want[k] - ref[k]).max()) for k in OUTPUTS}}
    print("eager, patched vs transformers' own:", report["eager patched vs original (max abs)"])

    path = out / "rt_detr.onnx"
    dcnkit.export.to_onnx(model, (x,), path, dynamo=args.dynamo, dynamic_batch=False, input_names=["pixel_values"],
                          output_names=list(OUTPUTS))
    counts = collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)
    report["nodes"] = {"MultiScaleDeformableAttention": counts["MultiScaleDeformableAttention"],
                       "GridSample": counts["GridSample"]}
    print(f"exported {path}: {report['nodes']}")

    got = dict(zip(OUTPUTS, ort_session(path).run(None, {"pixel_values": image})))
    report["ort"] = match_report(want, got)
    print("ONNX Runtime vs eager:", report["ort"])

    inputs = out / "image.npz"
    np.savez(inputs, pixel_values=image)
    rc = _dcnkit("compare", path, "--inputs", inputs, "--backends", "ort-cpu,reference", "--detections",
                 "pred_boxes,logits", "--box-format", "cxcywh", check=False)
    report["compare_rc"] = rc.returncode
    if not args.skip_serve:
        served = serve_and_query(path, image, name="rt_detr", input_name="pixel_values")
        report["serve"] = match_report(want, served)
        print("dcnkit serve vs eager:", report["serve"])
    (out / "report.json").write_text(json.dumps(report, indent=2))
    ok = (report["nodes"]["GridSample"] == 0 and report["ort"]["matched_within_tolerance"]
          and report["ort"]["encoder_scores_max_abs"] < 1e-4)
    print("OK" if ok else "MISMATCH", f"(report: {out / 'report.json'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
