"""Loads the PyTorch operator library once (torch.ops.dcnkit.*)."""
from __future__ import annotations

import torch

from dcnkit._lib import find_library

_loaded = False


def load() -> None:
    global _loaded
    if not _loaded:
        torch.ops.load_library(str(find_library("dcnkit_torch")))
        _loaded = True


load()
