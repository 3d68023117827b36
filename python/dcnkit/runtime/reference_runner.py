"""A slow, independent runner for whole ONNX models: ``onnx.reference`` + the kit's NumPy references.

Every standard node runs in ONNX's own reference evaluator (``onnx.reference.ReferenceEvaluator``). The
deformable / RoI nodes run in :mod:`dcnkit.reference`, the slow NumPy loops written straight from docs/operators.md that
the test-suite also uses:

- every name of every operator of the op table (the kit's domain, mmdeploy's and mmcv's names, InternImage's
  ``mmdeploy::TRTDCNv3``) through the op's reference with its canonical inputs and attributes
  (:func:`dcnkit.runtime.reference_ops.declared_ops`; DeformConv2d and DeformPSRoIPool through the adapters of
  ``NODE_FUNCTIONS``), and the classes below: ``QDeformConv2d`` (dequantize -> DeformConv2d -> quantize);
  TensorRT's ``MultiscaleDeformableAttnPlugin_TRT`` in the domains ``nvidia``, ``trt`` and ``TRT`` (output split
  per head);
- standard domain: ``DeformConv`` (opset 19) and avg ``RoiAlign`` (opset 10/16) are replaced too, so a model
  exported with ``standard_ops=True`` is checked against the same contract as one with custom nodes; a ``max``
  RoiAlign is ONNX's own function (not the kit's max), computed by onnx.reference.

A node of the op table is first read and checked as every backend's kernel reads and checks it (its attributes,
loose spellings included, and its inputs' shapes: the core's ``dcnkit_op_infer``), so a bad attribute (a sampling
ratio of 2^30, a kernel of 2^31 - 1) is the same error here as there; the references then bound their own work
(docs/operators.md, "Bounded work"), so no input makes the runner run for more than seconds.

No ONNX Runtime and no native kernel computes anything here (the native library lends the op table and reads the
attributes), which is what makes it a useful partner in a comparison.

>>> from dcnkit.runtime.reference_runner import ReferenceRunner
>>> with ReferenceRunner("model.onnx") as r:
...     outputs = r.run({"input": x})

:class:`PolygraphyReferenceRunner` is the same as a ``polygraphy.backend.base.BaseRunner`` (for
``polygraphy.comparator.Comparator.run``); ``polygraphy run --dcnkit-reference`` uses it.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from dcnkit.runtime.base import Backend, Runner, TensorInfo, load_model, value_infos
from dcnkit.runtime.reference_ops import _attr, _ref, check_node, declared_ops

DCNKIT_DOMAIN = "dcnkit"


def _pair(v, name: str, op: str) -> tuple[int, int]:
    if isinstance(v, (int, np.integer)):
        return int(v), int(v)
    v = [int(a) for a in v]
    if len(v) == 1:
        return v[0], v[0]
    if len(v) != 2:
        raise ValueError(f"{op}: {name}: expected 2 values, got {v}")
    return v[0], v[1]


def _f32(*arrays):
    return [None if a is None else np.asarray(a) for a in arrays]


def _check_groups(op: str, x, weight, offset, groups: int, deformable_groups: int):
    cin = x.shape[1]
    kh, kw = weight.shape[2], weight.shape[3]
    if weight.shape[1] * groups != cin:
        raise ValueError(f"{op}: weight: expected Cin/groups = {cin}/{groups} channels, got shape {weight.shape}")
    if offset.shape[1] != 2 * deformable_groups * kh * kw:
        raise ValueError(
            f"{op}: offset: expected {2 * deformable_groups * kh * kw} channels "
            f"(2*deformable_groups*kh*kw), got shape {offset.shape}"
        )


def _deform_conv(x, offset, weight, bias, mask, stride, padding, dilation):
    out = _ref().deform_conv2d(
        x, offset, weight, bias, stride=stride, padding=padding, dilation=dilation, mask=mask
    )
    return np.asarray(out).astype(x.dtype, copy=False)


# ------------------------------------------------------------------------------------------------
# Ops of the table whose NumPy reference does not take the table's inputs and attributes as they are: every name of
# them runs through reference_ops.declared_ops with these functions (canonical inputs and attributes)
# ------------------------------------------------------------------------------------------------
def _deform_conv2d_node(input, offset, weight, bias=None, mask=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                        groups=1, deformable_groups=1):
    """DeformConv2d: the reference infers the groups from the shapes, checked against the attributes first."""
    x, offset, weight, bias, mask = _f32(input, offset, weight, bias, mask)
    _check_groups("DeformConv2d", x, weight, offset, groups, deformable_groups)
    return _deform_conv(x, offset, weight, bias, mask, tuple(stride), tuple(padding), tuple(dilation))


def _deform_psroi_pool_node(input, rois, trans=None, spatial_scale=1.0, output_size=7, output_dim=1, group_size=1,
                            part_size=0, sample_per_part=4, trans_std=0.0, no_trans=0):
    """DeformPSRoIPool: (output, count); the reference takes no_trans as an absent trans and part_size <= 0 as None."""
    return _ref().deform_psroi_pool(input, rois, None if no_trans else trans, spatial_scale, output_size, output_dim,
                                    group_size=group_size, part_size=part_size if part_size > 0 else None,
                                    sample_per_part=sample_per_part, trans_std=trans_std)


NODE_FUNCTIONS = {"deform_conv2d": _deform_conv2d_node, "deform_psroi_pool": _deform_psroi_pool_node}


class QDeformConv2d(OpRun):
    """The quantized DeformConv2d (docs/operators.md): X and the int8 weight dequantized (float64), the float
    DeformConv2d reference, the result quantized to y_scale / y_zero_point (round half to even, saturated)."""

    op_domain = DCNKIT_DOMAIN

    def _run(self, x, x_scale, x_zero_point, w, w_scale, w_zero_point, offset, mask=None, bias=None,
             y_scale=None, y_zero_point=None, **_):
        name = "QDeformConv2d"
        if y_scale is None or y_zero_point is None:
            raise ValueError(f"{name}: y_scale, y_zero_point: expected tensors, got none")
        cout = w.shape[0]
        for arg, v in (("x_scale", x_scale), ("w_scale", w_scale), ("y_scale", y_scale)):
            if not (np.all(np.asarray(v) > 0) and np.all(np.isfinite(v))):
                raise ValueError(f"{name}: {arg}: expected positive finite scales, got {np.asarray(v).ravel()[:4]}")
        ws = np.broadcast_to(np.asarray(w_scale, np.float64).reshape(-1), (cout,))
        xf = (x.astype(np.float64) - np.float64(x_zero_point)) * np.float64(x_scale)
        wz = np.asarray(w_zero_point, np.float64).reshape(-1, 1, 1, 1)
        wf = (w.astype(np.float64) - wz) * ws.reshape(-1, 1, 1, 1)
        if bias is not None:
            bias = bias.astype(np.float64) * (np.float64(x_scale) * ws if bias.dtype == np.int32 else 1.0)
        stride = _pair(_attr(self, "stride", [1, 1]), "stride", name)
        padding = _pair(_attr(self, "padding", [0, 0]), "padding", name)
        dilation = _pair(_attr(self, "dilation", [1, 1]), "dilation", name)
        _check_groups(name, xf, wf, offset, int(_attr(self, "groups", 1)), int(_attr(self, "deformable_groups", 1)))
        mask = None if mask is None else mask.astype(np.float64)
        y = _deform_conv(xf, offset.astype(np.float64), wf, bias, mask, stride, padding, dilation)
        info = np.iinfo(x.dtype)
        q = np.rint(y / np.float64(y_scale)) + np.float64(y_zero_point)
        return (np.clip(q, info.min, info.max).astype(x.dtype),)


def _trt_msda(domain: str) -> type:
    """TensorRT's MultiscaleDeformableAttnPlugin_TRT as the torch symbolics that write it name its domain: the
    same computation, output split per head (N, Lq, M, D)."""

    def _run(self, value, spatial_shapes, level_start_index, sampling_locations, attention_weights, **_):
        check_node(self, (value, spatial_shapes, level_start_index, sampling_locations, attention_weights))
        out = _ref().multi_scale_deformable_attn(value, spatial_shapes, level_start_index, sampling_locations,
                                                 attention_weights)
        n, lq = sampling_locations.shape[:2]
        return (np.asarray(out).astype(value.dtype, copy=False).reshape(n, lq, value.shape[2], value.shape[3]),)

    return type("MultiscaleDeformableAttnPlugin_TRT", (OpRun,), {"op_domain": domain, "_run": _run})


TRT_MSDA_OPS = tuple(_trt_msda(d) for d in ("nvidia", "trt", "TRT"))

# ------------------------------------------------------------------------------------------------
# Standard domain replacements (same contract, other attribute spellings)
# ------------------------------------------------------------------------------------------------
class DeformConv(OpRun):
    """ONNX ``DeformConv`` (opset 19): inputs X, W, offset, B, mask; pads [top, left, bottom, right]."""

    op_domain = ""

    def _run(self, X, W, offset, B=None, mask=None, **_):
        name = "DeformConv"
        X, W, offset, B, mask = _f32(X, W, offset, B, mask)
        if X.ndim != 4:
            raise ValueError(f"{name}: X: expected a 4-D (N, C, H, W) tensor, got shape {X.shape}")
        strides = _pair(_attr(self, "strides", [1, 1]), "strides", name)
        dilations = _pair(_attr(self, "dilations", [1, 1]), "dilations", name)
        pads = [int(p) for p in _attr(self, "pads", [0, 0, 0, 0])]
        if len(pads) != 4:
            raise ValueError(f"{name}: pads: expected 4 values, got {pads}")
        ks = _attr(self, "kernel_shape", None)
        if ks is not None and tuple(int(k) for k in ks) != tuple(W.shape[2:]):
            raise ValueError(f"{name}: kernel_shape: expected {tuple(W.shape[2:])} (from W), got {ks}")
        _check_groups(name, X, W, offset, int(_attr(self, "group", 1)), int(_attr(self, "offset_group", 1)))
        top, left, bottom, right = pads
        if (top, left) == (bottom, right):
            padding = (top, left)
        else:
            # Zero padding is exactly what corner sampling sees outside the map, so pad explicitly.
            X = np.pad(X, ((0, 0), (0, 0), (top, bottom), (left, right)))
            padding = (0, 0)
        return (_deform_conv(X, offset, W, B, mask, strides, padding, dilations),)


class RoiAlign(OpRun):
    """ONNX ``RoiAlign``: inputs X, rois (K, 4) [x1, y1, x2, y2], batch_indices (K,)."""

    op_domain = ""

    def _run(self, X, rois, batch_indices, **_):
        X, rois, batch_indices = _f32(X, rois, batch_indices)
        if rois.ndim != 2 or rois.shape[1] != 4:
            raise ValueError(f"RoiAlign: rois: expected shape (K, 4), got {rois.shape}")
        if batch_indices.shape != (rois.shape[0],):
            raise ValueError(f"RoiAlign: batch_indices: expected shape ({rois.shape[0]},), got {batch_indices.shape}")
        bad = (batch_indices < 0) | (batch_indices >= X.shape[0])
        if bad.any():
            raise ValueError(
                f"RoiAlign: batch_indices: expected values in [0, {X.shape[0]}), got {batch_indices[bad][0]}"
            )
        # opset 16 defaults to half_pixel; opset 10 had no attribute and behaved as output_half_pixel.
        version = int(getattr(self, "_onnx_opset", 16) or 16)
        # onnx.reference fills absent attributes from the newest schema: read the node's own attributes.
        given = {a.name for a in self.onnx_node.attribute}
        if "coordinate_transformation_mode" in given:
            mode = _attr(self, "coordinate_transformation_mode", "half_pixel")
        else:
            mode = "half_pixel" if version >= 16 else "output_half_pixel"
        if mode not in ("half_pixel", "output_half_pixel"):
            raise ValueError(
                f"RoiAlign: coordinate_transformation_mode: expected half_pixel or output_half_pixel, got {mode!r}"
            )
        output_size = (int(_attr(self, "output_height", 1)), int(_attr(self, "output_width", 1)))
        if str(_attr(self, "mode", "avg")) == "max":
            return _onnx_max_roi_align(self, X, rois, batch_indices, mode, output_size)
        rois5 = np.concatenate([batch_indices.reshape(-1, 1).astype(rois.dtype), rois.reshape(-1, 4)], axis=1)
        out = _ref().roi_align(
            X,
            rois5,
            (int(_attr(self, "output_height", 1)), int(_attr(self, "output_width", 1))),
            spatial_scale=float(_attr(self, "spatial_scale", 1.0)),
            sampling_ratio=int(_attr(self, "sampling_ratio", 0)),
            aligned=(mode == "half_pixel"),
            pool_mode=str(_attr(self, "mode", "avg")),
        )
        return (np.asarray(out).astype(X.dtype, copy=False),)


# Sample evaluations (RoIs x channels x bins x samples) the reference's ONNX max RoiAlign takes at the most: it has no
# bounded work (neither has ONNX Runtime's kernel), so a larger grid is refused rather than run for minutes.
MAX_ONNX_MAX_ROI_ALIGN_SAMPLES = 2_000_000


def _onnx_max_roi_align(op: OpRun, X, rois, batch_indices, ctm: str, output_size) -> tuple:
    """ONNX's own ``max`` RoiAlign (the largest of each sample's four weighted corner values, not of the interpolated
    samples: another function than the kit's max, which the kit never writes as a standard node), as ONNX Runtime
    computes it: onnx.reference's implementation, after ONNX Runtime's checks (finite RoIs) and a bound on its work."""
    from onnx.reference.ops.op_roi_align import RoiAlign as OnnxRoiAlign

    if not np.all(np.isfinite(rois)):
        k, j = np.argwhere(~np.isfinite(rois))[0]
        raise ValueError(f"RoiAlign: rois[{k}, {j}]: expected a finite value (ONNX Runtime's rule), got {rois[k, j]}")
    oh, ow = output_size
    scale, ratio = float(_attr(op, "spatial_scale", 1.0)), int(_attr(op, "sampling_ratio", 0))
    with np.errstate(all="ignore"):
        extent = np.maximum(np.abs(rois[:, 2:] - rois[:, :2]).astype(np.float64) * scale, 1.0)
    grid = np.full(extent.shape, float(ratio)) if ratio > 0 else np.ceil(extent / [ow, oh])
    work = float(np.sum(grid[:, 0] * grid[:, 1])) * X.shape[1] * oh * ow
    if work > MAX_ONNX_MAX_ROI_ALIGN_SAMPLES:
        raise ValueError(f"RoiAlign (max): rois: expected at most {MAX_ONNX_MAX_ROI_ALIGN_SAMPLES} sample evaluations "
                         f"for the reference's ONNX max RoiAlign (it has no bounded work), got {work:.3g}")
    if X.shape[2] == 0 or X.shape[3] == 0:  # an empty map: zeros (onnx.reference would index into it)
        return (np.zeros((rois.shape[0], X.shape[1], oh, ow), X.dtype),)
    f = np.float64 if X.dtype == np.float64 else np.float32  # 16-bit data: computed in float32, as ONNX Runtime does
    (y,) = OnnxRoiAlign(op.onnx_node, op.run_params)._run(
        X.astype(f), rois.astype(f), batch_indices, coordinate_transformation_mode=ctm, mode="max", output_height=oh,
        output_width=ow, sampling_ratio=ratio, spatial_scale=scale)
    return (y.astype(X.dtype),)


class GatherElements(OpRun):
    """ONNX ``GatherElements`` with ``np.take_along_axis``: onnx.reference's own uses ``np.choose``, which takes at
    most 64 choices along the axis (RT-DETR gathers 300 queries out of thousands)."""

    op_domain = ""

    def _run(self, data, indices, **_):
        axis = int(_attr(self, "axis", 0))
        indices = np.where(indices < 0, indices + data.shape[axis], indices)
        return (np.take_along_axis(data, indices.astype(np.int64), axis=axis),)


class Flatten(OpRun):
    """ONNX ``Flatten`` with explicit sizes: onnx.reference reshapes to (d, -1), which NumPy refuses for an empty
    tensor (a detector's head on an image that yields no proposal)."""

    op_domain = ""

    def _run(self, x, **_):
        axis = int(_attr(self, "axis", 1))
        axis = axis + x.ndim if axis < 0 else axis
        return (x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), int(np.prod(x.shape[axis:], dtype=np.int64))),)


# The ops written here: the quantized one, TensorRT's per-head attention, the standard-domain replacements and ONNX
# ops onnx.reference gets wrong. Every other name of the op table: reference_ops.declared_ops.
CUSTOM_OPS = (QDeformConv2d, DeformConv, RoiAlign, Flatten, GatherElements) + TRT_MSDA_OPS


def reference_evaluator(model, verbose: int = 0) -> ReferenceEvaluator:
    """An ``onnx.reference.ReferenceEvaluator`` for ``model`` with the kit's op implementations."""
    proto = load_model(model)
    opsets = {o.domain: o.version for o in proto.opset_import}
    ops = list(CUSTOM_OPS) + list(declared_ops({(c.op_domain, c.__name__) for c in CUSTOM_OPS}, NODE_FUNCTIONS))
    if opsets.get("", opsets.get("ai.onnx", 16)) < 16:
        # RoiAlign's default coordinate mode changed in opset 16.
        class RoiAlignV10(RoiAlign):
            _onnx_opset = 10

        RoiAlignV10.__name__ = "RoiAlign"
        ops = [op for op in ops if op is not RoiAlign] + [RoiAlignV10]
    return ReferenceEvaluator(proto, new_ops=ops, verbose=verbose)


class ReferenceRunner(Runner):
    """The ``reference`` backend: the whole model through :func:`reference_evaluator`."""

    name = "reference"

    def __init__(self, model, **options):
        if options:
            raise ValueError(f"options: expected none for the reference backend, got {sorted(options)}")
        self.model = load_model(model)
        self._inputs = value_infos(
            [v for v in self.model.graph.input if v.name not in {i.name for i in self.model.graph.initializer}]
        )
        self._outputs = value_infos(self.model.graph.output)
        self.evaluator = reference_evaluator(self.model)

    def inputs(self):
        return list(self._inputs)

    def outputs(self):
        return list(self._outputs)

    def run(self, feeds):
        feeds = self._check_feeds(feeds)
        names = [o.name for o in self._outputs]
        res = self.evaluator.run(names, feeds)
        return {n: np.asarray(r) for n, r in zip(names, res)}

    def close(self):
        self.evaluator = None


def _polygraphy_runner_class():
    from polygraphy.backend.base import BaseRunner
    from polygraphy.common import TensorMetadata

    class PolygraphyReferenceRunner(BaseRunner):
        """Polygraphy runner over :class:`ReferenceRunner` (name prefix ``dcnkit-reference``)."""

        def __init__(self, model, name=None):
            """``model``: path, bytes, ModelProto, or a callable returning one (a Polygraphy loader)."""
            super().__init__(name=name, prefix="dcnkit-reference-runner")
            self._model = model

        def activate_impl(self):
            model = self._model() if callable(self._model) else self._model
            if isinstance(model, tuple):  # some Polygraphy loaders return (value, owned)
                model = model[0]
            self._runner = ReferenceRunner(model)

        def get_input_metadata_impl(self):
            meta = TensorMetadata()
            for info in self._runner.inputs():
                meta.add(info.name, dtype=info.dtype, shape=[d if d is not None else -1 for d in info.shape])
            return meta

        def infer_impl(self, feed_dict):
            import time

            feeds = {k: np.asarray(v) for k, v in feed_dict.items()}
            start = time.time()
            out = self._runner.run(feeds)
            self.inference_time = time.time() - start
            return OrderedDict(out)

        def deactivate_impl(self):
            self._runner.close()
            del self._runner

    return PolygraphyReferenceRunner


def _available_here() -> None:
    """The reference backend runs wherever this module imports (onnx.reference is its only need)."""
    return None


def _runner(model, kit_kernels: bool = True, **options) -> ReferenceRunner:
    """The ``reference`` backend's runner (``kit_kernels`` is ONNX Runtime's option: ignored)."""
    return ReferenceRunner(model, **options)


BACKENDS = (Backend("reference", _available_here, _runner),)


def __getattr__(name):
    # Polygraphy is optional: the class is built on first access.
    if name == "PolygraphyReferenceRunner":
        cls = _polygraphy_runner_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


__all__ = ["ReferenceRunner", "PolygraphyReferenceRunner", "reference_evaluator", "CUSTOM_OPS", "declared_ops"]
