"""How the Python wrappers of the ops (and the argument checks of the modules) run outside TorchScript.

Each wrapper is a TorchScript-compatible implementation (argument checks and the ``torch.ops.dcnkit``
call), which ``torch.jit.script`` compiles, behind a public function that, when not scripting, hands its
arguments to :func:`eager_call`:

- ``torch.fx.symbolic_trace``: when an argument is an fx ``Proxy`` the call is recorded as one
  ``call_function`` node whose target is the public function (an fx leaf), so no check ever looks at a
  Proxy and the ``GraphModule`` runs the checks on real tensors. ``torch.fx.wrap`` in the defining modules
  does the same for calls through those names; this also covers a user's ``from dcnkit.ops import ...``.
- ``torch.jit.trace`` (and the legacy ONNX exporter, which traces): sizes are traced tensors there, so a
  check such as ``offset.size(1) != 18`` would warn (``TracerWarning``) although nothing it computes
  reaches the traced graph. The implementation runs with that warning silenced.
- otherwise the implementation runs as it is.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Optional, Tuple

import torch

__all__ = ["eager_call"]


def _find_proxy(values: Any) -> Optional[torch.fx.Proxy]:
    for v in values:
        if isinstance(v, torch.fx.Proxy):
            return v
        if isinstance(v, (list, tuple)):
            found = _find_proxy(v)
            if found is not None:
                return found
    return None


@torch.jit.unused
def eager_call(public: Callable[..., Any], impl: Callable[..., Any], args: Tuple[Any, ...]) -> Any:
    """``impl(*args)``, or the fx node of ``public(*args)`` when an argument is an fx Proxy."""
    proxy = _find_proxy(args)
    if proxy is not None:
        # While tracing, torch.fx.wrap may have replaced the name `public` in its module by a wrapper:
        # the node's target is the function itself.
        target = getattr(public, "__wrapped__", public)
        return proxy.tracer.create_proxy("call_function", target, args, {})
    if torch.jit.is_tracing():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
            return impl(*args)
    return impl(*args)
