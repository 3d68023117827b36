"""What each dcnkit operator becomes in ONNX, written once for both torch exporters.

``lower`` receives the op's tensors (by the table's input names) and the torch schema's scalar
arguments, and builds nodes through an emitter (dynamo: onnxscript tracer; legacy: TorchScript graph
context). A standard ONNX op is used only where its semantics are identical to docs/operators.md:

* ``deform_conv2d`` -> ``DeformConv`` (opset 19): same offset layout (dy, dx per kernel point), same
  DCNv2 corner sampling, same mask placement.
* ``roi_align`` avg -> ``RoiAlign`` (opset 16): ``half_pixel`` when aligned, else ``output_half_pixel``
  (which keeps the min-size-1 rule of the non-aligned mode). ONNX's adaptive grid is
  ``sampling_ratio == 0`` (ceil(roi / output)); ours is ``<= 0``, so the ratio is clamped to >= 0.
  ``max`` mode is not mapped: ONNX / ONNX Runtime take the max over weighted corner values,
  not over bilinear samples.

Everything else, and every op while standard ops are switched off, is a node of the ``dcnkit``
domain with the table's op type, input order and attribute names.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from dcnkit.export import _table

_INT64 = 7  # onnx.TensorProto.INT64

_standard_ops: contextvars.ContextVar[bool] = contextvars.ContextVar("dcnkit_standard_ops", default=True)


def standard_ops_enabled() -> bool:
    """Whether exports map ops to standard ONNX ops where the semantics are identical."""
    return _standard_ops.get()


def set_standard_ops(enabled: bool) -> None:
    """Sets the default for later exports in this context: True maps to standard ONNX ops where
    identical, False makes every dcnkit op a ``dcnkit`` domain node."""
    if not isinstance(enabled, bool):
        raise TypeError(f"set_standard_ops: enabled: expected a bool, got {type(enabled).__name__}")
    _standard_ops.set(enabled)


@contextlib.contextmanager
def standard_ops(enabled: bool = True) -> Iterator[None]:
    """Context manager: ``with dcnkit.export.standard_ops(False): torch.onnx.export(...)`` exports
    every dcnkit op as a node of the ``dcnkit`` domain."""
    if not isinstance(enabled, bool):
        raise TypeError(f"standard_ops: enabled: expected a bool, got {type(enabled).__name__}")
    token = _standard_ops.set(enabled)
    try:
        yield
    finally:
        _standard_ops.reset(token)


def custom_ops_only() -> contextlib.AbstractContextManager[None]:
    """``with dcnkit.export.custom_ops_only(): ...``: every dcnkit op as a ``dcnkit`` domain node."""
    return standard_ops(False)


class Emitter(Protocol):
    def op(self, op_type: str, *inputs: Any, **attrs: Any) -> Any:
        """A standard-domain node; trailing None inputs are dropped, inner ones left empty."""

    def custom(self, info: _table.OpInfo, inputs: list[Any], attrs: dict[str, Any]) -> Any:
        """A dcnkit-domain node with all of the table's outputs (a tuple when more than one)."""

    def const_i64(self, value: int | list[int]) -> Any:
        """An int64 constant (a scalar for an int, 1-D for a list)."""

    def cast_like(self, value: Any, like: Any) -> Any:
        """``value`` cast to ``like``'s dtype (``value`` itself where they already agree)."""

    def static_shape(self, value: Any) -> list[int] | None:
        """The value's shape when fully known at export time, else None."""


def _deform_conv2d(t: dict[str, Any], a: dict[str, Any], em: Emitter, opset: int) -> Any:
    if opset < 19:
        return None
    sh, sw = a["stride"]
    ph, pw = a["padding"]
    dh, dw = a["dilation"]
    extra = {}
    wshape = em.static_shape(t["weight"])
    if wshape is not None and len(wshape) == 4:
        extra["kernel_shape"] = [int(wshape[2]), int(wshape[3])]
    return em.op(
        "DeformConv",
        t["input"],
        t["weight"],
        t["offset"],
        t["bias"],
        t["mask"],
        dilations=[dh, dw],
        group=a["groups"],
        offset_group=a["deformable_groups"],
        pads=[ph, pw, ph, pw],
        strides=[sh, sw],
        **extra,
    )


def _roi_align(t: dict[str, Any], a: dict[str, Any], em: Emitter, opset: int) -> Any:
    if a["pool_mode"] != "avg" or opset < 16:
        return None
    rois = t["rois"]
    # (K, 5) rows [batch_index, x1, y1, x2, y2] -> boxes (K, 4) and int64 batch indices (K,).
    boxes = em.op("Slice", rois, em.const_i64([1]), em.const_i64([5]), em.const_i64([1]))
    batch = em.op("Cast", em.op("Gather", rois, em.const_i64(0), axis=1), to=_INT64)
    oh, ow = a["output_size"]
    return em.op(
        "RoiAlign",
        t["input"],
        boxes,
        batch,
        coordinate_transformation_mode="half_pixel" if a["aligned"] else "output_half_pixel",
        mode="avg",
        output_height=oh,
        output_width=ow,
        sampling_ratio=max(int(a["sampling_ratio"]), 0),
        spatial_scale=float(a["spatial_scale"]),
    )


_STANDARD: dict[str, Callable[[dict[str, Any], dict[str, Any], Emitter, int], Any]] = {
    "deform_conv2d": _deform_conv2d,
    "roi_align": _roi_align,
}


def lower(
    name: str,
    tensors: dict[str, Any],
    scalars: list[Any],
    em: Emitter,
    opset: int,
    standard: bool | None = None,
) -> Any:
    """Emits the ONNX nodes for one call of ``torch.ops.dcnkit.<name>``; returns its output(s)."""
    info = _table.op(name)
    absent = all(tensors.get(t.name) is None for t in info.inputs if t.optional)
    attrs = _table.attrs_from_scalars(info, scalars, absent)
    if standard is None:
        standard = standard_ops_enabled()
    if standard and name in _STANDARD:
        full = {t.name: tensors.get(t.name) for t in info.inputs}
        out = _STANDARD[name](full, attrs, em, opset)
        if out is not None:
            return out
    if any(t.cast for t in info.inputs):  # as the eager op casts them (TensorDef::cast)
        tensors = dict(tensors)
        for t in info.inputs:
            if t.cast and tensors.get(t.name) is not None:
                tensors[t.name] = em.cast_like(tensors[t.name], tensors[info.inputs[0].name])
    inputs = [tensors.get(t.name) for t in info.inputs]
    if info.inputs and info.inputs[-1].variadic:
        # A variadic input (MultiLevelRoIAlign's feature maps, a torch Tensor[]): one node input per tensor.
        inputs = inputs[:-1] + list(inputs[-1] or [])
        return em.custom(info, inputs, {**attrs, **_table.plugin_attrs()})
    # TensorRT's ONNX parser hands a plugin its inputs by position and has no tensor for an empty name: an
    # absent optional input before a present one (DCNv2 without bias) becomes its neutral value.
    for i, t in enumerate(info.inputs):
        if inputs[i] is None and any(v is not None for v in inputs[i + 1 :]):
            inputs[i] = _NEUTRAL[(name, t.name)](tensors, em)
    return em.custom(info, inputs, {**attrs, **_table.plugin_attrs()})


def _zero_bias(tensors: dict[str, Any], em: Emitter) -> Any:
    # zeros(Cout) in the weight's dtype, Cout = weight.shape[0] (folds to a constant for static weights).
    cout = em.op("Slice", em.op("Shape", tensors["weight"]), em.const_i64([0]), em.const_i64([1]), em.const_i64([0]))
    # A Cast where the weight's type is known (CastLike is opset 15: plain TorchScript exports go down to opset 9).
    return em.cast_like(em.op("ConstantOfShape", cout), tensors["weight"])


# Values equivalent to an absent optional input, by (op, input).
_NEUTRAL: dict[tuple[str, str], Callable[[dict[str, Any], Emitter], Any]] = {
    ("deform_conv2d", "bias"): _zero_bias,
}


def is_tensor_arg(arg: Any) -> bool:
    """Whether a torch schema argument is a (possibly optional) tensor or a tensor list."""
    t = arg.type
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    if isinstance(t, torch.ListType):
        t = t.getElementType()
    return isinstance(t, torch.TensorType)


def is_tensor_list_arg(arg: Any) -> bool:
    """Whether a torch schema argument is a ``Tensor[]``."""
    return isinstance(arg.type, torch.ListType) and isinstance(arg.type.getElementType(), torch.TensorType)
