"""The model of a Python-backend Triton repository (``dcnkit triton-repo --backend python``): the kit's runner
inside Triton's Python-backend stub.

The repository's ``1/model.py`` is one import of :class:`TritonPythonModel` from here, so the code that runs is
the installed dcnkit's. Its ``config.pbtxt`` says which runner (``parameters { key: "dcnkit_backend" ... }``:
``ort-cpu`` or ``ort-cuda``; ``kit_kernels``) runs ``1/model.onnx``. Triton's dynamic batcher hands ``execute``
several requests at once; for a batching model (``max_batch_size > 0``) they are concatenated along dim 0, run
once and split back. If that run fails, each request runs alone, so one bad request never fails its neighbours.
``triton_python_backend_utils`` exists only inside the stub and is imported there.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

PARAM_BACKEND = "dcnkit_backend"
PARAM_KIT_KERNELS = "dcnkit_kit_kernels"
ONNX_FILENAME = "model.onnx"  # beside model.py (default_model_filename is model.py's name for this backend)


def run_requests(run, feeds: list[dict], batching: bool) -> list:
    """``run`` over each request's feeds: one run for all when ``batching`` (outputs split by rows), one each
    otherwise or when the batched run fails; a result dict or the exception, per request."""
    if batching and len(feeds) > 1:
        try:
            rows = [len(next(iter(f.values()))) for f in feeds]
            out = run({n: np.concatenate([f[n] for f in feeds]) for n in feeds[0]})
            if all(np.ndim(v) >= 1 and len(v) == sum(rows) for v in out.values()):
                starts = np.cumsum([0] + rows)
                return [{k: v[a:b] for k, v in out.items()} for a, b in zip(starts[:-1], starts[1:])]
        except Exception:  # noqa: BLE001 - run them one by one below: only the faulty request fails
            pass
    results = []
    for f in feeds:
        try:
            results.append(run(f))
        except Exception as e:  # noqa: BLE001 - answered to that request's client
            results.append(e)
    return results


# The wheel's stub was built against NumPy 1: its ``as_numpy()`` / ``Tensor(name, array)`` read NumPy 2's array
# descriptors wrongly (zeros in, "output tensor shape does not match size" out). DLPack has no such tie, so tensors
# cross that way, and the NumPy path stays for what DLPack cannot carry (BOOL on older NumPy).
def _as_array(tensor) -> np.ndarray:
    try:
        return np.from_dlpack(tensor)
    except (BufferError, TypeError, RuntimeError):
        return tensor.as_numpy()


def _as_tensor(pb_utils, name: str, array: np.ndarray):
    array = np.ascontiguousarray(array)
    try:
        return pb_utils.Tensor.from_dlpack(name, array)
    except (BufferError, TypeError, RuntimeError):
        return pb_utils.Tensor(name, array)


class TritonPythonModel:
    """Triton's Python-backend interface: ``initialize``, ``execute``, ``finalize``."""

    def initialize(self, args: dict) -> None:
        from dcnkit.runtime.registry import make_runner

        cfg = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in (cfg.get("parameters") or {}).items()}
        model_file = Path(args["model_repository"]) / str(args["model_version"]) / ONNX_FILENAME
        self.runner = make_runner(model_file, params.get(PARAM_BACKEND, "ort-cpu"),
                                  kit_kernels=params.get(PARAM_KIT_KERNELS, "true") != "false")
        self.inputs = [t["name"] for t in cfg["input"]]
        self.outputs = [t["name"] for t in cfg["output"]]
        self.batching = int(cfg.get("max_batch_size", 0)) > 0

    def execute(self, requests):
        import triton_python_backend_utils as pb_utils

        feeds = [{n: _as_array(pb_utils.get_input_tensor_by_name(r, n)) for n in self.inputs} for r in requests]
        responses = []
        for result in run_requests(self.runner.run, feeds, self.batching):
            if isinstance(result, Exception):
                error = pb_utils.TritonError(f"inference failed: {type(result).__name__}: {result}")
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
            else:
                tensors = [_as_tensor(pb_utils, n, result[n]) for n in self.outputs]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def finalize(self) -> None:
        self.runner.close()


__all__ = ["ONNX_FILENAME", "PARAM_BACKEND", "PARAM_KIT_KERNELS", "TritonPythonModel", "run_requests"]
