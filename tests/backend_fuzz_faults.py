"""A worker task for tests/test_backend_fuzz.py: the real backends (scripts/backend_fuzz.py's run_case), except that
the backend named by $FUZZ_FAULTY_BACKEND crashes, hangs or answers wrong, as $FUZZ_FAULT says."""
from __future__ import annotations

import os
import signal
import time

import numpy as np


def run_case(backend, model, feeds, ov_threads):
    from backend_fuzz import run_case as real

    out = real(backend, model, feeds, ov_threads)
    if backend != os.environ.get("FUZZ_FAULTY_BACKEND"):
        return out
    fault = os.environ.get("FUZZ_FAULT")
    if fault == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "hang":
        time.sleep(3600)
    return {k: np.asarray(v) + 1.0 for k, v in out.items()}  # "wrong"
