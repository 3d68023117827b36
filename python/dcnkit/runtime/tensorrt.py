"""TensorRT with the kit's plugin library, on Polygraphy's TensorRT loaders.

>>> from dcnkit.runtime.tensorrt import build_engine, TensorRTRunner
>>> build_engine("m.onnx", "m.engine", precision="fp16", shapes={"x": ((1, 3, 64, 64), (4, 3, 64, 64), (8, 3, 64, 64))})
>>> with TensorRTRunner("m.engine") as r:          # or "m.onnx": an engine per input shape, built on first use
...     out = r.run({"x": x})

- Plugins: the kit's library (:func:`dcnkit.tensorrt_library`) is always loaded, plus any ``plugins``. A library
  that exports ``getCreators`` (IPluginV3, like ours) is loaded with ``IPluginRegistry.load_library`` -- the way
  ``trtexec --dynamicPlugins`` loads it; a library that registers itself when loaded goes through Polygraphy's
  ``LoadPlugins`` (a plain ``dlopen``).
- Nodes in the ``dcnkit`` domain without a ``plugin_namespace`` attribute (files exported before the attribute
  existed) get ``plugin_namespace="dcnkit"`` before parsing, so the parser's plugin fallback finds our creators.
- Reduced precision: TensorRT 11 builds strongly typed networks only (no FP16/BF16 builder flags), so
  ``precision="fp16"|"bf16"`` converts the model's float32 tensors first (:mod:`dcnkit.runtime.precision`: the
  whole network in one float type, our nodes included, but the RoIs of the RoI operators, which stay float32;
  inputs and outputs stay float32); on TensorRT 10 it sets
  ``BuilderFlag.FP16`` / ``BF16`` and TensorRT picks the precision per layer. The build log says which.
- INT8: ``precision="int8"`` takes a QDQ model (``dcnkit quantize``), rewritten into TensorRT's symmetric int8 Q/DQ
  (:mod:`dcnkit.runtime.tensorrt_int8`); TensorRT 11 needs no flag for it, TensorRT 10 gets ``BuilderFlag.INT8``.
- Engines run through Polygraphy's ``TrtRunner`` (NumPy in and out, Polygraphy's own CUDA wrapper: no torch, no pycuda).

Nothing here imports ``tensorrt`` at module level; without it every entry point raises
:class:`~dcnkit.runtime.base.BackendUnavailable` with one line saying what is missing.
This module has never run against a real TensorRT on this project's machines (none has a GPU or TensorRT);
it is written against the TensorRT 10/11 Python API and Polygraphy 0.53's loaders.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from dcnkit.runtime.base import Backend, BackendUnavailable, Runner, TensorInfo, load_model, value_infos
from dcnkit.runtime.tensorrt_requirements import tensorrt_reason

ENGINE_SUFFIXES = (".engine", ".plan", ".trt")
PLUGIN_NAMESPACE = "dcnkit"
PRECISIONS = ("fp16", "bf16", "int8")
_CONVERT_DTYPE = {"fp16": "float16", "bf16": "bfloat16"}
_LOADED: dict[str, object] = {}  # plugin library path -> registry handle (kept for the process' lifetime)


class ShapeSpecError(ValueError):
    """A bad ``--shapes`` entry; the message starts with the argument's name."""


def is_engine_file(path) -> bool:
    """True for a serialized TensorRT engine by its suffix (``.engine``, ``.plan``, ``.trt``)."""
    return isinstance(path, (str, os.PathLike)) and Path(os.fspath(path)).suffix.lower() in ENGINE_SUFFIXES


def require_tensorrt() -> None:
    """Raises BackendUnavailable (one line: what is missing, how to get it) unless TensorRT can run here."""
    reason = tensorrt_reason()
    if reason:
        raise BackendUnavailable(f"tensorrt: {reason}")


# ------------------------------------------------------------------------------------------------
# Shapes and optimization profiles
# ------------------------------------------------------------------------------------------------
def _dims(text: str, arg: str, whole: str) -> tuple[int, ...]:
    parts = [p for p in re.split(r"[x,]", text.strip())]
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise ShapeSpecError(f"{arg}: expected NAME:MIN:OPT:MAX with shapes like 1x3x64x64, got {whole!r}") from None
    if any(d < 0 for d in dims):
        raise ShapeSpecError(f"{arg}: expected non-negative dims, got {whole!r}")
    return dims


def parse_shapes(texts: Sequence[str], arg: str = "--shapes") -> dict[str, tuple[tuple, tuple, tuple]]:
    """``["x:1x3x64x64:4x3x64x64:8x3x64x64", ...]`` -> ``{"x": (min, opt, max)}``.

    NAME may itself contain ``:`` (the last three fields are the shapes). Ranks must agree and
    ``min <= opt <= max`` per dim; each name once.
    """
    out: dict[str, tuple[tuple, tuple, tuple]] = {}
    for text in texts or []:
        parts = text.rsplit(":", 3)
        if len(parts) != 4 or not parts[0]:
            raise ShapeSpecError(f"{arg}: expected NAME:MIN:OPT:MAX (e.g. x:1x3x64x64:4x3x64x64:8x3x64x64), "
                                 f"got {text!r}")
        name = parts[0]
        lo, opt, hi = (_dims(p, arg, text) for p in parts[1:])
        if not len(lo) == len(opt) == len(hi):
            raise ShapeSpecError(f"{arg}: {name}: expected MIN, OPT and MAX of one rank, got {lo}, {opt}, {hi}")
        if not all(a <= b <= c for a, b, c in zip(lo, opt, hi)):
            raise ShapeSpecError(f"{arg}: {name}: expected MIN <= OPT <= MAX in every dim, got {lo}, {opt}, {hi}")
        if name in out:
            raise ShapeSpecError(f"{arg}: expected each input once, got {name!r} twice")
        out[name] = (lo, opt, hi)
    return out


def check_shapes(model, shapes: Mapping[str, tuple], arg: str = "--shapes") -> dict:
    """Checks ``shapes`` against the ONNX model's inputs: known names, ranks, fixed dims; every input with
    dynamic dims needs an entry. Returns ``shapes``."""
    m = load_model(model)
    inits = {t.name for t in m.graph.initializer}
    infos = value_infos([v for v in m.graph.input if v.name not in inits])
    names = [i.name for i in infos]
    unknown = [n for n in shapes if n not in names]
    if unknown:
        raise ShapeSpecError(f"{arg}: expected input names among {names}, got {unknown}")
    for info in infos:
        if info.name not in shapes:
            if not info.is_static:
                shown = "x".join(str(d) if isinstance(d, int) else "?" for d in info.shape)
                raise ShapeSpecError(f"{arg}: input {info.name!r} has dynamic dims {info.shape}: give "
                                     f"{arg} {info.name}:MIN:OPT:MAX (shapes like {shown})")
            continue
        for which, dims in zip(("MIN", "OPT", "MAX"), shapes[info.name]):
            if len(dims) != len(info.shape):
                raise ShapeSpecError(f"{arg}: {info.name}: expected rank {len(info.shape)} {info.shape}, "
                                     f"got {which} {dims}")
            for want, got in zip(info.shape, dims):
                if isinstance(want, int) and want >= 0 and want != got:
                    raise ShapeSpecError(f"{arg}: {info.name}: expected {which} to match the fixed dims of "
                                         f"{info.shape}, got {dims}")
    return dict(shapes)


def make_profile(shapes: Mapping[str, tuple]):
    """A Polygraphy ``Profile`` (one TensorRT optimization profile) from ``{name: (min, opt, max)}``."""
    from polygraphy.backend.trt import Profile

    profile = Profile()
    for name, (lo, opt, hi) in shapes.items():
        profile.add(name, min=tuple(lo), opt=tuple(opt), max=tuple(hi))
    return profile


# ------------------------------------------------------------------------------------------------
# Plugins and the ONNX preparation
# ------------------------------------------------------------------------------------------------
def _exports_creators(path: Path) -> bool:
    """Whether a library exposes creators for ``IPluginRegistry::loadLibrary`` (``getCreators`` or the
    IPluginV2-era ``getPluginCreators``)."""
    import ctypes

    lib = ctypes.CDLL(str(path), mode=getattr(os, "RTLD_LAZY", 1) | ctypes.RTLD_LOCAL)
    return hasattr(lib, "getCreators") or hasattr(lib, "getPluginCreators")


def _registered(registry, name: str, version: str, namespace: str) -> bool:
    for getter in ("get_creator", "get_plugin_creator"):  # TensorRT 10+ / older
        fn = getattr(registry, getter, None)
        if fn is None:
            continue
        try:
            if fn(name, version, namespace) is not None:
                return True
        except Exception:
            continue
    return False


def load_plugins(extra: Sequence = (), log: Callable[[str], None] | None = None) -> list[str]:
    """Loads TensorRT's own plugins, the kit's plugin library and ``extra`` libraries (once per process).

    Returns the paths loaded. Raises BackendUnavailable without TensorRT, FileNotFoundError for a missing
    library, ValueError when the kit's library does not serve the running TensorRT (one line naming both),
    RuntimeError when TensorRT refuses one.
    """
    require_tensorrt()
    import tensorrt as trt
    from polygraphy.backend.trt import LoadPlugins
    from polygraphy.backend.trt import util as trt_util

    import dcnkit
    from dcnkit import _polygraphy_torch

    _polygraphy_torch.install()  # Polygraphy's torch checks do not import torch

    trt.init_libnvinfer_plugins(trt_util.get_trt_logger(), "")
    registry = trt.get_plugin_registry()
    ours = Path(dcnkit.tensorrt_library(getattr(trt, "__version__", None)))  # ValueError: a release it does not serve
    paths = [ours]
    for p in extra or []:
        p = Path(os.fspath(p))
        if not p.is_file():
            raise FileNotFoundError(f"--plugins: expected an existing plugin library, got {str(p)!r}")
        paths.append(p)
    for p in paths:
        key = str(p.resolve())
        if key in _LOADED:
            continue
        if _exports_creators(p):
            how = "IPluginRegistry.load_library"
            if p == ours and _registered(registry, "DeformConv2d", "1", PLUGIN_NAMESPACE):
                handle, how = None, "already registered (libdcnkit_trt_autoreg.so was loaded)"
            else:
                # load_library first: TensorRT registers what getCreators returns, and the plugins log through
                # TensorRT's logger. Our library's fallback is a dlopen of libdcnkit_trt_autoreg.so beside it.
                load = getattr(registry, "load_library", None)
                handle = load(key) if load is not None else None
                if handle is None and p == ours and p.with_name("libdcnkit_trt_autoreg.so").is_file():
                    LoadPlugins(plugins=[str(p.with_name("libdcnkit_trt_autoreg.so"))])()
                    how = "dlopen of libdcnkit_trt_autoreg.so (IPluginRegistry.load_library failed)"
                    if not _registered(registry, "DeformConv2d", "1", PLUGIN_NAMESPACE):
                        raise RuntimeError(f"tensorrt: neither IPluginRegistry.load_library nor "
                                           f"libdcnkit_trt_autoreg.so registered {key} (see the TensorRT log)")
                elif handle is None:
                    raise RuntimeError(f"tensorrt: IPluginRegistry.load_library refused {key} (see the TensorRT log)")
        else:
            LoadPlugins(plugins=[key])()  # a library that registers itself when loaded
            handle, how = None, "dlopen"
        _LOADED[key] = handle
        if log:
            log(f"plugins: {key} ({how})")
    return list(_LOADED)


def add_plugin_namespace(model) -> int:
    """Gives every ``dcnkit``-domain node without one a ``plugin_namespace="dcnkit"`` attribute (in place).

    TensorRT's ONNX parser looks a custom node's plugin up by (op type, ``plugin_version`` or "1",
    ``plugin_namespace`` or ""); our creators live in namespace "dcnkit". Returns the number of nodes changed.
    """
    from onnx import helper

    changed = 0
    graphs = [model.graph]
    while graphs:
        g = graphs.pop()
        for n in g.node:
            if n.domain == PLUGIN_NAMESPACE and not any(a.name == "plugin_namespace" for a in n.attribute):
                n.attribute.append(helper.make_attribute("plugin_namespace", PLUGIN_NAMESPACE))
                changed += 1
            for a in n.attribute:
                if a.type == a.GRAPH:
                    graphs.append(a.g)
                graphs.extend(a.graphs)
    for f in model.functions:
        for n in f.node:
            if n.domain == PLUGIN_NAMESPACE and not any(a.name == "plugin_namespace" for a in n.attribute):
                n.attribute.append(helper.make_attribute("plugin_namespace", PLUGIN_NAMESPACE))
                changed += 1
    return changed


def strongly_typed_only() -> bool:
    """True on TensorRT 11+, whose builder has no FP16/BF16 flags (networks are always strongly typed)."""
    import tensorrt as trt

    return not hasattr(trt.BuilderFlag, "FP16")


def _progress_monitor():
    """A ``trt.IProgressMonitor`` drawing one tqdm bar per build phase (None without tqdm or the interface)."""
    import tensorrt as trt

    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        return None
    if not hasattr(trt, "IProgressMonitor"):
        return None

    class _Monitor(trt.IProgressMonitor):
        def __init__(self):
            trt.IProgressMonitor.__init__(self)
            self._bars = {}

        def phase_start(self, phase_name, parent_phase, num_steps):
            self._bars[phase_name] = tqdm(total=num_steps, desc=phase_name, leave=False,
                                          position=len(self._bars), unit="step")

        def step_complete(self, phase_name, step):
            bar = self._bars.get(phase_name)
            if bar is not None:
                bar.update(max(0, step + 1 - bar.n))
            return True  # never cancel

        def phase_finish(self, phase_name):
            bar = self._bars.pop(phase_name, None)
            if bar is not None:
                bar.close()

    return _Monitor()


# ------------------------------------------------------------------------------------------------
# Building
# ------------------------------------------------------------------------------------------------
def build_engine_bytes(model, *, precision: str | None = None, shapes: Mapping | None = None,
                       workspace_mib: int | None = None, timing_cache=None, plugins: Sequence = (),
                       log: Callable[[str], None] | None = None, progress: bool = False) -> bytes:
    """A serialized engine for ``model`` (ONNX path, bytes or ModelProto) with the kit's plugins loaded.

    ``precision``: None (float32, or the ONNX's own types), "fp16", "bf16" or "int8" (a QDQ model; see the module doc);
    ``shapes``: ``{input: (min, opt, max)}`` for one optimization profile (needed for dynamic dims);
    ``workspace_mib``: the builder's workspace pool limit; ``timing_cache``: a file read when it exists and
    written back after the build.
    """
    if precision not in (None, *PRECISIONS):
        raise ValueError(f"precision: expected None, 'fp16', 'bf16' or 'int8', got {precision!r}")
    if workspace_mib is not None and workspace_mib < 1:
        raise ValueError(f"workspace_mib: expected >= 1, got {workspace_mib}")
    say = log or (lambda _msg: None)
    load_plugins(plugins, log=say)
    import tensorrt as trt
    from polygraphy.backend.trt import CreateConfig, EngineBytesFromNetwork, NetworkFromOnnxBytes, NetworkFromOnnxPath

    path = Path(os.fspath(model)) if isinstance(model, (str, os.PathLike)) else None
    proto = load_model(model)
    changed = 0
    flags = {}
    if precision == "int8":
        from dcnkit.runtime.tensorrt_int8 import int8_build_setup

        proto, flags = int8_build_setup(proto, strongly_typed_only(), trt.__version__, say)
        changed += 1
    elif precision:
        if strongly_typed_only():
            from dcnkit.runtime.precision import convert_float_tensors

            proto, report = convert_float_tensors(proto, _CONVERT_DTYPE[precision])
            changed += 1
            say(f"precision: TensorRT {trt.__version__} builds strongly typed networks only: --{precision} "
                f"{report.summary()}")
        else:
            flags[precision] = True
            say(f"precision: TensorRT {trt.__version__}: --{precision} sets BuilderFlag.{precision.upper()} "
                "(TensorRT chooses the precision per layer)")
    else:
        say(f"precision: as written in the ONNX (TensorRT {trt.__version__})")
    named = add_plugin_namespace(proto)
    if named:
        changed += named
        say(f"onnx: {named} dcnkit node(s) got plugin_namespace=\"{PLUGIN_NAMESPACE}\"")
    if changed or path is None:
        network = NetworkFromOnnxBytes(proto.SerializeToString())
    else:
        network = NetworkFromOnnxPath(str(path))  # keeps external weights next to the file working
    kwargs = {}
    if shapes:
        kwargs["profiles"] = [make_profile(shapes)]
        for name, (lo, opt, hi) in shapes.items():
            say(f"profile: {name} min={lo} opt={opt} max={hi}")
    if workspace_mib is not None:
        kwargs["memory_pool_limits"] = {trt.MemoryPoolType.WORKSPACE: int(workspace_mib) << 20}
    if timing_cache is not None:
        kwargs["load_timing_cache"] = str(timing_cache)
    if progress:
        monitor = _progress_monitor()
        if monitor is not None:
            kwargs["progress_monitor"] = monitor
    config = CreateConfig(**flags, **kwargs)
    data = EngineBytesFromNetwork(network, config=config,
                                  save_timing_cache=str(timing_cache) if timing_cache is not None else None)()
    return bytes(data)


def build_engine(model, output, **kwargs) -> Path:
    """Builds (see :func:`build_engine_bytes`) and writes the serialized engine to ``output``; returns its path."""
    data = build_engine_bytes(model, **kwargs)
    out = Path(os.fspath(output))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    return out


def load_engine(path, plugins: Sequence = ()):
    """A deserialized ``trt.ICudaEngine`` from a file, with the kit's plugin library (and ``plugins``) loaded."""
    load_plugins(plugins)
    from polygraphy.backend.trt import EngineFromPath

    p = Path(os.fspath(path))
    if not p.is_file():
        raise FileNotFoundError(f"model: expected an existing engine file, got {str(p)!r}")
    return EngineFromPath(str(p))()


def engine_infos(engine) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """Inputs and outputs of an engine as TensorInfo (dynamic dims -> None)."""
    import tensorrt as trt

    ins, outs = [], []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
        shape = tuple(int(d) if d >= 0 else None for d in engine.get_tensor_shape(name))
        info = TensorInfo(name, dtype, shape)
        (ins if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT else outs).append(info)
    return ins, outs


# ------------------------------------------------------------------------------------------------
# Running
# ------------------------------------------------------------------------------------------------
class TensorRTRunner(Runner):
    """A serialized engine (``.engine`` / ``.plan`` / ``.trt``) or an ONNX model, run with Polygraphy's TrtRunner.

    An ONNX model is built on first use: with ``shapes`` one engine for that profile, otherwise one engine per
    set of input shapes (min = opt = max), cached. ``precision``, ``workspace`` (bytes) and ``plugins`` go to
    the build. Outputs are NumPy arrays (copied out of the runner's host buffers).
    """

    name = "tensorrt"

    def __init__(self, model, workspace: int | None = None, precision: str | None = None,
                 shapes: Mapping | None = None, plugins: Sequence = ()):
        require_tensorrt()
        self._plugins = tuple(plugins)
        self._runners: dict = {}
        self._build = dict(precision=precision, plugins=self._plugins,
                           workspace_mib=None if workspace is None else max(1, int(workspace) >> 20))
        if is_engine_file(model):
            from polygraphy.backend.trt import TrtRunner

            engine = load_engine(model, self._plugins)
            self._inputs, self._outputs = engine_infos(engine)
            self._fixed = TrtRunner(engine, name="tensorrt")
            self._fixed.activate()
            self._proto = None
            return
        self._fixed = None
        self._proto = load_model(model)
        inits = {t.name for t in self._proto.graph.initializer}
        self._inputs = value_infos([v for v in self._proto.graph.input if v.name not in inits])
        self._outputs = value_infos(self._proto.graph.output)
        if shapes:
            check_shapes(self._proto, shapes)
            self._fixed = self._activate(dict(shapes))

    def _activate(self, shapes):
        from polygraphy.backend.trt import EngineFromBytes, TrtRunner

        data = build_engine_bytes(self._proto, shapes=shapes, **self._build)
        runner = TrtRunner(EngineFromBytes(data), name="tensorrt")
        runner.activate()
        return runner

    def inputs(self):
        return list(self._inputs)

    def outputs(self):
        return list(self._outputs)

    def _runner_for(self, feeds):
        if self._fixed is not None:
            return self._fixed
        key = tuple(sorted((k, tuple(v.shape)) for k, v in feeds.items()))
        if key not in self._runners:
            self._runners[key] = self._activate({k: (s, s, s) for k, s in key})
        return self._runners[key]

    def run(self, feeds):
        feeds = self._check_feeds(feeds)
        out = self._runner_for(feeds).infer(feeds)
        order = [o.name for o in self._outputs if o.name in out] or list(out)
        # TrtRunner returns views of host buffers that the next inference overwrites: copy them.
        return {n: np.array(out[n], copy=True) for n in order}

    def close(self):
        runners = list(getattr(self, "_runners", {}).values())
        if getattr(self, "_fixed", None) is not None:
            runners.append(self._fixed)
        for r in runners:
            if r.is_active:
                r.deactivate()
        self._runners, self._fixed = {}, None


def _runner(model, kit_kernels: bool = True, **options) -> TensorRTRunner:
    """The ``tensorrt`` backend's runner (``kit_kernels`` is ONNX Runtime's option: ignored)."""
    require_tensorrt()
    return TensorRTRunner(model, **options)


BACKENDS = (Backend("tensorrt", tensorrt_reason, _runner),)


__all__ = [
    "ENGINE_SUFFIXES",
    "PRECISIONS",
    "ShapeSpecError",
    "TensorRTRunner",
    "add_plugin_namespace",
    "build_engine",
    "build_engine_bytes",
    "check_shapes",
    "engine_infos",
    "is_engine_file",
    "load_engine",
    "load_plugins",
    "make_profile",
    "parse_shapes",
    "require_tensorrt",
    "strongly_typed_only",
]
