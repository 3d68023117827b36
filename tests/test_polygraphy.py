"""The Polygraphy extension (``polygraphy run --dcnkit --dcnkit-reference``) and the Python API path."""
from __future__ import annotations

import os
import subprocess
import sys
from collections import OrderedDict
from importlib import metadata
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

pytest.importorskip("polygraphy")

from dcnkit import reference as ref  # noqa: E402
from dcnkit.polygraphy_ext import compare_backends, error_stats, polygraphy_runner  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
POLYGRAPHY = Path(sys.executable).with_name("polygraphy")


def _entry_point_installed() -> bool:
    eps = metadata.entry_points()
    group = eps.select(group="polygraphy.run.plugins") if hasattr(eps, "select") else eps.get("polygraphy.run.plugins", [])
    return any(ep.value.startswith("dcnkit.polygraphy_ext") for ep in group)


@pytest.fixture(scope="module")
def polygraphy_env(tmp_path_factory):
    """Environment in which ``polygraphy run`` finds the extension through its entry point: the installed
    dcnkit distribution when there is one, else a minimal dist-info declaring the same entry point as
    pyproject.toml."""
    env = dict(os.environ)
    paths = [str(ROOT / "python")]
    if not _entry_point_installed():
        site = tmp_path_factory.mktemp("site")
        info = site / "dcnkit_polygraphy_ext-0.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dcnkit-polygraphy-ext\nVersion: 0.0\n")
        # The same line as [project.entry-points."polygraphy.run.plugins"] in pyproject.toml.
        text = (ROOT / "pyproject.toml").read_text()
        assert '[project.entry-points."polygraphy.run.plugins"]\ndcnkit = "dcnkit.polygraphy_ext:arg_groups"' in text
        (info / "entry_points.txt").write_text("[polygraphy.run.plugins]\ndcnkit = dcnkit.polygraphy_ext:arg_groups\n")
        paths.append(str(site))
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH")] if p])
    return env


@pytest.fixture(scope="module")
def custom_model(tmp_path_factory):
    """A model with a dcnkit-domain DeformConv2d (DCNv2) followed by a standard Relu."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    nodes = [
        helper.make_node("DeformConv2d", ["x", "offset", "w", "b", "mask"], ["d"], domain="dcnkit",
                         padding=[1, 1], stride=[1, 1], dilation=[1, 1], groups=1, deformable_groups=1),
        helper.make_node("Relu", ["d"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 6, 6]),
         helper.make_tensor_value_info("offset", T.FLOAT, [1, 18, 6, 6]),
         helper.make_tensor_value_info("mask", T.FLOAT, [1, 9, 6, 6])],
        [helper.make_tensor_value_info("y", T.FLOAT, None)],
        initializer=[helper.make_tensor("w", T.FLOAT, w.shape, w.ravel()), helper.make_tensor("b", T.FLOAT, b.shape, b)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dcnkit", 1)],
                          ir_version=10)
    path = tmp_path_factory.mktemp("pg") / "custom.onnx"
    onnx.save(m, str(path))
    return path, w, b


def _polygraphy(env, *args):
    cmd = [str(POLYGRAPHY)] if POLYGRAPHY.exists() else [sys.executable, "-m", "polygraphy"]
    return subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True, env=env, timeout=300)


def test_polygraphy_run_loads_the_extension(polygraphy_env, custom_model):
    path = custom_model[0]
    p = _polygraphy(polygraphy_env, "run", "--help")
    assert p.returncode == 0, p.stderr
    assert "--dcnkit-reference" in p.stdout and "--dcnkit" in p.stdout and "dcnkit.ort_library()" in p.stdout

    # Without --dcnkit, ONNX Runtime cannot load the dcnkit-domain node.
    p = _polygraphy(polygraphy_env, "run", path, "--onnxrt")
    assert p.returncode != 0
    assert "dcnkit" in (p.stdout + p.stderr)

    # With it: the kit's library is registered, and the reference runner agrees.
    p = _polygraphy(polygraphy_env, "run", path, "--onnxrt", "--dcnkit", "--dcnkit-reference",
                    "--atol", "1e-4", "--rtol", "1e-4", "--val-range", "[0,1]")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "Creating ONNX-Runtime session with the dcnkit library" in out
    assert "dcnkit-reference-runner" in out
    assert "PASSED" in out and "FAILED" not in out


def test_polygraphy_gen_script_uses_the_extension(polygraphy_env, custom_model, tmp_path):
    script = tmp_path / "cmp.py"
    p = _polygraphy(polygraphy_env, "run", custom_model[0], "--onnxrt", "--dcnkit-ops", "--dcnkit-reference",
                    "--gen-script", script)
    assert p.returncode == 0, p.stderr
    text = script.read_text()
    assert "from dcnkit.polygraphy_ext import SessionFromOnnxWithDcnkit" in text
    assert "PolygraphyReferenceRunner" in text
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=polygraphy_env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_python_api_onnxrt_runner_with_ort_session_factory(custom_model):
    from polygraphy.backend.onnxrt import OnnxrtRunner
    from polygraphy.comparator import Comparator, SimpleCompareFunc

    from dcnkit.runtime import ort_session
    from dcnkit.runtime.reference_runner import PolygraphyReferenceRunner

    path, w, b = custom_model
    rng = np.random.default_rng(3)
    feed = OrderedDict(x=rng.standard_normal((1, 3, 6, 6)).astype(np.float32),
                       offset=rng.standard_normal((1, 18, 6, 6)).astype(np.float32),
                       mask=rng.random((1, 9, 6, 6)).astype(np.float32))
    runners = [OnnxrtRunner(lambda: ort_session(str(path), providers=["CPUExecutionProvider"])),
               PolygraphyReferenceRunner(str(path))]
    results = Comparator.run(runners, data_loader=[feed])
    assert bool(Comparator.compare_accuracy(results, compare_func=SimpleCompareFunc(atol=1e-4, rtol=1e-4)))
    want = np.maximum(ref.deform_conv2d(feed["x"], feed["offset"], w, b, padding=(1, 1), mask=feed["mask"]), 0)
    for _, iters in results:
        np.testing.assert_allclose(np.asarray(iters[0]["y"]), want, rtol=1e-4, atol=1e-4)


def test_compare_backends_helper_and_runner_factory(custom_model):
    path = custom_model[0]
    rng = np.random.default_rng(4)
    feeds = [dict(x=rng.standard_normal((1, 3, 6, 6)).astype(np.float32),
                  offset=rng.standard_normal((1, 18, 6, 6)).astype(np.float32),
                  mask=rng.random((1, 9, 6, 6)).astype(np.float32)) for _ in range(2)]
    passed, stats, results = compare_backends(path, ["ort-cpu", "reference"], feeds, atol=1e-4, rtol=1e-4)
    assert passed
    assert len(stats) == 1 and stats[0]["output"] == "y" and stats[0]["runner"] == "reference"
    assert 0 <= stats[0]["mean_abs"] <= stats[0]["max_abs"] < 1e-4
    assert [r[0] for r in results] == ["ort-cpu", "reference"] and len(results[0][1]) == 2
    with pytest.raises(ValueError, match="backend: expected one of"):
        polygraphy_runner(path, "gpu")


def test_error_stats_values():
    from polygraphy.comparator.struct import IterationResult, RunResults

    a = OrderedDict(y=np.array([1.0, 2.0, -4.0, 0.0], np.float32))
    b = OrderedDict(y=np.array([1.5, 2.0, -3.0, 0.25], np.float32))
    results = RunResults([("ref", [IterationResult(a, runner_name="ref")]),
                          ("other", [IterationResult(b, runner_name="other")])])
    (row,) = error_stats(results)
    assert row["runner"] == "other" and row["reference"] == "ref"
    assert row["max_abs"] == pytest.approx(1.0)
    assert row["mean_abs"] == pytest.approx((0.5 + 0 + 1 + 0.25) / 4)
    assert row["max_rel"] == pytest.approx(0.5)  # zeros of the reference are skipped in relative error
    assert row["mean_rel"] == pytest.approx((0.5 + 0 + 0.25) / 3)
