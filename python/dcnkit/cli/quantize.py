"""``dcnkit quantize m.onnx -o m.int8.onnx --calibration feeds.npz``: static INT8 (QDQ) quantization with ONNX
Runtime's quantization tool, calibrated through the kit's library (:mod:`dcnkit.runtime.quantize`).

The calibration .npz holds one array per model input, as ``dcnkit run --inputs`` takes it; where the model has a
fixed batch B, arrays of k*B samples are k calibration feeds. ``--calibration`` may be repeated."""
from __future__ import annotations

import time
from pathlib import Path

from dcnkit.cli.feeds import load_npz
from dcnkit.cli.shared import CliError, check_model_path


def cmd_quantize(args) -> int:
    from dcnkit.runtime import quantize as dq

    check_model_path(args.model)
    out = Path(args.output)
    if out.is_dir():
        raise CliError("--output", f"expected a file path, got the directory {args.output!r}")
    if Path(args.output).resolve() == Path(args.model).resolve():
        raise CliError("--output", f"expected a new file, got the model itself {args.output!r}")
    if args.threads is not None and args.threads < 1:
        raise CliError("--threads", f"expected an integer >= 1, got {args.threads}")
    feeds = []
    for path in args.calibration:
        arrays = load_npz(path, "--calibration")
        try:
            feeds += dq.calibration_feeds(args.model, arrays, "--calibration")
        except ValueError as e:
            raise CliError("--calibration", f"{path}: {str(e).split(': ', 1)[1]}") from None
    t0 = time.perf_counter()
    try:
        _, summary = dq.quantize_with_summary(
            args.model, out, feeds, method=args.method, per_channel=not args.per_tensor,
            exclude_op_types=args.exclude_op_type, exclude_nodes=args.exclude_node, threads=args.threads,
            reduce_range=not args.full_range, quantize_offsets=args.quantize_offsets,
            qdeform=False if args.no_qdeformconv else None, preprocess=not args.no_preprocess)
    except ValueError as e:
        arg, _, msg = str(e).partition(": ")
        raise CliError({"exclude_nodes": "--exclude-node"}.get(arg, arg), msg) from None
    import onnx

    proto = onnx.load(str(out), load_external_data=False)
    nq = sum(n.op_type == "QuantizeLinear" for n in proto.graph.node)
    print(f"wrote {out}: {nq} QuantizeLinear nodes, calibrated on {len(feeds)} feeds ({args.method}, "
          f"{'per-tensor' if args.per_tensor else 'per-channel'} int8 weights) in {time.perf_counter() - t0:.1f} s")
    print(summary.line())
    return 0


def register(sub) -> None:
    """Adds the command to the CLI's subparsers."""
    from dcnkit.runtime.quantize import CALIBRATION_METHODS

    p = sub.add_parser("quantize", help="quantize a model to INT8 (QDQ), calibrated with the kit's ops",
                       description="Static INT8 quantization (QDQ: int8 weights, uint8 activations) with ONNX "
                                   "Runtime's quantization tool; calibration runs with the kit's library, so models "
                                   "with dcnkit / mmdeploy / mmcv nodes and standard DeformConv quantize. The kit's "
                                   "deformable convolutions become dcnkit::QDeformConv2d (int8), its other nodes "
                                   "stay float between "
                                   "DequantizeLinear and QuantizeLinear.")
    p.add_argument("model", help="ONNX file (float32)")
    p.add_argument("-o", "--output", required=True, help="the quantized ONNX file to write")
    p.add_argument("--calibration", action="append", required=True, metavar="NPZ",
                   help="calibration inputs (.npz, one array per model input, as `dcnkit run --inputs`); repeatable")
    p.add_argument("--method", choices=sorted(CALIBRATION_METHODS), default="minmax",
                   help="calibration method (default minmax)")
    p.add_argument("--per-tensor", action="store_true", help="one int8 scale per weight tensor (default: per "
                   "output channel)")
    p.add_argument("--full-range", action="store_true", help="8-bit weights (default: 7-bit, which CPUs without "
                   "VNNI need to avoid saturation; use this only where the deployment CPU has VNNI or AMX)")
    p.add_argument("--quantize-offsets", action="store_true", help="quantize the layers that predict the "
                   "deformable convolutions' offsets and masks too (default: they stay float)")
    p.add_argument("--no-qdeformconv", action="store_true", help="leave deformable convolutions float between "
                   "DequantizeLinear/QuantizeLinear (default: one dcnkit::QDeformConv2d each where the kit's library "
                   "runs it, i.e. finds oneDNN)")
    p.add_argument("--no-preprocess", action="store_true", help="quantize the graph as it is (default: normalise "
                   "it first: shape inference with the kit's ops, constant and BatchNorm folding, computed weights and "
                   "biases as initializers, so that every exporter's file quantizes alike)")
    p.add_argument("--exclude-op-type", action="append", default=[], metavar="OP",
                   help="leave every node of this operator type in float (repeatable)")
    p.add_argument("--exclude-node", action="append", default=[], metavar="NAME",
                   help="leave this node in float (repeatable)")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads of the calibration sessions")
    p.set_defaults(func=cmd_quantize)
