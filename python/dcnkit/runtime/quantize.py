"""Static INT8 quantization (QDQ) of models that carry the kit's operators, with ONNX Runtime's quantization tool.

>>> from dcnkit.runtime.quantize import quantize
>>> quantize("m.onnx", "m.int8.onnx", calibration=[{"input": x0}, {"input": x1}])

ONNX Runtime's ``quantize_static`` calibrates by running the model in sessions of its own, which know nothing of
the kit's library: a model with a ``dcnkit::DeformConv2d`` (or an mmdeploy / mmcv node) fails there with
``... is not a registered function/op``. :func:`quantize` runs the same tool with every calibration session made
by :func:`dcnkit.runtime.ort_session` (the kit's library registered, standard ``DeformConv`` on the kit's kernel
where that is the faster one), so the models the kit runs are the models it quantizes.

Before calibration the graph is normalised (:mod:`dcnkit.runtime.quantize_prep`, ``preprocess``), so that files of
one model written by different exporters quantize alike. What is quantized is ONNX Runtime's choice of operators (Conv, MatMul, Gemm, Add, ...): weights int8 (per output
channel by default), activations uint8, QDQ format. The kit's nodes (and standard ``DeformConv``) are left float by
the tool, between a DequantizeLinear and a QuantizeLinear where their neighbours are quantized; a deformable
convolution there then becomes one ``dcnkit::QDeformConv2d`` (:mod:`dcnkit.runtime.quantize_qdeform`; ``qdeform``).
"""
from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
from pathlib import Path

import numpy as np

__all__ = ["quantize", "quantize_with_summary", "calibration_feeds", "offset_branch_nodes", "QuantizationError",
           "QuantizationWarning", "CALIBRATION_METHODS"]

# CLI / API name -> onnxruntime.quantization.CalibrationMethod member
CALIBRATION_METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}


class QuantizationError(RuntimeError):
    """ONNX Runtime's quantization tool could not quantize the model, or nothing in it became int8 (the message
    says why)."""


class QuantizationWarning(UserWarning):
    """The pre-processing could not normalise the model: some nodes stay float (the message names them)."""


_patch_lock = threading.Lock()


class _NoPreprocessHint(logging.Filter):
    """Drops the tool's "Please consider (to run) pre-processing" hint: its pre-processing opens plain ONNX Runtime
    sessions, which cannot load models with the kit's nodes; the kit runs its own (``preprocess``)."""

    def filter(self, record):
        return "pre-process" not in record.getMessage()


@contextlib.contextmanager
def _calibration_sessions_with_kit_library(providers, threads):
    """While active, ONNX Runtime's calibrators open their sessions through :func:`ort_session`.

    ``CalibraterBase.create_inference_session`` is the one place where the quantization tool makes its
    calibration session (with plain ``SessionOptions``); it is swapped for the kit's session maker and put back
    afterwards. The lock keeps concurrent calls from restoring each other's method."""
    from onnxruntime.quantization import calibrate

    from dcnkit.runtime.ort import ort_session

    def create_inference_session(self):
        options = {"graph_optimization_level": "ORT_DISABLE_ALL"}  # as the tool's own calibration sessions
        if threads:
            options["intra_op_num_threads"] = threads
        self.infer_session = ort_session(self.augmented_model_path, providers=providers, **options)

    with _patch_lock:
        original = calibrate.CalibraterBase.create_inference_session
        calibrate.CalibraterBase.create_inference_session = create_inference_session
        try:
            yield
        finally:
            calibrate.CalibraterBase.create_inference_session = original


class _FeedReader:
    """``onnxruntime.quantization.CalibrationDataReader`` over a list of feed dicts."""

    def __init__(self, feeds: list[dict]):
        self._feeds = list(feeds)
        self._next = 0

    def get_next(self):
        if self._next >= len(self._feeds):
            return None
        self._next += 1
        return self._feeds[self._next - 1]

    def __len__(self):
        return len(self._feeds)

    def set_range(self, start_index: int, end_index: int):  # CalibStridedMinMax
        self._feeds = self._feeds[start_index:end_index]
        self._next = 0


def _static_batch(model_path: str, name: str):
    import onnx

    m = onnx.load(model_path, load_external_data=False)
    for i in m.graph.input:
        if i.name == name:
            dims = i.type.tensor_type.shape.dim
            if dims and dims[0].HasField("dim_value"):
                return dims[0].dim_value
            return None
    return None


# Deformable convolution nodes in every domain the kit runs -> the positions of their offset and mask inputs.
_DEFORMABLE = {("dcnkit", "DeformConv2d"): (1, 4), ("", "DeformConv"): (2, 4), ("ai.onnx", "DeformConv"): (2, 4),
               ("mmdeploy", "MMCVModulatedDeformConv2d"): (1, 2), ("mmcv", "MMCVModulatedDeformConv2d"): (1, 2),
               ("mmdeploy", "MMCVDeformConv2d"): (1,), ("mmcv", "MMCVDeformConv2d"): (1,)}
# Shape-only / elementwise nodes walked through from an offset or mask input back to the convolution making it.
_PASS_THROUGH = {"Split", "Slice", "Sigmoid", "Concat", "Reshape", "Transpose", "Identity", "Mul", "Cast",
                 "Unsqueeze", "Squeeze", "Gather"}


def offset_branch_nodes(proto) -> set[str]:
    """Names of the nodes that compute the offsets and masks of the model's deformable convolutions: from each
    offset / mask input back through shape-only and elementwise nodes to (and including) the convolution or
    matrix product that predicts them. Quantizing them would round every sampling position to the offset
    tensor's uint8 grid; :func:`quantize` leaves them in float unless asked otherwise."""
    producer = {o: n for n in proto.graph.node for o in n.output}
    found, stack = set(), []
    for n in proto.graph.node:
        positions = _DEFORMABLE.get((n.domain, n.op_type), ())
        stack += [n.input[i] for i in positions if i < len(n.input) and n.input[i]]
    while stack:
        node = producer.get(stack.pop())
        if node is None or node.name in found:
            continue
        found.add(node.name)
        if node.op_type in _PASS_THROUGH:
            stack += [t for t in node.input if t]
    return found


def calibration_feeds(model: str, arrays: dict, arg: str = "calibration") -> list[dict]:
    """Feed dicts for calibration from one dict of arrays (an .npz as ``dcnkit run --inputs`` takes it).

    Every model input must be there. Where the model's first dimension is a fixed batch B and the arrays hold a
    multiple of B samples along it, they are cut into feeds of B samples (so an .npz of 64 images calibrates a
    batch-1 model with 64 feeds); otherwise the arrays are one feed."""
    import onnx

    m = onnx.load(model, load_external_data=False)
    init = {t.name for t in m.graph.initializer}
    names = [i.name for i in m.graph.input if i.name not in init]
    missing = [n for n in names if n not in arrays]
    if missing:
        raise ValueError(f"{arg}: expected arrays for the model inputs {names}, got {sorted(arrays)} "
                         f"(missing {missing})")
    counts = set()
    for n in names:
        b = _static_batch(model, n)
        a = np.asarray(arrays[n])
        if b and a.ndim >= 1 and a.shape[0] > b and a.shape[0] % b == 0:
            counts.add(a.shape[0] // b)
        else:
            counts.add(1)
    if len(counts) != 1 or counts == {1}:
        return [{n: np.asarray(arrays[n]) for n in names}]
    k = counts.pop()
    out = []
    for j in range(k):
        feed = {}
        for n in names:
            b = _static_batch(model, n)
            feed[n] = np.ascontiguousarray(np.asarray(arrays[n])[j * b:(j + 1) * b])
        out.append(feed)
    return out


def quantize(model, output, calibration, *, method: str = "minmax", per_channel: bool = True,
             exclude_op_types=(), exclude_nodes=(), providers=None, threads: int | None = None,
             reduce_range: bool = True, symmetric_activations: bool = False,
             quantize_offsets: bool = False, qdeform: bool | None = None, preprocess: bool = True) -> Path:
    """Quantize ``model`` (an ONNX path) statically to INT8 QDQ, write ``output`` and return its path.

    ``calibration``: feed dicts (input name -> array), or one dict whose arrays :func:`calibration_feeds` cuts
    into feeds. ``method``: ``minmax`` (default), ``entropy`` or ``percentile``. ``per_channel``: int8 weights
    per output channel (default) or per tensor. ``exclude_op_types`` / ``exclude_nodes``: operator types and node
    names left in float. ``reduce_range`` (default True): 7-bit weights, as ONNX Runtime advises for CPUs without
    VNNI, whose uint8 x int8 products saturate in 16 bits otherwise (on this project's AVX2 machine the demo model
    loses 1.1 points of accuracy with 8-bit weights and none with 7-bit ones); False where the deployment CPU
    has AVX-512 VNNI, AVX-VNNI or AMX. ``quantize_offsets`` (default False): also quantize the nodes that predict the deformable
    convolutions' offsets and masks (:func:`offset_branch_nodes`), which otherwise stay float. ``qdeform``: write
    each deformable convolution left between DequantizeLinear and QuantizeLinear as one ``dcnkit::QDeformConv2d``
    (True), leave it float (False), or (None, the default) do so where the kit's library here runs that op (it
    needs oneDNN). ``preprocess`` (default True): normalise the graph before calibration
    (:mod:`dcnkit.runtime.quantize_prep`: shape inference with the kit's rules, constant folding, BatchNorm folding,
    computed weights and biases as initializers), so that files of one model from any exporter quantize alike; a
    file it cannot normalise gets one :class:`QuantizationWarning` naming the nodes that stay float and why.
    ``providers``: of the calibration sessions (default: the CPU EP).
    Raises ValueError for bad arguments (naming the argument) and :class:`QuantizationError` when ONNX Runtime's
    tool cannot quantize the model or when no Conv / MatMul / deformable convolution became int8
    (:func:`quantize_with_summary` gives what did).
    """
    return quantize_with_summary(
        model, output, calibration, method=method, per_channel=per_channel, exclude_op_types=exclude_op_types,
        exclude_nodes=exclude_nodes, providers=providers, threads=threads, reduce_range=reduce_range,
        symmetric_activations=symmetric_activations, quantize_offsets=quantize_offsets, qdeform=qdeform,
        preprocess=preprocess)[0]


def _check_arguments(src: Path, dst: Path, method: str, threads, calibration) -> list:
    if not src.is_file():
        raise ValueError(f"model: expected an existing ONNX file, got {str(src)!r}")
    if dst.is_dir():
        raise ValueError(f"output: expected a file path, got the directory {str(dst)!r}")
    if method not in CALIBRATION_METHODS:
        raise ValueError(f"method: expected one of {sorted(CALIBRATION_METHODS)}, got {method!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads: expected an integer >= 1, got {threads!r}")
    if isinstance(calibration, dict):
        feeds = calibration_feeds(str(src), calibration)
    else:
        feeds = list(calibration)
    if not feeds:
        raise ValueError("calibration: expected at least one feed, got none")
    for i, f in enumerate(feeds):
        if not isinstance(f, dict):
            raise ValueError(f"calibration: expected dicts of input arrays, got {type(f).__name__} at {i}")
    if method != "minmax":
        shapes = {tuple((k, np.shape(v)) for k, v in sorted(f.items())) for f in feeds}
        if len(shapes) > 1:
            raise ValueError(f"calibration: the {method} method needs feeds of one shape (its histograms stack "
                             f"them), got {len(shapes)} different shapes; use equal batches or method 'minmax'")
    return feeds


def _warn_not_normalised(src: Path, report, summary) -> None:
    """One warning where the pre-processing could not normalise the file: the steps that could not run, and the
    nodes that stay float (not constant, or an unsupported pattern when a step failed) and why."""
    import warnings

    stay = list(summary.float.get("not constant", []))
    if report.problems:
        stay += summary.float.get("unsupported pattern", [])
    if not report.problems and not stay:
        return
    names = "; ".join(f"{n}: {why}" for n, why in stay) or "none"
    warnings.warn(f"dcnkit quantize: {str(src)!r} could not be fully normalised before calibration "
                  f"({'; '.join(report.problems) or 'every step ran'}); nodes that stay float: {names}",
                  QuantizationWarning, stacklevel=3)


def _warn_fused_exclusions(original, proto, exclude_nodes) -> None:
    """A warning for the excluded nodes the pre-processing fused into the convolution or matrix product before them
    (a BatchNormalization, a Mul or Add into a Conv): that node is quantized now. Excluded nodes folded into
    constants are gone with nothing to quantize."""
    from dcnkit.runtime.quantize_prep import weight_inputs

    names = {n.name for n in proto.graph.node}
    producer = {o: n for n in original.graph.node for o in n.output}
    by_name = {n.name: n for n in original.graph.node}
    fused = []
    for name in exclude_nodes:
        node = by_name[name]
        if name in names or node.op_type not in ("BatchNormalization", "Mul", "Add") or not node.input:
            continue
        before = producer.get(node.input[0])
        if before is not None and (weight_inputs(before) or before.op_type == "MatMul") and before.name in names:
            fused.append(f"{name} (into {before.name})")
    if fused:
        import warnings

        warnings.warn(f"exclude_nodes: the pre-processing fused {', '.join(fused)}: exclude the node it went "
                      "into, or use preprocess=False (--no-preprocess)", QuantizationWarning, stacklevel=3)


def quantize_with_summary(model, output, calibration, *, method: str = "minmax", per_channel: bool = True,
                          exclude_op_types=(), exclude_nodes=(), providers=None, threads: int | None = None,
                          reduce_range: bool = True, symmetric_activations: bool = False,
                          quantize_offsets: bool = False, qdeform: bool | None = None, preprocess: bool = True):
    """:func:`quantize`, returning ``(path, summary)``: the summary
    (:class:`dcnkit.runtime.quantize_report.QuantizeSummary`) counts the Conv / MatMul / deformable convolution
    nodes that became int8 and says which stayed float and why (``summary.line()``)."""
    import onnx
    from onnxruntime import quantization as q

    from dcnkit.runtime.quantize_report import summarize

    src, dst = Path(os.fspath(model)), Path(os.fspath(output))
    feeds = _check_arguments(src, dst, method, threads, calibration)
    proto = onnx.load(str(src))
    for i, n in enumerate(proto.graph.node):  # the tool excludes nodes by name
        if not n.name:
            n.name = f"{n.op_type}_{i}"
    node_names = {n.name for n in proto.graph.node}
    unknown = [n for n in exclude_nodes if n not in node_names]
    if unknown:
        raise ValueError(f"exclude_nodes: expected node names of the model, got unknown {unknown}")

    import dcnkit.export.schemas  # noqa: F401  (the kit's ONNX schemas: shape inference through its nodes)

    report = None
    if preprocess:
        from dcnkit.runtime.quantize_prep import preprocess as normalise

        original = proto
        proto, report = normalise(proto)
        _warn_fused_exclusions(original, proto, exclude_nodes)
    excluded_user = set(exclude_nodes) | {n.name for n in proto.graph.node if n.op_type in set(exclude_op_types)}
    offsets = set() if quantize_offsets else offset_branch_nodes(proto) - excluded_user
    excluded = excluded_user | offsets

    providers = list(providers) if providers else ["CPUExecutionProvider"]
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dcnkit-quant-") as tmp:
        named = Path(tmp) / "model.onnx"
        onnx.save(proto, str(named))
        hint = _NoPreprocessHint()
        logging.getLogger().addFilter(hint)
        try:
            with _calibration_sessions_with_kit_library(providers, threads):
                q.quantize_static(
                    str(named), str(dst), _FeedReader(feeds),
                    quant_format=q.QuantFormat.QDQ,
                    activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8,
                    per_channel=per_channel, reduce_range=reduce_range,
                    calibrate_method=getattr(q.CalibrationMethod, CALIBRATION_METHODS[method]),
                    nodes_to_exclude=sorted(excluded), calibration_providers=providers,
                    extra_options={"ActivationSymmetric": bool(symmetric_activations),
                                   # a BatchNormalization's scale is a vector: its channels are axis 0
                                   "QDQOpTypePerChannelSupportToAxis": {"BatchNormalization": 0}},
                )
        except Exception as e:  # noqa: BLE001 - any failure of the tool: one message naming the model
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise QuantizationError(
                f"ONNX Runtime cannot quantize {str(src)!r}: {type(e).__name__}: {first}") from e
        finally:
            logging.getLogger().removeFilter(hint)
    from dcnkit.runtime.quantize_qdeform import fuse_qdeform_conv, qdeform_available

    kernel = qdeform_available() if qdeform is not False else True
    qdeform_on = kernel if qdeform is None else bool(qdeform)
    out = onnx.load(str(dst))
    if qdeform_on and fuse_qdeform_conv(out, reduce_range=reduce_range):
        onnx.save(out, str(dst))
    summary = summarize(proto, out, excluded_user=excluded_user, offset_nodes=offsets,
                        qdeform_on=qdeform is not False, qdeform_kernel=kernel,
                        not_constant=report.not_constant if report else None)
    if report is not None:
        _warn_not_normalised(src, report, summary)
    if not summary.int8_total:
        dst.unlink(missing_ok=True)
        what = (f"float: {summary.float_text()}" if summary.total
                else "it has no Conv, MatMul, Gemm or deformable convolution")
        raise QuantizationError(f"nothing in {str(src)!r} was quantized to int8 ({what})")
    return dst, summary
