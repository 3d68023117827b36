"""What :func:`dcnkit.export.fuse_msda.fuse_msda` needs beyond a simplified static file: a copy of the model to read
the attention subgraphs and their level sizes from, and level tables computed in the graph where the file's level
sizes change with its input.

- **The analysis copy.** Exports that are not simplified (``simplify=False``) compute their reshape targets and pads
  from ``Shape`` at run time, where ONNX shape inference stops; dynamic exports (``dynamic=True``) have symbolic
  input dims. The copy gets fixed input dims (the file's own, else those given, else an image size from the
  exporter's metadata: Ultralytics writes ``imgsz``), then ONNX Runtime's basic graph optimizations fold every
  constant expression (standard ONNX ops only; a file ONNX Runtime cannot load keeps its own), and ONNX shape
  inference runs on what is left. Only tensors that
  exist in the original file are used: the file that is written is the original with its subgraphs replaced.
- **Level tables in the graph.** Where the file's inputs have symbolic dims, ``spatial_shapes`` and
  ``level_start_index`` are computed from the ``Shape`` of each level's map (the GridSample inputs), so the fused
  file keeps serving every input size the exported one did.
"""
from __future__ import annotations

import ast
import os
import tempfile
from typing import Any, Callable

import numpy as np

__all__ = ["analysis_copy", "has_symbolic_inputs", "level_tables"]

DEFAULT_IMAGE_SIZE = 640  # an image input's symbolic H and W, where neither the caller nor the metadata say


def has_symbolic_inputs(model: Any) -> bool:
    inits = {i.name for i in model.graph.initializer}
    return any(not d.HasField("dim_value") for i in model.graph.input if i.name not in inits
               for d in i.type.tensor_type.shape.dim)


def _metadata_image_size(model: Any) -> tuple[int, int] | None:
    for p in model.metadata_props:
        if p.key == "imgsz":
            try:
                v = ast.literal_eval(p.value)
            except (ValueError, SyntaxError):
                return None
            v = [v, v] if isinstance(v, int) else list(v)
            if len(v) == 2 and all(isinstance(x, int) and x > 0 for x in v):
                return v[0], v[1]
    return None


def _fixed_dims(model: Any, input_shapes: dict | None) -> dict[str, list[int]]:
    """Every graph input's dims with the symbolic ones fixed: ``input_shapes[name]``, else 1 for the batch and the
    metadata's (or a default) image size for an image input's H and W, else 1."""
    inits = {i.name for i in model.graph.initializer}
    hw = _metadata_image_size(model) or (DEFAULT_IMAGE_SIZE, DEFAULT_IMAGE_SIZE)
    out = {}
    for i in model.graph.input:
        if i.name in inits:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim]
        if input_shapes and i.name in input_shapes:
            given = [int(x) for x in input_shapes[i.name]]
            if len(given) != len(dims) or any(d is not None and d != g for d, g in zip(dims, given)):
                raise ValueError(f"fuse_msda: input_shapes[{i.name!r}]: expected {len(dims)} dims matching "
                                 f"{['?' if d is None else d for d in dims]}, got {given}")
            out[i.name] = given
            continue
        fixed = []
        for k, d in enumerate(dims):
            if d is not None:
                fixed.append(d)
            elif len(dims) == 4 and k in (2, 3):
                fixed.append(hw[k - 2])
            else:
                fixed.append(1)
        out[i.name] = fixed
    return out


def analysis_copy(model: Any, input_shapes: dict | None = None) -> Any:
    """The model with fixed input dims and its constant expressions folded (the module docstring)."""
    import onnx
    import onnxruntime as ort

    import dcnkit

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    dims = _fixed_dims(copy, input_shapes)
    for i in copy.graph.input:
        if i.name in dims:
            for d, v in zip(i.type.tensor_type.shape.dim, dims[i.name]):
                d.Clear()
                d.dim_value = v
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.log_severity_level = 3
    so.register_custom_ops_library(dcnkit.ort_library())  # a file that is fused in part already
    with tempfile.TemporaryDirectory(prefix="dcnkit-fuse-msda-") as tmp:
        so.optimized_model_filepath = os.path.join(tmp, "folded.onnx")
        try:
            ort.InferenceSession(copy.SerializeToString(), so, providers=["CPUExecutionProvider"])
        except Exception:  # noqa: BLE001 - a file ONNX Runtime cannot load as it is (a float64 grid on float32
            return copy  # maps, as the TorchScript exporter writes transformers' code): shape inference alone
        folded = onnx.load(so.optimized_model_filepath)
    return folded


def level_tables(maps: list[str], names: Callable[[str], str]) -> tuple[list, list, str, str]:
    """(nodes, initializers, spatial_shapes, level_start_index): the int64 tables of the levels whose maps
    (``(N*M, D, H_l, W_l)``, the GridSample inputs) are ``maps``, computed from their shapes at run time."""
    from onnx import helper, numpy_helper

    inits = [numpy_helper.from_array(np.array([2], dtype=np.int64), names("hw_start")),
             numpy_helper.from_array(np.array([4], dtype=np.int64), names("hw_end")),
             numpy_helper.from_array(np.array([-1, 2], dtype=np.int64), names("rows")),
             numpy_helper.from_array(np.array([0], dtype=np.int64), names("zero")),
             numpy_helper.from_array(np.array(0, dtype=np.int64), names("axis0"))]
    nodes, hws, areas = [], [], []
    for i, x in enumerate(maps):
        shape, hw, area = names(f"map_shape_{i}"), names(f"map_hw_{i}"), names(f"map_area_{i}")
        nodes.append(helper.make_node("Shape", [x], [shape]))
        nodes.append(helper.make_node("Slice", [shape, names("hw_start"), names("hw_end")], [hw]))
        nodes.append(helper.make_node("ReduceProd", [hw], [area], keepdims=1))
        hws.append(hw)
        areas.append(area)
    flat, shapes, sizes, starts = names("hw_flat"), names("spatial_shapes"), names("areas"), names("level_start_index")
    nodes.append(helper.make_node("Concat", hws, [flat], axis=0))
    nodes.append(helper.make_node("Reshape", [flat, names("rows")], [shapes]))
    nodes.append(helper.make_node("Concat", [names("zero")] + areas[:-1], [sizes], axis=0))
    nodes.append(helper.make_node("CumSum", [sizes, names("axis0")], [starts]))
    return nodes, inits, shapes, starts
