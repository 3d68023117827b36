"""Backend runners: one small interface over every way the kit can execute an ONNX model.

>>> from dcnkit.runtime.runners import available_backends, make_runner
>>> available_backends()            # {"ort-cpu": None, "ort-cuda": "onnxruntime ... has no CUDA...", ...}
>>> with make_runner("model.onnx", "ort-cpu") as r:
...     print(r.inputs())           # [TensorInfo(name='input', dtype=dtype('float32'), shape=('batch', 3, 64, 64))]
...     out = r.run({"input": x})   # {"output": np.ndarray}

Backends (``BACKENDS``):

``ort-cpu``    ONNX Runtime, CPU execution provider, with the kit's custom-op library registered (default).
``ort-cuda``   ONNX Runtime, CUDA execution provider (needs onnxruntime-gpu and a GPU).
``tensorrt``   TensorRT with the kit's plugin library (needs the ``tensorrt`` module and ``libdcnkit_trt.so``).
``reference``  :mod:`dcnkit.runtime.reference_runner`: the whole model in ``onnx.reference`` with the kit's
               slow NumPy references for the deformable / RoI ops. Slow, independent, always available.

Every runner has ``.name``, ``.run(feeds) -> dict``, ``.inputs()`` / ``.outputs()`` (lists of
:class:`TensorInfo`; symbolic dims are ``str``, unknown dims ``None``) and ``.close()``; runners are context
managers. A backend that cannot run here raises :class:`BackendUnavailable` (a ``RuntimeError``) with the reason.

This module is the public face of the runtime's runners; the code lives in :mod:`dcnkit.runtime.base` (the
interface), :mod:`dcnkit.runtime.registry` (the backends by name) and one module per backend. Nothing inside
dcnkit imports it.
"""
from __future__ import annotations

from dcnkit.runtime.base import BackendUnavailable, Runner, TensorInfo, load_model, uses_custom_ops, value_infos
from dcnkit.runtime.ort_runner import OrtRunner
from dcnkit.runtime.registry import BACKENDS, DEFAULT_BACKEND, available_backends, check_backend, make_runner


def __getattr__(name):
    """``TensorRTRunner`` lives in :mod:`dcnkit.runtime.tensorrt` (Polygraphy's TrtRunner underneath)."""
    if name == "TensorRTRunner":
        from dcnkit.runtime.tensorrt import TensorRTRunner

        return TensorRTRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "BackendUnavailable",
    "TensorInfo",
    "Runner",
    "OrtRunner",
    "TensorRTRunner",
    "available_backends",
    "check_backend",
    "make_runner",
    "load_model",
    "uses_custom_ops",
    "value_infos",
]
