"""Translations for torch.onnx's dynamo exporter (``torch.onnx.export(..., dynamo=True)``).

Plain ``torch.onnx.export`` builds its registry with ``ONNXRegistry.from_torchlib()``, which reads the
list of ONNX implementations that torch registers for its own operators
(``torch.onnx._internal.exporter._torchlib._torchlib_registry._registry``). We add our operators to that
list, so no ``custom_translation_table`` is needed. Two entries per op: one for opset 18 (the
exporter's lowest) and one for opset >= 19 (where ``DeformConv`` exists); the exporter keeps the one
with the highest opset not above the export's.

That module imports onnxscript (about half a second), so ``import dcnkit`` does not import it: a
post-import hook adds our entries when torch's exporter has loaded it and ``_registration`` (they
import each other; at once if both are loaded already).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import threading
from typing import Any

import torch

from dcnkit.export import _lowering, _table
from dcnkit.ops import _loader  # noqa: F401  (torch.ops.dcnkit.*)

_REGISTRY_MODULE = "torch.onnx._internal.exporter._torchlib._torchlib_registry"
_META_MODULE = "torch.onnx._internal.exporter._registration"
_OPSETS = (18, 19)
_lock = threading.Lock()
_registered = False


class _Emitter:
    def __init__(self, opset: int) -> None:
        import onnxscript

        self._std = onnxscript.opset19 if opset >= 19 else onnxscript.opset18
        self._custom = onnxscript.values.Opset(_table.domain(), _table.opset())

    @staticmethod
    def _inputs(inputs: tuple[Any, ...]) -> list[Any]:
        inputs_list = list(inputs)
        while inputs_list and inputs_list[-1] is None:
            inputs_list.pop()
        return inputs_list

    def op(self, op_type: str, *inputs: Any, **attrs: Any) -> Any:
        return getattr(self._std, op_type)(*self._inputs(inputs), **attrs)

    def custom(self, info: _table.OpInfo, inputs: list[Any], attrs: dict[str, Any]) -> Any:
        op = getattr(self._custom, info.onnx_type)
        if info.inputs and info.inputs[-1].variadic:
            # Inputs by name (the variadic one as a list): torch's node builder hands a positional variadic
            # parameter every positional argument, the ones before it included.
            fixed = len(info.inputs) - 1
            named = {t.name: v for t, v in zip(info.inputs[:fixed], inputs[:fixed])}
            named[info.inputs[-1].name] = list(inputs[fixed:])
            return op(**named, **attrs)
        out = op(*self._inputs(tuple(inputs)), **attrs)
        if len(info.outputs) > 1 and not isinstance(out, (tuple, list)):
            raise RuntimeError(f"{info.onnx_type}: expected {len(info.outputs)} outputs, got 1")
        return tuple(out) if isinstance(out, list) else out

    def cast_like(self, value: Any, like: Any) -> Any:
        """``value`` in ``like``'s dtype (a CastLike node only where the exported dtypes differ)."""
        vtype, ltype = getattr(value, "dtype", None), getattr(like, "dtype", None)
        if vtype is not None and vtype == ltype:
            return value
        return self._std.CastLike(value, like)

    def const_i64(self, value: int | list[int]) -> Any:
        if isinstance(value, int):
            return self._std.Constant(value_int=value)
        return self._std.Constant(value_ints=list(value))

    def static_shape(self, value: Any) -> list[int] | None:
        shape = getattr(value, "shape", None)
        if shape is None:
            return None
        dims = list(shape)
        return [int(d) for d in dims] if all(isinstance(d, int) for d in dims) else None


def _make_translation(name: str, opset: int):
    from dcnkit.export.schemas import register_onnx_schemas

    schema = getattr(torch.ops.dcnkit, name).default._schema
    args = list(schema.arguments)

    def translate(*call_args: Any, **call_kwargs: Any) -> Any:
        register_onnx_schemas()  # the custom-domain ops are built through their ONNX schemas
        values = list(call_args)
        for a in args[len(values) :]:
            if a.name in call_kwargs:
                values.append(call_kwargs[a.name])
            elif a.has_default_value():
                values.append(a.default_value)
            else:
                raise TypeError(f"dcnkit::{name}: missing argument {a.name!r} in the exported graph")
        tensors, scalars = {}, []
        for a, v in zip(args, values):
            if _lowering.is_tensor_arg(a):
                tensors[a.name] = v
            else:
                scalars.append(v)
        return _lowering.lower(name, tensors, scalars, _Emitter(opset), opset)

    translate.__name__ = f"dcnkit_{name}_opset{opset}"
    translate.__qualname__ = translate.__name__
    return translate


def _add_entries(registry_module: Any) -> None:
    global _registered
    with _lock:
        if _registered:
            return
        from torch.onnx._internal.exporter import _registration

        for name in _table.ops():
            target = getattr(torch.ops.dcnkit, name).default
            for opset in _OPSETS:
                registry_module._registry.append(
                    _registration.OnnxDecompMeta(
                        onnx_function=_make_translation(name, opset),
                        fx_target=target,
                        signature=None,
                        is_custom=True,
                        opset_introduced=opset,
                        skip_signature_inference=True,
                    )
                )
        # torch.onnx has no translation for aten._is_all_true, which torch._check_tensor_all (transformers'
        # torch_compilable_check on a tensor condition: RT-DETR v2, D-FINE) leaves in the graph while the assertion
        # that consumes it is removed: an unused value, which the exporter's optimizer then drops.
        registry_module._registry.append(
            _registration.OnnxDecompMeta(
                onnx_function=_is_all_true,
                fx_target=torch.ops.aten._is_all_true.default,
                signature=None,
                is_custom=True,
                opset_introduced=18,
                skip_signature_inference=True,
            )
        )
        _registered = True


def _is_all_true(x: Any) -> Any:
    import onnxscript

    std = onnxscript.opset18
    return std.Cast(std.ReduceMin(std.Cast(x, to=7), keepdims=0), to=9)  # INT64, then BOOL


def _try_add_entries() -> None:
    """Adds our entries once torch's registry list and ``OnnxDecompMeta`` are both fully loaded
    (the two modules import each other, so either may finish last)."""
    reg = sys.modules.get(_REGISTRY_MODULE)
    meta = sys.modules.get(_META_MODULE)
    if reg is not None and meta is not None and hasattr(reg, "_registry") and hasattr(meta, "OnnxDecompMeta"):
        _add_entries(reg)


class _PostImportHook(importlib.abc.MetaPathFinder):
    """Runs ``_try_add_entries`` right after torch's exporter loads either registry module."""

    def __init__(self) -> None:
        self.pending = {_REGISTRY_MODULE, _META_MODULE}

    def find_spec(self, fullname, path, target=None):  # noqa: D102
        if fullname not in self.pending:
            return None
        self.pending.discard(fullname)
        if not self.pending and self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module):
            loader_exec(module)
            _try_add_entries()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def register() -> None:
    """Makes plain ``torch.onnx.export(..., dynamo=True)`` translate the dcnkit ops (idempotent)."""
    if _registered:
        return
    _try_add_entries()
    if not _registered and not any(isinstance(f, _PostImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportHook())


def ensure_registered() -> None:
    """Imports torch's exporter registry now and adds our entries (used by ``to_onnx``)."""
    register()
    importlib.import_module(_META_MODULE)
    importlib.import_module(_REGISTRY_MODULE)
    _try_add_entries()
    if not _registered:
        raise RuntimeError("dcnkit: could not add the dcnkit ops to torch.onnx's exporter registry")
