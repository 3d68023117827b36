"""Progress bars for the tools (the CLI's commands, the demo): tqdm's, shown on a terminal or with
``DCNKIT_PROGRESS=1``, nothing when tqdm is missing."""
from __future__ import annotations

import os
import sys


def progress(iterable=None, **kw):
    """``tqdm(iterable, **kw)``, hidden unless stderr is a terminal or ``DCNKIT_PROGRESS=1``; without tqdm the
    iterable itself (callers check ``hasattr(bar, "update")`` before using a bar's methods)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        return iterable
    kw.setdefault("disable", not sys.stderr.isatty() and os.environ.get("DCNKIT_PROGRESS") != "1")
    kw.setdefault("leave", False)
    return tqdm(iterable, **kw)
