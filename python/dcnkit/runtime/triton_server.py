"""Running NVIDIA's ``tritonserver`` here: the binary and Python backend that the ``nvidia-pytriton`` wheel ships.

>>> from dcnkit.runtime.triton_server import TritonServer
>>> with TritonServer("model_repository", http_port=8000, grpc_port=8001, metrics_port=8002) as server:
...     server.wait_ready(timeout=60)        # then tritonclient.http / .grpc on 127.0.0.1

The wheel (``pip install --no-deps nvidia-pytriton==0.7.0``; only its files are used, not its Python API)
holds ``pytriton/tritonserver/{bin/tritonserver, backends/python, python_backend_stubs/3.x/}``. The Python
backend wants the stub of this Python's version beside ``libtriton_python.so``: :func:`backend_directory` lays
that out once, under ``$XDG_CACHE_HOME/dcnkit`` (links, the stub copied).

The stub embeds the first ``libpython3.x.so`` the dynamic loader finds. When this Python's shared library is not
the system one (a pyenv build) that is the wrong one, and model loading fails with ``'_thread.RLock' object has no
attribute '_recursion_count'``: :func:`server_environment` puts ``sysconfig``'s ``LIBDIR`` first on
``LD_LIBRARY_PATH``, this interpreter's ``bin`` first on ``PATH`` (the embedded Python finds its virtual
environment from there) and the folder this dcnkit comes from on ``PYTHONPATH`` (so the stub imports the same
dcnkit; the stub's interpreter is isolated, the repository's ``model.py`` reads ``PYTHONPATH`` itself).

The server runs in a process group of its own; :meth:`TritonServer.stop` sends it SIGTERM (Triton finishes what
is in flight, at most ``exit_timeout_s``), then SIGKILLs whatever of the group is left, stubs included.
:meth:`TritonServer.stubs` lists its Python-backend stubs (one process per model instance, named
``<model>_<group>_<instance>``) and :func:`process_status` tells whether one is still running; Triton itself does
not restart a stub that died (``dcnkit.server.triton_supervisor`` does).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from dcnkit.runtime.base import BackendUnavailable

PYTRITON_REQUIREMENT = "nvidia-pytriton==0.7.0"
INSTALL_HINT = f"pip install --no-deps {PYTRITON_REQUIREMENT}"


def distribution_dir() -> Path:
    """``.../site-packages/pytriton/tritonserver`` (found without importing PyTriton); BackendUnavailable if absent."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise BackendUnavailable(f"Triton: the nvidia-pytriton wheel is not installed ({INSTALL_HINT})")
    root = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    if not (root / "bin" / "tritonserver").is_file():
        raise BackendUnavailable(f"Triton: {root / 'bin' / 'tritonserver'} is missing (reinstall: {INSTALL_HINT})")
    return root


def python_library_dir() -> Path:
    """The folder of this Python's ``libpython3.x.so``, which the backend stub must load; BackendUnavailable if none."""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    # The stub links the soname (libpython3.x.so.1.0), which is there without the -dev symlink.
    name = (sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY")
            or f"libpython{sys.version_info[0]}.{sys.version_info[1]}.so.1.0")
    if not sysconfig.get_config_var("Py_ENABLE_SHARED") or not (Path(libdir) / name).is_file():
        raise BackendUnavailable(
            f"Triton: the Python backend stub cannot start: it needs this Python's shared library, tried "
            f"{Path(libdir) / name} (LIBDIR of {sys.executable}; a Python built with --enable-shared has it)")
    return Path(libdir)


def _libs_dir(dist: Path) -> Path:
    return dist.parents[1] / "nvidia_pytriton.libs"  # the wheel's vendored libraries (auditwheel)


def backend_directory(cache_dir=None) -> Path:
    """A ``--backend-directory`` whose ``python/`` has the stub of this Python's version (made once, then reused)."""
    dist = distribution_dir()
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise BackendUnavailable(f"Triton: the wheel has no Python backend stub for Python {version} (tried {stub})")
    base = Path(cache_dir or os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dcnkit"
    key = hashlib.sha1(str(dist).encode()).hexdigest()[:10]  # one layout per installed wheel
    out = base / "tritonserver-backends" / f"{key}-py{version}"
    python = out / "python"
    target = python / "triton_python_backend_stub"
    if not target.is_file() or target.stat().st_size != stub.stat().st_size:
        python.mkdir(parents=True, exist_ok=True)
        for f in (dist / "backends" / "python").iterdir():
            if f.is_file() and not (python / f.name).exists():
                try:
                    (python / f.name).symlink_to(f)
                except FileExistsError:  # another process laid it out at the same moment
                    pass
        tmp = python / f".stub.{os.getpid()}"
        shutil.copy2(stub, tmp)  # a copy: $ORIGIN in the stub's RPATH is then this folder; LD_LIBRARY_PATH covers it
        os.replace(tmp, target)
    return out


def unavailable_reason() -> str | None:
    """Why ``tritonserver`` cannot run here (no wheel, no stub for this Python, no shared libpython), or None."""
    try:
        backend_directory()
        python_library_dir()
    except BackendUnavailable as e:
        return str(e)
    return None


def server_environment(base: dict | None = None) -> dict:
    """The environment for ``tritonserver`` (``base``: default ``os.environ``) with this Python's libpython, its
    virtual environment and the folder of this dcnkit (the module docstring says why)."""
    env = dict(os.environ if base is None else base)
    dist = distribution_dir()
    libs = [str(python_library_dir()), str(_libs_dir(dist))]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(libs + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    import dcnkit

    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    here = str(Path(dcnkit.__file__).resolve().parents[1])  # the folder this dcnkit is imported from
    env["PYTHONPATH"] = os.pathsep.join(paths + ([here] if here not in paths else []))
    return env


def server_command_line(repository) -> str:
    """A shell line that serves ``repository`` here (the environment of :func:`server_environment` spelled out)."""
    from shlex import quote

    env = server_environment({})
    cmd = [str(distribution_dir() / "bin" / "tritonserver"), f"--model-repository={Path(repository).resolve()}",
           f"--backend-directory={backend_directory()}"]
    return " ".join([f"LD_LIBRARY_PATH={quote(env['LD_LIBRARY_PATH'])}",
                     f"PATH={quote(str(Path(sys.executable).parent))}:\"$PATH\"",
                     f"PYTHONPATH={quote(env['PYTHONPATH'])}"] + [quote(c) for c in cmd])


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_command(repository, *, host: str = "127.0.0.1", http_port: int = 8000, grpc_port: int = 8001,
                   metrics_port: int = 8002, exit_timeout_s: int = 8, log_verbose: int = 0,
                   extra: Sequence[str] = ()) -> list[str]:
    """The ``tritonserver`` command line serving ``repository`` on ``host`` (HTTP, gRPC, metrics)."""
    for what, port in (("http_port", http_port), ("grpc_port", grpc_port), ("metrics_port", metrics_port)):
        if not isinstance(port, int) or not 0 < port <= 65535:
            raise ValueError(f"{what}: expected a port in 1..65535, got {port!r}")
    ports = {http_port, grpc_port, metrics_port}
    if len(ports) != 3:
        raise ValueError(f"ports: expected three different ports, got http {http_port}, grpc {grpc_port}, "
                         f"metrics {metrics_port}")
    return [
        str(distribution_dir() / "bin" / "tritonserver"),
        f"--model-repository={Path(repository).resolve()}",
        f"--backend-directory={backend_directory()}",
        f"--http-address={host}", f"--http-port={http_port}",
        f"--grpc-address={host}", f"--grpc-port={grpc_port}",
        "--allow-metrics=true", "--allow-gpu-metrics=false", f"--metrics-address={host}",
        f"--metrics-port={metrics_port}",
        f"--exit-timeout-secs={int(exit_timeout_s)}", f"--log-verbose={int(log_verbose)}",
        *extra,
    ]


STUB_PROGRAM = "triton_python_backend_stub"


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3, the state, first); None when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def _status_of(fields: list[str]) -> tuple[str, int | None]:
    if fields[0] not in ("Z", "X"):
        return fields[0], None
    if len(fields) < 50:  # pragma: no cover - kernels before 3.5 do not show the exit code
        return "Z", None
    status = int(fields[-1])  # the wait status
    return "Z", -(status & 0x7F) if status & 0x7F else status >> 8


def process_status(pid: int) -> tuple[str, int | None] | None:
    """``(state, return code)`` of process ``pid`` from ``/proc``: state ``"Z"`` when it has ended but its parent has
    not reaped it yet (the return code as ``Popen.returncode`` gives it: negative for a signal), else its running
    state letter (return code None); None when it is gone."""
    fields = _stat_fields(pid)
    return None if fields is None else _status_of(fields)


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot, ``/proc/<pid>/stat`` field 22); None when it is gone.
    With the pid it names one process: a pid the kernel hands out again has another start time."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


@dataclass(frozen=True)
class Child:
    """A child process of ``tritonserver``: ``(pid, start)`` is its identity; ``state`` "Z" when it has ended and is
    not reaped (``returncode`` as :func:`process_status` gives it); ``name`` the model instance
    (``<model>_<group>_<index>``) of a running Python-backend stub of the repository, else None (an ended process
    has no command line left)."""

    pid: int
    start: int
    state: str
    returncode: int | None
    name: str | None

    @property
    def ident(self) -> tuple[int, int]:
        return self.pid, self.start


def describe_exit(returncode: int | None) -> str:
    """A return code (negative: the signal that ended it) in words: 'killed by SIGKILL', 'exited with code 1'."""
    if returncode is None:
        return "ended"
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


class TritonServer:
    """A ``tritonserver`` process serving a model repository (a context manager that always stops it)."""

    def __init__(self, repository, *, host: str = "127.0.0.1", http_port: int | None = None,
                 grpc_port: int | None = None, metrics_port: int | None = None, exit_timeout_s: int = 8,
                 log_file=None, extra: Sequence[str] = (), output=None):
        """Ports left out (or 0) are picked free now. The server's output (its stubs' included) goes to
        ``log_file``, or line by line to ``output`` (a callable, from a reader thread), or else to ours."""
        if log_file is not None and output is not None:
            raise ValueError("output: expected either log_file or output, got both")
        self.repository = Path(repository).resolve()
        self.output = output
        self.host = host
        self.http_port = http_port or free_port(host)
        self.grpc_port = grpc_port or free_port(host)
        self.metrics_port = metrics_port or free_port(host)
        self.command = server_command(repository, host=host, http_port=self.http_port, grpc_port=self.grpc_port,
                                      metrics_port=self.metrics_port, exit_timeout_s=exit_timeout_s, extra=extra)
        self.env = server_environment()
        self.exit_timeout_s = exit_timeout_s
        self.log_file = log_file
        self.process: subprocess.Popen | None = None

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    def start(self) -> "TritonServer":
        out = open(self.log_file, "wb") if self.log_file else None  # None: this process's stdout / stderr
        if self.output is not None:
            out = subprocess.PIPE
        try:
            self.process = subprocess.Popen(self.command, env=self.env, stdout=out,
                                            stderr=subprocess.STDOUT if out else None,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            if out not in (None, subprocess.PIPE):
                out.close()
        if self.output is not None:
            threading.Thread(target=self._forward, args=(self.process.stdout,), daemon=True,
                             name="tritonserver-output").start()
        return self

    def _forward(self, pipe) -> None:
        with pipe:
            for raw in pipe:  # until the server and its stubs (they share the pipe) are gone
                try:
                    self.output(raw.decode(errors="replace").rstrip("\n"))
                except Exception:  # noqa: BLE001 - never stop draining the pipe, or the server blocks on it
                    pass

    def children(self) -> list[Child]:
        """The server's child processes, ended ones not yet reaped included (Triton leaves a dead stub so)."""
        found: list[Child] = []
        if self.process is None:
            return found
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            fields = _stat_fields(int(entry.name))
            if fields is None or int(fields[1]) != self.process.pid:
                continue
            state, code = _status_of(fields)
            name = None
            if state != "Z":
                try:
                    argv = (entry / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                name = self._instance_name(argv)
            found.append(Child(int(entry.name), int(fields[19]), state, code, name))
        return found

    @staticmethod
    def _instance_name(argv: list[bytes]) -> str | None:
        """The model instance a stub's command line names: ``argv[8]`` counted from the stub program, which is
        ``argv[0]``, or ``argv[1]`` for a stub that is a script run by its interpreter."""
        program = next((i for i, a in enumerate(argv[:2])
                        if os.path.basename(a.decode(errors="replace")) == STUB_PROGRAM), None)
        if program is None or len(argv) <= program + 8:
            return None
        name = argv[program + 8].decode(errors="replace")
        # Model instances only ("<model>_<group>_<index>"): while a model loads, the Python backend also runs a
        # short-lived stub named after the model alone (its config auto-completion), whose exit is no crash.
        return name if re.search(r"_\d+_\d+$", name) else None

    def stubs(self) -> dict[str, int]:
        """The server's running Python-backend stubs of this repository: ``{instance name: pid}``."""
        return {c.name: c.pid for c in self.children() if c.name is not None}

    def log_tail(self, n: int = 30) -> str:
        if not self.log_file or not Path(self.log_file).is_file():
            return ""
        return "\n".join(Path(self.log_file).read_text(errors="replace").splitlines()[-n:])

    def wait_ready(self, timeout: float = 120.0, model: str | None = None) -> None:
        """Waits until ``/v2/health/ready`` (and ``model``'s ready) answer 200; RuntimeError if it exits or times out."""
        import urllib.request

        paths = ["/v2/health/ready"] + ([f"/v2/models/{model}/ready"] if model else [])
        deadline = time.monotonic() + timeout
        while True:
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise RuntimeError(f"tritonserver exited (code {code}) before it was ready:\n{self.log_tail()}")
            try:
                if all(urllib.request.urlopen(f"http://{self.http_url}{p}", timeout=2).status == 200 for p in paths):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"tritonserver was not ready within {timeout:g} s:\n{self.log_tail()}")
            time.sleep(0.2)

    def group_alive(self) -> bool:
        """Whether any process of the server's process group (the server, its stubs) is still there."""
        if self.process is None:
            return False
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # pragma: no cover - the group id was reused by another user's process
            return False
        return True

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM, wait (``exit_timeout_s`` + 2 s by default), then SIGKILL the group; returns the exit code."""
        p = self.process
        if p is None:
            return None
        timeout = self.exit_timeout_s + 2 if timeout is None else timeout
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        if self.group_alive():  # the server did not stop in time, or a stub outlived it
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        code = p.wait()
        deadline = time.monotonic() + 5
        while self.group_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        return code

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False


def check_loads(repository, models: Sequence[str] | None = None, timeout: float = 180.0) -> list[str]:
    """Loads ``models`` (default: every model) of ``repository`` in a ``tritonserver`` here, on 127.0.0.1, then
    stops it; returns Triton's reasons for the models that did not load ([] when all did)."""
    import json
    import tempfile
    import urllib.request

    repository = Path(repository)
    if models is None:
        models = sorted(p.name for p in repository.iterdir() if (p / "config.pbtxt").is_file())
    extra = ["--model-control-mode=explicit", *(f"--load-model={m}" for m in models)]
    with tempfile.TemporaryDirectory(prefix="dcnkit-triton-check-") as tmp:
        with TritonServer(repository, log_file=Path(tmp) / "server.log", exit_timeout_s=2, extra=extra) as server:
            try:
                server.wait_ready(timeout)
            except RuntimeError as e:
                text = Path(tmp, "server.log").read_text(errors="replace") if Path(tmp, "server.log").exists() else ""
                # Triton's error lines: E<date> <time> <pid> <file>:<line>] "failed to load '<m>' version 1: <why>\n..."
                failed = [ln.split("] ", 1)[-1].strip('"').split("\\n")[0] for ln in text.splitlines()
                          if ln.startswith("E") and "failed to load" in ln]
                return failed or [str(e).splitlines()[0]]
            req = urllib.request.Request(f"http://{server.http_url}/v2/repository/index", data=b"{}", method="POST")
            index = json.loads(urllib.request.urlopen(req, timeout=10).read())
    states = {m["name"]: m for m in index}
    return [f"{m}: {states.get(m, {}).get('state', 'not found')} {states.get(m, {}).get('reason', '')}".strip()
            for m in models if states.get(m, {}).get("state") != "READY"]


__all__ = ["PYTRITON_REQUIREMENT", "STUB_PROGRAM", "Child", "TritonServer", "backend_directory", "check_loads",
           "describe_exit", "distribution_dir", "free_port", "process_start", "process_status", "python_library_dir", "server_command",
           "server_command_line", "server_environment", "unavailable_reason"]
