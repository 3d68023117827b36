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
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

BACKENDS = ("ort-cpu", "ort-cuda", "tensorrt", "reference")
DEFAULT_BACKEND = "ort-cpu"

# What to do when TensorRT is missing (one line, printed by every TensorRT entry point).
_TRT_INSTALL = "install it with `pip install tensorrt` on a machine with an NVIDIA GPU and driver"
_TRT_BUILD = ("rebuild dcnkit where the TensorRT headers and nvcc are (CMake finds them through TensorRT_ROOT or "
              "TensorRT_INCLUDE_DIR): pip install --no-build-isolation .")


class BackendUnavailable(RuntimeError):
    """The backend exists but cannot run on this machine (the message says why)."""


@dataclass(frozen=True)
class TensorInfo:
    """A model input or output: name, NumPy dtype and shape (int, or str for a symbolic dim, None if unknown)."""

    name: str
    dtype: np.dtype
    shape: tuple

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) and d >= 0 for d in self.shape)


# ------------------------------------------------------------------------------------------------
# Model helpers
# ------------------------------------------------------------------------------------------------
def load_model(model) -> "Any":
    """An ``onnx.ModelProto`` from a path, bytes or a ModelProto."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model))
    path = Path(os.fspath(model))
    if not path.is_file():
        raise FileNotFoundError(f"model: expected an existing ONNX file, got {str(path)!r}")
    return onnx.load(str(path))


def _model_arg(model):
    """What ONNX Runtime accepts: a path string or serialized bytes."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model.SerializeToString()
    if isinstance(model, (bytes, bytearray)):
        return bytes(model)
    path = Path(os.fspath(model))
    if not path.is_file():
        raise FileNotFoundError(f"model: expected an existing ONNX file, got {str(path)!r}")
    return str(path)


def uses_custom_ops(model) -> bool:
    """True when the model has nodes in the ``dcnkit`` ONNX domain."""
    m = load_model(model)
    if any(n.domain == "dcnkit" for n in m.graph.node):
        return True
    return any(n.domain == "dcnkit" for f in m.functions for n in f.node)


def value_infos(values) -> list[TensorInfo]:
    """TensorInfo list from ONNX ``ValueInfoProto`` s (graph inputs / outputs)."""
    from onnx import helper

    out = []
    for v in values:
        tt = v.type.tensor_type
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        except Exception:
            dtype = np.dtype("float32")
        dims = []
        if tt.HasField("shape"):
            for d in tt.shape.dim:
                if d.HasField("dim_value"):
                    dims.append(int(d.dim_value))
                elif d.HasField("dim_param"):
                    dims.append(str(d.dim_param))
                else:
                    dims.append(None)
        out.append(TensorInfo(v.name, dtype, tuple(dims)))
    return out


_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def _ort_infos(nodes) -> list[TensorInfo]:
    out = []
    for n in nodes:
        dims = tuple(d if isinstance(d, (int, str)) or d is None else None for d in n.shape)
        out.append(TensorInfo(n.name, np.dtype(_ORT_TYPES.get(n.type, np.float32)), dims))
    return out


# ------------------------------------------------------------------------------------------------
# Runners
# ------------------------------------------------------------------------------------------------
class Runner:
    """Base class: ``name``, ``run``, ``inputs``, ``outputs``, ``close``; usable as a context manager."""

    name: str = "runner"

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # pragma: no cover
        raise NotImplementedError

    def inputs(self) -> list[TensorInfo]:  # pragma: no cover
        raise NotImplementedError

    def outputs(self) -> list[TensorInfo]:  # pragma: no cover
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return f"<{type(self).__name__} {self.name}>"

    def _check_feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        infos = self.inputs()
        names = [i.name for i in infos]
        missing = [n for n in names if n not in feeds]
        if missing:
            raise ValueError(f"feeds: expected inputs {names}, got {sorted(feeds)} (missing {missing})")
        extra = [n for n in feeds if n not in names]
        if extra:
            raise ValueError(f"feeds: expected inputs {names}, got unknown {extra}")
        out = {}
        for info in infos:
            a = np.asarray(feeds[info.name])
            if a.ndim != len(info.shape) and info.shape:
                raise ValueError(
                    f"feeds[{info.name!r}]: expected rank {len(info.shape)} {info.shape}, got shape {a.shape}"
                )
            for i, (want, got) in enumerate(zip(info.shape, a.shape)):
                if isinstance(want, int) and want >= 0 and want != got:
                    raise ValueError(
                        f"feeds[{info.name!r}]: expected shape {info.shape}, got {a.shape} (dim {i})"
                    )
            if a.dtype != info.dtype:
                a = a.astype(info.dtype)
            out[info.name] = np.ascontiguousarray(a)
        return out


def _make_ort_session(model, providers, **options):
    """An ONNX Runtime session with the kit's library registered (via dcnkit.runtime.ort_session)."""
    try:
        from dcnkit.runtime import ort_session

        return ort_session(model, providers=providers, **options)
    except NotImplementedError:
        pass
    # Fallback while dcnkit.runtime.ort_session is a placeholder.
    import onnxruntime as ort

    so = ort.SessionOptions()
    for k, v in options.items():
        setattr(so, k, v)
    try:
        import dcnkit

        so.register_custom_ops_library(dcnkit.ort_library())
    except FileNotFoundError:
        if uses_custom_ops(model):
            raise
    return ort.InferenceSession(_model_arg(model), sess_options=so, providers=providers)


class OrtRunner(Runner):
    """ONNX Runtime with the kit's custom-op library; ``device`` is ``"cpu"`` or ``"cuda"``."""

    def __init__(self, model, device: str = "cpu", **options):
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device: expected 'cpu' or 'cuda', got {device!r}")
        self.name = f"ort-{device}"
        if device == "cuda":
            reason = _ort_cuda_reason()
            if reason:
                raise BackendUnavailable(f"ort-cuda: {reason}")
            providers = [("CUDAExecutionProvider", {}), "CPUExecutionProvider"]
        else:
            providers = ["CPUExecutionProvider"]
        self.session = _make_ort_session(model, providers, **options)
        if device == "cuda" and "CUDAExecutionProvider" not in self.session.get_providers():
            raise BackendUnavailable("ort-cuda: the CUDA execution provider failed to initialise")

    def inputs(self):
        return _ort_infos(self.session.get_inputs())

    def outputs(self):
        return _ort_infos(self.session.get_outputs())

    def run(self, feeds):
        feeds = self._check_feeds(feeds)
        names = [o.name for o in self.session.get_outputs()]
        res = self.session.run(names, feeds)
        return dict(zip(names, res))

    def close(self):
        self.session = None


def _tensorrt_plugin_library():
    import dcnkit

    try:
        return Path(dcnkit.tensorrt_library())
    except FileNotFoundError:
        return None


def __getattr__(name):
    """``TensorRTRunner`` lives in :mod:`dcnkit.runtime.tensorrt` (Polygraphy's TrtRunner underneath)."""
    if name == "TensorRTRunner":
        from dcnkit.runtime.tensorrt import TensorRTRunner

        return TensorRTRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------------------------------------------
# Availability
# ------------------------------------------------------------------------------------------------
def _ort_cpu_reason() -> str | None:
    try:
        import onnxruntime  # noqa: F401
    except ImportError as e:
        return f"onnxruntime is not installed ({e})"
    try:
        import dcnkit

        dcnkit.ort_library()
    except FileNotFoundError as e:
        return f"the kit's ONNX Runtime library is missing: {e}"
    return None


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


def _ort_cuda_reason() -> str | None:
    r = _ort_cpu_reason()
    if r:
        return r
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return (
            f"onnxruntime {ort.__version__} has no CUDAExecutionProvider "
            f"(providers: {', '.join(ort.get_available_providers())}; install onnxruntime-gpu)"
        )
    if not _gpu_present():
        return "no NVIDIA GPU found on this machine"
    return None


def _tensorrt_reason() -> str | None:
    """None when TensorRT can run here, else one line naming everything missing and how to get it."""
    missing = []
    try:
        import tensorrt  # noqa: F401
    except Exception as e:
        missing.append(f"the tensorrt Python module is not installed ({type(e).__name__}: {e}): {_TRT_INSTALL}")
    if _tensorrt_plugin_library() is None:
        missing.append(f"the kit's TensorRT plugin library libdcnkit_trt.so is not built: {_TRT_BUILD}")
    try:
        import polygraphy  # noqa: F401
    except ImportError:
        missing.append("polygraphy is not installed: pip install polygraphy")
    if missing:
        return "; ".join(missing)
    if not _gpu_present():
        return "no NVIDIA GPU found on this machine (TensorRT builds and runs engines on a GPU)"
    return None


def _reference_reason() -> str | None:
    try:
        import onnx.reference  # noqa: F401
    except ImportError as e:
        return f"onnx.reference is not available ({e})"
    return None


_REASONS = {
    "ort-cpu": _ort_cpu_reason,
    "ort-cuda": _ort_cuda_reason,
    "tensorrt": _tensorrt_reason,
    "reference": _reference_reason,
}


def available_backends() -> dict[str, str | None]:
    """Every backend name -> None when it can run here, else the reason it cannot."""
    return {name: _REASONS[name]() for name in BACKENDS}


def check_backend(backend: str) -> str:
    """Validates a backend name; returns it. Unknown -> ValueError naming the argument and the choices."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    return backend


def make_runner(model, backend: str = DEFAULT_BACKEND, **options) -> Runner:
    """A runner for ``model`` (path, bytes or ``onnx.ModelProto``) on ``backend``.

    ``options`` go to the backend: ONNX Runtime ``SessionOptions`` attributes for ``ort-*`` (e.g.
    ``intra_op_num_threads=2``), ``workspace=`` (bytes) for ``tensorrt``. Raises ValueError for an unknown
    backend, :class:`BackendUnavailable` when the backend cannot run here, FileNotFoundError for a missing model.
    """
    check_backend(backend)
    if backend == "ort-cpu":
        return OrtRunner(model, "cpu", **options)
    if backend == "ort-cuda":
        return OrtRunner(model, "cuda", **options)
    if backend == "tensorrt":
        reason = _tensorrt_reason()
        if reason:
            raise BackendUnavailable(f"tensorrt: {reason}")
        from dcnkit.runtime.tensorrt import TensorRTRunner

        return TensorRTRunner(model, **options)
    from dcnkit.runtime.reference_runner import ReferenceRunner

    return ReferenceRunner(model, **options)


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
