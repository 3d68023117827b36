"""RoI operators: ``roi_align`` (torchvision's signature plus ``pool_mode``), ``deform_roi_pool`` (mmcv's)
and ``deform_psroi_pool`` (R-FCN, mmcv/mmdet v1). See docs/operators.md for the exact contract.

The kernels are ``torch.ops.dcnkit.*`` (C++/CUDA); this module registers their fake kernels (for
``torch.compile`` / ``torch.export``) and their autograd formulas (through the ``_*_backward`` ops).
"""
from __future__ import annotations

from typing import List, Optional, Tuple, Union

import torch
from torch import Tensor
from torch.jit.annotations import BroadcastingList2

from dcnkit.ops import _loader  # noqa: F401  (loads libdcnkit_torch.so)
from dcnkit.ops._tracing import eager_call

__all__ = ["roi_align", "deform_roi_pool", "deform_psroi_pool", "MAX_SAMPLING_RATIO"]

# The largest explicit sampling_ratio / sample_per_part per bin and axis; a larger value is a ValueError
# naming the argument (from the kernels' shared checks). Mirrors kMaxSamplingRatio in
# plugins/core/include/dcnkit/common.h, which every front end (torch, ONNX Runtime, TensorRT) enforces.
MAX_SAMPLING_RATIO = 1024


@torch.jit.unused
def _check_sampling(where: str, arg: str, value: int, lo: Optional[int] = None) -> int:
    """A module's explicit sampling grid, checked at construction like the ops check it per call."""
    value = int(value)
    if value > MAX_SAMPLING_RATIO or (lo is not None and value < lo):
        expected = (f"a value <= {MAX_SAMPLING_RATIO} (<= 0: adaptive; the limit of an explicit grid)"
                    if lo is None else f"a value in [{lo}, {MAX_SAMPLING_RATIO}]")
        raise ValueError(f"{where}: {arg}: expected {expected}, got {value}")
    return value


@torch.jit.unused
def _pair(v, name: str) -> Tuple[int, int]:
    if isinstance(v, int):
        return int(v), int(v)
    if isinstance(v, (tuple, list)) and len(v) == 2:
        return int(v[0]), int(v[1])
    if isinstance(v, torch.Size) and len(v) == 2:
        return int(v[0]), int(v[1])
    raise ValueError(f"{name}: expected an int or a pair (h, w), got {v!r}")


def _output_size(v: List[int], name: str) -> Tuple[int, int]:
    """output_size (an int or a pair in Python; BroadcastingList2[int] under TorchScript) -> (h, w)."""
    if not torch.jit.is_scripting():
        return _pair(v, name)
    if len(v) != 2:
        raise ValueError(f"{name}: expected an int or a pair (h, w), got {v}")
    return v[0], v[1]


def _quoted(s: str) -> str:
    if not torch.jit.is_scripting():
        return repr(s)
    return "'" + s + "'"


@torch.jit.unused
def _check_box_list_eager(boxes) -> None:
    """The checks of a box list that only Python can fail (TorchScript has typed them already)."""
    if not isinstance(boxes, (list, tuple)):
        raise ValueError(
            f"roi_align: boxes: expected a Tensor[K, 5] or a list of Tensor[L, 4], got {type(boxes).__name__}")
    for i, b in enumerate(boxes):
        if not isinstance(b, Tensor) or b.dim() != 2 or b.size(1) != 4:
            shape = list(b.shape) if isinstance(b, Tensor) else type(b).__name__
            raise ValueError(f"roi_align: boxes[{i}]: expected a Tensor[L, 4], got {shape}")


def _boxes_to_rois(boxes: Union[Tensor, List[Tensor]]) -> Tensor:
    """torchvision's two box forms -> (K, 5) rows [batch_index, x1, y1, x2, y2]."""
    if isinstance(boxes, Tensor):
        if boxes.dim() != 2 or boxes.size(1) != 5:
            raise ValueError(
                f"roi_align: boxes: expected a Tensor[K, 5] or a list of Tensor[L, 4], "
                f"got a tensor of shape {list(boxes.shape)}")
        return boxes
    if not torch.jit.is_scripting():
        _check_box_list_eager(boxes)
    ids: List[Tensor] = []
    for i, b in enumerate(boxes):
        if b.dim() != 2 or b.size(1) != 4:
            raise ValueError(f"roi_align: boxes[{i}]: expected a Tensor[L, 4], got {list(b.shape)}")
        ids.append(torch.full_like(b[:, :1], i))
    if len(boxes) == 0:
        raise ValueError("roi_align: boxes: expected a non-empty list of Tensor[L, 4], got []")
    return torch.cat([torch.cat(ids, dim=0), torch.cat(list(boxes), dim=0)], dim=1)


# ------------------------------------------------------------------------------------------------
# Public functions: scriptable (torch.jit.script), fx leaves (torch.fx.wrap below and
# _tracing.eager_call); CPU float16/bfloat16 compute in float32.


def roi_align(input: Tensor, boxes: Union[Tensor, List[Tensor]], output_size: BroadcastingList2[int],
              spatial_scale: float = 1.0, sampling_ratio: int = -1, aligned: bool = False,
              pool_mode: str = "avg") -> Tensor:
    """RoIAlign (torchvision.ops.roi_align, plus ``pool_mode`` "avg" | "max" as in mmcv).

    boxes: Tensor[K, 5] rows [batch_index, x1, y1, x2, y2], or a list of Tensor[L, 4] (one per image).
    sampling_ratio <= 0: adaptive, ceil(roi_size / output_size) samples per bin and axis.
    """
    if not torch.jit.is_scripting():
        return eager_call(roi_align, _roi_align,
                          (input, boxes, output_size, spatial_scale, sampling_ratio, aligned, pool_mode))
    return _roi_align(input, boxes, output_size, spatial_scale, sampling_ratio, aligned, pool_mode)


def _roi_align(input: Tensor, boxes: Union[Tensor, List[Tensor]], output_size: List[int],
               spatial_scale: float, sampling_ratio: int, aligned: bool, pool_mode: str) -> Tensor:
    if pool_mode != "avg" and pool_mode != "max":
        raise ValueError(f"roi_align: pool_mode: expected 'avg' or 'max', got {_quoted(pool_mode)}")
    oh, ow = _output_size(output_size, "roi_align: output_size")
    rois = _boxes_to_rois(boxes)
    return torch.ops.dcnkit.roi_align(input, rois, oh, ow, float(spatial_scale), int(sampling_ratio),
                                      bool(aligned), pool_mode)


def deform_roi_pool(input: Tensor, rois: Tensor, offset: Optional[Tensor], output_size: BroadcastingList2[int],
                    spatial_scale: float = 1.0, sampling_ratio: int = 0, gamma: float = 0.1) -> Tensor:
    """mmcv's deform_roi_pool: aligned RoIAlign (avg) whose bins move by gamma * roi_size * offset.

    offset: (K, 2, oh, ow) with offset[:, 0] along x and offset[:, 1] along y, or None.
    """
    if not torch.jit.is_scripting():
        return eager_call(deform_roi_pool, _deform_roi_pool,
                          (input, rois, offset, output_size, spatial_scale, sampling_ratio, gamma))
    return _deform_roi_pool(input, rois, offset, output_size, spatial_scale, sampling_ratio, gamma)


def _deform_roi_pool(input: Tensor, rois: Tensor, offset: Optional[Tensor], output_size: List[int],
                     spatial_scale: float, sampling_ratio: int, gamma: float) -> Tensor:
    oh, ow = _output_size(output_size, "deform_roi_pool: output_size")
    return torch.ops.dcnkit.deform_roi_pool(input, rois, offset, oh, ow, float(spatial_scale),
                                            int(sampling_ratio), float(gamma))


def deform_psroi_pool(input: Tensor, rois: Tensor, trans: Optional[Tensor], spatial_scale: float,
                      output_size: int, output_dim: int, group_size: int = 1,
                      part_size: Optional[int] = None, sample_per_part: int = 4,
                      trans_std: float = 0.0) -> Tensor:
    """Deformable position-sensitive RoI pooling (R-FCN). trans None means no_trans.

    input (N, output_dim * group_size^2, H, W), trans (K, 2 * num_classes, part_size, part_size);
    returns (K, output_dim, output_size, output_size).
    """
    if not torch.jit.is_scripting():
        return eager_call(deform_psroi_pool, _deform_psroi_pool,
                          (input, rois, trans, spatial_scale, output_size, output_dim, group_size, part_size,
                           sample_per_part, trans_std))
    return _deform_psroi_pool(input, rois, trans, spatial_scale, output_size, output_dim, group_size, part_size,
                              sample_per_part, trans_std)


def _deform_psroi_pool(input: Tensor, rois: Tensor, trans: Optional[Tensor], spatial_scale: float,
                       output_size: int, output_dim: int, group_size: int, part_size: Optional[int],
                       sample_per_part: int, trans_std: float) -> Tensor:
    out, _count = torch.ops.dcnkit.deform_psroi_pool(
        input, rois, trans, float(spatial_scale), int(output_size), int(output_dim), int(group_size),
        0 if part_size is None else int(part_size), int(sample_per_part), float(trans_std))
    return out


# torch.fx.symbolic_trace records calls to these as one node each (fx leaves, as torchvision's roi_align).
torch.fx.wrap("roi_align")
torch.fx.wrap("deform_roi_pool")
torch.fx.wrap("deform_psroi_pool")


# ------------------------------------------------------------------------------------------------
# Fake kernels (shapes only; outputs are contiguous like the real kernels')


@torch.library.register_fake("dcnkit::roi_align")
def _roi_align_fake(input, rois, pooled_h, pooled_w, spatial_scale, sampling_ratio, aligned, pool_mode):
    torch._check(input.dim() == 4, lambda: "roi_align: input: expected a 4-D tensor")
    torch._check(rois.dim() == 2 and rois.size(1) == 5, lambda: "roi_align: rois: expected (K, 5)")
    return input.new_empty((rois.size(0), input.size(1), pooled_h, pooled_w))


@torch.library.register_fake("dcnkit::_roi_align_backward")
def _roi_align_backward_fake(grad_output, input, rois, pooled_h, pooled_w, spatial_scale, sampling_ratio,
                             aligned, pool_mode):
    return input.new_empty(input.shape)


@torch.library.register_fake("dcnkit::deform_roi_pool")
def _deform_roi_pool_fake(input, rois, offset, pooled_h, pooled_w, spatial_scale, sampling_ratio, gamma):
    torch._check(input.dim() == 4, lambda: "deform_roi_pool: input: expected a 4-D tensor")
    torch._check(rois.dim() == 2 and rois.size(1) == 5, lambda: "deform_roi_pool: rois: expected (K, 5)")
    return input.new_empty((rois.size(0), input.size(1), pooled_h, pooled_w))


@torch.library.register_fake("dcnkit::_deform_roi_pool_backward")
def _deform_roi_pool_backward_fake(grad_output, input, rois, offset, pooled_h, pooled_w, spatial_scale,
                                   sampling_ratio, gamma):
    grad_offset = offset.new_empty(offset.shape) if offset is not None else input.new_empty((0,))
    return input.new_empty(input.shape), grad_offset


@torch.library.register_fake("dcnkit::deform_psroi_pool")
def _deform_psroi_pool_fake(input, rois, trans, spatial_scale, output_size, output_dim, group_size,
                            part_size, sample_per_part, trans_std):
    torch._check(input.dim() == 4, lambda: "deform_psroi_pool: input: expected a 4-D tensor")
    torch._check(rois.dim() == 2 and rois.size(1) == 5, lambda: "deform_psroi_pool: rois: expected (K, 5)")
    shape = (rois.size(0), output_dim, output_size, output_size)
    return input.new_empty(shape), input.new_empty(shape)


@torch.library.register_fake("dcnkit::_deform_psroi_pool_backward")
def _deform_psroi_pool_backward_fake(grad_output, input, rois, trans, count, spatial_scale, output_size,
                                     output_dim, group_size, part_size, sample_per_part, trans_std):
    grad_trans = trans.new_empty(trans.shape) if trans is not None else input.new_empty((0,))
    return input.new_empty(input.shape), grad_trans


# ------------------------------------------------------------------------------------------------
# Quantized features (torchvision's QuantizedCPU roi_align): per-tensor affine input; RoIs quantized (as
# torchvision takes them, dequantized with their own scale and zero point) or float. The samples are taken from
# the dequantized map and the result is quantized with the input's scale, zero point and dtype.


@torch.library.impl("dcnkit::roi_align", "QuantizedCPU")
def _roi_align_quantized(input, rois, pooled_h, pooled_w, spatial_scale, sampling_ratio, aligned, pool_mode):
    if input.qscheme() not in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        raise ValueError(f"roi_align: input: expected a per-tensor quantized tensor, got qscheme {input.qscheme()}")
    r = rois.dequantize() if rois.is_quantized else rois
    if r.dtype != torch.float32:
        r = r.float()
    y = torch.ops.dcnkit.roi_align(input.dequantize(), r, pooled_h, pooled_w, spatial_scale, sampling_ratio,
                                   aligned, pool_mode)
    return torch.quantize_per_tensor(y, input.q_scale(), input.q_zero_point(), input.dtype)


# ------------------------------------------------------------------------------------------------
# Autograd (gradients for input and offset / trans; none for rois or attributes)


def register_input_grad_autograd(name: str) -> None:
    """Autograd of ``dcnkit::<name>(input, rois, *attrs)``: a gradient for ``input`` only, computed by
    ``dcnkit::_<name>_backward(grad_output, input, rois, *attrs)`` (RoIAlign and RoIAlign-like ops)."""
    backward_op = getattr(torch.ops.dcnkit, f"_{name}_backward")

    def setup(ctx, inputs, output):
        input, rois, *attrs = inputs
        ctx.save_for_backward(input, rois)
        ctx.attrs = attrs

    def backward(ctx, grad_output):
        input, rois = ctx.saved_tensors
        grad_input = None
        if ctx.needs_input_grad[0]:
            grad_input = backward_op(grad_output, input, rois, *ctx.attrs)
        return (grad_input, None) + (None,) * len(ctx.attrs)

    torch.library.register_autograd(f"dcnkit::{name}", backward, setup_context=setup)


register_input_grad_autograd("roi_align")


def _deform_roi_pool_setup(ctx, inputs, output):
    input, rois, offset, *attrs = inputs
    ctx.save_for_backward(input, rois, offset)
    ctx.attrs = attrs


def _deform_roi_pool_backward(ctx, grad_output):
    input, rois, offset = ctx.saved_tensors
    grad_input = grad_offset = None
    if ctx.needs_input_grad[0] or (offset is not None and ctx.needs_input_grad[2]):
        grad_input, grad_offset = torch.ops.dcnkit._deform_roi_pool_backward(
            grad_output, input, rois, offset, *ctx.attrs)
        if not ctx.needs_input_grad[0]:
            grad_input = None
        if offset is None or not ctx.needs_input_grad[2]:
            grad_offset = None
    return (grad_input, None, grad_offset) + (None,) * len(ctx.attrs)


torch.library.register_autograd("dcnkit::deform_roi_pool", _deform_roi_pool_backward,
                                setup_context=_deform_roi_pool_setup)


def _deform_psroi_pool_setup(ctx, inputs, output):
    input, rois, trans, *attrs = inputs
    _out, count = output
    ctx.mark_non_differentiable(count)
    ctx.save_for_backward(input, rois, trans, count)
    ctx.attrs = attrs


def _deform_psroi_pool_backward(ctx, grad_output, _grad_count):
    input, rois, trans, count = ctx.saved_tensors
    grad_input = grad_trans = None
    if ctx.needs_input_grad[0] or (trans is not None and ctx.needs_input_grad[2]):
        grad_input, grad_trans = torch.ops.dcnkit._deform_psroi_pool_backward(
            grad_output, input, rois, trans, count, *ctx.attrs)
        if not ctx.needs_input_grad[0]:
            grad_input = None
        if trans is None or not ctx.needs_input_grad[2]:
            grad_trans = None
    return (grad_input, None, grad_trans) + (None,) * len(ctx.attrs)


torch.library.register_autograd("dcnkit::deform_psroi_pool", _deform_psroi_pool_backward,
                                setup_context=_deform_psroi_pool_setup)
