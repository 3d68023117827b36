"""Hugging Face transformers' deformable-attention models on dcnkit's operator, with one call.

``patch(model)`` finds every multi-scale deformable-attention core of a transformers model and swaps it, in place,
for :func:`dcnkit.ops.multi_scale_deformable_attn` (autograd on CPU and CUDA, ``torch.compile``, one
``dcnkit::MultiScaleDeformableAttention`` node per attention layer with either ONNX exporter); ``unpatch(model)``
puts transformers' code back. Parameters, buffers and the ``state_dict`` are not touched.

Three call sites exist in transformers (docs/transformers.md):

- a ``MultiScaleDeformableAttention`` module (Deformable DETR, RT-DETR, Grounding DINO, MM-Grounding-DINO,
  OmDet-Turbo, LW-DETR): the instance's class is swapped for a subclass whose ``forward`` calls the kit's op;
- the module-level ``multi_scale_deformable_attention`` function called by an attention module's ``forward``
  (Mask2Former, OneFormer) and ``multi_scale_deformable_attention_v2`` (RT-DETR v2): the instance's class is
  swapped for a subclass whose ``forward`` is transformers' own code with that one name bound to the kit's version;
- ``ms_deformable_attn_core``, the v2 function bound per instance at construction (D-FINE, DEIMv2): that
  attribute is replaced.

Only the given model's modules change (other models of the same classes keep transformers' code). Versions of
transformers outside :data:`SUPPORTED` are refused, and so is a call site whose code does not look as expected.
"""
from __future__ import annotations

import inspect
import types
from typing import Any

from dcnkit.integrations import _hf_cores, _versions

__all__ = ["patch", "unpatch", "patched_sites", "SUPPORTED"]

#: The transformers releases this integration knows (checked on 5.24.0): ``>=`` first, ``<`` second.
SUPPORTED = ("5.0", "6.0")

_FN = "multi_scale_deformable_attention"
_FN_V2 = "multi_scale_deformable_attention_v2"
_CORE_ATTR = "ms_deformable_attn_core"
_SAVED_CORE = "_dcnkit_original_ms_deformable_attn_core"
_MSDA_CLASS = "MultiScaleDeformableAttention"
# The parameters transformers' code has at each call site; anything else is a version this module does not know.
_MSDA_PARAMS = ("self", "value", "value_spatial_shapes", "value_spatial_shapes_list", "level_start_index",
                "sampling_locations", "attention_weights", "im2col_step")
_FN_PARAMS = ("value", "value_spatial_shapes", "sampling_locations", "attention_weights")
_FN_V2_PARAMS = _FN_PARAMS + ("num_points_list", "method")
_REPLACEMENTS = {_FN: _hf_cores.multi_scale_deformable_attention, _FN_V2: _hf_cores.multi_scale_deformable_attention_v2}
_EXPECTED_PARAMS = {_FN: _FN_PARAMS, _FN_V2: _FN_V2_PARAMS}

_patched_classes: dict[tuple[type, str], type] = {}


def check_version(version: str | None = None) -> str:
    """Raises ``RuntimeError`` unless transformers' version (or ``version``) is in :data:`SUPPORTED`."""
    return _versions.check_version("transformers", SUPPORTED, version)


def _params(fn: Any) -> tuple[str, ...]:
    return tuple(inspect.signature(fn).parameters)


def _unknown_code(where: str, what: str) -> RuntimeError:
    import transformers

    return RuntimeError(f"dcnkit.integrations.transformers: {where}: {what} (transformers {transformers.__version__});"
                        " refusing to patch code this module does not know")


def _from_transformers(obj: Any) -> bool:
    return (getattr(obj, "__module__", "") or "").startswith("transformers.")


def _rebound_forward(cls: type, name: str) -> Any:
    """``cls.forward`` as it is, with the global ``name`` bound to the kit's version."""
    fn = cls.forward
    code = getattr(fn, "__code__", None)
    if code is None or name not in code.co_names:
        raise _unknown_code(f"{cls.__module__}.{cls.__qualname__}.forward", f"no call to {name} in its code")
    original = fn.__globals__.get(name)
    if original is None or _params(original) != _EXPECTED_PARAMS[name]:
        got = None if original is None else _params(original)
        raise _unknown_code(f"{cls.__module__}.{name}", f"expected parameters {_EXPECTED_PARAMS[name]}, got {got}")
    scope = dict(fn.__globals__)
    scope[name] = _REPLACEMENTS[name]
    new = types.FunctionType(code, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__doc__ = fn.__doc__
    return new


def _patched_class(cls: type, kind: str) -> type:
    """A subclass of ``cls`` (same name) whose ``forward`` runs on the kit's op; one per (class, kind)."""
    key = (cls, kind)
    if key not in _patched_classes:
        if kind == _MSDA_CLASS:
            if _params(cls.forward) != _MSDA_PARAMS:
                raise _unknown_code(f"{cls.__module__}.{cls.__qualname__}.forward",
                                    f"expected parameters {_MSDA_PARAMS}, got {_params(cls.forward)}")
            forward = _hf_cores.msda_module_forward
        else:
            forward = _rebound_forward(cls, kind)
        _patched_classes[key] = type(cls.__name__, (cls,), {
            "forward": forward, "__module__": cls.__module__, "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__, "_dcnkit_original_class": cls, "_dcnkit_site": kind})
    return _patched_classes[key]


def _site_of(module: Any) -> str | None:
    """The kind of call site ``module`` is (unpatched), or None."""
    cls = type(module)
    if not _from_transformers(cls):
        return None
    if cls.__name__ == _MSDA_CLASS:
        return _MSDA_CLASS
    core = module.__dict__.get(_CORE_ATTR)
    if core is not None and getattr(core, "__name__", None) == _FN_V2 and _from_transformers(core):
        return _CORE_ATTR
    code = getattr(getattr(cls, "forward", None), "__code__", None)
    if code is not None:
        for name in (_FN_V2, _FN):
            if name in code.co_names and _from_transformers(cls.forward.__globals__.get(name)):
                return name
    return None


def _is_patched(module: Any) -> bool:
    return "_dcnkit_original_class" in type(module).__dict__ or _SAVED_CORE in module.__dict__


def patched_sites(model: Any) -> list[tuple[str, str]]:
    """``(module name, call site)`` for every deformable-attention core of ``model`` now on the kit's op; the site
    is ``"MultiScaleDeformableAttention"``, ``"multi_scale_deformable_attention"``,
    ``"multi_scale_deformable_attention_v2"`` or ``"ms_deformable_attn_core"``."""
    out = []
    for name, module in model.named_modules():
        if "_dcnkit_original_class" in type(module).__dict__:
            out.append((name, type(module)._dcnkit_site))
        elif _SAVED_CORE in module.__dict__:
            out.append((name, _CORE_ATTR))
    return out


def _check_model(model: Any, who: str) -> None:
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{who}: model: expected a torch.nn.Module (a transformers model), got "
                        f"{type(model).__name__}")


def patch(model: Any) -> Any:
    """Swaps every multi-scale deformable-attention core of the transformers model ``model`` for
    :func:`dcnkit.ops.multi_scale_deformable_attn`, in place; returns ``model``.

    Raises ``ValueError`` when the model has none (naming its class), ``RuntimeError`` for a transformers version
    outside :data:`SUPPORTED` or a call site whose code differs from what this module knows. Patching an already
    patched model changes nothing. :func:`patched_sites` lists what was swapped; :func:`unpatch` reverts it.
    """
    _check_model(model, "patch")
    check_version()
    found = []
    for name, module in model.named_modules():
        if _is_patched(module):
            found.append(name)
            continue
        kind = _site_of(module)
        if kind is None:
            continue
        if kind == _CORE_ATTR:
            core = module.__dict__[_CORE_ATTR]
            if _params(core) != _FN_V2_PARAMS:
                raise _unknown_code(f"{type(module).__qualname__}.{_CORE_ATTR}",
                                    f"expected parameters {_FN_V2_PARAMS}, got {_params(core)}")
            module.__dict__[_SAVED_CORE] = core
            module.__dict__[_CORE_ATTR] = _hf_cores.multi_scale_deformable_attention_v2
        else:
            module.__class__ = _patched_class(type(module), kind)
        found.append(name)
    if not found:
        raise ValueError(f"patch: model: expected a transformers model with multi-scale deformable attention "
                         f"(a {_MSDA_CLASS} module, or attention calling {_FN} or {_FN_V2}), found none in "
                         f"{type(model).__name__}")
    return model


def unpatch(model: Any) -> Any:
    """Puts transformers' own deformable-attention code back into a model patched by :func:`patch`; returns
    ``model``. Raises ``ValueError`` when nothing in ``model`` is patched."""
    _check_model(model, "unpatch")
    reverted = 0
    for module in model.modules():
        original = type(module).__dict__.get("_dcnkit_original_class")
        if original is not None:
            module.__class__ = original
            reverted += 1
        if _SAVED_CORE in module.__dict__:
            module.__dict__[_CORE_ATTR] = module.__dict__.pop(_SAVED_CORE)
            reverted += 1
    if not reverted:
        raise ValueError(f"unpatch: model: expected a model patched by dcnkit.integrations.transformers.patch, "
                         f"found nothing patched in {type(model).__name__}")
    return model
