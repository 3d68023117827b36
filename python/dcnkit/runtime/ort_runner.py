"""The ONNX Runtime backends, ``ort-cpu`` and ``ort-cuda``: :class:`OrtRunner` over :func:`dcnkit.runtime.ort_session`
(the kit's custom-op library registered), and what each needs on this machine.

``ort-cpu``   ONNX Runtime, CPU execution provider (the default backend).
``ort-cuda``  ONNX Runtime, CUDA execution provider (needs onnxruntime-gpu and a GPU).
"""
from __future__ import annotations

import numpy as np

from dcnkit.runtime.base import Backend, BackendUnavailable, Runner, TensorInfo
from dcnkit.runtime.gpu import gpu_present

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


def _make_ort_session(model, providers, **options):
    """An ONNX Runtime session with the kit's library registered, through the package's ``ort_session`` (so
    whatever wraps ``dcnkit.runtime.ort_session`` sees every session a runner makes)."""
    from dcnkit import runtime

    return runtime.ort_session(model, providers=providers, **options)


class OrtRunner(Runner):
    """ONNX Runtime with the kit's custom-op library; ``device`` is ``"cpu"`` or ``"cuda"``. ``kit_kernels``
    (default True) runs standard ``DeformConv`` nodes on the kit's kernel (see :func:`dcnkit.runtime.ort_session`)."""

    def __init__(self, model, device: str = "cpu", kit_kernels: bool = True, **options):
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device: expected 'cpu' or 'cuda', got {device!r}")
        self.name = f"ort-{device}"
        if device == "cuda":
            reason = ort_cuda_reason()
            if reason:
                raise BackendUnavailable(f"ort-cuda: {reason}")
            providers = [("CUDAExecutionProvider", {}), "CPUExecutionProvider"]
        else:
            providers = ["CPUExecutionProvider"]
        self.session = _make_ort_session(model, providers, kit_kernels=kit_kernels, **options)
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


def ort_cpu_reason() -> str | None:
    """None when ONNX Runtime and the kit's library are here, else what is missing."""
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


def ort_cuda_reason() -> str | None:
    """None when ONNX Runtime's CUDA execution provider and a GPU are here, else what is missing."""
    r = ort_cpu_reason()
    if r:
        return r
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return (
            f"onnxruntime {ort.__version__} has no CUDAExecutionProvider "
            f"(providers: {', '.join(ort.get_available_providers())}; install onnxruntime-gpu)"
        )
    if not gpu_present():
        return "no NVIDIA GPU found on this machine"
    return None


def _cpu_runner(model, kit_kernels: bool = True, **options) -> OrtRunner:
    return OrtRunner(model, "cpu", kit_kernels=kit_kernels, **options)


def _cuda_runner(model, kit_kernels: bool = True, **options) -> OrtRunner:
    return OrtRunner(model, "cuda", kit_kernels=kit_kernels, **options)


BACKENDS = (
    Backend("ort-cpu", ort_cpu_reason, _cpu_runner),
    Backend("ort-cuda", ort_cuda_reason, _cuda_runner),
)

__all__ = ["OrtRunner", "ort_cpu_reason", "ort_cuda_reason", "BACKENDS"]
