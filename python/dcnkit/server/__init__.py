"""``dcnkit serve``: a KServe v2 / Open Inference Protocol (REST) server for one model, with dynamic batching.

NVIDIA's ``tritonclient.http`` and KServe clients talk to it unchanged. For scaling out, write a Triton
model repository instead (``dcnkit triton-repo``, :mod:`dcnkit.runtime.triton`) and run NVIDIA Triton.

>>> from dcnkit.server import create_app, serve
>>> app = create_app("model.onnx", max_batch_size=8, max_queue_delay_ms=2)   # ASGI app (tests: TestClient)
>>> serve("model.onnx", host="127.0.0.1", port=8000)                          # blocks until SIGINT/SIGTERM

FastAPI, uvicorn and prometheus_client are imported only when these are used.
"""
from __future__ import annotations

from dcnkit.server.defaults import DEFAULTS  # noqa: F401

__all__ = ["create_app", "serve", "DEFAULTS"]


def __getattr__(name):
    if name in ("create_app", "serve"):
        from dcnkit.server import app

        return getattr(app, name)
    raise AttributeError(f"module 'dcnkit.server' has no attribute {name!r}")
