"""The CPU backends fuzzed against each other (scripts/backend_fuzz.py): a few hundred random, often malformed
one-node models of every operator and name, each run on ONNX Runtime, OpenVINO and the reference runner in worker
processes with a per-case timeout: no crash, no hang, and where ONNX Runtime returns outputs the others agree with
them. Also: the harness reports a backend that crashes, hangs or answers wrong (it can fail)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

pytest.importorskip("openvino", reason="the openvino extra is not installed (pip install dcnkit[openvino])")

from dcnkit.runtime.openvino import openvino_reason  # noqa: E402

pytestmark = pytest.mark.skipif(openvino_reason() is not None, reason=f"openvino backend: {openvino_reason()}")

CI_CASES = 400


def test_every_backend_on_the_fuzz_cases():
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "backend_fuzz.py"), "--cases", str(CI_CASES),
                        "--seed", "0", "--timeout", "60"], capture_output=True, text=True, timeout=900)
    summary = p.stdout[p.stdout.rfind("backend_fuzz:"):]
    assert p.returncode == 0, p.stdout[-6000:]
    assert f"{CI_CASES} cases" in summary and " 0 failures" in summary, summary
    agreed, compared = (int(v) for v in summary.split(";")[1].split("comparisons")[0].split(" of "))
    assert agreed == compared > CI_CASES // 2, summary  # most cases run on ONNX Runtime and are compared


@pytest.mark.parametrize("fault, outcome", [("crash", "crash"), ("hang", "hang"), ("wrong", "disagrees")])
def test_the_harness_reports_a_faulty_backend(fault, outcome, monkeypatch):
    import backend_fuzz

    monkeypatch.setenv("FUZZ_FAULTY_BACKEND", "reference")
    monkeypatch.setenv("FUZZ_FAULT", fault)
    monkeypatch.syspath_prepend(str(ROOT / "tests"))
    lines = []
    # case 1 of seed 0 runs on ONNX Runtime (its outputs are compared)
    tally = backend_fuzz.fuzz(range(1, 2), 0, timeout=20 if fault == "hang" else 120,
                              target="backend_fuzz_faults:run_case", log=lines.append)
    assert [f[2:4] for f in tally.failures] == [("reference", outcome)], tally.failures
    assert "replay: python scripts/backend_fuzz.py --seed 0 --case 1" in lines[0]
