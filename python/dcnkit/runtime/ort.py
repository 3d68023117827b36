"""ONNX Runtime sessions with the kit's custom-op library registered.

>>> from dcnkit.runtime import ort_session
>>> sess = ort_session("model.onnx", intra_op_num_threads=2)        # CUDA when available, else CPU
>>> y, = sess.run(None, {"input": x})

The library implements every operator of the kit's table in domain ``dcnkit`` and every other name the table lists
(the ops mmdeploy / mmcv 1.x export, ``mmdeploy::MMCVModulatedDeformConv2d``, ``mmcv::MMCVRoiAlign``, ...; see
``dcnkit.op_defs()``), so models exported by those tools run unchanged.
Two builds exist: ``libdcnkit_ort.so`` (CPU kernels, no CUDA dependency) and ``libdcnkit_ort_cuda.so``
(CPU + CUDA execution-provider kernels, built when CUDA is); :func:`ort_library` picks one.

Standard ``DeformConv`` nodes (what ``torch.onnx.export`` writes) run on the kit's ``DeformConv2d`` kernel by
default on the CPU execution provider, every node whatever its shape (measured at most the built-in's time on every
layer shape, and the border contract of docs/operators.md holds): the session is built from an in-memory copy of the model with those nodes rewritten (:mod:`dcnkit.runtime.ort_rewrite`; identical semantics, the
file on disk stays standard). On the CUDA execution provider ONNX Runtime's built-in ``DeformConv`` is faster (measured on an H100)
and is kept (:data:`KIT_DEFORM_CONV_FASTER`, :func:`rewrites_deform_conv`).
``ort_session(..., kit_kernels=False)`` keeps ONNX Runtime's built-in ``DeformConv``. ONNX Runtime has that kernel
from 1.26; with an older release (the library loads into 1.16 and later) the library itself registers its kernel for
the standard ``DeformConv`` too, so such nodes run there either way (docs/onnxruntime_versions.md).
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

from dcnkit.runtime.gpu import gpu_present as _gpu_present

__all__ = ["ort_session", "ort_library", "default_providers", "cuda_provider_available", "rewrites_deform_conv",
           "KIT_DEFORM_CONV_FASTER"]

CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"


def cuda_provider_available() -> bool:
    """True when this onnxruntime has the CUDA execution provider and a GPU is present."""
    try:
        import onnxruntime as ort
    except ImportError:
        return False
    return CUDA_PROVIDER in ort.get_available_providers() and _gpu_present()


def default_providers() -> list:
    """CUDA (then CPU) when onnxruntime has the CUDA provider and a GPU exists, else CPU."""
    return [CUDA_PROVIDER, CPU_PROVIDER] if cuda_provider_available() else [CPU_PROVIDER]


def _provider_name(p) -> str:
    return p[0] if isinstance(p, (tuple, list)) else str(p)


def ort_library(cuda: bool = False) -> str:
    """Absolute path of the kit's custom-op library: the CUDA build (``libdcnkit_ort_cuda.so``) when
    ``cuda`` is true, else the CPU build (``libdcnkit_ort.so``). Raises FileNotFoundError listing the
    places searched when it is not there."""
    from dcnkit._lib import find_library

    if cuda:
        return str(find_library("dcnkit_ort_cuda"))
    import dcnkit

    return dcnkit.ort_library()


def _wants_cuda(providers: list) -> bool:
    return any(_provider_name(p) == CUDA_PROVIDER for p in providers)


def _library_for(providers: list) -> str:
    if _wants_cuda(providers) and cuda_provider_available():
        try:
            return ort_library(cuda=True)
        except FileNotFoundError as e:
            warnings.warn(
                f"dcnkit: the CUDA build of the ONNX Runtime library is missing ({e}); the kit's ops will "
                "run on the CPU (rebuild with CUDA to get libdcnkit_ort_cuda.so)",
                RuntimeWarning,
                stacklevel=3,
            )
    return ort_library(cuda=False)


def _session_option_names(so) -> list[str]:
    names = []
    for n in dir(so):
        if n.startswith("_"):
            continue
        try:
            v = getattr(so, n)
        except Exception:  # pragma: no cover
            continue
        if not callable(v):
            names.append(n)
    return sorted(names)


def _coerce_option(ort, name: str, value):
    """Accepts enum names for the enum-valued options ("ORT_ENABLE_ALL", "ORT_SEQUENTIAL", ...)."""
    enums = {"graph_optimization_level": ort.GraphOptimizationLevel, "execution_mode": ort.ExecutionMode}
    if name in enums and isinstance(value, str):
        enum = enums[name]
        try:
            return getattr(enum, value)
        except AttributeError:
            choices = [m for m in dir(enum) if m.startswith("ORT_")]
            raise ValueError(f"ort_session: {name}: expected one of {choices}, got {value!r}") from None
    return value


def _model_arg(model):
    if isinstance(model, (bytes, bytearray)):
        return bytes(model)
    try:
        import onnx

        if isinstance(model, onnx.ModelProto):
            return model.SerializeToString()
    except ImportError:  # pragma: no cover - onnx is optional for running
        pass
    if isinstance(model, (str, os.PathLike)):
        path = Path(os.fspath(model))
        if not path.is_file():
            raise FileNotFoundError(f"ort_session: model: expected an existing ONNX file, got {str(path)!r}")
        return str(path)
    raise TypeError(f"ort_session: model: expected a path, bytes or onnx.ModelProto, got {type(model).__name__}")


def _load_proto(model):
    """``model`` (path, bytes or ModelProto) as an ``onnx.ModelProto`` without its external data, or None
    when it cannot be parsed here (ONNX Runtime then reports the problem)."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model
    try:
        if isinstance(model, (bytes, bytearray)):
            return onnx.load_from_string(bytes(model))
        return onnx.load(os.fspath(model), load_external_data=False)
    except Exception:  # noqa: BLE001 - not a model onnx can read: leave it to ONNX Runtime
        return None


# Where the kit's DeformConv2d kernel is measured faster than ONNX Runtime's built-in DeformConv, per execution
# provider (benchmarks/bench_ort_deform_conv.py, IO binding on the GPU). CPU: faster on every layer shape measured
# (docs/performance.md). CUDA: slower, measured
# on an NVIDIA H100 on 2026-11-24 with the kernels of that date (1.9x-3.4x the built-in's time, fp32 and fp16): the
# rewrite stays off on the CUDA EP until the kit's CUDA kernel is measured faster there.
KIT_DEFORM_CONV_FASTER = {CPU_PROVIDER: True, CUDA_PROVIDER: False}


def rewrites_deform_conv(providers: list) -> bool:
    """Whether ``ort_session(..., kit_kernels=True)`` runs standard DeformConv nodes on the kit's kernel with these
    providers: where the kit's kernel is the faster one (:data:`KIT_DEFORM_CONV_FASTER`) on the provider that
    will run them (the CUDA EP when it is requested and usable, else the CPU EP)."""
    on_cuda = _wants_cuda(providers) and cuda_provider_available()
    return KIT_DEFORM_CONV_FASTER[CUDA_PROVIDER if on_cuda else CPU_PROVIDER]


def _with_kit_kernels(model, providers: list):
    """``model`` with standard DeformConv nodes on the kit's kernel (bytes), or ``model`` unchanged when
    it has none, when ONNX Runtime's built-in kernel is the faster one on the provider that runs them
    (:func:`rewrites_deform_conv`), or when the rewrite is not possible (a warning says why). Every node the kit can
    represent is rewritten."""
    if not rewrites_deform_conv(providers):
        return model
    proto = _load_proto(model)
    if proto is None:
        return model
    from dcnkit.runtime.ort_rewrite import count_deform_conv, rewrite_deform_conv

    if count_deform_conv(proto) == 0:
        return model
    import onnx.external_data_helper as ext

    if isinstance(model, (str, os.PathLike)) and any(
        ext.uses_external_data(t) for t in ext._get_all_tensors(proto)
    ):
        ext.load_external_data_for_model(proto, str(Path(os.fspath(model)).resolve().parent))
    rewritten, n = rewrite_deform_conv(proto)
    if n == 0:
        return model
    try:
        return rewritten.SerializeToString()
    except ValueError as e:  # protobuf's 2 GiB limit
        warnings.warn(
            f"dcnkit: DeformConv nodes run on ONNX Runtime's built-in kernel: the rewritten model cannot be "
            f"serialized ({e})",
            RuntimeWarning,
            stacklevel=3,
        )
        return model


def _set_config(so, config) -> None:
    """``SessionOptions.add_session_config_entry`` for each item of ``config`` (str -> str)."""
    if not isinstance(config, dict):
        raise TypeError(f"ort_session: session_config: expected a dict of str to str, got {type(config).__name__}")
    for key, value in config.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"ort_session: session_config: expected str keys and values, got {key!r}: {value!r}")
        so.add_session_config_entry(key, value)


def ort_session(model, providers=None, kit_kernels: bool = True, session_config=None, **options):
    """An ``onnxruntime.InferenceSession`` for ``model`` with the kit's custom-op library registered.

    ``model``: a path, serialized bytes or an ``onnx.ModelProto``. ``providers``: as for ONNX Runtime
    (names or ``(name, options)`` tuples); default :func:`default_providers`. ``kit_kernels`` (default True):
    standard ``DeformConv`` nodes run on the kit's ``DeformConv2d`` kernel where it is the faster one (an
    in-memory rewrite with identical semantics, see :mod:`dcnkit.runtime.ort_rewrite`; the model file is not
    changed): on the CPU EP, node by node from its shape; on the CUDA EP ONNX Runtime's built-in kernel is kept (:func:`rewrites_deform_conv`).
    False keeps ONNX Runtime's built-in kernel everywhere. ``options`` set attributes of
    ``onnxruntime.SessionOptions`` (``intra_op_num_threads=2``, ``graph_optimization_level="ORT_ENABLE_ALL"``,
    ``log_severity_level=3`` ...); an unknown name is a TypeError listing the valid ones. ``session_config``: session
    configuration entries (``{"session.intra_op.allow_spinning": "0"}``). The CUDA build
    of the library is registered when the CUDA provider is requested and usable.
    """
    import onnxruntime as ort

    if not isinstance(kit_kernels, bool):
        raise TypeError(f"ort_session: kit_kernels: expected a bool, got {type(kit_kernels).__name__}")

    so = ort.SessionOptions()
    known = _session_option_names(so)
    for name, value in options.items():
        if name not in known:
            raise TypeError(
                f"ort_session: unknown SessionOptions attribute {name!r}; expected one of {', '.join(known)}"
            )
        try:
            setattr(so, name, _coerce_option(ort, name, value))
        except (TypeError, AttributeError) as e:
            raise TypeError(f"ort_session: {name}: cannot set {value!r}: {e}") from None
    if session_config is not None:
        _set_config(so, session_config)
    providers = default_providers() if providers is None else list(providers)
    if not providers:
        raise ValueError("ort_session: providers: expected at least one execution provider, got []")
    library = _library_for(providers)
    so.register_custom_ops_library(library)
    model_arg = _model_arg(model)
    if kit_kernels:
        model_arg = _with_kit_kernels(model_arg, providers)
    return ort.InferenceSession(model_arg, sess_options=so, providers=providers)
