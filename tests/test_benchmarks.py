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


def test_bench_cpu_gemm_quick(tmp_path):
    stdout, res = _run("bench_cpu_gemm", tmp_path)
    assert "OpenBLAS ms / CPU ms" in stdout  # the library the ORT library links; MKL / oneDNN only where installed
    (row,) = res
    assert (row["m"], row["n"], row["k"]) == (32, 40, 72) and row["ms"]["OpenBLAS"] > 0


def test_bench_openvino_quick(tmp_path):
    from dcnkit.runtime.registry import available_backends

    reason = available_backends().get("openvino")
    if reason:
        pytest.skip(reason)
    stdout, res = _run("bench_openvino", tmp_path, "--models", "resnet50", "--bf16")
    (row,) = res
    assert row["case"] == "ResNet-50-DCN 224" and set(row["ms"]) == {"ov native", "ov kit", "ort kit", "ov kit bf16",
                                                                   "ov kit bf16 f32 gemm"}
    assert row["ratio_vs_ort_kit"]["ort kit"] == 1.0 and all(v > 0 for v in row["ms"].values())
    assert "differs from ort kit" not in stdout  # the float32 sides compute the same logits (1e-3)
    assert "ov kit bf16 output output: max |diff|" in stdout  # bf16's agreement is reported, not asserted
    assert "ov kit bf16 f32 gemm output output: max |diff|" in stdout


def test_bench_ort_deform_conv_quick(tmp_path):
    stdout, res = _run("bench_ort_deform_conv", tmp_path)
    assert "ORT DeformConv ms" in stdout
    assert [r["stride"] for r in res] == [1, 2]  # stride 2 as in a ResNet stage's first block
    for row in res:
        assert set(row["ms"]) >= {"kit", "kit (rewrite)", "built-in", "torch"}
        # Accuracy against the kit's output, per implementation, in the JSON (and printed).
        assert [a["name"] for a in row["accuracy"]] == ["kit (rewrite) vs kit, cpu", "built-in vs kit, cpu",
                                                        "torch vs kit, cpu"]
        assert all(a["ok"] and a["max_abs_diff"] < 1e-4 for a in row["accuracy"])
    assert "accuracy built-in vs kit, cpu [float32]" in stdout


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


def test_accuracy_within_rounding_is_reported_and_a_wrong_result_stops_the_benchmark(capsys):
    """A benchmark reports each implementation's difference from its reference per precision: a difference within
    that precision's rounding (GPU sums in another order, TF32, float16) does not abort it; a wrong result does."""
    import numpy as np

    sys.path.insert(0, str(BENCH))
    import _common as C

    want = np.linspace(-3, 3, 1000).astype(np.float32)
    r = C.check_accuracy("gpu sums", want + 2e-5, want)  # ~2e-5 (the H100's float32 RoIAlign): float32 rounding
    assert r["ok"] and abs(r["max_abs_diff"] - 2e-5) < 1e-6 and r["scale"] == 3.0
    assert C.check_accuracy("tf32 conv", want + 6e-4 * 3, want, "tf32")["ok"]  # ORT's TF32 DeformConv on a GPU
    assert C.check_accuracy("resnet tf32", want * 10.3 / 3 + 0.037, want * 10.3 / 3, "tf32")["ok"]
    assert C.check_accuracy("fp16", (want.astype(np.float16)).astype(np.float32), want, "float16")["ok"]
    assert "accuracy gpu sums [float32]: max |diff| 2e-05" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="a wrong result, not rounding"):
        C.check_accuracy("wrong", want + 0.1, want, "tf32")
    with pytest.raises(SystemExit, match="wrong result"):
        C.check_accuracy("float32 off by 1e-3", want + 1e-2, want)
    with pytest.raises(SystemExit, match="shape"):
        C.check_accuracy("shape", want[:10], want)


def test_bench_dcnv3_quick(tmp_path):
    stdout, res = _run("bench_dcnv3", tmp_path)
    assert "dcnv4 / dcnv3" in stdout
    assert [r["case"] for r in res["rows"]] == ["forward", "forward+backward"]
    for r in res["rows"]:
        assert r["dcnv3_ms"] > 0 and r["dcnv4_ms"] > 0 and r["grid_sample_ms"] > 0
        assert all(a["ok"] for a in r["accuracy"])
    assert "DCNv4 / DCNv3 layer" in stdout
    assert [r["shape"] for r in res["layer_rows"]] == ["quick"]
    for r in res["layer_rows"]:
        assert r["dcnv3_layer_ms"] > 0 and r["dcnv4_layer_ms"] > 0


def test_bench_int8_quick(tmp_path):
    pytest.importorskip("onnxscript")
    stdout, res = _run("bench_int8", tmp_path, "--calibration", "2")
    assert "int8 / fp32" in stdout
    from dcnkit.runtime.quantize_qdeform import qdeform_available

    # One row per writer (--quick: dcnkit export and TorchScript opset 17); with oneDNN, int8 runs QDeformConv2d and
    # the float DCN between Q/DQ is measured beside it.
    extra = {"ResNet-50-DCN dcnkit int8 float-DCN"} if qdeform_available() else set()
    assert set(res["ms"]) == {f"ResNet-50-DCN {w} {v}" for w in ("dcnkit", "ts17") for v in ("fp32", "int8")} | extra
    assert all(0.9 < c <= 1.0 + 1e-9 for c in res["cosine_min"].values())
    nodes = res["int8_nodes"]  # the same int8 graph from both writers
    assert nodes["ResNet-50-DCN ts17"] == nodes["ResNet-50-DCN dcnkit"]
    assert nodes["ResNet-50-DCN dcnkit"]["Conv"] > 0 and set(res["writer_ratio"]) == {"dcnkit", "ts17"}
    assert "int8 / fp32 across 2 writers" in stdout


def test_bench_serve_quick(tmp_path):
    """The light server vs --engine triton (skipped where tritonserver cannot run)."""
    pytest.importorskip("tritonclient.http")
    from dcnkit.runtime.triton_server import unavailable_reason

    if unavailable_reason():
        pytest.skip(f"tritonserver cannot run here: {unavailable_reason()}")
    stdout, res = _run("bench_serve", tmp_path)
    assert "triton/light" in stdout
    assert [r["concurrency"] for r in res["rows"]] == [1, 4]
    for r in res["rows"]:
        for engine in ("light", "triton"):
            assert r[engine]["rps"] > 0 and 0 < r[engine]["p50_ms"] <= r[engine]["p99_ms"]


def test_bench_rfcn_quick(tmp_path):
    stdout, res = _run("bench_rfcn", tmp_path)
    assert "R-FCN head (both DeformPSRoIPool passes)" in stdout and "ORT profile" in stdout
    assert res["psroi_nodes"] == [[6, False], [2, False], [3, True], [8, True]]  # 3 classes with the background
    assert res["ms"]["ort"] > 0 and res["ms"]["eager"] > 0 and res["profile_ms"]["DeformPSRoIPool"] > 0
    assert [a["name"] for a in res["accuracy"]] == ["ORT vs eager, class_logits", "ORT vs eager, box_deltas"]
    assert all(a["ok"] for a in res["accuracy"])
