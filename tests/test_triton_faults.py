"""Faults under ``dcnkit serve --engine triton`` (a real ``tritonserver`` from the nvidia-pytriton wheel, on 127.0.0.1
with free ports): the Python-backend stub SIGKILLed under load is noticed and brought back; a model that crashes on
every load backs off and is given up on; and what a plain tritonserver does with the repository of
``triton-repo --backend python`` when its stub dies. The soak is ``benchmarks/soak_triton.py`` at CI's size: every
answer is compared bit for bit with the kit's ORT runner in this process."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
httpclient = pytest.importorskip("tritonclient.http")

from dcnkit.runtime import triton_server  # noqa: E402
from dcnkit.runtime.triton_server import describe_exit, process_status  # noqa: E402
from dcnkit.server.triton_supervisor import EXIT_MODEL_FAILED, RestartPolicy, TritonSupervisor  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(Path(__file__).parent))
import soak_triton  # noqa: E402
from triton_fault_times import CRASH_AT_LOAD, HANG, KILL_AT_READY, infer, patched_repository  # noqa: E402
from soak_triton import http_status  # noqa: E402
from test_triton_server import export_demo_model, server_processes  # noqa: E402

_NO_TRITON = triton_server.unavailable_reason()
needs_triton = pytest.mark.skipif(_NO_TRITON is not None, reason=f"tritonserver cannot run here: {_NO_TRITON}")
WINDOW_S = 15.0


def test_restart_policy_backs_off_and_checks_its_arguments():
    p = RestartPolicy(max_restarts=5, backoff_s=0.5, max_backoff_s=3.0)
    assert [p.delay(k) for k in range(1, 7)] == [0.0, 0.5, 1.0, 2.0, 3.0, 3.0]
    with pytest.raises(ValueError, match=r"max_restarts: expected an integer >= 0, got -1"):
        RestartPolicy(max_restarts=-1)
    with pytest.raises(ValueError, match=r"backoff_s: expected a number >= 0, got -2"):
        RestartPolicy(backoff_s=-2)


def test_process_status_reads_how_an_unreaped_child_ended():
    for cmd, want in ((["sleep", "60"], -signal.SIGKILL), (["sh", "-c", "read line; exit 3"], 3)):
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE)
        try:
            state, code = process_status(p.pid)
            assert state in "RSD" and code is None  # running (or just starting)
            if want < 0:
                os.kill(p.pid, -want)
            else:
                p.stdin.close()  # its `read` returns: it exits 3
            deadline = time.monotonic() + 10
            while process_status(p.pid)[0] != "Z":  # ended, not reaped: what Triton leaves of a dead stub
                assert time.monotonic() < deadline
                time.sleep(0.02)
            assert process_status(p.pid) == ("Z", want)
        finally:
            p.stdin.close()
            p.wait()
        assert process_status(p.pid) is None  # reaped: gone
    assert describe_exit(-9) == "killed by SIGKILL" and describe_exit(3) == "exited with code 3"


def test_handover_falls_back_where_dlpack_does_not_round_trip():
    """The hand-over is chosen once per dtype from what works: a stub whose ``from_dlpack`` fails for a dtype gets
    Triton's NumPy path for that dtype only (the real stub is exercised by the soak below)."""
    from dcnkit.runtime.triton_python_model import HANDOVER_DLPACK, HANDOVER_NUMPY, HandOver

    class FakeTensor:
        def __init__(self, array):
            self.array = array

        def __dlpack__(self, *a, **k):
            return self.array.__dlpack__(*a, **k)

        def __dlpack_device__(self):
            return self.array.__dlpack_device__()

        def shape(self):
            return list(self.array.shape)

        def as_numpy(self):
            return self.array

    class FakePbUtils:
        class Tensor(FakeTensor):
            def __init__(self, name, array):
                super().__init__(array)

            @staticmethod
            def from_dlpack(name, capsule):
                array = np.from_dlpack(_Capsule(capsule))
                if array.dtype == np.float16:
                    raise RuntimeError("no float16 here")
                return FakeTensor(array)

    class _Capsule:  # lets np.from_dlpack take a bare capsule (as the stub does)
        def __init__(self, capsule):
            self.capsule = capsule

        def __dlpack__(self, *a, **k):
            return self.capsule

        def __dlpack_device__(self):
            return (1, 0)

    h = HandOver.choose(FakePbUtils, [np.float32, np.float16, np.float32])
    assert h.paths == {np.dtype(np.float16): HANDOVER_NUMPY, np.dtype(np.float32): HANDOVER_DLPACK}
    assert h.describe() == "DLPack for float32; NumPy for float16"
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(h.to_array(h.to_tensor("y", x), np.dtype(np.float32)), x)
    assert np.array_equal(h.to_tensor("y", x.astype(np.float16)).as_numpy(), x.astype(np.float16))


@needs_triton
def test_fault_soak_stub_killed_twice_under_load(tmp_path):
    """16 clients, 4000 requests at 100/s, the stub SIGKILLed at 1/8 and 1/4 of the run (the second kill comes
    within the stable period, so it is answered by a new tritonserver after the back-off delay), then the model
    reloaded through Triton's API under load (new files: a new stub, which the engine adopts without a restart)."""
    model = export_demo_model(tmp_path / f"{soak_triton.NAME}.onnx")
    server = soak_triton.start_server("triton", model, tmp_path)
    try:
        res = soak_triton.run_soak(server, requests=4000, clients=16, kills=2, reloads=1, rate=100.0)
    finally:
        code = soak_triton.stop_server(server)
    s = soak_triton.summary(res, WINDOW_S)
    print(s)
    assert code == 0 and server_processes(str(tmp_path)) == []
    assert s["wrong_answers"] == 0 and s["exact"] > s["requests"] / 2, s  # every answer that came back is exact
    assert s["errors_outside_windows"] == 0, s  # errors only within 15 s after a kill
    assert s["errors_in_final_third"] == 0, s
    assert s["max_latency_s"] < WINDOW_S  # nothing hangs: requests in flight at a crash fail promptly
    kills, (reload,) = s["faults"][:2], s["faults"][2:]
    for fault in kills:
        assert fault["detail"].startswith("SIGKILL to stub pid [")
        assert fault["saw_unready"] and fault["saw_server_unready"], fault  # readiness false while recovering
        assert fault["ready_again_s"] is not None and fault["ready_again_s"] < WINDOW_S, fault
    old_stub, new_stubs = re.fullmatch(r"load -> 200, stub pid \[(\d+)\] -> \[([\d, ]+)\]", reload["detail"]).groups()
    assert new_stubs != old_stub  # Triton did reload it: a new stub
    assert not (res.outcome[res.t_done >= res.faults[2].t] == 1).any()  # and no request failed from then on
    assert set(s["error_messages"]) <= {
        "[500] Stub process 'digits_0_0' is not healthy.", "[Errno 111] Connection refused", "connection closed.",
        "[404] Request for unknown model: 'digits' has no available versions",
        "[400] Request for unknown model: 'digits' is not found"}, s["error_messages"]
    # Quiet: one line per restart with its cause, no traceback, far fewer lines than requests.
    restarts = re.findall(r"^dcnkit serve: digits: backend stub digits_0_0 \(pid \d+\) killed by SIGKILL; "
                          r"(.*) \(restart (\d) in a row, at most 5\)$", res.log_text, re.M)
    assert restarts == [("reloading the model", "1"), ("restarting tritonserver in 1 s", "2")], res.log_text[-3000:]
    assert len(s["restart_lines"]) == 2  # the reload through the API is no crash
    assert s["log_lines"] < s["requests"] / 20 and s["tracebacks_in_log"] == 0 and "PyCapsule" not in res.log_text
    assert s["rss_mb_end"] - s["rss_mb_final_third_start"] < 16, s  # flat over the final third


def _crash_on_load_repository(tmp_path) -> tuple[Path, Path]:
    """The demo model's Python-backend repository whose stub SIGKILLs itself at load once ``marker`` exists."""
    return patched_repository(tmp_path, CRASH_AT_LOAD)


@needs_triton
def test_a_model_that_crashes_at_every_load_backs_off_and_is_given_up(tmp_path):
    repo, marker = _crash_on_load_repository(tmp_path)
    lines: list[str] = []
    sup = TritonSupervisor(repo, "digits", policy=RestartPolicy(max_restarts=3, backoff_s=0.5), exit_timeout_s=1,
                           log=lines.append, output=lambda line: None)
    stop = threading.Event()
    try:
        assert sup.start(stop) and sup.state == "serving"
        url = sup.server.http_url
        (stub_pid,) = sup.server.stubs().values()
        marker.touch()
        result: list = []
        runner = threading.Thread(target=lambda: result.append(sup.run(stop)))
        t0 = time.monotonic()
        os.kill(stub_pid, signal.SIGKILL)
        runner.start()
        runner.join(120)
        assert not runner.is_alive() and result == [EXIT_MODEL_FAILED]
    finally:
        stop.set()
        sup.stop()
    assert sup.state == "failed" and sup.restarts == 0
    assert len(lines) == 4, lines  # three restarts, then the report, one line each
    assert lines[0].startswith(f"dcnkit serve: digits: backend stub digits_0_0 (pid {stub_pid}) killed by SIGKILL; "
                               "reloading the model (restart 1 in a row, at most 3)")
    assert "reloading failed: load failed for model 'digits'" in lines[1] and "is not healthy" in lines[1]
    assert lines[1].endswith("restarting tritonserver in 0.5 s (restart 2 in a row, at most 3)")
    assert "before the model was ready" in lines[2] and lines[2].endswith(
        "restarting tritonserver in 1 s (restart 3 in a row, at most 3)")
    assert "model failed: 3 restart(s) in a row did not keep it serving" in lines[3]
    assert time.monotonic() - t0 > 1.5  # the back-off waited 0.5 + 1 s: not a tight loop
    assert http_status(f"http://{url}/v2/health/ready") is None  # stopped: not ready, nothing left running
    assert server_processes(str(repo)) == []


@needs_triton
def test_plain_tritonserver_keeps_a_dead_stub_ready_until_the_model_is_loaded_again(tmp_path):
    """What the repository of ``triton-repo --backend python`` gets from a plain tritonserver (the facts
    runtime/triton/README.md builds on): after its stub dies the model and server still report ready while every
    request fails; loading the model again through the repository API (explicit model control) brings it back."""
    from dcnkit.runtime.registry import make_runner
    from dcnkit.runtime.triton import write_repository

    model = export_demo_model(tmp_path / "digits.onnx")
    repo = tmp_path / "repo"
    write_repository(model, repo, "digits", backend="python", max_batch_size=8)
    x = np.random.default_rng(3).random((2, 1, 8, 8), dtype=np.float32)
    with make_runner(model, "ort-cpu") as runner:
        want = runner.run({"input": x})["output"]
    extra = ["--model-control-mode=explicit", "--load-model=digits"]
    with triton_server.TritonServer(repo, log_file=tmp_path / "server.log", exit_timeout_s=1, extra=extra) as server:
        server.wait_ready(180, model="digits")
        url = f"http://{server.http_url}"
        with httpclient.InferenceServerClient(server.http_url) as c:
            i = httpclient.InferInput("input", list(x.shape), "FP32")
            i.set_data_from_numpy(x)
            assert np.array_equal(c.infer("digits", [i]).as_numpy("output"), want)
            for pid in server.stubs().values():
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
            with pytest.raises(Exception, match="Stub process 'digits_0_0' is not healthy"):
                c.infer("digits", [i])
            assert http_status(f"{url}/v2/models/digits/ready") == http_status(f"{url}/v2/health/ready") == 200
            req = urllib.request.Request(f"{url}/v2/repository/models/digits/load", data=b"{}", method="POST")
            assert urllib.request.urlopen(req, timeout=180).status == 200
            assert np.array_equal(c.infer("digits", [i]).as_numpy("output"), want)
    assert server_processes(str(repo)) == []


def _supervise(repo, lines, **kw):
    sup = TritonSupervisor(repo, "digits", policy=RestartPolicy(max_restarts=3, backoff_s=0.5), exit_timeout_s=1,
                           log=lines.append, output=lambda line: None, **kw)
    stop = threading.Event()
    result: list = []
    runner = threading.Thread(target=lambda: result.append(sup.run(stop)))
    return sup, stop, runner, result


@needs_triton
def test_a_stub_killed_as_the_model_turns_ready_is_recovered(tmp_path):
    """The blind spot of the last round, on the real server: the stub dies right after the model turns ready (before
    or after the supervisor's first look), before any request. It is a crash; the reload brings the model back."""
    repo, marker = patched_repository(tmp_path, KILL_AT_READY)
    marker.touch()
    lines: list[str] = []
    sup, stop, runner, result = _supervise(repo, lines)
    try:
        assert sup.start(stop)
        t0 = time.monotonic()
        runner.start()
        while not (sup.restarts == 1 and sup.state == "serving"):
            assert time.monotonic() - t0 < 120 and runner.is_alive(), lines
            time.sleep(0.05)
        assert infer(sup.server.http_url).shape[0] == 1
    finally:
        stop.set()
        runner.join(30)
        sup.stop()
    assert result == [0] and len(lines) == 1 and "killed by SIGKILL; reloading the model" in lines[0], lines


def _hold_a_hung_stub(tmp_path, health_timeout_s: float, requests: int, **options):
    """Serves the demo model (``options`` as ``triton_repository`` takes them) whose stub hangs in its first
    inference, sends ``requests`` requests that it holds, and waits until the supervisor has the model serving again:
    (the restart lines, what each held request ended with, :meth:`run`'s result, an inference's answer afterwards)."""
    repo, marker = patched_repository(tmp_path, HANG, **options)
    marker.touch()
    lines: list[str] = []
    sup, stop, runner, result = _supervise(repo, lines, health_timeout_s=health_timeout_s)
    try:
        assert sup.start(stop)
        url = sup.server.http_url
        runner.start()
        held: list = []
        clients = [threading.Thread(target=lambda: held.append(_try(lambda: infer(url, 120))))
                   for _ in range(requests)]
        for c in clients:
            c.start()
        t0 = time.monotonic()
        while not (sup.restarts == 1 and sup.state == "serving"):
            assert time.monotonic() - t0 < 120 and runner.is_alive(), lines
            time.sleep(0.05)
        after = infer(url)
        for c in clients:
            c.join(60)
    finally:
        stop.set()
        runner.join(30)
        sup.stop()
    return lines, held, result, after


@needs_triton
def test_a_hung_stub_is_killed_and_recovered_on_the_real_server(tmp_path):
    lines, held, result, after = _hold_a_hung_stub(tmp_path, 2.0, 1)
    assert after.shape[0] == 1
    assert result == [0] and len(lines) == 1, lines
    assert "no answer to a health inference within 2 s" in lines[0] and "reloading the model" in lines[0]
    assert held  # the held request ended (failed when its stub was killed), it does not hang forever


@needs_triton
def test_a_hung_stub_behind_a_full_queue_is_found_on_the_real_server(tmp_path):
    """16 requests wait on the hung stub: Triton's queue (4 here) is full and it refuses the health inference unrun
    (503 'Exceeds maximum queue size'). That is no answer from the stub: found, killed and recovered (before: taken
    for an answer, and the hang never found)."""
    lines, held, result, after = _hold_a_hung_stub(tmp_path, 1.0, 16, max_queue_size=4)
    assert np.array_equal(after, soak_triton_reference(tmp_path))
    assert result == [0] and len(lines) == 1, lines
    assert "no answer to a health inference within 1 s (Triton refused it: 503 " in lines[0], lines
    assert "Exceeds maximum queue size" in lines[0] and "reloading the model" in lines[0]
    assert len(held) == 16 and sum("Exceeds maximum queue size" in str(h) for h in held) >= 8  # the queue was full


def soak_triton_reference(tmp_path) -> np.ndarray:
    """The kit's ORT runner on the demo model for the zeros ``infer`` sends."""
    from dcnkit.runtime.registry import make_runner

    with make_runner(tmp_path / f"{soak_triton.NAME}.onnx", "ort-cpu") as runner:
        return runner.run({"input": np.zeros((1, 1, 8, 8), np.float32)})["output"]


def _try(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the outcome is the value under test
        return e
