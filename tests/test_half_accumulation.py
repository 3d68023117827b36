"""The 16-bit path of the DCNv3 / DCNv4 and multi-scale deformable attention CUDA kernels without a GPU: their
per-thread bodies instantiated for a bfloat16 storage type with float32 accumulation, run over the CUDA launch grid
on the host, and the final rounding of the float32 gradient buffers (tests/cpp/half_accumulation_test.cpp: each
16-bit result is the float32 computation on the same data rounded once); and the int32 level tables' widening
kernel body over its grid."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_16_bit_results_are_the_float32_computation_rounded_once(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("needs a C++ compiler (g++ or c++)")
    exe = tmp_path / "half_accumulation_test"
    build = subprocess.run([cxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-I",
                            str(ROOT / "plugins" / "core" / "include"),
                            str(ROOT / "tests" / "cpp" / "half_accumulation_test.cpp"), "-o", str(exe)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    passed, failed = (int(w) for w in run.stdout.split()[-4::2])
    assert failed == 0 and passed > 10000, run.stdout
