"""Ultralytics RT-DETR on the kit's deformable attention, end to end (docs/ultralytics.md).

    python examples/ultralytics_rt_detr.py [--yaml rtdetr-l.yaml] [--imgsz 320] [--out ultralytics-rtdetr]

Builds RT-DETR from its yaml (random weights: no download), exports it with Ultralytics' own exporter twice (as it
is, and after ``dcnkit.integrations.ultralytics.patch(model)``), fuses the plain export with ``dcnkit fuse-msda``,
and runs the three files on the same image in ONNX Runtime (the kit's library) and on OpenVINO (the kit's
extension), printing the GridSample and kit-node counts and the largest difference from the plain export's
detections (rows compared in sorted order: random weights tie scores). Last, Ultralytics' own ``predict`` runs the
patched file after ``patch()``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

os.environ.setdefault("YOLO_OFFLINE", "1")


def rows(y: np.ndarray) -> np.ndarray:
    y = y.reshape(-1, y.shape[-1])
    return y[np.lexsort(y.T[::-1])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--yaml", default="rtdetr-l.yaml")
    ap.add_argument("--imgsz", type=int, default=320)
    ap.add_argument("--out", default="ultralytics-rtdetr")
    args = ap.parse_args(argv)
    os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp(prefix="dcnkit-yolo-"))
    import onnx
    import onnxruntime as ort
    import torch
    from ultralytics import RTDETR

    import dcnkit.integrations.ultralytics as dku
    from dcnkit.export.fuse_msda import fuse_msda
    from dcnkit.runtime import ort_session
    from dcnkit.runtime.registry import make_runner

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = RTDETR(args.yaml)
    plain = Path(shutil.move(model.export(format="onnx", imgsz=args.imgsz), out / "plain.onnx"))
    print(f"patched: {len(dku.patch(model))} attention modules on the kit's op")
    patched = Path(shutil.move(model.export(format="onnx", imgsz=args.imgsz), out / "patched.onnx"))
    fused_model, report = fuse_msda(onnx.load(str(plain)))
    print("\n".join(report.lines()))
    fused = out / "fused.onnx"
    onnx.save(fused_model, str(fused))

    x = np.random.default_rng(0).random((1, 3, args.imgsz, args.imgsz), dtype=np.float32)
    want = rows(ort.InferenceSession(str(plain), providers=["CPUExecutionProvider"]).run(None, {"images": x})[0])
    for path in (plain, patched, fused):
        ops = [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]
        line = f"{path.name:12} GridSample {ops.count('GridSample'):2}  kit MSDA {ops.count('MultiScaleDeformableAttention')}"
        line += f"  ORT |diff| {np.abs(rows(ort_session(str(path)).run(None, {'images': x})[0]) - want).max():.2e}"
        try:
            with make_runner(str(path), "openvino") as r:
                line += f"  OpenVINO |diff| {np.abs(rows(next(iter(r.run({'images': x}).values()))) - want).max():.2e}"
        except Exception as e:  # noqa: BLE001 - the openvino extra is optional
            line += f"  OpenVINO: {type(e).__name__}: {str(e).splitlines()[0][:80]}"
        print(line)

    img = (np.random.default_rng(1).random((240, 320, 3)) * 255).astype(np.uint8)
    (res,) = RTDETR(str(patched)).predict(img, imgsz=args.imgsz, verbose=False)
    print(f"Ultralytics' predict on {patched.name}: {len(res.boxes)} boxes above its confidence threshold")
    dku.unpatch(model)
    dku.unpatch()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
