"""``dcnkit convert MODEL --to openvino -o DIR``: OpenVINO IR plus the kit's extension library it loads with
(:func:`dcnkit.runtime.openvino_convert.convert_to_openvino`)."""
from __future__ import annotations

from dcnkit.cli.shared import CliError, check_model_path

TARGETS = ("openvino",)


def cmd_convert(args) -> int:
    from dcnkit.runtime.openvino_convert import convert_to_openvino

    check_model_path(args.model)
    if args.to not in TARGETS:
        raise CliError("--to", f"expected one of {', '.join(TARGETS)}, got {args.to!r}")
    try:
        xml = convert_to_openvino(args.model, args.output, deform_conv=args.deform_conv,
                                  compress_to_fp16=args.fp16_weights, overwrite=args.overwrite)
    except FileExistsError as e:
        raise CliError("-o/--output", str(e).split(": ", 1)[1]) from None
    print(f"wrote {xml} (+ {xml.with_suffix('.bin').name}, the extension library and dcnkit_openvino.json in "
          f"{xml.parent}); run it with: dcnkit run {xml.parent} --backend openvino")
    return 0


def register(sub) -> None:
    """Adds the command to the CLI's subparsers."""
    p = sub.add_parser("convert", help="convert an ONNX model for another runtime (OpenVINO IR)",
                       description="Convert an ONNX model to OpenVINO IR (model.xml, model.bin) in a folder, with the "
                       "kit's extension library it loads with (libdcnkit_ov.so) and a manifest.")
    p.add_argument("model", help="ONNX file")
    p.add_argument("--to", required=True, help="target runtime: openvino")
    p.add_argument("-o", "--output", required=True, help="output folder")
    p.add_argument("--deform-conv", default="auto", choices=("auto", "openvino", "kit"),
                   help="standard DeformConv nodes: auto (default) or kit (the kit's kernel, measured the faster), "
                        "or openvino (OpenVINO's DeformableConvolution)")
    p.add_argument("--fp16-weights", action="store_true", help="store weights as float16 (default: float32, exact)")
    p.add_argument("--overwrite", action="store_true", help="replace the IR in an existing folder")
    p.set_defaults(func=cmd_convert)
