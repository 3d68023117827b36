"""``dcnkit serve`` and ``dcnkit triton-repo`` (registered into the main CLI by ``register_commands``)."""
from __future__ import annotations

import argparse
import functools
import sys

from dcnkit.server.defaults import DEFAULTS, MAX_RESTARTS


def _bounded(convert, low: float, what: str):
    """An argparse type: `convert(text)` that must be >= low."""

    def parse(text: str):
        try:
            v = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} >= {low:g}, got {text!r}") from None
        if not v >= low:
            raise argparse.ArgumentTypeError(f"expected {what} >= {low:g}, got {v}")
        return v

    return parse


_positive_int = _bounded(int, 1, "an integer")
_nonneg_int = _bounded(int, 0, "an integer")
_nonneg_float = _bounded(float, 0, "a number")


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    from dcnkit.runtime.registry import BACKENDS

    p.add_argument("model", help="ONNX model file (or, with --backend tensorrt, a serialized engine .engine/.plan)")
    p.add_argument("--engine", default="light", choices=("light", "triton"),
                   help="light: the kit's own server (FastAPI, default); triton: NVIDIA's tritonserver from the "
                        "nvidia-pytriton wheel, with Triton's dynamic batching, HTTP, gRPC and metrics ports")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    p.add_argument("--grpc-port", type=int, default=8001, help="--engine triton: gRPC port (default 8001)")
    p.add_argument("--metrics-port", type=int, default=8002,
                   help="--engine triton: Prometheus metrics port (default 8002; the light server has /metrics)")
    p.add_argument("--name", default=None, help="model name in the URLs (default: the file's stem)")
    p.add_argument("--backend", default="ort-cpu", choices=BACKENDS, help="runner backend (default ort-cpu)")
    p.add_argument("--max-batch-size", type=_positive_int, default=DEFAULTS["max_batch_size"],
                   help="rows per model run when batching requests along dim 0; 1 disables batching "
                        "(default %(default)s). Only models whose inputs and outputs share their first "
                        "symbolic dim are batched")
    p.add_argument("--max-queue-delay-ms", type=_nonneg_float, default=DEFAULTS["max_queue_delay_ms"],
                   help="how long the oldest request may wait for others to batch with (default %(default)s)")
    p.add_argument("--max-queue-size", type=_positive_int, default=DEFAULTS["max_queue_size"],
                   help="requests waiting at most; more get HTTP 503 (default %(default)s)")
    p.add_argument("--max-request-bytes", type=_positive_int, default=DEFAULTS["max_request_bytes"],
                   help="light: largest request body; larger get HTTP 413 (default %(default)s; Triton has its "
                        "own limits)")
    p.add_argument("--graceful-timeout", type=_nonneg_float, default=None,
                   help="seconds to finish in-flight requests on SIGTERM/SIGINT (default 30; --engine triton: 5)")
    p.add_argument("--workers", type=_positive_int, default=1,
                   help="light: server processes on the port, each with its own copy of the model and queue; one "
                        "that dies (a crash in a model run, an out-of-memory kill) is replaced while the others "
                        "serve (default %(default)s: one process, whose exit code tells a supervisor how it ended)")
    p.add_argument("--max-restarts", type=_nonneg_int, default=MAX_RESTARTS,
                   help="--engine triton: restarts in a row of a backend stub or server that died before the model is "
                        "reported failed and the command exits 3 (default %(default)s; the count starts again after "
                        "60 s of service)")
    p.add_argument("--health-timeout", type=_nonneg_float, default=None,
                   help="--engine triton: seconds a health inference may take before the backend stub is taken for "
                        "hung, killed and recovered; sent only when no inference completed for twice as long "
                        "(default 5; 0 turns it off)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.add_argument("--no-kit-kernels", dest="kit_kernels", action="store_false",
                   help="ort-*: run standard DeformConv nodes on ONNX Runtime's built-in kernel (default: on the "
                        "kit's DeformConv2d kernel, an in-memory rewrite; the file is not changed)")
    p.add_argument("--device", default=None,
                   help="openvino: the OpenVINO device (default CPU; others are passed to OpenVINO untested)")


def add_triton_repo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="ONNX model file")
    p.add_argument("-o", "--output", required=True, help="model repository directory (created if missing)")
    p.add_argument("--name", default=None, help="model name (default: the file's stem)")
    p.add_argument("--max-batch-size", type=_nonneg_int, default=None,
                   help="Triton max_batch_size; default 8 when inputs and outputs share a batch dim, else 0")
    p.add_argument("--backend", default="onnxruntime", choices=("onnxruntime", "tensorrt", "python"),
                   help="Triton backend: onnxruntime (model.onnx + libdcnkit_ort.so), tensorrt (model.plan + "
                        "libdcnkit_trt.so with libdcnkit_trt_autoreg.so, loaded with tritonserver "
                        "--backend-config=tensorrt,plugins=.../libdcnkit_trt_autoreg.so) or python (model.py "
                        "running the kit's ONNX Runtime runner: the one the nvidia-pytriton wheel's tritonserver "
                        "loads; needs dcnkit in the server's Python)")
    p.add_argument("--runner", default="ort-cpu", choices=("ort-cpu", "ort-cuda"),
                   help="python: the kit's runner in model.py (default ort-cpu)")
    p.add_argument("--no-kit-kernels", dest="kit_kernels", action="store_false",
                   help="python: run standard DeformConv nodes on ONNX Runtime's built-in kernel")
    p.add_argument("--engine", metavar="FILE",
                   help="tensorrt: a serialized engine to copy as 1/model.plan (not validated); without it the "
                        "engine is built here (needs TensorRT)")
    p.add_argument("--shapes", action="append", default=[], metavar="NAME:MIN:OPT:MAX",
                   help="tensorrt: optimization profile for the engine built here (as in dcnkit build; default: "
                        "the batch dim from 1 to --max-batch-size)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--fp16", dest="precision", action="store_const", const="fp16",
                   help="tensorrt: build the engine in float16 (as dcnkit build --fp16)")
    g.add_argument("--bf16", dest="precision", action="store_const", const="bf16",
                   help="tensorrt: build the engine in bfloat16")
    p.add_argument("--max-queue-delay-us", type=_nonneg_int, default=1000,
                   help="dynamic_batching max_queue_delay_microseconds (default %(default)s)")
    p.add_argument("--preferred-batch-size", type=_positive_int, action="append", default=[],
                   help="dynamic_batching preferred_batch_size (repeatable)")
    p.add_argument("--max-queue-size", type=_nonneg_int, default=0,
                   help="dynamic_batching default_queue_policy max_queue_size (0: unbounded)")
    p.add_argument("--instance-kind", choices=("KIND_GPU", "KIND_CPU", "KIND_AUTO"), default=None,
                   help="instance_group kind (default: left to Triton)")
    p.add_argument("--instance-count", type=_positive_int, default=1, help="instances per device")
    p.add_argument("--container-repository", default="/models",
                   help="where the repository is mounted inside the Triton container (default /models); "
                        "the library is referenced as <this>/<name>/libdcnkit_ort.so")
    p.add_argument("--library-path", default=None,
                   help="reference this op library path verbatim instead of copying the kit's library")
    p.add_argument("--overwrite", action="store_true", help="replace an existing <output>/<name>")
    p.add_argument("--no-load-check", dest="load_check", action="store_false",
                   help="python: do not load the written model in tritonserver here (default: loaded, then stopped, "
                        "where the nvidia-pytriton wheel can run)")


def run_serve(args) -> int:
    from dcnkit.runtime.base import BackendUnavailable
    from dcnkit.server.app import serve

    for flag, port in (("--port", args.port), ("--grpc-port", args.grpc_port), ("--metrics-port", args.metrics_port)):
        if not 0 <= port <= 65535:
            print(f"dcnkit serve: {flag}: expected 0..65535, got {port}", file=sys.stderr)
            return 2
    if args.engine == "triton":
        return _run_serve_triton(args)
    for flag, given in (("--max-restarts", args.max_restarts != MAX_RESTARTS),
                        ("--health-timeout", args.health_timeout is not None)):
        if given:
            print(f"dcnkit serve: {flag}: expected only with --engine triton (the light server's process is "
                  "restarted by its supervisor, or --workers), got --engine light", file=sys.stderr)
            return 2
    try:
        if args.workers > 1:  # several processes under uvicorn's manager, or this one
            from dcnkit.server.workers import serve_workers

            serve = functools.partial(serve_workers, workers=args.workers)
        serve(
            args.model, host=args.host, port=args.port, name=args.name, backend=args.backend,
            log_level=args.log_level,
            graceful_timeout_s=30.0 if args.graceful_timeout is None else args.graceful_timeout,
            max_batch_size=args.max_batch_size, max_queue_delay_ms=args.max_queue_delay_ms,
            max_queue_size=args.max_queue_size, max_request_bytes=args.max_request_bytes,
            runner_options={"kit_kernels": args.kit_kernels,
                            **({"device": args.device} if args.device and args.backend == "openvino" else {})},
        )
    except BackendUnavailable as e:  # the backend cannot run on this machine: what is missing, one line
        print(f"dcnkit serve: {e}", file=sys.stderr)
        return 1
    except (FileNotFoundError, ValueError, RuntimeError) as e:  # bad model path, unknown backend, model errors
        print(f"dcnkit serve: {e}", file=sys.stderr)
        return 2
    return 0


def _run_serve_triton(args) -> int:
    from dcnkit.server.triton_engine import serve_triton

    if args.max_request_bytes != DEFAULTS["max_request_bytes"] or args.workers != 1:
        flag = "--workers" if args.workers != 1 else "--max-request-bytes"
        print(f"dcnkit serve: {flag}: expected only with --engine light (tritonserver has its own "
              "limits and instances), got --engine triton", file=sys.stderr)
        return 2
    try:
        return serve_triton(
            args.model, host=args.host, port=args.port, name=args.name, backend=args.backend,
            grpc_port=args.grpc_port, metrics_port=args.metrics_port, graceful_timeout_s=args.graceful_timeout,
            max_batch_size=args.max_batch_size, max_queue_delay_ms=args.max_queue_delay_ms,
            max_queue_size=args.max_queue_size, kit_kernels=args.kit_kernels, max_restarts=args.max_restarts,
            **({} if args.health_timeout is None else {"health_timeout_s": args.health_timeout}),
        )
    except (FileNotFoundError, ValueError) as e:
        print(f"dcnkit serve: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # BackendUnavailable (no wheel, no stub, no libpython), or no ready model: one line
        print(f"dcnkit serve: {e}", file=sys.stderr)
        return 1


def run_triton_repo(args) -> int:
    from dcnkit.runtime.base import BackendUnavailable
    from dcnkit.runtime.triton import check_repository, write_repository

    trt_only = [f for f, v in (("--engine", args.engine), ("--shapes", args.shapes), ("--fp16/--bf16", args.precision))
                if v]
    if trt_only and args.backend != "tensorrt":
        print(f"dcnkit triton-repo: {trt_only[0]}: expected only with --backend tensorrt, got --backend {args.backend}",
              file=sys.stderr)
        return 2
    python_only = [f for f, v in (("--runner", args.runner != "ort-cpu"), ("--no-kit-kernels", not args.kit_kernels))
                   if v]
    if python_only and args.backend != "python":
        print(f"dcnkit triton-repo: {python_only[0]}: expected only with --backend python, got --backend "
              f"{args.backend}", file=sys.stderr)
        return 2
    shapes = None
    if args.shapes:
        from dcnkit.runtime.tensorrt import ShapeSpecError, parse_shapes

        try:
            shapes = parse_shapes(args.shapes)
        except ShapeSpecError as e:
            print(f"dcnkit triton-repo: {e}", file=sys.stderr)
            return 2
    try:
        model_dir = write_repository(
            args.model, args.output, args.name, max_batch_size=args.max_batch_size, backend=args.backend,
            max_queue_delay_us=args.max_queue_delay_us, preferred_batch_sizes=args.preferred_batch_size,
            max_queue_size=args.max_queue_size, instance_kind=args.instance_kind,
            instance_count=args.instance_count, container_repository=args.container_repository,
            library_path=args.library_path, overwrite=args.overwrite,
            engine=args.engine, shapes=shapes, precision=args.precision, runner_backend=args.runner,
            kit_kernels=args.kit_kernels,
        )
    except BackendUnavailable as e:  # no TensorRT here to build the engine: what is missing, one line
        print(f"dcnkit triton-repo: {e} (or pass an engine built elsewhere with --engine)", file=sys.stderr)
        return 1
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"dcnkit triton-repo: {e}", file=sys.stderr)
        return 2
    problems = check_repository(model_dir)
    if problems:  # pragma: no cover - the writer and the checker agree unless one is broken
        print("dcnkit triton-repo: the written repository has problems:\n  " + "\n  ".join(problems),
              file=sys.stderr)
        return 1
    if args.backend == "python":
        print(f"wrote {model_dir} (config.pbtxt, 1/model.py, 1/model.onnx)")
        from dcnkit.runtime.triton_server import check_loads, unavailable_reason

        if args.load_check and unavailable_reason() is None:
            failed = check_loads(model_dir.parent, [model_dir.name])
            if failed:
                print("dcnkit triton-repo: tritonserver could not load the written model:\n  " + "\n  ".join(failed),
                      file=sys.stderr)
                return 1
            print(f"loaded by tritonserver here: {model_dir.name} READY")
        print(f"run here: {_python_backend_hint(model_dir.parent)}")
        return 0
    if args.backend == "tensorrt":
        from dcnkit.runtime.triton_tensorrt import LIBRARY_FILENAME, PLUGIN_FILENAME

        lib = model_dir / PLUGIN_FILENAME
        plugin = args.library_path or (f"{args.container_repository.rstrip('/')}/{model_dir.name}/{PLUGIN_FILENAME}"
                                       if lib.exists() else None)
        print(f"wrote {model_dir} (config.pbtxt, 1/model.plan"
              + (f", {LIBRARY_FILENAME}, {PLUGIN_FILENAME}" if lib.exists() else "") + ")")
        extra = f" --backend-config=tensorrt,plugins={plugin}" if plugin else ""
        print(f"run: docker run --rm --gpus=all -p8000:8000 -v {model_dir.parent.resolve()}:{args.container_repository} "
              f"nvcr.io/nvidia/tritonserver:<yy.mm>-py3 tritonserver --model-repository={args.container_repository}"
              f"{extra}")
        return 0
    print(f"wrote {model_dir} (config.pbtxt, 1/model.onnx"
          + (", libdcnkit_ort.so" if (model_dir / "libdcnkit_ort.so").exists() else "") + ")")
    print(f"run: docker run --rm -p8000:8000 -v {model_dir.parent.resolve()}:{args.container_repository} "
          f"nvcr.io/nvidia/tritonserver:<yy.mm>-py3 tritonserver --model-repository={args.container_repository}")
    return 0


def _python_backend_hint(repository) -> str:
    """The command that serves a Python-backend repository here (or why it cannot)."""
    from dcnkit.runtime.base import BackendUnavailable
    from dcnkit.runtime.triton_server import server_command_line

    try:
        return server_command_line(repository)
    except BackendUnavailable as e:
        return f"(not here: {e})"


def register_commands(subparsers) -> None:
    """Adds ``serve`` and ``triton-repo`` to the main CLI's subparsers."""
    p = subparsers.add_parser(
        "serve", help="serve a model over the KServe v2 / Open Inference Protocol (REST, tritonclient-compatible)",
        description="Serve an ONNX model over HTTP with the KServe v2 / Open Inference Protocol "
                    "(tritonclient.http works unchanged), with dynamic batching and Prometheus metrics at /metrics; "
                    "--engine triton serves it on NVIDIA's tritonserver (HTTP, gRPC, metrics).",
    )
    add_serve_arguments(p)
    p.set_defaults(func=run_serve)
    p = subparsers.add_parser(
        "triton-repo", help="write an NVIDIA Triton model repository for a model",
        description="Write <output>/<name>/{config.pbtxt,1/model.onnx} for Triton's onnxruntime backend, with the "
                    "kit's custom-op library referenced through model_operations (or the tensorrt / python backend "
                    "variants).",
    )
    add_triton_repo_arguments(p)
    p.set_defaults(func=run_triton_repo)


def main(argv=None) -> int:
    """Stand-alone entry point: ``python -m dcnkit.server serve|triton-repo ...``."""
    parser = argparse.ArgumentParser(prog="python -m dcnkit.server")
    sub = parser.add_subparsers(dest="command", required=True)
    register_commands(sub)
    args = parser.parse_args(argv)
    return args.func(args)
