"""The skip every ONNX Runtime CUDA-EP test starts with."""
from __future__ import annotations

import pytest


def ort_cuda_or_skip() -> None:
    """Skips the test unless onnxruntime has the CUDA execution provider and the kit's CUDA library is built."""
    import onnxruntime as ort

    from dcnkit.runtime.ort import ort_library

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime has no CUDAExecutionProvider here (install onnxruntime-gpu)")
    try:
        ort_library(cuda=True)
    except FileNotFoundError as e:
        pytest.skip(f"libdcnkit_ort_cuda.so not built: {e}")
