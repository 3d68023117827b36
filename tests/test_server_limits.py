"""dcnkit serve, continued from test_server.py: request-size and queue limits, graceful shutdown, a model without
a shared batch dim, and create_app's arguments (each with a server of its own)."""
from __future__ import annotations

import gzip
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

from dcnkit.runtime.runners import make_runner  # noqa: E402
from dcnkit.server import create_app  # noqa: E402
from test_server import (GOOD, C, H, W, GatedRunner, LiveServer, _body, _direct, _metric, _roi_model,  # noqa: E402,F401
                         _x, model)

# ------------------------------------------------------------------------------------------------
# Limits and shutdown (each with a server of its own)
# ------------------------------------------------------------------------------------------------
def test_request_size_limit_413(model):
    app = create_app(model, name="ew", max_request_bytes=2000)
    srv = LiveServer(app)
    try:
        c = httpclient.InferenceServerClient(url=srv.url)
        x = _x(1)  # 240 bytes binary: fits
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_allclose(c.infer("ew", [inp]).as_numpy("y"), 2 * x + 1, rtol=1e-6)
        x = _x(3)  # 720 bytes of binary but ~2.5 kB as JSON
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=False)
        with pytest.raises(InferenceServerException, match=r"expected at most 2000 bytes") as e:
            c.infer("ew", [inp])
        assert e.value.status() == "413"
        c.close()
        # A small gzip body that inflates past the limit is refused too.
        big = _body([dict(GOOD, data=[0.0] * 60)]) + b" " * 5000
        r = srv.http("POST", "/v2/models/ew/infer", content=gzip.compress(big), headers={"Content-Encoding": "gzip"})
        assert r.status_code == 413 and "once decompressed" in r.json()["error"]
    finally:
        assert srv.stop()


def test_queue_full_503(model):
    gated = GatedRunner(make_runner(model, "ort-cpu"))
    app = create_app(gated, name="ew", max_batch_size=1, max_queue_size=2)
    srv = LiveServer(app)
    x = _x(1, seed=1)
    body = _body([{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}])
    try:
        with ThreadPoolExecutor(3) as pool:
            first = pool.submit(srv.http, "POST", "/v2/models/ew/infer", content=body)
            assert gated.entered.wait(20)  # the worker is busy with the first request
            queued = [pool.submit(srv.http, "POST", "/v2/models/ew/infer", content=body) for _ in range(2)]
            deadline = time.monotonic() + 20
            while app.state.batcher.depth < 2:
                assert time.monotonic() < deadline, "requests never reached the queue"
                time.sleep(0.01)
            r = srv.http("POST", "/v2/models/ew/infer", content=body)
            assert r.status_code == 503
            assert "queue: full (2 requests waiting" in r.json()["error"]
            text = srv.http("GET", "/metrics").text
            assert _metric(text, "dcnkit_queue_depth", 'model="ew"') == 2
            assert _metric(text, "dcnkit_requests_total", 'model="ew",status="503"') == 1
            gated.gate.set()
            for f in [first, *queued]:
                res = f.result(30)
                assert res.status_code == 200, res.text
                y = np.array(res.json()["outputs"][0]["data"], np.float32).reshape(x.shape)
                np.testing.assert_allclose(y, 2 * x + 1, rtol=1e-6)
    finally:
        gated.gate.set()
        assert srv.stop()


def test_graceful_shutdown_finishes_inflight_and_queued(model):
    gated = GatedRunner(make_runner(model, "ort-cpu"))
    app = create_app(gated, name="ew", max_batch_size=4, max_queue_delay_ms=1)
    srv = LiveServer(app)
    xs = [_x(1, seed=s) for s in range(4)]
    bodies = [_body([{"name": "x", "shape": [1, C, H, W], "datatype": "FP32", "data": x.ravel().tolist()}])
              for x in xs]
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(srv.http, "POST", "/v2/models/ew/infer", content=bodies[0])
        assert gated.entered.wait(20)
        rest = [pool.submit(srv.http, "POST", "/v2/models/ew/infer", content=b) for b in bodies[1:]]
        deadline = time.monotonic() + 20
        while app.state.batcher.depth < 3:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        srv.server.should_exit = True  # what uvicorn's SIGTERM handler does
        time.sleep(0.2)
        assert srv.thread.is_alive()  # still draining: the model is held
        gated.gate.set()
        responses = [f.result(30) for f in [first, *rest]]
    assert srv.stop()
    for x, r in zip(xs, responses):
        assert r.status_code == 200, r.text
        y = np.array(r.json()["outputs"][0]["data"], np.float32).reshape(x.shape)
        np.testing.assert_allclose(y, 2 * x + 1, rtol=1e-6)
    b = app.state.batcher
    assert not b.accepting and not b._thread.is_alive() and b.depth == 0
    assert b.stats.inference_count == 4 and b.stats.execution_count == 2  # 1 alone, then 3 batched
    with pytest.raises(Exception, match="shutting down"):
        b.submit({"x": xs[0]})


# ------------------------------------------------------------------------------------------------
# A model whose inputs do not share a batch dim (RoI style): never batched, still correct
# ------------------------------------------------------------------------------------------------
def test_roi_model_is_not_batched():
    model = _roi_model()
    app = create_app(model, name="roi", max_batch_size=8, max_queue_delay_ms=50)
    assert not app.state.batching
    srv = LiveServer(app)
    try:
        c = httpclient.InferenceServerClient(url=srv.url)
        md = c.get_model_metadata("roi")
        assert [i["shape"] for i in md["inputs"]] == [[-1, 2, 8, 8], [-1, 4], [-1]]
        assert md["inputs"][2]["datatype"] == "INT64"
        assert c.get_model_config("roi")["max_batch_size"] == 0
        rng = np.random.default_rng(0)

        def one(i):
            cl = httpclient.InferenceServerClient(url=srv.url)
            x = rng.standard_normal((2, 2, 8, 8)).astype(np.float32)
            k = 1 + i % 3
            rois = np.tile(np.array([[0.5, 1.0, 6.0, 7.5]], np.float32), (k, 1)) + i * 0.1
            bi = (np.arange(k) % 2).astype(np.int64)
            ins = [httpclient.InferInput("x", list(x.shape), "FP32"),
                   httpclient.InferInput("rois", list(rois.shape), "FP32"),
                   httpclient.InferInput("batch_indices", list(bi.shape), "INT64")]
            for t, a in zip(ins, (x, rois, bi)):
                t.set_data_from_numpy(a, binary_data=bool(i % 2))
            out = cl.infer("roi", ins).as_numpy("out")
            cl.close()
            return (x, rois, bi), out

        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(one, range(8)))
        for (x, rois, bi), out in results:
            want = _direct(model, {"x": x, "rois": rois, "batch_indices": bi})["out"]
            np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-7)
        st = c.get_inference_statistics("roi")["model_stats"][0]
        assert st["execution_count"] == st["inference_count"] == 8
        # A bad batch index is the model's error: 400 for that request, with ONNX Runtime's message.
        bad = _body([{"name": "x", "shape": [1, 2, 8, 8], "datatype": "FP32", "data": [0.0] * 128},
                     {"name": "rois", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 1, 1]},
                     {"name": "batch_indices", "shape": [1], "datatype": "INT64", "data": [1.5]}])
        r = srv.http("POST", "/v2/models/roi/infer", content=bad)
        assert r.status_code == 400 and "floating point values for an integer datatype" in r.json()["error"]
        c.close()
    finally:
        assert srv.stop()


def test_create_app_arguments(model, tmp_path):
    with pytest.raises(ValueError, match="name: expected a model name"):
        create_app(model)
    with pytest.raises(ValueError, match="max_queue_size: expected >= 1, got 0"):
        create_app(model, name="m", max_queue_size=0)
    with pytest.raises(ValueError, match="backend: expected one of"):
        create_app(model, name="m", backend="tpu")
    with pytest.raises(FileNotFoundError, match="model: expected an existing ONNX file"):
        create_app(str(tmp_path / "missing.onnx"))
    path = tmp_path / "my_model.onnx"
    onnx.save(model, str(path))
    app = create_app(str(path))
    srv = LiveServer(app)
    try:  # the name defaults to the file's stem
        assert srv.http("GET", "/v2/models/my_model").json()["name"] == "my_model"
        assert srv.http("GET", "/v2/models/stats").json()["model_stats"][0]["name"] == "my_model"
    finally:
        assert srv.stop()
    assert not app.state.batcher._thread.is_alive()  # the lifespan drained and stopped it
