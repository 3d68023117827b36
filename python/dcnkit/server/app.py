"""FastAPI application speaking the KServe v2 / Open Inference Protocol (REST) for one model.

Endpoints (what NVIDIA's ``tritonclient.http`` and KServe clients call):

=========================================================  ==================================================
``GET  /v2/health/live``, ``/v2/health/ready``             200 / 503 (ready turns 503 when shutting down)
``GET  /v2``                                               server metadata: name, version, extensions
``GET  /v2/models/{m}[/versions/{v}]``                     model metadata: inputs/outputs, datatype, shape (-1)
``GET  /v2/models/{m}[/versions/{v}]/ready``               200 / 503
``GET  /v2/models/{m}[/versions/{v}]/config``              the Triton model configuration (JSON)
``POST /v2/models/{m}[/versions/{v}]/infer``               inference, JSON and binary tensor data
``GET  /v2/models[/{m}[/versions/{v}]]/stats``             Triton statistics extension (batches, counts)
``POST /v2/repository/index``, ``.../models/{m}/load``     repository extension (one model, always loaded)
``GET  /metrics``                                          Prometheus metrics
=========================================================  ==================================================

Errors are ``{"error": "..."}`` with a 4xx status (400 bad request, 404 unknown model/version/route,
413 body too large, 415 unknown Content-Encoding), 503 when the queue is full or the server is stopping,
500 when the model itself fails.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
import zlib
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from dcnkit.runtime.triton_config import Signature, model_config, v2_datatype, v2_shape
from dcnkit.server.defaults import DEFAULTS
from dcnkit.server.batcher import Batcher
from dcnkit.server.protocol import HEADER_LENGTH, ProtocolError, build_infer_response, parse_infer_request

log = logging.getLogger("dcnkit.server")

SERVER_NAME = "dcnkit"
EXTENSIONS = ["binary_tensor_data", "model_configuration", "model_repository", "statistics"]
_OFFLOAD_BYTES = 1 << 20  # parse bodies larger than this in a worker thread, not on the event loop


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


class _Metrics:
    """Prometheus metrics in a registry of their own (several apps may live in one process)."""

    def __init__(self, model: str, depth_fn):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.requests = Counter("dcnkit_requests", "Inference requests by HTTP status",
                                ["model", "status"], registry=r)
        self.latency = Histogram("dcnkit_request_duration_seconds", "Inference request latency (server side)",
                                 ["model"], registry=r,
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.batch_requests = Histogram("dcnkit_batch_size", "Requests combined into one model run",
                                        ["model"], registry=r, buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128))
        self.batch_rows = Histogram("dcnkit_batch_rows", "Rows (dim 0) per model run", ["model"], registry=r,
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
        self.compute = Histogram("dcnkit_compute_duration_seconds", "Model run time per batch", ["model"],
                                 registry=r,
                                 buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5))
        self.queue_depth = Gauge("dcnkit_queue_depth", "Requests waiting in the batching queue", ["model"],
                                 registry=r)
        self.queue_depth.labels(model).set_function(depth_fn)
        self.inflight = Gauge("dcnkit_inflight_requests", "Inference requests being handled", ["model"],
                              registry=r)
        self.model = model

    def on_batch(self, n_requests: int, rows: int, seconds: float) -> None:
        self.batch_requests.labels(self.model).observe(n_requests)
        self.batch_rows.labels(self.model).observe(rows)
        self.compute.labels(self.model).observe(seconds)


def _is_runner(obj) -> bool:
    return callable(getattr(obj, "run", None)) and callable(getattr(obj, "inputs", None))


def create_app(
    model,
    name: str | None = None,
    backend: str = "ort-cpu",
    *,
    max_batch_size: int = DEFAULTS["max_batch_size"],
    max_queue_delay_ms: float = DEFAULTS["max_queue_delay_ms"],
    max_queue_size: int = DEFAULTS["max_queue_size"],
    max_request_bytes: int = DEFAULTS["max_request_bytes"],
    version: str = "1",
    runner_options: dict | None = None,
    close_runner: bool | None = None,
) -> FastAPI:
    """The v2-protocol app serving ``model`` (an ONNX path / ModelProto / bytes, or a ready runner object).

    ``name`` defaults to the model file's stem. Batching: requests are concatenated along dim 0 up to
    ``max_batch_size`` rows, waiting at most ``max_queue_delay_ms`` for company, when every input and output of
    the model shares its first symbolic dim (``max_batch_size=1`` disables it). ``max_queue_size`` waiting
    requests at most (503 beyond), bodies up to ``max_request_bytes`` (413 beyond).
    The model is loaded here; the batching thread starts here and stops (draining the queue) at app shutdown.
    """
    if _is_runner(model):
        runner = model
        if name is None:
            name = getattr(model, "model_name", None) or "model"
        close_runner = False if close_runner is None else close_runner
    else:
        from dcnkit.runtime.registry import make_runner

        if name is None:
            if isinstance(model, (str, os.PathLike)):
                name = Path(os.fspath(model)).stem
            else:
                raise ValueError("name: expected a model name when the model is not a file path, got None")
        runner = make_runner(model, backend, **(runner_options or {}))
        close_runner = True if close_runner is None else close_runner
    if not name or "/" in name:
        raise ValueError(f"name: expected a non-empty name without '/', got {name!r}")
    if not isinstance(max_request_bytes, int) or max_request_bytes < 1:
        raise ValueError(f"max_request_bytes: expected an integer >= 1, got {max_request_bytes!r}")

    sig = Signature.of(runner)
    batch_dim, why_not = sig.batch_dim()
    batching = batch_dim is not None and max_batch_size > 1
    if batch_dim is None and max_batch_size > 1:
        log.info("dcnkit serve: %s: no dynamic batching (%s); requests run one at a time", name, why_not)
    platform = "onnxruntime_onnx" if str(getattr(runner, "name", backend)).startswith("ort") else \
        str(getattr(runner, "name", backend))

    metrics_holder: dict = {}
    batcher = Batcher(
        runner, batching=batching, max_batch_size=max(1, max_batch_size),
        max_queue_delay_ms=max_queue_delay_ms, max_queue_size=max_queue_size,
        on_batch=lambda *a: metrics_holder["m"].on_batch(*a),
    )
    metrics = _Metrics(name, lambda: batcher.depth)
    metrics_holder["m"] = metrics

    def shutdown() -> None:
        if not batcher.accepting and not batcher._thread.is_alive():
            return
        log.info("dcnkit serve: draining %d queued request(s)", batcher.depth)
        batcher.close(drain=True)
        if close_runner and hasattr(runner, "close"):
            runner.close()
        log.info("dcnkit serve: stopped")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await run_in_threadpool(shutdown)

    app = FastAPI(title=f"dcnkit serve: {name}", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.model_name = name
    app.state.runner = runner
    app.state.batcher = batcher
    app.state.metrics = metrics
    app.state.signature = sig
    app.state.batching = batching
    app.state.shutdown = shutdown

    config = model_config(sig, name, max_batch_size=batcher.max_batch_size if batching else 0,
                          max_queue_delay_us=int(max_queue_delay_ms * 1000))
    config["platform"] = platform
    if batching:
        config["dynamic_batching"]["default_queue_policy"] = {"max_queue_size": max_queue_size}

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc):
        return _error(f"{request.method} {request.url.path}: {exc.detail}", exc.status_code)

    def check_model(model_name: str, model_version: str | None = None) -> None:
        if model_name != name:
            raise ProtocolError(f"model: unknown model '{model_name}'; this server has '{name}'", 404)
        if model_version not in (None, "", version):
            raise ProtocolError(f"model '{name}': unknown version '{model_version}'; available: ['{version}']",
                                404)

    # -- health and metadata --------------------------------------------------------------------
    @app.get("/v2/health/live")
    async def live():
        return Response(status_code=200)

    @app.get("/v2/health/ready")
    async def ready():
        if batcher.accepting:
            return Response(status_code=200)
        return _error("server: shutting down", 503)

    @app.get("/v2")
    async def server_metadata():
        import dcnkit

        return {"name": SERVER_NAME, "version": dcnkit.__version__, "extensions": EXTENSIONS}

    def metadata():
        def tensors(infos):
            return [{"name": t.name, "datatype": v2_datatype(t.dtype), "shape": v2_shape(t.shape)} for t in infos]

        return {"name": name, "versions": [version], "platform": platform,
                "inputs": tensors(sig.inputs), "outputs": tensors(sig.outputs)}

    def guarded(fn):
        @functools.wraps(fn)
        async def wrapper(**kw):
            try:
                return await fn(**kw)
            except ProtocolError as e:
                return _error(e.message, e.status)

        return wrapper

    async def model_metadata(model_name: str, model_version: str | None = None):
        check_model(model_name, model_version)
        return metadata()

    async def model_ready(model_name: str, model_version: str | None = None):
        check_model(model_name, model_version)
        if batcher.accepting:
            return Response(status_code=200)
        return _error(f"model '{name}': not ready (server shutting down)", 503)

    async def model_config_ep(model_name: str, model_version: str | None = None):
        check_model(model_name, model_version)
        return config

    def stats_of():
        st = batcher.stats
        return {
            "name": name,
            "version": version,
            "last_inference": st.last_inference_ms,
            "inference_count": st.inference_count,
            "execution_count": st.execution_count,
            "inference_stats": {
                "success": {"count": st.inference_count, "ns": 0},
                "fail": {"count": st.fail_count, "ns": 0},
                "queue": {"count": st.inference_count + st.fail_count, "ns": st.queue_ns},
                "compute_infer": {"count": st.execution_count, "ns": st.compute_ns},
            },
            "batch_stats": [
                {"batch_size": bs, "compute_infer": {"count": c, "ns": ns}}
                for bs, (c, ns) in sorted(st.batch_sizes.items())
            ],
        }

    async def model_stats(model_name: str | None = None, model_version: str | None = None):
        if model_name is not None:
            check_model(model_name, model_version)
        return {"model_stats": [stats_of()]}

    for path, fn in (
        ("/v2/models/stats", model_stats),  # before "/v2/models/{model_name}", which would match it
        ("/v2/models/{model_name}", model_metadata),
        ("/v2/models/{model_name}/versions/{model_version}", model_metadata),
        ("/v2/models/{model_name}/ready", model_ready),
        ("/v2/models/{model_name}/versions/{model_version}/ready", model_ready),
        ("/v2/models/{model_name}/config", model_config_ep),
        ("/v2/models/{model_name}/versions/{model_version}/config", model_config_ep),
        ("/v2/models/{model_name}/stats", model_stats),
        ("/v2/models/{model_name}/versions/{model_version}/stats", model_stats),
    ):
        app.add_api_route(path, guarded(fn), methods=["GET"])

    # -- repository extension (one model, loaded for the server's lifetime) ----------------------
    @app.post("/v2/repository/index")
    async def repository_index():
        return [{"name": name, "version": version, "state": "READY" if batcher.accepting else "UNAVAILABLE"}]

    @app.post("/v2/repository/models/{model_name}/load")
    async def repository_load(model_name: str):
        if model_name != name:
            return _error(f"model: unknown model '{model_name}'; this server serves only '{name}'", 404)
        return Response(status_code=200)

    @app.post("/v2/repository/models/{model_name}/unload")
    async def repository_unload(model_name: str):
        if model_name != name:
            return _error(f"model: unknown model '{model_name}'; this server serves only '{name}'", 404)
        return _error(f"model '{name}': unloading is not supported (one model per dcnkit serve process)", 400)

    # -- inference ----------------------------------------------------------------------------------
    async def read_body(request: Request) -> bytes:
        cl = request.headers.get("content-length")
        if cl is not None:
            try:
                n = int(cl)
            except ValueError:
                raise ProtocolError(f"Content-Length: expected an integer, got {cl!r}") from None
            if n > max_request_bytes:
                raise ProtocolError(f"request body: expected at most {max_request_bytes} bytes "
                                    f"(--max-request-bytes), got {n}", 413)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_request_bytes:
                raise ProtocolError(f"request body: expected at most {max_request_bytes} bytes "
                                    f"(--max-request-bytes), got more", 413)
            chunks.append(chunk)
        body = b"".join(chunks)
        enc = request.headers.get("content-encoding", "").strip().lower()
        if enc in ("", "identity"):
            return body
        if enc not in ("gzip", "deflate"):
            raise ProtocolError(f"Content-Encoding: expected gzip, deflate or identity, got {enc!r}", 415)
        d = zlib.decompressobj(wbits=31 if enc == "gzip" else 15)
        try:
            out = d.decompress(body, max_request_bytes + 1)
        except zlib.error as e:
            raise ProtocolError(f"request body: invalid {enc} data ({e})") from None
        if len(out) > max_request_bytes or d.unconsumed_tail:
            raise ProtocolError(f"request body: expected at most {max_request_bytes} bytes once decompressed "
                                "(--max-request-bytes), got more", 413)
        return out

    async def infer(request: Request, model_name: str, model_version: str | None = None):
        t0 = time.perf_counter()
        status = 200
        metrics.inflight.labels(name).inc()
        try:
            check_model(model_name, model_version)
            if not batcher.accepting:
                raise ProtocolError("server: shutting down, not accepting new requests", 503)
            body = await read_body(request)
            header_len = request.headers.get(HEADER_LENGTH)
            if len(body) > _OFFLOAD_BYTES:
                req = await run_in_threadpool(parse_infer_request, body, header_len, sig.inputs, sig.outputs)
            else:
                req = parse_infer_request(body, header_len, sig.inputs, sig.outputs)
            fut = batcher.submit(req.feeds)
            results = await asyncio.wrap_future(fut)
            payload, json_len = build_infer_response(name, version, req, results)
            if json_len is None:
                return Response(payload, media_type="application/json")
            return Response(payload, media_type="application/octet-stream",
                            headers={HEADER_LENGTH: str(json_len)})
        except ProtocolError as e:
            status = e.status
            return _error(e.message, e.status)
        except asyncio.CancelledError:
            status = 499  # client went away
            raise
        except Exception as e:  # noqa: BLE001 - answered, logged
            log.exception("dcnkit serve: internal error")
            status = 500
            return _error(f"internal error: {type(e).__name__}: {e}", 500)
        finally:
            metrics.inflight.labels(name).dec()
            metrics.requests.labels(name, str(status)).inc()
            metrics.latency.labels(name).observe(time.perf_counter() - t0)

    app.add_api_route("/v2/models/{model_name}/infer", infer, methods=["POST"])
    app.add_api_route("/v2/models/{model_name}/versions/{model_version}/infer", infer, methods=["POST"])

    @app.get("/metrics")
    async def prometheus_metrics():
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def configure_logging(log_level: str) -> None:
    """Gives the ``dcnkit.server`` logger a handler (uvicorn configures only its own loggers)."""
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        log.addHandler(handler)
        log.setLevel(log_level.upper())


def serve(
    model,
    host: str = "127.0.0.1",
    port: int = 8000,
    name: str | None = None,
    backend: str = "ort-cpu",
    *,
    log_level: str = "info",
    graceful_timeout_s: float | None = 30.0,
    **options,
) -> None:
    """Runs the server until SIGINT/SIGTERM; then stops accepting, finishes in-flight and queued requests."""
    import uvicorn

    configure_logging(log_level)
    app = create_app(model, name=name, backend=backend, **options)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=graceful_timeout_s)
    server = uvicorn.Server(config)
    # uvicorn drains, then re-raises the signal it caught with the handler that was there before it. Make that
    # handler for SIGTERM a no-op: a drained, orderly stop exits with status 0 (what orchestrators expect).
    import signal
    import threading

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        app.state.shutdown()  # no-op when the lifespan already drained


__all__ = ["create_app", "serve", "DEFAULTS"]
