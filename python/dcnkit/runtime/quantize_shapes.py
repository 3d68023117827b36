"""Shape inference that knows the kit's operators, and the values of shape arithmetic, for the quantizer's
pre-processing (:mod:`dcnkit.runtime.quantize_prep`).

ONNX's shape inference stops at a node of a custom domain (everything after it has no shape), and ONNX Runtime's
symbolic shape inference (``quant_pre_process``'s first step) does too, and can run for many minutes on a detector
(sympy simplifying data-dependent sizes). :func:`infer` walks the graph once, in order:

- a node of the kit (every name of every op of the op table, ``dcnkit.op_defs()``) gets its output shapes from the
  op's declaration (``dcnkit._lib.op_output_dims``: the rules every backend uses, unknown dims kept), the quantized
  ``dcnkit::QDeformConv2d`` from its rule here;
- a standard node gets ONNX's shape inference of that node alone, on its inputs' shapes and on the values of the
  small integer tensors computed so far (so a Reshape to a computed shape has a shape);
- shape arithmetic (Shape, Gather, Slice, Concat, Add, Div, ...) is evaluated on integers, element by element, an
  unknown (dynamic) dimension staying unknown: ``Shape(x)[1]`` of an ``(N, 27, H, W)`` tensor is 27 whatever N is.

Work is linear in the number of nodes (one small inference per standard node). Dimensions are ints, strings (a
named dynamic dimension) or None (unknown); values are lists of ints or None.
"""
from __future__ import annotations

import numpy as np

__all__ = ["infer", "value_info", "KIT_SHAPE_RULES", "SHAPE_OPS"]


def _qdeform(s, a):
    """dcnkit::QDeformConv2d (x, offset, mask, weight, ...): (input's N, weight's Cout, the offsets' Ho, Wo)."""
    return [s(0)[0], s(3)[0], s(1)[2], s(1)[3]]


# (domain, op type) -> (rule(shape_of, attrs) -> output dims, index of the input whose element type the output has):
# the nodes the op table does not declare (every other kit node: _declared).
KIT_SHAPE_RULES = {("dcnkit", "QDeformConv2d"): (_qdeform, 0)}

_ATTR_KINDS = {1: "float", 2: "int", 3: "string", 6: "floats", 7: "ints"}  # AttributeProto.AttributeType


def _declared() -> dict:
    """(domain, op type) -> the node input whose element type the outputs have (the op's feature map), for every name
    of every op of the table (ONNX's own domain also as "ai.onnx"); empty without the native library."""
    from dcnkit import op_defs

    try:
        table = op_defs()
    except (FileNotFoundError, OSError):
        return {}
    out = {}
    for op in table["ops"]:
        features = next((i for i, t in enumerate(op["inputs"]) if not t["rois"] and not t["int64"]), 0)
        for v in op.get("variants", []):
            if v["tensorrt_only"]:
                continue
            pos = next((k for k, slot in enumerate(v["inputs"]) if slot["canonical"] == features), 0)
            for domain in (v["domain"], "ai.onnx") if v["domain"] == "" else (v["domain"],):
                out[(domain, v["op_type"])] = pos
    return out


# Shape arithmetic evaluated on integers (outputs of rank 0 or 1).
SHAPE_OPS = {"Shape", "Size", "Gather", "Slice", "Concat", "Unsqueeze", "Squeeze", "Reshape", "Identity", "Cast",
             "Add", "Sub", "Mul", "Div", "Max", "Min", "Neg", "Abs"}
_SMALL = 64  # integer tensors up to this many elements are tracked as values


def _dims(type_proto):
    t = type_proto.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]


class _Walk:
    """The state of :func:`infer`: elem types, dims and small integer values of the tensors known so far."""

    def __init__(self, model):
        from onnx import numpy_helper

        self.model = model
        self.types, self.dims, self.values = {}, {}, {}
        for i in model.graph.input:
            self.types[i.name], self.dims[i.name] = i.type.tensor_type.elem_type, _dims(i.type)
        for t in model.graph.initializer:
            self.types[t.name], self.dims[t.name] = t.data_type, list(t.dims)
            if len(t.dims) <= 1 and np.prod(t.dims, dtype=np.int64) <= _SMALL and t.data_type in (6, 7):
                self.values[t.name] = [int(v) for v in numpy_helper.to_array(t).ravel()]

    def shape_of(self, node, i):
        if i >= len(node.input) or not node.input[i] or self.dims.get(node.input[i]) is None:
            raise KeyError(i)
        return self.dims[node.input[i]]

    def kit_node(self, node, entry):
        from onnx import helper

        rule, type_input = entry
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        try:
            dims = rule(lambda i: self.shape_of(node, i), attrs)
        except (KeyError, IndexError, TypeError, ValueError):
            return
        self.types[node.output[0]] = self.types.get(node.input[type_input], 0)
        self.dims[node.output[0]] = dims

    def declared_node(self, node, type_input):
        """Output dims from the op's declaration; unknown where it cannot say (an inconsistent node included)."""
        from onnx import helper

        from dcnkit._lib import op_output_dims

        attrs = []
        for a in node.attribute:
            if a.type in _ATTR_KINDS:
                v = helper.get_attribute_value(a)
                attrs.append([a.name, _ATTR_KINDS[a.type], v.decode() if isinstance(v, bytes) else list(v)
                              if isinstance(v, (list, tuple)) else v])
        inputs = [self.dims.get(name) if name else None for name in node.input]
        try:
            outputs = op_output_dims(f"{node.domain}::{node.op_type}", attrs, inputs, [])
        except ValueError:
            return
        for name, dims in zip(node.output, outputs or []):
            if name and dims is not None:
                self.types[name] = self.types.get(node.input[type_input], 0) if type_input < len(node.input) else 0
                self.dims[name] = dims

    def standard_node(self, node, opsets):
        """ONNX's inference of this node alone; integer values where the node is shape arithmetic."""
        import onnx
        from onnx import helper

        if any(a.type in (5, 10) for a in node.attribute):  # subgraphs (If, Loop, Scan): not followed
            return
        ins, inits = [], []
        for name in node.input:
            if not name:
                continue
            if name not in self.types:
                return
            if name in self.values and None not in self.values[name] and self.dims[name] is not None:
                dtype = helper.tensor_dtype_to_np_dtype(self.types[name])
                inits.append(onnx.numpy_helper.from_array(
                    np.asarray(self.values[name], dtype).reshape(self.dims[name]), name))
            ins.append(helper.make_tensor_value_info(name, self.types[name], self.dims[name]))
        graph = helper.make_graph([node], "node", ins, [helper.make_value_info(o, onnx.TypeProto())
                                                        for o in node.output if o], inits)
        try:
            out = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=opsets,
                                                                      ir_version=self.model.ir_version))
        except Exception:  # noqa: BLE001 - an inconsistent node: its outputs stay unknown
            return
        for o in out.graph.output:
            if o.type.tensor_type.elem_type:
                self.types[o.name], self.dims[o.name] = o.type.tensor_type.elem_type, _dims(o.type)
        if node.op_type in SHAPE_OPS and len(node.output) == 1:
            value = _evaluate(node, self)
            dims = self.dims.get(node.output[0])
            if value is not None and dims is not None and len(dims) <= 1 and \
                    (not dims or dims[0] in (len(value), None)) and len(value) <= _SMALL:
                if not dims or dims[0] is None:
                    self.dims[node.output[0]] = [len(value)] if dims else []
                self.values[node.output[0]] = value


def _attr(node, name, default=None):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _binary(op, a, b):
    if a is None or b is None:
        return None
    if op == "Add":
        return a + b
    if op == "Sub":
        return a - b
    if op == "Mul":
        return a * b
    if op == "Div":
        return None if b == 0 else (abs(a) // abs(b)) * (1 if (a >= 0) == (b >= 0) else -1)  # C: toward zero
    return max(a, b) if op == "Max" else min(a, b)


def _evaluate(node, w):
    """The integer value (a list; rank 0 or 1) of a shape-arithmetic node's output, or None."""
    op = node.op_type
    val = [w.values.get(i) if i else None for i in node.input]
    if op == "Shape":
        dims = w.dims.get(node.input[0])
        if dims is None:
            return None
        return [d if isinstance(d, int) else None for d in dims[_attr(node, "start", 0):_attr(node, "end")]]
    if op == "Size":
        dims = w.dims.get(node.input[0])
        return [int(np.prod(dims))] if dims is not None and all(isinstance(d, int) for d in dims) else None
    if not val or val[0] is None:
        return None
    if op in ("Identity", "Unsqueeze", "Squeeze", "Reshape"):
        return val[0]
    if op == "Cast":
        return val[0] if _attr(node, "to") in (6, 7) else None
    if op in ("Neg", "Abs"):
        return [None if v is None else (-v if op == "Neg" else abs(v)) for v in val[0]]
    if op == "Gather":
        if _attr(node, "axis", 0) != 0 or len(val) < 2 or val[1] is None or None in val[1] or \
                len(w.dims.get(node.input[0]) or []) != 1:
            return None
        n = len(val[0])
        if any(not -n <= i < n for i in val[1]):
            return None
        return [val[0][i] for i in val[1]]
    if op == "Slice":
        if len(w.dims.get(node.input[0]) or []) != 1:
            return None
        if len(node.input) >= 3:
            starts, ends = val[1], val[2]
            steps = val[4] if len(val) > 4 and node.input[4] else [1]
        else:  # opset < 10: attributes
            starts, ends, steps = _attr(node, "starts"), _attr(node, "ends"), [1]
        if starts is None or ends is None or steps is None or None in starts + ends + steps or len(starts) != 1:
            return None
        return val[0][slice(starts[0], ends[0], steps[0])]
    if op == "Concat":
        if None in val or any(len(w.dims.get(i) or []) != 1 for i in node.input):
            return None
        return [v for part in val for v in part]
    if op in ("Add", "Sub", "Mul", "Div", "Max", "Min"):
        if len(val) != 2 or val[1] is None:
            return None
        a, b = val
        if len(a) != len(b) and 1 not in (len(a), len(b)):
            return None
        n = max(len(a), len(b))
        a, b = (a * n if len(a) == 1 else a), (b * n if len(b) == 1 else b)
        return [_binary(op, x, y) for x, y in zip(a, b)]
    return None


def infer(model) -> _Walk:
    """Types, dims and integer values of ``model``'s tensors (``.types``, ``.dims``, ``.values``: name ->
    elem type, list of dims, list of ints or None), by one walk over its nodes (see the module docstring)."""
    from onnx import helper

    walk = _Walk(model)
    declared = _declared()
    opsets = [helper.make_opsetid(o.domain, o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")]
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            walk.standard_node(node, opsets)
            t = _attr(node, "value")
            if t is not None and t.data_type in (6, 7) and len(t.dims) <= 1:
                from onnx import numpy_helper

                values = [int(v) for v in numpy_helper.to_array(t).ravel()]
                if len(values) <= _SMALL:
                    walk.values[node.output[0]] = values
            continue
        entry = KIT_SHAPE_RULES.get((node.domain, node.op_type))
        if entry is not None:
            walk.kit_node(node, entry)
        elif (node.domain, node.op_type) in declared:
            walk.declared_node(node, declared[(node.domain, node.op_type)])
        elif node.domain in ("", "ai.onnx"):
            walk.standard_node(node, opsets)
    return walk


def value_info(walk, model) -> list:
    """``ValueInfoProto``s of the inferred tensors that are neither graph inputs nor outputs nor initializers."""
    from onnx import helper

    skip = {i.name for i in model.graph.input} | {o.name for o in model.graph.output} | \
        {t.name for t in model.graph.initializer}
    return [helper.make_tensor_value_info(n, t, walk.dims.get(n)) for n, t in walk.types.items()
            if n not in skip and t]
