"""How fast ``dcnkit serve --engine triton``'s supervisor notices each fault and has the model serving again, on the real
``tritonserver`` of the nvidia-pytriton wheel (the demo DCNv2 digits model, the supervisor in this process, defaults
as ``dcnkit serve`` has them: poll 0.2 s, health timeout 5 s, max restarts 5, back-off 1 s doubling).

    python benchmarks/triton_fault_times.py [--repeat 3]

Per fault, the fastest and slowest of ``--repeat`` runs: *detected* is from the fault to the supervisor's restart
line, *recovered* from the fault to the model serving again and answering an inference (for the give-up row: to
:meth:`run` returning exit code 3). Faults: the stub SIGKILLed while the model serves (idle); the stub killing itself
0.3 s after the model turned ready, before any request (the last round's blind spot); the stub hanging in its first
inference (a client's request held); the same behind a full queue (``max_queue_size`` 4, 16 requests held: Triton
refuses the health inference unrun); tritonserver SIGKILLed; a stub that dies at every load (given up on).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import soak_triton  # noqa: E402

KILL_AT_READY = ("    def initialize(self, args):\n"
                 "        super().initialize(args)\n"
                 "        if os.path.exists(MARKER):\n"
                 "            os.remove(MARKER)\n"
                 "            import signal, threading, time\n"
                 "            def die():\n"
                 "                open(MARKER + '.t', 'w').write(repr(time.time()))\n"
                 "                os.kill(os.getpid(), signal.SIGKILL)\n"
                 "            threading.Timer(0.3, die).start()\n")
HANG = ("    def initialize(self, args):\n"
        "        self.hang = os.path.exists(MARKER)\n"
        "        if self.hang:\n"
        "            os.remove(MARKER)\n"
        "        super().initialize(args)\n\n"
        "    def execute(self, requests):\n"
        "        if self.hang:\n"
        "            import time\n"
        "            time.sleep(3600)\n"
        "        return super().execute(requests)\n")
CRASH_AT_LOAD = ("    def initialize(self, args):\n"
                 "        if os.path.exists(MARKER):\n"
                 "            import signal\n"
                 "            os.kill(os.getpid(), signal.SIGKILL)\n"
                 "        super().initialize(args)\n")


def patched_repository(workdir: Path, body: str, model: Path | None = None, **options) -> tuple[Path, Path]:
    """The demo model's Python-backend repository (``dcnkit serve --engine triton``'s, ``options`` as
    ``triton_repository`` takes them) whose TritonPythonModel is subclassed with ``body``: methods that may test
    ``MARKER``, a file path returned beside the repository."""
    from dcnkit.server.triton_engine import triton_repository

    model = model or soak_triton.export_demo(workdir / f"{soak_triton.NAME}.onnx")
    repo = workdir / "repo"
    model_dir = triton_repository(model, repo, **options)
    marker = workdir / "marker"
    model_py = (model_dir / "1" / "model.py").read_text()
    (model_dir / "1" / "model.py").write_text(
        model_py.replace("TritonPythonModel  # noqa: E402,F401", "TritonPythonModel as _Base  # noqa")
        + f"\n\nMARKER = {str(marker)!r}\n\n\nclass TritonPythonModel(_Base):\n{body}")
    return repo, marker


def infer(url: str, timeout: float = 60.0):
    import tritonclient.http as httpclient

    x = np.zeros((1, 1, 8, 8), dtype=np.float32)
    with httpclient.InferenceServerClient(url, network_timeout=timeout, connection_timeout=timeout) as c:
        i = httpclient.InferInput("input", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        return c.infer(soak_triton.NAME, [i]).as_numpy("output")


def _serving_again(sup, restarts: int, timeout: float = 120.0) -> float:
    deadline = time.monotonic() + timeout
    while not (sup.restarts >= restarts and sup.state == "serving"):
        if time.monotonic() > deadline or sup.state == "failed":
            raise RuntimeError(f"not serving again within {timeout:g} s (state {sup.state})")
        time.sleep(0.02)
    infer(sup.server.http_url)
    return time.time()


def one_run(fault: str, workdir: Path, model: Path) -> tuple[float, float]:
    """(detected, recovered) seconds after the fault."""
    from dcnkit.server.triton_supervisor import TritonSupervisor

    body = {"kill-at-ready": KILL_AT_READY, "hang": HANG, "hang-full-queue": HANG,
            "crash-at-every-load": CRASH_AT_LOAD}.get(fault, "    pass\n")
    options = {"max_queue_size": 4} if fault == "hang-full-queue" else {}
    repo, marker = patched_repository(workdir, body, model, **options)
    if fault in ("kill-at-ready", "hang", "hang-full-queue"):
        marker.touch()
    lines: list[tuple[float, str]] = []
    sup = TritonSupervisor(repo, soak_triton.NAME, exit_timeout_s=1, log=lambda s: lines.append((time.time(), s)),
                           output=lambda s: None)
    stop, result = threading.Event(), []
    try:
        sup.start(stop)
        runner = threading.Thread(target=lambda: result.append(sup.run(stop)))
        runner.start()
        if fault == "kill-at-ready":
            while not Path(f"{marker}.t").exists():
                time.sleep(0.01)
            t0 = float(Path(f"{marker}.t").read_text())
        elif fault in ("hang", "hang-full-queue"):
            t0 = time.time()
            for _ in range(16 if fault == "hang-full-queue" else 1):
                threading.Thread(target=lambda: _quiet(infer, sup.server.http_url, 120), daemon=True).start()
        elif fault == "stub-sigkill":
            time.sleep(1.0)
            (pid,) = sup.server.stubs().values()
            t0 = time.time()
            os.kill(pid, signal.SIGKILL)
        elif fault == "server-sigkill":
            time.sleep(1.0)
            t0 = time.time()
            os.kill(sup.server.process.pid, signal.SIGKILL)
        else:  # crash-at-every-load
            time.sleep(1.0)
            marker.touch()
            (pid,) = sup.server.stubs().values()
            t0 = time.time()
            os.kill(pid, signal.SIGKILL)
            runner.join(300)
            return lines[0][0] - t0, time.time() - t0
        done = _serving_again(sup, 1)
        return lines[0][0] - t0, done - t0
    finally:
        stop.set()
        sup.stop()


def _quiet(fn, *args):
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - the held request fails when its stub is killed: expected
        pass


FAULTS = {"stub-sigkill": "stub SIGKILLed while serving (idle)",
          "kill-at-ready": "stub dies 0.3 s after the model turned ready, before any request",
          "hang": "stub hangs in its first inference (health timeout 5 s)",
          "hang-full-queue": "stub hangs behind a full queue (max_queue_size 4, 16 requests held; health timeout 5 s)",
          "server-sigkill": "tritonserver SIGKILLed",
          "crash-at-every-load": "stub dies at every load (given up: exit 3 after 5 restarts)"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--faults", default=",".join(FAULTS))
    args = ap.parse_args(argv)
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="dcnkit-fault-times-") as tmp:
        model = soak_triton.export_demo(Path(tmp) / f"{soak_triton.NAME}.onnx")
        for fault in args.faults.split(","):
            runs = []
            for k in range(args.repeat):
                work = Path(tmp) / f"{fault}-{k}"
                work.mkdir()
                runs.append(one_run(fault, work, model))
            det, rec = [r[0] for r in runs], [r[1] for r in runs]
            rows.append(f"| {FAULTS[fault]} | {min(det):.2f}-{max(det):.2f} s | {min(rec):.2f}-{max(rec):.2f} s |")
            print(rows[-1], flush=True)
    print("\n| fault | detected within | recovered within |\n|---|---|---|\n" + "\n".join(rows))
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
