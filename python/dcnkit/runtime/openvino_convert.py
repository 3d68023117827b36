"""``dcnkit convert MODEL --to openvino -o DIR``: an ONNX model as OpenVINO IR, with what it needs at load time.

DIR holds ``model.xml`` / ``model.bin`` (the IR; the kit's operations appear as layers of the opset ``dcnkit``, with
the attribute names of docs/operators.md), ``libdcnkit_ov.so`` (the extension that defines those layers, for
``core.add_extension``) with the OpenBLAS library it links, and ``dcnkit_openvino.json`` (what was written, by which
OpenVINO, and how to load it). ``make_runner(DIR, backend="openvino")`` runs it; so does plain OpenVINO::

    core = openvino.Core(); core.add_extension("DIR/libdcnkit_ov.so"); core.compile_model("DIR/model.xml", "CPU")

The extension loads only in the OpenVINO release it was built against (the json names it).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from dcnkit.runtime.openvino import EXTENSION_LIBRARY, extension_library, openvino_reason, read_onnx
from dcnkit.runtime.base import BackendUnavailable

MANIFEST = "dcnkit_openvino.json"


def _linked_openblas(lib: Path) -> list[Path]:
    """The scipy-openblas32 shared library the extension links (copied beside it: its rpath starts with $ORIGIN)."""
    try:
        import scipy_openblas32 as s
    except ImportError:
        return []
    p = Path(s.get_lib_dir()) / f"lib{s.get_library()}.so"
    return [p] if p.is_file() else []


def convert_to_openvino(model, output_dir, deform_conv: str = "auto", compress_to_fp16: bool = False,
                        overwrite: bool = False) -> Path:
    """Writes ``model`` (ONNX path, bytes or ModelProto) as OpenVINO IR into ``output_dir``; returns the ``.xml``.

    ``deform_conv``: which standard DeformConv nodes run on the kit's kernel (as the runner's option of that name).
    ``compress_to_fp16``: store the weights as float16 (OpenVINO's default; off here: the IR computes what the ONNX
    file does). ``overwrite``: replace the IR files of an existing folder.
    """
    reason = openvino_reason()
    if reason:
        raise BackendUnavailable(f"openvino: {reason}")
    import openvino as ov

    out = Path(os.fspath(output_dir))
    xml = out / "model.xml"
    if xml.exists() and not overwrite:
        raise FileExistsError(f"output: expected a folder without model.xml (or overwrite), got {str(out)!r}")
    out.mkdir(parents=True, exist_ok=True)
    core = ov.Core()
    lib = extension_library()
    core.add_extension(str(lib))
    ov_model, _, rewritten = read_onnx(core, model, deform_conv)
    ov.save_model(ov_model, str(xml), compress_to_fp16=compress_to_fp16)
    copied = []
    for src in [lib, *_linked_openblas(lib)]:
        shutil.copy2(src, out / src.name)
        copied.append(src.name)
    kit_ops = sorted({op.get_type_name() for op in ov_model.get_ops()
                      if op.get_type_info().version_id == "dcnkit"})
    manifest = {
        "model": xml.name,
        "weights": "model.bin",
        "extension": EXTENSION_LIBRARY,
        "libraries": copied,
        "openvino_version": ov.get_version(),
        "kit_operations": kit_ops,
        "deform_conv": deform_conv,
        "deform_conv_nodes_on_kit_kernel": rewritten,
        "compress_to_fp16": compress_to_fp16,
        "load": f"core.add_extension('{EXTENSION_LIBRARY}'); core.compile_model('{xml.name}', 'CPU')",
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return xml


__all__ = ["MANIFEST", "convert_to_openvino"]
