"""``dcnkit serve MODEL --engine triton``: the model served by NVIDIA's ``tritonserver`` (the binary of the
``nvidia-pytriton`` wheel) with Triton's own dynamic batching, HTTP and gRPC (KServe v2) and Prometheus metrics.

The model goes into a temporary Python-backend repository (:mod:`dcnkit.runtime.triton_python`: the kit's ONNX
Runtime runner in Triton's Python backend), which :class:`~dcnkit.runtime.triton_server.TritonServer` serves until
SIGINT or SIGTERM; then Triton finishes what is in flight (``graceful_timeout_s``) and the server's whole process
group, backend stubs included, is gone before this returns. Meanwhile
:class:`~dcnkit.server.triton_supervisor.TritonSupervisor` brings back a backend stub or server that dies. Model
name, inputs and outputs (names, shapes with -1, datatypes) are those of the kit's own server (``--engine light``).
"""
from __future__ import annotations

import os
import signal
import tempfile
import threading
from pathlib import Path

from dcnkit.server.defaults import DEFAULTS, MAX_RESTARTS

TRITON_DEFAULT_GRACE_S = 5.0  # Triton's --exit-timeout-secs: a stop takes at most this + 2 s


def triton_repository(model, repo_dir, name=None, backend: str = "ort-cpu", *,
                      max_batch_size: int = DEFAULTS["max_batch_size"],
                      max_queue_delay_ms: float = DEFAULTS["max_queue_delay_ms"],
                      max_queue_size: int = DEFAULTS["max_queue_size"], kit_kernels: bool = True):
    """Writes the Python-backend repository that ``--engine triton`` serves; returns the model directory.

    As with the light server, a model is batched only when its inputs and outputs share a first symbolic dim and
    ``max_batch_size`` > 1 (then Triton refuses requests of more rows than that); otherwise each request runs alone.
    """
    from dcnkit.runtime.base import load_model
    from dcnkit.runtime.triton import write_repository
    from dcnkit.runtime.triton_config import Signature
    from dcnkit.runtime.triton_python import RUNNER_BACKENDS

    if backend not in RUNNER_BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(RUNNER_BACKENDS)} with --engine triton, got {backend!r}")
    m = load_model(model)
    batch_dim, _ = Signature.of(m).batch_dim()
    batched = batch_dim is not None and max_batch_size > 1
    if name is None:
        if not isinstance(model, (str, os.PathLike)):
            raise ValueError("name: expected a model name when the model is not a file path, got None")
        name = Path(os.fspath(model)).stem
    return write_repository(
        m, repo_dir, name, backend="python", max_batch_size=max_batch_size if batched else 0,
        max_queue_delay_us=int(round(max_queue_delay_ms * 1000)), max_queue_size=max_queue_size if batched else 0,
        instance_kind="KIND_CPU", runner_backend=backend, kit_kernels=kit_kernels,
    )


def serve_triton(model, host: str = "127.0.0.1", port: int = 8000, name: str | None = None,
                 backend: str = "ort-cpu", *, grpc_port: int = 8001, metrics_port: int = 8002,
                 graceful_timeout_s: float | None = None, ready_timeout_s: float = 300.0, log=print,
                 max_restarts: int = MAX_RESTARTS, policy=None, health_timeout_s: float | None = None,
                 **repository_options) -> int:
    """Serves ``model`` on tritonserver until SIGINT/SIGTERM; returns the exit code: 0, or
    :data:`~dcnkit.server.triton_supervisor.EXIT_MODEL_FAILED` when the model kept crashing and was given up on.

    The server is supervised (:mod:`dcnkit.server.triton_supervisor`): a backend stub or server that dies is
    restarted, ``max_restarts`` times in a row at most (``policy``, a ``RestartPolicy``, says more), and a stub that
    hangs (no answer to a health inference within ``health_timeout_s``, default 5 s; 0: not looked for) is killed
    and restarted too. Raises
    :class:`~dcnkit.runtime.base.BackendUnavailable` (one line) when the wheel is not installed or the backend stub
    cannot start here, RuntimeError when the server exits before the model is first ready.
    """
    from dcnkit.server.triton_supervisor import HEALTH_TIMEOUT_S, RestartPolicy, TritonSupervisor

    grace = TRITON_DEFAULT_GRACE_S if graceful_timeout_s is None else graceful_timeout_s
    policy = policy or RestartPolicy(max_restarts=max_restarts)
    stop = threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, frame: stop.set())
    try:
        with tempfile.TemporaryDirectory(prefix="dcnkit-triton-") as repo:
            model_dir = triton_repository(model, repo, name, backend, **repository_options)
            supervisor = TritonSupervisor(repo, model_dir.name, host=host, http_port=port, grpc_port=grpc_port,
                                          metrics_port=metrics_port, exit_timeout_s=max(0, int(round(grace))),
                                          policy=policy, ready_timeout_s=ready_timeout_s,
                                          health_timeout_s=HEALTH_TIMEOUT_S if health_timeout_s is None
                                          else health_timeout_s,
                                          log=lambda line: log(line, flush=True))
            try:
                if not supervisor.start(stop):
                    return 0
                server = supervisor.server
                log(f"dcnkit serve: {model_dir.name} on tritonserver: HTTP http://{server.http_url}, "
                    f"gRPC {server.grpc_url}, metrics http://{host}:{server.metrics_port}/metrics "
                    f"(Ctrl-C stops it)", flush=True)
                return supervisor.run(stop)
            finally:
                supervisor.stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


__all__ = ["serve_triton", "triton_repository"]
