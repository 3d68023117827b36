"""``dcnkit serve`` and ``dcnkit triton-repo`` (registered into the main CLI by ``register_commands``)."""
from __future__ import annotations

import argparse
import sys


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
    from dcnkit.server.defaults import DEFAULTS

    p.add_argument("model", help="ONNX model file (or, with --backend tensorrt, a serialized engine .engine/.plan)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
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
                   help="largest request body; larger get HTTP 413 (default %(default)s)")
    p.add_argument("--graceful-timeout", type=_nonneg_float, default=30.0,
                   help="seconds to finish in-flight requests on SIGTERM/SIGINT (default %(default)s)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.add_argument("--no-kit-kernels", dest="kit_kernels", action="store_false",
                   help="ort-*: run standard DeformConv nodes on ONNX Runtime's built-in kernel (default: on the "
                        "kit's DeformConv2d kernel, an in-memory rewrite; the file is not changed)")


def add_triton_repo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="ONNX model file")
    p.add_argument("-o", "--output", required=True, help="model repository directory (created if missing)")
    p.add_argument("--name", default=None, help="model name (default: the file's stem)")
    p.add_argument("--max-batch-size", type=_nonneg_int, default=None,
                   help="Triton max_batch_size; default 8 when inputs and outputs share a batch dim, else 0")
    p.add_argument("--backend", default="onnxruntime", choices=("onnxruntime", "tensorrt"),
                   help="Triton backend: onnxruntime (model.onnx + libdcnkit_ort.so) or tensorrt (model.plan + "
                        "libdcnkit_trt.so, loaded with tritonserver --backend-config=tensorrt,plugins=...)")
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


def run_serve(args) -> int:
    from dcnkit.runtime.base import BackendUnavailable
    from dcnkit.server.app import serve

    if not 0 <= args.port <= 65535:
        print(f"dcnkit serve: --port: expected 0..65535, got {args.port}", file=sys.stderr)
        return 2
    try:
        serve(
            args.model, host=args.host, port=args.port, name=args.name, backend=args.backend,
            log_level=args.log_level, graceful_timeout_s=args.graceful_timeout,
            max_batch_size=args.max_batch_size, max_queue_delay_ms=args.max_queue_delay_ms,
            max_queue_size=args.max_queue_size, max_request_bytes=args.max_request_bytes,
            runner_options={"kit_kernels": args.kit_kernels},
        )
    except BackendUnavailable as e:  # the backend cannot run on this machine: what is missing, one line
        print(f"dcnkit serve: {e}", file=sys.stderr)
        return 1
    except (FileNotFoundError, ValueError, RuntimeError) as e:  # bad model path, unknown backend, model errors
        print(f"dcnkit serve: {e}", file=sys.stderr)
        return 2
    return 0


def run_triton_repo(args) -> int:
    from dcnkit.runtime.base import BackendUnavailable
    from dcnkit.runtime.triton import check_repository, write_repository

    trt_only = [f for f, v in (("--engine", args.engine), ("--shapes", args.shapes), ("--fp16/--bf16", args.precision))
                if v]
    if trt_only and args.backend != "tensorrt":
        print(f"dcnkit triton-repo: {trt_only[0]}: expected only with --backend tensorrt, got --backend {args.backend}",
              file=sys.stderr)
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
            engine=args.engine, shapes=shapes, precision=args.precision,
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
    if args.backend == "tensorrt":
        lib = model_dir / "libdcnkit_trt.so"
        plugin = args.library_path or (f"{args.container_repository.rstrip('/')}/{model_dir.name}/libdcnkit_trt.so"
                                       if lib.exists() else None)
        print(f"wrote {model_dir} (config.pbtxt, 1/model.plan" + (", libdcnkit_trt.so" if lib.exists() else "") + ")")
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


def register_commands(subparsers) -> None:
    """Adds ``serve`` and ``triton-repo`` to the main CLI's subparsers."""
    p = subparsers.add_parser(
        "serve", help="serve a model over the KServe v2 / Open Inference Protocol (REST, tritonclient-compatible)",
        description="Serve an ONNX model over HTTP with the KServe v2 / Open Inference Protocol "
                    "(tritonclient.http works unchanged), with dynamic batching and Prometheus metrics at /metrics.",
    )
    add_serve_arguments(p)
    p.set_defaults(func=run_serve)
    p = subparsers.add_parser(
        "triton-repo", help="write an NVIDIA Triton model repository for a model",
        description="Write <output>/<name>/{config.pbtxt,1/model.onnx} for Triton's onnxruntime backend, with the "
                    "kit's custom-op library referenced through model_operations.",
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
