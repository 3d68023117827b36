"""``dcnkit serve MODEL --workers N``: N processes of the light server on one port, under uvicorn's process manager.

A model run that crashes the process (a segmentation fault in native code, an out-of-memory kill) cannot be caught
inside it. With ``--workers N`` the parent process holds the listening socket and N workers, each with its own copy
of the model and its own batching queue, accept from it; uvicorn's manager checks on them twice a second and starts a
new worker in place of one that died (one log line, ``Child process [pid] died``), while the others go on serving.
The requests the dead worker held fail (the connection drops); later ones are answered by the others. SIGTERM or
SIGINT to the parent stops the workers as one server stops (each finishes what it holds) and exits 0.

The model and options reach the workers (spawned: fresh interpreters) through one environment variable; the model is
loaded once in the parent first, so that a model or backend that cannot load fails there, with the single server's
exit code, instead of making workers that die at birth.
"""
from __future__ import annotations

import json
import os

WORKER_ENV = "DCNKIT_SERVE_WORKER"


def app_from_environment():
    """The app of one worker (uvicorn's factory), from :data:`WORKER_ENV`."""
    from dcnkit.server.app import configure_logging, create_app

    options = json.loads(os.environ[WORKER_ENV])
    configure_logging(options.pop("log_level"))
    return create_app(options.pop("model"), **options)


def serve_workers(model, host: str, port: int, workers: int, *, name: str | None = None, backend: str = "ort-cpu",
                  log_level: str = "info", graceful_timeout_s: float | None = 30.0, **options) -> None:
    """Runs ``workers`` server processes on ``host:port`` until SIGINT/SIGTERM (the module docstring)."""
    import uvicorn

    from dcnkit.runtime.registry import make_runner

    if not isinstance(workers, int) or workers < 2:
        raise ValueError(f"workers: expected an integer >= 2 (1 is the single-process server), got {workers!r}")
    if not isinstance(model, (str, os.PathLike)):
        raise ValueError(f"model: expected a model file path with several workers, got {type(model).__name__}")
    path = os.path.abspath(os.fspath(model))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"model: no such file {path}")
    make_runner(path, backend, **(options.get("runner_options") or {})).close()  # fails here, not in every worker
    os.environ[WORKER_ENV] = json.dumps({"model": path, "name": name, "backend": backend, "log_level": log_level,
                                         **options})
    try:
        uvicorn.run("dcnkit.server.workers:app_from_environment", factory=True, host=host, port=port,
                    workers=workers, log_level=log_level, timeout_graceful_shutdown=graceful_timeout_s)
    finally:
        os.environ.pop(WORKER_ENV, None)


__all__ = ["WORKER_ENV", "app_from_environment", "serve_workers"]
