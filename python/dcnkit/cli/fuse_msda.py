"""``dcnkit fuse-msda in.onnx -o out.onnx``: an ONNX file exported from a pure-PyTorch deformable attention (Hugging
Face transformers', Ultralytics' RT-DETR; static or dynamic, simplified or not), with each attention's GridSample
subgraph replaced by one
``dcnkit::MultiScaleDeformableAttention`` node (:mod:`dcnkit.export.fuse_msda`); other GridSample nodes stay."""
from __future__ import annotations

from pathlib import Path

from dcnkit.cli.shared import CliError, check_model_path


def cmd_fuse_msda(args) -> int:
    import onnx

    from dcnkit.export.fuse_msda import fuse_msda

    check_model_path(args.model)
    out = Path(args.output)
    if not out.parent.is_dir():
        raise CliError("-o/--output", f"expected a file in an existing folder, got {args.output!r}")
    if out.resolve() == Path(args.model).resolve():
        raise CliError("-o/--output", f"expected another file than the input, got {args.output!r}")
    try:
        model = onnx.load(args.model)
    except Exception as e:  # noqa: BLE001 - not an ONNX file
        raise CliError("model", f"expected an ONNX file, got {args.model!r} ({type(e).__name__}: {e})") from None
    shapes = {}
    for text in args.shape or []:
        name, _, dims = text.rpartition(":")
        try:
            shapes[name] = [int(d) for d in dims.split("x")]
        except ValueError:
            raise CliError("--shape", f"expected NAME:DxDx... (e.g. images:1x3x640x640), got {text!r}") from None
        if not name or any(d < 1 for d in shapes[name]):
            raise CliError("--shape", f"expected NAME:DxDx... with dims >= 1, got {text!r}")
    try:
        fused, report = fuse_msda(model, verify=not args.no_verify, node=args.node, input_shapes=shapes)
    except ValueError as e:
        raise CliError("--shape", str(e)) from None
    for line in report.lines():
        print(line)
    if not report.fused:
        print(f"nothing fused: {args.output} not written")
        return 1
    onnx.save(fused, str(out))
    print(f"wrote {out} (run it with the kit's ONNX Runtime library: dcnkit run {out})")
    return 0


def register(sub) -> None:
    """Adds the command to the CLI's subparsers."""
    p = sub.add_parser("fuse-msda", help="replace transformers' GridSample deformable attention by one MSDA node",
                       description="Recognise the GridSample subgraph of each multi-scale deformable attention that "
                       "Hugging Face transformers' and Ultralytics' pure-PyTorch code exports to (Deformable DETR, "
                       "RT-DETR, Mask2Former, RT-DETR v2, D-FINE ...; either torch exporter; static or dynamic, "
                       "simplified or not), check it numerically against "
                       "the fused node on random inputs, and replace it with one dcnkit::MultiScaleDeformableAttention "
                       "node. Other GridSample nodes are left as they are. Exit code 1 when nothing was fused.")
    p.add_argument("model", help="input ONNX file")
    p.add_argument("-o", "--output", required=True, help="output ONNX file")
    p.add_argument("--node", choices=["dcnkit", "tensorrt"], default="dcnkit",
                   help="dcnkit: dcnkit::MultiScaleDeformableAttention (default); tensorrt: TensorRT's own "
                   "MultiscaleDeformableAttnPlugin_TRT (domain trt, output per head, then a Reshape), for a file that "
                   "TensorRT builds with its built-in plugin; ONNX Runtime runs both with the kit's library")
    p.add_argument("--shape", action="append", metavar="NAME:DIMS",
                   help="the dims to read the attention subgraphs at, for an input with symbolic dims (e.g. "
                   "images:1x3x640x640; default: batch 1 and the exporter's image size from the file's metadata, "
                   "else 640); the file keeps its symbolic dims and its level tables follow them")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the numerical check of each candidate in ONNX Runtime (faster; structure only)")
    p.set_defaults(func=cmd_fuse_msda)
