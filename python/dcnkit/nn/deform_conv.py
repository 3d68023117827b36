"""Deformable convolution modules with mmcv 2.x constructor arguments and parameter names.

Checkpoints of mmcv / mmdetection (``DeformConv2d``, ``ModulatedDeformConv2d``, ``DeformConv2dPack``,
``ModulatedDeformConv2dPack``, a.k.a. DCN / DCNv2) load unchanged: same ``weight`` / ``bias`` /
``conv_offset`` names and shapes; the old ``conv_offset_mask`` / ``<name>_offset`` keys are renamed on load.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
import torch.nn as nn
from torch import Tensor
from torch.nn.modules.utils import _pair

from dcnkit.ops._tracing import eager_call
from dcnkit.ops.deform_conv import deform_conv2d

__all__ = ["DeformConv2d", "ModulatedDeformConv2d", "DeformConv2dPack", "ModulatedDeformConv2dPack"]

_Size = Union[int, Tuple[int, int]]


def _check_deform_groups(module: str, offset: Tensor, mask: Optional[Tensor], deform_groups: int,
                         kernel_size: Tuple[int, int]) -> None:
    """The offset (and mask) channels of a module's input agree with its own deform_groups (as mmcv's).

    An fx leaf like the ops (a node of the traced graph, checked when the GraphModule runs)."""
    if not torch.jit.is_scripting():
        eager_call(_check_deform_groups, _deform_groups_check, (module, offset, mask, deform_groups, kernel_size))
        return
    _deform_groups_check(module, offset, mask, deform_groups, kernel_size)


def _deform_groups_check(module: str, offset: Tensor, mask: Optional[Tensor], deform_groups: int,
                         kernel_size: Tuple[int, int]) -> None:
    k = kernel_size[0] * kernel_size[1]
    # Other shapes are the functional op's to report.
    if offset.dim() == 4 and offset.size(1) != 2 * deform_groups * k:
        raise ValueError(
            f"{module}: offset: expected {2 * deform_groups * k} channels (2 * deform_groups * kh * kw with "
            f"deform_groups = {deform_groups}, kernel {kernel_size[0]}x{kernel_size[1]}), got {offset.size(1)}")
    if mask is not None and mask.dim() == 4 and mask.size(1) != deform_groups * k:
        raise ValueError(
            f"{module}: mask: expected {deform_groups * k} channels (deform_groups * kh * kw with "
            f"deform_groups = {deform_groups}, kernel {kernel_size[0]}x{kernel_size[1]}), got {mask.size(1)}")


def _deform_groups(deform_groups: int, kwargs: dict) -> int:
    # mmcv accepts the deprecated spelling `deformable_groups`.
    if "deformable_groups" in kwargs:
        deform_groups = kwargs.pop("deformable_groups")
    if kwargs:
        raise TypeError(f"unexpected keyword arguments: {sorted(kwargs)}")
    return int(deform_groups)


class _DeformConvBase(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: _Size, stride: _Size,
                 padding: _Size, dilation: _Size, groups: int, deform_groups: int, bias: bool):
        super().__init__()
        if in_channels % groups != 0:
            raise ValueError(f"in_channels {in_channels} is not divisible by groups {groups}")
        if out_channels % groups != 0:
            raise ValueError(f"out_channels {out_channels} is not divisible by groups {groups}")
        if in_channels % deform_groups != 0:
            raise ValueError(f"in_channels {in_channels} is not divisible by deform_groups {deform_groups}")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride)
        self.padding = _pair(padding)
        self.dilation = _pair(dilation)
        self.groups = groups
        self.deform_groups = deform_groups
        # mmcv keeps these for compatibility with nn.Conv2d-like code.
        self.transposed = False
        self.output_padding = _pair(0)
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, *self.kernel_size))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)

    def _init_weight(self) -> None:
        n = self.in_channels
        for k in self.kernel_size:
            n *= k
        stdv = 1.0 / math.sqrt(n)
        with torch.no_grad():
            self.weight.uniform_(-stdv, stdv)
            if self.bias is not None:
                self.bias.zero_()

    def _conv(self, x: Tensor, offset: Tensor, mask: Optional[Tensor]) -> Tensor:
        return deform_conv2d(x, offset, self.weight, self.bias, self.stride, self.padding, self.dilation, mask)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
                f"groups={self.groups}, deform_groups={self.deform_groups}, bias={self.bias is not None}")


class DeformConv2d(_DeformConvBase):
    """DCNv1: ``forward(x, offset)`` with offset ``(N, 2*deform_groups*kh*kw, Ho, Wo)``.

    As mmcv's ``DeformConv2d``: parameter ``weight`` (no bias parameter unless ``bias=True``, which mmcv
    refuses and dcnkit supports). ``im2col_step`` is accepted for compatibility and unused (the CPU and
    CUDA kernels choose their own tiling).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: _Size, stride: _Size = 1,
                 padding: _Size = 0, dilation: _Size = 1, groups: int = 1, deform_groups: int = 1,
                 bias: bool = False, im2col_step: int = 32, **kwargs):
        deform_groups = _deform_groups(deform_groups, kwargs)
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
                         deform_groups, bias)
        self.im2col_step = im2col_step
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self._init_weight()

    def forward(self, x: Tensor, offset: Tensor) -> Tensor:
        _check_deform_groups("DeformConv2d", offset, None, self.deform_groups, self.kernel_size)
        return self._conv(x, offset, None)


class ModulatedDeformConv2d(_DeformConvBase):
    """DCNv2: ``forward(x, offset, mask)``; parameters ``weight`` and ``bias`` (as mmcv)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: _Size, stride: _Size = 1,
                 padding: _Size = 0, dilation: _Size = 1, groups: int = 1, deform_groups: int = 1,
                 bias: bool = True, **kwargs):
        deform_groups = _deform_groups(deform_groups, kwargs)
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
                         deform_groups, bias)
        self.init_weights()

    def init_weights(self) -> None:
        self._init_weight()

    def forward(self, x: Tensor, offset: Tensor, mask: Tensor) -> Tensor:
        _check_deform_groups("ModulatedDeformConv2d", offset, mask, self.deform_groups, self.kernel_size)
        return self._conv(x, offset, mask)


# torch.fx.symbolic_trace keeps these calls as single nodes (fx leaves).
torch.fx.wrap("deform_conv2d")
torch.fx.wrap("_check_deform_groups")


def _rename_old_offset_keys(state_dict: dict, prefix: str, old_names: Tuple[str, ...]) -> None:
    """Moves "<old>.weight" / "<old>.bias" to "<prefix>conv_offset.*" when the new keys are absent."""
    for suffix in ("weight", "bias"):
        new = f"{prefix}conv_offset.{suffix}"
        if new in state_dict:
            continue
        for old in old_names:
            key = f"{old}.{suffix}"
            if key in state_dict:
                state_dict[new] = state_dict.pop(key)
                break


class DeformConv2dPack(DeformConv2d):
    """DCNv1 that predicts its offsets: ``conv_offset`` (nn.Conv2d, 2*deform_groups*kh*kw outputs, same
    kernel/stride/padding/dilation), zero-initialised so that the layer starts as a regular convolution."""

    _version = 2

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.conv_offset = nn.Conv2d(
            self.in_channels, self.deform_groups * 2 * self.kernel_size[0] * self.kernel_size[1],
            kernel_size=self.kernel_size, stride=self.stride, padding=self.padding,
            dilation=self.dilation, bias=True)
        self.init_offset()

    def init_offset(self) -> None:
        with torch.no_grad():
            self.conv_offset.weight.zero_()
            self.conv_offset.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:  # type: ignore[override]
        return self._conv(x, self.conv_offset(x), None)


class ModulatedDeformConv2dPack(ModulatedDeformConv2d):
    """DCNv2 that predicts offsets and mask: ``conv_offset`` (3*deform_groups*kh*kw outputs), split as
    mmcv does: ``o1, o2, mask = chunk(out, 3, dim=1)``, ``offset = cat(o1, o2)``, ``mask = sigmoid(mask)``.
    Zero-initialised: the layer starts as a regular convolution with the weight halved (mask 0.5)."""

    _version = 2

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.conv_offset = nn.Conv2d(
            self.in_channels, self.deform_groups * 3 * self.kernel_size[0] * self.kernel_size[1],
            kernel_size=self.kernel_size, stride=self.stride, padding=self.padding,
            dilation=self.dilation, bias=True)
        self.init_weights()

    def init_weights(self) -> None:
        super().init_weights()
        if hasattr(self, "conv_offset"):
            with torch.no_grad():
                self.conv_offset.weight.zero_()
                self.conv_offset.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:  # type: ignore[override]
        out = self.conv_offset(x)
        o1, o2, mask = torch.chunk(out, 3, dim=1)
        offset = torch.cat((o1, o2), dim=1)
        return self._conv(x, offset, torch.sigmoid(mask))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        version = local_metadata.get("version", None)
        if version is None or version < 2:
            # Old mmcv / mmdetection checkpoints call the offset-and-mask conv "conv_offset_mask".
            _rename_old_offset_keys(state_dict, prefix, (prefix + "conv_offset_mask",))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
