"""`.ci/gpu` on a machine without a GPU: one skip line and exit 0, nothing installed, no virtual environment made
(it uses the Python whose torch sees a GPU as it is; a venv made from a venv loses that venv's torch)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_ci_without_a_gpu_skips_and_installs_nothing(tmp_path):
    import torch

    if torch.cuda.is_available():
        import pytest

        pytest.skip("a GPU is present: .ci/gpu would build and test")
    env = dict(os.environ, PYTHON=sys.executable)
    r = subprocess.run(["bash", str(ROOT / ".ci" / "gpu")], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "skip: no Python here whose torch sees a GPU" in r.stdout
    assert "installing" not in r.stdout
    assert not (ROOT / ".venv-gpu").exists()


def test_gpu_ci_makes_no_virtual_environment():
    text = (ROOT / ".ci" / "gpu").read_text()
    assert "-m venv" not in text and "--system-site-packages " not in text.replace("with --system-site-packages", "")
    assert "--target" in text  # what is missing goes into a folder on PYTHONPATH


def test_gpu_ci_script_parses_and_runs_the_report():
    r = subprocess.run(["bash", "-n", str(ROOT / ".ci" / "gpu")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "benchmarks/gpu_report.py --out build/gpu-report" in (ROOT / ".ci" / "gpu").read_text()


def test_gpu_report_dry_run_writes_one_json_and_one_table_with_the_model(tmp_path):
    # Without a GPU: nothing measured; every row of issue 25 item 7 present with its target and the model's time.
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_report.py"), "--dry-run", "--no-kernel-report",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    import json

    report = json.loads((tmp_path / "report.json").read_text())
    md = (tmp_path / "report.md").read_text()
    assert "| model ms |" in md and "skip: measurements (--dry-run)" in md
    dcn = [x for x in report["rows"] if x["group"] == "DCN"]
    assert len(dcn) == 3 * 3 * 2 and {x["dtype"] for x in dcn} == {"float32", "float16", "bfloat16"}
    assert [x["case"] for x in report["rows"] if x["group"] == "RoIAlign"] == [
        "avg forward", "avg forward+backward", "max forward", "max forward+backward"]
    assert all(x["ms"] is None and x["model_ms"] > 0 for x in report["rows"])
    # the model: backward costs more than forward; the (8,32,128,128) forward target is the tighter 0.5x
    f32 = {x["case"]: x for x in dcn if x["dtype"] == "float32"}
    assert f32["(8, 32, 128, 128) forward+backward"]["model_ms"] > f32["(8, 32, 128, 128) forward"]["model_ms"]
    assert f32["(8, 32, 128, 128) forward"]["target"] == 0.5 and f32["(1, 64, 64, 64) forward"]["target"] == 0.8
    assert report["tensorrt_enqueue"] is None and "skip: TensorRT plugins' enqueue on device buffers" in md
    # peak memory at every benchmark shape and dtype, against the target fwd+bwd <= torchvision's
    shapes = ((1, 64, 64, 64), (4, 256, 32, 32), (8, 32, 128, 128))
    assert [(tuple(m["shape"]), m["dtype"]) for m in report["dcn_memory"]] == [
        (s, d) for d in ("float32", "float16", "bfloat16") for s in shapes]
    assert all(m["ratio"] is None and m["target"] == 1.0 for m in report["dcn_memory"])


def test_gpu_report_memory_rows_compare_fwd_bwd_peak_with_torchvision():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_report

    def measure(shape, dtype):  # stand-in for bench_deform_conv2d.measure_memory's row
        if dtype == "bfloat16":
            return None  # the child failed: no figures
        mib = 2**20
        return {"batch": shape[0], "dcnkit_fwd_bytes": 10 * mib, "torchvision_fwd_bytes": 20 * mib,
                "dcnkit_fwdbwd_bytes": (30 if shape[1] == 64 else 50) * mib, "torchvision_fwdbwd_bytes": 40 * mib}

    rows = gpu_report.dcn_memory_rows(measure)
    assert len(rows) == 9
    by = {(tuple(r["shape"]), r["dtype"]): r for r in rows}
    assert by[((1, 64, 64, 64), "float32")]["ratio"] == 0.75 and by[((1, 64, 64, 64), "float32")]["meets"]
    assert by[((4, 256, 32, 32), "float16")]["ratio"] == 1.25 and by[((4, 256, 32, 32), "float16")]["meets"] is False
    assert by[((8, 32, 128, 128), "bfloat16")]["meets"] is None
    md = gpu_report.markdown([], None, [], None, rows)
    assert "| (1, 64, 64, 64) | float32 | 10.0 | 20.0 | 30.0 | 40.0 | 0.75 | yes |" in md
    assert "| (4, 256, 32, 32) | float16 | 10.0 | 20.0 | 50.0 | 40.0 | 1.25 | no |" in md
    assert "| (8, 32, 128, 128) | bfloat16 | - | - | - | - | - | - |" in md


def test_gpu_report_table_has_a_pass_fail_row_per_tensorrt_plugin():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_report

    rows = [{"plugin": "RoIAlign-avg", "dtype": "float16", "max_err": 1e-3, "allowed": 1e-2, "passed": True,
             "note": ""},
            {"plugin": "DCNv3", "dtype": "float32", "max_err": None, "allowed": 1e-4, "passed": False,
             "note": "FAILED DCNv3-float32: enqueue returned -1"}]
    md = gpu_report.markdown([], None, [], rows)
    assert "| RoIAlign-avg | float16 | 0.001 | 0.01 | pass |" in md
    assert "| DCNv3 | float32 | - | 0.0001 | FAIL: FAILED DCNv3-float32: enqueue returned -1 |" in md
    assert "TensorRT plugins' enqueue on device buffers" not in gpu_report.markdown([], None, [], None)


def test_gpu_model_reproduces_the_calibration_points():
    # The model's constants: torchvision's im2col (~114 SASS per column element) at (8,32,128,128) takes 0.17 ms
    # on an H100, the old dcnkit im2col (~507) 0.76 ms (measured 0.79).
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_model as M

    e = 8 * 32 * 9 * 128 * 128
    assert abs(M.kernel_ms(e, 114, 0) - 0.17) < 0.01
    assert abs(M.kernel_ms(e, 507, 0) - 0.76) < 0.01
    assert M.kernel_ms(e, 1, 3.0e9) == 1.0  # 3 GB at 3 TB/s: the DRAM bound


def test_dcn_memory_child_measures_dcnkit_where_torchvision_lacks_the_dtype():
    # torchvision's deform_conv2d has no bfloat16 kernel on the CPU: the memory row keeps dcnkit's figures and
    # says why torchvision's are absent, instead of the whole child failing.
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_deform_conv2d as bench

    rows = bench.measure_memory((1, 8, 12, 12), "bfloat16", "cpu", [1], False, 1)
    assert rows is not None and len(rows) == 1, rows
    assert "not implemented for 'BFloat16'" in rows[0]["torchvision_unsupported"]
    assert "torchvision_fwdbwd_bytes" not in rows[0] and isinstance(rows[0]["dcnkit_fwdbwd_bytes"], int)


def test_gpu_ci_runs_the_sanitizers_and_the_fuzz_first():
    text = (ROOT / ".ci" / "gpu").read_text()
    first = text.index("compute-sanitizer")
    assert first < text.index('pytest -m cuda tests -q') and first < text.index("benchmarks/gpu_report.py --out")
    assert '--tool "$1"' in text and "for tool in memcheck racecheck" in text and 'part "$tool" 0 "${cmd[@]}"' in text
    assert "fuzz_cases=10000" in text and 'scripts/cuda_fuzz.py --cases "$fuzz_cases"' in text
    # the short-lease mode keeps memcheck and the fuzz run, each under a time limit
    quick = text[text.index('if [ "$quick" = 1 ]; then\n  # side by side'):text.index("else\n  if [ -x")]
    assert "part memcheck" in quick and "part fuzz" in quick and "part pytest-cuda" in quick


def test_cuda_fuzz_without_a_gpu_says_so_and_its_cases_run_on_the_cpu():
    import torch

    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "cuda_fuzz.py"), "--cases", "3"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    if not torch.cuda.is_available():
        assert "no CUDA device usable" in r.stdout
    # the generator's cases are valid calls of the ops: 150 of them forward and backward on the CPU
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "cuda_fuzz.py"), "--cpu-check", "150"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "150 cases of ['deform_conv2d', 'deform_psroi_pool', 'deform_roi_pool', 'multi_level_roi_align', " \
           "'roi_align'] ran on the CPU" in r.stdout
