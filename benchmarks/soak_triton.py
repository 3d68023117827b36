"""Fault soak of ``dcnkit serve --engine triton``: many requests from concurrent clients while the Python-backend stub
is SIGKILLed (as an out-of-memory kill would) and the model is reloaded through Triton's repository API.

    python benchmarks/soak_triton.py [--requests 1000000] [--clients 16] [--kills 4] [--reloads 1] [--window 15]
    python benchmarks/soak_triton.py --engine light --requests 100000 --kills 0 --reloads 0   # the light server

The demo model (a DCNv2 digits classifier, one 1x8x8 image per request, HTTP binary tensors, tritonclient) is served
by ``dcnkit serve`` in a subprocess on 127.0.0.1; its output goes to a file. ``--clients`` threads send
``--requests`` requests in all (at ``--rate`` requests per second in all, or as fast as they go); a client that
gets an error waits ``--error-pause`` s before its next request, as a client that retries would. Every answer is
compared with the kit's ORT runner in this process, bit for bit. The faults (``--kills`` stub kills, then
``--reloads`` reloads of the model while it serves, its files touched so that Triton does reload it) are spread over
the first half of the run (by requests); each waits until the model is ready and its stub is up. A monitor polls the
ready endpoints every 0.1 s and samples the server's resident memory (tritonserver and its stubs; the light
server's process) every second.

Printed: requests, failures (inside a recovery window of ``--window`` s after a kill, and outside), wrong answers,
per fault the time until readiness came back and the errors it cost, log lines per request, RSS at the start of the
final third and at the end. ``run_soak`` is what ``tests/test_triton_faults.py`` calls with CI's sizes.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

NAME = "digits"
POOL = 256  # distinct images; request j sends image j % POOL


def export_demo(path: Path) -> Path:
    import torch

    import dcnkit.export as dk_export
    from dcnkit.demo import build_model

    torch.manual_seed(0)
    dk_export.to_onnx(build_model().eval(), (torch.rand(2, 1, 8, 8),), str(path), dynamic_batch=True, verbose=False)
    return path


def processes(marker: str, program: str) -> list[int]:
    """Live processes whose command line has ``program`` and ``marker`` (e.g. the server's temporary folder)."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if program in cmd and marker in cmd and state not in ("Z", "X"):
            found.append(int(p.name))
    return found


def rss_mb(pids) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def http_status(url: str) -> int | None:
    """The HTTP status of GET ``url`` (None: no answer)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    log: Path
    workdir: Path
    engine: str
    model: Path

    def stubs(self) -> list[int]:
        return processes(str(self.workdir), "triton_python_backend_stub")

    def server_pids(self) -> list[int]:
        if self.engine == "light":
            return [self.proc.pid]
        return processes(str(self.workdir), "bin/tritonserver") + self.stubs()

    def ready(self) -> bool:
        return http_status(f"http://{self.url}/v2/models/{NAME}/ready") == 200


def start_server(engine: str, model: Path, workdir: Path, extra=()) -> Server:
    from dcnkit.runtime.triton_server import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "dcnkit", "serve", str(model), "--engine", engine, "--name", NAME,
           "--port", str(port), "--max-batch-size", "8", "--max-queue-delay-ms", "2", *extra]
    if engine == "triton":
        cmd += ["--grpc-port", str(free_port()), "--metrics-port", str(free_port())]
    log = workdir / f"serve-{engine}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, TMPDIR=str(workdir)))
    server = Server(proc, f"127.0.0.1:{port}", log, workdir, engine, model)
    deadline = time.monotonic() + 300
    while not server.ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_server(server)
            raise RuntimeError(f"{engine}: dcnkit serve did not get ready: {log.read_text()[-3000:]}")
        time.sleep(0.2)
    return server


def stop_server(server: Server) -> int | None:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(30)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
    for pid in processes(str(server.workdir), "tritonserver") + server.stubs():  # nothing may outlive it
        os.kill(pid, signal.SIGKILL)
    return server.proc.returncode


@dataclass
class Fault:
    kind: str  # "kill" or "reload"
    at_request: int
    t: float = float("nan")  # seconds since the start of the run
    ready_again_s: float | None = None  # from the fault until the model's ready endpoint answered 200 again
    saw_unready: bool = False  # the model's ready endpoint answered other than 200 (or nothing) after the fault
    saw_server_unready: bool = False  # /v2/health/ready, likewise
    detail: str = ""


@dataclass
class SoakResult:
    t_done: np.ndarray  # per request, seconds since the start, in the order requests were sent
    outcome: np.ndarray  # 0 exact answer, 1 error, 2 wrong answer
    latency: np.ndarray
    faults: list
    errors: collections.Counter
    rss: list  # (t, MB)
    log_lines: int
    log_text: str
    wall_s: float
    requests: int = 0
    probes: int = 0  # the monitor's readiness requests (the light server logs one line for each, as for any request)

    def in_windows(self, window: float) -> np.ndarray:
        inside = np.zeros(len(self.t_done), bool)
        for f in self.faults:
            if f.kind == "kill":
                inside |= (self.t_done >= f.t) & (self.t_done <= f.t + window)
        return inside

    def rss_at(self, t: float) -> float:
        return min(self.rss, key=lambda s: abs(s[0] - t))[1] if self.rss else float("nan")


def run_soak(server: Server, requests: int, clients: int, kills: int, reloads: int = 0, *, rate: float = 0.0,
             error_pause_s: float = 0.1, network_timeout_s: float = 60.0) -> SoakResult:
    """Drives ``server`` with ``clients`` threads for ``requests`` requests and the faults; see the module doc.
    ``rate`` > 0: request j is not sent before ``j / rate`` s into the run (a paced load)."""
    import tritonclient.http as httpclient

    from dcnkit.runtime.registry import make_runner

    images = np.random.default_rng(0).random((POOL, 1, 8, 8), dtype=np.float32)
    with make_runner(server.model, "ort-cpu") as runner:
        want = np.concatenate([runner.run({"input": images[i:i + 1]})["output"] for i in range(POOL)])
    n_faults = kills + reloads
    faults = [Fault("kill" if i < kills else "reload", int(requests / 2 * (i + 1) / (n_faults + 1)))
              for i in range(n_faults)]  # in the first half: the final third must find the model serving
    t_done = np.full(requests, np.nan)
    outcome = np.full(requests, -1, np.int8)
    latency = np.zeros(requests)
    errors: collections.Counter = collections.Counter()
    counter = iter(range(requests))
    lock = threading.Lock()
    done = [0]
    finished = threading.Event()
    rss: list = []
    probes = [0]
    t0 = time.monotonic()

    def client() -> None:
        with httpclient.InferenceServerClient(server.url, network_timeout=network_timeout_s) as c:
            while True:
                with lock:
                    j = next(counter, None)
                if j is None:
                    return
                if rate > 0:
                    time.sleep(max(0.0, t0 + j / rate - time.monotonic()))
                i = httpclient.InferInput("input", [1, 1, 8, 8], "FP32")
                i.set_data_from_numpy(images[j % POOL:j % POOL + 1], binary_data=True)
                start = time.monotonic()
                try:
                    out = c.infer(NAME, [i]).as_numpy("output")
                    result = 0 if np.array_equal(out, want[j % POOL:j % POOL + 1]) else 2
                except Exception as e:  # noqa: BLE001 - counted, by message
                    result = 1
                    with lock:
                        errors[str(e).splitlines()[0][:160]] += 1
                end = time.monotonic()
                t_done[j], outcome[j], latency[j] = end - t0, result, end - start
                with lock:
                    done[0] += 1
                if result == 1:
                    time.sleep(error_pause_s)

    def faults_and_monitor() -> None:
        pending = list(faults)
        last_rss = -1.0
        current = None
        while not finished.is_set():
            now = time.monotonic() - t0
            if now - last_rss >= 1.0:
                rss.append((now, rss_mb(server.server_pids())))
                last_rss = now
            ready = server.ready()
            probes[0] += 1
            if current is not None and current.ready_again_s is None:
                probes[0] += 1
                if http_status(f"http://{server.url}/v2/health/ready") != 200:
                    current.saw_server_unready = True
                if not ready:
                    current.saw_unready = True
                elif current.saw_unready or current.kind == "reload":
                    current.ready_again_s = time.monotonic() - t0 - current.t
            if pending and done[0] >= pending[0].at_request and ready and (
                    server.engine == "light" or server.stubs()) and (current is None or current.ready_again_s
                                                                    is not None):
                current = pending.pop(0)
                current.t = time.monotonic() - t0
                if current.kind == "kill":
                    pids = server.stubs()
                    for pid in pids:
                        os.kill(pid, signal.SIGKILL)
                    current.detail = f"SIGKILL to stub pid {pids}"
                else:  # an operator's reload: Triton reloads a model only when its files changed
                    before = server.stubs()
                    for f in server.workdir.glob(f"dcnkit-triton-*/{NAME}/1/model.onnx"):
                        os.utime(f)
                    req = urllib.request.Request(f"http://{server.url}/v2/repository/models/{NAME}/load", data=b"{}",
                                                 method="POST")
                    try:
                        with urllib.request.urlopen(req, timeout=300) as r:
                            current.detail = f"load -> {r.status}"
                    except OSError as e:
                        current.detail = f"load -> {e}"
                    current.detail += f", stub pid {before} -> {server.stubs()}"
                    current.ready_again_s = time.monotonic() - t0 - current.t  # the load call returns when done
            time.sleep(0.1)

    monitor = threading.Thread(target=faults_and_monitor, daemon=True)
    monitor.start()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    finished.set()
    monitor.join(10)
    text = server.log.read_text(errors="replace")
    return SoakResult(t_done, outcome, latency, faults, errors, rss, len(text.splitlines()), text, wall, requests,
                      probes[0])


def summary(res: SoakResult, window: float) -> dict:
    inside = res.in_windows(window)
    err = res.outcome == 1
    final = slice(2 * res.requests // 3, None)
    t_final = float(np.nanmin(res.t_done[final])) if res.requests else 0.0
    return {
        "requests": res.requests, "wall_s": round(res.wall_s, 1), "req_per_s": round(res.requests / res.wall_s, 1),
        "exact": int((res.outcome == 0).sum()), "errors": int(err.sum()),
        "errors_in_windows": int((err & inside).sum()), "errors_outside_windows": int((err & ~inside).sum()),
        "wrong_answers": int((res.outcome == 2).sum()), "errors_in_final_third": int(err[final].sum()),
        "max_latency_s": round(float(res.latency.max()), 2),
        "faults": [{"kind": f.kind, "t_s": round(f.t, 1), "ready_again_s": None if f.ready_again_s is None
                    else round(f.ready_again_s, 1), "saw_unready": f.saw_unready,
                    "saw_server_unready": f.saw_server_unready,
                    "errors_in_window": int((err & (res.t_done >= f.t) & (res.t_done <= f.t + window)).sum()),
                    "detail": f.detail} for f in res.faults],
        "log_lines": res.log_lines, "log_lines_per_request": round(res.log_lines / res.requests, 4),
        "http_requests": res.requests + res.probes,
        "log_lines_per_http_request": round(res.log_lines / (res.requests + res.probes), 4),
        "tracebacks_in_log": res.log_text.count("Traceback"),
        "restart_lines": [ln for ln in res.log_text.splitlines() if ln.startswith("dcnkit serve:") and "restart" in ln],
        "rss_mb_final_third_start": round(res.rss_at(t_final), 1), "rss_mb_end": round(res.rss[-1][1], 1),
        "rss_mb_max": round(max(m for _, m in res.rss), 1),
        "error_messages": dict(res.errors.most_common(6)),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("triton", "light"), default="triton")
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--kills", type=int, default=4, help="stub SIGKILLs (triton only; default 4)")
    ap.add_argument("--reloads", type=int, default=1, help="model reloads through the repository API, after the "
                    "kills (triton only; default 1)")
    ap.add_argument("--window", type=float, default=15.0, help="recovery window after a kill, s (default 15)")
    ap.add_argument("--rate", type=float, default=0.0, help="paced load: requests per second in all (default 0: "
                    "as fast as the clients go)")
    ap.add_argument("--error-pause", type=float, default=0.1, help="a client's pause after an error, s")
    ap.add_argument("--model", default=None, help="an ONNX model with input 'input' (N,1,8,8) (default: the demo)")
    ap.add_argument("--json", default=None, help="also write the summary to this JSON file")
    args = ap.parse_args(argv)
    if args.engine == "light" and (args.kills or args.reloads):
        ap.error("--kills/--reloads: expected 0 with --engine light (its process cannot survive a crash in-process)")
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        tmp = Path(tmp)
        model = tmp / f"{NAME}.onnx"
        if args.model:
            model.write_bytes(Path(args.model).read_bytes())
        else:
            export_demo(model)
        server = start_server(args.engine, model, tmp, ["--log-level", "info"])
        try:
            res = run_soak(server, args.requests, args.clients, args.kills, args.reloads, rate=args.rate,
                           error_pause_s=args.error_pause)
        finally:
            code = stop_server(server)
        out = summary(res, args.window)
        out.update(engine=args.engine, clients=args.clients, window_s=args.window, exit_code=code)
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    ok = (out["wrong_answers"] == 0 and out["errors_outside_windows"] == 0 and out["errors_in_final_third"] == 0
          and (args.engine == "light" or out["log_lines_per_request"] < 1))  # light: uvicorn's access log, 1 each
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
