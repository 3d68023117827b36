"""Whether an NVIDIA GPU is here, asked without importing torch or a CUDA library (the backends' checks use it)."""
from __future__ import annotations

import os
import sys


def gpu_present() -> bool:
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

