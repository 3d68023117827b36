"""Compiles and runs a C++ unit test of tests/cpp/ with the host compiler (the CPU halves of native code)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_cpp_unit(source: str, include: Path, tmp_path: Path, timeout: int = 120) -> str:
    """The output of tests/cpp/<source>, built with -Wall -Wextra -Werror against `include` and run (both must
    succeed); skips the test without a C++ compiler."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("needs a C++ compiler (g++ or c++)")
    exe = tmp_path / Path(source).stem
    build = subprocess.run([cxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-I", str(include),
                            str(ROOT / "tests" / "cpp" / source), "-o", str(exe)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout
