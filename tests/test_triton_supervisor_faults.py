"""The supervisor of ``dcnkit serve --engine triton`` against faults that a real tritonserver cannot be made to show on
demand, on a stand-in server (tests/fake_tritonserver.py: Triton's endpoints and stub processes, seconds per test):
a stub dead before the supervisor's first look, a hung stub (also behind a full queue, where Triton refuses the
health inference unrun), one of several instances dying, a stub that dies at every load, a reused pid, a readiness
probe without answer, stubs run as scripts, the instance count from config.pbtxt alone, Triton's output read while
the reader appends."""
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
from dcnkit.server.triton_health import HealthProbe
from dcnkit.server.triton_supervisor import EXIT_MODEL_FAILED, RestartPolicy, TritonSupervisor, config_instance_count

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


def _repo(tmp_path, loads, reap=False, name="repo", bare=False, **options) -> Path:
    """A repository for the stand-in: ``loads`` and its options (tests/fake_tritonserver.py)."""
    repo = tmp_path / name
    repo.mkdir()
    (repo / "fake_triton.json").write_text(json.dumps({"loads": loads, "reap": reap, "bare": bare, **options}))
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


def test_a_hung_stub_behind_a_full_queue_is_found(tmp_path):
    """Behind a hung stub Triton's queue fills and it refuses the health inference unrun (503 'Exceeds maximum
    queue size'): that is no answer from the stub, and with no inference completing it is a hang (before: taken
    for an answer, the hang never found)."""
    lines: list[str] = []
    sup = _supervisor(_repo(tmp_path, [["hang"], ["run"]], max_queue=2), lines, health_timeout_s=0.5)
    sup.health.interval_s = 3.0  # the held requests are in before the first health inference goes
    assert sup.start()
    with Running(sup) as r:
        held = [threading.Thread(target=lambda: r.result.append(("held", _infer(sup, 60)))) for _ in range(2)]
        for t in held:
            t.start()
        time.sleep(1.0)
        assert _infer(sup) == 503  # full: the next request is refused
        r.wait(lambda: sup.restarts == 1 and sup.state == "serving")
        for t in held:
            t.join(30)
        assert _infer(sup) == 200
    assert len(lines) == 1 and "no answer to a health inference within 0.5 s (Triton refused it: 503 " in lines[0]
    assert "Exceeds maximum queue size" in lines[0] and "(the backend stub hangs); reloading the model" in lines[0]
    assert r.result.count(("held", 500)) == 2  # the requests it held failed when it was killed


def test_a_refused_health_inference_on_a_busy_model_is_no_hang(tmp_path):
    """A health inference refused while the queue is full of requests that do complete: alive, and the next probe
    (once idle) is answered. Times are given to the probe, so the order is fixed."""
    lines: list[str] = []
    sup = _supervisor(_repo(tmp_path, [["slow"]], max_queue=1), lines, health_timeout_s=0)
    assert sup.start()
    try:
        url = sup.server.http_url
        probe = HealthProbe(MODEL, timeout_s=0.3, interval_s=1.0)
        probe.reset(url, 0.0)
        busy = threading.Thread(target=lambda: _infer(sup))  # 0.5 s in the stub: the queue (1) is full
        busy.start()
        time.sleep(0.1)
        assert probe.check(1.0) is None and probe._probe is not None  # idle for 1 s: sent, and refused at once
        deadline = time.monotonic() + 5
        while probe._probe.refused is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert probe._probe.refused.startswith("503 ")
        busy.join(10)  # it completed: the model is alive
        assert probe.check(2.0) is None and probe._probe is None
        assert probe.check(2.5) is None and probe._probe is None
        assert probe.check(3.0) is None and probe._probe is not None  # idle for 1 s again: a new health inference
        deadline = time.monotonic() + 5
        while not probe._probe.answered.is_set():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert probe.check(4.0) is None and probe._probe is None
    finally:
        sup.stop()
    assert lines == []


def test_stubs_run_as_scripts_are_recognised(tmp_path):
    """A stub program that is a script runs as its interpreter: the program is argv[1], its instance argv[9].
    Before: not seen at all, so '0 of 2 instance stubs running' for a model that serves."""
    lines: list[str] = []
    sup = _supervisor(_repo(tmp_path, [["run", "run"]], script_stubs=True), lines, health_timeout_s=0)
    assert sup.start()
    stubs = sup.server.stubs()
    assert sorted(stubs) == [f"{MODEL}_0_0", f"{MODEL}_0_1"]
    assert Path(f"/proc/{stubs[MODEL + '_0_1']}/cmdline").read_bytes().split(b"\0")[0] == sys.executable.encode()
    with Running(sup) as r:
        time.sleep(2.5)  # longer than the count check's grace: nothing is missing
        assert sup.restarts == 0
        os.kill(stubs[f"{MODEL}_0_1"], signal.SIGKILL)
        r.wait(lambda: sup.restarts == 1 and sup.state == "serving")
    assert len(lines) == 1 and f"backend stub {MODEL}_0_1 (pid {stubs[MODEL + '_0_1']}) killed by SIGKILL" in lines[0]


KIT_CONFIG = """name: "m"
max_batch_size: 8
input {
  name: "input"
  data_type: TYPE_FP32
  dims: 4
}
instance_group {
  count: 3
  kind: KIND_CPU
}
backend: "python"
"""


def test_the_instance_count_from_config_pbtxt_in_either_syntax(tmp_path, monkeypatch):
    assert config_instance_count(KIT_CONFIG) == 3  # what the kit (and protobuf) write
    listed = 'name: "m"\ninstance_group [ { count: 2 kind: KIND_GPU gpus: [ 0, 1 ] }, { kind: KIND_CPU } ]\n'
    nested = ('instance_group [ { count: 2 rate_limiter { resources [ { name: "R" count: 4 } ] } } ]\n'
              'instance_group { count: 5 }\n'
              'parameters { key: "k" value { string_value: "instance_group { count: 7 }" } }')
    others = {'name: "m"\n': 0, "instance_group { kind: KIND_CPU }  # count: 9\n": 1, "instance_group [ { count: 2": 0}
    want = {KIT_CONFIG: 3, listed: 3, nested: 7, **others}
    assert {text: config_instance_count(text) for text in want} == want
    import dcnkit.runtime.triton as triton

    monkeypatch.setattr(triton, "parse_config", lambda text: 1 / 0)  # without Triton's schema: the text itself
    assert {text: config_instance_count(text) for text in want} == want


def test_an_instance_reaped_before_the_first_look_is_counted_from_config_pbtxt(tmp_path):
    """No configuration endpoint and a server that reaps: one of three stubs dies before the first look and leaves
    nothing; the count of the repository's config.pbtxt (the kit's syntax) finds it (before: read as 0, so the
    two stubs seen were taken for all)."""
    lines: list[str] = []
    repo = _repo(tmp_path, [["run", "die", "run"], ["run", "run", "run"]], reap=True, bare=True)
    (repo / MODEL).mkdir()
    (repo / MODEL / "config.pbtxt").write_text(KIT_CONFIG)
    sup = _supervisor(repo, lines, health_timeout_s=0)
    assert sup.start() and len(sup.server.stubs()) == 2 and sup._expected == 3
    with Running(sup) as r:
        r.wait(lambda: sup.restarts == 1 and sup.state == "serving")
        assert len(sup.server.stubs()) == 3
    assert len(lines) == 1 and f"2 of 3 instance stubs of {MODEL} running; reloading the model" in lines[0]


def test_a_server_error_on_the_ready_endpoint_does_not_forget_the_stub(tmp_path):
    """A 5xx from the model's ready endpoint says nothing of the model: not taken for an unload (a 4xx would be)."""
    lines: list[str] = []
    repo = _repo(tmp_path, [["run"]], reap=True)
    sup = _supervisor(repo, lines, health_timeout_s=0.6)
    assert sup.start()
    try:
        (repo / "ready-error").touch()
        (name, pid), = sup.server.stubs().items()
        os.kill(pid, signal.SIGKILL)
        while Path(f"/proc/{pid}").exists():
            time.sleep(0.01)
        assert sup.check() is None and name in sup._stubs  # no word on the model: kept
        time.sleep(0.7)
        assert sup.check().startswith(f"backend stub {name} (pid {pid}) is gone and tritonserver has not answered")
    finally:
        sup.stop()


class _JsonServer:
    """A server answering GET ``self.routes[path]`` as JSON (404 otherwise), and every POST Triton's refusal of a
    full queue, on 127.0.0.1."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.routes: dict = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self, status=None, answer=None):
                found = self.path in outer.routes
                data = json.dumps(answer or outer.routes.get(self.path, {"error": "not found"})).encode()
                self.send_response(status or (200 if found else 404))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                self.do_GET(503, {"error": "Exceeds maximum queue size"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


def test_a_refused_health_inference_without_statistics_is_no_hang():
    """Refused unrun (a full queue) on a server without statistics: nothing says whether the stub runs, so no hang
    is claimed (and no busy model killed); the next probe goes once idle again."""
    server = _JsonServer()
    try:
        probe = HealthProbe(MODEL, timeout_s=0.3, interval_s=1.0)
        probe.reset(server.url, 0.0)
        assert probe.check(1.0) is None and probe._probe is not None
        deadline = time.monotonic() + 5
        while probe._probe.refused is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert probe.check(1.5) is None and probe._probe is None
        assert probe.check(2.0) is None and probe._probe is None  # idle for 0.5 s only
        assert probe.check(2.5) is None and probe._probe is not None  # idle for 1 s: the next probe
    finally:
        server.close()


def test_the_health_inference_is_zeros_shaped_by_metadata_or_configuration(tmp_path):
    from dcnkit.server.triton_health import completed_inferences, probe_request

    server = _JsonServer()

    def body(routes, repository=None):
        server.routes = routes
        return probe_request(server.url, MODEL, repository=repository)

    try:
        meta = {f"/v2/models/{MODEL}": {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]},
                                                   {"name": "k", "datatype": "BOOL", "shape": [3]}]}}
        data, headers = body(meta)
        assert headers == {"Content-Type": "application/json"} and json.loads(data) == {"inputs": [
            {"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [0, 0]},
            {"name": "k", "shape": [3], "datatype": "BOOL", "data": [False] * 3}]}
        cfg = {f"/v2/models/{MODEL}/config": {"max_batch_size": 4, "input": [
            {"name": "a", "data_type": "TYPE_INT64", "dims": [2, -1]},
            {"name": "o", "data_type": "TYPE_FP32", "dims": [1], "optional": True}]}}
        assert json.loads(body(cfg)[0]) == {"inputs": [{"name": "a", "shape": [1, 2, 1], "datatype": "INT64",
                                                         "data": [0, 0]}]}
        (tmp_path / MODEL).mkdir()
        (tmp_path / MODEL / "config.pbtxt").write_text(KIT_CONFIG)  # no endpoint says: the repository's file
        assert json.loads(body({}, tmp_path)[0]) == {"inputs": [{"name": "input", "shape": [1, 4],
                                                                  "datatype": "FP32", "data": [0] * 4}]}
        assert body({}) == (b'{"inputs": []}', {"Content-Type": "application/json"})  # nothing says
        data, headers = body({f"/v2/models/{MODEL}": {"inputs": [{"name": "h", "datatype": "BF16", "shape": [2]}]}})
        n = int(headers["Inference-Header-Content-Length"])  # JSON cannot carry BF16: Triton's binary extension
        assert json.loads(data[:n])["inputs"][0]["parameters"] == {"binary_data_size": 4} and data[n:] == bytes(4)
        stats = f"/v2/models/{MODEL}/stats"
        for answer, want in (
                ({"model_stats": [{"inference_stats": {"success": {"count": 5}, "fail": {"count": 2}}}]}, 7),
                ({"model_stats": [{"execution_count": 3}, {"execution_count": 4}]}, 7),  # a server with only these
                ({"model_stats": [{}]}, None), ({"x": 1}, None)):
            server.routes = {stats: answer}
            assert completed_inferences(server.url, MODEL) == want
    finally:
        server.close()
