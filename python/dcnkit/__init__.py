"""dcnkit: deformable convolution and RoI pooling that ship.

PyTorch operators with autograd (``dcnkit.ops``, ``dcnkit.nn``), ONNX export (``dcnkit.export``),
an ONNX Runtime custom-op library (``dcnkit.ort_library()``) and the tools around them.

``import dcnkit`` does not import torch; the submodules load on first use, and dcnkit's torch side loads
together with torch (see ``dcnkit._torch_side``).
"""
from __future__ import annotations

__version__ = "0.1.0"

from dcnkit._lib import find_library, op_defs  # noqa: F401


def ort_library() -> str:
    """Absolute path of the ONNX Runtime custom-op library shipped in this package.

    Register it with ``onnxruntime.SessionOptions().register_custom_ops_library(path)``, or use
    :func:`dcnkit.runtime.ort_session`.
    """
    return str(find_library("dcnkit_ort"))


def tensorrt_library() -> str:
    """Absolute path of the TensorRT plugin library (``libdcnkit_trt.so``: IPluginV3 creators, ``getCreators``).

    Load it with ``trt.get_plugin_registry().load_library(path)`` or ``trtexec --dynamicPlugins=path``
    (docs/tensorrt.md). It is built only where CMake finds the TensorRT headers and nvcc; otherwise
    FileNotFoundError says so.
    """
    try:
        return str(find_library("dcnkit_trt"))
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f"{e} -- libdcnkit_trt.so is built only when CMake finds the TensorRT headers (set TensorRT_ROOT or "
            "TensorRT_INCLUDE_DIR) and nvcc; rebuild dcnkit with them (pip install --no-build-isolation .)"
        ) from None


def cuda_compiled() -> bool:
    """True when the PyTorch operators were built with their CUDA kernels."""
    try:
        import torch
    except ImportError:
        return False
    from dcnkit import ops  # noqa: F401  (loads the library)

    return bool(torch.ops.dcnkit._cuda_compiled())


# The PyTorch side (``dcnkit.ops``: torch.ops.dcnkit.*; the exporters' registrations) loads with torch and
# never before it: at once when torch is already imported, else right after something imports torch. So
# deployment (dcnkit.runtime, dcnkit.server, `dcnkit run|compare|bench|serve` on ONNX Runtime) does not pay
# for PyTorch, while scripted models and plain torch.onnx.export still find the operators.
from dcnkit import _torch_side  # noqa: E402

_torch_side.install()

_LAZY_SUBMODULES = ("ops", "nn", "runtime", "reference", "export", "server", "cli", "demo", "polygraphy_ext")


def __getattr__(name: str):
    """``dcnkit.ops``, ``dcnkit.nn``, ``dcnkit.runtime``, ... import on first use (``ops``, ``nn`` and
    ``export`` import torch; ``runtime`` and ``server`` pull in ONNX Runtime, FastAPI...)."""
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f"dcnkit.{name}")
    raise AttributeError(f"module 'dcnkit' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))
