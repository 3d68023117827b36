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
        libdcnkit_ort.so      # the kit's ONNX Runtime custom-op library (only when the model uses dcnkit ops),
        libscipy_openblas.so  # the private libraries it needs (the kit's libraries search $ORIGIN first)
        1/model.onnx

``op_library_filename`` is handed by Triton's onnxruntime backend to ``RegisterCustomOpsLibrary`` as it is,
so it must be the path *inside the Triton container*. The default assumes the repository is mounted at
``/models`` (``docker run -v $PWD/model_repository:/models ... tritonserver --model-repository=/models``);
pass ``container_repository=`` for another mount point, or ``library_path=`` when the library is already in
the image. See ``runtime/triton/README.md``.

The shared configuration code (data types, :class:`Signature`, ``config.pbtxt``) is in
:mod:`dcnkit.runtime.triton_config`; its names are importable from here too. Nothing here needs
``tritonclient`` or a GPU; ``parse_config`` checks a ``config.pbtxt`` against the field
names and types of Triton's ``model_config.proto`` (a subset, built with protobuf, which ONNX already needs).
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
    normalize_infos,
    numpy_dtype,
    shared_batch_dim,
    to_pbtxt,
    triton_data_type,
    v2_datatype,
    v2_shape,
)


# ------------------------------------------------------------------------------------------------
# Repository writer
# ------------------------------------------------------------------------------------------------
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
) -> Path:
    """Writes ``output_dir/<name>/{config.pbtxt, 1/model.onnx[, libdcnkit_ort.so]}``; returns the model dir.

    ``model`` is an ONNX path, bytes or ``onnx.ModelProto``; ``name`` defaults to the file's stem. When the
    model has ``dcnkit``-domain nodes the kit's ONNX Runtime library is copied next to the config and
    referenced as ``<container_repository>/<name>/libdcnkit_ort.so`` (or ``library_path`` verbatim, then
    nothing is copied).

    ``backend="tensorrt"``: a ``tensorrt_plan`` model (:mod:`dcnkit.runtime.triton_tensorrt`): ``engine`` (a
    serialized engine, copied as it is) or an engine built here from the ONNX (``shapes``, ``precision``,
    ``plugins`` as in ``dcnkit build``; needs TensorRT), with the kit's plugin library (``libdcnkit_trt.so``)
    copied beside the config or ``library_path`` referenced.
    """
    import onnx

    from dcnkit.runtime.base import load_model, uses_custom_ops

    if backend not in ("onnxruntime", "tensorrt"):
        raise ValueError(f"backend: expected 'onnxruntime' or 'tensorrt', got {backend!r}")
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
    custom = uses_custom_ops(m)
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

    model_dir = Path(output_dir) / name
    if model_dir.exists():
        if not overwrite:
            raise FileExistsError(f"output: {model_dir} exists (pass overwrite=True / --overwrite to replace it)")
        shutil.rmtree(model_dir)
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
_SCHEMA = None

# (message, [(field, number, type, label, type_name)]) mirroring triton-inference-server/common
# protobuf/model_config.proto (field names, numbers and types; only the messages a dcnkit config uses).
_MESSAGES = [
    ("ModelTensorReshape", [("shape", 1, "int64", "repeated", None)]),
    ("ModelInput", [
        ("name", 1, "string", "optional", None), ("data_type", 2, "enum", "optional", "DataType"),
        ("format", 3, "enum", "optional", "ModelInput.Format"), ("dims", 4, "int64", "repeated", None),
        ("reshape", 5, "message", "optional", "ModelTensorReshape"),
        ("is_shape_tensor", 6, "bool", "optional", None), ("allow_ragged_batch", 7, "bool", "optional", None),
        ("optional", 8, "bool", "optional", None),
    ]),
    ("ModelOutput", [
        ("name", 1, "string", "optional", None), ("data_type", 2, "enum", "optional", "DataType"),
        ("dims", 3, "int64", "repeated", None), ("label_filename", 4, "string", "optional", None),
        ("reshape", 5, "message", "optional", "ModelTensorReshape"),
        ("is_shape_tensor", 6, "bool", "optional", None),
    ]),
    ("ModelInstanceGroup", [
        ("name", 1, "string", "optional", None), ("count", 2, "int32", "optional", None),
        ("gpus", 3, "int32", "repeated", None), ("kind", 4, "enum", "optional", "ModelInstanceGroup.Kind"),
    ]),
    ("ModelQueuePolicy", [
        ("default_timeout_microseconds", 2, "uint64", "optional", None),
        ("allow_timeout_override", 3, "bool", "optional", None),
        ("max_queue_size", 4, "uint32", "optional", None),
    ]),
    ("ModelDynamicBatching", [
        ("preferred_batch_size", 1, "int32", "repeated", None),
        ("max_queue_delay_microseconds", 2, "uint64", "optional", None),
        ("preserve_ordering", 3, "bool", "optional", None),
        ("default_queue_policy", 6, "message", "optional", "ModelQueuePolicy"),
    ]),
    ("ModelOperations", [("op_library_filename", 1, "string", "repeated", None)]),
    ("ModelConfig", [
        ("name", 1, "string", "optional", None), ("platform", 2, "string", "optional", None),
        ("max_batch_size", 4, "int32", "optional", None), ("input", 5, "message", "repeated", "ModelInput"),
        ("output", 6, "message", "repeated", "ModelOutput"),
        ("instance_group", 7, "message", "repeated", "ModelInstanceGroup"),
        ("default_model_filename", 8, "string", "optional", None),
        ("dynamic_batching", 11, "message", "optional", "ModelDynamicBatching"),
        ("backend", 17, "string", "optional", None),
        ("model_operations", 18, "message", "optional", "ModelOperations"),
    ]),
]
_DATA_TYPES = ["TYPE_INVALID", "TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64",
               "TYPE_INT8", "TYPE_INT16", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32", "TYPE_FP64",
               "TYPE_STRING", "TYPE_BF16"]


def _schema():
    global _SCHEMA
    if _SCHEMA is not None:
        return _SCHEMA
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fd = descriptor_pb2.FileDescriptorProto(name="dcnkit_triton_model_config.proto", package="inference",
                                            syntax="proto3")
    en = fd.enum_type.add(name="DataType")
    for i, n in enumerate(_DATA_TYPES):
        en.value.add(name=n, number=i)
    types = {
        "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
        "int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
        "int32": descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
        "uint64": descriptor_pb2.FieldDescriptorProto.TYPE_UINT64,
        "uint32": descriptor_pb2.FieldDescriptorProto.TYPE_UINT32,
        "bool": descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
        "enum": descriptor_pb2.FieldDescriptorProto.TYPE_ENUM,
        "message": descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
    }
    labels = {"optional": descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
              "repeated": descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED}
    for msg_name, fields in _MESSAGES:
        msg = fd.message_type.add(name=msg_name)
        if msg_name == "ModelInput":
            e = msg.enum_type.add(name="Format")
            for i, n in enumerate(["FORMAT_NONE", "FORMAT_NHWC", "FORMAT_NCHW"]):
                e.value.add(name=n, number=i)
        if msg_name == "ModelInstanceGroup":
            e = msg.enum_type.add(name="Kind")
            for i, n in enumerate(["KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL"]):
                e.value.add(name=n, number=i)
        for fname, num, ftype, label, tname in fields:
            f = msg.field.add(name=fname, number=num, type=types[ftype], label=labels[label])
            if tname:
                f.type_name = f".inference.{tname}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    _SCHEMA = message_factory.GetMessageClass(pool.FindMessageTypeByName("inference.ModelConfig"))
    return _SCHEMA


def parse_config(text: str):
    """Parses a ``config.pbtxt`` into a ``ModelConfig`` message (subset of Triton's schema).

    Unknown fields, wrong types and bad enum names raise ``google.protobuf.text_format.ParseError``.
    """
    from google.protobuf import text_format

    return text_format.Parse(text, _schema()())


def check_repository(model_dir) -> list[str]:
    """Problems Triton would report when loading ``model_dir`` with the onnxruntime or TensorRT backend ([] if none)."""
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
    if not tensorrt and cfg.platform != "onnxruntime_onnx" and cfg.backend != "onnxruntime":
        problems.append(f"platform/backend: expected onnxruntime_onnx / onnxruntime or tensorrt_plan / tensorrt, "
                        f"got {cfg.platform!r} / {cfg.backend!r}")
    default_file = "model.plan" if tensorrt else "model.onnx"
    versions = [p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    if not versions:
        problems.append(f"{model_dir}: no numeric version directory")
    for v in versions:
        if not (v / (cfg.default_model_filename or default_file)).is_file():
            problems.append(f"{v}: missing {cfg.default_model_filename or default_file}")
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
