"""Symbolic functions for torch.onnx's TorchScript exporter (``torch.onnx.export(..., dynamo=False)``).

Registered with ``torch.onnx.register_custom_op_symbolic("dcnkit::<op>", ...)`` for every opset the
exporter supports; the symbolic reads the export's opset from the graph context, so ``DeformConv`` is
used from opset 19 on.
"""
from __future__ import annotations

from typing import Any

import torch

from dcnkit.export import _lowering, _table
from dcnkit.ops import _loader  # noqa: F401  (torch.ops.dcnkit.*)

_MIN_OPSET = 9
_SUFFIX = {"int": "i", "ints": "i", "float": "f", "floats": "f", "string": "s"}
_registered = False


def _attr_suffix(name: str, value: Any) -> str:
    v = value[0] if isinstance(value, (list, tuple)) and value else value
    if isinstance(v, bool) or isinstance(v, int):
        return "i"
    if isinstance(v, float):
        return "f"
    if isinstance(v, str):
        return "s"
    raise TypeError(f"dcnkit export: attribute {name}: unsupported value {value!r}")


def _scalar_desc(arg: Any) -> str:
    t = arg.type
    if isinstance(t, torch.ListType):
        elem = t.getElementType()
        if isinstance(elem, torch.IntType):
            return "is"
        if isinstance(elem, torch.FloatType):
            return "fs"
        raise TypeError(f"dcnkit export: argument {arg.name}: unsupported type {t}")
    if isinstance(t, torch.BoolType):
        return "b"
    if isinstance(t, torch.IntType):
        return "i"
    if isinstance(t, torch.FloatType):
        return "f"
    if isinstance(t, torch.StringType):
        return "s"
    raise TypeError(f"dcnkit export: argument {arg.name}: unsupported type {t}")


def _const(value: Any, desc: str, name: str) -> Any:
    """A constant scalar argument; ``int[]`` / ``float[]`` also from a list of constants."""
    from torch.onnx import symbolic_helper

    if desc in ("is", "fs") and value.node().kind() == "prim::ListConstruct":
        return [symbolic_helper._get_const(v, desc[0], name) for v in value.node().inputs()]
    return symbolic_helper._get_const(value, desc, name)


class _Emitter:
    def __init__(self, g: Any) -> None:
        self.g = g

    def _none(self) -> Any:
        # An omitted optional input: the exporter writes "" for a value that must be None.
        return self.g.op("prim::Constant").setType(torch._C.NoneType.get())

    def _inputs(self, inputs: tuple[Any, ...]) -> list[Any]:
        from torch.onnx import symbolic_helper

        ins = list(inputs)
        while ins and (ins[-1] is None or symbolic_helper._is_none(ins[-1])):
            ins.pop()
        return [self._none() if v is None else v for v in ins]

    def op(self, op_type: str, *inputs: Any, **attrs: Any) -> Any:
        kw = {f"{k}_{_attr_suffix(k, v)}": v for k, v in attrs.items()}
        return self.g.op(op_type, *self._inputs(inputs), **kw)

    def custom(self, info: _table.OpInfo, inputs: list[Any], attrs: dict[str, Any]) -> Any:
        kw = {f"{a.name}_{_SUFFIX[a.kind]}": attrs[a.name] for a in info.attrs}
        known = {a.name for a in info.attrs}
        kw.update({f"{k}_{_attr_suffix(k, v)}": v for k, v in attrs.items() if k not in known})
        out = self.g.op(
            f"{_table.domain()}::{info.onnx_type}",
            *self._inputs(tuple(inputs)),
            outputs=len(info.outputs),
            **kw,
        )
        # The exporter cannot infer our outputs: give their dtype and rank (sizes unknown, so no
        # traced size is frozen into the graph); ONNX shape inference with our schemas fills them. The rank is
        # the traced op's (MultiScaleDeformableAttention's output has 3 dims: a 4 made the exporter write
        # Transpose perm {0, 2, 1, 3} for a transpose(1, 2) after it).
        x = inputs[0]
        outs = out if isinstance(out, (tuple, list)) else (out,)
        xtype = x.type()
        if isinstance(xtype, torch._C.TensorType) and xtype.scalarType() is not None:
            ranks = self._traced_ranks(len(outs))
            for o, rank in zip(outs, ranks):
                o.setType(xtype.with_sizes([None] * rank))
        return tuple(outs) if len(outs) > 1 else outs[0]

    def _traced_ranks(self, count: int) -> list[int]:
        """The ranks of the traced torch op's outputs (4 where the trace does not say)."""
        node = getattr(self.g, "original_node", None)
        ranks = []
        for i in range(count):
            rank = None
            if node is not None and i < node.outputsSize():
                t = node.outputsAt(i).type()
                if isinstance(t, torch._C.TensorType):
                    rank = t.dim()
            ranks.append(4 if rank is None else rank)
        return ranks

    def cast_like(self, value: Any, like: Any) -> Any:
        """``value`` in ``like``'s dtype: a Cast where the traced types differ (the trace may type a tensor as
        double where eager has float32, as transformers' reference points), CastLike where unknown."""
        vtype, ltype = value.type(), like.type()
        lscalar = ltype.scalarType() if isinstance(ltype, torch._C.TensorType) else None
        vscalar = vtype.scalarType() if isinstance(vtype, torch._C.TensorType) else None
        if vscalar is not None and vscalar == lscalar:
            return value
        if lscalar not in _FLOAT_TYPES:
            return self.g.op("CastLike", value, like)
        onnx_type, dtype = _FLOAT_TYPES[lscalar]
        out = self.g.op("Cast", value, to_i=onnx_type)
        if isinstance(vtype, torch._C.TensorType):
            out.setType(vtype.with_dtype(dtype))
        return out

    def const_i64(self, value: int | list[int]) -> Any:
        return self.g.op("Constant", value_t=torch.tensor(value, dtype=torch.int64))

    def static_shape(self, value: Any) -> list[int] | None:
        from torch.onnx import symbolic_helper

        sizes = symbolic_helper._get_tensor_sizes(value)
        if sizes is None or any(s is None for s in sizes):
            return None
        return [int(s) for s in sizes]


# TorchScript scalar type names -> (ONNX TensorProto type, torch dtype), the floating types the ops take.
_FLOAT_TYPES = {"Float": (1, torch.float32), "Double": (11, torch.float64), "Half": (10, torch.float16),
                "BFloat16": (16, torch.bfloat16)}


def _make_symbolic(name: str):
    from torch.onnx import symbolic_helper

    schema = getattr(torch.ops.dcnkit, name).default._schema
    args = list(schema.arguments)

    def symbolic(g, *values):
        tensors, scalars = {}, []
        for a, v in zip(args, values):
            if _lowering.is_tensor_list_arg(a):
                tensors[a.name] = symbolic_helper._unpack_list(v)
            elif _lowering.is_tensor_arg(a):
                tensors[a.name] = None if symbolic_helper._is_none(v) else v
            else:
                scalars.append(_const(v, _scalar_desc(a), a.name))
        return _lowering.lower(name, tensors, scalars, _Emitter(g), g.opset)

    symbolic.__name__ = f"dcnkit_{name}_symbolic"
    return symbolic


def register() -> None:
    """Makes ``torch.onnx.export(..., dynamo=False)`` translate the dcnkit ops (idempotent)."""
    global _registered
    if _registered:
        return
    from torch.onnx import register_custom_op_symbolic

    for name in _table.ops():
        register_custom_op_symbolic(f"dcnkit::{name}", _make_symbolic(name), _MIN_OPSET)
    _registered = True
