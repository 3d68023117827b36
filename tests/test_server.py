"""dcnkit serve: a real uvicorn server on 127.0.0.1 driven by NVIDIA's tritonclient.http and raw HTTP.

Models are built with onnx.helper from standard ops (so these tests run without the kit's libraries); the
kit's own ops are served in test_server_dcnkit_ops.py. Every result is compared with a direct ONNX Runtime run.
"""
from __future__ import annotations

import json
import re
import socket
import struct
import threading
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
from onnx import TensorProto, helper  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from dcnkit.server import create_app  # noqa: E402

C, H, W = 3, 4, 5


def _elementwise_model() -> onnx.ModelProto:
    """x (batch, 3, 4, 5) -> y = 2x + 1 (batch, 3, 4, 5), m = mean over H, W (batch, 3)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", C, H, W])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", C, H, W])
    m = helper.make_tensor_value_info("m", TensorProto.FLOAT, ["batch", C])
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["x2"]),
        helper.make_node("Add", ["x2", "one"], ["y"]),
        helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=0),
    ]
    inits = [
        helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
        helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
        helper.make_tensor("axes", TensorProto.INT64, [2], [2, 3]),
    ]
    g = helper.make_graph(nodes, "elementwise", [x], [y, m], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def _roi_model() -> onnx.ModelProto:
    """Standard ONNX RoiAlign: x (N, 2, 8, 8), rois (K, 4), batch_indices (K,) int64 -> (K, 2, 2, 2).

    Its inputs do not share a batch dim (N images, K boxes): the server must not batch it.
    """
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 8, 8])
    rois = helper.make_tensor_value_info("rois", TensorProto.FLOAT, ["K", 4])
    bi = helper.make_tensor_value_info("batch_indices", TensorProto.INT64, ["K"])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["K", 2, 2, 2])
    node = helper.make_node("RoiAlign", ["x", "rois", "batch_indices"], ["out"], output_height=2,
                            output_width=2, sampling_ratio=2, spatial_scale=1.0,
                            coordinate_transformation_mode="half_pixel")
    g = helper.make_graph([node], "roi", [x, rois, bi], [out])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def _direct(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


class LiveServer:
    """uvicorn on a loopback socket picked by the OS, in a thread; ``stop()`` is what SIGTERM does."""

    def __init__(self, app):
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=20)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)

    def http(self, method, path, **kw):
        return httpx.request(method, f"http://{self.url}{path}", timeout=30, **kw)

    def stop(self, timeout=30):
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()
        return not self.thread.is_alive()


class GatedRunner:
    """A real runner whose ``run`` waits for ``gate``: lets tests hold requests in flight / in the queue."""

    def __init__(self, runner):
        self.runner = runner
        self.name = runner.name
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.calls = 0

    def inputs(self):
        return self.runner.inputs()

    def outputs(self):
        return self.runner.outputs()

    def run(self, feeds):
        self.calls += 1
        self.entered.set()
        assert self.gate.wait(30), "test gate never opened"
        return self.runner.run(feeds)

    def close(self):
        self.runner.close()


def _metric(text: str, name: str, labels: str = "", default: float | None = None) -> float:
    """Value of one sample in Prometheus text format (labels given as in the exposition, e.g. 'le="1.0"');
    ``default`` when given and the sample is not there yet (a labelled counter appears on first use)."""
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            head, value = line.rsplit(" ", 1)
            if head.split("{")[0] == name and all(part in head for part in labels.split(",") if part):
                return float(value)
    if default is not None:
        return default
    raise AssertionError(f"metric {name}{{{labels}}} not found in:\n{text}")


@pytest.fixture(scope="module")
def model():
    return _elementwise_model()


@pytest.fixture(scope="module")
def live(model):
    app = create_app(model, name="ew", max_batch_size=8, max_queue_delay_ms=100, max_queue_size=64,
                     max_request_bytes=1 << 20)
    srv = LiveServer(app)
    yield srv
    assert srv.stop(), "server did not stop"
    assert not app.state.batcher._thread.is_alive()


@pytest.fixture
def client(live):
    c = httpclient.InferenceServerClient(url=live.url)
    yield c
    c.close()


def _x(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, C, H, W)).astype(np.float32)


# ------------------------------------------------------------------------------------------------
# tritonclient: health, metadata, inference
# ------------------------------------------------------------------------------------------------
def test_health_and_metadata(client, live):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("ew")
    assert client.is_model_ready("ew", "1")
    assert not client.is_model_ready("nope")
    assert not client.is_model_ready("ew", "2")
    sm = client.get_server_metadata()
    assert sm["name"] == "dcnkit" and "binary_tensor_data" in sm["extensions"]
    import dcnkit

    assert sm["version"] == dcnkit.__version__
    md = client.get_model_metadata("ew")
    assert md["name"] == "ew" and md["versions"] == ["1"]
    assert md["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, C, H, W]}]
    assert md["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, C, H, W]},
                             {"name": "m", "datatype": "FP32", "shape": [-1, C]}]
    assert client.get_model_metadata("ew", "1") == md
    cfg = client.get_model_config("ew")
    assert cfg["max_batch_size"] == 8 and cfg["input"][0]["dims"] == [C, H, W]
    assert cfg["input"][0]["data_type"] == "TYPE_FP32"
    assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 100000
    idx = client.get_model_repository_index()
    assert idx == [{"name": "ew", "version": "1", "state": "READY"}]
    client.load_model("ew")  # already loaded: fine
    with pytest.raises(InferenceServerException, match="unknown model 'zzz'"):
        client.load_model("zzz")
    with pytest.raises(InferenceServerException, match="unknown model 'zzz'"):
        client.get_model_metadata("zzz")


@pytest.mark.parametrize("binary_in,binary_out", [(True, True), (False, False), (True, False), (False, True)])
def test_infer_binary_and_json(client, model, binary_in, binary_out):
    x = _x(2, seed=int(binary_in) * 2 + int(binary_out))
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary_in)
    outs = [httpclient.InferRequestedOutput("y", binary_data=binary_out),
            httpclient.InferRequestedOutput("m", binary_data=binary_out)]
    res = client.infer("ew", [inp], outputs=outs, request_id="req-7")
    want = _direct(model, {"x": x})
    np.testing.assert_allclose(res.as_numpy("y"), want["y"], rtol=1e-6, atol=0)
    np.testing.assert_allclose(res.as_numpy("m"), want["m"], rtol=1e-6, atol=1e-7)
    r = res.get_response()
    assert r["id"] == "req-7" and r["model_name"] == "ew" and r["model_version"] == "1"
    assert ("binary_data_size" in r["outputs"][0].get("parameters", {})) == binary_out


def test_infer_default_outputs_and_selection(client, model):
    x = _x(1, seed=5)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    res = client.infer("ew", [inp])  # no outputs named: all, binary (tritonclient's binary_data_output)
    want = _direct(model, {"x": x})
    assert [o["name"] for o in res.get_response()["outputs"]] == ["y", "m"]
    np.testing.assert_allclose(res.as_numpy("m"), want["m"], rtol=1e-6, atol=1e-7)
    res = client.infer("ew", [inp], outputs=[httpclient.InferRequestedOutput("m", binary_data=False)],
                       model_version="1")
    assert [o["name"] for o in res.get_response()["outputs"]] == ["m"]
    assert res.as_numpy("y") is None
    np.testing.assert_allclose(res.as_numpy("m"), want["m"], rtol=1e-6, atol=1e-7)


def test_infer_compressed_request(client, model):
    x = _x(3, seed=9)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    for algo in ("gzip", "deflate"):
        res = client.infer("ew", [inp], request_compression_algorithm=algo)
        np.testing.assert_allclose(res.as_numpy("y"), 2 * x + 1, rtol=1e-6)


def test_concurrent_requests_are_batched(live, model):
    stats0 = live.http("GET", "/v2/models/ew/stats").json()["model_stats"][0]
    local = threading.local()

    def one(i):
        c = getattr(local, "c", None)
        if c is None:
            c = local.c = httpclient.InferenceServerClient(url=live.url)
        x = _x(1 + i % 3, seed=100 + i)
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=bool(i % 2))
        res = c.infer("ew", [inp])
        return x, res.as_numpy("y"), res.as_numpy("m")

    n = 24
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(n)))
    for x, y, m in results:  # every request got its own rows back
        want = _direct(model, {"x": x})
        np.testing.assert_allclose(y, want["y"], rtol=1e-6)
        np.testing.assert_allclose(m, want["m"], rtol=1e-6, atol=1e-7)
    stats = live.http("GET", "/v2/models/ew/stats").json()["model_stats"][0]
    done = stats["inference_count"] - stats0["inference_count"]
    runs = stats["execution_count"] - stats0["execution_count"]
    assert done == n
    assert runs < n, f"no batching: {runs} model runs for {n} requests"
    assert any(b["batch_size"] > 1 for b in stats["batch_stats"])
    text = live.http("GET", "/metrics").text
    total = _metric(text, "dcnkit_batch_size_count", 'model="ew"')
    singles = _metric(text, "dcnkit_batch_size_bucket", 'model="ew",le="1.0"')
    assert total > singles, "the batch-size histogram saw no batch of more than one request"


# ------------------------------------------------------------------------------------------------
# Bad requests: each gets a 4xx with {"error": "..."} naming what is wrong
# ------------------------------------------------------------------------------------------------
def _body(inputs, **extra):
    return json.dumps({"inputs": inputs, **extra}).encode()


GOOD = {"name": "x", "shape": [1, C, H, W], "datatype": "FP32", "data": [0.5] * (C * H * W)}

BAD_REQUESTS = [
    # (id, method, path, body, headers, status, message regex)
    ("unknown model", "POST", "/v2/models/nope/infer", _body([GOOD]), {}, 404, r"unknown model 'nope'"),
    ("unknown version", "POST", "/v2/models/ew/versions/3/infer", _body([GOOD]), {}, 404, r"unknown version '3'"),
    ("bad json", "POST", "/v2/models/ew/infer", b"{not json", {}, 400, r"invalid JSON"),
    ("json not object", "POST", "/v2/models/ew/infer", b"[1, 2]", {}, 400, r"expected a JSON object, got list"),
    ("no inputs", "POST", "/v2/models/ew/infer", b"{}", {}, 400, r"inputs: expected a non-empty list"),
    ("unknown input", "POST", "/v2/models/ew/infer", _body([dict(GOOD, name="q")]), {}, 400,
     r"input 'q': unknown input; expected one of \['x'\]"),
    ("missing field", "POST", "/v2/models/ew/infer", _body([{"name": "x", "shape": [1, C, H, W]}]), {}, 400,
     r"missing required field 'datatype'"),
    ("wrong datatype", "POST", "/v2/models/ew/infer", _body([dict(GOOD, datatype="INT32")]), {}, 400,
     r"input 'x'.datatype: expected FP32, got INT32"),
    ("unknown datatype", "POST", "/v2/models/ew/infer", _body([dict(GOOD, datatype="FLOAT")]), {}, 400,
     r"datatype: expected one of .*got 'FLOAT'"),
    ("bytes datatype", "POST", "/v2/models/ew/infer", _body([dict(GOOD, datatype="BYTES")]), {}, 400,
     r"expected FP32, got BYTES"),
    ("data size mismatch", "POST", "/v2/models/ew/infer", _body([dict(GOOD, data=[1.0] * 7)]), {}, 400,
     r"expected 60 values for shape \[1, 3, 4, 5\], got 7"),
    ("data not numbers", "POST", "/v2/models/ew/infer", _body([dict(GOOD, data=["a"] * 60)]), {}, 400,
     r"input 'x'.data: expected 60 values of datatype FP32"),
    ("missing data", "POST", "/v2/models/ew/infer", _body([{k: v for k, v in GOOD.items() if k != "data"}]), {},
     400, r"missing 'data'"),
    ("wrong rank", "POST", "/v2/models/ew/infer", _body([dict(GOOD, shape=[C, H, W], data=[0.0] * 60)]), {}, 400,
     r"input 'x'.shape: expected rank 4 \[-1, 3, 4, 5\], got \[3, 4, 5\]"),
    ("wrong fixed dim", "POST", "/v2/models/ew/infer",
     _body([dict(GOOD, shape=[1, C, H, 6], data=[0.0] * 72)]), {}, 400, r"input 'x'.shape\[3\]: expected 5, got 6"),
    ("negative dim", "POST", "/v2/models/ew/infer", _body([dict(GOOD, shape=[-1, C, H, W])]), {}, 400,
     r"shape: expected a list of non-negative integers"),
    ("batch too large", "POST", "/v2/models/ew/infer",
     _body([dict(GOOD, shape=[9, C, H, W], data=[0.0] * 540)]), {}, 400,
     r"expected a batch size <= max_batch_size 8, got 9"),
    ("input twice", "POST", "/v2/models/ew/infer", _body([GOOD, GOOD]), {}, 400, r"input 'x': given twice"),
    ("unknown output", "POST", "/v2/models/ew/infer", _body([GOOD], outputs=[{"name": "zz"}]), {}, 400,
     r"output 'zz': unknown output; expected one of \['y', 'm'\]"),
    ("classification", "POST", "/v2/models/ew/infer",
     _body([GOOD], outputs=[{"name": "y", "parameters": {"classification": 3}}]), {}, 400,
     r"classification: not supported"),
    ("binary size mismatch", "POST", "/v2/models/ew/infer",
     _body([{"name": "x", "shape": [1, C, H, W], "datatype": "FP32", "parameters": {"binary_data_size": 8}}])
     + b"\0" * 8, "HDR", 400, r"binary_data_size: expected 240 bytes for shape \[1, 3, 4, 5\] FP32, got 8"),
    ("binary data short", "POST", "/v2/models/ew/infer",
     _body([{"name": "x", "shape": [1, C, H, W], "datatype": "FP32", "parameters": {"binary_data_size": 240}}])
     + b"\0" * 100, "HDR", 400, r"expected 240 bytes of binary data, got 100"),
    ("binary data extra", "POST", "/v2/models/ew/infer", _body([GOOD]) + b"\0" * 4, "HDR", 400,
     r"expected 0 bytes of binary tensor data after the JSON header, got 4"),
    ("header length bad", "POST", "/v2/models/ew/infer", _body([GOOD]),
     {"Inference-Header-Content-Length": "abc"}, 400, r"Inference-Header-Content-Length: expected an integer"),
    ("header length too big", "POST", "/v2/models/ew/infer", _body([GOOD]),
     {"Inference-Header-Content-Length": "999999"}, 400, r"expected a value in \[0, \d+\]"),
    ("sequence", "POST", "/v2/models/ew/infer", _body([GOOD], parameters={"sequence_id": 3}), {}, 400,
     r"sequence batching is not supported"),
    ("content encoding", "POST", "/v2/models/ew/infer", _body([GOOD]), {"Content-Encoding": "br"}, 415,
     r"Content-Encoding: expected gzip, deflate or identity, got 'br'"),
    ("bad gzip", "POST", "/v2/models/ew/infer", b"notgzip", {"Content-Encoding": "gzip"}, 400, r"invalid gzip"),
    ("unknown route", "GET", "/v2/nothing/here", None, {}, 404, r"Not Found"),
    ("wrong method", "GET", "/v2/models/ew/infer", None, {}, 405, r"Method Not Allowed"),
]


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS])
def test_bad_requests(live, case):
    _, method, path, body, headers, status, pattern = case
    if headers == "HDR":
        headers = {"Inference-Header-Content-Length": str(body.index(b"}]}") + 3)}
    r = live.http(method, path, content=body, headers=headers)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert re.search(pattern, err), err


def test_bad_request_through_tritonclient(client):
    inp = httpclient.InferInput("x", [1, C, H, W], "FP64")
    inp.set_data_from_numpy(np.zeros((1, C, H, W), np.float64))
    with pytest.raises(InferenceServerException, match=r"input 'x'.datatype: expected FP32, got FP64") as e:
        client.infer("ew", [inp])
    assert e.value.status() == "400"


def test_failed_requests_are_counted(live):
    # One good request first: the test does not depend on which tests ran before it.
    assert live.http("POST", "/v2/models/ew/infer", content=_body([GOOD])).status_code == 200
    text0 = live.http("GET", "/metrics").text
    before = _metric(text0, "dcnkit_requests_total", 'model="ew",status="400"', default=0.0)
    live.http("POST", "/v2/models/ew/infer", content=b"{")
    text = live.http("GET", "/metrics").text
    assert _metric(text, "dcnkit_requests_total", 'model="ew",status="400"') == before + 1
    assert _metric(text, "dcnkit_requests_total", 'model="ew",status="200"') >= 1
    assert _metric(text, "dcnkit_request_duration_seconds_count", 'model="ew"') >= before + 1
    assert _metric(text, "dcnkit_queue_depth", 'model="ew"') == 0
    assert "# TYPE dcnkit_request_duration_seconds histogram" in text


def test_json_body_with_binary_output_raw(live, model):
    """The binary tensor data extension by hand: JSON header + raw little-endian bytes, both ways."""
    x = _x(2, seed=3)
    raw = x.astype("<f4").tobytes()
    header = json.dumps({
        "id": "raw",
        "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                    "parameters": {"binary_data_size": len(raw)}}],
        "outputs": [{"name": "m", "parameters": {"binary_data": True}}, {"name": "y"}],
    }).encode()
    r = live.http("POST", "/v2/models/ew/infer", content=header + raw,
                  headers={"Inference-Header-Content-Length": str(len(header))})
    assert r.status_code == 200, r.text
    hl = int(r.headers["Inference-Header-Content-Length"])
    meta = json.loads(r.content[:hl])
    assert meta["id"] == "raw"
    m_meta, y_meta = meta["outputs"]
    assert m_meta["parameters"]["binary_data_size"] == 2 * C * 4 and "data" not in m_meta
    m = np.frombuffer(r.content[hl:], dtype="<f4").reshape(m_meta["shape"])
    want = _direct(model, {"x": x})
    np.testing.assert_allclose(m, want["m"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.array(y_meta["data"], np.float32).reshape(y_meta["shape"]), want["y"], rtol=1e-6)
    # JSON data may be nested, as the protocol allows.
    r = live.http("POST", "/v2/models/ew/infer",
                  json={"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.tolist()}]})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    out = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in r.json()["outputs"]}
    np.testing.assert_allclose(out["y"], want["y"], rtol=1e-6)
    assert struct.calcsize("<f") == 4
