"""Reduced precision for strongly typed TensorRT networks: an ONNX model's float32 tensors as float16 / bfloat16.

TensorRT 11 builds strongly typed networks only (its FP16/BF16 builder flags are gone): the precision of every
layer follows the types written in the ONNX file. :func:`convert_float_tensors` rewrites a float32 model into one
float type, the kit's ``dcnkit``-domain nodes included, so the plugins see float16 (or bfloat16) features, weights
and offsets, **but float32 RoIs**:

- float32 initializers, ``Constant`` / ``ConstantOfShape`` values, ``Cast(to=FLOAT)`` targets and value infos
  become the target type (initializers are clipped to the target's finite range first);
- graph inputs and outputs stay float32 by default (``keep_io_types``): a ``Cast`` follows each float input and
  precedes each float output, and nodes inside the graph use the converted tensor (also where a graph output
  is consumed by later nodes);
- an input or output of a node whose ONNX schema does not accept the target type (``Resize`` scales,
  ``Range``, ``NonMaxSuppression``...) stays float32, with a ``Cast`` around it. The schemas decide, so the result
  passes ``onnx.checker`` wherever the original did.
- the RoI input of every RoI operator the plugins run (the inputs the op table marks ``rois``, under the kit's
  names and the names mmcv / mmdeploy export) stays float32 (a float16 box coordinate steps by 1 px above
  1024 px: boxes move and FPN levels flip). A float32 graph input or initializer feeds it as it is. RoIs computed inside the graph are computed in float32: the nodes of box
  arithmetic and data movement (``_BOX_OPS``: Add, Mul, Concat, Gather, Reshape, Constant...) that lead to a RoI
  input stay float32, with a ``Cast`` to float32 where a converted tensor (a Conv's deltas) enters them and a
  ``Cast`` to the target type where one of their results leaves for a converted node. ONNX's own ``RoiAlign``
  takes its RoIs in the type of its features (its schema), so those follow the features.
- multi-scale deformable attention's sampling locations and attention weights (the inputs the op table marks
  ``cast``: the eager op casts them to the value's type) stay float32, and so does the arithmetic that computes them
  (the same box arithmetic, ``Softmax`` and ``Sigmoid``): a float16 location steps by 1/2048 of the map near its edge, a
  whole pixel on a 2048-wide level. The kernel takes one floating type, so such a node runs in float32 as a whole
  (its value cast to float32, its output back to the target type).

Polygraphy's ``ConvertToFp16`` (onnxconverter-common) is not used: it has no bfloat16, and with ``keep_io_types``
a graph output that later nodes consume feeds them float32, so a model leaves it with mixed float types.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

_FLOAT = 1  # onnx.TensorProto.FLOAT
_TARGETS = {"float16": 10, "bfloat16": 16}  # TensorProto.FLOAT16 / BFLOAT16
_TYPE_NAMES = {10: "tensor(float16)", 16: "tensor(bfloat16)"}


@dataclass
class ConversionReport:
    """What :func:`convert_float_tensors` changed (for the build log)."""

    dtype: str
    initializers: int = 0
    clipped: int = 0
    constants: int = 0
    casts: int = 0
    kept_float32: list = field(default_factory=list)  # "op_type name: input/output i"

    def summary(self) -> str:
        text = (f"converted to {self.dtype}: {self.initializers} initializers ({self.clipped} values clipped to the "
                f"{self.dtype} range), {self.constants} constants, {self.casts} casts inserted")
        if self.kept_float32:
            text += (f"; kept float32 (RoIs, deformable attention's locations and weights with its node, and where the "
                     f"ONNX schema requires it): {', '.join(self.kept_float32)}")
        return text


def _np_target(dtype: str):
    if dtype == "float16":
        return np.float16
    import ml_dtypes

    return ml_dtypes.bfloat16


def _convert_tensor(t, dtype: str, report: ConversionReport | None):
    """A float32 TensorProto as the target type (clipped to its finite range); other tensors unchanged."""
    from onnx import numpy_helper

    if t.data_type != _FLOAT:
        return t
    a = numpy_helper.to_array(t)
    limit = float(np.finfo(np.float16).max) if dtype == "float16" else float(np.finfo(np.float32).max)
    finite = np.isfinite(a)
    clipped = np.clip(a, -limit, limit)
    if report is not None:
        report.clipped += int(np.count_nonzero(finite & (clipped != a)))
    out = numpy_helper.from_array(clipped.astype(_np_target(dtype)), t.name)
    out.doc_string = t.doc_string
    return out


def _allowed(schema, formal) -> set[str]:
    for c in schema.type_constraints:
        if c.type_param_str == formal.type_str:
            return set(c.allowed_type_strs)
    return {formal.type_str}


def _float32_only(node, opset: dict, target: int) -> tuple[set[int], set[int]]:
    """Indices of the node's inputs / outputs that must stay float32 by its ONNX schema (none if unknown)."""
    import onnx.defs

    domain = node.domain if node.domain not in ("", "ai.onnx") else ""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset.get(domain, opset.get("", 1)), domain)
    except Exception:  # unknown op: a plugin node without a registered schema; convert it like the rest
        return set(), set()
    want = _TYPE_NAMES[target]

    def fixed(formals, count):
        out = set()
        for i in range(count):
            if not formals:
                break
            f = formals[min(i, len(formals) - 1)]
            allowed = _allowed(schema, f)
            if "tensor(float)" in allowed and want not in allowed:
                out.add(i)
        return out

    return fixed(list(schema.inputs), len(node.input)), fixed(list(schema.outputs), len(node.output))


def _roi_positions() -> tuple[dict[str, tuple], dict[str, tuple]]:
    """Where the inputs that stay float32 are, from every variant's input order in the op table: (the kit's op type,
    another tool's op type (mmcv's / mmdeploy's names, any domain)) -> (RoI input positions, location / weight input
    positions: the inputs marked ``rois`` and ``cast``)."""
    from dcnkit import op_defs

    table = op_defs()
    kit: dict[str, tuple] = {}
    other: dict[str, tuple] = {}
    for op in table["ops"]:
        rois = {i for i, t in enumerate(op["inputs"]) if t.get("rois")}
        coords = {i for i, t in enumerate(op["inputs"]) if t.get("cast")}
        if not rois and not coords:
            continue
        for v in op.get("variants", []):
            where = {s["canonical"]: pos for pos, s in enumerate(v["inputs"])}
            found = ({where[i] for i in rois if i in where}, {where[i] for i in coords if i in where})
            (kit if v["domain"] == table["domain"] else other)[v["op_type"]] = found
    return kit, other


def _roi_input(node, positions: tuple[dict, dict], domain: str) -> tuple[set[int], set[int]]:
    """(RoI input positions, location / weight input positions) of a node of the plugins' operators."""
    kit, other = positions
    found = kit.get(node.op_type) if node.domain == domain else other.get(node.op_type)
    if found is None:
        return set(), set()
    return tuple({p for p in part if p < len(node.input)} for part in found)


# Box arithmetic and data movement: the nodes computing RoIs from anchors and deltas (decoding, clipping, scaling,
# concatenating batch indices) stay float32 when they lead to a RoI input. Anything else (Conv, MatMul, ...) ends
# the float32 region: its result is cast to float32 where the region reads it.
_BOX_OPS = frozenset({
    "Abs", "Add", "Cast", "Ceil", "Clip", "Concat", "Constant", "ConstantOfShape", "Div", "Exp", "Expand", "Flatten",
    "Floor", "Gather", "GatherElements", "GatherND", "Identity", "Log", "Max", "Min", "Mul", "Neg", "Reciprocal",
    "Reshape", "Round", "Slice", "Split", "Sqrt", "Squeeze", "Sub", "Tile", "Transpose", "Unsqueeze", "Where"})


def _subgraph_inputs(graph) -> set[str]:
    """Every tensor name read inside the graph's sub-graphs (If / Loop / Scan bodies, nested ones too)."""
    names: set[str] = set()
    for n in graph.node:
        for a in n.attribute:
            for g in ([a.g] if a.type == a.GRAPH else []) + list(a.graphs):
                names.update(x for m in g.node for x in m.input)
                names |= _subgraph_inputs(g)
    return names


def _roi_region(graph, roi_in: list, floats: set, ops: frozenset = _BOX_OPS) -> set[int]:
    """Indices of the nodes (of ``ops``) whose float results reach an input of ``roi_in`` through ``ops`` only. A
    node whose result a sub-graph reads stays out (sub-graphs are converted on their own, reading the target type)."""
    producer = {o: k for k, n in enumerate(graph.node) for o in n.output if o}
    in_subgraphs = _subgraph_inputs(graph)
    stack = [graph.node[k].input[i] for k, positions in enumerate(roi_in) for i in positions]
    region: set[int] = set()
    while stack:
        k = producer.get(stack.pop())
        if k is None or k in region or graph.node[k].op_type not in ops \
                or in_subgraphs.intersection(graph.node[k].output):
            continue
        region.add(k)
        stack.extend(x for x in graph.node[k].input if x in floats)
    return region


def _float_names(graph) -> set[str]:
    """Names of the graph's float32 tensors: inputs, initializers, value infos (after shape inference), outputs,
    and the outputs of float constants and casts to float."""
    names = {v.name for v in list(graph.input) + list(graph.value_info) + list(graph.output)
             if v.type.tensor_type.elem_type == _FLOAT}
    names |= {t.name for t in graph.initializer if t.data_type == _FLOAT}
    for n in graph.node:
        if n.op_type == "Cast" and any(a.name == "to" and a.i == _FLOAT for a in n.attribute):
            names.update(n.output)
        if n.op_type in ("Constant", "ConstantOfShape"):
            if n.op_type == "ConstantOfShape" and not any(a.name == "value" for a in n.attribute):
                names.update(n.output)  # float32 zeros by default
            for a in n.attribute:
                if (a.name == "value" and a.t.data_type == _FLOAT) or a.name in ("value_float", "value_floats"):
                    names.update(n.output)
    return names


def _convert_graph(graph, opset, dtype, target, report, keep_io_types, top_level, rois):
    from onnx import helper

    floats = _float_names(graph)
    init_names = {t.name for t in graph.initializer}
    out_names = {v.name for v in graph.output}
    roles = [_roi_input(n, *rois) for n in graph.node]
    roi_in = [r | c for r, c in roles]
    # float32 nodes computing RoIs, and locations and attention weights (their softmax included)
    region = _roi_region(graph, [r for r, _ in roles], floats)
    region |= _roi_region(graph, [c for _, c in roles], floats, _BOX_OPS | {"Softmax", "Sigmoid"})
    region_out = {o for k in region for o in graph.node[k].output if o in floats}
    keep = []
    for k, n in enumerate(graph.node):
        keep_in, keep_out = _float32_only(n, opset, target)
        if k in region:
            keep_in, keep_out = {i for i, x in enumerate(n.input) if x in floats}, set()
        if roles[k][1]:  # an attention node: float32 as a whole (one floating type in its kernel)
            keep_in = {i for i, x in enumerate(n.input) if x in floats}
            keep_out = set(range(len(n.output)))
        keep.append((keep_in | roi_in[k], keep_out))
    # Results of the region read by converted nodes: a Cast to the target type after their producer.
    leaving = {x for (keep_in, _), n in zip(keep, graph.node) for i, x in enumerate(n.input)
               if x in region_out and i not in keep_in}

    # An initializer used only where float32 is required stays float32 (no precision lost to a round trip).
    uses: dict[str, list[bool]] = {}
    for n, (keep_in, _) in zip(graph.node, keep):
        for i, name in enumerate(n.input):
            uses.setdefault(name, []).append(i in keep_in)
    stay32 = {name for name in init_names if uses.get(name) and all(uses[name])}
    # Likewise a float32 graph input used only there (RoIs fed by the caller): no Cast, not retyped.
    stay32 |= {v.name for v in graph.input if v.name not in init_names and v.name not in out_names
               and uses.get(v.name) and all(uses[v.name])}

    converted = set()
    for i, t in enumerate(list(graph.initializer)):
        if t.data_type == _FLOAT and t.name not in stay32 and t.name not in out_names:
            graph.initializer[i].CopyFrom(_convert_tensor(t, dtype, report))
            converted.add(t.name)
            report.initializers += 1
    for v in graph.input:  # old files list initializers among the graph inputs too: same type as the initializer
        if v.name in converted:
            v.type.tensor_type.elem_type = target
    for v in graph.value_info:
        if v.type.tensor_type.elem_type == _FLOAT and v.name not in region_out:
            v.type.tensor_type.elem_type = target

    head, tail = [], []
    renames: dict[str, str] = {}  # float32 graph I/O -> the target-typed tensor used inside the graph
    produced = {o for n in graph.node for o in n.output}
    for v in graph.input:
        if v.type.tensor_type.elem_type != _FLOAT or v.name in init_names or v.name in stay32:
            continue
        if keep_io_types and top_level:
            renames[v.name] = f"{v.name}__{dtype}"
            head.append(helper.make_node("Cast", [v.name], [renames[v.name]], to=target, name=f"{v.name}__cast_in"))
            report.casts += 1
        else:
            v.type.tensor_type.elem_type = target
    for v in graph.output:
        if v.type.tensor_type.elem_type != _FLOAT or v.name not in produced or v.name in region_out:
            continue  # an output that is a graph input or an initializer, or float32 RoI work, stays as it is
        if keep_io_types and top_level:
            renames[v.name] = f"{v.name}__{dtype}"
            tail.append(helper.make_node("Cast", [renames[v.name]], [v.name], to=_FLOAT, name=f"{v.name}__cast_out"))
            report.casts += 1
        else:
            v.type.tensor_type.elem_type = target

    inputs32 = {v.name for v in graph.input if v.name in renames}
    body = []
    cast32: dict[str, str] = {}
    for k, n in enumerate(graph.node):
        for a in n.attribute:  # sub-graphs (If / Loop / Scan bodies): same conversion, their I/O included
            if a.type == a.GRAPH:
                _convert_graph(a.g, opset, dtype, target, report, keep_io_types, False, rois)
            for g in a.graphs:
                _convert_graph(g, opset, dtype, target, report, keep_io_types, False, rois)
        in_region = k in region
        if n.op_type == "Cast" and not in_region:
            for a in n.attribute:
                if a.name == "to" and a.i == _FLOAT:
                    a.i = target
        if n.op_type in ("Constant", "ConstantOfShape") and not in_region:
            _convert_constant(n, dtype, target, report)
        keep_in, keep_out = keep[k]
        label = f"{n.op_type} {n.name or '(unnamed)'}"
        for i, name in enumerate(n.input):
            if name in floats and i in keep_in:
                as_is = name in inputs32 or name in stay32 or name in region_out  # float32 already
                if not (in_region and as_is):  # (not every step inside the region)
                    report.kept_float32.append(f"{label}: input {i}")
                if as_is:
                    continue
                if name not in cast32:  # one Cast per tensor, shared by every node that reads it in float32
                    cast32[name] = f"{name}__float32_{n.name or n.op_type}_{i}"
                    body.append(helper.make_node("Cast", [renames.get(name, name)], [cast32[name]], to=_FLOAT,
                                                 name=cast32[name]))
                    report.casts += 1
                n.input[i] = cast32[name]
            else:
                n.input[i] = renames.get(name, name)
        after = []
        for original in n.output if in_region else ():
            if original in leaving:
                renames[original] = f"{original}__{dtype}"
                after.append(helper.make_node("Cast", [original], [renames[original]], to=target,
                                              name=f"{original}__cast_{dtype}"))
                report.casts += 1
        for i, original in enumerate(n.output if not in_region else ()):
            name = renames.get(original, original)
            n.output[i] = name
            if name and i in keep_out and original in floats:
                n.output[i] = f"{name}__float32"
                after.append(helper.make_node("Cast", [n.output[i]], [name], to=target, name=f"{name}__cast_back"))
                report.casts += 1
                report.kept_float32.append(f"{label}: output {i}")
        body.append(n)
        body.extend(after)
    del graph.node[:]
    graph.node.extend(head + body + tail)


def _convert_constant(node, dtype: str, target: int, report: ConversionReport) -> None:
    from onnx import helper, numpy_helper

    if node.op_type == "ConstantOfShape" and not any(a.name == "value" for a in node.attribute):
        # without `value` it makes float32 zeros: make them the target type
        zero = numpy_helper.from_array(np.zeros(1, dtype=_np_target(dtype)), "value")
        node.attribute.append(helper.make_attribute("value", zero))
        report.constants += 1
        return

    for a in list(node.attribute):
        if a.name == "value" and a.t.data_type == _FLOAT:
            a.t.CopyFrom(_convert_tensor(a.t, dtype, report))
            report.constants += 1
        elif a.name in ("value_float", "value_floats"):
            values = np.asarray([a.f] if a.name == "value_float" else list(a.floats), dtype=np.float32)
            if a.name == "value_float":
                values = values.reshape(())
            t = _convert_tensor(numpy_helper.from_array(values, "value"), dtype, report)
            node.attribute.remove(a)
            node.attribute.append(helper.make_attribute("value", t))
            report.constants += 1


def convert_float_tensors(model, dtype: str = "float16", keep_io_types: bool = True):
    """A copy of ``model`` (``onnx.ModelProto``) with its float32 tensors as ``dtype`` ("float16" or "bfloat16").

    Returns ``(model, report)``; see the module's documentation for the rules. Raises ValueError for another dtype.
    """
    import onnx

    if dtype not in _TARGETS:
        raise ValueError(f"dtype: expected one of {', '.join(_TARGETS)}, got {dtype!r}")
    target = _TARGETS[dtype]
    try:  # the dcnkit schemas, so that shape inference types the tensors after our nodes too
        from dcnkit.export.schemas import register_onnx_schemas

        register_onnx_schemas()
    except Exception:  # pragma: no cover - without them those tensors are typed by value infos only
        pass
    try:  # the types of intermediate tensors (which inputs of a float32-only position are float)
        out = onnx.shape_inference.infer_shapes(model)
    except Exception:
        out = onnx.ModelProto()
        out.CopyFrom(model)
    opset = {o.domain if o.domain != "ai.onnx" else "": o.version for o in out.opset_import}
    report = ConversionReport(dtype)
    from dcnkit.export import _table

    rois = (_roi_positions(), _table.domain())
    _convert_graph(out.graph, opset, dtype, target, report, keep_io_types, True, rois)
    return out, report


__all__ = ["convert_float_tensors", "ConversionReport"]
