"""The operator table (``dcnkit.op_defs()``, from the C++ core) seen from the exporter.

Input order, attribute names, kinds and defaults come from the table; nothing here spells them again.
The only knowledge added is how a torch schema's scalar arguments fill the table's attributes: in
order, an ``ints`` attribute taking as many scalars as its default has entries (``stride_h, stride_w``
fill ``stride``). An int attribute left over says whether the optional inputs are absent (``no_trans``), the rule
the torch kernels follow too (plugins/torch/torch_ops.cpp).
"""
from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

# Attribute kinds of the table -> the Python type of their values.
_KIND_TYPES = {"int": int, "ints": list, "float": float, "floats": list, "string": str}


@dataclasses.dataclass(frozen=True)
class AttrInfo:
    name: str
    kind: str  # "int" | "ints" | "float" | "floats" | "string"
    default: Any
    doc: str

    @property
    def arity(self) -> int:
        """Torch scalar arguments that fill it: an ``ints`` pair takes two (``pooled_h, pooled_w``), a
        ``floats`` list one (a ``float[]`` argument), anything else one."""
        return len(self.default) if self.kind == "ints" else 1

    @property
    def required(self) -> bool:
        """A ``floats`` attribute with an empty default has no default (``featmap_strides``)."""
        return self.kind == "floats" and not self.default

    def convert(self, value: Any) -> Any:
        """``value`` as this attribute's kind (bool -> int, int -> float, tuple -> list)."""
        if self.kind == "ints":
            return [int(v) for v in value]
        if self.kind == "floats":
            return [float(v) for v in value]
        return _KIND_TYPES[self.kind](value)


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    name: str
    optional: bool
    doc: str
    variadic: bool = False  # the last input only: one or more tensors (a torch ``Tensor[]``)
    int64: bool = False  # an int64 index tensor (MultiScaleDeformableAttention's level tables)
    rois: bool = False  # RoIs: the features' type, or float32 with 16-bit features (kept float32 by precision rules)
    cast: bool = False  # the eager op casts it to the first input's type: the exporters write that cast


@dataclasses.dataclass(frozen=True)
class OpInfo:
    name: str  # snake_case, torch op name
    onnx_type: str  # CamelCase, op type in the dcnkit ONNX domain
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    attrs: tuple[AttrInfo, ...]

    def attr(self, name: str) -> AttrInfo:
        for a in self.attrs:
            if a.name == name:
                return a
        raise KeyError(f"{self.onnx_type}: no attribute {name!r} in the op table")

    def defaults(self) -> dict[str, Any]:
        return {a.name: a.default for a in self.attrs}


def _parse_default(kind: str, text: str) -> Any:
    if kind == "string":
        return text
    value = json.loads(text)
    if kind == "ints":
        return [int(v) for v in value]
    if kind == "floats":
        return [float(v) for v in value]
    return _KIND_TYPES[kind](value)


@functools.lru_cache(maxsize=None)
def _load() -> tuple[str, int, dict[str, OpInfo]]:
    from dcnkit import op_defs

    table = op_defs()
    ops = {}
    for d in table["ops"]:
        ops[d["name"]] = OpInfo(
            name=d["name"],
            onnx_type=d["onnx_type"],
            inputs=tuple(
                TensorInfo(t["name"], bool(t["optional"]), t["doc"], bool(t.get("variadic", False)),
                           bool(t.get("int64", False)), bool(t.get("rois", False)), bool(t.get("cast", False)))
                for t in d["inputs"]
            ),
            outputs=tuple(TensorInfo(t["name"], bool(t["optional"]), t["doc"]) for t in d["outputs"]),
            attrs=tuple(
                AttrInfo(a["name"], a["kind"], _parse_default(a["kind"], a["default"]), a["doc"])
                for a in d["attrs"]
            ),
        )
    return table["domain"], int(table["opset"]), ops


def domain() -> str:
    return _load()[0]


def opset() -> int:
    return _load()[1]


def ops() -> dict[str, OpInfo]:
    """snake_case op name -> OpInfo, in table order."""
    return _load()[2]


def op(name: str) -> OpInfo:
    try:
        return ops()[name]
    except KeyError:
        raise KeyError(f"dcnkit: no operator {name!r} in the op table (have: {', '.join(ops())})") from None


# Attributes every dcnkit-domain node carries for TensorRT's ONNX parser, which imports an unknown node as
# the plugin (op type, attribute plugin_version or "1", attribute plugin_namespace or ""): the kit's
# TensorRT creators live in the namespace named like the ONNX domain. Not fields of the plugins.
PLUGIN_VERSION = "1"


def plugin_attrs() -> dict[str, str]:
    """The TensorRT plugin-lookup attributes written on every dcnkit node (``plugin_namespace``)."""
    return {"plugin_namespace": domain()}


def attrs_from_scalars(info: OpInfo, scalars: list[Any], optional_absent: bool) -> dict[str, Any]:
    """Fills the table's attributes, in order, from a torch schema's scalar arguments.

    An ``int`` attribute left over once the scalars are used up has no torch argument: it says whether every optional
    input is absent (``optional_absent``: DeformPSRoIPool's ``no_trans``), as the torch kernels read it.
    """
    out: dict[str, Any] = {}
    pos = 0
    for a in info.attrs:
        if pos >= len(scalars) and a.kind == "int":
            out[a.name] = int(optional_absent)
            continue
        if pos + a.arity > len(scalars):
            raise ValueError(
                f"{info.onnx_type}: attribute {a.name}: expected {a.arity} more scalar argument(s) "
                f"from the torch schema, got {len(scalars) - pos}"
            )
        value = scalars[pos : pos + a.arity] if a.kind == "ints" else scalars[pos]
        out[a.name] = a.convert(value)
        pos += a.arity
    if pos != len(scalars):
        raise ValueError(
            f"{info.onnx_type}: expected {pos} scalar arguments from the torch schema, got {len(scalars)}"
        )
    return out
