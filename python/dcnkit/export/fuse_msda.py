"""``fuse_msda``: ONNX files exported from Hugging Face transformers' deformable attention in pure PyTorch, with
each attention's ``grid_sample`` subgraph (one ``GridSample`` per level, the gathers, the weighting and the sum)
replaced by one ``dcnkit::MultiScaleDeformableAttention`` node. ``dcnkit fuse-msda in.onnx -o out.onnx``.

Recognised: the subgraphs of transformers' ``MultiScaleDeformableAttention`` module and
``multi_scale_deformable_attention`` function (locations ``(N, Lq, M, L, P, 2)``) and of
``multi_scale_deformable_attention_v2`` (``(N, Lq, M, sum P_l, 2)``, a point count per level), as either torch
exporter writes them. A group of ``GridSample`` nodes (bilinear, zero padding, ``align_corners=0``) stacked by one
``Concat`` is traced back through layout-only nodes to the value ``(N, S, M, D)``, the locations (through
``2 * loc - 1``) and the weights, and forward to the ``(N, Lq, M*D)`` result. Each candidate is then checked
numerically before it is replaced: its subgraph and the fused node run in ONNX Runtime on random inputs and must
agree (``verify=False`` skips that). Any other ``GridSample`` stays as it is.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dcnkit.export._fuse_shapes import analysis_copy, has_symbolic_inputs, level_tables

__all__ = ["fuse_msda", "FuseReport"]

_LAYOUT = {"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Split", "Slice", "Gather"}
_OP = "MultiScaleDeformableAttention"
_TRT_OP = "MultiscaleDeformableAttnPlugin_TRT"
_NODES = ("dcnkit", "tensorrt")


@dataclass
class FuseReport:
    fused: list = field(default_factory=list)  # (output tensor, layout "v1" | "v2", levels)
    skipped: list = field(default_factory=list)  # (first GridSample's name, reason)
    grid_samples_left: int = 0
    node: str = f"dcnkit::{_OP}"  # the node written for each attention
    tables: str = "constant"  # the level tables: "constant", or "computed" from the maps' shapes at run time

    def lines(self) -> list[str]:
        out = [f"fused {len(self.fused)} deformable attention(s) into {self.node} nodes ({self.tables} level tables); "
               f"{self.grid_samples_left} GridSample node(s) left"]
        out += [f"  left as it is ({name}): {why}" for name, why in self.skipped]
        return out


class _Graph:
    def __init__(self, model: Any) -> None:
        import onnx

        self.model = model
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        self.inferred = inferred
        self.shapes: dict[str, list] = {}
        self.types: dict[str, int] = {}
        for vi in (list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)):
            tt = vi.type.tensor_type
            self.types[vi.name] = tt.elem_type
            if tt.HasField("shape"):
                self.shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        self.consts = {i.name: i for i in model.graph.initializer}
        self.producer = {o: n for n in model.graph.node for o in n.output}
        self.consumers: dict[str, list] = {}
        for n in model.graph.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        for n in model.graph.node:
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
                self.consts[n.output[0]] = n.attribute[0].t

    def const(self, name: str) -> np.ndarray | None:
        import onnx.numpy_helper

        t = self.consts.get(name)
        return None if t is None else onnx.numpy_helper.to_array(t)

    def back(self, name: str) -> list[str]:
        """``name`` and the tensors before it through layout-only nodes (first data input), nearest first."""
        chain = [name]
        while True:
            n = self.producer.get(chain[-1])
            if n is None or n.op_type not in _LAYOUT:
                return chain
            chain.append(n.input[0])

    def only_consumer(self, name: str) -> Any:
        """The one node that reads ``name``'s data (a ``Shape`` of it does not count), or None."""
        users = [n for n in self.consumers.get(name, []) if n.op_type != "Shape"]
        return users[0] if len(users) == 1 else None


def _attr(node: Any, name: str, default: Any) -> Any:
    import onnx

    for a in node.attribute:
        if a.name == name:
            v = onnx.helper.get_attribute_value(a)
            return v.decode() if isinstance(v, bytes) else v
    return default


def _plain_bilinear(node: Any) -> bool:
    return (_attr(node, "mode", "linear") in ("linear", "bilinear") and _attr(node, "padding_mode", "zeros") == "zeros"
            and int(_attr(node, "align_corners", 0)) == 0)


def _scalar(g: _Graph, name: str) -> float | None:
    v = g.const(name)
    return float(v.reshape(-1)[0]) if v is not None and v.size == 1 else None


def _locations(g: _Graph, grid_common: str) -> str | None:
    """The locations behind ``2 * loc - 1`` (Sub(Mul(loc, 2), 1) or Add(Mul(loc, 2), -1)), through layout nodes."""
    top = g.back(grid_common)[-1]
    n = g.producer.get(top)
    if n is None or n.op_type not in ("Sub", "Add"):
        return None
    one = _scalar(g, n.input[1])
    if one is None or one != (1.0 if n.op_type == "Sub" else -1.0):
        return None
    m = g.producer.get(n.input[0])
    if m is None or m.op_type != "Mul":
        return None
    for loc, two in ((m.input[0], m.input[1]), (m.input[1], m.input[0])):
        if _scalar(g, two) == 2.0:
            return loc
    return None


def _common(chains: list[list[str]]) -> str | None:
    rest = [set(c) for c in chains[1:]]
    return next((t for t in chains[0] if all(t in r for r in rest)), None)


def _match(g: _Graph, concat: Any, grid_nodes: list) -> tuple[dict | None, str]:
    """The pieces of one attention whose GridSample nodes ``grid_nodes`` (in level order) feed ``concat``."""
    xs = [n.input[0] for n in grid_nodes]
    levels = []
    for x in xs:
        s = g.shapes.get(x)
        if s is None or len(s) != 4 or s[2] is None or s[3] is None or s[1] is None:
            return None, "the level maps' sizes are not known statically"
        levels.append((s[2], s[3]))
    d = g.shapes[xs[0]][1]
    counts = []
    for n in grid_nodes:
        s = g.shapes.get(n.input[1])
        if s is None or len(s) != 4 or s[2] is None:
            return None, "the sampling grids' point counts are not known statically"
        counts.append(s[2])
    total = sum(h * w for h, w in levels)
    v_common = _common([g.back(x) for x in xs])
    value = next((t for t in (g.back(v_common) if v_common else [])
                  if len(g.shapes.get(t, [])) == 4 and g.shapes[t][1] == total and g.shapes[t][3] == d), None)
    if value is None:
        return None, "no value tensor (N, S, M, D) found behind the level maps"
    m_heads = g.shapes[value][2]
    g_common = _common([g.back(n.input[1]) for n in grid_nodes])
    loc = _locations(g, g_common) if g_common else None
    lshape = g.shapes.get(loc or "", [])
    num_l = len(levels)
    if len(lshape) == 6 and lshape[2:] == [m_heads, num_l, counts[0], 2] and len(set(counts)) == 1:
        layout, wshape = "v1", lshape[:5]
    elif len(lshape) == 5 and lshape[2:] == [m_heads, sum(counts), 2]:
        layout, wshape = "v2", lshape[:4]
    else:
        return None, "no sampling locations (N, Lq, M, L, P, 2) or (N, Lq, M, sum P, 2) behind 2 * loc - 1"
    # Forward: Concat -> layout -> Mul(weights) -> ReduceSum -> layout -> (N, Lq, M*D).
    t, mul = concat.output[0], None
    while mul is None:
        n = g.only_consumer(t)
        if n is None or n.op_type not in _LAYOUT | {"Mul"}:
            return None, "the stacked samples are not weighted by one Mul"
        if n.op_type == "Mul":
            mul = n
        t = n.output[0]
    stacked = _stacked_input(g, mul, concat)
    w_in = [i for i in mul.input if i != stacked]
    weights = next((t2 for t2 in (g.back(w_in[0]) if len(w_in) == 1 else [])
                    if g.shapes.get(t2) is not None and _same(g.shapes[t2], wshape)), None)
    if weights is None:
        return None, f"no attention weights {wshape} behind the Mul"
    red = g.only_consumer(mul.output[0])
    if red is None or red.op_type != "ReduceSum":
        return None, "the weighted samples are not summed by ReduceSum"
    t, out = red.output[0], None
    while out is None:
        n = g.only_consumer(t)
        if n is None or n.op_type not in _LAYOUT:
            return None, "no (N, Lq, M*D) result after the sum"
        t = n.output[0]
        if n.op_type == "Transpose" and list(_attr(n, "perm", [])) == [0, 2, 1]:
            out = t
    return dict(value=value, loc=loc, weights=weights, out=out, levels=levels, counts=counts, layout=layout,
                heads=m_heads, dim=d), ""


def _stacked_input(g: _Graph, mul: Any, concat: Any) -> str:
    """Which input of ``mul`` comes from the stacked samples (through layout nodes)."""
    for i in mul.input:
        if concat.output[0] in g.back(i):
            return i
    return ""


def _same(shape: list, want: list) -> bool:
    return len(shape) == len(want) and all(a is None or b is None or a == b for a, b in zip(shape, want))


_NP = {1: np.float32, 10: np.float16, 11: np.float64}


def _replacement(p: dict, names: Any, elem_types: dict, node: str = "dcnkit", maps: list | None = None) -> tuple[list, list]:
    """(nodes, initializers) computing ``p["out"]`` with one MSDA node from value, locations and weights; the level
    tables constant, or computed from the shapes of the level ``maps`` (the GridSample inputs) where given."""
    from onnx import helper, numpy_helper

    from dcnkit.export import _table

    levels, counts = p["levels"], p["counts"]
    num_l, most = len(levels), max(counts)
    nodes, inits = [], []

    def const(tag: str, array: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(array, names(tag)))
        return names(tag)

    vtype = elem_types.get(p["value"]) or 1
    loc, weights = p["loc"], p["weights"]
    for tag in ("loc", "weights"):
        src = loc if tag == "loc" else weights
        if elem_types.get(src) not in (None, vtype):  # the kernel takes one floating type (as the eager op casts)
            dst = names(f"{tag}_cast")
            nodes.append(helper.make_node("Cast", [src], [dst], to=vtype))
            loc, weights = (dst, weights) if tag == "loc" else (loc, dst)
    if p["layout"] == "v2":
        loc6, w5 = names("loc6"), names("w5")
        if all(c == most for c in counts):
            nodes.append(helper.make_node("Reshape", [loc, const("loc_shape", np.array([0, 0, 0, num_l, most, 2]))],
                                          [loc6]))
            nodes.append(helper.make_node("Reshape", [weights, const("w_shape", np.array([0, 0, 0, num_l, most]))],
                                          [w5]))
        else:
            # Levels with fewer points are padded with points of weight 0 placed outside the map: they add 0.
            split = const("counts", np.array(counts, dtype=np.int64))
            lparts, wparts = [names(f"loc_{i}") for i in range(num_l)], [names(f"w_{i}") for i in range(num_l)]
            nodes.append(helper.make_node("Split", [loc, split], lparts, axis=3))
            nodes.append(helper.make_node("Split", [weights, split], wparts, axis=3))
            axis3 = const("axis3", np.array([3], dtype=np.int64))
            outside = const("outside", np.array(-1.0, dtype=_NP.get(vtype, np.float32)))
            lpad, wpad = [], []
            for i, c in enumerate(counts):
                lp, wp, lu, wu = names(f"loc_pad_{i}"), names(f"w_pad_{i}"), names(f"loc_u_{i}"), names(f"w_u_{i}")
                pads_l = const(f"pads_l{i}", np.array([0, 0, 0, 0, 0, 0, 0, 0, most - c, 0], dtype=np.int64))
                pads_w = const(f"pads_w{i}", np.array([0, 0, 0, 0, 0, 0, 0, most - c], dtype=np.int64))
                nodes.append(helper.make_node("Pad", [lparts[i], pads_l, outside], [lp]))
                nodes.append(helper.make_node("Pad", [wparts[i], pads_w], [wp]))
                nodes.append(helper.make_node("Unsqueeze", [lp, axis3], [lu]))
                nodes.append(helper.make_node("Unsqueeze", [wp, axis3], [wu]))
                lpad.append(lu)
                wpad.append(wu)
            nodes.append(helper.make_node("Concat", lpad, [loc6], axis=3))
            nodes.append(helper.make_node("Concat", wpad, [w5], axis=3))
        loc, weights = loc6, w5
    if maps is None:
        shapes = const("spatial_shapes", np.array(levels, dtype=np.int64))
        starts = const("level_start_index", np.cumsum([0] + [a * b for a, b in levels[:-1]]).astype(np.int64))
    else:
        t_nodes, t_inits, shapes, starts = level_tables(maps, names)
        nodes += t_nodes
        inits += t_inits
    if node == "tensorrt":
        # TensorRT's own plugin (its ONNX parser finds it by op type; ONNX Runtime with the kit's library runs the
        # name in the trt domain): output (N, Lq, M, D), reshaped to the subgraph's (N, Lq, M*D).
        per_head = names("per_head")
        nodes.append(helper.make_node(_TRT_OP, [p["value"], shapes, starts, loc, weights], [per_head], domain="trt"))
        nodes.append(helper.make_node("Reshape", [per_head, const("out_shape", np.array([0, 0, -1]))], [p["out"]]))
    else:
        nodes.append(helper.make_node(_OP, [p["value"], shapes, starts, loc, weights], [p["out"]],
                                      domain=_table.domain(), **_table.plugin_attrs()))
    return nodes, inits


def _feeds(g: _Graph, p: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random inputs of one candidate: locations around [0, 1] (some outside the maps), weights in [0, 1]."""
    out = {}
    for key, low, high in (("value", None, None), ("loc", -0.1, 1.1), ("weights", 0.0, 1.0)):
        name = p[key]
        shape = [d if d else 1 for d in g.shapes[name]]
        dtype = _NP.get(g.types.get(name) or 1, np.float32)
        a = rng.standard_normal(shape) if low is None else rng.uniform(low, high, shape)
        out[name] = a.astype(dtype)
    return out


def _verify(g: _Graph, p: dict, nodes: list, inits: list) -> str:
    """'' when the candidate's subgraph and its replacement agree on random inputs in ONNX Runtime, else why not."""
    import onnx
    import onnx.utils
    import onnxruntime

    from dcnkit.runtime import ort_session

    ins = [p["value"], p["loc"], p["weights"]]
    if any(t not in g.shapes for t in ins + [p["out"]]):
        return "the shapes of its inputs are not known"
    try:
        sub = onnx.utils.Extractor(g.inferred).extract_model(ins, [p["out"]])
    except Exception as e:  # noqa: BLE001 - any failure to cut the subgraph out means: not verified
        return f"its subgraph could not be cut out ({type(e).__name__}: {e})"
    if sorted(i.name for i in sub.graph.input) != sorted(ins):
        return "its subgraph depends on other inputs of the model"
    rng = np.random.default_rng(0)
    feeds = _feeds(g, p, rng)
    _grids_like_maps(sub)
    sess = onnxruntime.InferenceSession(sub.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)[0]
    graph = onnx.helper.make_graph(nodes, "fused", list(sub.graph.input), list(sub.graph.output), inits)
    fused = onnx.helper.make_model(graph, opset_imports=list(g.model.opset_import))
    fused.ir_version = g.model.ir_version
    _ensure_domain(fused)
    _ensure_domain(fused, "trt")
    got = ort_session(fused.SerializeToString()).run(None, feeds)[0]
    if got.shape != want.shape:
        return f"the fused node gives shape {got.shape}, the subgraph {want.shape}"
    err = float(np.abs(got.astype(np.float64) - want).max())
    tol = 1e-5 * max(1.0, float(np.abs(want).max()))
    return "" if err <= tol else f"the fused node differs from the subgraph by {err:.3g} on random inputs"


def _grids_like_maps(sub: Any) -> None:
    """The TorchScript exporter types transformers' grids as float64 (eager: float32), and ONNX Runtime has no
    GridSample for a float64 grid on float32 maps: in the copy that is checked, the grids take the maps' type."""
    import onnx

    types = {v.name: v.type.tensor_type.elem_type for v in list(sub.graph.value_info) + list(sub.graph.input)}
    nodes = []
    for n in sub.graph.node:
        if n.op_type == "GridSample" and types.get(n.input[1], 0) not in (0, types.get(n.input[0], 0)):
            cast = n.input[1] + "/as_map_type"
            nodes.append(onnx.helper.make_node("Cast", [n.input[1]], [cast], to=types[n.input[0]]))
            n.input[1] = cast
        nodes.append(n)
    del sub.graph.node[:]
    sub.graph.node.extend(nodes)


def _ensure_domain(model: Any, domain: str | None = None) -> None:
    import onnx

    from dcnkit.export import _table

    name, version = (domain, 1) if domain else (_table.domain(), _table.opset())
    if not any(o.domain == name for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(name, version))


def _grid_groups(g: _Graph, report: FuseReport) -> list[tuple[Any, list]]:
    """(Concat, its GridSample nodes in input order) for every Concat that stacks only bilinear GridSamples."""
    groups: dict[str, tuple[Any, dict]] = {}
    for n in g.model.graph.node:
        if n.op_type != "GridSample":
            continue
        if not _plain_bilinear(n):
            report.skipped.append((n.name or n.output[0], "not bilinear with zero padding and align_corners=0"))
            continue
        t, concat = n.output[0], None
        while concat is None:
            u = g.only_consumer(t)
            if u is None or (u.op_type not in _LAYOUT and u.op_type != "Concat"):
                break
            if u.op_type == "Concat":
                concat = u
            else:
                t = u.output[0]
        if concat is None:
            report.skipped.append((n.name or n.output[0], "its samples are not stacked with other levels' by a Concat"))
            continue
        groups.setdefault(concat.output[0], (concat, {}))[1][list(concat.input).index(t)] = n
    out = []
    for concat, members in groups.values():
        if sorted(members) != list(range(len(concat.input))):
            first = next(iter(members.values()))
            report.skipped.append((first.name or first.output[0], "its Concat also stacks other tensors"))
            continue
        out.append((concat, [members[i] for i in range(len(concat.input))]))
    return out


def _drop_dead(model: Any) -> None:
    graph = model.graph
    needed = {o.name for o in graph.output}
    keep = []
    for n in reversed(list(graph.node)):
        if any(o in needed for o in n.output):
            keep.append(n)
            needed.update(i for i in n.input if i)
    keep.reverse()
    del graph.node[:]
    graph.node.extend(keep)
    inputs = {i.name for i in graph.input}
    inits = [i for i in graph.initializer if i.name in needed or i.name in inputs]
    del graph.initializer[:]
    graph.initializer.extend(inits)


def fuse_msda(model: Any, verify: bool = True, node: str = "dcnkit",
              input_shapes: dict | None = None) -> tuple[Any, FuseReport]:
    """``(fused model, report)``: every recognised deformable-attention subgraph of ``model`` (an
    ``onnx.ModelProto``, not changed) replaced by one ``dcnkit::MultiScaleDeformableAttention`` node, or with
    ``node="tensorrt"`` by TensorRT's own ``MultiscaleDeformableAttnPlugin_TRT`` (domain ``trt``) and a Reshape.

    The subgraphs are read from a copy with fixed input dims and constant expressions folded (``input_shapes``:
    ``{input name: dims}`` for inputs with symbolic dims; default: the exporter's image size, see
    :mod:`dcnkit.export._fuse_shapes`), so unsimplified and dynamic exports fuse too; a file whose inputs have
    symbolic dims gets level tables computed from its maps' shapes, and keeps serving every input size."""
    import onnx

    if node not in _NODES:
        raise ValueError(f"fuse_msda: node: expected one of {_NODES}, got {node!r}")

    src = model
    model = onnx.ModelProto()
    model.CopyFrom(src)
    g = _Graph(analysis_copy(model, input_shapes))
    dynamic = has_symbolic_inputs(model)
    present = {t for n in model.graph.node for t in list(n.input) + list(n.output)}
    present |= {i.name for i in model.graph.input}
    types = dict(g.types)
    report = FuseReport(node=f"trt::{_TRT_OP}" if node == "tensorrt" else f"dcnkit::{_OP}",
                        tables="computed" if dynamic else "constant")
    counter = [0]

    def namer_for(k: int):
        def names(tag: str) -> str:
            return f"dcnkit_fuse_msda_{k}/{tag}"
        return names

    # in the file's order (the analysis copy's optimizer may order nodes otherwise)
    where = {o: k for k, n in enumerate(model.graph.node) for o in n.output}
    groups = sorted(_grid_groups(g, report), key=lambda cg: where.get(cg[0].output[0], len(where)))
    replacements = []
    for concat, grid_nodes in groups:
        first = grid_nodes[0].name or grid_nodes[0].output[0]
        p, why = _match(g, concat, grid_nodes)
        if p is None:
            report.skipped.append((first, why))
            continue
        maps = [n.input[0] for n in grid_nodes]
        missing = [t for t in [p["value"], p["loc"], p["weights"], p["out"]] + maps if t not in present]
        if missing:
            report.skipped.append((first, f"tensor {missing[0]!r} of its subgraph is not in the file as exported"))
            continue
        names = namer_for(counter[0])
        counter[0] += 1
        nodes, inits = _replacement(p, names, types, node)
        if verify:
            why = _verify(g, p, nodes, inits)
            if why:
                report.skipped.append((first, why))
                continue
        if dynamic:
            nodes, inits = _replacement(p, names, types, node, maps=maps)
        replacements.append((p, nodes, inits))
    for p, nodes, inits in replacements:
        graph = model.graph
        old = next(i for i, n in enumerate(graph.node) if p["out"] in n.output)
        del graph.node[old]
        for k, n in enumerate(nodes):
            graph.node.insert(old + k, n)
        graph.initializer.extend(inits)
        report.fused.append((p["out"], p["layout"], len(p["levels"])))
    if replacements:
        _ensure_domain(model, "trt" if node == "tensorrt" else None)
        _drop_dead(model)
    report.grid_samples_left = sum(n.op_type == "GridSample" for n in model.graph.node)
    return model, report
