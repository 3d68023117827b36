"""``dcnv3`` (InternImage) and ``dcnv4`` (FlashInternImage): channels-last deformable sampling without a weight,
see docs/operators.md.

The kernels are ``torch.ops.dcnkit.dcnv3`` / ``dcnv4`` (C++/CUDA, one core for both); this module registers their
fake kernels (``torch.compile`` / ``torch.export``) and their autograd formulas (gradients for the input, the
offsets and the weights).
"""
from __future__ import annotations

import torch
from torch import Tensor

from dcnkit.ops import _loader  # noqa: F401  (loads libdcnkit_torch.so)
from dcnkit.ops._tracing import eager_call

__all__ = ["dcnv3", "dcnv4"]

_INT_ATTRS = ("kernel_h", "kernel_w", "stride_h", "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w", "group",
              "group_channels")


@torch.jit.unused
def _check_eager(op: str, tensors: dict, ints: tuple, offset_scale, im2col_step, remove_center) -> None:
    """The checks that only Python can fail (TorchScript has typed the arguments already)."""
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            raise ValueError(f"{op}: {name}: expected a Tensor, got {type(t).__name__}")
    for name, v in zip(_INT_ATTRS, ints):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{op}: {name}: expected an int, got {v!r}")
    if isinstance(offset_scale, bool) or not isinstance(offset_scale, (int, float)):
        raise ValueError(f"{op}: offset_scale: expected a float, got {offset_scale!r}")
    if isinstance(im2col_step, bool) or not isinstance(im2col_step, int):
        raise ValueError(f"{op}: im2col_step: expected an int >= 1, got {im2col_step!r}")
    if not isinstance(remove_center, (bool, int)):
        raise ValueError(f"{op}: remove_center: expected 0 or 1, got {remove_center!r}")


def dcnv3(input: Tensor, offset: Tensor, mask: Tensor, kernel_h: int, kernel_w: int, stride_h: int, stride_w: int,
          pad_h: int, pad_w: int, dilation_h: int, dilation_w: int, group: int, group_channels: int,
          offset_scale: float, im2col_step: int = 256, remove_center: int = 0) -> Tensor:
    """DCNv3 sampling in the argument order of InternImage's ``DCNv3Function.apply``.

    input (N, H, W, C) channels-last with C = group * group_channels; offset (N, Ho, Wo, group*K*2) as (dx, dy)
    pairs per group and kernel point; mask (N, Ho, Wo, group*K), already normalised; K = kernel_h*kernel_w (minus
    the centre when ``remove_center``), points enumerated w-major. Returns (N, Ho, Wo, C): per group, the
    mask-weighted sum of bilinear samples (zeros outside the map) at the kernel points displaced by
    ``offset * offset_scale``. ``im2col_step`` only batches InternImage's CUDA work: an int >= 1, no effect here.
    """
    if not torch.jit.is_scripting():
        return eager_call(dcnv3, _dcnv3, (input, offset, mask, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w,
                                          dilation_h, dilation_w, group, group_channels, offset_scale, im2col_step,
                                          remove_center))
    return _dcnv3(input, offset, mask, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
                  group, group_channels, offset_scale, im2col_step, remove_center)


def _dcnv3(input: Tensor, offset: Tensor, mask: Tensor, kernel_h: int, kernel_w: int, stride_h: int, stride_w: int,
           pad_h: int, pad_w: int, dilation_h: int, dilation_w: int, group: int, group_channels: int,
           offset_scale: float, im2col_step: int, remove_center: int) -> Tensor:
    if not torch.jit.is_scripting():
        _check_eager("dcnv3", {"input": input, "offset": offset, "mask": mask},
                     (kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group,
                      group_channels), offset_scale, im2col_step, remove_center)
    if im2col_step < 1:
        raise ValueError("dcnv3: im2col_step: expected an int >= 1, got " + str(im2col_step))
    # Attributes and shapes are checked by the kernel's core (messages name the argument).
    return torch.ops.dcnkit.dcnv3(input, offset, mask, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w,
                                  dilation_h, dilation_w, group, group_channels, float(offset_scale),
                                  int(remove_center))


def dcnv4(value: Tensor, offset_mask: Tensor, kernel_h: int, kernel_w: int, stride_h: int, stride_w: int, pad_h: int,
          pad_w: int, dilation_h: int, dilation_w: int, group: int, group_channels: int, offset_scale: float,
          im2col_step: int = 256, remove_center: int = 0, softmax: bool = False) -> Tensor:
    """DCNv4 sampling: DCNv3's with offsets and weights in one tensor.

    value (N, H, W, C); offset_mask (N, Ho, Wo, Cp): per group 2K offsets (dx, dy per point) then K weights,
    Cp = group*3K rounded up to a multiple of 8 (the extra channels are ignored). The weights are used as given,
    or softmaxed over the K points of each group with ``softmax=True``. Returns (N, Ho, Wo, C).
    """
    if not torch.jit.is_scripting():
        return eager_call(dcnv4, _dcnv4, (value, offset_mask, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w,
                                          dilation_h, dilation_w, group, group_channels, offset_scale, im2col_step,
                                          remove_center, softmax))
    return _dcnv4(value, offset_mask, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
                  group, group_channels, offset_scale, im2col_step, remove_center, softmax)


def _dcnv4(value: Tensor, offset_mask: Tensor, kernel_h: int, kernel_w: int, stride_h: int, stride_w: int,
           pad_h: int, pad_w: int, dilation_h: int, dilation_w: int, group: int, group_channels: int,
           offset_scale: float, im2col_step: int, remove_center: int, softmax: bool) -> Tensor:
    if not torch.jit.is_scripting():
        _check_eager("dcnv4", {"value": value, "offset_mask": offset_mask},
                     (kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group,
                      group_channels), offset_scale, im2col_step, remove_center)
        if not isinstance(softmax, bool):
            raise ValueError(f"dcnv4: softmax: expected a bool, got {softmax!r}")
    if im2col_step < 1:
        raise ValueError("dcnv4: im2col_step: expected an int >= 1, got " + str(im2col_step))
    return torch.ops.dcnkit.dcnv4(value, offset_mask, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w,
                                  dilation_h, dilation_w, group, group_channels, float(offset_scale),
                                  int(remove_center), bool(softmax))


# torch.fx.symbolic_trace records a call as one node (an fx leaf).
torch.fx.wrap("dcnv3")
torch.fx.wrap("dcnv4")


def _out_shape(x, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w):
    torch._check(x.dim() == 4, lambda: "dcnv3: input: expected a 4-D tensor (N, H, W, C)")
    n, h, w, c = x.shape
    ho = (h + 2 * pad_h - (dilation_h * (kernel_h - 1) + 1)) // stride_h + 1
    wo = (w + 2 * pad_w - (dilation_w * (kernel_w - 1) + 1)) // stride_w + 1
    return (n, ho, wo, c)


@torch.library.register_fake("dcnkit::dcnv3")
def _dcnv3_fake(input, offset, mask, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
                group, group_channels, offset_scale, remove_center):
    return input.new_empty(_out_shape(input, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h,
                                      dilation_w))


@torch.library.register_fake("dcnkit::_dcnv3_backward")
def _dcnv3_backward_fake(grad_output, input, offset, mask, *attrs):
    return input.new_empty(input.shape), offset.new_empty(offset.shape), mask.new_empty(mask.shape)


@torch.library.register_fake("dcnkit::dcnv4")
def _dcnv4_fake(value, offset_mask, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
                group, group_channels, offset_scale, remove_center, softmax):
    return value.new_empty(_out_shape(value, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h,
                                      dilation_w))


@torch.library.register_fake("dcnkit::_dcnv4_backward")
def _dcnv4_backward_fake(grad_output, value, offset_mask, *attrs):
    return value.new_empty(value.shape), offset_mask.new_empty(offset_mask.shape)


def _setup_tensors(count):
    def setup(ctx, inputs, output):
        ctx.attrs = inputs[count:]
        ctx.save_for_backward(*inputs[:count])

    return setup


def _dcnv3_backward(ctx, grad_output):
    input, offset, mask = ctx.saved_tensors
    grads = (None, None, None)
    if any(ctx.needs_input_grad[:3]):
        grads = torch.ops.dcnkit._dcnv3_backward(grad_output, input, offset, mask, *ctx.attrs)
    return tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad[:3])) + (None,) * 12


def _dcnv4_backward(ctx, grad_output):
    value, offset_mask = ctx.saved_tensors
    grads = (None, None)
    if any(ctx.needs_input_grad[:2]):
        grads = torch.ops.dcnkit._dcnv4_backward(grad_output, value, offset_mask, *ctx.attrs)
    return tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad[:2])) + (None,) * 13


torch.library.register_autograd("dcnkit::dcnv3", _dcnv3_backward, setup_context=_setup_tensors(3))
torch.library.register_autograd("dcnkit::dcnv4", _dcnv4_backward, setup_context=_setup_tensors(2))
