"""Counting proxies of the CUDA schedules (issue 25, item 6): tests/cpp harnesses run the kernels' per-thread
DCNKIT_HD bodies over their launch grid with counting scalar types, print their table and exit 1 on a gate.

- DeformConv2d (tests/cpp/kernel_counts.cpp, over the launchers' own grid): per column element, sampling points
  <= 1/8, offset/mask loads <= 3/8, stores exactly 1, index divisions 0; backward atomics <= 4, none (and no load)
  for a sampling point outside the map, offset/mask gradients written once; extra fwd+bwd
  workspace at (8,64,64,64) fp32 <= 0.5x torchvision's columns, the deterministic plan reserved only in
  deterministic mode (deformable groups = channels, fp32 and fp16); CUDA's launch limits and the schedule's launches
  at N=70,000 (1x1 maps); it also prints the model's predicted times (labelled "model").
- RoIAlign, DeformRoIPool and DeformPSRoIPool (tests/cpp/roi_plan_counts.cpp): RoI-field loads per output <= 0.1,
  one store per output (DeformPSRoIPool: two, the output and its count); MultiLevelRoIAlign with a finest level of
  2^31 pixels serves (visit kernel) and writes the RoIs of its small levels.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CXX = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
needs_cxx = pytest.mark.skipif(CXX is None, reason="no C++ compiler (c++, g++ or clang++) on PATH")


def _build_and_run(source: str, tmp_path) -> subprocess.CompletedProcess:
    exe = tmp_path / Path(source).stem
    build = subprocess.run([CXX, "-std=c++17", "-O1", "-Wall", f"-I{ROOT / 'plugins' / 'core' / 'include'}",
                            "-o", str(exe), str(ROOT / "tests" / "cpp" / source)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    print(run.stdout)
    return run


@needs_cxx
def test_kernel_counts(tmp_path):
    run = _build_and_run("kernel_counts.cpp", tmp_path)
    assert run.returncode == 0 and run.stdout.strip().endswith("all gates passed"), run.stdout + run.stderr
    # Every gate ran: 13 per shape over 4 shapes, the divisor check, the memory gate, the deterministic plan only in
    # deterministic mode (fp32, fp16; deformable groups = channels), no atomic for a point outside the map (points
    # across the border; all far outside), and the launch limits (the checker, the DCN launches at N=70000, GEMM
    # batches split at 65535).
    assert run.stdout.count(" ok\n") == 4 * 13 + 2 + 2 + 2 + 3, run.stdout
    assert "model (8,32,128,128) fp32 forward" in run.stdout


@needs_cxx
def test_roi_align_plan_counts(tmp_path):
    run = _build_and_run("roi_plan_counts.cpp", tmp_path)
    assert all(f"| {m} |" in run.stdout for m in ("avg", "max", "deform avg", "psroi avg")), run.stdout + run.stderr
    assert run.returncode == 0, run.stdout + run.stderr


@needs_cxx
def test_device_math_matches_the_host_arithmetic(tmp_path):
    # tests/cpp/device_math_checks.cpp: the device's CALL-free division bit-equal to IEEE division, the 32-bit split
    # conversions equal to the 64-bit ones, and the rotated gather's 64-bit grad_output offsets past 2^31 bins.
    run = _build_and_run("device_math_checks.cpp", tmp_path)
    assert run.returncode == 0 and "FAIL" not in run.stdout, run.stdout + run.stderr
    assert "rotated gather's grad_output offset past 2^31 bins" in run.stdout
    assert run.stdout.count(" ok\n") >= 5, run.stdout
