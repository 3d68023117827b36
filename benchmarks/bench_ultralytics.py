"""Benchmark: Ultralytics RT-DETR exported after ``dcnkit.integrations.ultralytics.patch`` (kit MSDA nodes) against
Ultralytics' plain export (GridSample chains), in ONNX Runtime and OpenVINO, interleaved in one run.

    python benchmarks/bench_ultralytics.py [--yaml rtdetr-l.yaml] [--sizes 320,640] [--threads 2] [--repeat 20]
        [--json out.json]

Per image size, both files come from Ultralytics' own ``export(format="onnx")`` of one model (random weights from
the yaml, no download). ONNX Runtime: the patched file with the kit's library, the plain one on plain ONNX Runtime,
``--threads`` intra-op threads, spinning off (``session.intra_op.allow_spinning`` 0: the sessions are timed in turn).
OpenVINO: both through ``backend="openvino"`` (the kit's extension; f32). After ``--warmup`` rounds every variant runs
once per round for ``--repeat`` rounds; a variant's time is its fastest round. Prints ms and the ratio patched /
plain per runtime and size, and the load average at the start and the end.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--yaml", default="rtdetr-l.yaml")
    ap.add_argument("--sizes", default="320,640")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    os.environ.setdefault("YOLO_OFFLINE", "1")
    os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp(prefix="dcnkit-yolo-"))
    import numpy as np
    import torch
    from ultralytics import RTDETR

    import dcnkit.integrations.ultralytics as dku
    from dcnkit.runtime import ort_session
    from dcnkit.runtime.registry import make_runner

    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    result = {"rows": []}
    no_spin = {"session.intra_op.allow_spinning": "0", "session.inter_op.allow_spinning": "0"}
    with tempfile.TemporaryDirectory(prefix="dcnkit-bench-ul-") as tmp:
        torch.manual_seed(0)
        model = RTDETR(args.yaml)
        for size in (int(s) for s in args.sizes.split(",")):
            plain = shutil.move(model.export(format="onnx", imgsz=size), Path(tmp) / f"plain{size}.onnx")
            dku.patch(model)
            patched = shutil.move(model.export(format="onnx", imgsz=size), Path(tmp) / f"patched{size}.onnx")
            dku.unpatch(model)
            feeds = {"images": np.random.default_rng(0).random((1, 3, size, size), dtype=np.float32)}
            opts = dict(intra_op_num_threads=args.threads, inter_op_num_threads=1, session_config=no_spin)
            sessions = {"ort plain": ort_session(str(plain), **opts), "ort patched": ort_session(str(patched), **opts)}
            fns = {k: (lambda s=s: s.run(None, feeds)) for k, s in sessions.items()}
            runners = []
            try:
                for name, path in (("openvino plain", plain), ("openvino patched", patched)):
                    runners.append(make_runner(str(path), "openvino", num_threads=args.threads))
                    fns[name] = lambda r=runners[-1]: r.run(feeds)
            except Exception as e:  # noqa: BLE001 - the openvino extra is optional
                print(f"skip: OpenVINO ({type(e).__name__}: {str(e).splitlines()[0][:100]})")
            best = C.interleaved(fns, args.repeat, args.warmup)
            for r in runners:
                r.close()
            for rt in ("ort", "openvino"):
                if f"{rt} plain" in best:
                    row = {"size": size, "runtime": rt, "plain_ms": best[f"{rt} plain"],
                           "patched_ms": best[f"{rt} patched"]}
                    row["ratio"] = row["patched_ms"] / row["plain_ms"]
                    result["rows"].append(row)
    C.print_table(["size", "runtime", "plain ms", "patched ms", "patched / plain"],
                  [[r["size"], r["runtime"], f"{r['plain_ms']:.1f}", f"{r['patched_ms']:.1f}", f"{r['ratio']:.2f}"]
                   for r in result["rows"]])
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    C.write_json(args, result)
    return result


if __name__ == "__main__":
    main()
