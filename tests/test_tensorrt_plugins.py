"""The TensorRT plugin library, without TensorRT or a GPU: built whenever TensorRT's headers and nvcc are there,
links nothing from TensorRT, and every creator passes the host-side lifecycle test (tests/cpp)."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import dcnkit

ROOT = Path(__file__).resolve().parents[1]
LIFECYCLE_SRC = ROOT / "tests" / "cpp" / "tensorrt_lifecycle_test.cpp"


def _trt_include():
    """TensorRT headers as the build finds them (TensorRT_INCLUDE_DIR / TensorRT_ROOT, then usual places)."""
    cands = [os.environ.get("TensorRT_INCLUDE_DIR", "")]
    if os.environ.get("TensorRT_ROOT"):
        cands.append(os.path.join(os.environ["TensorRT_ROOT"], "include"))
    cands += ["/usr/include/x86_64-linux-gnu", "/usr/local/TensorRT/include", "/opt/tensorrt/include", "/usr/include"]
    for c in cands:
        if c and (Path(c) / "NvInferRuntime.h").is_file():
            return Path(c)
    return None


def _cuda_include():
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    return home / "include" if (home / "include" / "cuda_runtime_api.h").is_file() else None


def _nvcc():
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    p = Path(home) / "bin" / "nvcc"
    return str(p) if p.is_file() else shutil.which("nvcc")


needs_headers = pytest.mark.skipif(_trt_include() is None, reason="no TensorRT headers (set TensorRT_INCLUDE_DIR)")
needs_nvcc = pytest.mark.skipif(_nvcc() is None, reason="no nvcc: the plugin library needs the CUDA kernels")


def _library():
    try:
        return dcnkit.find_library("dcnkit_trt")
    except FileNotFoundError:
        return None


@needs_headers
@needs_nvcc
def test_library_is_built_when_headers_are_given():
    lib = _library()
    assert lib is not None, (
        f"TensorRT headers are at {_trt_include()} and nvcc is present, but libdcnkit_trt.so was not built")


@needs_headers
@needs_nvcc
def test_library_exports_only_the_plugin_entry_points_and_needs_no_tensorrt():
    lib = _library()
    if lib is None or shutil.which("nm") is None:
        pytest.skip("no library or no nm")
    defined = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True)
    text_symbols = sorted(line.split()[-1] for line in defined.stdout.splitlines() if " T " in line)
    assert text_symbols == ["dcnkit_op_defs_json", "getCreators", "setLoggerFinder"]
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], capture_output=True, text=True, check=True)
    assert "nvinfer" not in undefined.stdout.lower()
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
    assert "libnvinfer" not in needed


@needs_headers
@needs_nvcc
def test_op_table_is_the_one_of_the_other_libraries():
    import ctypes
    import json

    lib = _library()
    if lib is None:
        pytest.skip("no library")
    handle = ctypes.CDLL(str(lib))
    handle.dcnkit_op_defs_json.restype = ctypes.c_char_p
    assert json.loads(handle.dcnkit_op_defs_json()) == dcnkit.op_defs()


@needs_headers
@needs_nvcc
def test_every_creator_through_the_plugin_lifecycle(tmp_path):
    lib = _library()
    cuda_inc = _cuda_include()
    cxx = shutil.which("g++") or shutil.which("c++")
    if lib is None or cuda_inc is None or cxx is None:
        pytest.skip("needs the library, CUDA headers and a C++ compiler")
    exe = tmp_path / "tensorrt_lifecycle_test"
    build = subprocess.run(
        [cxx, "-std=c++17", "-O1", "-Wall", "-Wno-deprecated-declarations", "-isystem", str(_trt_include()),
         "-isystem", str(cuda_inc), str(LIFECYCLE_SRC), "-ldl", "-o", str(exe)],
        capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe), str(lib)], capture_output=True, text=True, timeout=120)
    last = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0 and last.endswith(" 0 failed"), run.stdout + run.stderr
    passed = int(last.split()[0])
    assert passed > 500, last  # every creator ran its checks
