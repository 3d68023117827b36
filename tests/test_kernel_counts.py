"""Counting proxies of the CUDA schedules (issue 25, item 6): tests/cpp harnesses run the kernels' per-thread
DCNKIT_HD bodies over their launch grid with counting scalar types, print their table and exit 1 on a gate.
RoIAlign (tests/cpp/roi_plan_counts.cpp): RoI-field loads per output <= 0.1, one store per output."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CXX = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


@pytest.mark.skipif(CXX is None, reason="no C++ compiler (c++, g++ or clang++) on PATH")
def test_roi_align_plan_counts(tmp_path):
    exe = tmp_path / "roi_plan_counts"
    subprocess.run([CXX, "-std=c++17", "-O1", f"-I{ROOT / 'plugins' / 'core' / 'include'}", "-o", str(exe),
                    str(ROOT / "tests" / "cpp" / "roi_plan_counts.cpp")], check=True, capture_output=True, text=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    print(r.stdout)
    assert "| avg |" in r.stdout and "| max |" in r.stdout, r.stdout + r.stderr
    assert r.returncode == 0, r.stdout + r.stderr
