"""A stand-in for ``tritonserver`` that the supervisor cannot tell from the real one where it looks: the HTTP
endpoints it reads (readiness, model metadata and configuration, statistics, explicit model control, inference) and
Python-backend stubs as children of the server, with Triton's command line (``argv[0]`` ends in
``triton_python_backend_stub``, ``argv[1]`` the model file in the repository, ``argv[8]`` the instance
``<model>_0_<i>``) that answer inferences over a pipe. Like Triton it never reaps a stub that died (a zombie) until
the model is unloaded, and answers ``Stub process '<instance>' is not healthy.`` for it.

What each load does comes from ``<repository>/fake_triton.json``, read at every load:
``{"loads": [[mode, ...], ...], "reap": false, "bare": false}``; load k uses ``loads[k]`` (the last one again once they run out),
one mode per instance (the instance count is the first load's): ``run``, ``die`` (the stub kills itself at start:
the model still turns ready, once the stub is a zombie), ``hang`` (the stub never answers an inference), ``slow``
(each inference takes 0.5 s). ``reap``: the server reaps stubs that die (as no Triton does); ``bare``: no metadata,
configuration or statistics endpoints (404), only readiness, model control and inference; ``max_queue``: at most
this many inferences waiting or running, the others refused as Triton refuses them (``503 ... Exceeds maximum
queue size``); ``script_stubs``: stubs run as a script by the interpreter (``argv[0]`` the interpreter, the stub
program ``argv[1]``, everything after one place later). While a file ``<repository>/ready-error`` exists, the
model's ready endpoint answers 503.

    python fake_tritonserver.py --model-repository=R --http-port=P --load-model=M [Triton's other flags, ignored]
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

STUB_SCRIPT = '''
import os, signal, sys
if sys.argv[-1] == "die":
    os.kill(os.getpid(), signal.SIGKILL)
for line in sys.stdin:
    if sys.argv[-1] == "slow":
        import time
        time.sleep(0.5)
    if sys.argv[-1] != "hang":
        sys.stdout.write("ok\\n")
        sys.stdout.flush()
'''


def _state(pid: int) -> str | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()[0]


class Stub:
    def __init__(self, repo: Path, model: str, index: int, mode: str, script_stub: bool = False):
        self.name = f"{model}_0_{index}"
        script = repo / model / "1" / "model.py"
        r_in, self.w_in = os.pipe()
        self.r_out, w_out = os.pipe()
        program = repo / "backend" / "triton_python_backend_stub"
        argv = [str(program), str(script), *"abcdef", self.name, mode]
        if script_stub:  # the stub program is a script of this Python's, run by its interpreter
            program.write_text(STUB_SCRIPT)
            argv = [sys.executable, *argv]
        env = dict(os.environ, PYTHONHOME=sys.base_prefix)  # argv[0] is no Python: say where its library is
        self.pid = os.posix_spawn(sys._base_executable, argv, env, file_actions=[
            (os.POSIX_SPAWN_DUP2, r_in, 0), (os.POSIX_SPAWN_DUP2, w_out, 1)])
        os.close(r_in)
        os.close(w_out)
        self.reply = os.fdopen(self.r_out, "rb")
        self.lock = threading.Lock()  # one inference at a time; the pipes are closed under it
        self.closed = False

    def alive(self) -> bool:
        return _state(self.pid) not in (None, "Z", "X")

    def infer(self) -> bool:
        with self.lock:
            if self.closed:  # unloaded while this request waited (its fds may name a new stub's pipes by now)
                return False
            try:
                os.write(self.w_in, b"x\n")
            except OSError:
                return False
            return self.reply.readline() == b"ok\n"  # EOF (killed) or never (hangs)


class Model:
    def __init__(self, repo: Path, name: str):
        self.repo, self.name = repo, name
        self.loads, self.ready, self.stubs, self.next = 0, False, [], 0
        self.success = self.fail = self.in_flight = 0
        self.lock = threading.Lock()
        self.config = {}

    def load(self) -> None:
        self.unload()
        self.config = json.loads((self.repo / "fake_triton.json").read_text())
        plans = self.config["loads"]
        modes = plans[min(self.loads, len(plans) - 1)]
        self.loads += 1
        self.stubs = [Stub(self.repo, self.name, i, m, self.config.get("script_stubs", False))
                      for i, m in enumerate(modes)]
        deadline = time.monotonic() + 10
        for stub, mode in zip(self.stubs, modes):
            while mode == "die" and _state(stub.pid) not in (None, "Z", "X") and time.monotonic() < deadline:
                time.sleep(0.01)  # dead before the model turns ready
        time.sleep(0.3)  # a model's load time: not ready meanwhile
        self.ready = True

    def unload(self) -> None:
        self.ready = False
        for stub in self.stubs:
            try:
                os.kill(stub.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.waitpid(stub.pid, 0)
            except ChildProcessError:
                pass
            with stub.lock:  # free: the stub is dead, so an inference on it has ended or not begun
                stub.closed = True
                os.close(stub.w_in)
                stub.reply.close()
        self.stubs = []

    def infer(self) -> tuple[int, dict]:
        with self.lock:
            if not self.ready or not self.stubs:
                return 400, {"error": f"Request for unknown model: '{self.name}' is not found"}
            if self.in_flight >= self.config.get("max_queue", 1 << 30):
                return 503, {"error": "[request id: <id_unknown>] Exceeds maximum queue size"}
            stub = self.stubs[self.next % len(self.stubs)]
            self.next += 1
            self.in_flight += 1
        try:
            return self._infer_on(stub)
        finally:
            with self.lock:
                self.in_flight -= 1

    def _infer_on(self, stub: Stub) -> tuple[int, dict]:
        if not stub.alive():
            self.fail += 1
            return 500, {"error": f"Stub process '{stub.name}' is not healthy."}
        if not stub.infer():
            self.fail += 1
            return 500, {"error": f"Stub process '{stub.name}' is not healthy."}
        self.success += 1
        return 200, {"model_name": self.name, "outputs": [{"name": "output", "datatype": "FP32", "shape": [1],
                                                           "data": [1.0]}]}


def main(argv) -> None:
    opts = {}
    for a in argv:
        if a.startswith("--") and "=" in a:
            k, v = a[2:].split("=", 1)
            opts.setdefault(k, []).append(v)
    repo = Path(opts["model-repository"][0])
    name = opts["load-model"][0]
    model = Model(repo, name)
    backend = repo / "backend"
    backend.mkdir(exist_ok=True)
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "1" / "model.py").write_text(STUB_SCRIPT)
    if json.loads((repo / "fake_triton.json").read_text()).get("reap"):
        def reap(*_):
            for stub in model.stubs:
                try:
                    os.waitpid(stub.pid, os.WNOHANG)
                except ChildProcessError:
                    pass
        signal.signal(signal.SIGCHLD, reap)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code: int, body: dict | None = None) -> None:
            data = json.dumps(body or {}).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            m = f"/v2/models/{name}"
            if self.path == f"{m}/ready" and (repo / "ready-error").exists():
                return self._send(503, {"error": "upstream unavailable"})
            if self.path in ("/v2/health/ready", f"{m}/ready"):
                return self._send(200 if model.ready else 400)
            if self.path == "/v2/health/live":
                return self._send(200)
            if model.config.get("bare"):
                return self._send(404, {"error": "not found"})
            if self.path == m:
                return self._send(200, {"name": name, "inputs": [{"name": "input", "datatype": "FP32",
                                                                  "shape": [-1, 4]}]})
            if self.path == f"{m}/config":
                return self._send(200, {"name": name, "instance_group": [
                    {"count": len(model.config.get("loads", [[]])[0]), "kind": "KIND_CPU"}]})
            if self.path == f"{m}/stats":
                return self._send(200, {"model_stats": [{"name": name, "inference_stats": {
                    "success": {"count": model.success}, "fail": {"count": model.fail}}}]})
            return self._send(404, {"error": "not found"})

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            base = f"/v2/repository/models/{name}"
            if self.path == f"{base}/load":
                model.load()
                return self._send(200)
            if self.path == f"{base}/unload":
                model.unload()
                return self._send(200)
            if self.path == f"/v2/models/{name}/infer":
                return self._send(*model.infer())
            return self._send(404, {"error": "not found"})

    server = ThreadingHTTPServer((opts.get("http-address", ["127.0.0.1"])[0], int(opts["http-port"][0])), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: (model.unload(), os._exit(0)))
    model.load()
    print(f"I fake tritonserver: model {name} loaded", flush=True)
    print(f"I Started HTTPService at {server.server_address[0]}:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
