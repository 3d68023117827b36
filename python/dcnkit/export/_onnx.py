"""``dcnkit.export.to_onnx``: torch.onnx.export with dcnkit's checks around it."""
from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_BATCH = "batch"
_NUM_ROIS = "num_rois"
_MIN_OPSET = 18  # the dynamo exporter's lowest opset; RoiAlign needs 16, DeformConv 19
_DEFORM_CONV_OPSET = 19


def _fail(arg: str, expected: str, got: Any, exc: type[Exception] = ValueError) -> None:
    raise exc(f"to_onnx: {arg}: expected {expected}, got {got}")


def _type_name(v: Any) -> str:
    return type(v).__name__


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        _fail(name, "a bool", _type_name(value), TypeError)


def _default_input_names(model: Any, n: int) -> list[str]:
    try:
        params = [
            p
            for p in inspect.signature(model.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    if len(params) >= n:
        return [p.name for p in params[:n]]
    return [f"input_{i}" for i in range(n)]


def _check_names(arg: str, names: Any, count: int | None) -> list[str]:
    if isinstance(names, str) or not isinstance(names, Sequence):
        _fail(arg, "a sequence of str", _type_name(names), TypeError)
    names = list(names)
    bad = [n for n in names if not isinstance(n, str) or not n]
    if bad:
        _fail(arg, "non-empty str names", repr(bad[0]), TypeError)
    if len(set(names)) != len(names):
        _fail(arg, "unique names", names)
    if count is not None and len(names) != count:
        _fail(arg, f"{count} name(s) (one per {arg.split('_')[0]})", f"{len(names)}: {names}")
    return names


def _flatten_outputs(out: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
    """(path, tensor) for every tensor of a model's output, in the exporters' order: tuples and lists by
    index, dicts in insertion order (torchvision detectors return ``[{"boxes", "labels", "scores"}]``)."""
    import torch

    if isinstance(out, torch.Tensor):
        return [(path, out)]
    if isinstance(out, (tuple, list)):
        return [leaf for i, o in enumerate(out) for leaf in _flatten_outputs(o, path + (i,))]
    if isinstance(out, dict):
        return [leaf for k, o in out.items() for leaf in _flatten_outputs(o, path + (str(k),))]
    _fail("model", "a model returning tensors (a tensor, or tuples / lists / dicts of them)", _type_name(out),
          TypeError)
    return []


def _output_structure(model: Any, args: tuple, kwargs: dict) -> tuple[int, list[str]]:
    """(number of outputs, default names): ``output`` for one plain tensor, ``output_<i>`` for a tuple;
    outputs in dicts are named by their keys (``boxes``, ``labels``, ``scores`` for a torchvision detector on
    one image), with the list / tuple indices added where keys alone repeat (``boxes_0``, ``boxes_1``)."""
    import torch

    with torch.no_grad():
        out = model(*args, **kwargs)
    leaves = _flatten_outputs(out)
    if not leaves:
        _fail("model", "a model returning at least one tensor", "no tensors", TypeError)
    if not any(isinstance(p, str) for path, _ in leaves for p in path):
        if len(leaves) == 1:
            return 1, ["output"]
        return len(leaves), [f"output_{i}" for i in range(len(leaves))]
    keys_only = ["_".join(p for p in path if isinstance(p, str)) for path, _ in leaves]
    if all(keys_only) and len(set(keys_only)) == len(keys_only):
        return len(leaves), keys_only
    names = []
    for i, (path, _) in enumerate(leaves):
        keys = [p for p in path if isinstance(p, str)] + [str(p) for p in path if not isinstance(p, str)]
        names.append("_".join(keys) or f"output_{i}")
    return len(leaves), names


def _param_bytes(model: Any) -> int:
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))


def to_onnx(
    model: Any,
    args: Any,
    path: str | os.PathLike,
    *,
    standard_ops: bool = True,
    dynamic_batch: bool = True,
    dynamic_rois: bool = True,
    roi_inputs: Sequence[str] | None = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    output_axes: dict[str, dict[int, str]] | None = None,
    opset_version: int | None = None,
    opset: int | None = None,
    dynamo: bool = True,
    kwargs: dict[str, Any] | None = None,
    check: bool = True,
    external_data: bool | None = None,
    **export_options: Any,
) -> str:
    """Exports ``model(*args)`` to ONNX at ``path`` and checks the result; returns the path.

    Args:
        model: a ``torch.nn.Module`` (put in eval mode by you; a module in training mode warns).
        args: the example inputs, a tensor or a tuple of tensors.
        path: the ``.onnx`` file to write (its folder must exist).
        standard_ops: map ops to standard ONNX ops where identical (``DeformConv``, ``RoiAlign``);
            False makes every dcnkit op a node of the ``dcnkit`` domain (run it with
            ``dcnkit.runtime.ort_session``).
        dynamic_batch: make dim 0 of every input (except RoI inputs) a ``batch`` axis.
        dynamic_rois: make dim 0 of every RoI input a ``num_rois`` axis.
        roi_inputs: names of the inputs whose dim 0 is the RoI count (``rois (K, 5)``, also
            per-RoI offsets); default: the inputs whose name contains ``roi``.
        input_names: default: the names of ``model.forward``'s parameters.
        output_names: default: ``output`` for one output, else ``output_0``, ``output_1``, ...; outputs
            in dicts (torchvision detectors: ``[{"boxes": ..., "labels": ..., "scores": ...}]``) are named
            by their keys (``boxes``, ``labels``, ``scores``; ``boxes_0``, ``boxes_1``, ... for several images).
        output_axes: names of output dims whose size depends on the data, e.g.
            ``{"boxes": {0: "num_detections"}}``, written into the graph's output shapes.
        opset / opset_version: default 20 (give one of the two names); >= 19 is needed for ``DeformConv`` (below that, deform_conv2d
            is exported as ``dcnkit::DeformConv2d``); the TorchScript exporter supports up to 20. The file gets the
            lowest IR version its opsets allow (:func:`lower_ir_version`): opset 19 and 20 give IR 9, which ONNX
            Runtime reads from 1.16 (opset 19) and 1.17 (opset 20); docs/onnxruntime_versions.md has the table.
        dynamo: True for torch.export-based export (torch's default), False for the TorchScript one.
        kwargs: keyword inputs of ``model``.
        check: run ``onnx.checker`` (full check) and strict shape inference on the result.
        external_data: store weights in a side file; default only when they exceed 1.5 GiB.
        export_options: passed on to ``torch.onnx.export``.
    """
    import torch

    from dcnkit.export import _dynamo, _legacy, _lowering
    from dcnkit.export.schemas import register_onnx_schemas

    if not isinstance(model, torch.nn.Module):
        _fail("model", "a torch.nn.Module", _type_name(model), TypeError)
    if isinstance(args, torch.Tensor):
        args = (args,)
    if not isinstance(args, (tuple, list)) or not args:
        _fail("args", "a tensor or a non-empty tuple of tensors", _type_name(args) if not isinstance(args, (tuple, list)) else "an empty tuple", TypeError)
    args = tuple(args)
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            _fail(f"args[{i}]", "a torch.Tensor", _type_name(a), TypeError)
    if not isinstance(path, (str, os.PathLike)):
        _fail("path", "a str or os.PathLike", _type_name(path), TypeError)
    path = Path(path)
    if not path.parent.is_dir():
        _fail("path", "a file in an existing folder", str(path))
    for name, value in (
        ("standard_ops", standard_ops),
        ("dynamic_batch", dynamic_batch),
        ("dynamic_rois", dynamic_rois),
        ("dynamo", dynamo),
        ("check", check),
    ):
        _check_bool(name, value)
    if kwargs is not None and not isinstance(kwargs, dict):
        _fail("kwargs", "a dict or None", _type_name(kwargs), TypeError)
    kwargs = dict(kwargs or {})
    from torch.onnx import _constants

    if opset is not None:
        if opset_version is not None and opset_version != opset:
            _fail("opset", f"the same value as opset_version ({opset_version}) or None", opset)
        opset_version = opset
    max_opset = _constants.ONNX_MAX_OPSET if dynamo else _constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET
    if opset_version is None:
        opset_version = _constants.ONNX_DEFAULT_OPSET
    if isinstance(opset_version, bool) or not isinstance(opset_version, int):
        _fail("opset_version", "an int or None", _type_name(opset_version), TypeError)
    if not _MIN_OPSET <= opset_version <= max_opset:
        exporter = "dynamo" if dynamo else "TorchScript"
        _fail("opset_version", f"{_MIN_OPSET}..{max_opset} (the {exporter} exporter)", opset_version)
    if standard_ops and opset_version < _DEFORM_CONV_OPSET:
        warnings.warn(
            f"to_onnx: opset_version {opset_version} < {_DEFORM_CONV_OPSET}: deform_conv2d is exported "
            "as dcnkit::DeformConv2d, not the standard DeformConv",
            stacklevel=2,
        )
    if external_data is not None:
        _check_bool("external_data", external_data)
    for reserved in ("f", "dynamic_axes", "dynamic_shapes"):
        if reserved in export_options:
            _fail(reserved, "not given (to_onnx sets it from its own arguments)", "a value", TypeError)

    in_names = (
        _default_input_names(model, len(args))
        if input_names is None
        else _check_names("input_names", input_names, len(args))
    )
    n_out, default_out_names = _output_structure(model, args, kwargs)
    if output_names is None:
        out_names = default_out_names
    else:
        out_names = _check_names("output_names", output_names, n_out)
    out_axes = _check_output_axes(output_axes, out_names)
    if roi_inputs is None:
        rois = [n for n in in_names if "roi" in n.lower()]
    else:
        rois = _check_names("roi_inputs", roi_inputs, None)
        unknown = [n for n in rois if n not in in_names]
        if unknown:
            _fail("roi_inputs", f"names among input_names {in_names}", unknown)

    axes: list[dict[int, str] | None] = []
    for name, a in zip(in_names, args):
        if a.dim() == 0:
            axes.append(None)
        elif name in rois:
            axes.append({0: _NUM_ROIS} if dynamic_rois else None)
        else:
            axes.append({0: _BATCH} if dynamic_batch else None)
    if external_data is None:
        external_data = _param_bytes(model) > (3 << 29)

    options: dict[str, Any] = dict(
        input_names=in_names,
        output_names=out_names,
        opset_version=opset_version,
        dynamo=dynamo,
    )
    if kwargs:
        options["kwargs"] = kwargs
    if dynamo:
        _dynamo.ensure_registered()
        options["dynamic_shapes"] = tuple(axes) if any(axes) else None
        options["external_data"] = external_data
    else:
        _legacy.register()
        options["dynamic_axes"] = {n: ax for n, ax in zip(in_names, axes) if ax}
    options.update(export_options)

    register_onnx_schemas()
    with _lowering.standard_ops(standard_ops), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*'dynamic_axes' is not recommended.*")
        torch.onnx.export(model, args, str(path), **options)

    if not dynamo:
        _relabel_outputs(path)
    if out_axes:
        _name_output_dims(path, out_axes)
    _empty_safe_reshapes(path)
    lower_ir_version(path)
    if check:
        check_model(path)
    return str(path)


def _check_output_axes(output_axes: Any, out_names: list[str]) -> dict[str, dict[int, str]]:
    if output_axes is None:
        return {}
    if not isinstance(output_axes, dict):
        _fail("output_axes", "a dict {output name: {dim: name}} or None", _type_name(output_axes), TypeError)
    for name, dims in output_axes.items():
        if name not in out_names:
            _fail("output_axes", f"output names among {out_names}", repr(name))
        if not isinstance(dims, dict) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 and isinstance(n, str) and n
                for d, n in dims.items()):
            _fail(f"output_axes[{name!r}]", "a dict {dim (int >= 0): name (non-empty str)}", repr(dims), TypeError)
    return {k: dict(v) for k, v in output_axes.items()}


def _name_output_dims(path: Path, out_axes: dict[str, dict[int, str]]) -> None:
    """Writes ``out_axes`` into the graph outputs' shapes."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    for out in model.graph.output:
        dims = out_axes.get(out.name)
        if not dims:
            continue
        tt = out.type.tensor_type
        if not tt.HasField("shape"):
            _fail(f"output_axes[{out.name!r}]", "an output whose rank the export knows", "an unknown rank")
        shape = tt.shape
        rank = len(shape.dim)
        if max(dims) >= rank:
            _fail(f"output_axes[{out.name!r}]", f"dims below the output's rank {rank}", sorted(dims))
        for d, name in dims.items():
            shape.dim[d].Clear()
            shape.dim[d].dim_param = name
    onnx.save(model, str(path))


def _empty_safe_reshapes(path: Path) -> None:
    """Reshapes whose ``-1`` cannot be inferred on empty tensors (no proposals, no detections) made explicit
    (:mod:`dcnkit.export._empty_reshape`)."""
    import onnx

    from dcnkit.export._empty_reshape import rewrite_empty_reshapes

    model = onnx.load(str(path), load_external_data=False)
    if rewrite_empty_reshapes(model):
        onnx.save(model, str(path))


# The newest tensor element type of each IR version (TensorProto.DataType): IR 9 added the FLOAT8 types, IR 10 INT4 /
# UINT4, IR 11 FLOAT4E2M1.
_LAST_TYPE_OF_IR = {8: 16, 9: 20, 10: 22, 11: 23}


def _newer_ir_needed(model: Any, ir: int) -> bool:
    """Whether ``model`` uses what IR version ``ir`` lacks: newer element types, or function overloads (IR 10)."""
    if ir >= max(_LAST_TYPE_OF_IR) + 1:
        return False
    last_type = _LAST_TYPE_OF_IR.get(ir, 16)

    def graph_needs(g) -> bool:
        values = list(g.input) + list(g.output) + list(g.value_info)
        if any(v.type.HasField("tensor_type") and v.type.tensor_type.elem_type > last_type for v in values):
            return True
        if any(t.data_type > last_type for t in g.initializer):
            return True
        for n in g.node:
            if ir < 10 and n.overload:
                return True
            if any(graph_needs(a.g) for a in n.attribute if a.HasField("g")):
                return True
            if any(graph_needs(sg) for a in n.attribute for sg in a.graphs):
                return True
        return False

    if ir < 10 and any(f.overload or any(n.overload for n in f.node) for f in model.functions):
        return True
    return graph_needs(model.graph)


def lower_ir_version(path: str | os.PathLike) -> int:
    """Sets the model file's IR version to the lowest its opsets allow (ONNX's release table) when the exporter wrote a
    newer one and the model uses nothing of the newer IR; returns the IR version of the file. An opset-19 file is then
    IR 9, which ONNX Runtime 1.16 reads (torch's dynamo exporter writes IR 10, which ONNX Runtime reads from 1.18)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    want = onnx.helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    if want >= model.ir_version or _newer_ir_needed(model, want):
        return model.ir_version
    model.ir_version = want
    onnx.save(model, str(path))
    return want


def _relabel_outputs(path: Path) -> None:
    """TorchScript exports give the outputs of dcnkit-domain nodes fresh dim names: recompute the
    value shapes and graph output shapes with ONNX shape inference (our schemas), so an output's
    RoI axis is ``num_rois`` and its batch axis ``batch``."""
    import onnx

    from dcnkit.export import _table

    model = onnx.load(str(path), load_external_data=False)
    if not any(n.domain == _table.domain() for n in model.graph.node):
        return
    del model.graph.value_info[:]
    exported = {}
    for out in model.graph.output:
        if out.type.tensor_type.HasField("shape"):
            exported[out.name] = onnx.TypeProto.Tensor()
            exported[out.name].CopyFrom(out.type.tensor_type)
            out.type.tensor_type.ClearField("shape")
    # Data propagation: shapes computed by Shape / Gather / Concat before an Expand or a Reshape (Mask2Former).
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    for out in inferred.graph.output:
        # An output whose shape inference cannot reach keeps the exporter's shape (an output without one fails
        # the checker).
        if not out.type.tensor_type.HasField("shape") and out.name in exported:
            out.type.tensor_type.CopyFrom(exported[out.name])
    onnx.save(inferred, str(path))


def check_model(path: str | os.PathLike) -> Any:
    """Runs ``onnx.checker`` (full check) and strict shape inference on the model at ``path``;
    returns the model with inferred shapes."""
    import onnx

    from dcnkit.export.schemas import register_onnx_schemas

    register_onnx_schemas()
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    return onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
