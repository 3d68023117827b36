"""A deformable Faster R-CNN from PyTorch to ONNX Runtime, end to end.

torchvision's ``fasterrcnn_resnet50_fpn`` (no downloaded weights), DCNv2 in ResNet stages 4-5
(``dcnkit.nn.deformable_resnet``, as mmdet's ``stage_with_dcn``), the FPN box pooler swapped for
``dcnkit.nn.MultiScaleRoIAlign`` (one fused ``multi_level_roi_align``), exported whole with the legacy
(TorchScript) exporter with named outputs ``boxes``, ``labels``, ``scores``, then run with the kit's tools:

    python examples/faster_rcnn_dcn.py --out /tmp/frcnn            # build, export, check, run, compare, serve

which does what these commands do (the factory ``build`` below works with ``dcnkit export`` too):

    dcnkit export examples/faster_rcnn_dcn.py:build -o frcnn.onnx --input images:1x3x256x256 --legacy --no-dynamic-batch
    dcnkit run frcnn.onnx --inputs image.npz -o detections.npz
    dcnkit compare frcnn.onnx --inputs image.npz --backends ort-cpu,reference --atol boxes:0.05 --rtol scores:1e-3
    dcnkit serve frcnn.onnx --port 8000

The detector is untrained (random weights from a fixed seed; the offset convolutions get small random weights
so that the deformable sampling is exercised), with few classes and a low score threshold so that it still
makes many detections. ORT's detections are checked against eager PyTorch's: same count, each matched to one
of the same label with its box within ``--box-atol`` pixels (0.05) and its score within ``--score-atol`` (5e-4).
Detections are a discontinuous function of the network's output: a box whose score sits on the threshold, or
two boxes whose overlap sits on NMS's IoU threshold, can be kept by one backend and not the other when the
features differ in the sixth digit; the default image has none.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import torch

OUTPUTS = ("boxes", "labels", "scores")
# A synthetic image on which no detection is borderline (see check_detections): with seed 0, two boxes of
# one label overlap with IoU 0.497 against NMS's 0.5, and ORT keeps one that eager PyTorch suppresses.
IMAGE_SEED = 4
FEATMAPS = ["0", "1", "2", "3"]


def build(image_size: int = 256, seed: int = 0, fused: bool = True, dcn: bool = True, num_classes: int = 5,
          rpn_top_n: int = 100, detections: int = 100, score_thresh: float = 0.3,
          cls_scale: float = 0.5, rpn_score_thresh: float = 0.0) -> torch.nn.Module:
    """The detector in eval mode: deterministic for a ``seed``; ``fused`` swaps in dcnkit's pooler, ``dcn``
    puts DCNv2 in ``layer3``, ``layer4``. ``image_size``: the transform keeps images of that size as they are.
    ``rpn_score_thresh``: the objectness a proposal needs (torchvision's default 0: every image gets proposals);
    above what a blank image's anchors reach, such an image yields no proposal and no detection."""
    from torchvision.models.detection import fasterrcnn_resnet50_fpn

    import dcnkit.nn

    torch.manual_seed(seed)
    model = fasterrcnn_resnet50_fpn(
        weights=None, weights_backbone=None, num_classes=num_classes, min_size=image_size, max_size=image_size,
        rpn_pre_nms_top_n_test=rpn_top_n, rpn_post_nms_top_n_test=rpn_top_n, box_score_thresh=score_thresh,
        box_detections_per_img=detections, rpn_score_thresh=rpn_score_thresh)
    with torch.no_grad():  # a tempered classifier: the untrained scores spread over several classes
        model.roi_heads.box_predictor.cls_score.weight.mul_(cls_scale)
    if dcn:
        dcnkit.nn.deformable_resnet(model, stages=(3, 4), modulated=True)
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():  # "trained" offsets and masks: small, so boxes stay sensible
            for m in model.modules():
                if isinstance(m, dcnkit.nn.ModulatedDeformConv2dPack):
                    w = m.conv_offset.weight
                    w.copy_(torch.randn(w.shape, generator=g) * (0.1 / w[0].numel() ** 0.5))
    if fused:
        old = model.roi_heads.box_roi_pool
        model.roi_heads.box_roi_pool = dcnkit.nn.MultiScaleRoIAlign(
            old.featmap_names, old.output_size, old.sampling_ratio,
            canonical_scale=old.canonical_scale, canonical_level=old.canonical_level)
    return model.eval()


def make_image(size: int = 256, seed: int = 0) -> np.ndarray:
    """An image-like input (1, 3, size, size) in [0, 1]: a smooth background with rectangles and discs."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    img = np.stack([0.3 + 0.4 * xx, 0.2 + 0.5 * yy, 0.5 + 0.2 * xx * yy]).astype(np.float32)
    for _ in range(12):
        c = rng.uniform(0, 1, size=3).astype(np.float32)
        x0, y0 = rng.integers(0, size - 24, size=2)
        w, h = rng.integers(16, size // 2, size=2)
        if rng.random() < 0.5:
            img[:, y0:y0 + h, x0:x0 + w] = c[:, None, None]
        else:
            r = min(w, h) / 2
            disc = (xx * size - x0 - r) ** 2 + (yy * size - y0 - r) ** 2 < r * r
            img[:, disc] = c[:, None]
    img += rng.normal(0, 0.02, size=img.shape).astype(np.float32)
    return np.clip(img, 0, 1)[None]


IMAGE_MEAN = (0.485, 0.456, 0.406)  # torchvision's detection transform normalises this colour to zero


def blank_image(size: int = 256) -> np.ndarray:
    """A blank image (1, 3, size, size): uniform, of the colour the detectors' transform normalises to zero, so
    that the untrained networks see nothing (every objectness of the example detectors is then sigmoid(0) = 0.5).
    What a detector must survive: no proposal or no detection, empty outputs, whichever backend runs the exported
    file (which was traced on an image with detections)."""
    return np.broadcast_to(np.asarray(IMAGE_MEAN, np.float32)[None, :, None, None], (1, 3, size, size)).copy()


def runner_detections(path: Path, image: np.ndarray, backend: str) -> dict:
    """The detections of one of the kit's backends (``dcnkit run --backend BACKEND``) for ``image``."""
    from dcnkit.runtime.registry import make_runner

    runner = make_runner(str(path), backend)
    try:
        return runner.run({"images": image})
    finally:
        runner.close()


def reference_detections(path: Path, image: np.ndarray) -> dict:
    """The detections of the NumPy reference runner (``dcnkit run --backend reference``) for ``image``."""
    return runner_detections(path, image, "reference")


def eager_detections(model, image: np.ndarray) -> dict:
    with torch.no_grad():
        out = model(torch.from_numpy(image))[0]
    return {k: out[k].numpy() for k in OUTPUTS}


def export(model, image: np.ndarray, path: Path) -> Path:
    """The whole detector, legacy exporter, outputs named by the detections' keys; the detection count is the
    ``num_detections`` axis. Images are fixed at the example's size and batch 1."""
    import dcnkit.export

    with torch.no_grad():
        dcnkit.export.to_onnx(
            model, (torch.from_numpy(image),), path, dynamo=False, dynamic_batch=False, input_names=["images"],
            output_axes={k: {0: "num_detections"} for k in OUTPUTS})
    return path


def graph_summary(path: Path) -> dict:
    """Node counts that tell the fused pooler apart from torchvision's lowering."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    counts: dict = {}
    for n in m.graph.node:
        key = f"{n.domain or 'ai.onnx'}::{n.op_type}"
        counts[key] = counts.get(key, 0) + 1
    return dict(outputs=[o.name for o in m.graph.output], nodes=len(m.graph.node), counts=counts)


def match_detections(got: dict, want: dict) -> np.ndarray:
    """For each of ``want``'s detections, the index of ``got``'s with the same label and the nearest box
    (one to one). Scores a hair apart may swap places between two backends; matching ignores the order."""
    order = np.full(len(want["scores"]), -1)
    free = np.ones(len(got["scores"]), bool)
    for i in np.argsort(-want["scores"], kind="stable"):
        cand = np.nonzero(free & (got["labels"] == want["labels"][i]))[0]
        if cand.size == 0:
            raise AssertionError(f"detection {i} (label {want['labels'][i]}, box {want['boxes'][i]}) has no partner")
        j = cand[np.argmin(np.abs(got["boxes"][cand] - want["boxes"][i]).max(axis=1))]
        order[i] = j
        free[j] = False
    return order


def check_detections(got: dict, want: dict, box_atol: float, score_atol: float) -> dict:
    """ORT vs eager: the same number of detections, each matched (same label, nearest box) with its box within
    ``box_atol`` pixels and its score within ``score_atol``. Returns the largest differences."""
    n_got, n_want = len(got["scores"]), len(want["scores"])
    if n_got != n_want:
        raise AssertionError(f"detections: ORT found {n_got}, eager {n_want}")
    j = match_detections(got, want)
    box = float(np.abs(got["boxes"][j] - want["boxes"]).max()) if n_got else 0.0
    score = float(np.abs(got["scores"][j] - want["scores"]).max()) if n_got else 0.0
    if box > box_atol or score > score_atol:
        raise AssertionError(f"boxes differ by {box:.3g} px (atol {box_atol}), scores by {score:.3g} "
                             f"(atol {score_atol})")
    return dict(detections=n_got, labels=int(len(np.unique(want["labels"]))), max_box_diff=box,
                max_score_diff=score, reordered=int((j != np.arange(n_got)).sum()))


def _dcnkit(*args, check=True, in_process=False, **kw):
    """``dcnkit ARGS``: in a subprocess, or in this process (``dcnkit.cli.main``, the same code, without paying
    for a second interpreter's imports)."""
    print("$ dcnkit " + " ".join(map(str, args)), flush=True)
    if in_process:
        from dcnkit import cli

        rc = cli.main([str(a) for a in args])
        if check and rc != 0:
            raise RuntimeError(f"dcnkit {args[0]} failed (rc {rc})")
        return rc
    cmd = [sys.executable, "-m", "dcnkit", *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.stdout.strip():
        print(p.stdout.rstrip())
    if check and p.returncode != 0:
        raise RuntimeError(f"dcnkit {args[0]} failed (rc {p.returncode}): {p.stderr.strip()[-2000:]}")
    return p


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_and_query(path: Path, image: np.ndarray, timeout: float = 120.0, name: str = "frcnn",
                    input_name: str = "images") -> dict:
    """Starts ``dcnkit serve`` on a free port, sends the image as a v2 (KServe / Triton) JSON request, returns
    the outputs by name and stops the server (served as model ``name``)."""
    port = _free_port()
    cmd = [sys.executable, "-m", "dcnkit", "serve", str(path), "--port", str(port), "--name", name,
           "--log-level", "warning"]
    print(f"$ dcnkit serve {path} --port {port} --name {name}", flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"dcnkit serve exited with {proc.returncode}: {proc.stdout.read()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{base}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("dcnkit serve did not become ready")
            time.sleep(0.3)
        body = json.dumps({"inputs": [{"name": input_name, "shape": list(image.shape), "datatype": "FP32",
                                       "data": image.ravel().tolist()}]}).encode()
        req = urllib.request.Request(f"{base}/v2/models/{name}/infer", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            reply = json.load(r)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover
            proc.kill()
    dtypes = {"FP32": np.float32, "INT64": np.int64}
    return {o["name"]: np.asarray(o["data"], dtype=dtypes[o["datatype"]]).reshape(o["shape"]) for o in reply["outputs"]}


def cli_checks(path: Path, image: np.ndarray, want: dict, out: Path, box_atol: float = 0.05,
               score_atol: float = 5e-4, compare_reference: bool = False, name: str = "frcnn") -> dict:
    """``dcnkit run`` (and ``dcnkit compare`` against the NumPy reference when asked) and ``dcnkit serve`` (model
    ``name``) on the exported detector; their detections checked against eager ``want``."""
    report = {}
    inputs = out / "image.npz"
    np.savez(inputs, images=image)
    dets = out / "detections.npz"
    _dcnkit("run", path, "--inputs", inputs, "-o", dets, in_process=True)
    with np.load(dets) as d:
        report["cli_run"] = check_detections({k: d[k] for k in OUTPUTS}, want, box_atol, score_atol)
    if compare_reference:
        # Per-output tolerances: pixels for boxes, probabilities for scores; exit code 1 (an error here) on a
        # mismatch.
        _dcnkit("compare", path, "--inputs", inputs, "--backends", "ort-cpu,reference", "--atol", "1e-4",
                "--atol", f"boxes:{box_atol}", "--rtol", "scores:1e-3", in_process=True)
        report["compare"] = "PASSED"
    report["serve"] = check_detections(serve_and_query(path, image, name=name), want, box_atol, score_atol)
    print(f"dcnkit serve vs eager: {report['serve']}")
    return report


def detector_parser(doc: str, out: str, image_seed: int) -> argparse.ArgumentParser:
    """The command line the detector examples share (``out``: the default output folder)."""
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(out), help="folder for the models and arrays")
    p.add_argument("--image-size", type=int, default=256)
    p.add_argument("--seed", type=int, default=0, help="seed of the detector's weights")
    p.add_argument("--image-seed", type=int, default=image_seed, help="seed of the synthetic image")
    p.add_argument("--box-atol", type=float, default=0.05, help="pixels (default 0.05)")
    p.add_argument("--score-atol", type=float, default=5e-4)
    p.add_argument("--skip-cli", action="store_true", help="skip dcnkit run / compare / serve")
    p.add_argument("--compare-reference", action="store_true",
                   help="also dcnkit compare ort-cpu against the (slow) NumPy reference backend")
    return p


def ort_detections(model, image: np.ndarray) -> dict:
    """The detections of ONNX Runtime on the CPU for ``image``; ``model``: a path or a session."""
    if isinstance(model, (str, Path)):
        from dcnkit.runtime import ort_session

        model = ort_session(str(model), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in model.get_outputs()], model.run(None, {"images": image})))


def main(argv=None) -> int:
    p = detector_parser(__doc__, "faster_rcnn_dcn", IMAGE_SEED)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    model = build(args.image_size, args.seed)
    image = make_image(args.image_size, args.image_seed)
    t0 = time.perf_counter()
    want = eager_detections(model, image)
    print(f"eager: {len(want['scores'])} detections ({time.perf_counter() - t0:.2f} s)")
    path = export(model, image, args.out / "faster_rcnn_dcn.onnx")
    summary = graph_summary(path)
    fused = summary["counts"].get("dcnkit::MultiLevelRoIAlign", 0)
    print(f"exported {path}: outputs {summary['outputs']}, {summary['nodes']} nodes, {fused} MultiLevelRoIAlign, "
          f"{summary['counts'].get('ai.onnx::ScatterElements', 0)} ScatterElements, "
          f"{summary['counts'].get('ai.onnx::DeformConv', 0) + summary['counts'].get('dcnkit::DeformConv2d', 0)} "
          "deformable convolutions")

    report = dict(summary=summary, ort=check_detections(ort_detections(path, image), want, args.box_atol,
                                                        args.score_atol))
    print(f"ONNX Runtime vs eager: {report['ort']}")

    if not args.skip_cli:
        report.update(cli_checks(path, image, want, args.out, args.box_atol, args.score_atol,
                                 compare_reference=args.compare_reference))
    (args.out / "report.json").write_text(json.dumps(report, indent=2))
    print("PASSED: ONNX Runtime's detections equal eager PyTorch's")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    sys.exit(main())
