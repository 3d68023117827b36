"""``dcnkit serve --engine triton``: the demo model (a DCNv2 digits classifier) on a real ``tritonserver`` (the
nvidia-pytriton wheel's), started once for the module as the CLI command, on 127.0.0.1 with free ports, and
driven by NVIDIA's tritonclient over HTTP and gRPC. Every answer is compared with the kit's ONNX Runtime runner in
this process; the module ends by stopping the command with SIGTERM and checking that no server or backend-stub
process is left."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is not installed")
from tritonclient.utils import InferenceServerException  # noqa: E402

from dcnkit.runtime.triton_server import free_port, unavailable_reason  # noqa: E402

_NO_TRITON = unavailable_reason()
pytestmark = pytest.mark.skipif(_NO_TRITON is not None, reason=f"tritonserver cannot run here: {_NO_TRITON}")

NAME = "digits"
MAX_BATCH = 8


def server_processes(marker: str) -> list[str]:
    """Command lines of live processes mentioning ``marker`` (the server's ports or repository folder)."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next((ln for ln in (p / "status").read_text().splitlines() if ln.startswith("State:")), "")
        except OSError:
            continue
        if marker in cmd and "zombie" not in state:
            found.append(f"{p.name}: {cmd[:200]}")
    return found


def export_demo_model(path: Path) -> Path:
    torch = pytest.importorskip("torch")
    import dcnkit.export as dk_export
    from dcnkit.demo import build_model

    torch.manual_seed(0)
    model = build_model().eval()
    dk_export.to_onnx(model, (torch.rand(2, 1, 8, 8),), str(path), dynamic_batch=True, verbose=False)
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(model path, ORT runner, http url, grpc url, metrics port): `dcnkit serve --engine triton` in a subprocess."""
    from dcnkit.runtime.registry import make_runner

    tmp = tmp_path_factory.mktemp("triton-serve")
    model = export_demo_model(tmp / f"{NAME}.onnx")
    ports = [free_port() for _ in range(3)]
    log = open(tmp / "serve.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dcnkit", "serve", str(model), "--engine", "triton", "--port", str(ports[0]),
         "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]), "--max-batch-size", str(MAX_BATCH),
         "--max-queue-delay-ms", "5"],
        stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, TMPDIR=str(tmp)))
    runner = make_runner(model, "ort-cpu")
    http = f"127.0.0.1:{ports[0]}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, (tmp / "serve.log").read_text()[-3000:]
            try:
                if urllib.request.urlopen(f"http://{http}/v2/models/{NAME}/ready", timeout=2).status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, (tmp / "serve.log").read_text()[-3000:]
            time.sleep(0.3)
        yield {"model": model, "runner": runner, "http": http, "grpc": f"127.0.0.1:{ports[1]}",
               "metrics": ports[2], "proc": proc, "tmp": tmp}
    finally:
        runner.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()
        for line in server_processes(str(tmp)):  # never leave a server behind, whatever the tests did
            os.kill(int(line.split(":")[0]), signal.SIGKILL)


def _images(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((n, 1, 8, 8), dtype=np.float32)


def _http_infer(client, x, name: str = "input", datatype: str = "FP32"):
    i = httpclient.InferInput(name, list(x.shape), datatype)
    i.set_data_from_numpy(x, binary_data=True)
    return client.infer(NAME, [i]).as_numpy("output")


def test_metadata_matches_the_light_server(served):
    from fastapi.testclient import TestClient

    from dcnkit.server import create_app

    with TestClient(create_app(served["model"], name=NAME)) as light:
        want = light.get(f"/v2/models/{NAME}").json()
    got = json.loads(urllib.request.urlopen(f"http://{served['http']}/v2/models/{NAME}").read())
    assert got["name"] == want["name"] == NAME and got["versions"] == want["versions"]
    assert got["inputs"] == want["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
    assert got["outputs"] == want["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 10]}]
    assert urllib.request.urlopen(f"http://{served['http']}/v2/health/live").status == 200
    assert urllib.request.urlopen(f"http://{served['http']}/v2/health/ready").status == 200


@pytest.mark.parametrize("n", [1, 5])
def test_http_and_grpc_equal_the_ort_runner(served, n):
    x = _images(n, seed=n)
    want = served["runner"].run({"input": x})["output"]
    with httpclient.InferenceServerClient(served["http"]) as c:
        np.testing.assert_allclose(_http_infer(c, x), want, rtol=1e-5, atol=1e-5)
    g = grpcclient.InferenceServerClient(served["grpc"])
    try:
        i = grpcclient.InferInput("input", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        np.testing.assert_allclose(g.infer(NAME, [i]).as_numpy("output"), want, rtol=1e-5, atol=1e-5)
        assert g.is_model_ready(NAME)
    finally:
        g.close()


def test_concurrent_clients_are_batched_and_exact(served):
    clients, per_client = 32, 20
    inputs = [_images(1 + (k % 2), seed=100 + k) for k in range(clients * per_client)]
    want = served["runner"].run({"input": np.concatenate(inputs)})["output"]
    starts = np.cumsum([0] + [len(x) for x in inputs])

    def client(k: int) -> int:
        bad = 0
        with httpclient.InferenceServerClient(served["http"]) as c:
            for j in range(k * per_client, (k + 1) * per_client):
                got = _http_infer(c, inputs[j])
                bad += not np.allclose(got, want[starts[j]:starts[j + 1]], rtol=1e-5, atol=1e-5)
        return bad

    with httpclient.InferenceServerClient(served["http"]) as c:
        before = c.get_inference_statistics(NAME)["model_stats"][0]
    with ThreadPoolExecutor(clients) as pool:
        assert sum(pool.map(client, range(clients))) == 0
    with httpclient.InferenceServerClient(served["http"]) as c:
        after = c.get_inference_statistics(NAME)["model_stats"][0]
    assert int(after["inference_count"]) - int(before["inference_count"]) == int(starts[-1])  # rows
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert executions < clients * per_client  # Triton's dynamic batcher put requests together
    sizes = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in after["batch_stats"]}
    assert max(sizes) > 2 and all(s <= MAX_BATCH for s in sizes)


def _post(url: str, body: bytes, headers=None) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_malformed_requests_are_refused_and_the_server_goes_on(served):
    url = f"http://{served['http']}/v2/models/{NAME}/infer"
    x = _images(2, seed=7)
    want = served["runner"].run({"input": x})["output"]

    def request(name="input", shape=(2, 1, 8, 8), datatype="FP32", data=None):
        return json.dumps({"inputs": [{"name": name, "shape": list(shape), "datatype": datatype,
                                       "data": x.ravel().tolist() if data is None else data}]}).encode()

    cases = {
        "unknown input": (request(name="image"), "unexpected inference input 'image'"),
        "wrong dtype": (request(datatype="INT32", data=[1] * 128), "expects 'FP32'"),
        "wrong shape": (request(shape=(2, 1, 8, 9), data=[0.0] * 144), "unexpected shape for input 'input'"),
        "too many rows": (request(shape=(MAX_BATCH + 1, 1, 8, 8), data=[0.0] * 64 * (MAX_BATCH + 1)),
                          f"must be <= {MAX_BATCH}"),
        "body larger than its tensor": (
            json.dumps({"inputs": [{"name": "input", "shape": [2, 1, 8, 8], "datatype": "FP32",
                                    "parameters": {"binary_data_size": 512}}]}).encode() + x.tobytes() + bytes(4096),
            "unexpected additional input data"),
    }
    for what, (body, message) in cases.items():
        headers = {}
        if what == "body larger than its tensor":
            headers = {"Inference-Header-Content-Length": str(body.index(x.tobytes()))}
        status, text = _post(url, body, headers)
        assert 400 <= status < 500, (what, status, text)
        assert message in text, (what, text)
        with httpclient.InferenceServerClient(served["http"]) as c:  # the next good request is answered
            np.testing.assert_allclose(_http_infer(c, x), want, rtol=1e-5, atol=1e-5)
    g = grpcclient.InferenceServerClient(served["grpc"])
    try:
        i = grpcclient.InferInput("input", [1, 1, 8, 8], "FP64")
        i.set_data_from_numpy(x[:1].astype(np.float64))
        with pytest.raises(InferenceServerException, match="FP32"):
            g.infer(NAME, [i])
    finally:
        g.close()


def test_prometheus_metrics(served):
    text = urllib.request.urlopen(f"http://127.0.0.1:{served['metrics']}/metrics").read().decode()
    line = next(ln for ln in text.splitlines() if ln.startswith("nv_inference_request_success")
                and f'model="{NAME}"' in ln)
    assert float(line.split()[-1]) > 0


def test_sigterm_stops_everything_within_10_s(served):
    proc = served["proc"]
    assert server_processes(str(served["tmp"]))  # the server and its stub, before
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    assert time.monotonic() - t0 < 10
    assert server_processes(str(served["tmp"])) == []
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{served['http']}/v2/health/live", timeout=2)
