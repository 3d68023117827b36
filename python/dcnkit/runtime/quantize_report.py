"""What ``dcnkit quantize`` made int8 and what stayed float, and why: :func:`summarize` reads the quantized model's
structure as ONNX Runtime will run it.

A convolution or matrix product runs in int8 where ONNX Runtime's QDQ fusion takes it: its input and weight come
out of DequantizeLinear nodes, its bias (if any) too (an int32 bias: a float bias keeps the node float), and a
convolution's output goes to one QuantizeLinear. A deformable convolution runs in int8 as a
``dcnkit::QDeformConv2d``. Every other node of those kinds stayed float, for one of these reasons:

- ``excluded``: named by ``exclude_nodes`` / ``exclude_op_types``, an offset / mask predictor (kept float unless
  ``quantize_offsets``), or a deformable convolution where ``qdeform`` is off;
- ``not constant``: its weight or bias is computed from a model input (:mod:`dcnkit.runtime.quantize_prep`);
- ``no int8 kernel``: a deformable convolution where the kit's library here cannot run ``QDeformConv2d``
  (no oneDNN);
- ``unsupported pattern``: anything else (e.g. a float bias, an output with float consumers).
"""
from __future__ import annotations

import dataclasses

from dcnkit.runtime.quantize_qdeform import DEFORM_INPUTS, QDEFORM_OP

__all__ = ["summarize", "QuantizeSummary", "FAMILIES"]

# family -> standard op types (the deformable convolutions: every name in DEFORM_INPUTS)
FAMILIES = {"Conv": ("Conv", "ConvTranspose"), "MatMul": ("MatMul", "Gemm")}
_REASONS = ("excluded", "not constant", "no int8 kernel", "unsupported pattern")


def _family(node) -> str | None:
    if (node.domain, node.op_type) in DEFORM_INPUTS:
        return "DeformConv"
    if node.domain in ("", "ai.onnx"):
        for family, types in FAMILIES.items():
            if node.op_type in types:
                return family
    return None


@dataclasses.dataclass
class QuantizeSummary:
    """``int8``: family (Conv, MatMul, DeformConv) -> nodes that run in int8; ``float``: reason -> [(node name,
    detail)]; ``total``: nodes of those families in the (pre-processed) float model."""
    int8: dict
    float: dict
    total: int

    @property
    def int8_total(self) -> int:
        return sum(self.int8.values())

    def float_text(self, names: int = 3) -> str:
        """``9 excluded (offset predictor: a, b, c, +6 more); 1 not constant (...)``, or ``none``: per reason, the
        nodes grouped by what keeps them float (``names`` names shown per group)."""
        parts = []
        for reason in _REASONS:
            items = self.float.get(reason, [])
            if not items:
                continue
            groups: dict[str, list] = {}
            for n, detail in items:
                groups.setdefault(detail, []).append(n)
            text = " | ".join(f"{d}: {', '.join(ns[:names])}" + (f", +{len(ns) - names} more" if len(ns) > names
                                                                 else "") for d, ns in groups.items())
            parts.append(f"{len(items)} {reason} ({text})")
        return "; ".join(parts) or "none"

    def line(self) -> str:
        """The one line ``dcnkit quantize`` ends with."""
        kinds = ", ".join(f"{v} {k}" for k, v in self.int8.items() if v) or "none"
        return (f"int8: {self.int8_total} of {self.total} Conv/MatMul/DeformConv nodes ({kinds}); "
                f"float: {self.float_text()}")


def _runs_int8(node, producer, consumers) -> bool:
    def dequantized(i):
        p = producer.get(node.input[i]) if i < len(node.input) and node.input[i] else None
        return p is not None and p.op_type == "DequantizeLinear"

    if len(node.input) < 2 or not dequantized(0) or not dequantized(1):
        return False
    if node.op_type != "MatMul" and len(node.input) > 2 and node.input[2] and not dequantized(2):
        return False
    if node.op_type in FAMILIES["Conv"]:
        users = consumers.get(node.output[0], [])
        return len(users) == 1 and users[0].op_type == "QuantizeLinear"
    return True


def _why_not(qnode, producer) -> str:
    """The unsupported part of a Conv / MatMul's pattern in the quantized model."""
    if qnode is None:
        return "not in the quantized model"
    names = ("input", "weight", "bias")
    for i, what in enumerate(names[:len(qnode.input)]):
        p = producer.get(qnode.input[i]) if qnode.input[i] else None
        if qnode.input[i] and (p is None or p.op_type != "DequantizeLinear"):
            return f"its {what} is not quantized"
    return "its output is not quantized"


def summarize(float_model, int8_model, *, excluded_user=(), offset_nodes=(), qdeform_on=True,
              qdeform_kernel=True, not_constant=None) -> QuantizeSummary:
    """The summary of ``int8_model`` (what :func:`dcnkit.runtime.quantize.quantize` wrote) against the float model
    the quantization tool was given (``float_model``, after pre-processing). ``excluded_user``: names excluded by the
    caller (``exclude_nodes`` and ``exclude_op_types``); ``offset_nodes``: the offset / mask predictors left float;
    ``qdeform_on``: whether deformable convolutions were to become ``QDeformConv2d``; ``qdeform_kernel``: whether the
    library here runs it; ``not_constant``: node name -> why its weight or bias is not a constant."""
    not_constant = not_constant or {}
    q = int8_model.graph
    producer = {o: n for n in q.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in q.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    by_name = {n.name: n for n in q.node if n.name}
    fused = {n.name for n in q.node if (n.domain, n.op_type) == QDEFORM_OP}
    excluded_user, offset_nodes = set(excluded_user), set(offset_nodes)
    int8 = {"Conv": 0, "MatMul": 0, "DeformConv": 0}
    floats: dict[str, list] = {r: [] for r in _REASONS}
    total = 0
    for node in float_model.graph.node:
        family = _family(node)
        if family is None:
            continue
        total += 1
        name = node.name
        if family == "DeformConv":
            if f"{name}_quant" in fused:
                int8[family] += 1
                continue
        else:
            qnode = by_name.get(name)
            if qnode is not None and _runs_int8(qnode, producer, consumers):
                int8[family] += 1
                continue
        if name in excluded_user:
            floats["excluded"].append((name, "excluded by the caller"))
        elif name in offset_nodes:
            floats["excluded"].append((name, "offset predictor"))
        elif name in not_constant:
            floats["not constant"].append((name, not_constant[name]))
        elif family == "DeformConv" and not qdeform_on:
            floats["excluded"].append((name, "QDeformConv2d off"))
        elif family == "DeformConv" and not qdeform_kernel:
            floats["no int8 kernel"].append((name, "QDeformConv2d needs oneDNN"))
        elif family == "DeformConv":
            floats["unsupported pattern"].append((name, "no DequantizeLinear -> node -> QuantizeLinear around it"))
        else:
            floats["unsupported pattern"].append((name, _why_not(by_name.get(name), producer)))
    return QuantizeSummary(int8=int8, float={k: v for k, v in floats.items() if v}, total=total)
