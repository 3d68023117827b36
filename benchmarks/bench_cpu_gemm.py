"""Benchmark: the CPU sgemm libraries a CPU front end of the kit could use, on the GEMMs of DCNv2 detector layers.

    python benchmarks/bench_cpu_gemm.py [--repeat 40] [--lib-dir DIR] [--json out.json]

docs/performance.md's GEMM table: ``python benchmarks/bench_cpu_gemm.py --repeat 40 --lib-dir DIR`` with ``pip install
--target`` of ``mkl`` beside this environment (DIR: its lib folder; oneDNN is this environment's onednn-cpu-gomp).

The deformable convolution's forward multiplies the weight (C_out x C_in*9) by a tile of columns (positions x
C_in*9, transposed), row-major, ``C = A B^T``, one call per tile and task. The shapes are those of the layers of
issue 31 (C 256 on 20x20 / 40x40 / 32x32 maps, C 512 on 10x10 and 7x7) as the kit calls them with 2 threads:
the whole map, half of its positions (a tile per thread) and half of the output rows (a small map's GEMM split by
rows), plus a 64-channel layer. Each library runs single-threaded on one pinned core (the kit runs one GEMM per
task inside ONNX Runtime's or PyTorch's thread pool), through ctypes:

* OpenBLAS from the ``scipy-openblas32`` wheel (what ``libdcnkit_ort.so`` links);
* MKL's ``cblas_sgemm`` (``libmkl_rt``, pip ``mkl``), when installed in this environment;
* oneDNN's ``dnnl_sgemm`` (``libdnnl``, pip ``onednn-cpu-gomp``), when installed;
* with the weight A packed once (what a constant weight allows; ``cpu_gemm_packed.cpp``, compiled here with g++ against
  oneDNN 3.x's headers from pip ``onednn-devel-cpu-gomp``): oneDNN 3.x's matmul on A reordered once per block of 64
  rows (the kit's ORT / OpenVINO GEMM, dcnkit/cpu_gemm.h) and MKL's ``cblas_sgemm_pack`` + ``cblas_sgemm_compute``;
  beside them oneDNN's bfloat16 matmul (A packed as bf16, B converted to bf16 inside each timed call, float32
  accumulation: the OpenVINO bf16 mode's GEMM) and its float32 matmul with the ``fpmath_mode`` bf16 attribute.

Times are the fastest of ``--repeat`` calls (elapsed time on the pinned core; the process's CPU time is printed
beside it, steadier on a shared machine), with GFLOP/s; a missing library is reported and skipped.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

# (M, N, K): C_out, positions, C_in * 9
SHAPES = [
    (256, 400, 2304), (256, 200, 2304), (128, 400, 2304),  # C256 20x20: whole map, tile per thread, row half
    (512, 100, 4608), (512, 50, 4608), (256, 100, 4608),   # C512 10x10
    (512, 49, 4608), (512, 25, 4608), (256, 49, 4608),     # C512 7x7
    (256, 800, 2304), (256, 512, 2304),                    # C256 40x40 and N4 32x32 tiles per thread
    (64, 2048, 576),                                       # C64 64x64
    (1024, 64, 9216), (512, 64, 9216), (1024, 32, 9216),   # C1024 8x8: whole map, row half, tile per thread
]
QUICK_SHAPES = [(32, 40, 72)]
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
# Relative error bound of the bfloat16 matmul (inputs rounded to 8 significant bits, float32 accumulation): a few
# 2^-9 roundings per product, averaging out over K; measured 1e-4 - 3e-4 here.
BF16_ERROR = 4e-3


_LIB_DIR = [os.path.join(sys.prefix, "lib")]  # --lib-dir


def _lib_dir() -> str:
    return _LIB_DIR[0]


def _cblas(fn):
    fn.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                        ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
    return fn


def _openblas():
    try:
        import scipy_openblas32 as s
    except ImportError as e:
        return None, f"scipy-openblas32 not installed ({e})"
    lib = ctypes.CDLL(os.path.join(s.get_lib_dir(), f"lib{s.get_library()}.so"))
    lib.scipy_openblas_set_num_threads(1)
    return _cblas(lib.scipy_cblas_sgemm), None


def _mkl():
    path = os.path.join(_lib_dir(), "libmkl_rt.so.2")
    path = path if os.path.exists(path) else os.path.join(_lib_dir(), "libmkl_rt.so.3")
    os.environ.setdefault("MKL_THREADING_LAYER", "SEQUENTIAL")  # one thread: no OpenMP / TBB runtime needed
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        return None, f"MKL not loadable (pip install mkl): {e}"
    lib.MKL_Set_Num_Threads(1)
    return _cblas(lib.cblas_sgemm), None


def _onednn():
    try:
        lib = ctypes.CDLL(os.path.join(sys.prefix, "lib", "libdnnl.so.3"))
    except OSError as e:
        return None, f"oneDNN not loadable (pip install onednn-cpu-gomp): {e}"
    dnnl = lib.dnnl_sgemm  # row-major: (transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)
    dnnl.argtypes = [ctypes.c_char, ctypes.c_char] + [ctypes.c_int64] * 3 + [
        ctypes.c_float, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_float,
        ctypes.c_void_p, ctypes.c_int64]

    def sgemm(_order, _ta, _tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        return dnnl(b"N", b"T", m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)

    return sgemm, None


LIBRARIES = {"OpenBLAS": _openblas, "MKL": _mkl, "oneDNN sgemm": _onednn}


def _packed(shapes, repeat: int) -> dict:
    """{(library, (m, n, k)): ms} of cpu_gemm_packed.cpp (compiled here), and {library: why} for those skipped."""
    import subprocess
    import sysconfig
    import tempfile

    here = os.path.dirname(os.path.abspath(__file__))
    inc = os.path.join(sysconfig.get_paths()["data"], "include")
    if not os.path.exists(os.path.join(inc, "oneapi", "dnnl", "dnnl.h")):
        return {}, {"packed": f"no oneDNN 3.x headers in {inc} (pip install onednn-devel-cpu-gomp)"}
    exe = os.path.join(tempfile.mkdtemp(), "cpu_gemm_packed")
    subprocess.run(["g++", "-O2", "-std=c++20", "-I", inc, os.path.join(here, "cpu_gemm_packed.cpp"), "-ldl", "-o",
                    exe], check=True)
    mkl = os.path.join(_lib_dir(), "libmkl_rt.so.3")
    mkl = mkl if os.path.exists(mkl) else os.path.join(_lib_dir(), "libmkl_rt.so.2")
    dnnl = os.path.join(sys.prefix, "lib", "libdnnl.so.3")
    out = subprocess.run([exe, str(repeat), dnnl, mkl] + [f"{m},{n},{k}" for m, n, k in shapes], check=True,
                         capture_output=True, text=True).stdout
    ms, skipped = {}, {}
    for line in out.splitlines():
        f = line.split()
        if f[1] == "skipped":
            skipped[f"{f[0]} packed"] = " ".join(f[2:])
            continue
        m, n, k, t, err = int(f[1]), int(f[2]), int(f[3]), float(f[4]), float(f[5])
        bound = BF16_ERROR if "bf16" in f[0] and "fpmath" not in f[0] else 1e-4
        if err > bound:
            raise SystemExit(f"{f[0]} packed {m}x{n}x{k}: expected A B^T within {bound:g}, got a relative error of "
                             f"{err:.2e}")
        ms[(f"{f[0]} packed", (m, n, k))] = t
    return ms, skipped


def _time(fn, repeat: int) -> tuple[float, float]:
    """(fastest elapsed ms, fastest CPU ms) of ``repeat`` calls after one untimed call."""
    fn()
    wall = cpu = float("inf")
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall = min(wall, time.perf_counter() - t0)
        cpu = min(cpu, time.process_time() - c0)
    return wall * 1e3, cpu * 1e3


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    C.add_common_args(ap, repeat=40)  # --device cpu only; --threads, --warmup, --clock: not used (one core, CPU time too)
    ap.add_argument("--lib-dir", default=_LIB_DIR[0],
                    help="where the mkl wheel put libmkl_rt (default: this environment's lib; "
                    "their dependencies must be on LD_LIBRARY_PATH)")
    args = ap.parse_args(argv)
    _LIB_DIR[0] = args.lib_dir
    if args.repeat < 1:
        raise SystemExit(f"--repeat: expected a positive count, got {args.repeat}")
    if args.device not in (None, "cpu"):
        raise SystemExit(f"--device: expected cpu (this benchmark measures CPU libraries), got {args.device}")
    import numpy as np

    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core: the libraries' pools see one CPU
    fns, skipped = {}, {}
    for name, load in LIBRARIES.items():
        fn, why = load()
        if fn is None:
            skipped[name] = why
        else:
            fns[name] = fn
    shapes = QUICK_SHAPES if args.quick else SHAPES
    packed, why_packed = _packed(shapes, 2 if args.quick else args.repeat)
    skipped.update(why_packed)
    packed_names = sorted({name for name, _ in packed})
    for name, why in skipped.items():
        print(f"{name} skipped: {why}")
    print(f"single-threaded sgemm C = A B^T (row-major) on one core, fastest of {args.repeat} calls")
    rng = np.random.default_rng(0)
    table, results = [], []
    for m, n, k in shapes:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((n, k)).astype(np.float32)
        want = a.astype(np.float64) @ b.T.astype(np.float64)
        row, res = [f"{m}x{n}x{k}"], {"m": m, "n": n, "k": k, "ms": {}, "cpu_ms": {}}
        for name, fn in fns.items():
            c = np.zeros((m, n), np.float32)

            def call(fn=fn, c=c):
                fn(_ROW_MAJOR, _NO_TRANS, _TRANS, m, n, k, 1.0, a.ctypes.data, k, b.ctypes.data, k, 0.0,
                   c.ctypes.data, n)

            call()
            err = float(np.abs(c - want).max() / max(1.0, np.abs(want).max()))
            if err > 1e-4:
                raise SystemExit(f"{name} {m}x{n}x{k}: expected A B^T, got a relative error of {err:.2e}")
            wall, cpu = _time(call, 2 if args.quick else args.repeat)
            res["ms"][name], res["cpu_ms"][name] = wall, cpu
            row.append(f"{wall:.3f} / {cpu:.3f} ({2e-6 * m * n * k / wall:.0f})")
        for name in packed_names:
            wall = packed[(name, (m, n, k))]
            res["ms"][name] = wall
            row.append(f"{wall:.3f} ({2e-6 * m * n * k / wall:.0f})")
        table.append(row)
        results.append(res)
    C.print_table(["M x N x K"] + [f"{name} ms / CPU ms (GFLOP/s)" for name in fns]
                  + [f"{name} ms (GFLOP/s)" for name in packed_names], table)
    return C.write_json(args, results)


if __name__ == "__main__":
    main()
