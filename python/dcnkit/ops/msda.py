"""``multi_scale_deformable_attn``: the sampling of Deformable DETR's multi-scale deformable attention
(mmcv's ``MultiScaleDeformableAttnFunction``), see docs/operators.md.

The kernel is ``torch.ops.dcnkit.multi_scale_deformable_attn`` (C++/CUDA); this module registers its fake
kernel (``torch.compile`` / ``torch.export``) and its autograd formula (gradients for value,
sampling_locations and attention_weights; none for the int64 level tables).
"""
from __future__ import annotations

import torch
from torch import Tensor

from dcnkit.ops import _loader  # noqa: F401  (loads libdcnkit_torch.so)
from dcnkit.ops._tracing import eager_call

__all__ = ["multi_scale_deformable_attn"]

_OP = "multi_scale_deformable_attn"


@torch.jit.unused
def _check_eager(value, value_spatial_shapes, value_level_start_index, sampling_locations, attention_weights,
                 im2col_step) -> None:
    """The checks that only Python can fail (TorchScript has typed the arguments already)."""
    for name, t in (("value", value), ("value_spatial_shapes", value_spatial_shapes),
                    ("value_level_start_index", value_level_start_index),
                    ("sampling_locations", sampling_locations), ("attention_weights", attention_weights)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{_OP}: {name}: expected a Tensor, got {type(t).__name__}")
    if isinstance(im2col_step, bool) or not isinstance(im2col_step, int):
        raise ValueError(f"{_OP}: im2col_step: expected an int >= 1, got {im2col_step!r}")


def multi_scale_deformable_attn(value: Tensor, value_spatial_shapes: Tensor, value_level_start_index: Tensor,
                                sampling_locations: Tensor, attention_weights: Tensor,
                                im2col_step: int = 64) -> Tensor:
    """Multi-scale deformable attention sampling, in the argument order of mmcv's
    ``MultiScaleDeformableAttnFunction.apply``.

    value: (N, S, M, D) with S = sum of H_l*W_l; value_spatial_shapes: (L, 2) int64 rows (H_l, W_l);
    value_level_start_index: (L,) int64, the first row of each level in value; sampling_locations:
    (N, Lq, M, L, P, 2) as (x, y) in [0, 1] of each level; attention_weights: (N, Lq, M, L, P).
    Returns (N, Lq, M*D): ``out[n, q, m*D + d] = sum over l, p of a * bilinear(value_l[n, :, m, d], y*H_l - 0.5,
    x*W_l - 0.5)`` with zeros outside the map (``grid_sample(align_corners=False)``).

    ``im2col_step`` is accepted for mmcv compatibility (it only batches mmcv's CUDA work): it must be an
    int >= 1 and does not change the result. Gradients flow to value, sampling_locations and
    attention_weights. As in mmcv, sampling_locations and attention_weights are cast to value's floating dtype
    (e.g. float16 value, float32 locations under autocast); their gradients come back in their own dtypes.
    """
    if not torch.jit.is_scripting():
        return eager_call(multi_scale_deformable_attn, _multi_scale_deformable_attn,
                          (value, value_spatial_shapes, value_level_start_index, sampling_locations,
                           attention_weights, im2col_step))
    return _multi_scale_deformable_attn(value, value_spatial_shapes, value_level_start_index, sampling_locations,
                                        attention_weights, im2col_step)


def _multi_scale_deformable_attn(value: Tensor, value_spatial_shapes: Tensor, value_level_start_index: Tensor,
                                 sampling_locations: Tensor, attention_weights: Tensor, im2col_step: int) -> Tensor:
    if not torch.jit.is_scripting():
        _check_eager(value, value_spatial_shapes, value_level_start_index, sampling_locations, attention_weights,
                     im2col_step)
    if im2col_step < 1:
        raise ValueError("multi_scale_deformable_attn: im2col_step: expected an int >= 1, got " + str(im2col_step))
    if value.is_floating_point():
        # As mmcv's MultiScaleDeformableAttnFunction: the locations and weights take value's dtype (float16 value
        # and float32 locations under autocast); autograd gives their gradients back in the callers' dtypes. A
        # value of another dtype is refused by the kernel, as by mmcv's.
        if sampling_locations.dtype != value.dtype:
            sampling_locations = sampling_locations.to(value.dtype)
        if attention_weights.dtype != value.dtype:
            attention_weights = attention_weights.to(value.dtype)
    # Shapes, dtypes, devices and (on the CPU) the level tables' values are checked by the kernel's core.
    return torch.ops.dcnkit.multi_scale_deformable_attn(value, value_spatial_shapes, value_level_start_index,
                                                        sampling_locations, attention_weights)


# torch.fx.symbolic_trace records a call as one node (an fx leaf).
torch.fx.wrap("multi_scale_deformable_attn")


def _check_shapes_fake(value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
    torch._check(value.dim() == 4, lambda: f"{_OP}: value: expected a 4-D tensor (N, S, M, D)")
    torch._check(spatial_shapes.dim() == 2 and spatial_shapes.size(1) == 2,
                 lambda: f"{_OP}: spatial_shapes: expected (L, 2)")
    torch._check(spatial_shapes.dtype == torch.int64, lambda: f"{_OP}: spatial_shapes: expected dtype int64")
    torch._check(level_start_index.dtype == torch.int64, lambda: f"{_OP}: level_start_index: expected dtype int64")
    torch._check(level_start_index.dim() == 1, lambda: f"{_OP}: level_start_index: expected (L)")
    torch._check(sampling_locations.dim() == 6, lambda: f"{_OP}: sampling_locations: expected (N, Lq, M, L, P, 2)")
    torch._check(attention_weights.dim() == 5, lambda: f"{_OP}: attention_weights: expected (N, Lq, M, L, P)")


@torch.library.register_fake("dcnkit::multi_scale_deformable_attn")
def _msda_fake(value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
    _check_shapes_fake(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)
    n, _, m, d = value.shape
    return value.new_empty((n, sampling_locations.size(1), m * d))


@torch.library.register_fake("dcnkit::_multi_scale_deformable_attn_backward")
def _msda_backward_fake(grad_output, value, spatial_shapes, level_start_index, sampling_locations,
                        attention_weights):
    _check_shapes_fake(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)
    return (value.new_empty(value.shape), sampling_locations.new_empty(sampling_locations.shape),
            attention_weights.new_empty(attention_weights.shape))


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad_output):
    value, spatial_shapes, level_start_index, locations, weights = ctx.saved_tensors
    grad_value = grad_locations = grad_weights = None
    if any(ctx.needs_input_grad[i] for i in (0, 3, 4)):
        grad_value, grad_locations, grad_weights = torch.ops.dcnkit._multi_scale_deformable_attn_backward(
            grad_output, value, spatial_shapes, level_start_index, locations, weights)
    return (grad_value if ctx.needs_input_grad[0] else None, None, None,
            grad_locations if ctx.needs_input_grad[3] else None,
            grad_weights if ctx.needs_input_grad[4] else None)


torch.library.register_autograd("dcnkit::multi_scale_deformable_attn", _backward, setup_context=_setup)
