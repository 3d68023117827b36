"""One PyTorch model, the ONNX files the exporters in the field write of it (for bench_int8.py and
tests/test_quantize_writers.py).

Writers (key: what writes the file):

* ``ts16`` .. ``ts20``: ``torch.onnx.export(dynamo=False, opset_version=k)`` (TorchScript), dynamic batch;
  ``ts17-static``: the same at opset 17 with a fixed batch;
* ``dynamo``: ``torch.onnx.export(dynamo=True)``;
* ``dcnkit``, ``dcnkit-custom``: ``dcnkit export`` (standard ``DeformConv`` / ``--custom-ops``);
* ``mmdeploy``: mmdeploy's names: the TorchScript export (opset 17) with each deformable convolution written as
  ``mmdeploy::MMCVModulatedDeformConv2d`` (input order input, offset, mask, weight, bias; attribute
  ``deform_groups``), as mmdeploy's symbolic writes it. (mmdeploy's default opset is 11; torch's TorchScript export
  of a deformable convolution without bias writes its zero bias with CastLike, which needs opset 15.)

The model comes from a factory ``MODULE:FACTORY`` (as ``dcnkit export`` takes it), built once per writer with the
same keyword arguments: the factory must seed its own weights.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import warnings

WRITERS = ("ts16", "ts17", "ts18", "ts19", "ts20", "ts17-static", "dynamo", "dcnkit", "dcnkit-custom", "mmdeploy")
LABELS = {**{f"ts{k}": f"torch.onnx.export(dynamo=False), opset {k}" for k in range(16, 21)},
          "ts17-static": "torch.onnx.export(dynamo=False), opset 17, fixed batch",
          "dynamo": "torch.onnx.export(dynamo=True)", "dcnkit": "dcnkit export (standard ops)",
          "dcnkit-custom": "dcnkit export --custom-ops", "mmdeploy": "mmdeploy names (TorchScript, opset 17)"}


def to_mmdeploy_names(proto) -> None:
    """Rewrites each ``dcnkit::DeformConv2d`` of ``proto`` (in place) as mmdeploy writes a modulated deformable
    convolution: ``mmdeploy::MMCVModulatedDeformConv2d(input, offset, mask, weight, bias)``, ``deform_groups``."""
    import onnx

    for n in proto.graph.node:
        if n.domain == "dcnkit" and n.op_type == "DeformConv2d":
            x, off, w, b, mask = (list(n.input) + [""] * 5)[:5]
            del n.input[:]
            n.input.extend([x, off, mask, w, b] if b else [x, off, mask, w])
            n.domain, n.op_type = "mmdeploy", "MMCVModulatedDeformConv2d"
            keep = [a for a in n.attribute if a.name in ("stride", "padding", "dilation", "groups")]
            dg = [a for a in n.attribute if a.name == "deformable_groups"][0].i
            del n.attribute[:]
            n.attribute.extend(keep + [onnx.helper.make_attribute("deform_groups", dg)])
    if not any(o.domain == "mmdeploy" for o in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid("mmdeploy", 1))


def _torchscript(model, x, path, opset, dynamic=True):
    import torch

    axes = {"x": {0: "N"}, "y": {0: "N"}} if dynamic else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), path, opset_version=opset, dynamo=False, input_names=["x"],
                          output_names=["y"], dynamic_axes=axes)


def write(writer: str, factory: str, shape, path: str, **kwargs) -> str:
    """Writes the model of ``factory`` (``MODULE:FACTORY``, called with ``kwargs``) as ``writer`` does to ``path``;
    ``shape``: the example input's shape (one input, named ``x``). Returns ``path``."""
    import torch
    import onnx

    import dcnkit  # noqa: F401  (the kit's exporters)
    from dcnkit.cli.export import load_factory

    if writer not in WRITERS:
        raise ValueError(f"writer: expected one of {WRITERS}, got {writer!r}")
    x = torch.randn(*shape)
    if writer in ("dcnkit", "dcnkit-custom"):
        from dcnkit.cli.parser import main

        args = ["export", factory, "-o", path, "--input", "x:" + "x".join(map(str, shape))]
        args += [f"--arg={k}={json.dumps(v)}" for k, v in kwargs.items()]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            rc = main(args + (["--custom-ops"] if writer == "dcnkit-custom" else []))
        if rc:
            raise RuntimeError(f"dcnkit export failed: {err.getvalue().strip()}")
        return path
    model = load_factory(factory)(**kwargs).eval()
    if writer == "dynamo":
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (x,), path, dynamo=True, input_names=["x"], output_names=["y"], verbose=False)
    elif writer == "mmdeploy":
        _torchscript(model, x, path, 17)
        proto = onnx.load(path)
        to_mmdeploy_names(proto)
        onnx.save(proto, path)
    else:
        _torchscript(model, x, path, int(writer[2:4]), dynamic=writer != "ts17-static")
    return path


def write_all(factory: str, shape, folder: str, writers=WRITERS, **kwargs) -> dict:
    """``{writer: path}``: the model written by each of ``writers`` into ``folder``."""
    return {w: write(w, factory, shape, os.path.join(folder, f"{w}.onnx"), **kwargs) for w in writers}
