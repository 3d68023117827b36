"""Which standard nodes run on the kit's kernels under OpenVINO, applied as an in-memory rewrite before OpenVINO reads
the model (the file is not touched).

``DeformConv``: every node the kit can represent is rewritten to ``dcnkit::DeformConv2d`` (measured: OpenVINO's
DeformableConvolution-8 took 1.24-1.82x the kit kernel's time inside OpenVINO on ten of eleven DCNv2 layers, docs/
openvino.md "Which kernel runs a DeformConv"; the kit's kernel reads its weight packed once for its GEMM).

The kit's extension library converts standard ``DeformConv`` to OpenVINO's own DeformableConvolution-8 (with
``bilinear_interpolation_pad``, the same function) and ``dcnkit::DeformConv2d`` to the kit's kernel; the rewrite
itself is :func:`dcnkit.runtime.ort_rewrite.rewrite_deform_conv` (exact; nodes the kit cannot represent, e.g.
asymmetric padding, stay on OpenVINO's op).

``RoiAlign`` (``avg``): always the kit's ``dcnkit::RoIAlign`` (:func:`rewrite_roi_align`). OpenVINO 2026.4's ROIAlign
computes the same values on finite maps, but reads the pixel at (0, 0) with weight 0 for samples off the map (an Inf
or NaN there turns such bins into NaN, as torchvision's CPU kernel does; docs/operators.md says 0) and reads outside
the map for a negative batch index; the kit's kernel gives 0 and an error naming the RoI. ``max`` mode (ONNX's own
definition, which the kit's exporter never writes) stays OpenVINO's.

Empty constants in subgraphs (:func:`rewrite_empty_constants`): OpenVINO 2026.4 reads a ``Constant`` of zero
elements inside an ``If`` branch as a one-element tensor. torchvision's ``batched_nms`` returns such a constant when
there is no box, so a detector fed an image without proposals got one detection of uninitialised memory. Such a
constant becomes ``ConstantOfShape`` of its (empty) shape, which OpenVINO reads right.
"""
from __future__ import annotations

from typing import Any

from dcnkit.runtime.ort_rewrite import rewrite_deform_conv

__all__ = ["prepare_onnx", "rewrite_empty_constants", "rewrite_roi_align"]

def _default_opset(model: Any) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=1)


def _elem_types(model: Any) -> dict:
    """The element type (``onnx.TensorProto`` enum) of every value of ``model`` that ONNX's shape inference knows,
    subgraphs included."""
    import onnx

    from dcnkit.runtime.ort_rewrite import _subgraphs

    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - a model it cannot read (> 2 GB, ...): the types the file states
        pass
    out = {}

    def visit(graph):
        for v in [*graph.input, *graph.output, *graph.value_info]:
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type:
                out[v.name] = v.type.tensor_type.elem_type
        out.update({t.name: t.data_type for t in graph.initializer})
        for node in graph.node:
            for sub in _subgraphs(node):
                visit(sub)

    visit(model.graph)
    return out


def _roi_align_mode(node: Any) -> str | None:
    """``avg`` / ``max`` for a standard RoiAlign node, else None."""
    from onnx import helper

    if node.op_type != "RoiAlign" or node.domain not in ("", "ai.onnx"):
        return None
    mode = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "mode"), b"avg")
    return mode.decode() if isinstance(mode, bytes) else mode


def _pad_columns(x: str, out: str, before: int, after: int, opset: int, name: str) -> list:
    """Nodes that widen the (K, n) matrix ``x`` by zero columns: ``before`` to its left, ``after`` to its right."""
    from onnx import helper, numpy_helper

    import numpy as np

    pads = [0, before, 0, after]
    if opset < 11:  # Pad-2: pads an attribute
        return [helper.make_node("Pad", [x], [out], pads=pads, name=name)]
    const = helper.make_node("Constant", [], [name + "_pads"], name=name + "_pads",
                             value=numpy_helper.from_array(np.array(pads, np.int64)))
    return [const, helper.make_node("Pad", [x, name + "_pads"], [out], name=name)]


def _avg_roi_align_nodes(node: Any, p: str, shape: str, opset: int, float_type: int | None, default_ctm: str) -> list:
    """``RoiAlign(X, rois (K, 4), batch_indices (K))`` (avg) as ``dcnkit::RoIAlign(X, rois5)``, rois5 the (K, 5) rows
    [batch index, x1, y1, x2, y2]: ``Pad(Reshape(Cast(batch_indices), [-1, 1]))`` + ``Pad(rois)``, the cast to the
    RoIs' float type. (Not a Concat: OpenVINO 2026.4 drops every input of a Concat that has a zero dimension, also off
    the concatenation axis, so K = 0 RoIs gave a (0, 4) matrix.)"""
    import onnx
    from onnx import helper

    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    ctm = a.get("coordinate_transformation_mode", default_ctm.encode())
    ctm = ctm.decode() if isinstance(ctm, bytes) else ctm
    x, rois, bi = node.input[:3]
    if float_type is not None or opset < 15:
        cast = helper.make_node("Cast", [bi], [p + "_bf"], to=float_type or onnx.TensorProto.FLOAT, name=p + "_cast")
    else:  # a type shape inference does not know: the RoIs' own, when the model runs
        cast = helper.make_node("CastLike", [bi, rois], [p + "_bf"], name=p + "_cast")
    return [
        cast,
        helper.make_node("Reshape", [p + "_bf", shape], [p + "_b"], name=p + "_reshape"),
        *_pad_columns(p + "_b", p + "_b5", 0, 4, opset, p + "_pad_b"),
        *_pad_columns(rois, p + "_r5", 1, 0, opset, p + "_pad_r"),
        helper.make_node("Add", [p + "_b5", p + "_r5"], [p + "_rois"], name=p + "_rows"),
        helper.make_node("RoIAlign", [x, p + "_rois"], list(node.output), name=node.name, domain="dcnkit",
                         output_size=[int(a.get("output_height", 1)), int(a.get("output_width", 1))],
                         spatial_scale=float(a.get("spatial_scale", 1.0)),
                         sampling_ratio=int(a.get("sampling_ratio", 0)),
                         aligned=int(ctm == "half_pixel"), pool_mode="avg"),
    ]


def _guarded_max_roi_align_nodes(node: Any, p: str, minus_two: str) -> list:
    """A max RoiAlign whose negative batch indices become -2: OpenVINO's ROIAlign raises for an index below -1 or at
    least N, and takes -1 as the end of the RoI list (the rest of its output left unwritten)."""
    from onnx import helper

    out = _copy_node(node)
    bi = node.input[2]
    out.input[2] = p + "_bi"
    return [
        helper.make_node("Less", [bi, minus_two + "_zero"], [p + "_neg"], name=p + "_less"),
        helper.make_node("Where", [p + "_neg", minus_two, bi], [p + "_bi"], name=p + "_where"),
        out,
    ]


def _copy_node(node: Any) -> Any:
    import onnx

    out = onnx.NodeProto()
    out.CopyFrom(node)
    return out


def rewrite_roi_align(model: Any) -> tuple[Any, int]:
    """(a copy of ``model`` with its standard ``avg`` RoiAlign nodes as ``dcnkit::RoIAlign``, nodes rewritten); the
    model itself when there is no RoiAlign. ``RoiAlign(X, rois (K, 4), batch_indices (K))`` becomes
    ``dcnkit::RoIAlign(X, rois5)`` with the (K, 5) rows [batch index, box] (:func:`_avg_roi_align_nodes`; the cast
    to the RoIs' float type: float16, float32, float64 models alike), with ``aligned`` from ``coordinate_transformation_mode``
    (``half_pixel``, opset 16's default: 1; ``output_half_pixel``: 0). A ``max`` RoiAlign stays OpenVINO's, its
    negative batch indices replaced by -2 so that OpenVINO refuses them (:func:`_guarded_max_roi_align_nodes`)."""
    import numpy as np
    import onnx

    from dcnkit.runtime.ort_rewrite import _walk

    if not any(_roi_align_mode(n) for _, n in _walk(model.graph)):
        return model, 0
    out = onnx.ModelProto()
    out.CopyFrom(model)
    opset = _default_opset(model)
    default_ctm = "half_pixel" if opset >= 16 else "output_half_pixel"
    types = _elem_types(out)
    graphs = {}
    for graph, node in _walk(out.graph):
        if _roi_align_mode(node):
            graphs.setdefault(id(graph), (graph, []))[1].append(node)
    rewritten = 0
    for k, (graph, nodes) in enumerate(graphs.values()):
        shape, minus_two = f"dcnkit_roi_shape_{k}", f"dcnkit_roi_minus_two_{k}"
        graph.initializer.extend([onnx.numpy_helper.from_array(np.array([-1, 1], "int64"), shape),
                                  onnx.numpy_helper.from_array(np.array(-2, "int64"), minus_two),
                                  onnx.numpy_helper.from_array(np.array(0, "int64"), minus_two + "_zero")])
        new_nodes = []
        for node in graph.node:
            mode = _roi_align_mode(node) if any(node is n for n in nodes) else None
            p = f"{node.name or node.output[0]}_dcnkit"
            if mode == "avg":
                new_nodes += _avg_roi_align_nodes(node, p, shape, opset, types.get(node.input[1]), default_ctm)
                rewritten += 1
            elif mode == "max":
                new_nodes += _guarded_max_roi_align_nodes(node, p, minus_two)
            else:
                new_nodes.append(node)
        del graph.node[:]
        graph.node.extend(new_nodes)
    if rewritten and not any(o.domain == "dcnkit" for o in out.opset_import):
        out.opset_import.append(onnx.helper.make_opsetid("dcnkit", 1))
    return out, rewritten


def _empty_value(node: Any) -> Any:
    """The tensor of a ``Constant`` node with a ``value`` of zero elements, else None."""
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
        return None
    value = next((a.t for a in node.attribute if a.name == "value" and a.HasField("t")), None)
    return value if value is not None and 0 in value.dims else None


def rewrite_empty_constants(model: Any) -> tuple[Any, int]:
    """(a copy of ``model`` whose subgraphs' empty ``Constant`` nodes are ``ConstantOfShape`` of their shape,
    nodes rewritten); the model itself when there is none (module docstring)."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    from dcnkit.runtime.ort_rewrite import _subgraphs, _walk

    def subgraph_nodes(m):
        return [(g, n) for top in m.graph.node for sub in _subgraphs(top) for g, n in _walk(sub)]

    if not any(_empty_value(n) is not None for _, n in subgraph_nodes(model)):
        return model, 0
    out = onnx.ModelProto()
    out.CopyFrom(model)
    rewritten = 0
    for graph, node in subgraph_nodes(out):
        value = _empty_value(node)
        if value is None:
            continue
        name = node.name or node.output[0]
        dims = helper.make_node("Constant", [], [f"{name}_dcnkit_dims"], name=f"{name}_dcnkit_dims",
                                value=numpy_helper.from_array(np.array(list(value.dims), np.int64)))
        fill = numpy_helper.from_array(np.zeros(1, helper.tensor_dtype_to_np_dtype(value.data_type)))
        new = helper.make_node("ConstantOfShape", [dims.output[0]], list(node.output), name=name, value=fill)
        at = next(i for i, n in enumerate(graph.node) if n is node)
        graph.node.remove(node)
        graph.node.insert(at, new)
        graph.node.insert(at, dims)
        rewritten += 1
    return out, rewritten


def prepare_onnx(model: Any, deform_conv: str = "auto") -> tuple[Any, int]:
    """(the model OpenVINO reads, standard DeformConv nodes moved to the kit's kernel): empty constants in subgraphs
    become ``ConstantOfShape`` (:func:`rewrite_empty_constants`), RoiAlign (avg) nodes always move to the kit's
    (:func:`rewrite_roi_align`); ``deform_conv``: ``"auto"`` and ``"kit"`` (every DeformConv node the kit can
    represent) or ``"openvino"`` (none)."""
    if deform_conv not in ("auto", "kit", "openvino"):
        raise ValueError(f"deform_conv: expected 'auto', 'kit' or 'openvino', got {deform_conv!r}")
    model, _ = rewrite_empty_constants(model)
    model, _ = rewrite_roi_align(model)
    if deform_conv == "openvino":
        return model, 0
    return rewrite_deform_conv(model)
