"""Benchmark: a deformable Faster R-CNN (torchvision ``fasterrcnn_resnet50_fpn``, DCNv2 in layer3-4) in ONNX
Runtime on the CPU with the fused ``dcnkit::MultiLevelRoIAlign`` pooler vs the same detector with torchvision's
pooler (four ``RoiAlign`` + gathers + ``ScatterElements``) vs PyTorch eager (the fused model), in one run.

    python benchmarks/bench_detector.py [--threads 2] [--rounds 15] [--image-size 512] [--json out.json]

Same weights in all three (one seed). The detections of the three are checked against each other first. Then
``--rounds`` interleaved rounds run each variant once per round (after warm-up); a variant's time is its
fastest run. The detector is the example's (examples/faster_rcnn_dcn.py) at a larger image and torchvision's
default proposal count. Prints milliseconds and the ratios fused / torchvision-pooler ORT and fused ORT / eager
(targets of issue 13: <= 0.7 and <= 0.8), plus where ORT's time goes (per-op profile of one run) for the two
ORT variants.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402


def _profile(path: str, feeds: dict, threads: int) -> dict:
    """Milliseconds per op type of one run (ORT profiler), largest first."""
    from dcnkit.runtime import ort_session

    d = tempfile.mkdtemp()
    sess = ort_session(path, providers=["CPUExecutionProvider"], intra_op_num_threads=threads,
                       inter_op_num_threads=1, enable_profiling=True, profile_file_prefix=os.path.join(d, "p"))
    sess.run(None, feeds)
    sess.run(None, feeds)
    prof = sess.end_profiling()
    events = json.load(open(prof))
    # The second run's nodes only: events after the first "model_run".
    runs = [e for e in events if e.get("name") == "model_run"]
    t_from = runs[-1]["ts"] if runs else 0
    per: dict = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= t_from:
            op = e.get("args", {}).get("op_name", "?")
            per[op] = per.get(op, 0.0) + e["dur"] / 1e3
    return dict(sorted(per.items(), key=lambda kv: -kv[1]))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--image-size", type=int, default=512)
    ap.add_argument("--rpn-top-n", type=int, default=1000, help="proposals per image (torchvision's default 1000)")
    ap.add_argument("--json", help="also write the results to this file")
    C.add_no_spin_arg(ap)
    args = ap.parse_args(argv)
    no_spin = C.no_spin_options(args)

    import onnxruntime as ort
    import torch

    import faster_rcnn_dcn as ex
    from dcnkit.runtime import ort_session

    torch.set_num_threads(args.threads)
    image = ex.make_image(args.image_size, ex.IMAGE_SEED)
    kw = dict(image_size=args.image_size, rpn_top_n=args.rpn_top_n)
    fused = ex.build(fused=True, **kw)
    tv = ex.build(fused=False, **kw)
    out = Path(tempfile.mkdtemp())
    p_fused = str(ex.export(fused, image, out / "fused.onnx"))
    p_tv = str(ex.export(tv, image, out / "tv.onnx"))
    counts = {k: ex.graph_summary(Path(p))["counts"] for k, p in (("fused", p_fused), ("tv", p_tv))}
    opts = dict(providers=["CPUExecutionProvider"], intra_op_num_threads=args.threads, inter_op_num_threads=1,
                **no_spin)
    s_fused, s_tv = ort_session(p_fused, **opts), ort_session(p_tv, **opts)
    feeds = {"images": image}
    x = torch.from_numpy(image)

    def run_eager():
        with torch.inference_mode():
            return fused([x[0]])

    want = ex.eager_detections(fused, image)
    for name, sess in (("fused ORT", s_fused), ("torchvision-pooler ORT", s_tv)):
        got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        try:
            print(f"{name} vs eager: {ex.check_detections(got, want, 0.05, 5e-4)}")
        except AssertionError as e:  # timing is still meaningful; correctness is tests/test_faster_rcnn_dcn.py's
            print(f"{name} vs eager: differs beyond the example's tolerances: {e}")

    variants = {"fused_ort": lambda: s_fused.run(None, feeds), "tv_pooler_ort": lambda: s_tv.run(None, feeds),
                "eager": run_eager}
    for fn in variants.values():
        for _ in range(args.warmup):
            fn()
    times: dict = {k: [] for k in variants}
    for _ in range(args.rounds):
        for k, fn in variants.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    best = {k: min(v) * 1e3 for k, v in times.items()}
    res = dict(
        machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs visible",
        onnxruntime=ort.__version__, torch=torch.__version__, threads=args.threads, image_size=args.image_size,
        rpn_top_n=args.rpn_top_n, rounds=args.rounds, detections=int(len(want["scores"])),
        ms=best, fused_over_tv_pooler=best["fused_ort"] / best["tv_pooler_ort"],
        fused_over_eager=best["fused_ort"] / best["eager"],
        nodes={k: dict(MultiLevelRoIAlign=c.get("dcnkit::MultiLevelRoIAlign", 0),
                       RoiAlign=c.get("ai.onnx::RoiAlign", 0), ScatterElements=c.get("ai.onnx::ScatterElements", 0))
               for k, c in counts.items()},
    )
    print(f"onnxruntime {res['onnxruntime']}, torch {res['torch']}, {args.threads} threads, image 1x3x"
          f"{args.image_size}x{args.image_size}, {args.rpn_top_n} proposals, {res['detections']} detections, "
          f"fastest of {args.rounds} interleaved runs")
    print(f"{'variant':<28} {'ms':>9}")
    for k, label in (("fused_ort", "ORT, fused pooler"), ("tv_pooler_ort", "ORT, torchvision's pooler"),
                     ("eager", "PyTorch eager (fused)")):
        print(f"{label:<28} {best[k]:9.1f}")
    print(f"fused / torchvision-pooler ORT: {res['fused_over_tv_pooler']:.2f} (target <= 0.70)")
    print(f"fused ORT / eager:              {res['fused_over_eager']:.2f} (target <= 0.80)")
    for k, p in (("fused", p_fused), ("tv", p_tv)):
        prof = _profile(p, feeds, args.threads)
        res.setdefault("profile_ms", {})[k] = prof
        top = ", ".join(f"{op} {ms:.1f}" for op, ms in list(prof.items())[:6])
        print(f"profile {k}: {top} (ms, one run)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    main()
