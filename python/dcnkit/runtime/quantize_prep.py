"""Pre-processing before calibration: the same graph whatever wrote the file.

Exporters write the same model differently. torch's TorchScript exporter (``torch.onnx.export(dynamo=False)``)
keeps per-layer shape arithmetic (Shape, Gather, Div, ConstantOfShape, CastLike), biases computed from constants or
behind Identity nodes, and BatchNormalization after the kit's nodes; the dynamo exporter folds most of it. ONNX
Runtime's quantization tool quantizes a convolution's bias only where it is an initializer, and ONNX Runtime runs a
convolution in int8 only with a quantized bias: elsewhere it stays float between DequantizeLinear and
QuantizeLinear, slower than not quantizing. :func:`preprocess` normalises the graph first, as ONNX Runtime's own
``quant_pre_process`` does for models without custom nodes:

1. shape inference that knows the kit's operators (:mod:`dcnkit.runtime.quantize_shapes`), and the shape
   arithmetic whose values it knows (independent of dynamic dimensions) written as initializers;
2. ONNX Runtime's basic graph optimisation (constant folding, Identity elimination, Conv + BatchNormalization
   fusion ...) in a session with the kit's library registered, written back with ``optimized_model_filepath``
   (basic level: standard operators only, so the file stays portable);
3. a BatchNormalization after a deformable convolution folded into its weight and bias (ONNX Runtime fuses only its
   own Conv);
4. weights and biases still computed from constants evaluated and written as initializers.

What cannot be normalised is reported in :attr:`PrepReport.not_constant` (node -> which weight or bias is not a
constant, and from what it is computed) and :attr:`PrepReport.problems` (steps that could not run, and why).
"""
from __future__ import annotations

import dataclasses
import os
import tempfile

import numpy as np

from dcnkit.runtime.quantize_qdeform import DEFORM_INPUTS

__all__ = ["preprocess", "PrepReport", "weight_inputs"]

_STANDARD = ("", "ai.onnx")


@dataclasses.dataclass
class PrepReport:
    """What :func:`preprocess` did (``steps``), what it could not do (``problems``) and the nodes whose weight or
    bias is still not a constant (``not_constant``: name -> reason); ``nodes_before`` / ``nodes_after``: counts.
    (ONNX Runtime's tool quantizes such a weight per tensor, as an activation, and leaves such a bias float.)"""
    steps: list = dataclasses.field(default_factory=list)
    problems: list = dataclasses.field(default_factory=list)
    not_constant: dict = dataclasses.field(default_factory=dict)
    nodes_before: int = 0
    nodes_after: int = 0


def weight_inputs(node) -> list[tuple[str, int]]:
    """``(role, input position)`` of the constant inputs a quantized node needs: weight and bias of Conv,
    ConvTranspose, Gemm and the deformable convolutions (every name the kit runs)."""
    if node.domain in _STANDARD and node.op_type in ("Conv", "ConvTranspose", "Gemm"):
        return [("weight", 1), ("bias", 2)]
    pos = DEFORM_INPUTS.get((node.domain, node.op_type))
    if pos is None:
        return []
    return [(role, p) for role, p in (("weight", pos[2]), ("bias", pos[3])) if p is not None]


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _set_nodes(graph, nodes) -> None:
    """Replaces the graph's nodes by ``nodes`` (copies: the list may hold nodes of this graph)."""
    keep = []
    for n in nodes:
        keep.append(type(n)())
        keep[-1].CopyFrom(n)
    del graph.node[:]
    graph.node.extend(keep)


def _reads(node) -> set:
    """The names a node reads: its inputs and, for If / Loop / Scan, what its subgraphs read from outside."""
    names = set(node.input)
    for a in node.attribute:
        for g in ([a.g] if a.type == 5 else list(a.graphs) if a.type == 10 else []):  # GRAPH, GRAPHS
            for n in g.node:
                names |= _reads(n)
    return names


def _sweep(graph) -> None:
    """Removes nodes whose outputs nobody reads, then initializers nobody reads (subgraphs' reads included)."""
    outputs = {o.name for o in graph.output}
    nodes = list(graph.node)
    reads = {id(n): _reads(n) for n in nodes}
    while True:
        used = {i for n in nodes for i in reads[id(n)]} | outputs
        alive = [n for n in nodes if any(o in used for o in n.output if o)]
        if len(alive) == len(nodes):
            break
        nodes = alive
    if len(nodes) != len(graph.node):
        _set_nodes(graph, nodes)
    used = {i for n in nodes for i in reads[id(n)]} | outputs
    removed = {t.name for t in graph.initializer if t.name not in used}
    if removed:
        _keep(graph.initializer, lambda t: t.name not in removed)
        _keep(graph.input, lambda i: i.name not in removed)  # initializers listed as inputs (IR < 4)


def _keep(field, pred) -> None:
    """Keeps the entries of a repeated message field for which ``pred`` is true."""
    kept = []
    for x in field:
        if pred(x):
            kept.append(type(x)())
            kept[-1].CopyFrom(x)
    del field[:]
    field.extend(kept)


def _fold_shapes(proto, report: PrepReport):
    """Step 1: shape inference with the kit's rules, and the shape arithmetic whose values it knows as initializers
    (the model, changed in place, is returned)."""
    from onnx import helper, numpy_helper

    from dcnkit.runtime.quantize_shapes import SHAPE_OPS, infer, value_info

    try:
        walk = infer(proto)
    except Exception as e:  # noqa: BLE001 - left to ONNX Runtime's optimiser as it is
        report.problems.append(f"shape inference: {_first_line(e)}")
        return proto
    g = proto.graph
    nodes = list(g.node)  # one list: removal by identity
    folded = [n for n in nodes if n.domain in _STANDARD and n.op_type in SHAPE_OPS and len(n.output) == 1
              and n.output[0] in walk.values and None not in walk.values[n.output[0]]
              and walk.types.get(n.output[0]) in (6, 7)]
    for n in folded:
        o = n.output[0]
        dtype = helper.tensor_dtype_to_np_dtype(walk.types[o])
        g.initializer.append(numpy_helper.from_array(np.asarray(walk.values[o], dtype).reshape(walk.dims[o]), o))
    drop = {id(n) for n in folded}
    _set_nodes(g, [n for n in nodes if id(n) not in drop])
    del g.value_info[:]
    g.value_info.extend(value_info(walk, proto))  # initializers (the folded values among them) have none
    _sweep(g)
    report.steps.append(f"shape inference with the kit's rules ({len(folded)} shape values folded)")
    return proto


def _constant_only_nodes(graph) -> int:
    """Standard nodes that read only initializers (what constant folding would still remove)."""
    const = {t.name for t in graph.initializer}
    return sum(1 for n in graph.node if n.domain in _STANDARD
               and (n.op_type == "Constant" or (n.input and all(not i or i in const for i in n.input))))


def _ort_optimise(proto, report: PrepReport):
    """Step 2: ONNX Runtime's basic optimisation with the kit's library; a second pass where it left nodes that
    read only constants (a CastLike is inlined after the first constant folding)."""
    import onnx

    from dcnkit.runtime.ort import ort_session

    opsets = {o.domain: o.version for o in proto.opset_import}
    with tempfile.TemporaryDirectory(prefix="dcnkit-prep-") as tmp:
        path = os.path.join(tmp, "optimized.onnx")
        current = proto
        for _ in range(2):
            try:
                ort_session(current.SerializeToString(), providers=["CPUExecutionProvider"], kit_kernels=False,
                            graph_optimization_level="ORT_ENABLE_BASIC", optimized_model_filepath=path,
                            log_severity_level=3)
                current = onnx.load(path)
            except Exception as e:  # noqa: BLE001 - a model ONNX Runtime cannot load: left as it is
                report.problems.append(f"ONNX Runtime's optimiser: {_first_line(e)}")
                return proto
            if not _constant_only_nodes(current.graph):
                break
    # ONNX Runtime writes every domain it knows into opset_import: keep the model's own, and any new one in use.
    used = {n.domain for n in current.graph.node}
    del current.opset_import[:]
    for domain, version in opsets.items():
        current.opset_import.add(domain=domain, version=version)
    for domain in sorted(used - set(opsets) - {"ai.onnx"}):
        current.opset_import.add(domain=domain, version=1)
    current.ir_version = proto.ir_version
    report.steps.append("ONNX Runtime basic optimisation")
    return current


def _fold_batchnorm(proto, report: PrepReport) -> None:
    """Step 3: BatchNormalization (inference mode, constant parameters) after a deformable convolution whose output
    only it reads, folded into the convolution's weight and bias (new initializers: shared ones stay)."""
    from onnx import helper, numpy_helper

    g = proto.graph
    init = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    readers: dict[str, int] = {}
    for n in g.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    outputs = {o.name for o in g.output}
    nodes, drop = list(g.node), set()  # one list: removal by identity
    for bn in nodes:
        if bn.op_type != "BatchNormalization" or bn.domain not in _STANDARD or len([o for o in bn.output if o]) != 1:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in bn.attribute}
        if attrs.get("training_mode", 0) or any(i not in init for i in bn.input[1:5]):
            continue
        conv = producer.get(bn.input[0])
        pos = DEFORM_INPUTS.get((conv.domain, conv.op_type)) if conv is not None else None
        if pos is None or pos[3] is None or readers.get(bn.input[0], 0) != 1 or bn.input[0] in outputs:
            continue
        wname = conv.input[pos[2]]
        bname = conv.input[pos[3]] if pos[3] < len(conv.input) else ""
        if wname not in init or (bname and bname not in init):
            continue
        w = numpy_helper.to_array(init[wname])
        if w.dtype != np.float32 or w.ndim != 4:
            continue
        gamma, beta, mean, var = (numpy_helper.to_array(init[i]).astype(np.float64) for i in bn.input[1:5])
        scale = gamma / np.sqrt(var + float(attrs.get("epsilon", 1e-5)))
        b = numpy_helper.to_array(init[bname]).astype(np.float64) if bname else np.zeros(w.shape[0])
        base = conv.name or conv.output[0]
        new_w, new_b = f"{base}.bn_folded.weight", f"{base}.bn_folded.bias"
        g.initializer.extend([
            numpy_helper.from_array((w * scale.reshape(-1, 1, 1, 1)).astype(np.float32), new_w),
            numpy_helper.from_array(((b - mean) * scale + beta).astype(np.float32), new_b)])
        conv.input[pos[2]] = new_w
        while len(conv.input) <= pos[3]:
            conv.input.append("")
        conv.input[pos[3]] = new_b
        conv.output[0] = bn.output[0]
        drop.add(id(bn))
    if drop:
        _set_nodes(g, [n for n in nodes if id(n) not in drop])
        _sweep(g)
        report.steps.append(f"{len(drop)} BatchNormalization folded into deformable convolutions")


def _subgraph(name, producer, init):
    """The nodes computing ``name`` from initializers only (in graph order), or ``(None, leaf)`` where a model
    input, a custom-domain node or a control-flow node is on the way."""
    nodes, stack, seen = [], [name], set()
    while stack:
        t = stack.pop()
        if not t or t in seen or t in init:
            continue
        seen.add(t)
        node = producer.get(t)
        if node is None:
            return None, f"the model input '{t}'"
        if node.domain not in _STANDARD or any(a.type in (5, 10) for a in node.attribute):  # GRAPH(S)
            return None, f"{node.domain or 'ai.onnx'}::{node.op_type} '{node.name}'"
        nodes.append(node)
        stack.extend(node.input)
    return nodes, None


def _constant_inputs(proto, report: PrepReport) -> None:
    """Step 4: weights and biases computed from constants only, evaluated (ONNX's reference evaluator) and written
    as initializers; those computed from anything else go to ``report.not_constant``."""
    import onnx
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    g = proto.graph
    init = {t.name for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    order = {id(n): i for i, n in enumerate(g.node)}
    done: dict[str, str] = {}
    for node in g.node:
        for role, p in weight_inputs(node):
            name = node.input[p] if p < len(node.input) else ""
            if not name or name in init:
                continue
            if name in done:
                node.input[p] = done[name]
                continue
            nodes, leaf = _subgraph(name, producer, init)
            if nodes is None:
                report.not_constant[node.name] = f"its {role} '{name}' is computed from {leaf}"
                continue
            nodes.sort(key=lambda n: order[id(n)])
            needed = {i for n in nodes for i in n.input if i in init}
            sub = helper.make_graph([_copy(n) for n in nodes], "constant", [], [helper.make_value_info(name, onnx.TypeProto())],
                                    [t for t in g.initializer if t.name in needed])
            model = helper.make_model(sub, opset_imports=[o for o in proto.opset_import if o.domain in _STANDARD])
            try:
                value = np.asarray(ReferenceEvaluator(model).run(None, {})[0])
            except Exception as e:  # noqa: BLE001
                report.not_constant[node.name] = f"its {role} '{name}' could not be evaluated ({_first_line(e)})"
                continue
            new = f"{name}.const"
            g.initializer.append(numpy_helper.from_array(value, new))
            init.add(new)
            done[name] = node.input[p] = new
    if done:
        _sweep(g)
        report.steps.append(f"{len(done)} computed weights / biases made initializers")


def _copy(node):
    import onnx

    c = onnx.NodeProto()
    c.CopyFrom(node)
    return c


def preprocess(proto, report: PrepReport | None = None):
    """``(normalised model, report)`` for ``proto`` (an ``onnx.ModelProto``, not changed): the steps of the module
    docstring. Every step that cannot run is recorded in ``report.problems`` and skipped; the model stays valid."""
    import onnx

    report = report or PrepReport()
    report.nodes_before = len(proto.graph.node)
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    model = _fold_shapes(model, report)
    model = _ort_optimise(model, report)
    _fold_batchnorm(model, report)
    _constant_inputs(model, report)
    for i, n in enumerate(model.graph.node):
        if not n.name:
            n.name = f"{n.op_type}_{i}"
    report.nodes_after = len(model.graph.node)
    return model, report
