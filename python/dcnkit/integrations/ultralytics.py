"""Ultralytics' RT-DETR on dcnkit's deformable attention, with one call.

``patch(model)`` makes every ``MSDeformAttn`` of an Ultralytics model (``RTDETR("rtdetr-l.yaml")``, ``RTDETR(...)
.model`` or any ``nn.Module`` holding them) compute its sampling with :func:`dcnkit.ops.multi_scale_deformable_attn`
instead of Ultralytics' ``multi_scale_deformable_attn_pytorch`` (one ``F.grid_sample`` per level). The result and
every parameter gradient are Ultralytics' own (the same bilinear sampling with zeros outside, in one kernel), so the
model trains on as before; Ultralytics' own ``export(format="onnx")`` then writes one
``dcnkit::MultiScaleDeformableAttention`` node per attention layer and no ``GridSample`` (static and
``dynamic=True`` exports alike: the level tables follow the maps' sizes). Only the given model changes: its
modules' class is swapped for a subclass whose ``forward`` is Ultralytics' code with that one function bound to the
kit's. Traces for other targets than ONNX (``format="openvino"``, ``"torchscript"``: ``torch.jit.trace`` outside an
ONNX export) keep Ultralytics' function, which OpenVINO's PyTorch frontend and TorchScript know.

Every call of ``patch``, ``patch()`` without a model included, also gives Ultralytics' inference backends the kit's
libraries: its ONNX Runtime backend (``AutoBackend`` for ``.onnx`` files, hence ``RTDETR("fused.onnx").predict()``
and ``val``) registers the kit's custom-op library in its session options (the CUDA build where it runs on the
CUDA execution provider), and its OpenVINO backend adds the kit's OpenVINO extension to its ``Core``. ``unpatch``
undoes both. Ultralytics releases outside :data:`SUPPORTED` are refused with a RuntimeError before anything changes.
"""
from __future__ import annotations

import contextlib
import types
from typing import Any

from dcnkit.integrations import _versions

__all__ = ["patch", "unpatch", "patched_sites", "SUPPORTED"]

#: The Ultralytics releases this integration knows (checked on 8.4.190): ``>=`` first, ``<`` second.
SUPPORTED = ("8.3", "9.0")

_FN = "multi_scale_deformable_attn_pytorch"
_CLASS = "MSDeformAttn"
_FN_PARAMS = ("value", "value_spatial_shapes", "sampling_locations", "attention_weights")
_patched_classes: dict[type, type] = {}
_saved_loaders: dict[type, Any] = {}
_registered_options: dict[int, Any] = {}  # id -> SessionOptions already given the kit's library (kept alive)


def check_version(version: str | None = None) -> str:
    """Raises ``RuntimeError`` unless ultralytics' version (or ``version``) is in :data:`SUPPORTED`."""
    return _versions.check_version("ultralytics", SUPPORTED, version)


def _transformer_module():
    from ultralytics.nn.modules import transformer

    fn = getattr(transformer, _FN, None)
    cls = getattr(transformer, _CLASS, None)
    import inspect

    if fn is None or cls is None or tuple(inspect.signature(fn).parameters) != _FN_PARAMS or \
            _FN not in cls.forward.__code__.co_names:
        raise RuntimeError(f"dcnkit.integrations.ultralytics: ultralytics.nn.modules.transformer has no {_CLASS} calling "
                           f"{_FN}{_FN_PARAMS} (an Ultralytics release this integration does not know)")
    return transformer


def kit_msda(value, value_spatial_shapes, sampling_locations, attention_weights):
    """Ultralytics' ``multi_scale_deformable_attn_pytorch``: ``value (N, S, M, D)``, the levels' ``(H, W)``,
    locations ``(N, Lq, M, L*P, 2)`` and weights ``(N, Lq, M, L*P)`` -> ``(N, Lq, M*D)``, on the kit's op."""
    import torch

    from dcnkit.integrations import _hf_cores

    if torch.jit.is_tracing() and not torch.onnx.is_in_onnx_export():
        return _saved_fn()(value, value_spatial_shapes, sampling_locations, attention_weights)
    levels = len(value_spatial_shapes)
    points = sampling_locations.shape[3] // levels
    return _hf_cores.multi_scale_deformable_attention_v2(value, value_spatial_shapes, sampling_locations,
                                                         attention_weights, [points] * levels)


def _saved_fn():
    return _transformer_module().__dict__[_FN]


def _patched_class(cls: type) -> type:
    """A subclass of ``cls`` whose ``forward`` is ``cls.forward`` reading ``multi_scale_deformable_attn_pytorch`` as
    the kit's function (its other globals are Ultralytics' module's)."""
    if cls not in _patched_classes:
        fwd = cls.forward
        globs = dict(fwd.__globals__)
        globs[_FN] = kit_msda
        new_fwd = types.FunctionType(fwd.__code__, globs, fwd.__name__, fwd.__defaults__, fwd.__closure__)
        new_fwd.__kwdefaults__ = fwd.__kwdefaults__
        new_fwd.__qualname__ = fwd.__qualname__
        _patched_classes[cls] = type(cls.__name__, (cls,), {"forward": new_fwd, "__module__": cls.__module__,
                                                             "_dcnkit_original_class": cls})
    return _patched_classes[cls]


def _modules(model) -> Any:
    import torch

    inner = getattr(model, "model", None)
    if not isinstance(model, torch.nn.Module) and isinstance(inner, torch.nn.Module):
        return inner  # the Ultralytics wrapper (RTDETR, YOLO): its nn.Module
    if isinstance(model, torch.nn.Module):
        return model
    raise TypeError(f"dcnkit.integrations.ultralytics: model: expected an Ultralytics model or an nn.Module, got "
                    f"{type(model).__name__}")


def patch(model=None) -> list[str]:
    """Makes ``model``'s deformable attention run the kit's op (the module docstring) and gives Ultralytics'
    ONNX Runtime and OpenVINO backends the kit's libraries; returns the names of the modules patched. ``model=None``:
    the backends only. ValueError when the model has no ``MSDeformAttn``."""
    check_version()
    transformer = _transformer_module()
    root = _modules(model) if model is not None else None
    targets = [] if root is None else [(n, m) for n, m in root.named_modules() if isinstance(m, transformer.MSDeformAttn)]
    if root is not None and not targets:
        raise ValueError("dcnkit.integrations.ultralytics: model: expected a model with MSDeformAttn modules "
                         "(RT-DETR), found none")
    _install_backends()
    for _, m in targets:
        if not hasattr(type(m), "_dcnkit_original_class"):
            m.__class__ = _patched_class(type(m))
    return [n for n, _ in targets]


def unpatch(model=None) -> list[str]:
    """Puts Ultralytics' code back in ``model`` (None: nothing of a model) and takes the kit's libraries out of its
    backends' loading; returns the names of the modules restored."""
    restored = []
    if model is not None:
        for n, m in _modules(model).named_modules():
            original = getattr(type(m), "_dcnkit_original_class", None)
            if original is not None:
                m.__class__ = original
                restored.append(n)
    for cls, loader in list(_saved_loaders.items()):
        cls.load_model = loader
        del _saved_loaders[cls]
    return restored


def patched_sites(model) -> list[str]:
    """The names of the modules of ``model`` that run the kit's op."""
    return [n for n, m in _modules(model).named_modules() if hasattr(type(m), "_dcnkit_original_class")]


# -- Ultralytics' inference backends --------------------------------------------------------------------------------
def _kit_session_options(options, device):
    """``options`` (or new SessionOptions) with the kit's custom-op library registered once: the CUDA build where
    Ultralytics will run on the CUDA execution provider."""
    import onnxruntime as ort
    import torch

    from dcnkit.runtime.ort import cuda_provider_available, ort_library

    so = options if options is not None else ort.SessionOptions()
    if id(so) in _registered_options:
        return so
    cuda = isinstance(device, torch.device) and device.type == "cuda" and torch.cuda.is_available() \
        and cuda_provider_available()
    so.register_custom_ops_library(ort_library(cuda=cuda))
    _registered_options[id(so)] = so
    return so


@contextlib.contextmanager
def _kit_openvino_core():
    """``openvino.Core`` made with the kit's extension added, while Ultralytics' OpenVINO backend loads a model."""
    import openvino

    from dcnkit.runtime.openvino import extension_library

    plain = openvino.Core
    path = str(extension_library())

    class Core(plain):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_extension(path)

    openvino.Core = Core
    try:
        yield
    finally:
        openvino.Core = plain


def _install_backends() -> None:
    from ultralytics.nn.backends.onnx import ONNXBackend
    from ultralytics.nn.backends.openvino import OpenVINOBackend

    if ONNXBackend not in _saved_loaders:
        onnx_load = ONNXBackend.load_model

        def load_onnx(self, weight):
            if getattr(self, "format", "onnx") == "onnx":
                self.session_options = _kit_session_options(self.session_options, self.device)
            return onnx_load(self, weight)

        _saved_loaders[ONNXBackend] = onnx_load
        ONNXBackend.load_model = load_onnx
    if OpenVINOBackend not in _saved_loaders:
        ov_load = OpenVINOBackend.load_model

        def load_openvino(self, weight):
            with _kit_openvino_core():
                return ov_load(self, weight)

        _saved_loaders[OpenVINOBackend] = ov_load
        OpenVINOBackend.load_model = load_openvino
