"""The TensorRT plugins' enqueue on real device buffers, without TensorRT, checked against the torch op.

    python scripts/check_trt_enqueue.py                 # on a machine with a GPU (.ci/gpu, benchmarks/gpu_report.py)
    python scripts/check_trt_enqueue.py --plan          # anywhere: the host half (fields, shapes, workspace) only

Every plugin kind (DeformConv2d v1 / v2, RoIAlign avg / max, DeformRoIPool, DeformPSRoIPool, MultiLevelRoIAlign,
MultiScaleDeformableAttention with int64 and int32 level tables, DCNv3, DCNv4), and the same nodes under mmdeploy's and
InternImage's names (MMCVDeformConv2d, MMCVModulatedDeformConv2d, MMCVRoiAlign, MMCVDeformRoIPool,
MMCVMultiLevelRoiAlign, MMCVMultiScaleDeformableAttention, TRTDCNv3), in float32, float16 and bfloat16 (RoIs in
float32 next to float16 features, in the features' type next to bfloat16 ones; one RoI with an out-of-range batch
index, which gives zeros). The inputs are drawn here, in the
plugin's type, and written as raw files with a manifest; tests/cpp/tensorrt_enqueue_cuda.cpp (compiled here with
g++ against TensorRT's headers and libcudart) drives libdcnkit_trt.so through the plugin lifecycle as TensorRT does
and enqueues each case on a CUDA stream; its outputs are compared with dcnkit's torch op on the CPU in float64 on
the same (rounded) inputs. Prints one row per case and exits 1 on a mismatch; exit 0 with one "skip" line when a
dependency (TensorRT headers, the plugin library, CUDA, a GPU) is absent.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "tests" / "cpp" / "tensorrt_enqueue_cuda.cpp"
DTYPES = ("float32", "float16", "bfloat16")
# Largest |got - want| / max(1, max |want|) allowed per plugin type. The kit's own CPU ops run in float16 / bfloat16
# on these cases (float16 RoIs too) stay within 6.0e-3 / 3.4e-3 of the float64 results (2026-11-25).
TOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}


class Skip(Exception):
    """A dependency of the device run is absent (the message says which)."""


def trt_include() -> Path | None:
    """TensorRT headers as the build finds them (TensorRT_INCLUDE_DIR / TensorRT_ROOT, then the usual places)."""
    cands = [os.environ.get("TensorRT_INCLUDE_DIR", "")]
    if os.environ.get("TensorRT_ROOT"):
        cands.append(os.path.join(os.environ["TensorRT_ROOT"], "include"))
    cands += ["/usr/include/x86_64-linux-gnu", "/usr/local/TensorRT/include", "/opt/tensorrt/include", "/usr/include"]
    return next((Path(c) for c in cands if c and (Path(c) / "NvInferRuntime.h").is_file()), None)


def cuda_home() -> Path:
    return Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))


def build_harness(out_dir: Path) -> Path:
    """Compiles the harness; raises Skip naming what is missing."""
    cxx = shutil.which("g++") or shutil.which("c++")
    inc, cuda = trt_include(), cuda_home()
    libdirs = [d for d in [cuda / "lib64"] + [cuda / "targets" / t / "lib" for t in ("x86_64-linux", "sbsa-linux")]
               if (d / "libcudart.so").exists()]
    if inc is None:
        raise Skip("no TensorRT headers (set TensorRT_INCLUDE_DIR)")
    if cxx is None or not (cuda / "include" / "cuda_runtime_api.h").is_file() or not libdirs:
        raise Skip(f"needs a C++ compiler and CUDA's headers and libcudart under {cuda} (set CUDA_HOME)")
    exe = out_dir / "tensorrt_enqueue_cuda"
    # -Wno-unused-function: the shared host stand-ins (tensorrt_test_support.h) have helpers this program does not use.
    cmd = [cxx, "-std=c++17", "-O1", "-Wall", "-Wno-deprecated-declarations", "-Wno-unused-function", "-isystem",
           str(inc), "-isystem",
           str(cuda / "include"), str(HARNESS), f"-L{libdirs[0]}", f"-Wl,-rpath,{libdirs[0]}", "-lcudart", "-ldl",
           "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"compiling {HARNESS.name} failed:\n{r.stderr}")
    return exe


def plugin_library() -> Path:
    import dcnkit

    try:
        return dcnkit.find_library("dcnkit_trt")
    except FileNotFoundError as e:
        raise Skip(f"libdcnkit_trt.so was not built ({e})") from None


@dataclass
class Case:
    label: str
    plugin: str
    ns: str
    dtype: str
    fields: list  # (name, "i32" | "f32" | "str", values)
    inputs: list  # torch tensors, node order, in the types the plugin gets
    op: Callable  # the torch op over the node's inputs: a list of outputs
    expected: list = field(default_factory=list)  # the op in float64 on the inputs, one tensor per output

    def __post_init__(self):
        self.expected = self.op(*[x.double() if x.is_floating_point() else x for x in self.inputs])


def _rois(g, k, n, h, w, dtype):
    """k RoIs [b, x1, y1, x2, y2] inside an h x w image, then one whose batch index is n (out of range: zeros)."""
    import torch

    b = torch.randint(0, n, (k, 1), generator=g).double()
    x = (torch.rand(k, 2, generator=g, dtype=torch.float64) * (w - 1)).sort(1).values
    y = (torch.rand(k, 2, generator=g, dtype=torch.float64) * (h - 1)).sort(1).values
    r = torch.cat([b, x[:, :1], y[:, :1], x[:, 1:], y[:, 1:]], 1)
    return torch.cat([r, torch.tensor([[n, 1.0, 1.0, 3.0, 3.0]], dtype=torch.float64)]).to(dtype)


def _valid_rows(fn, rois, n, *per_roi):
    """fn over the RoIs with a batch index in [0, n) (and the matching rows of per-RoI tensors), zeros elsewhere
    (what the CUDA kernels give such a RoI; the torch op on the CPU refuses it)."""
    import torch

    ok = (rois[:, 0] >= 0) & (rois[:, 0] < n)
    got = fn(rois[ok].to(per_roi[0].dtype) if per_roi else rois[ok], *[t[ok] for t in per_roi])
    outs = []
    for x in (got if isinstance(got, tuple) else (got,)):
        full = torch.zeros((rois.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype)
        full[ok] = x
        outs.append(full)
    return outs


def cases(dtype: str, seed: int = 0) -> list[Case]:
    """Every plugin kind in `dtype`, with the torch op that gives its expected outputs."""
    import torch

    from dcnkit import ops

    g = torch.Generator().manual_seed(seed)
    t = getattr(torch, dtype)
    rt = torch.float32 if dtype == "float16" else t  # the RoIs' type: float32 next to float16 features

    def rnd(*shape, scale=1.0, uniform=False):
        x = torch.rand(*shape, generator=g) if uniform else torch.randn(*shape, generator=g) * scale
        return x.to(t)

    out = []
    n, c, h, w = 2, 8, 12, 10
    x, off, mask = rnd(n, c, h, w), rnd(n, 36, h, w, scale=1.5), rnd(n, 18, h, w, uniform=True)
    wt, bias = rnd(6, c, 3, 3, scale=0.2), rnd(6)
    conv = [("stride", "i32", [1, 1]), ("padding", "i32", [1, 1]), ("dilation", "i32", [1, 1]), ("groups", "i32", [1])]
    out.append(Case("DeformConv2d-v2", "DeformConv2d", "dcnkit", dtype, conv + [("deformable_groups", "i32", [2])],
                    [x, off, wt, bias, mask], lambda x, o, w, b, m: [ops.deform_conv2d(x, o, w, b, 1, 1, 1, m)]))
    # DCNv1 (no mask), stride 2, two weight groups: offsets (N, 2*9, 6, 5); mmcv's node has no bias.
    v1 = [("stride", "i32", [2, 2]), ("padding", "i32", [1, 1]), ("dilation", "i32", [1, 1]), ("groups", "i32", [2])]
    off1, wt1 = rnd(n, 18, 6, 5, scale=1.5), rnd(6, c // 2, 3, 3, scale=0.2)
    out.append(Case("DeformConv2d-v1", "DeformConv2d", "dcnkit", dtype, v1 + [("deformable_groups", "i32", [1])],
                    [x, off1, wt1, bias], lambda x, o, w, b: [ops.deform_conv2d(x, o, w, b, 2, 1, 1)]))
    out.append(Case("MMCVDeformConv2d", "MMCVDeformConv2d", "", dtype, v1 + [("deform_groups", "i32", [1])],
                    [x, off1, wt1], lambda x, o, w: [ops.deform_conv2d(x, o, w, None, 2, 1, 1)]))

    rois = _rois(g, 5, n, h * 2, w * 2, rt)  # image coordinates, spatial_scale 0.5
    for mode, ratio, aligned in (("avg", 2, 1), ("max", 0, 0)):
        fields = [("output_size", "i32", [3, 2]), ("spatial_scale", "f32", [0.5]), ("sampling_ratio", "i32", [ratio]),
                  ("aligned", "i32", [aligned]), ("pool_mode", "str", mode)]
        out.append(Case(f"RoIAlign-{mode}", "RoIAlign", "dcnkit", dtype, fields, [x, rois],
                        lambda x, r, m=mode, s=ratio, a=aligned: _valid_rows(
                            lambda r: ops.roi_align(x, r.to(x.dtype), (3, 2), 0.5, s, bool(a), m), r, n)))
    out.append(Case("DeformRoIPool", "DeformRoIPool", "dcnkit", dtype,
                    [("output_size", "i32", [3, 3]), ("spatial_scale", "f32", [0.5]), ("sampling_ratio", "i32", [2]),
                     ("gamma", "f32", [0.1])], [x, rois, rnd(rois.shape[0], 2, 3, 3, scale=0.3)],
                    lambda x, r, o: _valid_rows(lambda r, o: ops.deform_roi_pool(x, r, o, (3, 3), 0.5, 2, 0.1),
                                                r, n, o)))
    # output_dim 2, group_size 2; the plugin's second output is the per-bin sample count.
    out.append(Case("DeformPSRoIPool", "DeformPSRoIPool", "dcnkit", dtype,
                    [("spatial_scale", "f32", [0.5]), ("output_size", "i32", [2]), ("output_dim", "i32", [2]),
                     ("group_size", "i32", [2]), ("part_size", "i32", [2]), ("sample_per_part", "i32", [2]),
                     ("trans_std", "f32", [0.1]), ("no_trans", "i32", [0])],
                    [rnd(n, 8, h, w), rois, rnd(rois.shape[0], 2, 2, 2, scale=0.5)],
                    lambda x, r, tr: _valid_rows(
                        lambda r, tr: torch.ops.dcnkit.deform_psroi_pool(x, r, tr, 0.5, 2, 2, 2, 2, 2, 0.1), r, n, tr)))
    # Two levels (strides 4 and 8 of a 64 x 64 image); finest_scale 16 sends the larger boxes to level 1.
    out.append(Case("MultiLevelRoIAlign", "MultiLevelRoIAlign", "dcnkit", dtype,
                    [("output_size", "i32", [3, 3]), ("featmap_strides", "f32", [4.0, 8.0]),
                     ("sampling_ratio", "i32", [2]), ("finest_scale", "i32", [16]), ("roi_scale_factor", "f32", [1.0]),
                     ("aligned", "i32", [1]), ("pool_mode", "str", "avg")],
                    [_rois(g, 6, n, 64, 64, rt), rnd(n, c, 16, 16), rnd(n, c, 8, 8)],
                    lambda r, f0, f1: _valid_rows(lambda r: ops.multi_level_roi_align(
                        [f0, f1], r.to(f0.dtype), (3, 3), [4.0, 8.0], 2, 16, 1.0, True, "avg"), r, n)))

    # Multi-scale deformable attention: levels 6x5 and 3x3 (S = 39), 2 heads of 4 channels, 2 points, 5 queries,
    # some locations outside [0, 1]; int64 level tables, and int32 ones (widened into the workspace).
    shapes, starts = torch.tensor([[6, 5], [3, 3]]), torch.tensor([0, 30])
    value, attn = rnd(n, 39, 2, 4), rnd(n, 5, 2, 2, 2, uniform=True)
    loc = (torch.rand(n, 5, 2, 2, 2, 2, generator=g) * 1.2 - 0.1).to(t)
    for idx in (torch.int64, torch.int32):
        out.append(Case(f"MultiScaleDeformableAttention-{str(idx)[6:]}", "MultiScaleDeformableAttention", "dcnkit",
                        dtype, [], [value, shapes.to(idx), starts.to(idx), loc, attn],
                        lambda v, s, st, lc, a: [ops.multi_scale_deformable_attn(v, s.long(), st.long(), lc, a)]))

    # DCNv3 / DCNv4, channels last: a (2, 9, 11, 8) map, 2 groups of 4 channels, 3x3, stride 1, pad 1.
    hv, wv, grp, gc = 9, 11, 2, 4
    attrs = dict(kernel_h=3, kernel_w=3, stride_h=1, stride_w=1, pad_h=1, pad_w=1, dilation_h=1, dilation_w=1,
                 group=grp, group_channels=gc)
    a = list(attrs.values())
    v3_fields = [(k, "i32", [v]) for k, v in attrs.items()] + [("offset_scale", "f32", [0.5]),
                                                               ("remove_center", "i32", [0])]
    xv = rnd(n, hv, wv, grp * gc)
    out.append(Case("DCNv3", "DCNv3", "dcnkit", dtype, v3_fields,
                    [xv, rnd(n, hv, wv, grp * 18, scale=2.0), rnd(n, hv, wv, grp * 9, uniform=True)],
                    lambda x, o, m: [ops.dcnv3(x, o, m, *a, 0.5)]))
    out.append(Case("DCNv4", "DCNv4", "dcnkit", dtype, v3_fields + [("softmax", "i32", [1])],
                    [xv, rnd(n, hv, wv, 56)],  # G * 3K = 54 rounded up to 56
                    lambda x, om: [ops.dcnv4(x, om, *a, 0.5, softmax=True)]))
    return out + _mmdeploy_variants({k.label: k for k in out}, v3_fields)


def _variant(case: Case, plugin: str, fields: list, order: tuple | None = None) -> Case:
    """`case` under an exporter's own node name: its fields, and the kit's node inputs in its order (`order`: the
    kit's input positions, default the same)."""
    order = order or tuple(range(len(case.inputs)))
    op = case.op
    return Case(plugin, plugin, "", case.dtype, fields, [case.inputs[i] for i in order],
                lambda *xs: op(*[xs[order.index(i)] for i in range(len(order))]))


def _mmdeploy_variants(by: dict, v3_fields: list) -> list[Case]:
    """mmdeploy's and InternImage's names of the same nodes (docs/tensorrt.md's tables): their fields and order."""
    return [
        _variant(by["DeformConv2d-v2"], "MMCVModulatedDeformConv2d",
                 [("stride", "i32", [1, 1]), ("padding", "i32", [1, 1]), ("dilation", "i32", [1, 1]),
                  ("groups", "i32", [1]), ("deform_groups", "i32", [2])], (0, 1, 4, 2, 3)),
        _variant(by["RoIAlign-max"], "MMCVRoiAlign",
                 [("output_height", "i32", [3]), ("output_width", "i32", [2]), ("spatial_scale", "f32", [0.5]),
                  ("sampling_ratio", "i32", [0]), ("mode", "str", "max"), ("aligned", "i32", [0])]),
        _variant(by["DeformRoIPool"], "MMCVDeformRoIPool",  # mmcv writes sampling_ratio as a float
                 [("pooled_height", "i32", [3]), ("pooled_width", "i32", [3]), ("spatial_scale", "f32", [0.5]),
                  ("sampling_ratio", "f32", [2.0]), ("gamma", "f32", [0.1])]),
        _variant(by["MultiLevelRoIAlign"], "MMCVMultiLevelRoiAlign",  # pool_mode 1: avg
                 [("output_height", "i32", [3]), ("output_width", "i32", [3]), ("featmap_strides", "f32", [4.0, 8.0]),
                  ("sampling_ratio", "i32", [2]), ("finest_scale", "i32", [16]), ("roi_scale_factor", "f32", [1.0]),
                  ("aligned", "i32", [1]), ("pool_mode", "i32", [1])]),
        _variant(by["MultiScaleDeformableAttention-int64"], "MMCVMultiScaleDeformableAttention",
                 [("im2col_step", "i32", [64])]),
        _variant(by["DCNv3"], "TRTDCNv3", v3_fields + [("im2col_step", "i32", [256])]),
    ]


def _raw(x) -> bytes:
    import torch

    return x.contiguous().view(torch.uint8).numpy().tobytes() if x.dtype != torch.uint8 else x.numpy().tobytes()


def write_manifest(all_cases: list[Case], folder: Path) -> Path:
    """Raw input files and the manifest the harness reads (tests/cpp/tensorrt_enqueue_cuda.cpp's format)."""
    lines = []
    for i, c in enumerate(all_cases):
        lines.append(f"case {c.label}-{c.dtype} {c.plugin} {c.ns or '-'}")
        for name, kind, values in c.fields:
            lines.append(f"field {name} str {values}" if kind == "str" else
                         f"field {name} {kind} {len(values)} " + " ".join(repr(float(v)) if kind == "f32" else str(v)
                                                                       for v in values))
        for j, x in enumerate(c.inputs):
            path = folder / f"c{i}_in{j}.raw"
            path.write_bytes(_raw(x))
            lines.append(f"in {path} {str(x.dtype)[6:]} {x.dim()} " + " ".join(map(str, x.shape)))
        for j, e in enumerate(c.expected):
            lines.append(f"out {folder / f'c{i}_out{j}.raw'} {c.dtype} {e.dim()} " + " ".join(map(str, e.shape)))
        lines.append("end")
    manifest = folder / "manifest.txt"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


def compare(all_cases: list[Case], folder: Path, harness_lines: dict, missing: str = "no line from the harness") \
        -> list[dict]:
    """One row per case: the harness's verdict (``missing`` where it printed none), then the largest scaled error of
    its outputs vs the torch op."""
    import torch

    rows = []
    for i, c in enumerate(all_cases):
        line = harness_lines.get(f"{c.label}-{c.dtype}", missing)
        err, note = None, line
        if line.startswith("ok "):
            err = 0.0
            for j, e in enumerate(c.expected):
                got = torch.frombuffer(bytearray((folder / f"c{i}_out{j}.raw").read_bytes()),
                                       dtype=getattr(torch, c.dtype)).reshape(e.shape).double()
                scaled = ((got - e).abs().max() / max(1.0, float(e.abs().max()))).item()
                err = max(err, scaled if scaled == scaled else float("inf"))  # NaN: never written
            note = "" if err <= TOL[c.dtype] else "outputs differ from the torch op"
        rows.append({"plugin": c.label, "dtype": c.dtype, "max_err": err, "allowed": TOL[c.dtype],
                     "passed": err is not None and err <= TOL[c.dtype], "note": note})
    return rows


def run(dtypes=DTYPES, plan: bool = False, log=print, exe: Path | None = None) -> list[dict] | None:
    """Writes the cases, runs the harness (`exe`, else built here; --plan: its host half) and compares. None (after
    one "skip" line) when a dependency is absent; else one row per case."""
    try:
        if not plan:
            import torch

            if not torch.cuda.is_available():
                raise Skip("no CUDA device (torch.cuda.is_available() is False)")
        lib = plugin_library()
        with tempfile.TemporaryDirectory(prefix="trt-enqueue-") as tmp:
            folder = Path(tmp)
            exe = exe or build_harness(folder)
            all_cases = [c for dt in dtypes for c in cases(dt)]
            manifest = write_manifest(all_cases, folder)
            r = subprocess.run([str(exe), str(lib), str(manifest)] + (["--plan"] if plan else []),
                               capture_output=True, text=True, timeout=300)
            if r.returncode == 3:
                raise Skip(r.stdout.strip())
            if r.returncode == 2:  # usage, manifest or library: no case ran
                raise RuntimeError(f"the harness failed (exit 2):\n{r.stdout}{r.stderr}")
            # A crash (a signal) in one case: the cases before it printed their lines (line-buffered).
            missing = f"no line from the harness (exit {r.returncode}: {(r.stderr.strip().splitlines() or [''])[-1]})"
            lines = {}
            for text in r.stdout.splitlines():
                kind, _, rest = text.partition(" ")
                if kind in ("ok", "FAILED"):
                    lines[rest.split(":")[0].split(" (")[0]] = text
            if plan:
                return [{"plugin": c.label, "dtype": c.dtype, "passed": lines.get(f"{c.label}-{c.dtype}", "")
                         .startswith("ok "), "note": lines.get(f"{c.label}-{c.dtype}", missing)} for c in all_cases]
            return compare(all_cases, folder, lines, missing)
    except Skip as e:
        log(f"skip: TensorRT plugins' enqueue on device buffers: {e}")
        return None


def table(rows: list[dict]) -> str:
    out = ["| plugin | dtype | max error | allowed | result |", "|---|---|---|---|---|"]
    for r in rows:
        err = "-" if r.get("max_err") is None else f"{r['max_err']:.2g}"
        allowed = "-" if r.get("allowed") is None else f"{r['allowed']:g}"
        result = "pass" if r["passed"] else f"FAIL: {r['note']}"
        out.append(f"| {r['plugin']} | {r['dtype']} | {err} | {allowed} | {result} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated: float32, float16, bfloat16")
    ap.add_argument("--plan", action="store_true", help="the host half only (no GPU needed): fields, shapes, workspace")
    args = ap.parse_args(argv)
    dtypes = [s.strip() for s in args.dtypes.split(",") if s.strip()]
    bad = [s for s in dtypes if s not in DTYPES]
    if bad:
        ap.error(f"--dtypes: expected some of {', '.join(DTYPES)}, got {bad}")
    rows = run(dtypes, args.plan)
    if rows is None:
        return 0
    print(table(rows))
    failed = sum(not r["passed"] for r in rows)
    print("PASSED" if failed == 0 else f"FAILED: {failed} of {len(rows)} case(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
