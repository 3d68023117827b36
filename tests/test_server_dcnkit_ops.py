"""dcnkit serve with the kit's own ONNX ops (domain "dcnkit", run by libdcnkit_ort.so), checked against the
NumPy references of docs/operators.md; and the `dcnkit serve` command in a subprocess, stopped with SIGTERM."""
from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
httpclient = pytest.importorskip("tritonclient.http")
from onnx import TensorProto, helper  # noqa: E402

import dcnkit  # noqa: E402
from dcnkit import reference  # noqa: E402
from dcnkit.server import create_app  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from server_process import free_port, serving  # noqa: E402
from test_server import LiveServer  # noqa: E402


def _have_ort_library() -> bool:
    try:
        dcnkit.ort_library()
        return True
    except FileNotFoundError:
        return False


needs_ort_lib = pytest.mark.skipif(not _have_ort_library(), reason="the kit's ONNX Runtime library is not built")

CIN, COUT, HW = 4, 5, 6


def _dcn_model(weight, bias):
    """dcnkit::DeformConv2d 3x3, padding 1: input (batch, 4, 6, 6), offset (batch, 18, 6, 6) -> (batch, 5, 6, 6)."""
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", CIN, HW, HW])
    off = helper.make_tensor_value_info("offset", TensorProto.FLOAT, ["batch", 18, HW, HW])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", COUT, HW, HW])
    node = helper.make_node("DeformConv2d", ["input", "offset", "weight", "bias"], ["output"], domain="dcnkit",
                            stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1, deformable_groups=1)
    inits = [onnx.numpy_helper.from_array(weight, "weight"), onnx.numpy_helper.from_array(bias, "bias")]
    g = helper.make_graph([node], "dcn", [x, off], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("dcnkit", 1)])
    m.ir_version = 9
    return m


def _roi_model():
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", CIN, 8, 8])
    rois = helper.make_tensor_value_info("rois", TensorProto.FLOAT, ["K", 5])
    out = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["K", CIN, 2, 2])
    node = helper.make_node("RoIAlign", ["input", "rois"], ["output"], domain="dcnkit", output_size=[2, 2],
                            spatial_scale=0.5, sampling_ratio=2, aligned=1)
    g = helper.make_graph([node], "roi", [x, rois], [out])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("dcnkit", 1)])
    m.ir_version = 9
    return m


@needs_ort_lib
def test_serve_deform_conv2d_batched():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((COUT, CIN, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(COUT).astype(np.float32)
    app = create_app(_dcn_model(weight, bias), name="dcn", max_batch_size=8, max_queue_delay_ms=100)
    assert app.state.batching
    srv = LiveServer(app)
    try:
        def one(i):
            c = httpclient.InferenceServerClient(url=srv.url)
            n = 1 + i % 2
            r = np.random.default_rng(10 + i)
            x = r.standard_normal((n, CIN, HW, HW)).astype(np.float32)
            off = (2.0 * r.standard_normal((n, 18, HW, HW))).astype(np.float32)
            ins = [httpclient.InferInput("input", list(x.shape), "FP32"),
                   httpclient.InferInput("offset", list(off.shape), "FP32")]
            ins[0].set_data_from_numpy(x)
            ins[1].set_data_from_numpy(off, binary_data=bool(i % 2))
            y = c.infer("dcn", ins).as_numpy("output")
            c.close()
            return x, off, y

        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(one, range(12)))
        for x, off, y in results:
            want = reference.deform_conv2d(x, off, weight, bias, stride=1, padding=1, dilation=1)
            np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
        st = app.state.batcher.stats
        assert st.inference_count == 12 and st.execution_count < 12
    finally:
        assert srv.stop()


@needs_ort_lib
def test_serve_roi_align_unbatched_and_op_errors():
    app = create_app(_roi_model(), name="roi", max_batch_size=8)
    assert not app.state.batching
    srv = LiveServer(app)
    try:
        c = httpclient.InferenceServerClient(url=srv.url)
        rng = np.random.default_rng(1)
        x = rng.standard_normal((2, CIN, 8, 8)).astype(np.float32)
        rois = np.array([[0, 1.0, 2.0, 11.0, 9.5], [1, 0.0, 0.0, 15.0, 15.0], [1, 4.0, 3.0, 6.0, 12.0]], np.float32)
        ins = [httpclient.InferInput("input", list(x.shape), "FP32"),
               httpclient.InferInput("rois", list(rois.shape), "FP32")]
        ins[0].set_data_from_numpy(x)
        ins[1].set_data_from_numpy(rois)
        y = c.infer("roi", ins).as_numpy("output")
        want = reference.roi_align(x, rois, (2, 2), spatial_scale=0.5, sampling_ratio=2, aligned=True)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
        # The op's own check (a batch index outside [0, N)) comes back as 400 with its message.
        rois_bad = rois.copy()
        rois_bad[1, 0] = 7
        ins[1].set_data_from_numpy(rois_bad)
        with pytest.raises(Exception, match=r"roi_align: rois\[1, 0\] \(batch index\): expected a value in "
                                            r"\[0, 2\).*got 7") as e:
            c.infer("roi", ins)
        assert e.value.status() == "400"
        # ... and does not hurt the next request.
        ins[1].set_data_from_numpy(rois)
        np.testing.assert_allclose(c.infer("roi", ins).as_numpy("output"), want, rtol=1e-5, atol=1e-6)
        c.close()
    finally:
        assert srv.stop()


def test_cli_serve_subprocess_sigterm(tmp_path):
    """`dcnkit serve` for real: answers tritonclient, then exits 0 on SIGTERM after draining."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    g = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "neg", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    path = tmp_path / "negate.onnx"
    onnx.save(m, str(path))
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(dcnkit.__file__).parents[1]),
                                                      os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "dcnkit.cli", "serve", str(path), "--host", "127.0.0.1", "--port", str(port),
           "--max-batch-size", "4", "--max-queue-delay-ms", "1", "--log-level", "info"]
    with serving(cmd, port, env=env, cwd=tmp_path, timeout=90) as proc:
        c = httpclient.InferenceServerClient(url=f"127.0.0.1:{port}")
        assert c.get_model_metadata("negate")["inputs"][0]["shape"] == [-1, 3]
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        inp = httpclient.InferInput("x", [2, 3], "FP32")
        inp.set_data_from_numpy(a)
        np.testing.assert_array_equal(c.infer("negate", [inp]).as_numpy("y"), -a)
        c.close()
    assert "draining 0 queued request(s)" in proc.log and "dcnkit serve: stopped" in proc.log, proc.log


def test_cli_serve_bad_arguments(tmp_path):
    from dcnkit.server.cli import main

    assert main(["serve", str(tmp_path / "missing.onnx")]) == 2
    with pytest.raises(SystemExit):
        main(["serve", "m.onnx", "--max-queue-size", "0"])
    with pytest.raises(SystemExit):
        main(["serve", "m.onnx", "--backend", "tpu"])
