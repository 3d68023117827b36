"""The backends, by name: :func:`available_backends`, :func:`check_backend`, :func:`make_runner`.

Each backend is declared by its own module as ``BACKENDS = (Backend(name, unavailable_reason, runner), ...)``
(:class:`~dcnkit.runtime.base.Backend`). The table below says which module declares which name; a module is
imported only when its backend is asked for, so making an ``ort-cpu`` runner never imports TensorRT's tools or
``onnx.reference``. Adding a backend is one module that declares it and one line in this table; backend modules
import :mod:`dcnkit.runtime.base`, never this module.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the registry imports no backend code until a backend is asked for
    from dcnkit.runtime.base import Backend, Runner

_MODULES = {
    "ort-cpu": "dcnkit.runtime.ort_runner",
    "ort-cuda": "dcnkit.runtime.ort_runner",
    "tensorrt": "dcnkit.runtime.tensorrt",
    "reference": "dcnkit.runtime.reference_runner",
    "openvino": "dcnkit.runtime.openvino",
}

BACKENDS = tuple(_MODULES)
DEFAULT_BACKEND = "ort-cpu"


def check_backend(backend: str) -> str:
    """Validates a backend name; returns it. Unknown -> ValueError naming the argument and the choices."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    return backend


def backend_declaration(name: str) -> Backend:
    """The declaration of backend ``name`` (imports its module; ImportError when the module cannot load here)."""
    module = importlib.import_module(_MODULES[check_backend(name)])
    for b in module.BACKENDS:
        if b.name == name:
            return b
    raise LookupError(f"{module.__name__} does not declare the backend {name!r} (BACKENDS: "
                      f"{[b.name for b in module.BACKENDS]})")


def available_backends() -> dict[str, str | None]:
    """Every backend name -> None when it can run here, else the reason it cannot."""
    out = {}
    for name in BACKENDS:
        try:
            out[name] = backend_declaration(name).unavailable_reason()
        except ImportError as e:
            out[name] = f"{_MODULES[name]} cannot be imported ({type(e).__name__}: {e})"
    return out


def make_runner(model, backend: str = DEFAULT_BACKEND, kit_kernels: bool = True, **options) -> Runner:
    """A runner for ``model`` (path, bytes or ``onnx.ModelProto``) on ``backend``.

    ``kit_kernels`` (``ort-*`` only; default True): standard ``DeformConv`` nodes run on the kit's kernel;
    False keeps ONNX Runtime's built-in one (:func:`dcnkit.runtime.ort_session`).
    ``options`` go to the backend: ONNX Runtime ``SessionOptions`` attributes for ``ort-*`` (e.g.
    ``intra_op_num_threads=2``), ``workspace=`` (bytes) for ``tensorrt``. Raises ValueError for an unknown
    backend, :class:`~dcnkit.runtime.base.BackendUnavailable` when the backend cannot run here,
    FileNotFoundError for a missing model.
    """
    return backend_declaration(backend).runner(model, kit_kernels=kit_kernels, **options)


__all__ = ["BACKENDS", "DEFAULT_BACKEND", "available_backends", "backend_declaration", "check_backend", "make_runner"]
