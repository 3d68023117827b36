"""dcnkit: deformable convolution and RoI pooling that ship.

PyTorch operators with autograd (``dcnkit.ops``, ``dcnkit.nn``), ONNX export (``dcnkit.export``),
an ONNX Runtime custom-op library (``dcnkit.ort_library()``) and the tools around them.

``import dcnkit`` does not import torch; the submodules load on first use, and dcnkit's torch side loads
together with torch (see ``dcnkit._torch_side``).
"""
from __future__ import annotations

__version__ = "0.1.0"

import json
import re
from pathlib import Path

from dcnkit._lib import find_library, op_defs  # noqa: F401


def ort_library() -> str:
    """Absolute path of the ONNX Runtime custom-op library shipped in this package.

    Register it with ``onnxruntime.SessionOptions().register_custom_ops_library(path)``, or use
    :func:`dcnkit.runtime.ort_session`.
    """
    return str(find_library("dcnkit_ort"))


def tensorrt_library(version: str | None = None) -> str:
    """Absolute path of the TensorRT plugin library that serves TensorRT ``version`` (``libdcnkit_trt.so``:
    IPluginV3 creators, ``getCreators``).

    ``version``: a release such as ``"10.3"`` or ``"11.1.0"``; None: the installed ``tensorrt`` module's (or, without
    one, the newest release this build serves). One file serves every release from 10.0 to 11.x that the build had
    headers for: it calls TensorRT's logger and registry through the ABI of the release it finds running
    (docs/tensorrt.md). A release no library serves (TensorRT 8.x and 9.x have no IPluginV3) is a ValueError naming
    it and the releases served. Load it with ``trt.get_plugin_registry().load_library(path)`` or ``trtexec
    --dynamicPlugins=path``. It is built only where CMake finds the TensorRT headers and nvcc; otherwise
    FileNotFoundError says so.
    """
    try:
        path = find_library("dcnkit_trt")
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f"{e} -- libdcnkit_trt.so is built only when CMake finds the TensorRT headers (set TensorRT_ROOT or "
            "TensorRT_INCLUDE_DIR) and nvcc; rebuild dcnkit with them (pip install --no-build-isolation .)"
        ) from None
    served = tensorrt_releases_served(path)
    wanted = _tensorrt_version() if version is None else str(version)
    if wanted is None:
        return str(path)
    if not re.fullmatch(r"\d+(\.\d+){0,3}", wanted.strip()):
        raise ValueError(f"tensorrt_library: version: expected a TensorRT release such as '10.3' or '11.1.0', got "
                         f"{wanted!r}")
    major = int(wanted.strip().split(".")[0])
    if major not in served:
        span = " and ".join(f"{m}.x" for m in served) or "no release"
        why = " (TensorRT 8.x and 9.x have no IPluginV3)" if major < 10 else ""
        raise ValueError(f"tensorrt_library: TensorRT {wanted} is not served{why}: this build's plugin library "
                         f"serves TensorRT {span}")
    return str(path)


def tensorrt_releases_served(path=None) -> list[int]:
    """The TensorRT majors the plugin library serves (what it was built with: ``dcnkit_trt.json`` beside it)."""
    path = Path(path) if path is not None else find_library("dcnkit_trt")
    manifest = path.with_name("dcnkit_trt.json")
    if not manifest.is_file():  # a library built before the manifest: the 11.x headers' alone
        return [11]
    return sorted(int(m) for m in json.loads(manifest.read_text())["tensorrt_majors"])


def _tensorrt_version() -> str | None:
    try:
        import tensorrt
    except Exception:  # noqa: BLE001 - not installed, or a broken install: no version to go by
        return None
    return getattr(tensorrt, "__version__", None)


def cuda_compiled() -> bool:
    """True when the PyTorch operators were built with their CUDA kernels."""
    try:
        import torch
    except ImportError:
        return False
    from dcnkit import ops  # noqa: F401  (loads the library)

    return bool(torch.ops.dcnkit._cuda_compiled())


def torch_cpu_gemm() -> str:
    """The GEMM the PyTorch operators' float32 CPU forward runs DeformConv2d's weight on: ``"oneDNN <version>
    (<library>)"`` (the weight packed once per call for oneDNN's matmul), or ``"libtorch BLAS (<why>)"`` where oneDNN
    3.x does not load (pip install onednn-cpu-gomp) or ``DCNKIT_NO_PACKED_GEMM`` is set. Needs torch."""
    import torch

    from dcnkit import ops  # noqa: F401  (loads the library)

    return str(torch.ops.dcnkit._cpu_gemm())


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
