"""The build's configure step (CMakeLists.txt, cmake/dcnkit_paths.cmake): the ONNX Runtime library is never left
out silently (headers given, found, or one line saying how to provide them; DCNKIT_BUILD_ORT=OFF leaves it out),
a changed DCNKIT_ORT_INCLUDE_DIR / TensorRT_INCLUDE_DIR is honoured by the next configure of the same build
folder, and one summary line says what the build holds. Configure only (nothing compiled), PyTorch library off."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(module: str, name: str) -> str | None:
    try:
        mod = __import__(module)
        return str(Path(getattr(mod, f"{name.upper()}_BIN_DIR")) / name)
    except (ImportError, AttributeError):
        return shutil.which(name)


CMAKE, NINJA = _tool("cmake", "cmake"), _tool("ninja", "ninja")
pytestmark = pytest.mark.skipif(CMAKE is None or NINJA is None, reason="cmake and ninja are needed (requirements-dev.txt)")


def _nvcc() -> str | None:
    p = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
    return str(p) if p.is_file() else shutil.which("nvcc")


def _configure(build: Path, *defs: str, env: dict | None = None, cuda: bool = False) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if k not in ("DCNKIT_ORT_INCLUDE_DIR", "TensorRT_INCLUDE_DIR", "TensorRT_ROOT", "CMAKE_ARGS")}
    cmd = [CMAKE, "-S", ROOT, "-B", build, "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={NINJA}",
           f"-DPython_EXECUTABLE={sys.executable}", "-DDCNKIT_BUILD_TORCH=OFF",
           f"-DDCNKIT_WITH_CUDA={'ON' if cuda else 'OFF'}", *defs]
    if cuda:
        cmd += ["-DCMAKE_CUDA_ARCHITECTURES=90", f"-DCMAKE_CUDA_COMPILER={_nvcc()}"]
    return subprocess.run([str(c) for c in cmd], env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=300)


def _summary(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    (line,) = [l for l in p.stdout.splitlines() if l.startswith("-- dcnkit build: ")]
    return line[len("-- "):]


def _headers(d: Path) -> Path:
    d.mkdir(parents=True)
    for h in ("onnxruntime_c_api.h", "onnxruntime_cxx_api.h"):
        (d / h).write_text("// configure only\n")
    return d


def test_a_changed_ort_include_dir_is_honoured_by_the_next_configure(tmp_path):
    a, b = _headers(tmp_path / "a"), _headers(tmp_path / "b")
    build = tmp_path / "build"
    s = _summary(_configure(build, env={"DCNKIT_ORT_INCLUDE_DIR": str(a)}))
    assert s == (f"dcnkit build: Python {sys.executable} | PyTorch: not built (DCNKIT_BUILD_TORCH=OFF) | "
                 f"ONNX Runtime: libdcnkit_ort.so (headers {a}) | ONNX Runtime CUDA: not built (DCNKIT_WITH_CUDA=OFF) | "
                 "TensorRT: not built (no CUDA kernels: DCNKIT_WITH_CUDA=OFF) | " + OPENVINO_SUMMARY)
    assert f"(headers {b})" in _summary(_configure(build, env={"DCNKIT_ORT_INCLUDE_DIR": str(b)}))
    # Nothing from the environment went into the cache: -D gives the folder when the variable is unset.
    assert "DCNKIT_ORT_INCLUDE_DIR:PATH=\n" in (build / "CMakeCache.txt").read_text()
    assert f"(headers {a})" in _summary(_configure(build, f"-DDCNKIT_ORT_INCLUDE_DIR={a}"))


def _openvino_summary() -> str:
    """What the summary says of the OpenVINO library with this Python (the openvino wheel's CMake package or not)."""
    import importlib.util

    if importlib.util.find_spec("openvino") is None:
        return f"OpenVINO: not built (no openvino wheel with its CMake package in {sys.executable} (pip install dcnkit[openvino]))"
    import openvino

    version = openvino.get_version().split("-")[0]
    return f"OpenVINO: libdcnkit_ov.so (OpenVINO {version})"


OPENVINO_SUMMARY = _openvino_summary()


def test_the_openvino_library_is_built_with_the_wheel_and_left_out_on_request(tmp_path):
    headers = _headers(tmp_path / "h")
    s = _summary(_configure(tmp_path / "build", "-DDCNKIT_BUILD_OPENVINO=OFF", env={"DCNKIT_ORT_INCLUDE_DIR": str(headers)}))
    assert s.endswith(" | OpenVINO: not built (DCNKIT_BUILD_OPENVINO=OFF)")
    if "libdcnkit_ov.so" in OPENVINO_SUMMARY:  # ON with the wheel present: built; AUTO (above) the same
        s = _summary(_configure(tmp_path / "build", "-DDCNKIT_BUILD_OPENVINO=ON",
                                env={"DCNKIT_ORT_INCLUDE_DIR": str(headers)}))
        assert s.endswith(" | " + OPENVINO_SUMMARY)


def test_no_headers_is_one_line_unless_the_library_is_left_out(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    p = _configure(tmp_path / "build", env={"DCNKIT_ORT_INCLUDE_DIR": str(empty)})
    assert p.returncode != 0
    (line,) = [l for l in p.stderr.splitlines() if "dcnkit: no ONNX Runtime headers" in l]
    assert f"DCNKIT_ORT_INCLUDE_DIR={empty} has no onnxruntime_cxx_api.h" in line
    assert line.rstrip().endswith("or leave the library out with -DDCNKIT_BUILD_ORT=OFF")
    s = _summary(_configure(tmp_path / "build", "-DDCNKIT_BUILD_ORT=OFF", env={"DCNKIT_ORT_INCLUDE_DIR": str(empty)}))
    assert "| ONNX Runtime: not built (DCNKIT_BUILD_ORT=OFF) | ONNX Runtime CUDA: not built (DCNKIT_BUILD_ORT=OFF) |" in s


@pytest.mark.skipif(_nvcc() is None, reason="no nvcc: the TensorRT library is only configured with the CUDA kernels")
def test_a_changed_tensorrt_include_dir_is_honoured_by_the_next_configure(tmp_path):
    def trt(d: Path) -> Path:
        d.mkdir()
        (d / "NvInferRuntime.h").write_text("// configure only\n")
        (d / "NvInferVersion.h").write_text("#define NV_TENSORRT_MAJOR 10\n")
        return d

    a, b = trt(tmp_path / "trt-a"), trt(tmp_path / "trt-b")
    ort = {"DCNKIT_ORT_INCLUDE_DIR": str(_headers(tmp_path / "ort"))}
    build = tmp_path / "build"
    for d in (a, b):
        p = _configure(build, cuda=True, env={**ort, "TensorRT_INCLUDE_DIR": str(d)})
        assert "| TensorRT: libdcnkit_trt.so" in _summary(p)
        assert re.search(rf"^-- dcnkit: TensorRT plugin library against {re.escape(str(d))}/? \(", p.stdout, re.M)
