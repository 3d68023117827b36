"""The OpenVINO backend, ``openvino``: :class:`OpenVINORunner`, OpenVINO with the kit's extension library
(``libdcnkit_ov.so``) added, and what it needs on this machine (docs/openvino.md).

OpenVINO's ONNX frontend reads no deformable node by itself. The extension converts them: standard ``DeformConv`` to
OpenVINO's own DeformableConvolution-8 with ``bilinear_interpolation_pad`` on (the ONNX / torchvision semantics), and
every ``dcnkit``, mmdeploy and mmcv node to an operation computed by the kit's CPU kernels. Before OpenVINO reads the
model, a standard ``DeformConv`` whose layer the kit's kernel runs faster (per node, measured) and every standard avg
``RoiAlign`` (OpenVINO's differs at the border) are rewritten to the kit's nodes in memory
(:mod:`dcnkit.runtime.openvino_rewrite`; the file is not touched).

Options (``make_runner(path, backend="openvino", ...)``):

``device``               ``"CPU"`` (default); ``"GPU"``, ``"NPU"``, ``"AUTO"``, ... are passed to OpenVINO as they are.
                         Only the CPU is tested: the kit's operations have CPU kernels only, so a model with them
                         compiles for another device only where OpenVINO falls back to the CPU for them (``AUTO``,
                         ``HETERO:GPU,CPU``).
``inference_precision``  ``"f32"`` (default: exact on every CPU, also where OpenVINO would pick bf16 on its own),
                         ``"bf16"`` or ``"f16"``: OpenVINO's ``INFERENCE_PRECISION_HINT`` for its own layers. The
                         kit's operations compute in float32, but for the DCN GEMM with bf16 (next option).
``dcn_gemm_precision``   the precision of the GEMM of the kit's ``DeformConv2d`` nodes (and of the standard
                         ``DeformConv`` nodes rewritten to them): ``None`` (default) follows the model's, ``"bf16"``
                         where ``inference_precision="bf16"`` on a CPU that OpenVINO lists with BF16, else ``"f32"``;
                         ``"f32"`` or ``"bf16"`` as asked. bf16: the constant weight packed once as bfloat16 for
                         oneDNN's bf16 matmul, the sampled columns rounded to bfloat16, float32 accumulation and
                         output (docs/openvino.md, "Reduced precision").
``num_threads``          ``INFERENCE_NUM_THREADS`` (default: OpenVINO's choice, every core).
``deform_conv``          ``"auto"`` (default) and ``"kit"``: every standard DeformConv the kit can represent on the
                         kit's kernel (measured the faster one); ``"openvino"``: every one on OpenVINO's op.
                         ``kit_kernels=False`` is ``"openvino"``.
``config``               more OpenVINO properties for ``compile_model`` (a dict).

``model`` is an ONNX file (path, bytes or ``onnx.ModelProto``), or OpenVINO IR: a ``.xml`` file or a folder written
by ``dcnkit convert --to openvino`` (:func:`dcnkit.runtime.openvino_convert.convert_to_openvino`).

Two workarounds of OpenVINO 2026.4's CPU plugin (docs/openvino.md, "Errors and int64 tables"):

- :meth:`OpenVINORunner.run` infers with ``start_async()`` + ``wait()``: with one inference thread
  (``num_threads=1``, or a 1-CPU machine) the synchronous ``infer()`` drops an exception raised inside an extension
  operation and returns the output buffers as they are.
- The plugin computes int64 tensors in int32 (wrapping a graph input, saturating a constant). An int64 input whose
  values do not fit int32 and that only the kit's operations read runs as a constant kept in int64 (a model compiled
  for those values); one that OpenVINO's own operations read too is refused, naming it.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from dcnkit.runtime.base import Backend, BackendUnavailable, Runner, TensorInfo, load_model, value_infos

DEFAULT_DEVICE = "CPU"
PRECISIONS = ("f32", "bf16", "f16")
DEFORM_CONV_CHOICES = ("auto", "openvino", "kit")
GEMM_PRECISIONS = ("f32", "bf16")
# The rt_info entry by which the extension's DeformConv2d node learns its GEMM's precision (plugins/openvino/ov_op.h).
GEMM_PRECISION_KEY = "dcnkit_gemm_precision"
EXTENSION_LIBRARY = "libdcnkit_ov.so"


def extension_library() -> Path:
    """The installed ``libdcnkit_ov.so`` (FileNotFoundError, with the places searched, where this build has none)."""
    from dcnkit._lib import find_library

    return find_library("dcnkit_ov")


def openvino_reason() -> str | None:
    """None when OpenVINO and the kit's extension library are here, else what is missing."""
    try:
        import openvino  # noqa: F401
    except ImportError as e:
        return f"openvino is not installed ({e}; pip install dcnkit[openvino])"
    try:
        extension_library()
    except FileNotFoundError as e:
        return f"the kit's OpenVINO extension library is missing: {e}"
    return None


def ir_path(model) -> Path | None:
    """The IR ``.xml`` that ``model`` names (a ``.xml`` file, or a folder holding ``model.xml``), else None."""
    if isinstance(model, (str, os.PathLike)):
        p = Path(os.fspath(model))
        if p.is_dir() and (p / "model.xml").is_file():
            return p / "model.xml"
        if p.suffix == ".xml":
            if not p.is_file():
                raise FileNotFoundError(f"model: expected an existing OpenVINO IR file, got {str(p)!r}")
            return p
    return None


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name}: expected one of {', '.join(map(repr, choices))}, got {value!r}")


def compile_config(device: str, inference_precision: str, num_threads, config) -> dict:
    """The properties ``compile_model`` gets: on the CPU the precision hint (f32 unless asked) and the latency hint."""
    _check_choice("inference_precision", inference_precision, PRECISIONS)
    if num_threads is not None and (not isinstance(num_threads, int) or isinstance(num_threads, bool)
                                    or num_threads < 1):
        raise ValueError(f"num_threads: expected an int >= 1 or None, got {num_threads!r}")
    if config is not None and not isinstance(config, dict):
        raise ValueError(f"config: expected a dict of OpenVINO properties, got {type(config).__name__}")
    out = {}
    if device.upper().startswith("CPU"):
        out["INFERENCE_PRECISION_HINT"] = inference_precision
        out["PERFORMANCE_HINT"] = "LATENCY"
        if num_threads is not None:
            out["INFERENCE_NUM_THREADS"] = num_threads
    elif inference_precision != "f32":
        out["INFERENCE_PRECISION_HINT"] = inference_precision
    out.update(config or {})
    return out


def cpu_has_bf16(core) -> bool:
    """Whether OpenVINO lists BF16 among the CPU's optimization capabilities (AVX-512 BF16 or AMX)."""
    try:
        return "BF16" in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    except Exception:  # noqa: BLE001 - no CPU plugin
        return False


def resolve_gemm_precision(core, device: str, inference_precision: str, asked: str | None) -> str:
    """The precision of the kit's DCN GEMM: ``asked``, or bf16 where a CPU with BF16 compiles the model in bf16."""
    if asked is not None:
        return asked
    cpu = device.upper().startswith("CPU")
    return "bf16" if inference_precision == "bf16" and cpu and cpu_has_bf16(core) else "f32"


def tell_gemm_precision(model, precision: str) -> int:
    """Sets the rt_info entry ``GEMM_PRECISION_KEY`` of every kit ``DeformConv2d`` node of ``model`` (an
    ``ov.Model``, before ``compile_model``) to ``precision``; returns how many nodes were told."""
    told = 0
    for op in model.get_ops():
        if is_kit_operation(op) and op.get_type_name() == "DeformConv2d":
            op.get_rt_info()[GEMM_PRECISION_KEY] = precision
            told += 1
    return told


def _np_dtype(ov_type) -> np.dtype:
    try:
        return np.dtype(ov_type.to_dtype())
    except Exception:  # noqa: BLE001 - a type NumPy has no name for
        return np.dtype("float32")


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def fits_int32(a: np.ndarray) -> bool:
    """Whether OpenVINO's CPU plugin passes ``a`` on unchanged: not an int64 / uint64 array with a value outside
    int32."""
    if a.dtype not in (np.int64, np.uint64) or a.size == 0:
        return True
    return bool(a.min() >= INT32_MIN and a.max() <= INT32_MAX)


def is_kit_operation(node) -> bool:
    """Whether ``node`` (an OpenVINO node) is one of the kit's operations (opset ``dcnkit``)."""
    return node.get_type_info().version_id == "dcnkit"


def _port_infos(ports, names=None) -> list[TensorInfo]:
    out = []
    for i, p in enumerate(ports):
        dims = tuple(d.get_length() if d.is_static else None for d in p.get_partial_shape())
        out.append(TensorInfo(names[i] if names else p.get_any_name(), _np_dtype(p.get_element_type()), dims))
    return out


class OpenVINORunner(Runner):
    """OpenVINO with the kit's extension library (see the module's docstring for the options)."""

    name = "openvino"

    def __init__(self, model, device: str = DEFAULT_DEVICE, kit_kernels: bool = True, inference_precision: str = "f32",
                 num_threads: int | None = None, deform_conv: str | None = None, config: dict | None = None,
                 dcn_gemm_precision: str | None = None):
        reason = openvino_reason()
        if reason:
            raise BackendUnavailable(f"openvino: {reason}")
        if not isinstance(device, str) or not device:
            raise ValueError(f"device: expected an OpenVINO device name such as 'CPU', got {device!r}")
        deform_conv = deform_conv if deform_conv is not None else ("auto" if kit_kernels else "openvino")
        _check_choice("deform_conv", deform_conv, DEFORM_CONV_CHOICES)
        if dcn_gemm_precision is not None:
            _check_choice("dcn_gemm_precision", dcn_gemm_precision, GEMM_PRECISIONS)
        properties = compile_config(device, inference_precision, num_threads, config)
        import openvino as ov

        self.core = ov.Core()
        xml = ir_path(model)
        extension = xml.parent / EXTENSION_LIBRARY if xml is not None else None
        self.extension = extension if extension is not None and extension.is_file() else extension_library()
        try:
            self.core.add_extension(str(self.extension))
        except Exception as e:  # noqa: BLE001 - OpenVINO raises RuntimeError with the loader's message
            raise BackendUnavailable(
                f"openvino: the kit's extension library {self.extension} does not load into openvino "
                f"{ov.get_version()} (it loads only into the release it was built against; rebuild dcnkit): "
                f"{str(e).strip().splitlines()[-1] if str(e).strip() else e}") from e
        self.rewritten = 0
        if xml is not None:
            ov_model = self.core.read_model(str(xml))
            self._infos = None
        else:
            ov_model, self._infos, self.rewritten = read_onnx(self.core, model, deform_conv)
        self.gemm_precision = resolve_gemm_precision(self.core, device, inference_precision, dcn_gemm_precision)
        if self.gemm_precision != "f32" or dcn_gemm_precision is not None:
            tell_gemm_precision(ov_model, self.gemm_precision)
        self.device, self.properties, self._model = device, properties, ov_model
        self.compiled = self.core.compile_model(ov_model, device, properties)
        self.request = self.compiled.create_infer_request()
        # A port may carry several tensor names: the model's own output names where it has them.
        wanted = [i.name for i in self._infos[1]] if self._infos is not None else []
        self._outputs = [next((n for n in wanted if n in p.get_names()), p.get_any_name())
                         for p in self.compiled.outputs]

    def inputs(self):
        if self._infos is not None:
            return self._infos[0]
        return _port_infos(self.compiled.inputs)

    def outputs(self):
        return _port_infos(self.compiled.outputs, self._outputs)

    def run(self, feeds):
        feeds = self._check_feeds(feeds)
        wide = {n: a for n, a in feeds.items() if not fits_int32(a)}
        request = self._pinned_request(wide) if wide else self.request
        # An input the compiled model no longer has (OpenVINO folded away what it fed) cannot change the result.
        names = {n for port in request.model_inputs for n in port.get_names()}
        request.start_async({n: a for n, a in feeds.items() if n not in wide and n in names})
        request.wait()
        return {name: np.array(request.get_output_tensor(i).data) for i, name in enumerate(self._outputs)}

    def _pinned_request(self, wide: dict):
        """An infer request of the model compiled with the int64 inputs ``wide`` as int64 constants of those values
        (module docstring); ValueError naming an input that one of OpenVINO's own operations reads."""
        import openvino as ov

        model = self._model.clone()
        by_name = {p.get_output_tensor(0).get_any_name(): p for p in model.get_parameters()}
        for name, value in wide.items():
            param = by_name[name]
            readers = [i.get_node() for i in param.output(0).get_target_inputs()]
            if not all(is_kit_operation(r) for r in readers):
                flat = value.ravel()
                at = int(np.flatnonzero((flat < INT32_MIN) | (flat > INT32_MAX))[0])
                raise ValueError(
                    f"feeds[{name!r}]: expected int64 values in [-2^31, 2^31) on OpenVINO (its CPU plugin computes "
                    f"int64 in int32, and an operation of OpenVINO's own reads this input), got {int(flat[at])} at "
                    f"index {np.unravel_index(at, value.shape)}")
            constant = ov.opset13.constant(value)  # kept int64 by the kit's operations (ov_op.cpp)
            for reader in param.output(0).get_target_inputs():
                reader.replace_source_output(constant.output(0))
            model.remove_parameter(param)
        model.validate_nodes_and_infer_types()
        return self.core.compile_model(model, self.device, self.properties).create_infer_request()

    def close(self):
        self.request = self.compiled = self._model = None


def read_onnx(core, model, deform_conv: str = "auto"):
    """(``ov.Model``, (input infos, output infos) of the ONNX graph, DeformConv nodes rewritten) for an ONNX model
    (path, bytes or ModelProto), with the per-node DeformConv choice applied in memory."""
    from dcnkit.runtime.openvino_rewrite import prepare_onnx

    proto = load_model(model)
    prepared, rewritten = prepare_onnx(proto, deform_conv)
    infos = (value_infos(_graph_inputs(proto)), value_infos(proto.graph.output))
    if prepared is proto and isinstance(model, (str, os.PathLike)):
        return core.read_model(os.fspath(model)), infos, 0
    # OpenVINO's ONNX frontend reads files: the prepared model goes through a temporary one, next to the original
    # where there is one (its external data files are found relative to it).
    folder = Path(os.fspath(model)).parent if isinstance(model, (str, os.PathLike)) else None
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=folder if folder and os.access(folder, os.W_OK) else None)
    os.close(fd)
    try:
        with open(tmp, "wb") as f:
            f.write(prepared.SerializeToString())
        return core.read_model(tmp), infos, rewritten
    finally:
        os.remove(tmp)


def _graph_inputs(proto):
    inits = {t.name for t in proto.graph.initializer}
    return [i for i in proto.graph.input if i.name not in inits]


def _runner(model, kit_kernels: bool = True, **options) -> OpenVINORunner:
    return OpenVINORunner(model, kit_kernels=kit_kernels, **options)


BACKENDS = (Backend("openvino", openvino_reason, _runner),)

__all__ = ["BACKENDS", "DEFAULT_DEVICE", "GEMM_PRECISION_KEY", "OpenVINORunner", "compile_config", "cpu_has_bf16",
           "extension_library", "fits_int32", "resolve_gemm_precision", "tell_gemm_precision",
           "ir_path", "is_kit_operation", "openvino_reason", "read_onnx"]
