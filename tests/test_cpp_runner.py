"""The C++ runner (runtime/cpp): configured, built and run on a model using the kit's ops; its outputs
must equal Python ONNX Runtime's on the same inputs."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dcnkit import reference as ref
from dcnkit.runtime import ort_session
from dcnkit.runtime.ort import ort_library

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "runtime" / "cpp"


def _tool(name):
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    cmake = _tool("cmake")
    if cmake is None:
        pytest.skip("cmake not found")
    build = tmp_path_factory.mktemp("cpp_runner_build")
    cmd = [cmake, "-S", str(SRC), "-B", str(build), f"-DPython_EXECUTABLE={sys.executable}"]
    if _tool("ninja"):
        cmd += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    subprocess.run([cmake, "--build", str(build), "-j", "2"], check=True, capture_output=True, text=True)
    exe = build / "dcnkit_ort_run"
    assert exe.is_file()
    return exe


def _model(path):
    """DeformConv2d (weights as initializers) feeding RoIAlign: the kit's ops chained in one graph."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((6, 4, 3, 3)) * 0.3).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    nodes = [
        helper.make_node("DeformConv2d", ["x", "offset", "w", "b", "mask"], ["feat"], domain="dcnkit", name="dcn",
                         padding=[1, 1]),
        helper.make_node("RoIAlign", ["feat", "rois"], ["pooled"], domain="dcnkit", name="roi", output_size=[2, 2],
                         spatial_scale=0.5, sampling_ratio=2, aligned=1),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, "H", "W"]),
         helper.make_tensor_value_info("offset", TensorProto.FLOAT, ["N", 18, "H", "W"]),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["N", 9, "H", "W"]),
         helper.make_tensor_value_info("rois", TensorProto.FLOAT, ["K", 5])],
        [helper.make_tensor_value_info("feat", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("pooled", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dcnkit", 1)],
                              ir_version=10)
    onnx.save(model, str(path))
    return w, b


def _run(exe, args):
    env = dict(os.environ)
    res = subprocess.run([str(exe), *args], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_cpp_runner_matches_python_onnxruntime(runner, tmp_path):
    model = tmp_path / "m.onnx"
    w, b = _model(model)
    rng = np.random.default_rng(1)
    feeds = {
        "x": rng.standard_normal((2, 4, 8, 9)).astype(np.float32),
        "offset": (rng.standard_normal((2, 18, 8, 9)) * 2).astype(np.float32),
        "mask": rng.uniform(0, 1, (2, 9, 8, 9)).astype(np.float32),
        "rois": np.array([[0, 1, 1, 10, 12], [1, 0, 2, 16, 14], [1, 5, 5, 6, 6]], np.float32),
    }
    args = ["--model", str(model), "--library", ort_library(), "--threads", "2", "--output-dir", str(tmp_path)]
    for k, v in feeds.items():
        np.save(tmp_path / f"{k}.npy", v)
        args += ["--input", f"{k}={tmp_path / (k + '.npy')}"]
    out = _run(runner, args)

    feat, pooled = ort_session(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    cpp_feat, cpp_pooled = np.load(tmp_path / "feat.npy"), np.load(tmp_path / "pooled.npy")
    np.testing.assert_allclose(cpp_feat, feat, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(cpp_pooled, pooled, rtol=1e-6, atol=1e-6)
    # and both equal the references
    exp_feat = ref.deform_conv2d(feeds["x"], feeds["offset"], w, b, (1, 1), (1, 1), (1, 1), feeds["mask"])
    np.testing.assert_allclose(cpp_feat, exp_feat, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(cpp_pooled, ref.roi_align(exp_feat, feeds["rois"], (2, 2), 0.5, 2, True),
                               rtol=1e-5, atol=1e-5)
    # printed shapes and checksums
    m = re.search(r"output pooled shape \[3, 6, 2, 2\] sum (\S+) abs_sum (\S+)", out)
    assert m, out
    assert float(m.group(1)) == pytest.approx(float(pooled.astype(np.float64).sum()), rel=1e-5, abs=1e-4)
    assert float(m.group(2)) == pytest.approx(float(np.abs(pooled.astype(np.float64)).sum()), rel=1e-5)


def test_cpp_runner_random_inputs_are_seeded(runner, tmp_path):
    model = tmp_path / "m.onnx"
    _model(model)
    # rois from a file (random rows would have invalid batch indices); the rest random.
    np.save(tmp_path / "rois.npy", np.array([[0, 0, 0, 6, 6]], np.float32))
    base = ["--model", str(model), "--library", ort_library(), "--input", f"rois={tmp_path / 'rois.npy'}",
            "--dim", "N=2", "--dim", "H=5", "--dim", "W=7"]
    a = _run(runner, base + ["--seed", "3"])
    b = _run(runner, base + ["--seed", "3"])
    c = _run(runner, base + ["--seed", "4"])
    assert "output feat shape [2, 6, 5, 7]" in a
    assert a == b
    assert a != c


def test_cpp_runner_reports_kernel_errors(runner, tmp_path):
    model = tmp_path / "m.onnx"
    _model(model)
    np.save(tmp_path / "rois.npy", np.array([[3, 0, 0, 6, 6]], np.float32))  # batch index 3 of N=1
    res = subprocess.run([str(runner), "--model", str(model), "--library", ort_library(), "--input",
                          f"rois={tmp_path / 'rois.npy'}"], capture_output=True, text=True)
    assert res.returncode == 1
    assert "roi" in res.stderr and "batch" in res.stderr, res.stderr
