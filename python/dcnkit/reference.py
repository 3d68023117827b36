"""Slow, obviously-correct NumPy references of the operators, written straight from docs/operators.md.

They compute in float64 with plain loops (vectorised only over whole feature maps, channels or a bin's samples),
share no code with the C++ core, and are what the tests, `dcnkit compare` and the Polygraphy reference runner
check every backend against. Forward only; gradients are checked with gradcheck.

The RoI operators (dcnkit._reference_roi) place their samples in the kernels' precision and visit only those of a
bin that can land on the map (dcnkit._reference_grid: the bounded work of docs/operators.md), so no box, however
large, makes them run long; their results are the full loop's.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from dcnkit import _reference_roi
from dcnkit._reference_roi import *  # noqa: F401,F403 - the RoI operators' references, re-exported
from dcnkit._reference_roi import _f64, _pair

__all__ = ["deform_conv2d", "sample_dcn", "sample_roi", "multi_scale_deformable_attn", *_reference_roi.__all__]


def _quiet(fn):
    """`fn` without NumPy's warnings on NaN / Inf arithmetic (the data may hold them; the results are IEEE's)."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    return wrapped


def sample_dcn(img: np.ndarray, py: np.ndarray, px: np.ndarray, m=1.0) -> np.ndarray:
    """S_dcn: corner sampling of the H x W map `img` at every (py, px) (arrays of one shape), times `m` (a mask:
    a scalar or an array of that shape) folded into each neighbour's weight, as the kernels fold it: a point off
    the map is 0 and a neighbour off the map adds nothing, whatever the mask."""
    H, W = img.shape
    py = np.asarray(py, dtype=np.float64)
    px = np.asarray(px, dtype=np.float64)
    m = np.broadcast_to(np.asarray(m, dtype=np.float64), py.shape)
    out = np.zeros(py.shape)
    with np.errstate(invalid="ignore"):
        valid = (py > -1) & (py < H) & (px > -1) & (px < W)  # NaN compares False: outside
    y, x, mv = py[valid], px[valid], m[valid]
    y0, x0 = np.floor(y), np.floor(x)
    ly, lx = y - y0, x - x0
    hy, ny = (1 - ly) * mv, ly * mv
    acc = np.zeros(y.shape)
    for dy, dx, w in ((0, 0, hy * (1 - lx)), (0, 1, hy * lx), (1, 0, ny * (1 - lx)), (1, 1, ny * lx)):
        yy, xx = y0 + dy, x0 + dx
        inside = (yy >= 0) & (yy <= H - 1) & (xx >= 0) & (xx <= W - 1)
        with np.errstate(invalid="ignore"):
            acc[inside] += w[inside] * img[yy[inside].astype(np.int64), xx[inside].astype(np.int64)]
    out[valid] = acc
    return out


def sample_roi(img: np.ndarray, y: float, x: float) -> np.ndarray:
    """S_roi: clamped sampling of `img` (C, H, W) at one point; returns the (C,) values."""
    C, H, W = img.shape
    if not (-1.0 <= y <= H and -1.0 <= x <= W):  # NaN fails: empty
        return np.zeros(C)
    y, x = max(y, 0.0), max(x, 0.0)
    y_low, x_low = int(math.floor(y)), int(math.floor(x))
    if y_low >= H - 1:
        y_low = y_high = H - 1
        y = float(y_low)
    else:
        y_high = y_low + 1
    if x_low >= W - 1:
        x_low = x_high = W - 1
        x = float(x_low)
    else:
        x_high = x_low + 1
    ly, lx = y - y_low, x - x_low
    hy, hx = 1.0 - ly, 1.0 - lx
    return (hy * hx * img[:, y_low, x_low] + hy * lx * img[:, y_low, x_high]
            + ly * hx * img[:, y_high, x_low] + ly * lx * img[:, y_high, x_high])


# --------------------------------------------------------------------------------------------------
# Operators


@_quiet
def deform_conv2d(x, offset, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), mask=None):
    """DeformConv2d (mask None) / modulated DeformConv2d, per docs/operators.md. Groups inferred from shapes."""
    x, offset, weight, bias, mask = map(_f64, (x, offset, weight, bias, mask))
    sh, sw = _pair(stride)
    ph, pw = _pair(padding)
    dh, dw = _pair(dilation)
    N, Cin, H, W = x.shape
    Cout, Cg, kh, kw = weight.shape
    Ho = (H + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    Wo = (W + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    if N * Cout * Ho * Wo <= 0:  # an empty output: no kernel point is visited (kh * kw may be huge)
        return np.zeros((N, Cout, max(Ho, 0), max(Wo, 0)))
    K = kh * kw
    groups = Cin // Cg
    Gd = offset.shape[1] // (2 * K)
    ho = np.arange(Ho, dtype=np.float64)[:, None]
    wo = np.arange(Wo, dtype=np.float64)[None, :]
    out = np.zeros((N, Cout, Ho, Wo))
    for n in range(N):
        cols = np.zeros((Cin, kh, kw, Ho, Wo))
        for ci in range(Cin):
            g = ci // (Cin // Gd)
            for i in range(kh):
                for j in range(kw):
                    k = i * kw + j
                    py = ho * sh - ph + i * dh + offset[n, g * 2 * K + 2 * k]
                    px = wo * sw - pw + j * dw + offset[n, g * 2 * K + 2 * k + 1]
                    m = mask[n, g * K + k] if mask is not None else 1.0
                    cols[ci, i, j] = sample_dcn(x[n, ci], py, px, m)
        for co in range(Cout):
            grp = co // (Cout // groups)
            out[n, co] = np.einsum("cij,cijhw->hw", weight[co], cols[grp * Cg:(grp + 1) * Cg])
            if bias is not None:
                out[n, co] += bias[co]
    return out


# --------------------------------------------------------------------------------------------------
# MultiScaleDeformableAttention


def _sample_zero(img: np.ndarray, py: float, px: float, weight=1.0) -> np.ndarray:
    """S_zero: bilinear sampling of `img` (H, W, D) at pixel (py, px) with zeros outside the map, pixel
    centres at integers (grid_sample's padding_mode='zeros'), times `weight` folded into each neighbour's weight (as
    the kernels fold it); returns the (D,) values. Each of the four neighbours counts when it lies in the map; a
    non-finite point samples as 0 (its weight is not read)."""
    H, W, D = img.shape
    if not (math.isfinite(py) and math.isfinite(px)) or not (-1.0 < py < H and -1.0 < px < W):
        return np.zeros(D)
    y0, x0 = math.floor(py), math.floor(px)
    ly, lx = py - y0, px - x0
    out = np.zeros(D)
    with np.errstate(invalid="ignore"):
        for yy, xx, w in ((y0, x0, (1 - ly) * (1 - lx)), (y0, x0 + 1, (1 - ly) * lx),
                          (y0 + 1, x0, ly * (1 - lx)), (y0 + 1, x0 + 1, ly * lx)):
            if 0 <= yy < H and 0 <= xx < W:
                out += (weight * w) * img[yy, xx]
    return out


@_quiet
def multi_scale_deformable_attn(value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
    """Multi-scale deformable attention (docs/operators.md): value (N, S, M, D), spatial_shapes (L, 2) rows
    (H_l, W_l), level_start_index (L), sampling_locations (N, Lq, M, L, P, 2) as (x, y) in [0, 1],
    attention_weights (N, Lq, M, L, P) -> (N, Lq, M*D). The level tables are checked as the CPU kernels check them
    (ValueError naming the entry): sizes >= 0, starts >= 0 with start + H*W <= S, and the sum of H*W equal to S."""
    value = _f64(value)
    shapes = np.asarray(spatial_shapes, dtype=np.int64)
    starts = np.asarray(level_start_index, dtype=np.int64)
    loc = _f64(sampling_locations)
    attn = _f64(attention_weights)
    N, S, M, D = value.shape
    _, Lq, _, L, P, _ = loc.shape
    if N * Lq * M * D == 0:  # no work, and nothing checked (as in the kernels)
        return np.zeros((N, Lq, M * D))
    areas = [int(shapes[l, 0]) * int(shapes[l, 1]) for l in range(L)]  # Python ints: no overflow
    for l in range(L):
        H, W, start = int(shapes[l, 0]), int(shapes[l, 1]), int(starts[l])
        if H < 0 or W < 0:
            raise ValueError(f"spatial_shapes[{l}]: expected sizes (H, W) >= 0, got ({H}, {W})")
        if start < 0 or start + areas[l] > S:
            raise ValueError(f"level_start_index[{l}]: expected a start >= 0 with start + H*W <= S = {S}, got {start} "
                             f"(H, W = {H}, {W})")
    if sum(areas) != S:
        raise ValueError(f"spatial_shapes: expected sum of H*W equal to S = {S} (value's dim 1), got {sum(areas)}")
    out = np.zeros((N, Lq, M, D))
    for l in range(L):
        H, W, start = int(shapes[l, 0]), int(shapes[l, 1]), int(starts[l])
        if H == 0 or W == 0:
            continue
        for n in range(N):
            for m in range(M):
                img = value[n, start:start + H * W, m].reshape(H, W, D)
                for q in range(Lq):
                    for p in range(P):
                        x, y = loc[n, q, m, l, p]
                        px, py = x * W - 0.5, y * H - 0.5
                        if -1.0 < py < H and -1.0 < px < W:  # else nothing (its weight is not read)
                            out[n, q, m] += _sample_zero(img, py, px, attn[n, q, m, l, p])
    return out.reshape(N, Lq, M * D)


__all__ += ["dcnv3", "dcnv4"]


def _dcnv3_points(kernel_h, kernel_w, remove_center):
    """The kernel points (i_h, i_w) in the order of the offsets: w-major, the centre left out on request."""
    pts = [(i_h, i_w) for i_w in range(kernel_w) for i_h in range(kernel_h)]
    if remove_center:
        pts.pop((kernel_h * kernel_w - 1) // 2)
    return pts


@_quiet
def dcnv3(x, offset, mask, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group,
          group_channels, offset_scale, remove_center=0):
    """DCNv3 (docs/operators.md): x (N, H, W, C), offset (N, Ho, Wo, G*K*2) as [g][k][dx, dy], mask (N, Ho, Wo, G*K)
    -> (N, Ho, Wo, C). Point k = (i_h, i_w) samples group g's channels at
    x = wo*sw - pw + cw + (i_w*dw - cw + dx) * s, y likewise (cw = (dw*(kw-1))//2), bilinear with zeros outside."""
    x, offset, mask = _f64(x), _f64(offset), _f64(mask)
    N, H, W, C = x.shape
    Ho = (H + 2 * pad_h - (dilation_h * (kernel_h - 1) + 1)) // stride_h + 1
    Wo = (W + 2 * pad_w - (dilation_w * (kernel_w - 1) + 1)) // stride_w + 1
    if N * Ho * Wo * C <= 0:  # an empty output: no kernel point is visited (kernel_h * kernel_w may be huge)
        return np.zeros((N, max(Ho, 0), max(Wo, 0), C))
    pts = _dcnv3_points(kernel_h, kernel_w, remove_center)
    K, gc = len(pts), group_channels
    ch, cw = (dilation_h * (kernel_h - 1)) // 2, (dilation_w * (kernel_w - 1)) // 2
    off = offset.reshape(N, Ho, Wo, group, K, 2)
    m = mask.reshape(N, Ho, Wo, group, K)
    out = np.zeros((N, Ho, Wo, group, gc))
    for n in range(N):
        for g in range(group):
            img = x[n, :, :, g * gc:(g + 1) * gc]
            for ho in range(Ho):
                for wo in range(Wo):
                    for k, (i_h, i_w) in enumerate(pts):
                        px = wo * stride_w - pad_w + cw + (i_w * dilation_w - cw + off[n, ho, wo, g, k, 0]) * offset_scale
                        py = ho * stride_h - pad_h + ch + (i_h * dilation_h - ch + off[n, ho, wo, g, k, 1]) * offset_scale
                        if -1.0 < py < H and -1.0 < px < W:
                            out[n, ho, wo, g] += _sample_zero(img, py, px, m[n, ho, wo, g, k])
    return out.reshape(N, Ho, Wo, C)


@_quiet
def dcnv4(value, offset_mask, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group,
          group_channels, offset_scale, remove_center=0, softmax=False):
    """DCNv4 (docs/operators.md): DCNv3 with offsets and weights in one tensor offset_mask (N, Ho, Wo, Cp): per group
    2K offsets [k][dx, dy] then K weights (softmax over them when `softmax`), Cp = G*3K rounded up to 8."""
    om = _f64(offset_mask)
    N, Ho, Wo, _ = om.shape
    K = kernel_h * kernel_w - (1 if remove_center else 0)
    per_group = om[..., :group * 3 * K].reshape(N, Ho, Wo, group, 3 * K)
    offset = per_group[..., :2 * K].reshape(N, Ho, Wo, group * 2 * K)
    mask = per_group[..., 2 * K:]
    if softmax:
        e = np.exp(mask - mask.max(-1, keepdims=True))
        mask = e / e.sum(-1, keepdims=True)
    return dcnv3(value, offset, mask.reshape(N, Ho, Wo, group * K), kernel_h, kernel_w, stride_h, stride_w, pad_h,
                 pad_w, dilation_h, dilation_w, group, group_channels, offset_scale, remove_center)
