"""Supervision of ``dcnkit serve --engine triton``: a backend stub or a ``tritonserver`` that dies is noticed and
brought back, and a model that keeps dying is given up on.

Triton 2.51 does not restart a Python-backend stub that died (an out-of-memory kill, a crash in native code): it
answers every later request ``Stub process '<model>_0_0' is not healthy.`` while the model's ready endpoint and
``/v2/health/ready`` go on answering 200. So :class:`TritonSupervisor` watches the processes themselves:

* **Detect.** Every ``poll_s`` (0.2 s) it reads ``/proc`` for the server's children and checks the server process. A
  stub is known by its pid and start time (a pid the kernel hands out again is another process). These are crashes: a
  child of the server that ended with a signal or an error code and is left unreaped (Triton does not reap a dead stub:
  a zombie, whose command line is gone), a tracked stub that has ended or is gone while the model still answers ready,
  and fewer running instance stubs than the model's instance count (Triton's ``/v2/models/<m>/config``, else the
  repository's ``config.pbtxt``) for longer than ``grace_s``. A stub that died before the model turned ready is such a
  zombie, seen in the first scan. A stub that is alive but hangs is found by a health inference of bounded time
  (:mod:`dcnkit.server.triton_health`, ``health_timeout_s``; 0 turns it off) and killed, then recovered as a dead one. A
  readiness probe that gets no answer, or a server error (5xx), is no unload: the stub is kept, and the server counts as
  hung once it has not answered for ``health_timeout_s`` (or 10 s with the health inference off).
* **Recover.** The server runs with explicit model control. The first crash after a stable period is answered by
  unloading and loading the model (a new stub; about the model's load time). A crash that follows a recovery within
  ``stable_s``, or a reload that fails, gets a fresh ``tritonserver`` after a back-off delay (``backoff_s``,
  doubling up to ``max_backoff_s``), with the server down meanwhile.
* **Report.** From the unload (or the server's stop) until the model is loaded again, ``/v2/health/ready`` and
  ``/v2/models/<m>/ready`` answer 400 (Triton's strict readiness: a model loading or unloading is not ready), or
  nothing at all while the server is down; requests get Triton's errors (unknown or unavailable model) or a refused
  connection. Requests in flight at the crash are failed by Triton with ``Stub process ... is not healthy``.
* **States.** ``starting``, ``serving``, ``recovering`` (Triton's readiness false, or no server), ``failed`` (given
  up: the server is stopped, :meth:`run` returns :data:`EXIT_MODEL_FAILED`), ``stopped``.
* **Log.** Each restart is one line with its cause; Triton's own output during the recovery (its loading lines,
  a new server's banner) is held back, and its error lines are printed if the model is given up on.
* **Give up.** After ``max_restarts`` restarts in a row without ``stable_s`` of service in between, the model is
  reported failed in one line, the server is stopped and :meth:`run` returns :data:`EXIT_MODEL_FAILED`.
"""
from __future__ import annotations

import collections
import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from dcnkit.runtime.triton_server import TritonServer, describe_exit
from dcnkit.server.triton_health import HealthProbe
from dcnkit.server.defaults import MAX_RESTARTS

EXIT_MODEL_FAILED = 3  # the exit code of `dcnkit serve --engine triton` when the model is given up on
HEALTH_TIMEOUT_S = 5.0  # --health-timeout's default: seconds a health inference may take


@dataclass(frozen=True)
class RestartPolicy:
    """When to restart, and when to stop trying: ``max_restarts`` in a row (0: none), each after
    :meth:`delay`; the count starts again once the model has served ``stable_s`` seconds."""

    max_restarts: int = MAX_RESTARTS
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    stable_s: float = 60.0

    def __post_init__(self):
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ValueError(f"max_restarts: expected an integer >= 0, got {self.max_restarts!r}")
        for what in ("backoff_s", "max_backoff_s", "stable_s"):
            if not getattr(self, what) >= 0:
                raise ValueError(f"{what}: expected a number >= 0, got {getattr(self, what)!r}")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before restart number ``attempt`` of a row (1-based): none for the first."""
        return 0.0 if attempt <= 1 else min(self.backoff_s * 2 ** (attempt - 2), self.max_backoff_s)


# Tokens of protobuf's text format: strings, comments, punctuation, names and numbers.
_PBTXT_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|#[^\n]*|[{}\[\]<>:,;]|[^\s{}\[\]<>:,;"\'#]+')
_PBTXT_CLOSE = {"{": "}", "<": ">"}


def _pbtxt_fields(tokens: list[str], i: int, close: str | None) -> tuple[list[tuple[str, object]], int]:
    """The ``(field, value)`` pairs of the message from ``tokens[i]`` to its ``close`` (None: the end), a message
    value as its own pairs, a list as one pair per element; and the index after the message."""
    fields = []
    while i < len(tokens) and tokens[i] != close:
        name, i = tokens[i], i + 1 + (tokens[i + 1] == ":")
        values, i = _pbtxt_value(tokens, i)
        fields += [(name, v) for v in values]
        i += tokens[i] in (",", ";") if i < len(tokens) else 0
    if close is not None and i >= len(tokens):
        raise ValueError(f"config.pbtxt: expected {close!r} before the end")
    return fields, i + 1


def _pbtxt_value(tokens: list[str], i: int) -> tuple[list, int]:
    if tokens[i] in _PBTXT_CLOSE:
        message, i = _pbtxt_fields(tokens, i + 1, _PBTXT_CLOSE[tokens[i]])
        return [message], i
    if tokens[i] == "[":
        values, i = [], i + 1
        while tokens[i] != "]":
            value, i = _pbtxt_value(tokens, i)
            values += value
            i += tokens[i] == ","
        return values, i + 1
    return [tokens[i]], i + 1


def config_instance_count(text: str) -> int:
    """The instances a ``config.pbtxt`` declares: the sum of its ``instance_group`` counts (1 where a group gives
    none); 0 when it declares no group, or cannot be read. Read with Triton's schema, or, without it (no
    ``tritonclient[grpc]``), by protobuf's text format itself, in either of its syntaxes: ``instance_group { ... }``
    (what the kit and protobuf write) and ``instance_group [ {...}, ... ]``."""
    try:
        from dcnkit.runtime.triton import parse_config

        return sum(g.count or 1 for g in parse_config(text).instance_group)
    except Exception:  # noqa: BLE001 - no schema here, or a file it refuses: the text itself
        pass
    try:
        tokens = [t for t in _PBTXT_TOKEN.findall(text) if not t.startswith("#")]
        fields, _ = _pbtxt_fields(tokens, 0, None)
        groups = [dict(g) for name, g in fields if name == "instance_group" and isinstance(g, list)]
        return sum(int(g.get("count", 1)) or 1 for g in groups)
    except (IndexError, ValueError):
        return 0


class TritonSupervisor:
    """Runs ``tritonserver`` on ``repository`` serving ``model`` and keeps it serving (the module docstring)."""

    def __init__(self, repository, model: str, *, host: str = "127.0.0.1", http_port: int | None = None,
                 grpc_port: int | None = None, metrics_port: int | None = None, exit_timeout_s: int = 5,
                 policy: RestartPolicy = RestartPolicy(), ready_timeout_s: float = 300.0, poll_s: float = 0.2,
                 health_timeout_s: float = HEALTH_TIMEOUT_S, grace_s: float = 2.0, log=print, output=None,
                 server_factory=TritonServer):
        """``log`` gets the supervisor's lines, ``output`` (default: ``log``) Triton's own output, line by line;
        ``server_factory`` makes the server (:class:`TritonServer`'s arguments)."""
        self.repository, self.model, self.policy = repository, model, policy
        self.ready_timeout_s, self.poll_s, self.log = ready_timeout_s, poll_s, log
        self.health = HealthProbe(model, health_timeout_s, repository=repository)
        self.grace_s, self._server_factory = grace_s, server_factory
        self._unanswered_limit_s = health_timeout_s if health_timeout_s > 0 else 10.0
        self._output = output or log
        self._server_options = dict(host=host, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                                    exit_timeout_s=exit_timeout_s)
        self.server: TritonServer | None = None
        self.restarts = 0  # restarts done, all told
        self.state = "stopped"  # starting, serving, recovering, failed, stopped
        self._in_a_row = 0
        self._serving_since: float | None = None
        self._stubs: dict[str, tuple[int, int]] = {}  # instance name -> (pid, start time) of its stub
        self._answered: set[tuple[int, int]] = set()  # ended children already recovered from (never reaped)
        self._expected = 0  # the model's instance count (0: unknown)
        self._short_since: float | None = None  # since when fewer instance stubs run than expected
        self._unanswered_since: float | None = None  # since when a stub is gone and readiness gets no answer
        self._kill_stubs = False  # the next recovery kills the live stubs first (a hang)
        self._quiet = False
        self._held: collections.deque = collections.deque(maxlen=200)
        self._held_lock = threading.Lock()  # the reader thread appends while the supervisor reads

    # -- Triton's output: forwarded, or held back while recovering --------------------------------------------
    def _on_output(self, line: str) -> None:
        if self._quiet:
            with self._held_lock:
                self._held.append(line)
        else:
            self._output(line)

    def held_lines(self) -> list[str]:
        """Triton's output held back during the current recovery (a copy)."""
        with self._held_lock:
            return list(self._held)

    def _clear_held(self) -> None:
        with self._held_lock:
            self._held.clear()

    def _new_server(self) -> TritonServer:
        extra = ["--model-control-mode=explicit", f"--load-model={self.model}"]
        server = self._server_factory(self.repository, extra=extra, output=self._on_output, **self._server_options)
        self._server_options.update(http_port=server.http_port, grpc_port=server.grpc_port,
                                    metrics_port=server.metrics_port)  # a restarted server keeps the ports
        return server

    # -- start, serve, stop -----------------------------------------------------------------------------------------
    def start(self, stop: threading.Event | None = None) -> bool:
        """Starts the server and waits until the model is ready: True; False if ``stop`` was set meanwhile.
        RuntimeError when the server exits first or is not ready within ``ready_timeout_s``."""
        self.state = "starting"
        self.server = self._new_server().start()
        error = self._wait_ready(stop or threading.Event())
        if error == "stopped":
            return False
        if error:
            raise RuntimeError(f"tritonserver did not get model {self.model!r} ready ({error}; its log is above)")
        self._serving()
        return True

    def run(self, stop: threading.Event) -> int:
        """Supervises until ``stop`` is set (returns 0) or the model is given up on (:data:`EXIT_MODEL_FAILED`)."""
        while not stop.wait(self.poll_s):
            cause = self.check()
            if cause is not None and self.recover(cause, stop) == "failed":
                return EXIT_MODEL_FAILED
        return 0

    def stop(self) -> int | None:
        """Stops the server (Triton finishes what is in flight, then its process group is killed)."""
        if self.state != "failed":
            self.state = "stopped"
        return self.server.stop() if self.server is not None else None

    # -- detection ------------------------------------------------------------------------------------------------
    def check(self) -> str | None:
        """What has died or hangs since the last check (a cause, in words), or None."""
        p = self.server.process
        if p.poll() is not None:
            return f"tritonserver {describe_exit(p.returncode)}"
        now = time.monotonic()
        children = self.server.children()
        live = {c.name: c for c in children if c.name is not None}
        for c in children:  # ended, unreaped: a tracked stub, or any child that failed (even before the first scan)
            if c.state != "Z" or c.ident in self._answered:
                continue
            name = next((n for n, ident in self._stubs.items() if ident == c.ident), None)
            if name is not None or c.returncode not in (0, None):
                self._answered.add(c.ident)
                return f"backend stub {name or 'of ' + self.model} (pid {c.pid}) {describe_exit(c.returncode)}"
        for name, ident in list(self._stubs.items()):
            if name in live:
                self._stubs[name] = live[name].ident  # the same, or replaced by Triton (a reload through the API)
                continue
            ready = self._model_ready()
            if ready is False:  # reaped by Triton, the model not ready: unloaded on purpose through the API
                del self._stubs[name]
                continue
            if ready is None:  # no answer: keep the stub, and count how long the server stays silent
                self._unanswered_since = self._unanswered_since or now
                if now - self._unanswered_since >= self._unanswered_limit_s:
                    return (f"backend stub {name} (pid {ident[0]}) is gone and tritonserver has not answered for "
                            f"{now - self._unanswered_since:.0f} s")
                return None
            return f"backend stub {name} (pid {ident[0]}) is gone"
        self._unanswered_since = None
        for name, c in live.items():
            self._stubs.setdefault(name, c.ident)
        cause = self._count_check(len(live), now)
        if cause is None:
            cause = self.health.check(now)
            self._kill_stubs = cause is not None
        return cause

    def _count_check(self, running: int, now: float) -> str | None:
        """Fewer instance stubs than the model's count, for ``grace_s`` while the model answers ready."""
        if running >= self._expected:
            self._short_since = None
            return None
        self._short_since = self._short_since or now
        if now - self._short_since < self.grace_s or self._model_ready() is False:
            return None
        return f"{running} of {self._expected} instance stubs of {self.model} running"

    def _model_ready(self) -> bool | None:
        """Whether the model answers ready: True (200), False (another status: Triton's 400 for a model that is not
        ready), None (no answer, or a server error: no word on the model)."""
        try:
            with urllib.request.urlopen(f"http://{self.server.http_url}/v2/models/{self.model}/ready", timeout=5) as r:
                return r.status == 200
        except urllib.error.HTTPError as e:
            return None if e.code >= 500 else False
        except OSError:
            return None

    def _instance_count(self) -> int:
        """The model's instance count: Triton's configuration endpoint, else the repository's config.pbtxt (the
        counts of its instance_group); 0 when neither says."""
        try:
            with urllib.request.urlopen(f"http://{self.server.http_url}/v2/models/{self.model}/config", timeout=5) as r:
                groups = json.loads(r.read()).get("instance_group") or []
            return sum(int(g.get("count", 1)) for g in groups)
        except (OSError, ValueError, TypeError, AttributeError):
            pass
        try:
            return config_instance_count((Path(self.repository) / self.model / "config.pbtxt").read_text())
        except OSError:
            return 0

    def _kill_live_stubs(self) -> None:
        for c in self.server.children():
            if c.name is not None:
                try:
                    os.kill(c.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self._answered.add(c.ident)

    # -- recovery -------------------------------------------------------------------------------------------------
    def recover(self, cause: str, stop: threading.Event) -> str:
        """Brings the model back after ``cause``: "serving", "stopped" (``stop`` was set) or "failed"."""
        while True:
            now = time.monotonic()
            if self._serving_since is not None and now - self._serving_since >= self.policy.stable_s:
                self._in_a_row = 0
            self._in_a_row += 1
            self._serving_since = None
            if self._in_a_row > self.policy.max_restarts:
                return self._give_up(cause)
            delay = self.policy.delay(self._in_a_row)
            reload = delay == 0 and self.server.process.poll() is None
            action = "reloading the model" if reload else "restarting tritonserver" + (
                f" in {delay:g} s" if delay else "")
            self.log(f"dcnkit serve: {self.model}: {cause}; {action} (restart {self._in_a_row} in a row, at most "
                     f"{self.policy.max_restarts})")
            self.state, self._quiet = "recovering", True
            self._clear_held()
            if self._kill_stubs:  # a hung stub would hold up the unload: it goes first
                self._kill_live_stubs()
                self._kill_stubs = False
            error = self._reload(stop) if reload else self._restart(delay, stop)
            if error == "stopped":
                self._quiet = False
                return "stopped"
            if error is None:
                self.restarts += 1
                self._serving()
                return "serving"
            cause = error

    def _serving(self) -> None:
        """The model is ready: track its stubs (ended ones are left to check(), which counts them as crashes)."""
        self.state, self._quiet = "serving", False
        now = self._serving_since = time.monotonic()
        self._stubs = {c.name: c.ident for c in self.server.children() if c.name is not None}
        self._expected = self._instance_count() or len(self._stubs)
        self._short_since = self._unanswered_since = None
        self.health.reset(self.server.http_url, now)

    def _give_up(self, cause: str) -> str:
        self.state = "failed"
        errors = [ln for ln in self.held_lines() if ln[:1] == "E" or "rror" in ln]
        for line in errors[-10:]:
            self._output(line)
        self.log(f"dcnkit serve: {self.model}: {cause}; model failed: {self.policy.max_restarts} restart(s) in a "
                 f"row did not keep it serving, stopping tritonserver (exit code {EXIT_MODEL_FAILED})")
        self.server.stop()
        return "failed"

    def _post(self, path: str, timeout: float) -> str | None:
        """POSTs to the server: None on 200, else the error (Triton's message, or why there was no answer)."""
        req = urllib.request.Request(f"http://{self.server.http_url}{path}", data=b"{}", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout):
                return None
        except urllib.error.HTTPError as e:
            try:
                return str(json.loads(e.read()).get("error", e)).strip().rstrip(";").strip()
            except (ValueError, OSError):
                return str(e)
        except OSError as e:
            return f"no answer from tritonserver ({e})"

    def _reload(self, stop: threading.Event) -> str | None:
        """Unload, then load: not ready in between (Triton's readiness); None once it serves, else the error."""
        base = f"/v2/repository/models/{self.model}"
        error = self._post(f"{base}/unload", timeout=30)
        if error is not None:
            return f"unloading failed: {error}"
        result: list = []
        loader = threading.Thread(target=lambda: result.append(self._post(f"{base}/load", self.ready_timeout_s)),
                                  daemon=True)
        loader.start()
        while loader.is_alive():
            if stop.wait(0.1):
                return "stopped"
            if self.server.process.poll() is not None:
                return f"tritonserver {describe_exit(self.server.process.returncode)} while loading the model"
        if result and result[0] is not None:
            return f"reloading failed: {result[0]}"
        return self._wait_ready(stop)

    def _restart(self, delay: float, stop: threading.Event) -> str | None:
        """A new server after ``delay`` s (none meanwhile: readiness probes fail); None once it serves. The old one
        gets a second to answer what it has: with its stub dead, nothing it holds can succeed."""
        self.server.stop(timeout=1.0)
        if stop.wait(delay):
            return "stopped"
        self.server = self._new_server().start()
        return self._wait_ready(stop)

    def _wait_ready(self, stop: threading.Event) -> str | None:
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            if stop.is_set():
                return "stopped"
            p = self.server.process
            if p.poll() is not None:
                last = [ln for ln in self.held_lines() if ln[:1] == "E"]
                return f"tritonserver {describe_exit(p.returncode)} before the model was ready" + (
                    f" ({last[-1].split('] ', 1)[-1].strip(chr(34))})" if last else "")
            try:
                self.server.wait_ready(timeout=0.3, model=self.model)
                return None
            except RuntimeError:
                if time.monotonic() > deadline:
                    return f"the model was not ready within {self.ready_timeout_s:g} s"


__all__ = ["EXIT_MODEL_FAILED", "HEALTH_TIMEOUT_S", "RestartPolicy", "TritonSupervisor", "config_instance_count"]
