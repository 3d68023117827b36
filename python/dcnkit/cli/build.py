"""``dcnkit build``: an ONNX model -> a serialized TensorRT engine, with the kit's plugin library loaded.

    dcnkit build m.onnx -o m.engine [--fp16 | --bf16 | --int8] [--shapes NAME:MIN:OPT:MAX ...] [--workspace MIB]
                 [--timing-cache FILE] [--plugins LIB ...]

Arguments are checked against the model before TensorRT is needed (bad ones: one line, exit 2); without
TensorRT the command prints one line naming what is missing and how to install it, and exits 1.
See docs/tensorrt.md.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from dcnkit.cli.shared import CliError, cli_error_from, progress


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {v}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="ONNX file")
    p.add_argument("-o", "--output", required=True, help="the engine file to write (e.g. m.engine or model.plan)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--fp16", dest="precision", action="store_const", const="fp16",
                   help="float16: TensorRT 11 converts the ONNX's float tensors first (strongly typed networks; "
                        "the RoIs of RoI operators stay float32), TensorRT 10 sets the FP16 builder flag")
    g.add_argument("--bf16", dest="precision", action="store_const", const="bf16", help="bfloat16, likewise")
    g.add_argument("--int8", dest="precision", action="store_const", const="int8",
                   help="int8 from a QDQ model (`dcnkit quantize`): its Q/DQ nodes made symmetric int8 as TensorRT "
                        "takes them; TensorRT 11 needs no flag (strongly typed), TensorRT 10 sets BuilderFlag.INT8")
    p.add_argument("--shapes", action="append", default=[], metavar="NAME:MIN:OPT:MAX",
                   help="optimization profile of an input, shapes like 1x3x64x64 (repeat per input; required for "
                        "every input with dynamic dims)")
    p.add_argument("--workspace", type=_positive_int, metavar="MIB",
                   help="builder workspace limit in MiB (default: TensorRT's)")
    p.add_argument("--timing-cache", metavar="FILE", help="tactic timing cache: read if it exists, updated after")
    p.add_argument("--plugins", action="append", default=[], metavar="LIB",
                   help="another plugin library to load (repeatable); the kit's libdcnkit_trt.so is always loaded")
    p.add_argument("-v", "--verbose", action="store_true", help="show Polygraphy's and TensorRT's log")


def _check_int8_model(model: Path) -> None:
    """--int8 needs a QDQ model that TensorRT's Q/DQ rules can take: checked (and converted once, to find out)
    before TensorRT is needed."""
    import onnx

    from dcnkit.runtime.tensorrt_int8 import tensorrt_qdq

    try:
        tensorrt_qdq(onnx.load(str(model)), name=repr(str(model)))
    except ValueError as e:
        raise CliError("--int8", str(e).split(": ", 1)[1]) from None


def run_build(args) -> int:
    from dcnkit.runtime import tensorrt as dk_trt

    model = Path(args.model)
    if not model.is_file():
        raise CliError("model", f"expected an existing ONNX file, got {args.model!r}")
    if dk_trt.is_engine_file(model):
        raise CliError("model", f"expected an ONNX file, got the engine {args.model!r}")
    out = Path(args.output)
    if out.is_dir():
        raise CliError("--output", f"expected a file path, got the directory {args.output!r}")
    for lib in args.plugins:
        if not Path(lib).is_file():
            raise CliError("--plugins", f"expected an existing plugin library, got {lib!r}")
    try:
        shapes = dk_trt.check_shapes(model, dk_trt.parse_shapes(args.shapes))
    except dk_trt.ShapeSpecError as e:
        raise cli_error_from(e) from None
    if args.precision == "int8":
        _check_int8_model(model)
    dk_trt.require_tensorrt()  # BackendUnavailable: one line, exit 1

    from polygraphy.logger import G_LOGGER

    steps = progress(total=2, desc="build", unit="step")
    lines = []

    def log(msg):
        lines.append(msg)
        print(msg, flush=True)

    G_LOGGER.module_severity = G_LOGGER.VERBOSE if args.verbose else G_LOGGER.WARNING
    t0 = time.perf_counter()
    data = dk_trt.build_engine_bytes(
        str(model), precision=args.precision, shapes=shapes or None, workspace_mib=args.workspace,
        timing_cache=args.timing_cache, plugins=args.plugins, log=log, progress=True,
    )
    if hasattr(steps, "update"):
        steps.update(1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    if hasattr(steps, "update"):
        steps.update(1)
        steps.close()
    print(f"wrote {out} ({len(data) / 2**20:.1f} MiB) in {time.perf_counter() - t0:.1f} s")
    print(f"run it: dcnkit run {out} --backend tensorrt  |  trtexec --loadEngine={out} "
          f"--dynamicPlugins=$(python -c 'import dcnkit; print(dcnkit.tensorrt_library())')")
    return 0


def register(subparsers) -> None:
    """Adds ``build`` to the main CLI's subparsers."""
    p = subparsers.add_parser(
        "build", help="build a TensorRT engine from an ONNX model (the kit's plugins loaded)",
        description="Build and serialize a TensorRT engine from an ONNX model with Polygraphy's TensorRT loaders; "
                    "the kit's plugin library (libdcnkit_trt.so) is always loaded. See docs/tensorrt.md.",
    )
    add_arguments(p)
    p.set_defaults(func=run_build)

