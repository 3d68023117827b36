"""ONNX Runtime sessions with the kit's custom-op library registered.

>>> from dcnkit.runtime import ort_session
>>> sess = ort_session("model.onnx", intra_op_num_threads=2)        # CUDA when available, else CPU
>>> y, = sess.run(None, {"input": x})

The library implements domain ``dcnkit`` (``DeformConv2d``, ``RoIAlign``, ``DeformRoIPool``,
``DeformPSRoIPool``) and the ops mmdeploy / mmcv 1.x export (``mmdeploy::MMCVModulatedDeformConv2d``,
``mmdeploy::MMCVDeformConv2d``, ``mmcv::MMCVModulatedDeformConv2d``, ``mmcv::MMCVDeformConv2d``,
``mmcv::MMCVRoiAlign``, ``mmcv::MMCVDeformRoIPool``), so models exported by those tools run unchanged.
Two builds exist: ``libdcnkit_ort.so`` (CPU kernels, no CUDA dependency) and ``libdcnkit_ort_cuda.so``
(CPU + CUDA execution-provider kernels, built when CUDA is); :func:`ort_library` picks one.
"""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

__all__ = ["ort_session", "ort_library", "default_providers", "cuda_provider_available"]

CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"


def _gpu_present() -> bool:
    """An NVIDIA GPU is visible: its device nodes (Linux, WSL), or torch says so when the process has already
    imported it. torch is never imported for this: the deployment side runs without it."""
    if any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")):
        return True
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # pragma: no cover
        return False


def cuda_provider_available() -> bool:
    """True when this onnxruntime has the CUDA execution provider and a GPU is present."""
    try:
        import onnxruntime as ort
    except ImportError:
        return False
    return CUDA_PROVIDER in ort.get_available_providers() and _gpu_present()


def default_providers() -> list:
    """CUDA (then CPU) when onnxruntime has the CUDA provider and a GPU exists, else CPU."""
    return [CUDA_PROVIDER, CPU_PROVIDER] if cuda_provider_available() else [CPU_PROVIDER]


def _provider_name(p) -> str:
    return p[0] if isinstance(p, (tuple, list)) else str(p)


def ort_library(cuda: bool = False) -> str:
    """Absolute path of the kit's custom-op library: the CUDA build (``libdcnkit_ort_cuda.so``) when
    ``cuda`` is true, else the CPU build (``libdcnkit_ort.so``). Raises FileNotFoundError listing the
    places searched when it is not there."""
    from dcnkit._lib import find_library

    if cuda:
        return str(find_library("dcnkit_ort_cuda"))
    import dcnkit

    return dcnkit.ort_library()


def _library_for(providers: list) -> str:
    wants_cuda = any(_provider_name(p) == CUDA_PROVIDER for p in providers)
    if wants_cuda and cuda_provider_available():
        try:
            return ort_library(cuda=True)
        except FileNotFoundError as e:
            warnings.warn(
                f"dcnkit: the CUDA build of the ONNX Runtime library is missing ({e}); the kit's ops will "
                "run on the CPU (rebuild with CUDA to get libdcnkit_ort_cuda.so)",
                RuntimeWarning,
                stacklevel=3,
            )
    return ort_library(cuda=False)


def _session_option_names(so) -> list[str]:
    names = []
    for n in dir(so):
        if n.startswith("_"):
            continue
        try:
            v = getattr(so, n)
        except Exception:  # pragma: no cover
            continue
        if not callable(v):
            names.append(n)
    return sorted(names)


def _coerce_option(ort, name: str, value):
    """Accepts enum names for the enum-valued options ("ORT_ENABLE_ALL", "ORT_SEQUENTIAL", ...)."""
    enums = {"graph_optimization_level": ort.GraphOptimizationLevel, "execution_mode": ort.ExecutionMode}
    if name in enums and isinstance(value, str):
        enum = enums[name]
        try:
            return getattr(enum, value)
        except AttributeError:
            choices = [m for m in dir(enum) if m.startswith("ORT_")]
            raise ValueError(f"ort_session: {name}: expected one of {choices}, got {value!r}") from None
    return value


def _model_arg(model):
    if isinstance(model, (bytes, bytearray)):
        return bytes(model)
    try:
        import onnx

        if isinstance(model, onnx.ModelProto):
            return model.SerializeToString()
    except ImportError:  # pragma: no cover - onnx is optional for running
        pass
    if isinstance(model, (str, os.PathLike)):
        path = Path(os.fspath(model))
        if not path.is_file():
            raise FileNotFoundError(f"ort_session: model: expected an existing ONNX file, got {str(path)!r}")
        return str(path)
    raise TypeError(f"ort_session: model: expected a path, bytes or onnx.ModelProto, got {type(model).__name__}")


def ort_session(model, providers=None, **options):
    """An ``onnxruntime.InferenceSession`` for ``model`` with the kit's custom-op library registered.

    ``model``: a path, serialized bytes or an ``onnx.ModelProto``. ``providers``: as for ONNX Runtime
    (names or ``(name, options)`` tuples); default :func:`default_providers`. ``options`` set attributes of
    ``onnxruntime.SessionOptions`` (``intra_op_num_threads=2``, ``graph_optimization_level="ORT_ENABLE_ALL"``,
    ``log_severity_level=3`` ...); an unknown name is a TypeError listing the valid ones. The CUDA build
    of the library is registered when the CUDA provider is requested and usable.
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    known = _session_option_names(so)
    for name, value in options.items():
        if name not in known:
            raise TypeError(
                f"ort_session: unknown SessionOptions attribute {name!r}; expected one of {', '.join(known)}"
            )
        try:
            setattr(so, name, _coerce_option(ort, name, value))
        except (TypeError, AttributeError) as e:
            raise TypeError(f"ort_session: {name}: cannot set {value!r}: {e}") from None
    providers = default_providers() if providers is None else list(providers)
    if not providers:
        raise ValueError("ort_session: providers: expected at least one execution provider, got []")
    so.register_custom_ops_library(_library_for(providers))
    return ort.InferenceSession(_model_arg(model), sess_options=so, providers=providers)
