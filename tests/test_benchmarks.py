"""Every benchmark script runs (``--quick``: tiny shapes, one round) and prints its tables, so that they do not rot.
No timing is asserted: speed is what the scripts report, not what tests check."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def _run(script: str, tmp_path, *extra) -> tuple[str, object]:
    out = tmp_path / f"{script}.json"
    r = subprocess.run([sys.executable, str(BENCH / f"{script}.py"), "--quick", "--device", "cpu", "--threads", "1",
                        "--json", str(out), *extra], capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r.stdout, json.loads(out.read_text())


def test_bench_deform_conv2d_quick(tmp_path):
    stdout, res = _run("bench_deform_conv2d", tmp_path)
    assert "dcnkit/conv2d" in stdout and "peak extra memory" in stdout
    assert res["device"] == "cpu" and len(res["rows"]) == 2
    for row in res["rows"]:
        for impl in ("dcnkit", "conv2d", "torchvision"):
            assert row[f"{impl}_fwd_ms"] > 0 and row[f"{impl}_fwdbwd_ms"] > 0
    mem = res["memory"]["rows"]
    assert [m["batch"] for m in mem] == [1, 2]
    # The forward allocates at least its output (1 x 8 x 12 x 12 float32 for batch 1).
    assert mem[0]["output_bytes"] == 8 * 12 * 12 * 4
    assert all(m["dcnkit_fwd_bytes"] is None or m["dcnkit_fwd_bytes"] >= 0 for m in mem)


def test_bench_ort_deform_conv_quick(tmp_path):
    stdout, res = _run("bench_ort_deform_conv", tmp_path)
    assert "ORT DeformConv ms" in stdout
    (row,) = res
    assert set(row["ms"]) >= {"kit", "kit (rewrite)", "built-in", "torch"}


def test_bench_roi_align_quick(tmp_path):
    stdout, res = _run("bench_roi_align", tmp_path)
    assert "ORT RoiAlign ms" in stdout
    first = res["rows"][0]
    assert first["case"] == "roi_align avg forward"
    assert all(first[k] > 0 for k in ("dcnkit_ms", "torchvision_ms", "ort_kit_ms", "ort_builtin_ms"))


@pytest.mark.slow
def test_bench_resnet50_dcn_quick(tmp_path):
    pytest.importorskip("onnxscript")
    stdout, res = _run("bench_resnet50_dcn", tmp_path)
    assert "deformable layers" in stdout
    assert set(res["ms"]) >= {"PyTorch eager", "ORT built-in DeformConv", "ORT kit kernels"}


def test_bench_msda_quick(tmp_path):
    stdout, res = _run("bench_msda", tmp_path)
    assert "dcnkit / grid_sample" in stdout
    assert [r["case"] for r in res["rows"]] == ["PyTorch forward", "PyTorch forward+backward",
                                                "ONNX Runtime (CPU EP) forward"]
    assert all(r["dcnkit_ms"] > 0 and r["grid_sample_ms"] > 0 for r in res["rows"])
