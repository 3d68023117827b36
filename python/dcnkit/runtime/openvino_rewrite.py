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


def rewrite_roi_align(model: Any) -> tuple[Any, int]:
    """(a copy of ``model`` with its standard ``avg`` RoiAlign nodes as ``dcnkit::RoIAlign``, nodes rewritten); the
    model itself when there is none. ``RoiAlign(X, rois (K, 4), batch_indices (K))`` becomes
    ``dcnkit::RoIAlign(X, Concat(Reshape(Cast(batch_indices), [-1, 1]), rois))`` with ``aligned`` from
    ``coordinate_transformation_mode`` (``half_pixel``, opset 16's default: 1; ``output_half_pixel``: 0)."""
    import onnx
    from onnx import helper

    from dcnkit.runtime.ort_rewrite import _walk

    def wanted(n):
        if n.op_type != "RoiAlign" or n.domain not in ("", "ai.onnx"):
            return False
        mode = next((helper.get_attribute_value(a) for a in n.attribute if a.name == "mode"), b"avg")
        return (mode.decode() if isinstance(mode, bytes) else mode) == "avg"

    if not any(wanted(n) for _, n in _walk(model.graph)):
        return model, 0
    out = onnx.ModelProto()
    out.CopyFrom(model)
    default_ctm = "half_pixel" if _default_opset(model) >= 16 else "output_half_pixel"
    graphs = {}
    for graph, node in _walk(out.graph):
        if wanted(node):
            graphs.setdefault(id(graph), (graph, []))[1].append(node)
    rewritten = 0
    for graph, nodes in graphs.values():
        shape = f"dcnkit_roi_shape_{rewritten}"
        graph.initializer.append(onnx.numpy_helper.from_array(__import__("numpy").array([-1, 1], "int64"), shape))
        new_nodes = []
        for node in graph.node:
            if not any(node is n for n in nodes):
                new_nodes.append(node)
                continue
            a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
            ctm = a.get("coordinate_transformation_mode", default_ctm.encode())
            ctm = ctm.decode() if isinstance(ctm, bytes) else ctm
            x, rois, bi = node.input[:3]
            p = f"{node.name or node.output[0]}_dcnkit"
            new_nodes += [
                helper.make_node("Cast", [bi], [p + "_bf"], to=onnx.TensorProto.FLOAT, name=p + "_cast"),
                helper.make_node("Reshape", [p + "_bf", shape], [p + "_b"], name=p + "_reshape"),
                helper.make_node("Concat", [p + "_b", rois], [p + "_rois"], axis=1, name=p + "_concat"),
                helper.make_node("RoIAlign", [x, p + "_rois"], list(node.output), name=node.name, domain="dcnkit",
                                 output_size=[int(a.get("output_height", 1)), int(a.get("output_width", 1))],
                                 spatial_scale=float(a.get("spatial_scale", 1.0)),
                                 sampling_ratio=int(a.get("sampling_ratio", 0)),
                                 aligned=int(ctm == "half_pixel"), pool_mode="avg"),
            ]
            rewritten += 1
        del graph.node[:]
        graph.node.extend(new_nodes)
    if not any(o.domain == "dcnkit" for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid("dcnkit", 1))
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
