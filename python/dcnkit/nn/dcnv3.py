"""``DCNv3`` (InternImage) and ``DCNv4`` (FlashInternImage) layers over :func:`dcnkit.ops.dcnv3` /
:func:`dcnkit.ops.dcnv4`, with the constructor arguments, parameter names and shapes of the published modules, so
their checkpoints load with ``strict=True``.

``DCNv3``: input (N, H, W, C) channels-last; a depthwise conv + norm + activation predicts the offsets (``offset``)
and the per-group softmaxed weights (``mask``) from the input; the value is ``input_proj(input)``; the result goes
through ``output_proj``. ``DCNv4``: input (N, L, C) with ``shape=(H, W)`` (square when omitted); one linear layer
``offset_mask`` predicts offsets and weights together (no softmax), ``value_proj`` / ``output_proj`` around the op.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dcnkit.ops.dcnv3 import dcnv3, dcnv4

__all__ = ["DCNv3", "DCNv4"]


class _ToChannelsLast(nn.Module):
    def forward(self, x):
        return x.permute(0, 2, 3, 1)


class _ToChannelsFirst(nn.Module):
    def forward(self, x):
        return x.permute(0, 3, 1, 2)


def _norm(channels: int, norm_layer: str) -> nn.Module:
    """InternImage's build_norm_layer(channels, norm_layer, 'channels_first', 'channels_last') (same children, so
    the same state-dict keys): LN -> (to channels-last, LayerNorm); BN -> (BatchNorm2d, to channels-last)."""
    if norm_layer == "LN":
        return nn.Sequential(_ToChannelsLast(), nn.LayerNorm(channels))
    if norm_layer == "BN":
        return nn.Sequential(nn.BatchNorm2d(channels), _ToChannelsLast())
    raise ValueError(f"DCNv3: norm_layer: expected 'LN' or 'BN', got {norm_layer!r}")


def _act(act_layer: str) -> nn.Module:
    layers = {"GELU": nn.GELU, "ReLU": nn.ReLU, "SiLU": nn.SiLU}
    if act_layer not in layers:
        raise ValueError(f"DCNv3: act_layer: expected one of {sorted(layers)}, got {act_layer!r}")
    return layers[act_layer]()


def _check_channels(cls: str, channels: int, group: int) -> int:
    if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1:
        raise ValueError(f"{cls}: channels: expected an int >= 1, got {channels!r}")
    if isinstance(group, bool) or not isinstance(group, int) or group < 1 or channels % group:
        raise ValueError(f"{cls}: group: expected an int >= 1 dividing channels = {channels}, got {group!r}")
    return channels // group


class _CenterFeatureScale(nn.Module):
    """InternImage's center_feature_scale: a per-group sigmoid gate between the sampled and the projected value."""

    def __init__(self, owner: nn.Module, group: int, channels: int):
        super().__init__()
        owner.center_feature_scale_proj_weight = nn.Parameter(torch.zeros(group, channels))
        owner.center_feature_scale_proj_bias = nn.Parameter(torch.zeros(group))


def _center_feature_scale(layer, query, x, x_proj):
    scale = F.linear(query, layer.center_feature_scale_proj_weight, layer.center_feature_scale_proj_bias).sigmoid()
    scale = scale[..., None].repeat(*([1] * scale.dim()), layer.channels // layer.group).flatten(-2)
    return x * (1 - scale) + x_proj * scale


class DCNv3(nn.Module):
    """InternImage's ``DCNv3`` layer (``ops_dcnv3/modules/dcnv3.py``): same arguments and parameters."""

    def __init__(self, channels: int = 64, kernel_size: int = 3, dw_kernel_size: int | None = None, stride: int = 1,
                 pad: int = 1, dilation: int = 1, group: int = 4, offset_scale: float = 1.0, act_layer: str = "GELU",
                 norm_layer: str = "LN", center_feature_scale: bool = False, remove_center: bool = False):
        super().__init__()
        self.group_channels = _check_channels("DCNv3", channels, group)
        dw_kernel_size = kernel_size if dw_kernel_size is None else dw_kernel_size
        self.channels, self.kernel_size, self.dw_kernel_size = channels, kernel_size, dw_kernel_size
        self.stride, self.pad, self.dilation, self.group = stride, pad, dilation, group
        self.offset_scale = offset_scale
        self.center_feature_scale = center_feature_scale
        self.remove_center = int(remove_center)
        points = kernel_size * kernel_size - self.remove_center
        self.dw_conv = nn.Sequential(
            nn.Conv2d(channels, channels, dw_kernel_size, stride=1, padding=(dw_kernel_size - 1) // 2,
                      groups=channels),
            _norm(channels, norm_layer), _act(act_layer))
        self.offset = nn.Linear(channels, group * points * 2)
        self.mask = nn.Linear(channels, group * points)
        self.input_proj = nn.Linear(channels, channels)
        self.output_proj = nn.Linear(channels, channels)
        self._reset_parameters()
        if center_feature_scale:
            _CenterFeatureScale(self, group, channels)

    def _reset_parameters(self):
        for lin in (self.offset, self.mask):
            nn.init.constant_(lin.weight, 0.0)
            nn.init.constant_(lin.bias, 0.0)
        for lin in (self.input_proj, self.output_proj):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.constant_(lin.bias, 0.0)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """input (N, H, W, C) -> (N, Ho, Wo, C)."""
        n, h, w, _ = input.shape
        x = self.input_proj(input)
        x_proj = x
        x1 = self.dw_conv(input.permute(0, 3, 1, 2))
        offset = self.offset(x1)
        mask = F.softmax(self.mask(x1).reshape(n, h, w, self.group, -1), -1).reshape(n, h, w, -1).type(x.dtype)
        x = dcnv3(x, offset, mask, self.kernel_size, self.kernel_size, self.stride, self.stride, self.pad, self.pad,
                  self.dilation, self.dilation, self.group, self.group_channels, self.offset_scale, 256,
                  self.remove_center)
        if self.center_feature_scale:
            x = _center_feature_scale(self, x1, x, x_proj)
        return self.output_proj(x)


class DCNv4(nn.Module):
    """The DCNv4 package's ``DCNv4`` layer (``DCNv4/modules/dcnv4.py``): same arguments and parameters."""

    def __init__(self, channels: int = 64, kernel_size: int = 3, stride: int = 1, pad: int = 1, dilation: int = 1,
                 group: int = 4, offset_scale: float = 1.0, dw_kernel_size: int | None = None,
                 center_feature_scale: bool = False, remove_center: bool = False, output_bias: bool = True,
                 without_pointwise: bool = False, **kwargs):
        super().__init__()
        self.group_channels = _check_channels("DCNv4", channels, group)
        self.channels, self.kernel_size, self.dw_kernel_size = channels, kernel_size, dw_kernel_size
        self.stride, self.pad, self.dilation, self.group = stride, pad, dilation, group
        self.offset_scale = offset_scale
        self.center_feature_scale = center_feature_scale
        self.remove_center = int(remove_center)
        self.without_pointwise = without_pointwise
        self.K = group * (kernel_size * kernel_size - self.remove_center)
        if dw_kernel_size is not None:
            self.offset_mask_dw = nn.Conv2d(channels, channels, dw_kernel_size, stride=1,
                                            padding=(dw_kernel_size - 1) // 2, groups=channels)
        self.offset_mask = nn.Linear(channels, int(math.ceil((self.K * 3) / 8) * 8))
        if not without_pointwise:
            self.value_proj = nn.Linear(channels, channels)
            self.output_proj = nn.Linear(channels, channels, bias=output_bias)
        self._reset_parameters()
        if center_feature_scale:
            _CenterFeatureScale(self, group, channels)

    def _reset_parameters(self):
        nn.init.constant_(self.offset_mask.weight, 0.0)
        nn.init.constant_(self.offset_mask.bias, 0.0)
        if not self.without_pointwise:
            for lin in (self.value_proj, self.output_proj):
                nn.init.xavier_uniform_(lin.weight)
                if lin.bias is not None:
                    nn.init.constant_(lin.bias, 0.0)

    def forward(self, input: torch.Tensor, shape: tuple[int, int] | None = None) -> torch.Tensor:
        """input (N, L, C) with L = H*W (``shape=(H, W)``; a square map when omitted) -> (N, L, C)."""
        n, length, c = input.shape
        h, w = shape if shape is not None else (int(length ** 0.5), int(length ** 0.5))
        if h * w != length:
            raise ValueError(f"DCNv4: shape: expected (H, W) with H*W = L = {length}, got {(h, w)}")
        x = input if self.without_pointwise else self.value_proj(input)
        x = x.reshape(n, h, w, -1)
        om_input = input
        if self.dw_kernel_size is not None:
            om_input = self.offset_mask_dw(input.reshape(n, h, w, c).permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        offset_mask = self.offset_mask(om_input).reshape(n, h, w, -1)
        x_proj = x
        x = dcnv4(x, offset_mask, self.kernel_size, self.kernel_size, self.stride, self.stride, self.pad, self.pad,
                  self.dilation, self.dilation, self.group, self.group_channels, self.offset_scale, 256,
                  self.remove_center)
        if self.center_feature_scale:
            x = _center_feature_scale(self, om_input.reshape(n, h, w, c), x, x_proj)
        x = x.reshape(n, -1, x.shape[-1])
        return x if self.without_pointwise else self.output_proj(x)
