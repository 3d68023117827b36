"""The supervisor of ``dcnkit serve --engine triton`` against faults that a real tritonserver cannot be made to show on
demand, on a stand-in server (tests/fake_tritonserver.py: Triton's endpoints and stub processes, seconds per test):
a stub dead before the supervisor's first look, a hung stub, one of several instances dying, a stub that dies at
every load, a reused pid, a readiness probe without answer, Triton's output read while the reader appends."""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from dcnkit.runtime.triton_server import TritonServer, free_port, process_start
from dcnkit.server.triton_supervisor import EXIT_MODEL_FAILED, RestartPolicy, TritonSupervisor

FAKE = Path(__file__).with_name("fake_tritonserver.py")
MODEL = "m"


class FakeServer(TritonServer):
    """TritonServer's process handling (start, output, stop of the group) around the stand-in."""

    def __init__(self, repository, *, host="127.0.0.1", http_port=None, grpc_port=None, metrics_port=None,
                 exit_timeout_s=1, log_file=None, extra=(), output=None):
        self.repository, self.output, self.host = Path(repository).resolve(), output, host
        self.http_port = http_port or free_port(host)
        self.grpc_port, self.metrics_port = grpc_port or free_port(host), metrics_port or free_port(host)
        self.command = [sys.executable, str(FAKE), f"--model-repository={self.repository}",
                        f"--http-address={host}", f"--http-port={self.http_port}", *extra]
        self.env, self.exit_timeout_s, self.log_file, self.process = dict(os.environ), exit_timeout_s, log_file, None


def _repo(tmp_path, loads, reap=False, name="repo", bare=False) -> Path:
    repo = tmp_path / name
    repo.mkdir()
    (repo / "fake_triton.json").write_text(json.dumps({"loads": loads, "reap": reap, "bare": bare}))
    return repo


def _supervisor(repo, lines, **kw) -> TritonSupervisor:
    kw.setdefault("policy", RestartPolicy(max_restarts=3, backoff_s=0.1))
    return TritonSupervisor(repo, MODEL, exit_timeout_s=1, ready_timeout_s=30, log=lines.append,
                            output=lambda line: None, server_factory=FakeServer, **kw)


def _infer(sup, timeout=10.0):
    req = urllib.request.Request(f"http://{sup.server.http_url}/v2/models/{MODEL}/infer", data=b"{}", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def _ready(sup) -> int | None:
    try:
        with urllib.request.urlopen(f"http://{sup.server.http_url}/v2/models/{MODEL}/ready", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


class Running:
    """sup.run() in a thread; a sampler records readiness meanwhile; stopped on exit."""

    def __init__(self, sup):
        self.sup, self.stop, self.result, self.readiness = sup, threading.Event(), [], []

    def __enter__(self):
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=lambda: self.result.append(self.sup.run(self.stop)))
        self.thread.start()
        threading.Thread(target=self._sample, daemon=True).start()
        return self

    def _sample(self):
        while not self.stop.is_set() and self.thread.is_alive():
            self.readiness.append((time.monotonic() - self.t0, _ready(self.sup) if self.sup.server else None))
            time.sleep(0.05)

    def wait(self, cond, timeout=30.0) -> float:
        while not cond():
            assert time.monotonic() - self.t0 < timeout and self.thread.is_alive(), "timed out"
            time.sleep(0.02)
        return time.monotonic() - self.t0

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)
        self.sup.stop()


def test_a_stub_dead_before_the_first_look_is_a_crash_and_is_recovered(tmp_path):
    lines: list[str] = []
    sup = _supervisor(_repo(tmp_path, [["die"], ["run"]]), lines)
    assert sup.start() and sup.state == "serving"
    assert sup.server.stubs() == {}  # the stub was a zombie when the model turned ready: nothing to track
    with Running(sup) as r:
        r.wait(lambda: sup.restarts == 1 and sup.state == "serving")
        assert _infer(sup) == 200
    assert r.result == [0]
    assert len(lines) == 1 and f"backend stub of {MODEL} (pid " in lines[0] and "killed by SIGKILL" in lines[0]
    assert "reloading the model (restart 1 in a row" in lines[0]
    assert any(code != 200 for _, code in r.readiness)  # readiness false while it recovered


@pytest.mark.parametrize("bare", [False, True])
def test_a_stub_reaped_before_the_first_look_is_found_by_count_or_by_the_health_inference(tmp_path, bare):
    """A server that reaps a stub dead before the first look leaves no zombie: the instance count finds it (Triton's
    configuration endpoint); a server without that endpoint (and no config.pbtxt) by the health inference's answer
    'Stub process ... is not healthy.'"""
    lines: list[str] = []
    sup = _supervisor(_repo(tmp_path, [["die"], ["run"]], reap=True, bare=bare), lines,
                      health_timeout_s=0.5 if bare else 5.0)  # with the endpoint, the count speaks first (2 s)
    assert sup.start()
    with Running(sup) as r:
        took = r.wait(lambda: sup.restarts == 1 and sup.state == "serving")
        assert _infer(sup) == 200
    assert took < 6 and len(lines) == 1, lines
    assert ("is not healthy" in lines[0]) == bare and ("0 of 1 instance stubs" in lines[0]) == (not bare), lines


def test_a_hung_stub_is_found_by_the_health_inference_killed_and_recovered(tmp_path):
    lines: list[str] = []
    sup = _supervisor(_repo(tmp_path, [["hang"], ["run"]]), lines, health_timeout_s=1.0)
    assert sup.start()
    (hung,) = sup.server.stubs().values()
    with Running(sup) as r:
        waiting = threading.Thread(target=lambda: r.result.append(("request", _infer(sup, 60))))
        waiting.start()  # a client's request waits on the hung stub
        detected = r.wait(lambda: sup.restarts == 1 and sup.state == "serving")
        waiting.join(30)
        assert _infer(sup) == 200
    assert detected < 8  # probe after 2 s without a completed inference, 1 s for its answer, then the reload
    assert ("request", 500) in r.result  # the request held by the hung stub fails when it is killed
    assert len(lines) == 1 and "no answer to a health inference within 1 s" in lines[0], lines
    assert not Path(f"/proc/{hung}").exists() or Path(f"/proc/{hung}/stat").read_text().split(") ")[1][0] in "ZX"


def test_a_busy_model_is_not_probed_and_its_health_inference_can_be_off(tmp_path):
    lines: list[str] = []
    sup = _supervisor(_repo(tmp_path, [["hang"]]), lines, health_timeout_s=0)
    assert sup.start()
    with Running(sup):
        time.sleep(2.5)
        assert sup.restarts == 0 and sup.state == "serving"  # off: a hang is not looked for
    sup = _supervisor(_repo(tmp_path, [["run"]], name="busy"), lines, health_timeout_s=0.5)
    assert sup.start()
    with Running(sup):
        end = time.monotonic() + 3
        while time.monotonic() < end:  # inferences complete all the time: no probe, no restart
            assert _infer(sup) == 200
        assert sup.restarts == 0
    assert lines == []


def test_one_of_three_instances_dying_at_load_is_counted_and_recovered(tmp_path):
    lines: list[str] = []
    sup = _supervisor(_repo(tmp_path, [["run", "die", "run"], ["run", "run", "run"]]), lines)
    assert sup.start()
    assert len(sup.server.stubs()) == 2 and sup._expected == 3
    with Running(sup) as r:
        r.wait(lambda: sup.restarts == 1 and sup.state == "serving")
        assert len(sup.server.stubs()) == 3
    assert len(lines) == 1 and "killed by SIGKILL" in lines[0]


def test_a_stub_that_dies_at_every_load_is_given_up_on_with_exit_code_3(tmp_path):
    lines: list[str] = []
    sup = _supervisor(_repo(tmp_path, [["die"]]), lines, policy=RestartPolicy(max_restarts=2, backoff_s=0.1))
    assert sup.start()
    with Running(sup) as r:
        r.thread.join(60)
    assert r.result == [EXIT_MODEL_FAILED] and sup.state == "failed"
    assert len(lines) == 3 and "model failed: 2 restart(s) in a row" in lines[2]
    assert sup.server.process.poll() is not None  # the server is stopped


def test_a_gone_stub_whose_pid_is_another_process_is_a_crash(tmp_path):
    """Liveness by (pid, start time) among the server's children: a pid that now names another process (here this
    test's own) is not the stub."""
    lines: list[str] = []
    sup = _supervisor(_repo(tmp_path, [["run"]]), lines)
    assert sup.start()
    try:
        sup._stubs[f"{MODEL}_0_7"] = (os.getpid(), process_start(os.getpid()))
        assert sup.check() == f"backend stub {MODEL}_0_7 (pid {os.getpid()}) is gone"
        assert process_start(os.getpid()) != process_start(sup.server.process.pid)
    finally:
        sup.stop()


def test_a_readiness_probe_without_answer_keeps_the_stub_until_the_server_counts_as_hung(tmp_path, monkeypatch):
    lines: list[str] = []
    sup = _supervisor(_repo(tmp_path, [["run"]], reap=True), lines, health_timeout_s=0.6)
    assert sup.start()
    try:
        (name, pid), = sup.server.stubs().items()
        monkeypatch.setattr(sup, "_model_ready", lambda: None)  # a probe that timed out under load
        os.kill(pid, signal.SIGKILL)  # the server reaps it: gone, not a zombie
        while Path(f"/proc/{pid}").exists():
            time.sleep(0.01)
        assert sup.check() is None and name in sup._stubs  # not forgotten
        time.sleep(0.7)
        cause = sup.check()
        assert cause.startswith(f"backend stub {name} (pid {pid}) is gone and tritonserver has not answered for")
    finally:
        sup.stop()


def test_held_output_is_read_while_the_reader_thread_appends(tmp_path):
    sup = _supervisor(_repo(tmp_path, [["run"]]), [])
    sup._quiet = True
    done = threading.Event()

    def append():
        i = 0
        while not done.is_set():
            sup._on_output(f"E line {i}")
            i += 1

    t = threading.Thread(target=append)
    t.start()
    try:
        for _ in range(3000):  # iterating the deque itself failed with "deque mutated during iteration"
            assert all(line.startswith("E line") for line in sup.held_lines())
    finally:
        done.set()
        t.join()


def test_serve_refuses_health_timeout_with_the_light_engine(tmp_path, capsys):
    from dcnkit.cli import main

    code = main(["serve", str(tmp_path / "model.onnx"), "--health-timeout", "3"])
    assert code == 2
    assert "--health-timeout: expected only with --engine triton" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", str(tmp_path / "model.onnx"), "--engine", "triton", "--health-timeout", "-1"])
