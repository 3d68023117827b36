"""One small model per operator family for the OpenVINO tests: each a thin module over a ``dcnkit.ops`` function whose
data tensors (offsets, RoIs, locations) are graph inputs, so that the tests feed border-heavy values; and the inputs,
with Inf / NaN in the corners of every map where the operator samples bilinearly."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from dcnkit import ops

INF, NAN = float("inf"), float("nan")


def poison_corners(x: np.ndarray, h_dim: int, w_dim: int) -> np.ndarray:
    """x with +Inf, NaN, -Inf, NaN in the four corners of every map (dims h_dim, w_dim)."""
    x = x.copy()
    for v, (cy, cx) in zip((INF, NAN, -INF, NAN), ((0, 0), (0, -1), (-1, 0), (-1, -1))):
        idx = [slice(None)] * x.ndim
        idx[h_dim], idx[w_dim] = cy, cx
        x[tuple(idx)] = v
    return x


def border_offsets(rng, shape, scale=1.0) -> np.ndarray:
    """Offsets whose taps straddle the map's border: whole pixels in [-2, 2] plus fractions away from 0 and 1."""
    whole = rng.integers(-2, 3, shape)
    return ((whole + 0.15 + 0.7 * rng.random(shape)) * scale).astype(np.float32)


def rois(rng, k, n, h, w, scale=1.0, margin=4.0) -> np.ndarray:
    """(k, 5) rows [batch, x1, y1, x2, y2] in image coordinates (map size / scale), many across the border."""
    H, W = h / scale, w / scale
    xy = rng.uniform(-margin / scale, np.array([W, H]) + margin / scale, (k, 2))
    wh = rng.uniform(0.3, np.array([W, H]) * 0.8, (k, 2))
    b = rng.integers(0, n, (k, 1))
    return np.concatenate([b, xy, xy + wh], 1).astype(np.float32)


class DeformConv(nn.Module):
    def __init__(self, cin=4, cout=6, k=3, stride=1, padding=1, dilation=1, groups=1, dg=2, bias=True, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.weight = nn.Parameter(torch.randn(cout, cin // groups, k, k, generator=g))
        self.bias = nn.Parameter(torch.randn(cout, generator=g)) if bias else None
        self.stride, self.padding, self.dilation = stride, padding, dilation

    def forward(self, x, offset, mask):
        return ops.deform_conv2d(x, offset, self.weight, self.bias, self.stride, self.padding, self.dilation, mask)


class RoIAlign(nn.Module):
    def __init__(self, mode="avg", aligned=True, sampling_ratio=0, size=(3, 4), scale=0.5):
        super().__init__()
        self.kw = dict(output_size=size, spatial_scale=scale, sampling_ratio=sampling_ratio, aligned=aligned,
                       pool_mode=mode)

    def forward(self, x, rois):
        return ops.roi_align(x, rois, **self.kw)


class DeformRoIPool(nn.Module):
    def forward(self, x, rois, roi_offset):
        return ops.deform_roi_pool(x, rois, roi_offset, (3, 3), spatial_scale=0.5, sampling_ratio=2, gamma=0.1)


class DeformPSRoIPool(nn.Module):
    def __init__(self, output_size=3, group_size=3, output_dim=4, part_size=3):
        super().__init__()
        self.kw = dict(spatial_scale=0.5, output_size=output_size, output_dim=output_dim, group_size=group_size,
                       part_size=part_size, sample_per_part=2, trans_std=0.1)

    def forward(self, x, rois, roi_trans):
        return ops.deform_psroi_pool(x, rois, roi_trans, **self.kw)


class MultiLevel(nn.Module):
    def forward(self, rois, f0, f1, f2):
        return ops.multi_level_roi_align([f0, f1, f2], rois, (3, 3), [4.0, 8.0, 16.0], sampling_ratio=0,
                                         finest_scale=8, aligned=True)


class Msda(nn.Module):
    def __init__(self, sizes=((6, 5), (3, 4), (1, 2))):
        super().__init__()
        shapes = torch.tensor(sizes, dtype=torch.int64)
        areas = shapes[:, 0] * shapes[:, 1]
        self.register_buffer("shapes", shapes)
        self.register_buffer("starts", torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]]))

    def forward(self, value, loc, attn):
        return ops.multi_scale_deformable_attn(value, self.shapes, self.starts, loc, attn)


DCNV3_ATTRS = (3, 3, 1, 1, 1, 1, 1, 1, 2, 4, 1.0)  # kernel, stride, pad, dilation (h, w), group 2, gc 4, scale 1


class Dcnv3(nn.Module):
    def forward(self, x, offset, mask):
        return ops.dcnv3(x, offset, mask, *DCNV3_ATTRS)


class Dcnv4(nn.Module):
    def forward(self, x, offset_mask):
        return ops.dcnv4(x, offset_mask, *DCNV3_ATTRS, softmax=True)


def case(name: str, n: int = 2, seed: int = 0):
    """(module, input names, inputs as float32/int64 NumPy arrays) of family ``name`` with batch ``n``."""
    rng = np.random.default_rng(seed)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    if name == "deform_conv2d":
        x = poison_corners(r(n, 4, 9, 10), 2, 3)
        return DeformConv(), ["x", "offset", "mask"], [x, border_offsets(rng, (n, 36, 9, 10)),
                                                       rng.random((n, 18, 9, 10)).astype(np.float32)]
    if name in ("roi_align", "roi_align_max", "roi_align_unaligned"):
        mod = {"roi_align": RoIAlign(), "roi_align_max": RoIAlign("max"),
               "roi_align_unaligned": RoIAlign(aligned=False, sampling_ratio=2)}[name]
        return mod, ["x", "rois"], [poison_corners(r(n, 3, 12, 14), 2, 3), rois(rng, 17, n, 12, 14, 0.5)]
    if name == "deform_roi_pool":
        return DeformRoIPool(), ["x", "rois", "roi_offset"], [poison_corners(r(n, 3, 12, 14), 2, 3),
                                                              rois(rng, 13, n, 12, 14, 0.5), r(13, 2, 3, 3)]
    if name in ("deform_psroi_pool", "deform_psroi_pool_parts"):
        # output_size == group_size (the shape OpenVINO's own op, no longer used, could take) and 4 != 2
        mod = DeformPSRoIPool() if name == "deform_psroi_pool" else DeformPSRoIPool(4, 2, 4, 2)
        gs = 3 if name == "deform_psroi_pool" else 2  # part_size = group_size; trans: 2 classes
        return mod, ["x", "rois", "roi_trans"], [poison_corners(r(n, 4 * gs * gs, 11, 13), 2, 3),
                                                 rois(rng, 11, n, 11, 13, 0.5), r(11, 4, gs, gs)]
    if name == "multi_level_roi_align":
        feats = [poison_corners(r(n, 3, s, s + 1), 2, 3) for s in (16, 8, 4)]
        return MultiLevel(), ["rois", "f0", "f1", "f2"], [rois(rng, 19, n, 64, 68, 1.0, margin=8), *feats]
    if name == "multi_scale_deformable_attn":
        S = 6 * 5 + 3 * 4 + 1 * 2
        loc = (rng.random((n, 7, 3, 3, 2, 2)) * 1.4 - 0.2).astype(np.float32)
        return Msda(), ["value", "loc", "attn"], [r(n, S, 3, 4), loc, rng.random((n, 7, 3, 3, 2)).astype(np.float32)]
    if name == "dcnv3":
        x = poison_corners(r(n, 7, 6, 8), 1, 2)
        return Dcnv3(), ["x", "offset", "mask"], [x, border_offsets(rng, (n, 7, 6, 2 * 9 * 2)),
                                                  rng.random((n, 7, 6, 2 * 9)).astype(np.float32)]
    if name == "dcnv4":
        x = poison_corners(r(n, 7, 6, 8), 1, 2)
        return Dcnv4(), ["x", "offset_mask"], [x, border_offsets(rng, (n, 7, 6, 56))]
    raise KeyError(name)


FAMILIES = ("deform_conv2d", "roi_align", "roi_align_max", "roi_align_unaligned", "deform_roi_pool",
            "deform_psroi_pool", "deform_psroi_pool_parts", "multi_level_roi_align", "multi_scale_deformable_attn",
            "dcnv3", "dcnv4")


def eager(module, inputs) -> np.ndarray:
    with torch.no_grad():
        return module(*[torch.from_numpy(a) for a in inputs]).numpy()
