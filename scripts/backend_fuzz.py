"""Fuzz run of the CPU backends: every case (scripts/backend_fuzz_cases.py: a random, often malformed one-node model of
one of the kit's operators, under any of its names, and its inputs) runs on ONNX Runtime (the oracle), OpenVINO and
the reference runner, each backend in its own worker process with a per-case timeout.

A case fails when a backend's process dies (a crash), when it does not answer within the timeout (a hang; the process
is killed), or, where ONNX Runtime returns outputs, when another backend raises or returns outputs that differ from
them: another shape, NaN or an infinity somewhere else, or a finite value further than `--tol` (1e-3; float16
models 1e-2; an explicit grid of n samples per bin n * 2^-24, the float32 rounding of the kernels' sum) of the
outputs' scale from ONNX Runtime's. Where ONNX Runtime raises, the others may raise or return.
A case whose `ov_differs` names a documented difference of OpenVINO's own operation (ONNX's max RoiAlign) only has
to end on OpenVINO. Even cases run OpenVINO with one inference thread, odd ones with its default.

    python scripts/backend_fuzz.py [--cases 300] [--seed 0] [--timeout 30] [--case I] [--report FILE]

Prints one line per failure (with the command that replays it) and a summary; exit 1 on a failure, else 0.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

BACKENDS = ("ort-cpu", "openvino", "reference")
# The kernels add a bin's samples one by one in float32: the mean of n samples carries up to n * 2^-24 of rounding
# (1024 x 1024 samples of a box a few pixels wide: measured 0.8%), so such a bin is compared at that tolerance.
FLOAT32_SUM_ROUNDING = 2.0**-24
ORACLE = "ort-cpu"
DEFAULT_TARGET = "backend_fuzz:run_case"


def run_case(backend: str, model: bytes, feeds: dict, ov_threads) -> dict:
    """The outputs of ``model`` on ``backend`` (the worker's default task)."""
    from dcnkit.runtime.registry import make_runner

    options = {}
    if backend == "openvino" and ov_threads:
        options["num_threads"] = ov_threads
    if backend.startswith("ort"):  # its own log of the errors a case is meant to raise: off (they are answers)
        options = dict(intra_op_num_threads=1, inter_op_num_threads=1, log_severity_level=4)
    with make_runner(model, backend=backend, **options) as runner:
        return runner.run(feeds)


def _import(target: str):
    module, name = target.split(":")
    return getattr(__import__(module), name)


def _worker_main(conn, backend: str, target: str) -> None:
    """A worker: runs each case it is sent on ``backend`` and answers ("ok", outputs, s) or ("error", text, s)."""
    task = _import(target)
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        start = time.monotonic()
        try:
            out = task(backend, *job)
            reply = ("ok", {k: np.asarray(v) for k, v in out.items()}, time.monotonic() - start)
        except Exception as e:  # noqa: BLE001 - every error is an answer
            text = " ".join(str(e).split())
            reply = ("error", f"{type(e).__name__}: {text[-400:]}", time.monotonic() - start)
        conn.send(reply)


class Worker:
    """One backend's worker process; restarted after a crash or a hang."""

    def __init__(self, ctx, backend: str, target: str):
        self.ctx, self.backend, self.target = ctx, backend, target
        self.restarts = 0
        self._start()

    def _start(self):
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker_main, args=(child, self.backend, self.target), daemon=True)
        self.proc.start()
        child.close()

    def _restart(self):
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(10)
        self.conn.close()
        self.restarts += 1
        self._start()

    def submit(self, job) -> None:
        self.conn.send(job)
        self.sent = time.monotonic()

    def result(self, timeout: float):
        """("ok", outputs, s) | ("error", text, s) | ("crash", text, s) | ("hang", text, s)."""
        try:
            if self.conn.poll(max(0.0, self.sent + timeout - time.monotonic())):
                return self.conn.recv()
        except (EOFError, OSError):
            pass
        seconds = time.monotonic() - self.sent
        if self.proc.is_alive() and seconds >= timeout:
            self._restart()
            return ("hang", f"no answer within {timeout:g} s (killed)", seconds)
        self.proc.join(10)
        code = self.proc.exitcode
        self._restart()
        return ("crash", f"the worker process died (exit code {code})", seconds)

    def close(self):
        self.conn.close()
        self.proc.kill()
        self.proc.join(10)


def disagreement(want: dict, got: dict, tol: float) -> str | None:
    """Why ``got`` differs from the oracle's ``want`` (None: they agree; see the module docstring)."""
    if set(want) != set(got):
        return f"outputs {sorted(got)}, expected {sorted(want)}"
    for name, w in want.items():
        g = np.asarray(got[name])
        w = np.asarray(w)
        if g.shape != w.shape:
            return f"{name}: shape {g.shape}, expected {w.shape}"
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        if not np.array_equal(np.isnan(g64), np.isnan(w64)):
            at = np.argwhere(np.isnan(g64) != np.isnan(w64))[0]
            return f"{name}: NaN at {tuple(at)} in one only ({g64[tuple(at)]} vs {w64[tuple(at)]})"
        inf = np.isinf(w64) | np.isinf(g64)
        if not np.array_equal(g64[inf], w64[inf]):
            at = np.argwhere(inf & (g64 != w64))[0]
            return f"{name}: infinity at {tuple(at)} differs ({g64[tuple(at)]} vs {w64[tuple(at)]})"
        fin = np.isfinite(w64)
        if fin.any():
            scale = max(1.0, float(np.abs(w64[fin]).max()))
            err = np.abs(g64[fin] - w64[fin])
            bad = err > tol * scale + tol * np.abs(w64[fin])
            if bad.any():
                return f"{name}: largest difference {err.max():.3g} (scale {scale:.3g}, tolerance {tol:g} of it)"
    return None


@dataclass
class Tally:
    counts: dict = field(default_factory=dict)  # backend -> outcome -> n
    slowest: dict = field(default_factory=dict)  # backend -> (seconds, case)
    compared: int = 0
    agreed: int = 0
    oracle_raised_other_ran: dict = field(default_factory=dict)
    ran_where_oracle_raised: list = field(default_factory=list)  # (case, name, backend, the oracle's error)
    failures: list = field(default_factory=list)

    def add(self, backend: str, outcome: str, seconds: float, case: int):
        self.counts.setdefault(backend, {}).setdefault(outcome, 0)
        self.counts[backend][outcome] += 1
        if seconds > self.slowest.get(backend, (0.0, -1))[0]:
            self.slowest[backend] = (seconds, case)


def fuzz(cases: range, seed: int, backends=BACKENDS, timeout: float = 30.0, tol: float = 1e-3,
         target: str = DEFAULT_TARGET, log=print) -> Tally:
    """Runs ``cases`` (indices) of ``seed`` on ``backends`` (the first is the oracle); returns the tally."""
    import backend_fuzz_cases as F

    names = F.variants()
    ctx = multiprocessing.get_context("spawn")
    workers = {b: Worker(ctx, b, target) for b in backends}
    tally = Tally()
    try:
        for i in cases:
            case = F.draw(np.random.default_rng([seed, i]), names)
            threads = 1 if i % 2 == 0 else None
            for w in workers.values():
                w.submit((case.model, case.feeds, threads))
            results = {b: w.result(timeout) for b, w in workers.items()}
            _judge(i, seed, case, results, backends, tol, tally, log)
    finally:
        for w in workers.values():
            w.close()
    return tally


def _judge(i, seed, case, results, backends, tol, tally, log):
    oracle = backends[0]
    for b, (outcome, _, seconds) in results.items():
        tally.add(b, outcome, seconds, i)
        if outcome in ("crash", "hang"):
            tally.failures.append((i, case.name, b, outcome, results[b][1]))
    state, want, _ = results[oracle]
    if state == "error":
        for b in backends[1:]:
            if results[b][0] == "ok":
                tally.oracle_raised_other_ran[b] = tally.oracle_raised_other_ran.get(b, 0) + 1
                tally.ran_where_oracle_raised.append((i, case.name, b, want))
    if state != "ok":
        return
    for b in backends[1:]:
        if b == "openvino" and case.ov_differs:
            continue
        tally.compared += 1
        got_state, got, _ = results[b]
        tol_case = max(tol * 10 if "float16" in case.name else tol, case.samples_per_bin * FLOAT32_SUM_ROUNDING)
        why = got if got_state == "error" else disagreement(want, got, tol_case) if got_state == "ok" else None
        if got_state in ("crash", "hang"):
            continue
        if why is None:
            tally.agreed += 1
        else:
            tally.failures.append((i, case.name, b, "disagrees", why))
    for f in tally.failures:
        if f[0] == i:
            log(f"FAIL case {i} ({f[1]}) on {f[2]}: {f[3]}: {f[4]}  "
                f"[replay: python scripts/backend_fuzz.py --seed {seed} --case {i}]")


def summary(tally: Tally, n: int, seconds: float) -> str:
    lines = [f"backend_fuzz: {n} cases in {seconds:.0f} s, {len(tally.failures)} failures; "
             f"{tally.agreed} of {tally.compared} comparisons with {ORACLE} agree"]
    for b, c in tally.counts.items():
        slow, case = tally.slowest.get(b, (0.0, -1))
        ran = ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
        extra = f"; ran where {ORACLE} raised: {tally.oracle_raised_other_ran[b]}" \
            if b in tally.oracle_raised_other_ran else ""
        lines.append(f"  {b}: {ran}; slowest case {slow:.2f} s (case {case}){extra}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds a backend may take for one case")
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--case", type=int, default=None, help="run only case I of the seed (a replay)")
    ap.add_argument("--backends", default=",".join(BACKENDS), help=f"comma-separated; the first is the oracle")
    ap.add_argument("--report", default=None, help="write the tally as JSON to this file")
    args = ap.parse_args(argv)
    backends = tuple(b for b in args.backends.split(",") if b)
    cases = range(args.case, args.case + 1) if args.case is not None else range(args.cases)
    start = time.monotonic()
    tally = fuzz(cases, args.seed, backends, args.timeout, args.tol)
    seconds = time.monotonic() - start
    print(summary(tally, len(cases), seconds))
    if args.report:
        with open(args.report, "w") as f:
            json.dump({"seed": args.seed, "cases": len(cases), "seconds": seconds, "counts": tally.counts,
                       "slowest": tally.slowest, "compared": tally.compared, "agreed": tally.agreed,
                       "oracle_raised_other_ran": tally.oracle_raised_other_ran,
                       "ran_where_oracle_raised": tally.ran_where_oracle_raised,
                       "failures": tally.failures}, f, indent=1, default=str)
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
