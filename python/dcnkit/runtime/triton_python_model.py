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


# ---- how tensors cross the stub: chosen once per model load (initialize), from what works here -------------------
# The wheel's stub (Triton 2.51) was built against NumPy 1, and its NumPy path reads NumPy 2's array descriptors
# wrongly: ``pb_utils.Tensor(name, array)`` hands Triton an output of 0 bytes ("cannot reshape array of size 0").
# DLPack has no such tie. But ``pb_utils.Tensor.from_dlpack`` renames the capsule it consumed "used_dlpack", where
# the DLPack convention (and NumPy's capsule destructor) expects "used_dltensor": NumPy's destructor then raises
# ``ValueError: PyCapsule_GetPointer called with incorrect name``, printed as a traceback for every output tensor
# although the tensor is right (the stub owns the data and calls its deleter). So the kit hands the capsule over
# itself and clears its destructor once the stub has consumed it: DLPack both ways, and no noise.
HANDOVER_DLPACK = "dlpack"
HANDOVER_NUMPY = "numpy"


def _capsule_api():
    import ctypes

    api = ctypes.pythonapi
    api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_IsValid.restype = ctypes.c_int
    api.PyCapsule_SetDestructor.argtypes = [ctypes.py_object, ctypes.c_void_p]
    api.PyCapsule_SetDestructor.restype = ctypes.c_int
    return api


def _dlpack_out(pb_utils, api, name: str, array: np.ndarray):
    capsule = array.__dlpack__()
    tensor = pb_utils.Tensor.from_dlpack(name, capsule)
    if api.PyCapsule_IsValid(capsule, b"used_dlpack"):  # consumed: the tensor owns the data and frees it
        api.PyCapsule_SetDestructor(capsule, None)
    return tensor


def _probe_array(dtype: np.dtype) -> np.ndarray:
    values = np.arange(6) % 2 == 1 if dtype == np.bool_ else np.arange(-3, 3)
    return values.astype(dtype).reshape(2, 3)


class HandOver:
    """How one model's tensors cross the stub, per dtype: outputs into ``pb_utils.Tensor``, inputs into arrays.

    :meth:`choose` makes a small tensor of each dtype by DLPack and reads it back by DLPack: where it comes back
    exact (dtype, shape, values), DLPack is the path of that dtype both ways, and ``noisy`` lists the dtypes whose
    hand-over reported something to ``sys.unraisablehook`` (none with this stub). Elsewhere Triton's NumPy path
    (``pb_utils.Tensor(name, array)`` / ``as_numpy()``) is used; it cannot be checked from inside the stub (what goes
    wrong is the byte size handed to Triton). Nothing is tried again per request.
    """

    def __init__(self, pb_utils, paths: dict, noisy=()):
        self.pb_utils, self.paths, self.noisy = pb_utils, dict(paths), tuple(noisy)
        self._api = _capsule_api()

    @classmethod
    def choose(cls, pb_utils, dtypes) -> "HandOver":
        import sys

        api = _capsule_api()
        paths, noisy = {}, []
        for dtype in sorted({np.dtype(d) for d in dtypes}, key=str):
            probe, noise, hook = _probe_array(dtype), [], sys.unraisablehook
            sys.unraisablehook = noise.append
            try:
                t = _dlpack_out(pb_utils, api, "probe", probe)
                back = np.from_dlpack(t)
                ok = back.dtype == dtype and list(t.shape()) == list(probe.shape) and np.array_equal(back, probe)
                del t, back
            except Exception:  # noqa: BLE001 - DLPack does not carry this dtype here: the NumPy path
                ok = False
            finally:
                sys.unraisablehook = hook
            paths[dtype] = HANDOVER_DLPACK if ok else HANDOVER_NUMPY
            if ok and noise:
                noisy.append(dtype)
        return cls(pb_utils, paths, noisy)

    def describe(self) -> str:
        groups: dict = {}
        for d, p in self.paths.items():
            groups.setdefault(p, []).append(np.dtype(d).name)
        return "; ".join(f"{'DLPack' if p == HANDOVER_DLPACK else 'NumPy'} for {', '.join(n)}"
                         for p, n in sorted(groups.items()))

    def to_tensor(self, name: str, array: np.ndarray):
        array = np.ascontiguousarray(array)
        if self.paths.get(array.dtype) == HANDOVER_DLPACK:
            return _dlpack_out(self.pb_utils, self._api, name, array)
        return self.pb_utils.Tensor(name, array)

    def to_array(self, tensor, dtype) -> np.ndarray:
        return np.from_dlpack(tensor) if self.paths.get(dtype) == HANDOVER_DLPACK else tensor.as_numpy()


class TritonPythonModel:
    """Triton's Python-backend interface: ``initialize``, ``execute``, ``finalize``."""

    def initialize(self, args: dict) -> None:
        from dcnkit.runtime.registry import make_runner

        cfg = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in (cfg.get("parameters") or {}).items()}
        model_file = Path(args["model_repository"]) / str(args["model_version"]) / ONNX_FILENAME
        self.runner = make_runner(model_file, params.get(PARAM_BACKEND, "ort-cpu"),
                                  kit_kernels=params.get(PARAM_KIT_KERNELS, "true") != "false")
        import triton_python_backend_utils as pb_utils

        def dtype(t):
            return np.dtype(pb_utils.triton_string_to_numpy(t["data_type"]))

        self.inputs = {t["name"]: dtype(t) for t in cfg["input"]}
        self.outputs = [t["name"] for t in cfg["output"]]
        self.batching = int(cfg.get("max_batch_size", 0)) > 0
        self.handover = HandOver.choose(pb_utils, [dtype(t) for t in cfg["input"] + cfg["output"]])
        # One line per load, never per request: Triton's verbose level when DLPack carries everything quietly.
        line = f"dcnkit: {cfg.get('name')}: tensors cross the stub by {self.handover.describe()}"
        if HANDOVER_NUMPY in self.handover.paths.values() or self.handover.noisy:
            pb_utils.Logger.log_warn(line + (f" (reported by NumPy: {self.handover.noisy})" if self.handover.noisy
                                             else ""))
        else:
            pb_utils.Logger.log_verbose(line)

    def execute(self, requests):
        import triton_python_backend_utils as pb_utils

        h = self.handover
        feeds = [{n: h.to_array(pb_utils.get_input_tensor_by_name(r, n), d) for n, d in self.inputs.items()}
                 for r in requests]
        responses = []
        for result in run_requests(self.runner.run, feeds, self.batching):
            if isinstance(result, Exception):
                error = pb_utils.TritonError(f"inference failed: {type(result).__name__}: {result}")
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
            else:
                tensors = [h.to_tensor(n, result[n]) for n in self.outputs]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def finalize(self) -> None:
        self.runner.close()


__all__ = ["HANDOVER_DLPACK", "HANDOVER_NUMPY", "HandOver", "ONNX_FILENAME", "PARAM_BACKEND", "PARAM_KIT_KERNELS",
           "TritonPythonModel", "run_requests"]
