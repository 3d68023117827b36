"""``DCNv3`` (InternImage) and ``DCNv4`` (FlashInternImage) layers over :func:`dcnkit.ops.dcnv3` /
:func:`dcnkit.ops.dcnv4`, with the constructor arguments (and defaults), parameter names and shapes and sub-module
defaults of the published modules, so their checkpoints load with ``strict=True`` and compute the same output.

``DCNv3``: input (N, H, W, C) channels-last; a depthwise conv + norm + activation predicts the offsets (``offset``)
and the per-group softmaxed weights (``mask``) from the input; the value is ``input_proj(input)``; the result goes
through ``output_proj``. ``DCNv4``: input (N, L, C) with ``shape=(H, W)`` (square when omitted); one linear layer
``offset_mask`` predicts offsets and weights together (no softmax), ``value_proj`` / ``output_proj`` around the op.

Both predict the offsets at the input's resolution, so the sampling keeps it: every argument is checked when the
layer is built (docs/operators.md, "The layers against InternImage, DCNv4 and mmcv").
"""
from __future__ import annotations

import functools
import math
import numbers
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from dcnkit.ops.dcnv3 import dcnv3, dcnv4

__all__ = ["DCNv3", "DCNv4"]

# InternImage's build_norm_layer(..., 'LN') builds nn.LayerNorm(dim, eps=1e-6); 'BN' a default nn.BatchNorm2d.
_LN_EPS = 1e-6


class UnsupportedLayerError(ValueError, NotImplementedError):
    """An unknown norm_layer / act_layer name: a ValueError (the kit's rule for a bad argument) that is also the
    NotImplementedError InternImage's build_norm_layer / build_act_layer raise."""


class _ToChannelsLast(nn.Module):
    def forward(self, x):
        return x.permute(0, 2, 3, 1)


def _norm(channels: int, norm_layer: str) -> nn.Module:
    """InternImage's build_norm_layer(channels, norm_layer, 'channels_first', 'channels_last') (same children and
    defaults, so the same state-dict keys and output): LN -> (to channels-last, LayerNorm(eps=1e-6));
    BN -> (BatchNorm2d, to channels-last)."""
    if norm_layer == "LN":
        return nn.Sequential(_ToChannelsLast(), nn.LayerNorm(channels, eps=_LN_EPS))
    return nn.Sequential(nn.BatchNorm2d(channels), _ToChannelsLast())


# InternImage's build_act_layer: ReLU and SiLU in place, GELU exact (approximate='none').
_ACTS = {"GELU": nn.GELU, "ReLU": functools.partial(nn.ReLU, inplace=True),
         "SiLU": functools.partial(nn.SiLU, inplace=True)}
_NORMS = ("LN", "BN")


def _check_int(cls: str, name: str, v, minimum: int) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum:
        raise ValueError(f"{cls}: {name}: expected an int >= {minimum}, got {v!r}")
    return int(v)


def _check_flag(cls: str, name: str, v) -> bool:
    if v not in (0, 1):  # True / False, or InternImage's int(remove_center)
        raise ValueError(f"{cls}: {name}: expected a bool, got {v!r}")
    return bool(v)


def _check_geometry(cls: str, channels, group, kernel_size, stride, pad, dilation, offset_scale, dw_kernel_size,
                    remove_center) -> int:
    """The checks the two layers share; returns group_channels. The layer predicts its offsets at the input's
    resolution, so the op's output must have it: stride 1 and 2 * pad = dilation * (kernel_size - 1)."""
    channels = _check_int(cls, "channels", channels, 1)
    group = _check_int(cls, "group", group, 1)
    if channels % group:
        raise ValueError(f"{cls}: group: expected an int >= 1 dividing channels = {channels}, got {group!r}")
    k = _check_int(cls, "kernel_size", kernel_size, 1)
    if _check_flag(cls, "remove_center", remove_center) and k % 2 == 0:
        # InternImage: "remove_center is only compatible with odd kernel size."
        raise ValueError(f"{cls}: remove_center: expected False with an even kernel_size = {k} (only an odd "
                         f"kernel has a centre point), got {remove_center!r}")
    _check_int(cls, "stride", stride, 1)
    _check_int(cls, "pad", pad, 0)
    d = _check_int(cls, "dilation", dilation, 1)
    if stride != 1:
        raise ValueError(f"{cls}: stride: expected 1 (the offsets are predicted at the input's resolution, so the "
                         f"output must keep it), got {stride!r}")
    if 2 * pad != d * (k - 1):
        raise ValueError(f"{cls}: pad: expected dilation * (kernel_size - 1) / 2 = {d * (k - 1) / 2:g} (the output "
                         f"keeps the input's size), got {pad!r}")
    if isinstance(offset_scale, bool) or not isinstance(offset_scale, numbers.Real) \
            or not math.isfinite(offset_scale):
        raise ValueError(f"{cls}: offset_scale: expected a finite number, got {offset_scale!r}")
    if dw_kernel_size is not None and (_check_int(cls, "dw_kernel_size", dw_kernel_size, 1) % 2 == 0):
        raise ValueError(f"{cls}: dw_kernel_size: expected an odd int (the depthwise conv keeps the map's size; "
                         f"DCNv3 uses kernel_size when it is None), got {dw_kernel_size!r}")
    return channels // group


def _check_layers(cls: str, act_layer, norm_layer) -> None:
    if norm_layer not in _NORMS:
        raise UnsupportedLayerError(f"{cls}: norm_layer: expected 'LN' or 'BN', got {norm_layer!r}")
    if act_layer not in _ACTS:
        raise UnsupportedLayerError(f"{cls}: act_layer: expected one of {sorted(_ACTS)}, got {act_layer!r}")


class _CenterFeatureScaleModule(nn.Module):
    """The published layers' center_feature_scale_module: a per-group sigmoid gate (no parameters of its own)."""

    def forward(self, query, weight, bias):
        return F.linear(query, weight, bias).sigmoid()


def _add_center_feature_scale(owner: nn.Module, group: int, channels: int) -> None:
    owner.center_feature_scale_proj_weight = nn.Parameter(torch.zeros(group, channels))
    owner.center_feature_scale_proj_bias = nn.Parameter(torch.zeros(group))
    owner.center_feature_scale_module = _CenterFeatureScaleModule()


def _center_feature_scale(layer, query, x, x_proj):
    """x * (1 - s) + x_proj * s with s the gate of `query`, repeated over each group's channels."""
    scale = layer.center_feature_scale_module(query, layer.center_feature_scale_proj_weight,
                                              layer.center_feature_scale_proj_bias)
    scale = scale[..., None].repeat(*([1] * scale.dim()), layer.channels // layer.group).flatten(-2)
    return x * (1 - scale) + x_proj * scale


class DCNv3(nn.Module):
    """InternImage's ``DCNv3`` layer (``ops_dcnv3/modules/dcnv3.py``): same arguments, defaults, parameters and
    sub-modules (LayerNorm eps 1e-6, in-place ReLU / SiLU, exact GELU)."""

    def __init__(self, channels: int = 64, kernel_size: int = 3, dw_kernel_size: int | None = None, stride: int = 1,
                 pad: int = 1, dilation: int = 1, group: int = 4, offset_scale: float = 1.0, act_layer: str = "GELU",
                 norm_layer: str = "LN", center_feature_scale: bool = False, remove_center: bool = False):
        super().__init__()
        dw_kernel_size = kernel_size if dw_kernel_size is None else dw_kernel_size
        self.group_channels = _check_geometry("DCNv3", channels, group, kernel_size, stride, pad, dilation,
                                              offset_scale, dw_kernel_size, remove_center)
        _check_layers("DCNv3", act_layer, norm_layer)
        if self.group_channels & (self.group_channels - 1):
            warnings.warn(f"DCNv3: channels / group = {self.group_channels} is not a power of 2 (InternImage's CUDA "
                          "kernel is most efficient with one); the result is the same")
        self.channels, self.kernel_size, self.dw_kernel_size = channels, kernel_size, dw_kernel_size
        self.stride, self.pad, self.dilation, self.group = stride, pad, dilation, group
        self.offset_scale = offset_scale
        self.center_feature_scale = _check_flag("DCNv3", "center_feature_scale", center_feature_scale)
        self.remove_center = int(remove_center)
        points = kernel_size * kernel_size - self.remove_center
        self.dw_conv = nn.Sequential(
            nn.Conv2d(channels, channels, dw_kernel_size, stride=1, padding=(dw_kernel_size - 1) // 2,
                      groups=channels),
            _norm(channels, norm_layer), _ACTS[act_layer]())
        self.offset = nn.Linear(channels, group * points * 2)
        self.mask = nn.Linear(channels, group * points)
        self.input_proj = nn.Linear(channels, channels)
        self.output_proj = nn.Linear(channels, channels)
        self._reset_parameters()
        if self.center_feature_scale:
            _add_center_feature_scale(self, group, channels)

    def _reset_parameters(self):
        for lin in (self.offset, self.mask):
            nn.init.constant_(lin.weight, 0.0)
            nn.init.constant_(lin.bias, 0.0)
        for lin in (self.input_proj, self.output_proj):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.constant_(lin.bias, 0.0)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """input (N, H, W, C) -> (N, H, W, C)."""
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
            x = _center_feature_scale(self, x1, x, x_proj)  # InternImage: the gate of the dw_conv features
        return self.output_proj(x)


# What InternImage-style blocks pass to any core op (DCNv3's arguments); the DCNv4 package ignores them.
_DCNV4_IGNORED = ("act_layer", "norm_layer")


class DCNv4(nn.Module):
    """The DCNv4 package's ``DCNv4`` layer (``DCNv4/modules/dcnv4.py``): same arguments, defaults and parameters.

    ``act_layer`` / ``norm_layer`` (which InternImage-style blocks pass to their core op) are accepted and unused,
    as in the package; any other keyword is a TypeError (the package's ``**kwargs`` would swallow a misspelling).
    """

    def __init__(self, channels: int = 64, kernel_size: int = 3, stride: int = 1, pad: int = 1, dilation: int = 1,
                 group: int = 4, offset_scale: float = 1.0, dw_kernel_size: int | None = None,
                 center_feature_scale: bool = False, remove_center: bool = False, output_bias: bool = True,
                 without_pointwise: bool = False, **kwargs):
        super().__init__()
        unknown = sorted(set(kwargs) - set(_DCNV4_IGNORED))
        if unknown:
            raise TypeError(f"DCNv4: unexpected keyword argument(s) {', '.join(map(repr, unknown))} (accepted and "
                            f"unused, as in the DCNv4 package: {', '.join(_DCNV4_IGNORED)})")
        self.group_channels = _check_geometry("DCNv4", channels, group, kernel_size, stride, pad, dilation,
                                              offset_scale, dw_kernel_size, remove_center)
        self.channels, self.kernel_size, self.dw_kernel_size = channels, kernel_size, dw_kernel_size
        self.stride, self.pad, self.dilation, self.group = stride, pad, dilation, group
        self.offset_scale = offset_scale
        self.center_feature_scale = _check_flag("DCNv4", "center_feature_scale", center_feature_scale)
        self.remove_center = int(remove_center)
        self.without_pointwise = _check_flag("DCNv4", "without_pointwise", without_pointwise)
        output_bias = _check_flag("DCNv4", "output_bias", output_bias)
        self.K = group * (kernel_size * kernel_size - self.remove_center)
        if dw_kernel_size is not None:
            self.offset_mask_dw = nn.Conv2d(channels, channels, dw_kernel_size, stride=1,
                                            padding=(dw_kernel_size - 1) // 2, groups=channels)
        self.offset_mask = nn.Linear(channels, int(math.ceil((self.K * 3) / 8) * 8))
        if not without_pointwise:
            self.value_proj = nn.Linear(channels, channels)
            self.output_proj = nn.Linear(channels, channels, bias=output_bias)
        self._reset_parameters()
        if self.center_feature_scale:
            _add_center_feature_scale(self, group, channels)

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
            x = _center_feature_scale(self, x, x, x_proj)  # the DCNv4 package: the gate of the sampled output
        x = x.reshape(n, -1, x.shape[-1])
        return x if self.without_pointwise else self.output_proj(x)
