"""What the ``tensorrt`` backend needs on this machine, and one line saying what is missing.

Kept apart from :mod:`dcnkit.runtime.tensorrt` (the engine builder and runner) so that both that module and its
``require_tensorrt`` read the same check; nothing here imports TensorRT unless asked whether it is there.
"""
from __future__ import annotations

from pathlib import Path

from dcnkit.runtime.gpu import gpu_present

# What to do when TensorRT is missing (one line, printed by every TensorRT entry point).
_TRT_INSTALL = "install it with `pip install tensorrt` on a machine with an NVIDIA GPU and driver"
_TRT_BUILD = ("rebuild dcnkit where the TensorRT headers and nvcc are (CMake finds them through TensorRT_ROOT or "
              "TensorRT_INCLUDE_DIR): pip install --no-build-isolation .")


def plugin_library() -> Path | None:
    """The kit's TensorRT plugin library (``libdcnkit_trt.so``), or None when it is not built."""
    import dcnkit

    try:
        return Path(dcnkit.tensorrt_library())
    except FileNotFoundError:
        return None


def tensorrt_reason() -> str | None:
    """None when TensorRT can run here, else one line naming everything missing and how to get it."""
    missing = []
    try:
        import tensorrt  # noqa: F401
    except Exception as e:
        missing.append(f"the tensorrt Python module is not installed ({type(e).__name__}: {e}): {_TRT_INSTALL}")
    if plugin_library() is None:
        missing.append(f"the kit's TensorRT plugin library libdcnkit_trt.so is not built: {_TRT_BUILD}")
    try:
        import polygraphy  # noqa: F401
    except ImportError:
        missing.append("polygraphy is not installed: pip install polygraphy")
    if missing:
        return "; ".join(missing)
    if not gpu_present():
        return "no NVIDIA GPU found on this machine (TensorRT builds and runs engines on a GPU)"
    return None
