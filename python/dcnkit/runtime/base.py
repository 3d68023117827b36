"""What every backend shares: the Runner interface, TensorInfo, BackendUnavailable, reading ONNX models and
the declaration a backend module makes (:class:`Backend`).

A runner has ``.name``, ``.run(feeds) -> dict``, ``.inputs()`` / ``.outputs()`` (lists of :class:`TensorInfo`;
symbolic dims are ``str``, unknown dims ``None``) and ``.close()``, and is a context manager. A backend that
cannot run here raises :class:`BackendUnavailable` (a ``RuntimeError``) with the reason.

This module imports nothing from the rest of dcnkit: the backend modules (:mod:`dcnkit.runtime.ort_runner`,
:mod:`dcnkit.runtime.tensorrt`, :mod:`dcnkit.runtime.reference_runner`) build on it, and
:mod:`dcnkit.runtime.registry` finds them by name.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np


class BackendUnavailable(RuntimeError):
    """The backend exists but cannot run on this machine (the message says why)."""


@dataclass(frozen=True)
class TensorInfo:
    """A model input or output: name, NumPy dtype and shape (int, or str for a symbolic dim, None if unknown)."""

    name: str
    dtype: np.dtype
    shape: tuple

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) and d >= 0 for d in self.shape)


# ------------------------------------------------------------------------------------------------
# Model helpers
# ------------------------------------------------------------------------------------------------
def load_model(model) -> "Any":
    """An ``onnx.ModelProto`` from a path, bytes or a ModelProto."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model))
    path = Path(os.fspath(model))
    if not path.is_file():
        raise FileNotFoundError(f"model: expected an existing ONNX file, got {str(path)!r}")
    return onnx.load(str(path))


def uses_custom_ops(model) -> bool:
    """True when the model has nodes in the ``dcnkit`` ONNX domain."""
    m = load_model(model)
    if any(n.domain == "dcnkit" for n in m.graph.node):
        return True
    return any(n.domain == "dcnkit" for f in m.functions for n in f.node)


# The domains of the nodes the kit's ONNX Runtime library serves (plugins/core/src/op_attrs.cpp's variants): its
# own, mmdeploy's and mmcv's, and those MultiscaleDeformableAttnPlugin_TRT is exported in.
KIT_LIBRARY_DOMAINS = ("dcnkit", "mmdeploy", "mmcv", "nvidia", "trt", "TRT")


def _all_nodes(graph):
    for n in graph.node:
        yield n
        for a in n.attribute:
            if a.HasField("g"):
                yield from _all_nodes(a.g)
            for g in a.graphs:
                yield from _all_nodes(g)


def has_deformable_nodes(model) -> bool:
    """True when the model has nodes the kit's ONNX Runtime library serves: in its domains (``dcnkit``, mmdeploy's,
    mmcv's, ...) or a standard ``DeformConv`` (which the library runs where ONNX Runtime has no kernel of its own,
    before 1.26); subgraphs and local functions included. Such a model wants the library registered."""
    m = load_model(model)
    nodes = list(_all_nodes(m.graph)) + [n for f in m.functions for n in f.node]
    return any(n.domain in KIT_LIBRARY_DOMAINS or (n.op_type == "DeformConv" and n.domain in ("", "ai.onnx"))
               for n in nodes)


def value_infos(values) -> list[TensorInfo]:
    """TensorInfo list from ONNX ``ValueInfoProto`` s (graph inputs / outputs)."""
    from onnx import helper

    out = []
    for v in values:
        tt = v.type.tensor_type
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        except Exception:
            dtype = np.dtype("float32")
        dims = []
        if tt.HasField("shape"):
            for d in tt.shape.dim:
                if d.HasField("dim_value"):
                    dims.append(int(d.dim_value))
                elif d.HasField("dim_param"):
                    dims.append(str(d.dim_param))
                else:
                    dims.append(None)
        out.append(TensorInfo(v.name, dtype, tuple(dims)))
    return out


# ------------------------------------------------------------------------------------------------
# Runners
# ------------------------------------------------------------------------------------------------
class Runner:
    """Base class: ``name``, ``run``, ``inputs``, ``outputs``, ``close``; usable as a context manager."""

    name: str = "runner"

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # pragma: no cover
        raise NotImplementedError

    def inputs(self) -> list[TensorInfo]:  # pragma: no cover
        raise NotImplementedError

    def outputs(self) -> list[TensorInfo]:  # pragma: no cover
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return f"<{type(self).__name__} {self.name}>"

    def _check_feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        infos = self.inputs()
        names = [i.name for i in infos]
        missing = [n for n in names if n not in feeds]
        if missing:
            raise ValueError(f"feeds: expected inputs {names}, got {sorted(feeds)} (missing {missing})")
        extra = [n for n in feeds if n not in names]
        if extra:
            raise ValueError(f"feeds: expected inputs {names}, got unknown {extra}")
        out = {}
        for info in infos:
            a = np.asarray(feeds[info.name])
            if a.ndim != len(info.shape) and info.shape:
                raise ValueError(
                    f"feeds[{info.name!r}]: expected rank {len(info.shape)} {info.shape}, got shape {a.shape}"
                )
            for i, (want, got) in enumerate(zip(info.shape, a.shape)):
                if isinstance(want, int) and want >= 0 and want != got:
                    raise ValueError(
                        f"feeds[{info.name!r}]: expected shape {info.shape}, got {a.shape} (dim {i})"
                    )
            if a.dtype != info.dtype:
                a = a.astype(info.dtype)
            # np.ascontiguousarray makes a 0-d array 1-d: a scalar input keeps its rank
            out[info.name] = a if a.flags.c_contiguous else np.ascontiguousarray(a)
        return out


# ------------------------------------------------------------------------------------------------
# What a backend module declares
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Backend:
    """A backend as its module declares it (``BACKENDS = (Backend(...), ...)``; see :mod:`dcnkit.runtime.registry`).

    ``unavailable_reason()`` is None when the backend can run on this machine, else one line saying what is
    missing and how to get it. ``runner(model, kit_kernels=True, **options)`` makes its :class:`Runner` (raising
    :class:`BackendUnavailable` when it cannot run here); ``kit_kernels`` is ONNX Runtime's option, other
    backends accept and ignore it.
    """

    name: str
    unavailable_reason: Callable[[], "str | None"]
    runner: Callable[..., Runner]


__all__ = ["Backend", "BackendUnavailable", "Runner", "TensorInfo", "load_model", "uses_custom_ops",
           "has_deformable_nodes", "value_infos"]
