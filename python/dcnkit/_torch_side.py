"""dcnkit's PyTorch side, loaded when (and only when) the process uses torch.

``import dcnkit`` must not import torch: the deployment side (ONNX Runtime runners, the server, the CLI's
``run`` / ``compare`` / ``bench`` / ``serve``) runs without it, in a fraction of the memory. Yet a process
that does use torch expects what ``import dcnkit`` always gave it: the ``torch.ops.dcnkit.*`` operators
(``torch.jit.load`` of a scripted model finds them) and the ONNX exporters' registrations (plain
``torch.onnx.export`` writes our nodes). So:

* torch already imported when dcnkit is: the torch side loads at once;
* otherwise a finder on ``sys.meta_path`` waits for ``torch`` to be imported (by anyone, at any later time)
  and loads the torch side right after torch's own module has finished executing, then removes itself.

The torch side is ``dcnkit.ops`` (loads ``libdcnkit_torch.so``, registers fake kernels and autograd) and
``dcnkit.export._register`` (the exporters' translations; onnx / onnxscript stay unimported).
"""
from __future__ import annotations

import importlib
import importlib.abc
import sys
import threading
import warnings

TORCH_SIDE_MODULES = ("dcnkit.ops", "dcnkit.export._register")

_lock = threading.RLock()
_loaded = False


def torch_imported() -> bool:
    """True when torch has been imported in this process (a ``None`` entry, which blocks the import, is not)."""
    return sys.modules.get("torch") is not None


def load() -> None:
    """Imports dcnkit's torch side (idempotent). Raises what the import raises (e.g. a missing library)."""
    global _loaded
    with _lock:
        if _loaded:
            return
        for name in TORCH_SIDE_MODULES:
            importlib.import_module(name)
        _loaded = True


def loaded() -> bool:
    return _loaded


class TorchImportHook(importlib.abc.MetaPathFinder):
    """Finds ``torch`` through the finders after it, and runs :func:`load` once torch's module has executed."""

    def find_spec(self, fullname, path, target=None):  # noqa: D102
        if fullname != "torch":
            return None
        spec = None
        for finder in list(sys.meta_path):
            if finder is self or isinstance(finder, TorchImportHook):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module):
            run(module)
            if getattr(module, "__name__", None) == "torch":
                _after_torch_import()

        loader.exec_module = exec_module  # the loader instance is this spec's own
        return spec


def _remove_hooks() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, TorchImportHook)]


def _after_torch_import() -> None:
    _remove_hooks()
    try:
        load()
    except Exception as e:  # never make `import torch` fail because of dcnkit: say so, and go on
        warnings.warn(
            f"dcnkit: could not load its PyTorch operators after `import torch` ({type(e).__name__}: {e}); "
            "dcnkit.ops will raise the error when used",
            RuntimeWarning,
            stacklevel=3,
        )


def install() -> None:
    """Loads the torch side now if torch is imported, else arranges for it to load when torch is."""
    if torch_imported():
        load()
        return
    with _lock:
        if not any(isinstance(f, TorchImportHook) for f in sys.meta_path):
            sys.meta_path.insert(0, TorchImportHook())
