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
