"""Reshapes that survive empty tensors: the exporter's rewrite of ``Reshape`` nodes whose ``-1`` cannot be inferred
when a dimension is zero.

ONNX's ``Reshape`` (``allowzero=0``) infers a ``-1`` entry as ``numel / product of the other entries``, a ``0`` entry
copying the input's dimension. With zero elements that is 0 / 0: ``x.reshape(n, -1)`` of a ``(0, 16)`` tensor fails
in ONNX Runtime ("Input shape:{0,16}, requested shape:{0,-1}") and in the reference runner. Exporters write such
reshapes wherever PyTorch code guards them with Python control flow that tracing bakes in: torchvision's box decoding
(``if box_sum > 0: rel_codes = rel_codes.reshape(box_sum, -1)``), traced on an image with proposals, runs the reshape
on an image without any. So a detector exported on an example image failed on an image that yields no proposals.

Entries computed in the graph fail too without a ``-1``: ONNX Runtime's own graph optimizer (its Reshape fusion) turns
a target made of the input's dimensions (``x.view(x.shape[0], x.shape[1], -1)`` as torchvision's heads write it, traced
into ``Shape``/``Gather``/``Concat``) back into ``[0, 0, -1]``, which then meets the same 0 / 0.

The rewrite, for every ``Reshape`` with an entry that can be 0 (a ``0``, or a value computed in the graph), at most one
``-1`` at a position known when exporting, and an input whose shape is not known to be non-empty (with
``allowzero=1`` only when there is a ``-1``, which torch's dynamo exporter writes next to computed sizes although ONNX
leaves that combination undefined):

- ``[0, -1]`` (a constant, allowzero 0): ``Flatten(axis=1)``, which is exactly that reshape for every input;
- otherwise explicit shape arithmetic: the ``0`` entries (allowzero 0) replaced by the input's dimensions, the ``-1`` by
  ``numel / product of the other entries`` when the input has elements (ONNX's own rule, so nothing changes for
  non-empty inputs) or, when it has none, by the product of the input's dimensions from the ``-1``'s position on
  divided by the product of the entries after it (``(0, 16)`` to ``[0, -1]`` gives ``(0, 16)``; ``(0, 20)`` to
  ``[0, -1, 4]`` gives ``(0, 5, 4)``): the size the dimension has for non-empty inputs whenever the entries before the
  ``-1`` copy the input's leading dimensions, which is how such code reshapes. Then ``Reshape(allowzero=1)`` on those
  explicit sizes, which no optimizer turns back into copies.
"""
from __future__ import annotations

from typing import Any

__all__ = ["rewrite_empty_reshapes"]

_INT64_MAX = 2**63 - 1


def _constants(graph: Any) -> dict[str, Any]:
    from onnx import numpy_helper

    out = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            for a in n.attribute:
                if a.name == "value":
                    out[n.output[0]] = numpy_helper.to_array(a.t)
                elif a.name == "value_ints":
                    import numpy as np

                    out[n.output[0]] = np.asarray(list(a.ints), np.int64)
                elif a.name == "value_int":
                    import numpy as np

                    out[n.output[0]] = np.asarray(a.i, np.int64)
    return out


def _length(name: str, shapes: dict[str, tuple], consts: dict[str, Any]) -> int | None:
    if name in consts:
        return int(consts[name].size)
    dims = shapes.get(name)
    if dims is not None and len(dims) == 1 and isinstance(dims[0], int):
        return dims[0]
    return None


def _entries(name: str, producers: dict, shapes: dict, consts: dict) -> list | None:
    """The target shape's entries: an int where known when exporting, None where computed; None when its length is
    not known."""
    if name in consts:
        return [int(v) for v in consts[name].reshape(-1)]
    node = producers.get(name)
    if node is not None and node.op_type == "Concat" and node.domain in ("", "ai.onnx"):
        out: list = []
        for piece in node.input:
            if piece in consts:
                out += [int(v) for v in consts[piece].reshape(-1)]
                continue
            n = _length(piece, shapes, consts)
            if n is None:
                return None
            out += [None] * n
        return out
    n = _length(name, shapes, consts)
    return None if n is None else [None] * n


def _shapes(model: Any) -> dict[str, tuple]:
    """Each value's dims from ONNX shape inference (an int where known, else None); {} when inference fails."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - no shapes: every dimension unknown (then every candidate is rewritten)
        return {}
    out = {}
    g = inferred.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        t = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and t.HasField("shape"):
            out[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
    return out


def _can_be_empty(dims: tuple | None) -> bool:
    return dims is None or any(d is None or d == 0 for d in dims)


class _Builder:
    """New nodes and constants for one graph, named after the node they replace."""

    def __init__(self, graph: Any, prefix: str):
        self.graph, self.prefix, self.nodes, self.count = graph, prefix, [], 0

    def name(self) -> str:
        self.count += 1
        return f"{self.prefix}_ez{self.count}"

    def const(self, values) -> str:
        import numpy as np
        from onnx import numpy_helper

        name = self.name()
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(values, np.int64), name))
        return name

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        from onnx import helper

        out = self.name()
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out


def _explicit_shape(b: _Builder, x: str, s: str, length: int, p: int | None, copy_zeros: bool) -> str:
    shape_x = b.op("Shape", x)
    s_eff = s
    if copy_zeros:  # allowzero 0: the 0 entries copy the input's dimensions
        zero = b.const([0])
        padded = b.op("Slice", b.op("Concat", shape_x, b.const([1] * length), axis=0), zero, b.const([length]))
        s_eff = b.op("Where", b.op("Equal", s, zero), padded, s)
    if p is None:  # no -1: the copies made explicit are all (no constant is made that no node reads)
        return s_eff
    one, zero, minus_one = b.const([1]), b.const([0]), b.const([-1])
    is_fill = b.op("Equal", s, minus_one)
    numel = b.op("ReduceProd", shape_x, keepdims=1)
    known = b.op("ReduceProd", b.op("Where", is_fill, one, s_eff), keepdims=1)
    exact = b.op("Div", numel, b.op("Max", known, one))
    tail = b.op("ReduceProd", b.op("Slice", shape_x, b.const([p]), b.const([_INT64_MAX])), keepdims=1)
    after = b.op("ReduceProd", b.op("Slice", s_eff, b.const([p + 1]), b.const([_INT64_MAX])), keepdims=1)
    guess = b.op("Div", tail, b.op("Max", after, one))
    fill = b.op("Where", b.op("Equal", numel, zero), guess, exact)
    return b.op("Where", is_fill, fill, s_eff)


def _rewrite_graph(graph: Any, shapes: dict, opset: int) -> int:
    from onnx import helper

    consts = _constants(graph)
    producers = {o: n for n in graph.node for o in n.output}
    new_nodes, rewritten = [], 0
    for node in graph.node:
        for a in node.attribute:  # subgraphs first (their own constants and producers)
            if a.HasField("g"):
                rewritten += _rewrite_graph(a.g, shapes, opset)
            for g in a.graphs:
                rewritten += _rewrite_graph(g, shapes, opset)
        allowzero = next((a.i for a in node.attribute if a.name == "allowzero"), 0)
        if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            new_nodes.append(node)
            continue
        x, s = node.input[0], node.input[1]
        entries = _entries(s, producers, shapes, consts)
        fills = [i for i, e in enumerate(entries or []) if e == -1]
        # allowzero 1 with a -1 and a 0 is not valid ONNX, yet torch's dynamo exporter writes it for computed sizes
        others_may_be_zero = entries is not None and any(e is None or e == 0 for e in entries if e != -1)
        if (entries is None or len(fills) > 1 or not others_may_be_zero or (allowzero and not fills)
                or not _can_be_empty(shapes.get(x))):
            new_nodes.append(node)
            continue
        b = _Builder(graph, node.name or node.output[0])
        if entries == [0, -1] and not allowzero:
            b.nodes.append(helper.make_node("Flatten", [x], list(node.output), name=b.name(), axis=1))
        else:
            target = _explicit_shape(b, x, s, len(entries), fills[0] if fills else None, copy_zeros=not allowzero)
            b.nodes.append(helper.make_node("Reshape", [x, target], list(node.output), name=b.name(),
                                            allowzero=1 if opset >= 14 else 0))
        new_nodes += b.nodes
        rewritten += 1
    if rewritten:
        del graph.node[:]
        graph.node.extend(new_nodes)
    return rewritten


def rewrite_empty_reshapes(model: Any) -> int:
    """Rewrites, in place, the ``Reshape`` nodes of ``model`` (an ``onnx.ModelProto``) that would fail on empty
    tensors (module docstring); returns how many. Exact for every non-empty input."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 14:  # Reshape's allowzero (explicit zero sizes) came with opset 14
        return 0
    return _rewrite_graph(model.graph, _shapes(model), opset)
