"""Keeps Polygraphy from importing torch on dcnkit's deployment side.

Polygraphy asks "is this array a torch tensor?" (``util.array.is_torch``), "is this dtype torch's?"
(``datatype.torch.from_torch``) and "can I encode torch tensors?" (``json.serde``) by *importing* torch when it
is installed: 0.6 GB and a second of every ``dcnkit compare`` / TensorRT run that never touches torch. An
object can only be a torch tensor or dtype once torch has been imported, so the answer does not change if
torch counts as available exactly when it is already in ``sys.modules``. :func:`install` puts a stand-in with
that rule in place of those modules' lazy ``torch`` handles; everything else is delegated to the original
handle, so a process that does use torch sees no difference.
"""
from __future__ import annotations

import importlib
import sys

_MODULES = ("polygraphy.util.array", "polygraphy.datatype.torch", "polygraphy.json.serde")


class ImportedTorchOnly:
    """Polygraphy's lazy ``torch`` handle, available only when torch is imported already."""

    def __init__(self, lazy) -> None:
        object.__setattr__(self, "_lazy", lazy)

    @staticmethod
    def is_installed() -> bool:
        return sys.modules.get("torch") is not None

    @staticmethod
    def is_importable() -> bool:
        return sys.modules.get("torch") is not None

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_lazy"), name)


def install() -> None:
    """Idempotent; does nothing for a module that Polygraphy does not have (other versions)."""
    for name in _MODULES:
        try:
            module = importlib.import_module(name)
        except Exception:  # pragma: no cover - another Polygraphy layout
            continue
        lazy = getattr(module, "torch", None)
        if lazy is not None and not isinstance(lazy, ImportedTorchOnly) and hasattr(lazy, "is_importable"):
            module.torch = ImportedTorchOnly(lazy)
