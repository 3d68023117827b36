"""``dcnkit run m.onnx --backend B``: run a model once on one backend (random inputs of the model's shapes unless
``--inputs``), print the inputs and outputs, optionally save them."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from dcnkit.cli.backend_args import add_device_arg, add_kit_kernels_arg, check_model_for, make_runner_cli
from dcnkit.cli.feeds import add_input_args, feeds_for
from dcnkit.cli.shared import CliError


def _describe(a: np.ndarray) -> str:
    if a.size and np.issubdtype(a.dtype, np.number):
        f = a.astype(np.float64)
        return f"{a.dtype} {tuple(a.shape)} min={f.min():.6g} max={f.max():.6g} mean={f.mean():.6g}"
    return f"{a.dtype} {tuple(a.shape)}"


def cmd_run(args) -> int:
    from dcnkit.runtime.registry import check_backend

    check_model_for(args.model, [args.backend])
    try:
        check_backend(args.backend)
    except ValueError as e:
        raise CliError("--backend", str(e).split(": ", 1)[1]) from None
    with make_runner_cli(args.model, args.backend, kit_kernels=args.kit_kernels, device=args.device) as runner:
        feeds = feeds_for(args, runner.inputs())
        t0 = time.perf_counter()
        outs = runner.run(feeds)
        dt = time.perf_counter() - t0
    for k, v in feeds.items():
        print(f"input  {k}: {_describe(v)}")
    for k, v in outs.items():
        print(f"output {k}: {_describe(v)}")
    print(f"{args.backend}: {dt * 1e3:.2f} ms")
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        np.savez(out, **outs)
        print(f"saved outputs to {out}")
    if args.save_inputs:
        p = Path(args.save_inputs)
        p.parent.mkdir(parents=True, exist_ok=True)
        np.savez(p, **feeds)
        print(f"saved inputs to {p}")
    return 0


def register(sub) -> None:
    """Adds the command to the CLI's subparsers."""
    p = sub.add_parser("run", help="run an ONNX model on one backend and save its outputs",
                       description="Run an ONNX model (random inputs of the model's shapes unless --inputs).")
    p.add_argument("model", help="ONNX file (openvino: also an IR folder from dcnkit convert)")
    p.add_argument("--backend", default="ort-cpu", help="ort-cpu (default), ort-cuda, tensorrt, openvino, reference; tensorrt "
                   "builds an ONNX file on the fly or runs an engine file (.engine/.plan/.trt, from dcnkit build)")
    add_input_args(p)
    p.add_argument("-o", "--output", help="save the outputs to this .npz")
    p.add_argument("--save-inputs", metavar="NPZ", help="save the inputs used to this .npz")
    add_kit_kernels_arg(p)
    add_device_arg(p)
    p.set_defaults(func=cmd_run)
