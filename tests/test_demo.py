"""dcnkit demo: a DCNv2 digits classifier trained, exported, run in ONNX Runtime and compared with Polygraphy."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")

from dcnkit import demo  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_demo_split_is_fixed_and_stratified():
    a = demo.load_digits_split(0)
    b = demo.load_digits_split(0)
    x_tr, y_tr, x_te, y_te = a
    assert x_tr.shape[1:] == (1, 8, 8) and x_tr.dtype == np.float32
    assert len(x_tr) + len(x_te) == 1797 and len(x_te) == 360
    assert x_tr.min() >= -1 and x_tr.max() <= 1
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    assert np.bincount(y_te, minlength=10).min() >= 35  # stratified: every digit is in the test split


def test_demo_model_has_a_modulated_deformable_conv():
    import torch

    from dcnkit.nn import ModulatedDeformConv2dPack

    m = demo.build_model()
    assert any(isinstance(x, ModulatedDeformConv2dPack) for x in m.modules())
    assert m(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


def test_demo_reduced_run_trains_exports_and_compares(tmp_path):
    lines = []
    s = demo.run_demo(out=tmp_path, epochs=6, train_fraction=0.5, reference_samples=8, seed=0, log=lines.append)
    text = "\n".join(lines)
    # Real learning on held-out digits (chance is 0.1).
    assert s["test_accuracy_torch"] > 0.85, text
    # ONNX Runtime with the kit's library computes the same network.
    assert s["deformable_nodes"] == ["dcnkit::DeformConv2d"]
    assert abs(s["test_accuracy_ort"] - s["test_accuracy_torch"]) <= 1 / 360 + 1e-9
    assert s["max_abs_diff_torch_ort"] < 1e-3
    assert s["comparison_passed"] and s["compared_backends"][0] == "ort-cpu" and "reference" in s["compared_backends"]
    row = next(r for r in s["comparison"] if r["runner"] == "reference")
    assert row["max_abs"] < 1e-4
    for b, reason in s["skipped"].items():
        assert f"{b}: skipped: {reason}" in text
    assert (tmp_path / "dcn_digits.onnx").is_file() and (tmp_path / "model.pt").is_file()
    assert json.loads((tmp_path / "summary.json").read_text())["test_accuracy_ort"] == s["test_accuracy_ort"]
    assert "PyTorch: train accuracy" in text and "ONNX Runtime (kit's library): test accuracy" in text
    assert "largest output difference" in text


@pytest.mark.slow
def test_demo_command_full(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    p = subprocess.run([sys.executable, "-m", "dcnkit", "demo", "--out", str(tmp_path)], capture_output=True,
                       text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["test_accuracy_torch"] > 0.95 and s["test_accuracy_ort"] > 0.95
    assert s["seconds"] > 0  # reported; its speed is the README's business, not a timed assertion
