"""Deformable convolution (DCNv1 / DCNv2) as a ``torch.library`` operator: ``torch.ops.dcnkit.deform_conv2d``.

:func:`deform_conv2d` has exactly the signature and semantics of ``torchvision.ops.deform_conv2d``.
The op has a fake (meta) kernel and autograd registered here, so ``torch.compile(fullgraph=True)``,
``torch.export`` and ``torch.library.opcheck`` work.
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from dcnkit.ops import _loader  # noqa: F401  (loads libdcnkit_torch.so)
from dcnkit.ops._tracing import eager_call

__all__ = ["deform_conv2d"]

_IntPair = Union[int, Tuple[int, int]]


@torch.jit.unused
def _pair_eager(name: str, v) -> Tuple[int, int]:
    if isinstance(v, int) and not isinstance(v, bool):
        return (v, v)
    try:
        t = tuple(int(x) for x in v)
    except TypeError:
        raise ValueError(f"deform_conv2d: {name}: expected an int or a pair of ints, got {v!r}") from None
    if len(t) != 2:
        raise ValueError(f"deform_conv2d: {name}: expected an int or a pair of ints, got {v!r}")
    return t


def _pair(name: str, v: _IntPair) -> Tuple[int, int]:
    if not torch.jit.is_scripting():
        return _pair_eager(name, v)
    if isinstance(v, int):
        return (v, v)
    return v


def _raise_shape_error(arg: str, expected: str, t: Tensor) -> None:
    raise ValueError(f"deform_conv2d: {arg}: expected {expected}, got shape {list(t.shape)}")


def deform_conv2d(
    input: Tensor,
    offset: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    stride: _IntPair = (1, 1),
    padding: _IntPair = (0, 0),
    dilation: _IntPair = (1, 1),
    mask: Optional[Tensor] = None,
) -> Tensor:
    """Deformable convolution v1 (``mask=None``) or v2 (modulated), as ``torchvision.ops.deform_conv2d``.

    Args:
        input: ``(N, Cin, H, W)``.
        offset: ``(N, 2*Gd*kh*kw, Ho, Wo)``: (dy, dx) per kernel point and deformable group.
        weight: ``(Cout, Cin/groups, kh, kw)``; ``groups = Cin // weight.shape[1]``.
        bias: ``(Cout)`` or None.
        stride, padding, dilation: int or (h, w).
        mask: ``(N, Gd*kh*kw, Ho, Wo)`` or None (DCNv1).

    Returns:
        ``(N, Cout, Ho, Wo)``.

    Scriptable (``torch.jit.script``), an fx leaf (``torch.fx``); CPU float16/bfloat16 compute in float32.
    """
    if not torch.jit.is_scripting():
        return eager_call(deform_conv2d, _deform_conv2d,
                          (input, offset, weight, bias, stride, padding, dilation, mask))
    return _deform_conv2d(input, offset, weight, bias, stride, padding, dilation, mask)


def _deform_conv2d(input: Tensor, offset: Tensor, weight: Tensor, bias: Optional[Tensor], stride: _IntPair,
                   padding: _IntPair, dilation: _IntPair, mask: Optional[Tensor]) -> Tensor:
    sh, sw = _pair("stride", stride)
    ph, pw = _pair("padding", padding)
    dh, dw = _pair("dilation", dilation)
    if input.dim() != 4:
        _raise_shape_error("input", "a 4-D tensor (N, Cin, H, W)", input)
    if weight.dim() != 4:
        _raise_shape_error("weight", "a 4-D tensor (Cout, Cin/groups, kh, kw)", weight)
    if offset.dim() != 4:
        _raise_shape_error("offset", "a 4-D tensor (N, 2*deformable_groups*kh*kw, Ho, Wo)", offset)
    cin = input.shape[1]
    cin_g = weight.shape[1]
    kh, kw = weight.shape[2], weight.shape[3]
    if cin_g < 1 or cin % cin_g != 0:
        raise ValueError(
            f"deform_conv2d: weight: expected in-channels (dim 1) dividing the input channels {cin}, "
            f"got {cin_g} (shape {list(weight.shape)})"
        )
    groups = cin // cin_g
    k2 = 2 * kh * kw
    if k2 < 2 or offset.shape[1] % k2 != 0 or offset.shape[1] == 0:
        raise ValueError(
            f"deform_conv2d: offset: expected channels (dim 1) a positive multiple of 2*kh*kw = {k2}, "
            f"got {offset.shape[1]} (shape {list(offset.shape)})"
        )
    deformable_groups = offset.shape[1] // k2
    if mask is not None and mask.dim() != 4:
        _raise_shape_error("mask", "a 4-D tensor (N, deformable_groups*kh*kw, Ho, Wo)", mask)
    if bias is not None and bias.dim() != 1:
        _raise_shape_error("bias", "a 1-D tensor (Cout)", bias)
    return torch.ops.dcnkit.deform_conv2d(
        input, offset, weight, bias, mask, sh, sw, ph, pw, dh, dw, groups, deformable_groups
    )


# torch.fx.symbolic_trace records calls to deform_conv2d as one node (an fx leaf), as torchvision's
# roi_align; see _tracing.eager_call for the calls this name does not reach.
torch.fx.wrap("deform_conv2d")


# ---- fake kernels ------------------------------------------------------------------------------


def _out_size(n, k, s, p, d):
    return (n + 2 * p - (d * (k - 1) + 1)) // s + 1


@torch.library.register_fake("dcnkit::deform_conv2d")
def _deform_conv2d_fake(input, offset, weight, bias, mask, stride_h, stride_w, pad_h, pad_w,
                        dilation_h, dilation_w, groups, deformable_groups):
    torch._check(input.dim() == 4, lambda: "deform_conv2d: input: expected a 4-D tensor")
    torch._check(weight.dim() == 4, lambda: "deform_conv2d: weight: expected a 4-D tensor")
    torch._check(offset.dim() == 4, lambda: "deform_conv2d: offset: expected a 4-D tensor")
    n = input.shape[0]
    cout = weight.shape[0]
    ho = _out_size(input.shape[2], weight.shape[2], stride_h, pad_h, dilation_h)
    wo = _out_size(input.shape[3], weight.shape[3], stride_w, pad_w, dilation_w)
    return input.new_empty((n, cout, ho, wo))


@torch.library.register_fake("dcnkit::_deform_conv2d_backward")
def _deform_conv2d_backward_fake(grad_output, input, offset, weight, bias, mask, stride_h, stride_w,
                                 pad_h, pad_w, dilation_h, dilation_w, groups, deformable_groups):
    grad_bias = torch.empty_like(bias) if bias is not None else input.new_empty((0,))
    grad_mask = torch.empty_like(mask) if mask is not None else input.new_empty((0,))
    return (torch.empty_like(input), torch.empty_like(offset), torch.empty_like(weight), grad_bias,
            grad_mask)


# ---- autograd ----------------------------------------------------------------------------------


def _setup_context(ctx, inputs, output):
    (input, offset, weight, bias, mask, *attrs) = inputs
    ctx.attrs = tuple(attrs)
    ctx.has_bias = bias is not None
    ctx.has_mask = mask is not None
    ctx.save_for_backward(input, offset, weight, bias, mask)


def _backward(ctx, grad_output):
    input, offset, weight, bias, mask = ctx.saved_tensors
    gi, go, gw, gb, gm = torch.ops.dcnkit._deform_conv2d_backward(
        grad_output, input, offset, weight, bias, mask, *ctx.attrs
    )
    return (gi, go, gw, gb if ctx.has_bias else None, gm if ctx.has_mask else None) + (None,) * len(ctx.attrs)


torch.library.register_autograd("dcnkit::deform_conv2d", _backward, setup_context=_setup_context)
