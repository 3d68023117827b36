"""Standard ``DeformConv`` nodes onto the kit's ``dcnkit::DeformConv2d`` kernel, in memory.

``torch.onnx.export`` writes deformable convolution as the standard ONNX ``DeformConv`` (opset 19), which ONNX
Runtime runs on its built-in kernel. The kit's ``DeformConv2d`` computes the same function (docs/operators.md: same offset
layout, same corner sampling, same mask placement) faster, so :func:`dcnkit.runtime.ort_session` rewrites such
nodes before it builds the session; the model file is not touched.

The rewrite is exact: ``DeformConv(X, W, offset[, B][, mask])`` with ``strides``, ``pads`` ``[t, l, b, r]``,
``dilations``, ``group``, ``offset_group`` becomes ``dcnkit::DeformConv2d(X, offset, W[, B][, mask])`` with
``stride``, ``padding`` ``[t, l]``, ``dilation``, ``groups``, ``deformable_groups`` (input order and attribute
names from the kit's op table, ``dcnkit.op_defs()``), plus ``plugin_namespace`` as on every node the exporter
writes. A node is left as it is when the kit cannot represent it: not 2-D, or asymmetric padding
(``pads[0] != pads[2]`` or ``pads[1] != pads[3]``). Nodes in subgraphs (``If``/``Loop``/``Scan`` bodies) are
rewritten too.

Which nodes (``ort_session``'s default on the CPU execution provider): every node the kit can represent, whatever its
shape. The kit's kernel in ONNX Runtime takes at most ONNX Runtime's built-in ``DeformConv`` time on every measured
layer shape, from 7x7 to 84x84 maps (docs/performance.md: its weight is packed once per session for its GEMM), and
keeps the operator contract of docs/operators.md at the map's border (tests/test_ort_border_contract.py): ONNX
Runtime's built-in kernel (1.26 and later) reads a sampling point's neighbours outside the map with weight 0, so an
infinite input next to the map's edge makes border outputs NaN (0 x Inf) where the kit's kernel and torchvision give
finite values.
"""
from __future__ import annotations

import functools
from typing import Any

__all__ = ["rewrite_deform_conv", "count_deform_conv"]

_STANDARD_DOMAINS = ("", "ai.onnx")
_STANDARD_OP = "DeformConv"


@functools.lru_cache(maxsize=None)
def _kit_table() -> tuple[str, int, str, tuple[str, ...], tuple[str, ...]]:
    """(domain, opset, op type, input names, attribute names) of the kit's deform_conv2d, from the C++ table."""
    from dcnkit._lib import op_defs

    table = op_defs()
    for d in table["ops"]:
        if d["name"] == "deform_conv2d":
            return (
                table["domain"],
                int(table["opset"]),
                d["onnx_type"],
                tuple(t["name"] for t in d["inputs"]),
                tuple(a["name"] for a in d["attrs"]),
            )
    raise RuntimeError("dcnkit: the op table has no deform_conv2d")  # pragma: no cover


def _is_standard(node: Any) -> bool:
    return node.op_type == _STANDARD_OP and node.domain in _STANDARD_DOMAINS


def _subgraphs(node: Any):
    import onnx

    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def _walk(graph: Any):
    """Every node of ``graph`` and of its subgraphs, with the graph that holds it."""
    for node in graph.node:
        yield graph, node
        for g in _subgraphs(node):
            yield from _walk(g)


def count_deform_conv(model: Any) -> int:
    """Number of standard ``DeformConv`` nodes in ``model`` (an ``onnx.ModelProto``), subgraphs included."""
    return sum(1 for _, n in _walk(model.graph) if _is_standard(n))


def _attr_values(node: Any) -> dict[str, Any]:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _kit_attrs(node: Any) -> dict[str, Any] | None:
    """The kit's attributes for a standard DeformConv node, or None when the kit cannot represent it."""
    a = _attr_values(node)
    strides = list(a.get("strides", [1, 1]))
    dilations = list(a.get("dilations", [1, 1]))
    pads = list(a.get("pads", [0, 0, 0, 0]))
    kernel = a.get("kernel_shape")
    if len(strides) != 2 or len(dilations) != 2 or len(pads) != 4 or (kernel is not None and len(kernel) != 2):
        return None  # not a 2-D convolution
    if pads[0] != pads[2] or pads[1] != pads[3]:
        return None  # asymmetric padding: the kit pads symmetrically
    _, _, _, _, names = _kit_table()
    values = [strides, pads[:2], dilations, int(a.get("group", 1)), int(a.get("offset_group", 1))]
    if len(names) != len(values):  # pragma: no cover - the table and this mapping must agree
        raise RuntimeError(f"dcnkit: DeformConv2d attributes {names} do not match the DeformConv mapping")
    return dict(zip(names, values))


def _kernel_shape_conflicts(node: Any, initializers: dict[str, Any]) -> bool:
    """True when ``kernel_shape`` disagrees with a weight initializer (ONNX Runtime rejects such a node)."""
    kernel = _attr_values(node).get("kernel_shape")
    w = initializers.get(node.input[1]) if len(node.input) > 1 else None
    return kernel is not None and w is not None and len(w.dims) == 4 and list(w.dims[2:]) != list(kernel)


def _kit_node(node: Any, attrs: dict[str, Any], domain: str, op_type: str, input_names: tuple[str, ...]) -> Any:
    import onnx

    std = list(node.input) + [""] * (5 - len(node.input))
    x, w, offset, bias, mask = std[:5]
    by_name = {"input": x, "offset": offset, "weight": w, "bias": bias, "mask": mask}
    inputs = [by_name[n] for n in input_names]
    while inputs and not inputs[-1]:
        inputs.pop()  # trailing absent optional inputs are left out, inner ones stay empty
    return onnx.helper.make_node(
        op_type, inputs, list(node.output), name=node.name, domain=domain, plugin_namespace=domain, **attrs
    )


def _output_sizes(model: Any) -> dict[str, tuple]:
    """(Ho, Wo) of every 4-D tensor whose shape ONNX shape inference finds (a None for a symbolic size), by name."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - no shapes (e.g. a model over 2 GiB): every size unknown
        return {}
    sizes = {}

    def collect(graph):
        for vi in list(graph.value_info) + list(graph.output):
            dims = vi.type.tensor_type.shape.dim if vi.type.HasField("tensor_type") else []
            if len(dims) == 4:
                sizes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in dims[2:])
        for node in graph.node:
            for g in _subgraphs(node):
                collect(g)

    collect(inferred.graph)
    return sizes


def rewrite_deform_conv(model: Any, rule=None) -> tuple[Any, int]:
    """(a copy of ``model`` with its standard ``DeformConv`` nodes as ``dcnkit::DeformConv2d``, nodes rewritten).

    ``model`` (an ``onnx.ModelProto``) is not modified. With no node to rewrite the model itself is returned.
    ``rule``: None rewrites every node the kit can represent; else a callable given each node's output map size
    (Ho, Wo) (None, or a None size, where shape inference does not know it), and only nodes for which it returns
    True are rewritten (``ort_session`` passes none: every node).
    """
    import onnx

    if rule is not None and not callable(rule):
        raise TypeError(f"rewrite_deform_conv: rule: expected a callable or None, got {type(rule).__name__}")
    if count_deform_conv(model) == 0:
        return model, 0
    sizes = _output_sizes(model) if rule is not None else {}
    domain, opset, op_type, input_names, _ = _kit_table()
    out = onnx.ModelProto()
    out.CopyFrom(model)
    rewritten = 0
    for graph, node in list(_walk(out.graph)):
        if not _is_standard(node):
            continue
        attrs = _kit_attrs(node)
        if attrs is None or _kernel_shape_conflicts(node, {t.name: t for t in graph.initializer}):
            continue
        if rule is not None and not rule(sizes.get(node.output[0])):
            continue
        node.CopyFrom(_kit_node(node, attrs, domain, op_type, input_names))
        rewritten += 1
    if rewritten and not any(o.domain == domain for o in out.opset_import):
        out.opset_import.append(onnx.helper.make_opsetid(domain, opset))
    return (out, rewritten) if rewritten else (model, 0)
