"""Triton model configurations, shared by the repository writers (:mod:`dcnkit.runtime.triton` for ONNX Runtime,
:mod:`dcnkit.runtime.triton_tensorrt` for TensorRT) and the server: the data types of the KServe v2 / Open
Inference Protocol, a model's :class:`Signature` and batch dim, ``config.pbtxt`` as a dict and as text, and
copying a plugin library with the private libraries it needs.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

# ------------------------------------------------------------------------------------------------
# Data types: NumPy <-> KServe v2 ("FP32") <-> Triton model config ("TYPE_FP32")
# ------------------------------------------------------------------------------------------------
_NP_TO_V2 = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "UINT8",
    np.dtype(np.uint16): "UINT16",
    np.dtype(np.uint32): "UINT32",
    np.dtype(np.uint64): "UINT64",
    np.dtype(np.int8): "INT8",
    np.dtype(np.int16): "INT16",
    np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64",
    np.dtype(np.float16): "FP16",
    np.dtype(np.float32): "FP32",
    np.dtype(np.float64): "FP64",
}
_V2_TO_NP = {v: k for k, v in _NP_TO_V2.items()}
# Protocol data types that exist but that no dcnkit model uses (no NumPy type, or strings).
V2_UNSUPPORTED = ("BYTES", "BF16")


def v2_datatype(dtype) -> str:
    """KServe v2 datatype name ("FP32", ...) of a NumPy dtype; ValueError for types the protocol lacks."""
    dt = np.dtype(dtype)
    try:
        return _NP_TO_V2[dt]
    except KeyError:
        raise ValueError(f"dtype: expected one of {sorted(str(d) for d in _NP_TO_V2)}, got {dt}") from None


def numpy_dtype(datatype: str) -> np.dtype:
    """NumPy dtype of a KServe v2 datatype name; ValueError naming the known names otherwise."""
    try:
        return _V2_TO_NP[datatype]
    except (KeyError, TypeError):
        raise ValueError(
            f"datatype: expected one of {', '.join(sorted(_V2_TO_NP))}, got {datatype!r}"
        ) from None


def triton_data_type(dtype) -> str:
    """Triton model-config data type ("TYPE_FP32", ...) of a NumPy dtype."""
    v2 = v2_datatype(dtype)
    return "TYPE_STRING" if v2 == "BYTES" else f"TYPE_{v2}"


# ------------------------------------------------------------------------------------------------
# Model signature and batching
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Signature:
    """Inputs and outputs of a model as ``TensorInfo`` s (name, dtype, shape with str/None symbolic dims)."""

    inputs: tuple
    outputs: tuple

    @staticmethod
    def of(runner_or_model) -> "Signature":
        """From a runner (``.inputs()`` / ``.outputs()``) or an ONNX model (path, bytes, ModelProto)."""
        if hasattr(runner_or_model, "inputs") and callable(runner_or_model.inputs):
            return Signature(tuple(normalize_infos(runner_or_model.inputs())),
                             tuple(normalize_infos(runner_or_model.outputs())))
        from dcnkit.runtime.base import load_model, value_infos

        m = load_model(runner_or_model)
        init = {t.name for t in m.graph.initializer}
        ins = [v for v in m.graph.input if v.name not in init]
        return Signature(tuple(value_infos(ins)), tuple(value_infos(m.graph.output)))

    def batch_dim(self) -> tuple[str | None, str]:
        """The symbolic dim that every input and output has first, or (None, why not)."""
        return shared_batch_dim(self.inputs, self.outputs)


def normalize_infos(infos: Iterable) -> list:
    """TensorInfo list from runner infos given as TensorInfo, objects, dicts or (name, dtype, shape) tuples."""
    from dcnkit.runtime.base import TensorInfo

    out = []
    for i in infos:
        if isinstance(i, dict):
            name, dtype, shape = i["name"], i["dtype"], i["shape"]
        elif isinstance(i, (tuple, list)):
            name, dtype, shape = i
        else:
            name, dtype, shape = i.name, i.dtype, i.shape
        dims = []
        for d in shape:
            if isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0:
                dims.append(int(d))
            elif isinstance(d, str) and d:
                dims.append(d)
            else:
                dims.append(None)
        out.append(TensorInfo(str(name), np.dtype(dtype), tuple(dims)))
    return out


def shared_batch_dim(inputs: Sequence, outputs: Sequence) -> tuple[str | None, str]:
    """Name of the symbolic first dim shared by every input and output, or ``(None, reason)``.

    Requests may be concatenated along dim 0 only when that dim means the same thing in every tensor. A
    symbolic name shared by all inputs and outputs (``batch`` / ``N``) says so; an unnamed or fixed first dim,
    or names that differ (an RoI model: ``x`` is ``N x C x H x W`` and ``rois`` is ``K x 5``), do not.
    """
    tensors = [("input", t) for t in inputs] + [("output", t) for t in outputs]
    if not inputs:
        return None, "the model has no inputs"
    names = set()
    for kind, t in tensors:
        if len(t.shape) == 0:
            return None, f"{kind} {t.name!r} is a scalar (no batch dim)"
        d0 = t.shape[0]
        if not isinstance(d0, str):
            what = "fixed" if isinstance(d0, int) else "unnamed dynamic"
            return None, f"{kind} {t.name!r} has a {what} first dim ({d0})"
        names.add(d0)
    if len(names) != 1:
        firsts = ", ".join(f"{t.name}: {t.shape[0]}" for _, t in tensors)
        return None, f"the first dims differ ({firsts}): the tensors do not share a batch dim"
    return names.pop(), ""


def v2_shape(shape: Sequence) -> list[int]:
    """A shape for the v2 protocol and Triton configs: -1 for symbolic or unknown dims."""
    return [int(d) if isinstance(d, int) else -1 for d in shape]


# ------------------------------------------------------------------------------------------------
# Model configuration
# ------------------------------------------------------------------------------------------------
DEFAULT_MAX_BATCH_SIZE = 8


def model_config(
    signature: Signature,
    name: str,
    *,
    max_batch_size: int | None = None,
    max_queue_delay_us: int = 1000,
    preferred_batch_sizes: Sequence[int] = (),
    max_queue_size: int = 0,
    op_libraries: Sequence[str] = (),
    instance_kind: str | None = None,
    instance_count: int = 1,
    platform: str = "onnxruntime_onnx",
) -> dict:
    """Triton model configuration as a dict (the JSON form of ``ModelConfig``).

    ``max_batch_size=None`` picks :data:`DEFAULT_MAX_BATCH_SIZE` when the tensors share a batch dim and 0
    otherwise; a positive value for a model whose tensors do not share one is a ValueError (Triton would
    concatenate unrelated dims). With batching the batch dim is left out of ``dims`` as Triton requires.
    """
    batch_name, why = signature.batch_dim()
    if max_batch_size is None:
        max_batch_size = DEFAULT_MAX_BATCH_SIZE if batch_name else 0
    if not isinstance(max_batch_size, int) or max_batch_size < 0:
        raise ValueError(f"max_batch_size: expected an integer >= 0, got {max_batch_size!r}")
    if max_batch_size > 0 and batch_name is None:
        raise ValueError(
            f"max_batch_size: expected 0 for this model ({why}), got {max_batch_size}"
        )
    if instance_kind not in (None, "KIND_CPU", "KIND_GPU", "KIND_AUTO"):
        raise ValueError(f"instance_kind: expected KIND_CPU, KIND_GPU or KIND_AUTO, got {instance_kind!r}")

    def tensors(infos):
        out = []
        for t in infos:
            dims = v2_shape(t.shape[1:] if max_batch_size > 0 else t.shape)
            if not dims:  # Triton wants at least one dim; [1] reshaped to [] is its idiom for scalars.
                out.append({"name": t.name, "data_type": triton_data_type(t.dtype), "dims": [1],
                            "reshape": {"shape": []}})
            else:
                out.append({"name": t.name, "data_type": triton_data_type(t.dtype), "dims": dims})
        return out

    cfg: dict = {
        "name": name,
        "platform": platform,
        "max_batch_size": max_batch_size,
        "input": tensors(signature.inputs),
        "output": tensors(signature.outputs),
    }
    if max_batch_size > 0:
        db: dict = {"max_queue_delay_microseconds": int(max_queue_delay_us)}
        pref = [int(p) for p in preferred_batch_sizes]
        bad = [p for p in pref if p < 1 or p > max_batch_size]
        if bad:
            raise ValueError(f"preferred_batch_sizes: expected values in [1, {max_batch_size}], got {bad}")
        if pref:
            db["preferred_batch_size"] = pref
        if max_queue_size:
            db["default_queue_policy"] = {"max_queue_size": int(max_queue_size)}
        cfg["dynamic_batching"] = db
    if instance_kind:
        cfg["instance_group"] = [{"kind": instance_kind, "count": int(instance_count)}]
    if op_libraries:
        cfg["model_operations"] = {"op_library_filename": list(op_libraries)}
    return cfg


def model_config_message(cfg: dict | None = None):
    """A ``ModelConfig`` message of Triton's own schema (``tritonclient.grpc.model_config_pb2``), from ``cfg`` (the
    JSON form; unknown fields and bad enum names raise ``google.protobuf.json_format.ParseError``)."""
    try:
        from tritonclient.grpc import model_config_pb2
    except Exception as e:  # ImportError, or tritonclient's RuntimeError when installed without grpc
        raise ImportError(
            "tritonclient.grpc.model_config_pb2 (Triton's model configuration schema) is needed: "
            f"pip install 'tritonclient[grpc]' ({type(e).__name__}: {e})"
        ) from e
    msg = model_config_pb2.ModelConfig()
    if cfg:
        from google.protobuf import json_format

        json_format.ParseDict(cfg, msg)
    return msg


def to_pbtxt(cfg: dict) -> str:
    """``config.pbtxt`` (protobuf text format) of a config dict, written by protobuf with Triton's schema."""
    from google.protobuf import text_format

    return text_format.MessageToString(model_config_message(cfg)).rstrip("\n")


# ------------------------------------------------------------------------------------------------
# Making the copied library self-contained
# ------------------------------------------------------------------------------------------------
LIBRARY_FILENAME = "libdcnkit_ort.so"  # the ONNX Runtime library's name in a repository
DEFAULT_CONTAINER_REPOSITORY = "/models"
_SYSTEM_DIRS = ("/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/", "/usr/local/cuda")
# Libraries that the Triton container provides (CUDA runtime, cuBLAS, ...) are never copied.
_CONTAINER_PROVIDED = ("libcuda", "libcudart", "libcublas", "libcublasLt", "libnvrtc", "libnvJitLink")


def _private_dependencies(lib: Path) -> list[Path]:
    """Shared libraries ``lib`` needs that are neither system nor CUDA libraries (OpenBLAS from a wheel)."""
    import subprocess

    try:
        out = subprocess.run(["ldd", str(lib)], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    deps = []
    for line in out.splitlines():
        if "=>" not in line:
            continue
        name, _, rest = line.strip().partition("=>")
        target = rest.strip().split(" (")[0].strip()
        if not target.startswith("/") or target.startswith(_SYSTEM_DIRS):
            continue
        if name.strip().startswith(_CONTAINER_PROVIDED):
            continue
        deps.append(Path(target))
    return deps


def bundle_library(src, dest_dir, filename: str = LIBRARY_FILENAME) -> list[Path]:
    """Copies ``src`` to ``dest_dir/filename`` with the private libraries it needs (OpenBLAS) beside it.

    The kit's libraries search ``$ORIGIN`` first, so the copy loads from there in any container.
    Returns the files written.
    """
    src, dest_dir = Path(src), Path(dest_dir)
    written = [dest_dir / filename]
    shutil.copy2(src, written[0])
    deps = _private_dependencies(src)
    for dep in deps:
        shutil.copy2(dep, dest_dir / dep.name)
        written.append(dest_dir / dep.name)
    return written
