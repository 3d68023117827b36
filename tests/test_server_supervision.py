"""The light server (``dcnkit serve``, no Triton) under a supervisor: what a supervisor sees when a model run crashes
the process (its exit code), readiness during start-up and shutdown, and ``--workers N``, where uvicorn's process
manager replaces a worker that died while the others serve. Real servers on 127.0.0.1 in subprocesses; answers are
compared with ONNX Runtime run in this process."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("uvicorn")
httpclient = pytest.importorskip("tritonclient.http")
from onnx import TensorProto, helper  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from server_process import free_port  # noqa: E402
from soak_triton import http_status  # noqa: E402  (GET -> status, None when nothing answers)

# Serves model.onnx (argv[1]) on port argv[2] as model "m" through the kit's ORT runner, except that an input whose
# first value is -1 crashes the process in native code (a null read: SIGSEGV) and -2 takes 2 s.
FAULTY_SERVER = r'''
import ctypes, sys, time
from dcnkit.runtime.registry import make_runner
from dcnkit.server.app import serve

class Faulty:
    def __init__(self, path):
        self.runner = make_runner(path, "ort-cpu")
        self.inputs, self.outputs = self.runner.inputs, self.runner.outputs

    def run(self, feeds):
        first = float(feeds["x"].flat[0])
        if first == -1:
            ctypes.string_at(0)
        if first == -2:
            time.sleep(2)
        return self.runner.run(feeds)

serve(Faulty(sys.argv[1]), port=int(sys.argv[2]), name="m", max_batch_size=1, log_level="warning")
'''


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """y = 2x + 1 on x (batch, 4)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    nodes = [helper.make_node("Mul", ["x", "two"], ["x2"]), helper.make_node("Add", ["x2", "one"], ["y"])]
    g = helper.make_graph(nodes, "affine", [x], [y], [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
                                                      helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    path = tmp_path_factory.mktemp("supervision") / "m.onnx"
    onnx.save(m, str(path))
    return path


def _infer(port: int, first: float):
    x = np.full((1, 4), first, np.float32)
    with httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=30) as c:
        i = httpclient.InferInput("x", [1, 4], "FP32")
        i.set_data_from_numpy(x)
        out = c.infer("m", [i]).as_numpy("y")
    np.testing.assert_array_equal(out, x * 2 + 1)  # what ONNX Runtime computes: exact in float32
    return out


def _start(cmd, port: int, log: Path):
    """Starts the server, its output into ``log``; returns (process, readiness answers seen before the first 200)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT)
    seen = []
    deadline = time.monotonic() + 120
    while (s := http_status(f"http://127.0.0.1:{port}/v2/health/ready")) != 200:
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the server did not come up in 120 s"
        seen.append(s)
        time.sleep(0.05)
    return proc, seen


def test_readiness_through_start_up_and_shutdown(model, tmp_path):
    """Start-up: the port opens once the model is loaded, so readiness is never 200 before a request can be
    served. Shutdown (SIGTERM): the port closes at once (probes fail), the request in flight is still answered,
    and the exit code is 0."""
    port = free_port()
    proc, seen = _start([sys.executable, "-c", FAULTY_SERVER, model, port], port, tmp_path / "serve.log")
    try:
        assert set(seen) <= {None}  # nothing but a refused connection until ready
        _infer(port, 1.0)  # ready means it serves
        slow = threading.Thread(target=lambda: results.append(_infer(port, -2.0)))
        results: list = []
        slow.start()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert http_status(f"http://127.0.0.1:{port}/v2/health/ready") is None  # out of rotation at once
        slow.join(30)
        assert len(results) == 1  # the request in flight was answered
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_a_crash_in_a_model_run_ends_the_process_with_its_signal(model, tmp_path):
    """A model run that crashes the process is not caught in-process: the client's request fails (it does not
    hang), and the exit status says how it ended, for the supervisor to restart it."""
    port = free_port()
    proc, _ = _start([sys.executable, "-c", FAULTY_SERVER, model, port], port, tmp_path / "serve.log")
    try:
        _infer(port, 3.0)
        with pytest.raises(Exception) as err:
            _infer(port, -1.0)
        assert "ssertion" not in type(err.value).__name__  # an error of the connection, not a wrong answer
        assert proc.wait(30) == -signal.SIGSEGV  # a shell shows 139 (128 + 11), systemd "signal=SEGV"
        assert http_status(f"http://127.0.0.1:{port}/v2/health/ready") is None
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _workers_of(parent: int) -> list[int]:
    """uvicorn's worker processes of ``parent`` (spawned children running multiprocessing's spawn_main)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (p / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if int(stat[1]) == parent and stat[0] not in "ZX" and b"spawn_main" in cmd:
            out.append(int(p.name))
    return out


def test_workers_replace_a_worker_that_died_while_the_others_serve(model, tmp_path):
    port = free_port()
    proc, _ = _start([sys.executable, "-m", "dcnkit", "serve", model, "--port", port, "--name", "m",
                      "--workers", "2"], port, tmp_path / "serve.log")
    try:
        deadline = time.monotonic() + 60
        while len(workers := _workers_of(proc.pid)) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        errors, answered, stop = [], [0], threading.Event()

        def client():
            while not stop.is_set():
                try:
                    _infer(port, float(answered[0] % 7))
                    answered[0] += 1
                except Exception as e:  # noqa: BLE001 - only the killed worker's requests may fail
                    errors.append(e)

        clients = [threading.Thread(target=client) for _ in range(4)]
        for c in clients:
            c.start()
        time.sleep(1.0)
        os.kill(workers[0], signal.SIGKILL)  # as the kernel's out-of-memory killer would
        before = answered[0]
        time.sleep(2.0)
        assert answered[0] > before + 20  # the other worker went on serving
        deadline = time.monotonic() + 60
        while not ((now := _workers_of(proc.pid)) and len(now) == 2 and workers[0] not in now):
            assert time.monotonic() < deadline, "no worker replaced the dead one"
            time.sleep(0.2)
        time.sleep(1.0)
        stop.set()
        for c in clients:
            c.join(30)
        assert len(errors) <= 4, errors  # at most the requests the dead worker held (one per client)
        assert answered[0] > 100
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        log = (tmp_path / "serve.log").read_text()
        assert f"Child process [{workers[0]}] died" in log  # one line, at the default level
        assert _workers_of(proc.pid) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_workers_refuse_what_cannot_work(model, tmp_path, capsys):
    from dcnkit.server.cli import main as cli_main

    assert cli_main(["serve", str(tmp_path / "missing.onnx"), "--workers", "2"]) == 2
    assert "model: no such file" in capsys.readouterr().err
    assert cli_main(["serve", str(model), "--engine", "triton", "--workers", "2"]) == 2
    assert "--workers: expected only with --engine light" in capsys.readouterr().err
    assert cli_main(["serve", str(model), "--max-restarts", "2"]) == 2
    assert "--max-restarts: expected only with --engine triton" in capsys.readouterr().err
