"""Python-backend Triton repositories: ``<dir>/<name>/{config.pbtxt, 1/model.py, 1/model.onnx}`` where
``model.py`` runs the kit's ONNX Runtime runner (:mod:`dcnkit.runtime.triton_python_model`).

This is the variant that the ``tritonserver`` of the ``nvidia-pytriton`` wheel loads here (that wheel has the
Python backend only; :mod:`dcnkit.runtime.triton_server` runs it). The Python that runs the stub must have
dcnkit installed (and ``onnxruntime``); in NVIDIA's Triton container: ``pip install`` dcnkit there, or give the
model an ``EXECUTION_ENV_PATH`` environment.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from dcnkit.runtime.triton_python_model import PARAM_BACKEND, PARAM_KIT_KERNELS

RUNNER_BACKENDS = ("ort-cpu", "ort-cuda")

MODEL_PY = '''\
# Written by dcnkit triton-repo --backend python: Triton's Python backend runs the kit's ONNX Runtime runner
# on model.onnx beside this file (which runner: config.pbtxt's parameters). Needs dcnkit in the stub's Python.
import os
import sys

# The stub's interpreter is isolated (it ignores PYTHONPATH): honour the server's PYTHONPATH here, so that it
# decides which dcnkit runs, as it would for any Python program.
sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

from dcnkit.runtime.triton_python_model import TritonPythonModel  # noqa: E402,F401
'''


def python_backend_config(cfg: dict, runner_backend: str = "ort-cpu", kit_kernels: bool = True) -> dict:
    """``cfg`` (from :func:`~dcnkit.runtime.triton_config.model_config`) turned into a Python-backend config."""
    if runner_backend not in RUNNER_BACKENDS:
        raise ValueError(f"runner_backend: expected one of {', '.join(RUNNER_BACKENDS)}, got {runner_backend!r}")
    cfg = dict(cfg)
    cfg.pop("platform", None)
    cfg.pop("model_operations", None)  # the runner loads the kit's library itself
    cfg["backend"] = "python"
    cfg.setdefault("instance_group", [{"kind": "KIND_CPU", "count": 1}])
    cfg["parameters"] = {PARAM_BACKEND: {"string_value": runner_backend},
                         PARAM_KIT_KERNELS: {"string_value": "true" if kit_kernels else "false"}}
    return cfg


def write_python_repository(m, model_dir: Path, cfg: dict, *, version: int = 1) -> Path:
    """Writes ``model_dir/{config.pbtxt, <version>/model.py, <version>/model.onnx}`` (``model_dir`` must not exist)."""
    import onnx

    from dcnkit.runtime.triton_config import to_pbtxt

    (model_dir / str(version)).mkdir(parents=True)
    try:
        onnx.save_model(m, str(model_dir / str(version) / "model.onnx"))
        (model_dir / str(version) / "model.py").write_text(MODEL_PY)
        (model_dir / "config.pbtxt").write_text(
            "# Written by dcnkit triton-repo --backend python. Triton model configuration (protobuf text format).\n"
            + to_pbtxt(cfg) + "\n")
    except BaseException:
        shutil.rmtree(model_dir, ignore_errors=True)
        raise
    return model_dir


__all__ = ["MODEL_PY", "RUNNER_BACKENDS", "python_backend_config", "write_python_repository"]
