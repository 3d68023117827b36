"""The reference runner's ops read from the op table: every name of every op (the kit's own and other tools')
runs its op's NumPy reference, ``dcnkit.reference.<op name>(inputs..., **attributes)`` (or an adapter of
:mod:`dcnkit.runtime.reference_runner`), with the node's inputs in the op's canonical order and its attributes as the
core reads them for every backend (:func:`check_node`), under their canonical names."""
from __future__ import annotations

import inspect

import numpy as np
from onnx.reference.op_run import OpRun


def _ref():
    from dcnkit import reference

    return reference


def _attr(op: OpRun, name: str, default):
    v = getattr(op, name, None)
    if v is None:
        return default
    if isinstance(v, bytes):
        v = v.decode()
    if isinstance(v, np.ndarray):
        v = v.tolist()
    return v


# ONNX attribute types -> the kinds dcnkit_op_infer reads (others are passed as "other": the core names them).
_ATTR_KINDS = {1: "float", 2: "int", 3: "string", 6: "floats", 7: "ints"}


def _attr_triple(a) -> list:
    from onnx import helper

    kind = _ATTR_KINDS.get(a.type, "other")
    value = helper.get_attribute_value(a) if kind != "other" else None
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return [a.name, kind, list(value) if isinstance(value, (list, tuple)) else value]


def check_node(op: OpRun, node_inputs) -> dict | None:
    """A node of the op table read and checked as every backend's kernel does before it runs: its attributes read
    and checked by the core (``dcnkit_op_infer``; loose spellings, element and enum attributes included) and its
    inputs' shapes checked by the op's declaration. Returns the canonical attribute values (name -> value), or
    raises a ValueError with the core's message; None where no native library is installed (nothing checked). The
    data (RoI batch indices, level tables) the references check themselves."""
    from dcnkit._lib import op_node

    node = op.onnx_node
    dims = [None if x is None else [int(d) for d in np.shape(x)] for x in node_inputs]
    try:
        return op_node(f"{node.domain or 'ai.onnx'}::{node.op_type}", [_attr_triple(a) for a in node.attribute],
                       dims)["attrs"]
    except FileNotFoundError:
        return None


def _declared_op(op: dict, variant: dict, fn) -> type:
    """An OpRun for one name of an op of the table (the kit's own or another tool's): the node's inputs in the op's
    canonical order (a variadic input as a list), its attributes as the core reads them (:func:`check_node`),
    through ``fn`` (the op's reference; keyword arguments where it names its inputs as the table does); results in
    the features' type."""
    from dcnkit.export import _table

    info = _table.op(op["name"])
    features = next(i for i, t in enumerate(op["inputs"]) if not t.get("rois") and not t.get("int64"))
    names = [t["name"] for t in op["inputs"]]
    by_name = set(names) <= set(inspect.signature(fn).parameters)

    def _run(self, *node_inputs, **_):
        read = check_node(self, node_inputs)
        canonical: list = [None] * len(op["inputs"])
        slots = variant["inputs"]
        for i, x in enumerate(node_inputs):
            slot = slots[min(i, len(slots) - 1)]
            if slot["variadic"]:
                canonical[slot["canonical"]] = (canonical[slot["canonical"]] or []) + [x]
                continue
            if i >= len(slots) or x is None:
                continue
            if variant["empty_input_is_absent"] and slot["optional"] and np.asarray(x).size == 0:
                continue
            canonical[slot["canonical"]] = x
        for slot in slots:
            if not slot["optional"] and canonical[slot["canonical"]] is None:
                raise ValueError(f"{variant['op_type']}: {names[slot['canonical']]}: expected a tensor, got no input")
        attrs = {a.name: a.convert(read[a.name]) for a in info.attrs}
        out = fn(**dict(zip(names, canonical)), **attrs) if by_name else fn(*canonical, **attrs)
        x = canonical[features]
        dtype = (x[0] if isinstance(x, list) else x).dtype
        outs = out if isinstance(out, tuple) else (out,)
        return tuple(np.asarray(o).astype(dtype, copy=False) for o in outs)[: len(self.onnx_node.output)]

    return type(variant["op_type"], (OpRun,), {"op_domain": variant["domain"], "_run": _run})


def _takes_the_table(fn, op: dict) -> bool:
    """Whether ``fn`` takes every attribute of the op under its canonical name."""
    params = inspect.signature(fn).parameters
    return all(a["name"] in params for a in op["attrs"])


def declared_ops(have: set, functions: dict | None = None) -> tuple:
    """OpRun classes for every name (domain, op type) of the op table not in ``have`` whose op's reference takes the
    op's canonical attributes: ``functions[<op name>]`` where given, else ``dcnkit.reference.<op name>``."""
    from dcnkit import op_defs

    try:
        table = op_defs()
    except FileNotFoundError:  # no native library to read the table from: the classes written by hand only
        return ()
    out = []
    for op in table["ops"]:
        fn = (functions or {}).get(op["name"]) or getattr(_ref(), op["name"], None)
        if fn is None or not _takes_the_table(fn, op):
            continue
        for v in op.get("variants", []):
            if not v["tensorrt_only"] and not v.get("onnx_standard") and (v["domain"], v["op_type"]) not in have:
                out.append(_declared_op(op, v, fn))
    return tuple(out)
