"""Triton model repositories for TensorRT: a ``tensorrt_plan`` model with the kit's plugin library beside it.

>>> from dcnkit.runtime.triton import write_repository
>>> write_repository("dcn.onnx", "model_repository", backend="tensorrt", engine="dcn.engine")

writes::

    model_repository/
      dcn/
        config.pbtxt          # platform "tensorrt_plan", inputs/outputs from the ONNX, max_batch_size, batching
        libdcnkit_trt.so      # the kit's TensorRT plugin library (when the model has custom-domain nodes)
        1/model.plan          # the serialized engine: ``engine`` copied as it is, or built here from the ONNX

Triton's model configuration has no field for TensorRT plugins: the TensorRT backend loads plugin libraries
given on the server's command line, ``--backend-config=tensorrt,plugins="/models/dcn/libdcnkit_trt.so"``
(several separated by ``;``): the backend ``dlopen``s it after loading TensorRT, and the library registers its
creators itself (``LD_PRELOAD`` does not work: it loads the library before TensorRT; runtime/triton/README.md).
The config's header says so. A copied engine is not validated (it must come from the TensorRT version of the
Triton image, for its GPU); the signature is read from the ONNX model.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Sequence

from dcnkit.runtime.triton_config import bundle_library, to_pbtxt

PLAN_FILENAME = "model.plan"
PLUGIN_FILENAME = "libdcnkit_trt.so"
_STANDARD_DOMAINS = ("", "ai.onnx")


def needs_plugins(model) -> bool:
    """True when the model has nodes outside the standard ONNX domain (the kit's or mmdeploy's)."""
    graphs = [model.graph] + [f for f in model.functions]
    return any(n.domain not in _STANDARD_DOMAINS for g in graphs for n in g.node)


def batch_profile(signature, max_batch_size: int) -> dict:
    """``{input: (min, opt, max)}`` for a model whose only dynamic dims are the shared batch dim: 1..max."""
    shapes = {}
    for t in signature.inputs:
        rest = t.shape[1:]
        if not all(isinstance(d, int) for d in rest):
            raise ValueError(f"shapes: input {t.name!r} {t.shape} has dynamic dims besides the batch dim: give "
                             f"shapes (--shapes {t.name}:MIN:OPT:MAX) or a built engine (--engine)")
        shapes[t.name] = ((1, *rest), (max_batch_size, *rest), (max_batch_size, *rest))
    return shapes


def write_tensorrt_repository(
    m, signature, model_dir: Path, cfg: dict, *, name: str, version: int, container_repository: str,
    library_path: str | None, engine=None, shapes=None, precision: str | None = None,
    plugins: Sequence = (),
) -> Path:
    """Writes ``model_dir`` for Triton's TensorRT backend (called by ``triton.write_repository``).

    ``cfg`` is the model config (``model_config(..., platform="tensorrt_plan")``); without ``engine`` the engine
    is built here with :func:`dcnkit.runtime.tensorrt.build_engine_bytes` (BackendUnavailable without TensorRT).
    """
    plugin_src = None
    plugin_ref = None
    if needs_plugins(m):
        if library_path:
            plugin_ref = library_path
        else:
            import dcnkit

            plugin_src = Path(dcnkit.tensorrt_library())  # FileNotFoundError: not built, how to build it
            plugin_ref = f"{container_repository.rstrip('/')}/{name}/{PLUGIN_FILENAME}"
    if engine is not None:
        engine = Path(engine)
        if not engine.is_file() or engine.stat().st_size == 0:
            raise FileNotFoundError(f"engine: expected an existing, non-empty engine file, got {str(engine)!r}")
        data = None
    else:
        from dcnkit.runtime import tensorrt as dk_trt

        dk_trt.require_tensorrt()
        if shapes is None and any(not t.is_static for t in signature.inputs):
            shapes = batch_profile(signature, max(1, cfg["max_batch_size"]))
        if shapes:
            dk_trt.check_shapes(m, shapes)
        data = dk_trt.build_engine_bytes(m, precision=precision, shapes=shapes, plugins=plugins)

    if model_dir.exists():
        shutil.rmtree(model_dir)  # the caller checked `overwrite`
    (model_dir / str(version)).mkdir(parents=True)
    plan = model_dir / str(version) / PLAN_FILENAME
    if data is None:
        shutil.copyfile(engine, plan)
    else:
        plan.write_bytes(data)
    if plugin_src is not None:
        bundle_library(plugin_src, model_dir, PLUGIN_FILENAME)
    header = "# Written by dcnkit triton-repo. Triton model configuration (protobuf text format).\n"
    header += "# 1/model.plan is a serialized TensorRT engine: it runs only with the TensorRT version and GPU it was\n"
    header += "# built for (build it with the Triton image's TensorRT).\n"
    if plugin_ref:
        header += (
            "# The engine uses the kit's TensorRT plugins. Triton's config has no field for TensorRT plugins: start\n"
            f"#   tritonserver --backend-config=tensorrt,plugins=\"{plugin_ref}\" ...\n"
            f"# (the library registers its plugins when the backend loads it; runtime/triton/README.md).\n"
        )
    (model_dir / "config.pbtxt").write_text(header + to_pbtxt(cfg) + "\n")
    return model_dir


__all__ = ["write_tensorrt_repository", "needs_plugins", "batch_profile", "PLAN_FILENAME", "PLUGIN_FILENAME"]
