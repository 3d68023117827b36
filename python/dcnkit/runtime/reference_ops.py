"""The reference runner's ops read from the op table: every name of every op (the kit's own and other tools')
runs its op's NumPy reference, ``dcnkit.reference.<op name>(inputs..., **attributes)``, with the node's inputs in the
op's canonical order and its attributes under their canonical names and defaults (see
:mod:`dcnkit.runtime.reference_runner`, which adds the classes written by hand)."""
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


def _declared_op(op: dict, variant: dict) -> type:
    """An OpRun for one name of an op of the table (the kit's own or another tool's): the node's inputs in the op's
    canonical order (a variadic input as a list), its attributes under their canonical names with the table's
    defaults, through ``dcnkit.reference.<op name>``; results in the features' type."""
    from dcnkit.export import _table

    info = _table.op(op["name"])
    features = next(i for i, t in enumerate(op["inputs"]) if not t.get("rois") and not t.get("int64"))
    fields = variant["attrs"] or [{"name": a.name, "canonical": a.name, "element": -1, "enum": None}
                                  for a in info.attrs]

    def _run(self, *node_inputs, **_):
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
        attrs = info.defaults()
        for f in fields:
            v = _attr(self, f["name"], None)
            if v is None:
                continue
            a = info.attr(f["canonical"])
            if f["enum"]:
                v = f["enum"].split("|")[int(v)]
            elif f["element"] >= 0:
                v = [*attrs[a.name][: f["element"]], int(v), *attrs[a.name][f["element"] + 1:]]
            attrs[a.name] = a.convert(v)
        fn = getattr(_ref(), op["name"])
        names = [t["name"] for t in op["inputs"]]
        if set(names) <= set(inspect.signature(fn).parameters):  # the reference names its inputs as the table does
            out = fn(**dict(zip(names, canonical)), **attrs)
        else:
            out = fn(*canonical, **attrs)
        x = canonical[features]
        dtype = (x[0] if isinstance(x, list) else x).dtype
        outs = out if isinstance(out, tuple) else (out,)
        return tuple(np.asarray(o).astype(dtype, copy=False) for o in outs)[: len(self.onnx_node.output)]

    return type(variant["op_type"], (OpRun,), {"op_domain": variant["domain"], "_run": _run})


def _takes_the_table(op: dict) -> bool:
    """Whether ``dcnkit.reference.<op name>`` exists and takes every attribute of the op under its canonical name."""
    fn = getattr(_ref(), op["name"], None)
    if fn is None:
        return False
    params = inspect.signature(fn).parameters
    return all(a["name"] in params for a in op["attrs"])


def declared_ops(have: set) -> tuple:
    """OpRun classes for every name (domain, op type) of the op table not in ``have`` whose op's NumPy reference
    (``dcnkit.reference.<op name>``) takes the op's canonical attributes."""
    from dcnkit import op_defs

    try:
        table = op_defs()
    except FileNotFoundError:  # no native library to read the table from: the classes written by hand only
        return ()
    out = []
    for op in table["ops"]:
        if not _takes_the_table(op):
            continue
        for v in op.get("variants", []):
            if not v["tensorrt_only"] and not v.get("onnx_standard") and (v["domain"], v["op_type"]) not in have:
                out.append(_declared_op(op, v))
    return tuple(out)
