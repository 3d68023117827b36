"""CPU proxies of the DeformConv2d CUDA kernels (issue 25 item 6): the counting
harness tests/cpp/kernel_counts.cpp runs the kernels' per-thread DCNKIT_HD bodies over the launchers' own launch
grid with counting scalar types, and prints its table, the launchers' workspace against torchvision's column
buffer and the model's predicted times (labelled "model"). It exits 1 when a gate fails: per column element,
sampling points <= 1/8, offset/mask loads <= 3/8, stores exactly 1, index divisions 0; backward atomics <= 4,
offset/mask gradients written once; extra fwd+bwd workspace at (8,64,64,64) fp32 <= 0.5x torchvision's
columns."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_kernel_counts(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("needs a C++ compiler")
    exe = tmp_path / "kernel_counts"
    build = subprocess.run([cxx, "-std=c++17", "-O1", "-Wall", "-I", str(ROOT / "plugins/core/include"),
                            str(ROOT / "tests/cpp/kernel_counts.cpp"), "-o", str(exe)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    print(run.stdout)
    assert run.returncode == 0 and run.stdout.strip().endswith("all gates passed"), run.stdout + run.stderr
    # Every gate ran: 13 per shape over 4 shapes, the divisor check and the memory gate.
    assert run.stdout.count(" ok\n") == 4 * 13 + 2, run.stdout
    assert "model (8,32,128,128) fp32 forward" in run.stdout
