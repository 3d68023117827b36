"""The ONNX Runtime libraries use nothing of the C API beyond the floor (ONNX Runtime 1.16, C API 16) except where
they check the running version first (plugins/onnxruntime/ort_common.h).

The check is a build: the CPU library's and the CUDA-EP library's sources compile (syntax and types, g++
``-fsyntax-only``) against the floor's API, i.e. the ONNX Runtime headers with ``ORT_API_VERSION`` 16 and the two
structs that grow with it cut to their 1.16 layout: ``OrtApi`` ends at ``KernelContext_GetResource`` (the last entry
of 1.16, "\\since Version 1.16"), ``OrtCustomOp`` at ``KernelComputeV2`` (ONNX Runtime reads ``GetStartVersion`` /
``GetEndVersion`` and ``InferOutputShapeFn`` only from version 17). Both structs only ever grow at the end, so a use
of a newer entry outside an ``ORT_API_VERSION >= N`` block does not compile. The CUDA-EP library cannot run here (no
GPU); this and the CPU library's tests (its registration code is the same file, ort_ops.cpp) are what check it.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ORT_DIR = ROOT / "plugins" / "onnxruntime"
CPU_SOURCES = ["ort_common.cpp", "ort_ops.cpp", "ort_qdeform_conv.cpp", "ort_onednn.cpp"]
CUDA_SOURCES = ["ort_ops.cpp", "ort_cuda.cpp"]  # compiled with DCNKIT_ORT_CUDA (the CUDA-EP library's kernels)

FLOOR_API = 16
LAST_FLOOR_ENTRY = "KernelContext_GetResource"  # OrtApi: the last function of C API 16
LAST_FLOOR_OP_FIELD = "KernelComputeV2"  # OrtCustomOp: the last field ONNX Runtime 1.16 reads


def _ort_include() -> Path | None:
    """The headers the build used (its CMake cache), else DCNKIT_ORT_INCLUDE_DIR or setup.sh's .deps copy."""
    dirs = []
    for cache in sorted(ROOT.glob("build/*/CMakeCache.txt")):
        m = re.search(r"^DCNKIT_ORT_INCLUDE_DIR:\w+=(.+)$", cache.read_text(errors="replace"), re.M)
        if m:
            dirs.append(m.group(1).strip())
    dirs += [os.environ.get("DCNKIT_ORT_INCLUDE_DIR"), ROOT / ".deps" / "onnxruntime" / "include"]
    for d in dirs:
        if d and (Path(d) / "onnxruntime_c_api.h").is_file():
            return Path(d)
    return None


def _cut_struct(text: str, struct: str, last_member: str) -> str:
    """``text`` with the members of ``struct <struct> {`` after the declaration of ``last_member`` removed."""
    start = text.index(f"struct {struct} {{")
    end = text.index("\n};", start)
    body = text[start:end]
    # the declaration, not a mention in a comment: "ORT_API2_STATUS(Name," or "(ORT_API_CALL* Name)"
    m = re.search(rf"(?:ORT_API2_STATUS\(\s*|\*\s*){last_member}\b", body)
    assert m, f"{struct}: no member {last_member} in the headers"
    decl_end = body.index(";", m.end()) + 1
    return text[: start + decl_end] + "\n" + text[end:]


def floor_header(src: Path) -> str:
    """The C API header of ``src`` cut to C API 16."""
    text = src.read_text()
    text, n = re.subn(r"#define ORT_API_VERSION \d+", f"#define ORT_API_VERSION {FLOOR_API}", text)
    assert n == 1, "ORT_API_VERSION not defined in the headers"
    text = _cut_struct(text, "OrtApi", LAST_FLOOR_ENTRY)
    return _cut_struct(text, "OrtCustomOp", LAST_FLOOR_OP_FIELD)


def _openblas_include() -> str | None:
    try:
        import scipy_openblas32

        return scipy_openblas32.get_include_dir()
    except ImportError:
        return None


def _compile(floor_dir: Path, sources: list[str], extra: list[str]) -> subprocess.CompletedProcess:
    gxx = shutil.which("g++")
    cmd = [gxx, "-std=c++17", "-fsyntax-only", "-Wno-unused-function", "-I", str(floor_dir), "-I", str(ORT_DIR),
           "-I", str(ROOT / "plugins" / "core" / "include"), *extra]
    blas = _openblas_include()
    if blas:
        cmd += ["-isystem", blas]
    # The sources one after another in one process each (the machine may be shared: no parallel jobs).
    out = subprocess.CompletedProcess(cmd, 0, "", "")
    for s in sources:
        r = subprocess.run(cmd + [str(ORT_DIR / s)], capture_output=True, text=True)
        if r.returncode != 0:
            return r
    return out


@pytest.fixture(scope="module")
def floor_dir(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("g++ not found")
    inc = _ort_include()
    if inc is None:
        pytest.skip("ONNX Runtime headers not found (scripts/setup.sh puts them in .deps/onnxruntime/include)")
    d = tmp_path_factory.mktemp("ort_floor_api")
    (d / "onnxruntime_c_api.h").write_text(floor_header(inc / "onnxruntime_c_api.h"))
    return d


def test_floor_header_is_the_1_16_layout(floor_dir):
    text = (floor_dir / "onnxruntime_c_api.h").read_text()
    api = text[text.index("struct OrtApi {"):]
    api = api[: api.index("\n};")]
    assert "KernelContext_GetResource" in api and "KernelContext_ParallelFor" not in api
    assert "KernelContext_GetScratchBuffer" not in api and "KernelInfoGetAllocator" not in api
    op = text[text.index("struct OrtCustomOp {"):]
    op = op[: op.index("\n};")]
    assert "KernelComputeV2" in op and "GetStartVersion" not in op and "InferOutputShapeFn" not in op


def test_floor_check_fails_on_a_newer_entry(floor_dir, tmp_path):
    """The check can fail: a use of C API 17's KernelContext_ParallelFor does not compile against the floor."""
    bad = tmp_path / "bad.cpp"
    bad.write_text('#include <onnxruntime_c_api.h>\nvoid* f(const OrtApi* a) { return (void*)a->KernelContext_ParallelFor; }\n')
    r = subprocess.run([shutil.which("g++"), "-std=c++17", "-fsyntax-only", "-I", str(floor_dir), str(bad)],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "KernelContext_ParallelFor" in r.stderr


def test_cpu_library_compiles_against_the_floor_api(floor_dir):
    extra = []
    onednn = ROOT / ".deps" / "onednn" / "include"
    if (onednn / "oneapi" / "dnnl" / "dnnl.h").is_file():
        extra += ["-DDCNKIT_WITH_ONEDNN_HEADERS=1", "-isystem", str(onednn)]
    r = _compile(floor_dir, CPU_SOURCES, extra)
    assert r.returncode == 0, r.stderr[-4000:]


def _cuda_includes() -> list[str] | None:
    cuda = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    if not (cuda / "cuda_runtime.h").is_file():
        return None
    hits = sorted({str(Path(p).parent) for s in sys.path if s
                   for p in glob.glob(os.path.join(s, "nvidia", "*", "include", "cublas_v2.h"))})
    if not hits and not (cuda / "cublas_v2.h").is_file():
        return None
    return ["-isystem", str(cuda)] + [x for h in hits[-1:] for x in ("-isystem", h)]


def test_cuda_ep_library_compiles_against_the_floor_api(floor_dir):
    inc = _cuda_includes()
    if inc is None:
        pytest.skip("CUDA headers (cuda_runtime.h) and cuBLAS headers (cublas_v2.h, pip nvidia-cublas) not found")
    r = _compile(floor_dir, CUDA_SOURCES, ["-DDCNKIT_ORT_CUDA=1", *inc])
    assert r.returncode == 0, r.stderr[-4000:]
