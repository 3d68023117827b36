"""NVIDIA Triton Inference Server: model repositories for the kit's ONNX models, and the data types of the
KServe v2 / Open Inference Protocol that Triton (and ``dcnkit serve``) speak.

>>> from dcnkit.runtime.triton import write_repository
>>> write_repository("dcn.onnx", "model_repository", max_batch_size=8)
PosixPath('model_repository/dcn')

writes::

    model_repository/
      dcn/
        config.pbtxt          # platform "onnxruntime_onnx", inputs/outputs, max_batch_size, dynamic_batching,
                              # model_operations { op_library_filename: "/models/dcn/libdcnkit_ort.so" }
        libdcnkit_ort.so      # the kit's ONNX Runtime custom-op library (when the model has deformable nodes:
                              # dcnkit, mmdeploy or mmcv ops, or a standard DeformConv, which the library runs
                              # where the container's ONNX Runtime has no kernel for it, before 1.26),
        libscipy_openblas.so  # the private libraries it needs (the kit's libraries search $ORIGIN first)
        1/model.onnx

``op_library_filename`` is handed by Triton's onnxruntime backend to ``RegisterCustomOpsLibrary`` as it is,
so it must be the path *inside the Triton container*. The default assumes the repository is mounted at
``/models`` (``docker run -v $PWD/model_repository:/models ... tritonserver --model-repository=/models``);
pass ``container_repository=`` for another mount point, or ``library_path=`` when the library is already in
the image. See ``runtime/triton/README.md``.

The shared configuration code (data types, :class:`Signature`, ``config.pbtxt``) is in
:mod:`dcnkit.runtime.triton_config`; its names are importable from here too. Configs are written and parsed
with Triton's own schema, ``tritonclient.grpc.model_config_pb2`` (``pip install 'tritonclient[grpc]'``); no GPU is
needed. ``backend="python"`` writes a Python-backend variant (:mod:`dcnkit.runtime.triton_python`) that the
``tritonserver`` of the ``nvidia-pytriton`` wheel loads here; :mod:`dcnkit.runtime.triton_server` runs it.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Sequence

from dcnkit.runtime.triton_config import (  # noqa: F401  (this module's public names since it was one file)
    DEFAULT_CONTAINER_REPOSITORY,
    DEFAULT_MAX_BATCH_SIZE,
    LIBRARY_FILENAME,
    V2_UNSUPPORTED,
    Signature,
    _private_dependencies,
    bundle_library,
    model_config,
    model_config_message,
    normalize_infos,
    numpy_dtype,
    shared_batch_dim,
    to_pbtxt,
    triton_data_type,
    v2_datatype,
    v2_shape,
)


BACKENDS = ("onnxruntime", "tensorrt", "python")


# ------------------------------------------------------------------------------------------------
# Repository writer
# ------------------------------------------------------------------------------------------------
def _fresh_model_dir(output_dir, name: str, overwrite: bool) -> Path:
    """``output_dir/name``, removed first when it exists and ``overwrite`` (else FileExistsError); not created."""
    model_dir = Path(output_dir) / name
    if model_dir.exists():
        if not overwrite:
            raise FileExistsError(f"output: {model_dir} exists (pass overwrite=True / --overwrite to replace it)")
        shutil.rmtree(model_dir)
    return model_dir


def write_repository(
    model,
    output_dir,
    name: str | None = None,
    *,
    max_batch_size: int | None = None,
    backend: str = "onnxruntime",
    max_queue_delay_us: int = 1000,
    preferred_batch_sizes: Sequence[int] = (),
    max_queue_size: int = 0,
    instance_kind: str | None = None,
    instance_count: int = 1,
    container_repository: str = DEFAULT_CONTAINER_REPOSITORY,
    library_path: str | None = None,
    version: int = 1,
    overwrite: bool = False,
    engine=None,
    shapes=None,
    precision: str | None = None,
    plugins: Sequence = (),
    runner_backend: str = "ort-cpu",
    kit_kernels: bool = True,
) -> Path:
    """Writes ``output_dir/<name>/{config.pbtxt, 1/model.onnx[, libdcnkit_ort.so]}``; returns the model dir.

    ``model`` is an ONNX path, bytes or ``onnx.ModelProto``; ``name`` defaults to the file's stem. When the
    model has deformable nodes (``dcnkit``, mmdeploy or mmcv ops, or a standard ``DeformConv``:
    :func:`dcnkit.runtime.base.has_deformable_nodes`) the kit's ONNX Runtime library is copied next to the config
    and referenced as ``<container_repository>/<name>/libdcnkit_ort.so`` (or ``library_path`` verbatim, then
    nothing is copied).

    ``backend="tensorrt"``: a ``tensorrt_plan`` model (:mod:`dcnkit.runtime.triton_tensorrt`): ``engine`` (a
    serialized engine, copied as it is) or an engine built here from the ONNX (``shapes``, ``precision``,
    ``plugins`` as in ``dcnkit build``; needs TensorRT), with the kit's plugin library (``libdcnkit_trt.so``)
    copied beside the config or ``library_path`` referenced.

    ``backend="python"``: Triton's Python backend running the kit's ``runner_backend`` (``ort-cpu`` or
    ``ort-cuda``; ``kit_kernels`` as in ``dcnkit run``) on ``1/model.onnx`` (:mod:`dcnkit.runtime.triton_python`);
    instances on the CPU unless ``instance_kind`` says otherwise.
    """
    import onnx

    from dcnkit.runtime.base import has_deformable_nodes, load_model

    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    if name is None:
        if isinstance(model, (str, os.PathLike)):
            name = Path(os.fspath(model)).stem
        else:
            raise ValueError("name: expected a model name when the model is not given as a file path, got None")
    if not name or "/" in name or name in (".", "..") or name.strip() != name:
        raise ValueError(f"name: expected a plain directory name, got {name!r}")
    if not isinstance(version, int) or version < 1:
        raise ValueError(f"version: expected an integer >= 1, got {version!r}")
    if not str(container_repository).startswith("/"):
        raise ValueError(f"container_repository: expected an absolute path, got {container_repository!r}")

    if backend == "tensorrt" and instance_kind == "KIND_CPU":
        raise ValueError("instance_kind: expected KIND_GPU or KIND_AUTO for a TensorRT engine, got 'KIND_CPU'")
    if backend != "tensorrt" and engine is not None:
        raise ValueError(f"engine: expected only with backend='tensorrt', got backend={backend!r}")

    m = load_model(model)
    signature = Signature.of(m)
    if backend == "tensorrt":
        from dcnkit.runtime.triton_tensorrt import write_tensorrt_repository

        cfg = model_config(
            signature, name, max_batch_size=max_batch_size, max_queue_delay_us=max_queue_delay_us,
            preferred_batch_sizes=preferred_batch_sizes, max_queue_size=max_queue_size,
            instance_kind=instance_kind, instance_count=instance_count, platform="tensorrt_plan",
        )
        model_dir = Path(output_dir) / name
        if model_dir.exists() and not overwrite:
            raise FileExistsError(f"output: {model_dir} exists (pass overwrite=True / --overwrite to replace it)")
        return write_tensorrt_repository(
            m, signature, model_dir, cfg, name=name, version=version, container_repository=container_repository,
            library_path=library_path, engine=engine, shapes=shapes, precision=precision, plugins=plugins,
        )
    if backend == "python":
        from dcnkit.runtime.triton_python import python_backend_config, write_python_repository

        cfg = python_backend_config(model_config(
            signature, name, max_batch_size=max_batch_size, max_queue_delay_us=max_queue_delay_us,
            preferred_batch_sizes=preferred_batch_sizes, max_queue_size=max_queue_size,
            instance_kind=instance_kind, instance_count=instance_count,
        ), runner_backend, kit_kernels)
        return write_python_repository(m, _fresh_model_dir(output_dir, name, overwrite), cfg, version=version)
    custom = has_deformable_nodes(m)  # standard DeformConv too: the library runs it where ORT has no kernel
    libs: list[str] = []
    lib_src = None
    if custom:
        if library_path:
            libs = [library_path]
        else:
            import dcnkit

            lib_src = Path(dcnkit.ort_library())  # FileNotFoundError with the places searched
            libs = [f"{container_repository.rstrip('/')}/{name}/{LIBRARY_FILENAME}"]
    cfg = model_config(
        signature, name,
        max_batch_size=max_batch_size, max_queue_delay_us=max_queue_delay_us,
        preferred_batch_sizes=preferred_batch_sizes, max_queue_size=max_queue_size,
        op_libraries=libs, instance_kind=instance_kind, instance_count=instance_count,
    )

    model_dir = _fresh_model_dir(output_dir, name, overwrite)
    (model_dir / str(version)).mkdir(parents=True)
    onnx.save_model(m, str(model_dir / str(version) / "model.onnx"))
    if lib_src is not None:
        bundle_library(lib_src, model_dir, LIBRARY_FILENAME)
    header = (
        "# Written by dcnkit triton-repo. Triton model configuration (protobuf text format).\n"
        + (f"# op_library_filename is the library's path inside the Triton container.\n" if libs else "")
    )
    (model_dir / "config.pbtxt").write_text(header + to_pbtxt(cfg) + "\n")
    return model_dir


# ------------------------------------------------------------------------------------------------
# Checking a config.pbtxt against Triton's schema
# ------------------------------------------------------------------------------------------------
def parse_config(text: str):
    """Parses a ``config.pbtxt`` into Triton's ``ModelConfig`` message (``tritonclient.grpc.model_config_pb2``).

    Unknown fields, wrong types and bad enum names raise ``google.protobuf.text_format.ParseError``.
    """
    from google.protobuf import text_format

    return text_format.Parse(text, model_config_message())


def check_repository(model_dir) -> list[str]:
    """Problems Triton would report when loading ``model_dir`` ([] if none): the config against Triton's schema and
    what the onnxruntime, TensorRT or Python backend (with the kit's ``model.py``) needs. Loading it in a real server
    is the final check where it can run: :func:`dcnkit.runtime.triton_server.check_loads` (``dcnkit triton-repo
    --backend python`` does it)."""
    model_dir = Path(model_dir)
    problems = []
    cfg_path = model_dir / "config.pbtxt"
    if not cfg_path.is_file():
        return [f"{cfg_path}: missing"]
    try:
        cfg = parse_config(cfg_path.read_text())
    except Exception as e:  # ParseError
        return [f"{cfg_path}: {e}"]
    if cfg.name and cfg.name != model_dir.name:
        problems.append(f"name: expected the directory name {model_dir.name!r}, got {cfg.name!r}")
    tensorrt = cfg.platform == "tensorrt_plan" or cfg.backend == "tensorrt"
    python = cfg.backend == "python"
    if not (tensorrt or python) and cfg.platform != "onnxruntime_onnx" and cfg.backend != "onnxruntime":
        problems.append(f"platform/backend: expected onnxruntime_onnx / onnxruntime, tensorrt_plan / tensorrt or "
                        f"python, got {cfg.platform!r} / {cfg.backend!r}")
    default_file = "model.plan" if tensorrt else "model.py" if python else "model.onnx"
    versions = [p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    if not versions:
        problems.append(f"{model_dir}: no numeric version directory")
    for v in versions:
        for f in [cfg.default_model_filename or default_file] + (["model.onnx"] if python else []):
            if not (v / f).is_file():
                problems.append(f"{v}: missing {f}")
    if tensorrt and any(g.kind == 2 for g in cfg.instance_group):  # KIND_CPU
        problems.append("instance_group: TensorRT engines run on GPUs, got KIND_CPU")
    for kind, items in (("input", cfg.input), ("output", cfg.output)):
        if not items:
            problems.append(f"{kind}: none declared")
        for t in items:
            if not t.name:
                problems.append(f"{kind}: an entry has no name")
            if t.data_type == 0:
                problems.append(f"{kind} {t.name!r}: data_type missing")
            if not len(t.dims):
                problems.append(f"{kind} {t.name!r}: dims missing")
            if any(d < -1 or d == 0 for d in t.dims):
                problems.append(f"{kind} {t.name!r}: dims must be -1 or positive, got {list(t.dims)}")
    if cfg.HasField("dynamic_batching") and cfg.max_batch_size <= 0:
        problems.append("dynamic_batching: needs max_batch_size > 0")
    return problems


__all__ = [
    "Signature",
    "shared_batch_dim",
    "normalize_infos",
    "v2_datatype",
    "v2_shape",
    "numpy_dtype",
    "triton_data_type",
    "model_config",
    "to_pbtxt",
    "write_repository",
    "parse_config",
    "check_repository",
    "bundle_library",
    "LIBRARY_FILENAME",
    "DEFAULT_CONTAINER_REPOSITORY",
    "DEFAULT_MAX_BATCH_SIZE",
]
