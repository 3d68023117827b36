"""One GPU run, every figure of issue 25 item 7, one JSON and one Markdown table, the model beside each figure.

    python benchmarks/gpu_report.py [--out build/gpu-report] [--repeat 10]     # on a machine with a GPU (.ci/gpu)
    python benchmarks/gpu_report.py --dry-run                                 # anywhere: the plan and the model

Measured (interleaved rounds, the fastest counts; benchmarks/_common.py):
* DCN (DCNv2 3x3, C_out = C) forward and forward+backward vs torchvision in float32, float16 and bfloat16 at
  (1,64,64,64), (4,256,32,32), (8,32,128,128), and the peak extra memory of one call at each of them and of
  batches 1-8 of the first (benchmarks/bench_deform_conv2d.py);
* RoIAlign avg and max, forward and forward+backward, vs torchvision (benchmarks/bench_roi_align.py);
* the kit's ONNX Runtime CUDA DeformConv2d vs ONNX Runtime's built-in DeformConv, IO binding, TF32 off for float32,
  when onnxruntime has the CUDA execution provider (benchmarks/bench_ort_deform_conv.py);
* the TensorRT plugins' enqueue on device buffers, driven without TensorRT by the host lifecycle harness and checked
  against the torch op: a pass/fail row per plugin and type (scripts/check_trt_enqueue.py).
Beside each time: the target of issue 25 (ratio to the baseline) and the model's prediction (benchmarks/gpu_model.py;
SASS per element from scripts/kernel_report.py when nvcc and cuobjdump are here). A part whose dependency is absent
is one "skip" line. Writes report.json and report.md under --out.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gpu_model as M  # noqa: E402

sys.path.insert(0, str(HERE.parent / "scripts"))
import check_trt_enqueue as TRT  # noqa: E402

DCN_SHAPES = [(1, 64, 64, 64), (4, 256, 32, 32), (8, 32, 128, 128)]
DCN_DTYPES = ["float32", "float16", "bfloat16"]
MEMORY_KEYS = ("dcnkit_fwd_bytes", "torchvision_fwd_bytes", "dcnkit_fwdbwd_bytes", "torchvision_fwdbwd_bytes")
ROI = dict(num_rois=512, channels=256, pooled=7)  # bench_roi_align.py's case
# Targets (issue 25): time / baseline time at most this.
TARGETS = {"dcn fwd": 0.8, "dcn fwdbwd": 0.8, "dcn fwd (8,32,128,128)": 0.5, "roi": 0.8, "ort dcn": 0.8,
           "dcn memory": 1.0}


def _load(name: str, path: Path | None = None):
    """A script as a module, registered in sys.modules first (its dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, path or HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def model_sass(log, use_report: bool) -> dict:
    """SASS per element of the modelled kernels: the kernel report's where it runs, else the defaults."""
    sass = dict(M.DEFAULT_SASS)
    if not use_report:
        log("skip: kernel report (--no-kernel-report): the model uses its default SASS counts")
        return sass
    kr = _load("kernel_report", HERE.parent / "scripts" / "kernel_report.py")
    why = kr.missing_tools()
    if why:
        log(f"skip: kernel report ({why}): the model uses its default SASS counts")
        return sass
    src = kr.CORE / "src"
    kernels = kr.report([src / "deform_conv2d.cu", src / "roi_align.cu"], jobs=2)
    names = {"deform_conv2d_gather_kernel": "dcn_gather", "deform_conv2d_sampling_backward_kernel": "dcn_backward",
             "roi_align_plan_forward_kernel": "roi_align_forward"}
    found = set()
    for k in kernels:  # the slowest instantiation (avg / max, ...) of the float32 kernel
        key = names.get(k.name)
        if key and k.dtype == "float" and k.sass_per_element is not None:
            sass[key] = max(sass[key], k.sass_per_element) if key in found else k.sass_per_element
            found.add(key)
    log("model SASS per element: " + ", ".join(f"{k} {v:.0f}" + ("" if k in found else " (default)")
                                               for k, v in sass.items()))
    return sass


def row(group, case, dtype, ms, base_name, base_ms, target, model_ms):
    ratio = ms / base_ms if ms is not None and base_ms not in (None, 0) and base_ms == base_ms else None
    return {"group": group, "case": case, "dtype": dtype, "ms": ms, "baseline": base_name, "baseline_ms": base_ms,
            "ratio": ratio, "target": target, "meets": None if ratio is None else ratio <= target,
            "model_ms": model_ms}


def dcn_rows(measured: dict | None, sass: dict) -> list[dict]:
    rows = []
    by_key = {(tuple(r["shape"]), r["dtype"]): r for r in (measured or {}).get("rows", [])}
    for dt in DCN_DTYPES:
        for s in DCN_SHAPES:
            r = by_key.get((s, dt), {})
            for what, label in (("fwd", "forward"), ("fwdbwd", "forward+backward")):
                target = TARGETS["dcn fwd (8,32,128,128)"] if (what == "fwd" and s == (8, 32, 128, 128)) \
                    else TARGETS[f"dcn {what}"]
                base = "torchvision" + (" (no such dtype)" if "torchvision_unsupported" in r else "")
                rows.append(row("DCN", f"{s} {label}", dt, r.get(f"dcnkit_{what}_ms"), base,
                                r.get(f"torchvision_{what}_ms"), target,
                                M.dcn_ms(s, dt, sass, backward=what == "fwdbwd")))
    return rows


def roi_rows(measured: dict | None, sass: dict) -> list[dict]:
    rows = []
    by_case = {r["case"]: r for r in (measured or {}).get("rows", [])}
    for mode in ("avg", "max"):
        for label, bwd in (("forward", False), ("forward+backward", True)):
            r = by_case.get(f"roi_align {mode} {label}", {})
            tv = r.get("torchvision_ms")
            rows.append(row("RoIAlign", f"{mode} {label}", "float32", r.get("dcnkit_ms"), "torchvision",
                            None if tv != tv else tv, TARGETS["roi"],
                            M.roi_align_ms(ROI["num_rois"], ROI["channels"], ROI["pooled"], "float32", sass, bwd)))
    return rows


def ort_rows(measured: list | None, sass: dict) -> list[dict]:
    return [row("ORT CUDA", f"DeformConv2d {tuple(r['shape'])}", "float32", r["ms"]["kit"], "ORT DeformConv",
                r["ms"]["built-in"], TARGETS["ort dcn"], M.dcn_ms(tuple(r["shape"]), "float32", sass))
            for r in (measured or [])]


def dcn_memory_rows(measure) -> list[dict]:
    """Peak extra memory of one DCN call per benchmark shape and dtype, dcnkit vs torchvision; ``measure(shape,
    dtype)`` gives bench_deform_conv2d.py's memory row of that shape (its batch) or None. Target: fwd+bwd <= 1x."""
    rows = []
    for dt in DCN_DTYPES:
        for s in DCN_SHAPES:
            m = measure(s, dt) or {}
            r = {"shape": list(s), "dtype": dt, "target": TARGETS["dcn memory"]}
            for k in MEMORY_KEYS:
                r[k] = m.get(k)
            mine, base = r["dcnkit_fwdbwd_bytes"], r["torchvision_fwdbwd_bytes"]
            r["ratio"] = mine / base if mine is not None and base else None
            r["meets"] = None if r["ratio"] is None else r["ratio"] <= r["target"]
            rows.append(r)
    return rows


def _mib_cells(m: dict) -> str:
    """dcnkit's and torchvision's fwd and fwd+bwd peak bytes of a memory row, in MiB ("-": not measured)."""
    return " | ".join("-" if m.get(k) is None else f"{m[k] / 2**20:.1f}" for k in MEMORY_KEYS)


def markdown(rows: list[dict], memory: dict | None, notes: list[str], trt: list[dict] | None = None,
             shape_memory: list[dict] | None = None) -> str:
    def f(v, spec=".3f"):
        return "-" if v is None else format(v, spec)

    out = ["| group | case | dtype | ms | baseline | baseline ms | ratio | target | met | model ms |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        met = "-" if r["meets"] is None else ("yes" if r["meets"] else "no")
        out.append(f"| {r['group']} | {r['case']} | {r['dtype']} | {f(r['ms'])} | {r['baseline']} | "
                   f"{f(r['baseline_ms'])} | {f(r['ratio'], '.2f')} | <= {r['target']} | {met} | {f(r['model_ms'])} |")
    if memory:
        out += ["", f"Peak extra memory of one call (MiB), float32, shape (N, {', '.join(map(str, memory['shape'][1:]))})",
                "", "| N | dcnkit fwd | torchvision fwd | dcnkit fwd+bwd | torchvision fwd+bwd |", "|---|---|---|---|---|"]
        for m in memory["rows"]:
            out.append(f"| {m['batch']} | {_mib_cells(m)} |")
    if shape_memory:
        out += ["", "DCN peak extra memory of one call (MiB) at the benchmark shapes (target: fwd+bwd <= "
                "torchvision's)", "", "| shape | dtype | dcnkit fwd | torchvision fwd | dcnkit fwd+bwd | "
                "torchvision fwd+bwd | ratio | met |", "|---|---|---|---|---|---|---|---|"]
        for m in shape_memory:
            met = "-" if m["meets"] is None else ("yes" if m["meets"] else "no")
            out.append(f"| {tuple(m['shape'])} | {m['dtype']} | {_mib_cells(m)} | {f(m['ratio'], '.2f')} | {met} |")
    if trt:
        out += ["", "TensorRT plugins' enqueue on device buffers (host lifecycle harness, no TensorRT) vs the torch op",
                "", TRT.table(trt).rstrip()]
    return "\n".join(out + [""] + [f"* {n}" for n in notes]) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="build/gpu-report", help="folder for report.json and report.md")
    ap.add_argument("--repeat", type=int, default=10, help="timed rounds per case (default 10)")
    ap.add_argument("--dry-run", action="store_true", help="measure nothing: the plan, the model and the tables")
    ap.add_argument("--no-kernel-report", action="store_true", help="model with the default SASS counts")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []

    def log(msg):
        print(f"[gpu-report] {msg}", flush=True)
        if msg.startswith("skip"):
            notes.append(msg)

    t0 = time.time()
    sass = model_sass(log, not args.no_kernel_report)
    dcn = roi = ort = None
    device = "none (dry run)"
    shape_memory = dcn_memory_rows(lambda s, dt: None)
    if args.dry_run:
        log("skip: measurements (--dry-run)")
    else:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("gpu_report: expected a CUDA device, got none (torch.cuda.is_available() is False); "
                             "use --dry-run")
        device = torch.cuda.get_device_name(0)
        common = ["--device", "cuda", "--repeat", str(args.repeat), "--warmup", "3"]
        log("DCN: benchmarks/bench_deform_conv2d.py (float32, float16, bfloat16)")
        dcn = _load("bench_deform_conv2d").main(common + ["--dtypes", ",".join(DCN_DTYPES), "--json",
                                                          str(out / "bench_deform_conv2d.json")])
        log("DCN peak memory per benchmark shape and dtype (one child process each)")
        bench = _load("bench_deform_conv2d")
        shape_memory = dcn_memory_rows(lambda s, dt: (bench.measure_memory(s, dt, "cuda", [s[0]], False,
                                                                           torch.get_num_threads()) or [None])[0])
        log("RoIAlign: benchmarks/bench_roi_align.py")
        roi = _load("bench_roi_align").main(common + ["--json", str(out / "bench_roi_align.json")])
        import onnxruntime as ort_mod

        if "CUDAExecutionProvider" in ort_mod.get_available_providers():
            log("ORT CUDA: benchmarks/bench_ort_deform_conv.py (IO binding, TF32 off)")
            ort = _load("bench_ort_deform_conv").main(common + ["--json", str(out / "bench_ort_deform_conv.json")])
        else:
            log("skip: ORT CUDA DeformConv2d vs built-in (onnxruntime has no CUDAExecutionProvider)")
    trt = None
    if args.dry_run:
        log("skip: TensorRT plugins' enqueue on device buffers (--dry-run)")
    else:
        log("TensorRT plugins' enqueue on device buffers, no TensorRT: scripts/check_trt_enqueue.py")
        try:
            trt = TRT.run(log=log)
        except Exception as e:  # the harness did not build or run: one failed row, the other figures stay
            log(f"TensorRT enqueue harness: {type(e).__name__}: {e}")
            trt = [{"plugin": "(harness)", "dtype": "-", "max_err": None, "allowed": None, "passed": False,
                    "note": (str(e).splitlines() or [type(e).__name__])[0]}]
    rows = dcn_rows(dcn, sass) + roi_rows(roi, sass) + ort_rows(ort, sass)
    notes.insert(0, f"device: {device}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
                    f"fastest of {args.repeat} interleaved rounds; model: benchmarks/gpu_model.py (kernel time only)")
    report = {"device": device, "seconds": round(time.time() - t0, 1), "model_sass": sass, "rows": rows,
              "memory": (dcn or {}).get("memory"), "dcn_memory": shape_memory, "tensorrt_enqueue": trt,
              "notes": notes}
    (out / "report.json").write_text(json.dumps(report, indent=1))
    md = markdown(rows, report["memory"], notes, trt, shape_memory)
    (out / "report.md").write_text(md)
    print(md)
    log(f"wrote {out / 'report.json'} and {out / 'report.md'} in {report['seconds']} s")
    return report


if __name__ == "__main__":
    main()
