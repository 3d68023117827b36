"""The RoI operators' NumPy references (re-exported by dcnkit.reference): RoIAlign, RoIAlignRotated,
MultiLevelRoIAlign, DeformRoIPool and DeformPSRoIPool, per docs/operators.md.

Box geometry and sample positions are computed in the kernels' precision and order of operations (float32 for
float32 and 16-bit data: dcnkit._reference_grid), everything after that in float64; each bin visits only the samples
that can land on the map (bounded work, the full loop's result). An empty output is returned without a look at the
RoIs, as the kernels do.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import math

import numpy as np

from dcnkit import _reference_grid as G

__all__ = ["roi_align", "roi_align_rotated", "multi_level_roi_align", "deform_roi_pool", "deform_psroi_pool"]

MAX_ROTATED_GRID = 2**31 - 1  # samples per bin and axis of roi_align_rotated at the most (mmcv's grid is an int)


def _pair(v) -> tuple[int, int]:
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"expected an int or a pair, got {v!r}")
        return int(v[0]), int(v[1])
    return int(v), int(v)


def _f64(a):
    return None if a is None else np.asarray(a, dtype=np.float64)


def _batch_index(rois: np.ndarray, k: int, n: int) -> int:
    b = float(rois[k, 0])
    if not (0 <= b < n):
        raise ValueError(f"rois: expected batch indices in [0, {n}), got {b} in row {k}")
    return int(b)


def _c_round(v) -> float:
    """C's round(): halves away from zero (NaN and infinities unchanged)."""
    return float(np.copysign(np.floor(np.abs(v) + 0.5), v))


# --------------------------------------------------------------------------------------------------
# RoIAlign, DeformRoIPool, MultiLevelRoIAlign


def _bin_axis(origin, bin_size, g: int, size: int, f: type):
    """The samples origin + (i + 0.5) * bin_size / g (computed in f) of one bin axis that land on [-1, size]:
    (indices, taps)."""
    gf = f(g)
    idx, pos = G.window(g, lambda i: origin + (i + f(0.5)) * bin_size / gf, -1.0, float(size), f)
    return idx, G.roi_taps(pos, size)


def _roi_bin(img, y0, x0, bin_h, bin_w, gh: int, gw: int, pool_mode: str, f: type):
    """One RoIAlign-style bin of `img` (C, H, W) whose first corner is (y0, x0): the mean (avg) or the largest (max)
    of its gh x gw samples."""
    C, H, W = img.shape
    if gh == 0 or gw == 0 or H == 0 or W == 0:  # no sample, or none on an empty map (each then counts 0)
        return np.zeros(C)
    iy, ty = _bin_axis(y0, bin_h, gh, H, f)
    ix, tx = _bin_axis(x0, bin_w, gw, W, f)
    if pool_mode == "avg":
        return G.tap_sum(img, ty, tx) / (float(gh) * float(gw))
    first = iy.size > 0 and ix.size > 0 and iy[0] == 0 and ix[0] == 0
    return G.tap_max(img, ty, tx, first, iy.size == gh and ix.size == gw)


def _roi_pool(x, rois, offset, oh: int, ow: int, spatial_scale, sampling_ratio: int, aligned: bool, pool_mode: str,
              gamma, f: type) -> np.ndarray:
    """RoIAlign of float64 maps `x` and RoIs `rois` (values of type f), the geometry in f; with `offset` (K, 2, oh, ow)
    the start of bin (p, q) moves by gamma * roi_w * offset[k, 0, p, q] in x (y alike): DeformRoIPool."""
    N, C, H, W = x.shape
    out = np.zeros((rois.shape[0], C, oh, ow))
    if out.size == 0:  # no work, and nothing checked (as in the kernels)
        return out
    s, o, gamma = f(spatial_scale), f(0.5) if aligned else f(0), f(gamma)
    for k in range(rois.shape[0]):
        b = _batch_index(rois, k, N)
        with np.errstate(all="ignore"):
            x_start, y_start = rois[k, 1] * s - o, rois[k, 2] * s - o
            roi_w = (rois[k, 3] * s - o) - x_start
            roi_h = (rois[k, 4] * s - o) - y_start
            if not aligned:  # at least a pixel (NaN stays NaN)
                roi_w, roi_h = (f(1) if roi_w < 1 else roi_w), (f(1) if roi_h < 1 else roi_h)
            bin_h, bin_w = roi_h / f(oh), roi_w / f(ow)
            gh, gw = G.grid_size(roi_h, oh, sampling_ratio, f), G.grid_size(roi_w, ow, sampling_ratio, f)
            for p in range(oh):
                for q in range(ow):
                    xs, ys = x_start, y_start
                    if offset is not None:
                        xs = xs + gamma * roi_w * offset[k, 0, p, q]
                        ys = ys + gamma * roi_h * offset[k, 1, p, q]
                    out[k, :, p, q] = _roi_bin(x[b], ys + f(p) * bin_h, xs + f(q) * bin_w, bin_h, bin_w, gh, gw,
                                               pool_mode, f)
    return out


def roi_align(x, rois, output_size, spatial_scale=1.0, sampling_ratio=0, aligned=False, pool_mode="avg"):
    """RoIAlign (avg | max), per docs/operators.md. rois (K, 5) rows [batch_index, x1, y1, x2, y2]."""
    if pool_mode not in ("avg", "max"):
        raise ValueError(f"pool_mode: expected 'avg' or 'max', got {pool_mode!r}")
    f = G.acc_type(x)
    oh, ow = _pair(output_size)
    return _roi_pool(_f64(x), np.asarray(rois).astype(f), None, oh, ow, spatial_scale, sampling_ratio, aligned,
                     pool_mode, 0.0, f)


def multi_level_roi_align(features, rois, output_size, featmap_strides, sampling_ratio=0, finest_scale=56,
                          roi_scale_factor=1.0, aligned=True, pool_mode="avg"):
    """MultiLevelRoIAlign, per docs/operators.md: per RoI the level clamp(floor(log2(sqrt(w * h) / finest_scale + 1e-6)),
    0, L-1) of the box as given (NaN: 0), the box rescaled about its centre to half sizes (w + 1) * f / 2 - 0.5
    when f = roi_scale_factor > 0 (and not 1), then RoIAlign on that level with spatial_scale 1 / stride."""
    if len(features) < 1 or len(featmap_strides) != len(features):
        raise ValueError(f"featmap_strides: expected one stride per feature map ({len(features)}), "
                         f"got {list(featmap_strides)}")
    f = G.acc_type(features[0])
    maps, rois = [_f64(m) for m in features], np.asarray(rois).astype(f)
    oh, ow = _pair(output_size)
    out = np.zeros((rois.shape[0], maps[0].shape[1], oh, ow))
    if out.size == 0:  # no work, and nothing checked (as in the kernels)
        return out
    factor = f(roi_scale_factor)
    for k in range(rois.shape[0]):
        box = rois[k].copy()
        x1, y1, x2, y2 = box[1:]
        with np.errstate(all="ignore"):
            v = np.floor(np.log2(np.sqrt((x2 - x1) * (y2 - y1)) / f(finest_scale) + f(1e-6)))
            level = 0 if not v > 0 else int(min(v, len(maps) - 1))  # NaN: 0, infinite: L - 1
            if factor > 0 and factor != 1:
                cx, cy = (x1 + x2) * f(0.5), (y1 + y2) * f(0.5)
                hw = (x2 - x1 + f(1)) * factor * f(0.5) - f(0.5)
                hh = (y2 - y1 + f(1)) * factor * f(0.5) - f(0.5)
                box[1:] = [cx - hw, cy - hh, cx + hw, cy + hh]
        out[k] = _roi_pool(maps[level], box[None], None, oh, ow, 1.0 / featmap_strides[level], sampling_ratio,
                           aligned, pool_mode, 0.0, f)[0]
    return out


def deform_roi_pool(x, rois, offset, output_size, spatial_scale=1.0, sampling_ratio=0, gamma=0.1):
    """DeformRoIPool (mmcv semantics), per docs/operators.md. offset (K, 2, oh, ow) or None."""
    f = G.acc_type(x)
    oh, ow = _pair(output_size)
    offset = None if offset is None else np.asarray(offset).astype(f)
    return _roi_pool(_f64(x), np.asarray(rois).astype(f), offset, oh, ow, spatial_scale, sampling_ratio, True, "avg",
                     gamma, f)


# --------------------------------------------------------------------------------------------------
# RoIAlignRotated


def _libm_sincos(f: type):
    """sin and cos as the kernels call them: the C library's sinf / cosf in float32 (NumPy's float32 sin may differ
    in the last bit), Python's math in float64."""
    if f is np.float64:
        return math.sin, math.cos
    try:
        libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        sinf, cosf = libm.sinf, libm.cosf
        for fn in (sinf, cosf):
            fn.argtypes, fn.restype = [ctypes.c_float], ctypes.c_float
        return (lambda t: f(sinf(float(t)))), (lambda t: f(cosf(float(t))))
    except (OSError, AttributeError):
        return (lambda t: f(np.sin(f(t)))), (lambda t: f(np.cos(f(t))))


def _rotated_axis(origin, bin_size, g: int, lo: float, hi: float, f: type):
    """The distinct positions origin + (i + 0.5) * bin_size / g (in f) of one frame axis of a rotated bin within
    [lo, hi], and how many samples sit on each."""
    gf = f(g)
    _, pos = G.window(g, lambda i: origin + (i + f(0.5)) * bin_size / gf, lo, hi, f)
    return np.unique(pos, return_counts=True)


def _rotated_bin(img, box, yy0, xx0, bin_h, bin_w, gh: int, gw: int, f: type):
    """The sum of the samples of one rotated bin on `img` (C, H, W): frame rows yy(iy) = yy0 + (iy + 0.5) * bin_h / gh,
    columns xx(ix) likewise, at y = yy cos - xx sin + cy, x = yy sin + xx cos + cx. Only the rows and columns whose
    frame coordinates can reach the map's rectangle [-1, H] x [-1, W] are visited, and samples that rounding puts
    on one point are taken once, times their number."""
    C, H, W = img.shape
    cy, cx, cos, sin = box
    if gh == 0 or gw == 0 or H == 0 or W == 0:
        return np.zeros(C)
    with np.errstate(all="ignore"):
        corners = np.array([[-1.0, -1.0], [-1.0, W], [H, -1.0], [H, W]]) - [float(cy), float(cx)]
        yy_map = corners[:, 0] * float(cos) + corners[:, 1] * float(sin)  # the map's corners in the box's frame
        xx_map = corners[:, 1] * float(cos) - corners[:, 0] * float(sin)
    if not (np.all(np.isfinite(yy_map)) and np.all(np.isfinite(xx_map))):
        return np.zeros(C)
    yy, ny = _rotated_axis(yy0, bin_h, gh, yy_map.min() - 1, yy_map.max() + 1, f)
    xx, nx = _rotated_axis(xx0, bin_w, gw, xx_map.min() - 1, xx_map.max() + 1, f)
    with np.errstate(all="ignore"):
        y = yy[:, None] * cos - xx[None, :] * sin + cy
        x = yy[:, None] * sin + xx[None, :] * cos + cx
        on = (y >= f(-1)) & (y <= f(H)) & (x >= f(-1)) & (x <= f(W))
    times = np.outer(ny, nx).astype(np.float64)
    return G.point_sum(img, y[on], x[on], times[on])


def roi_align_rotated(x, rois, output_size, spatial_scale=1.0, sampling_ratio=0, aligned=True, clockwise=False):
    """RoIAlignRotated (mmcv's), per docs/operators.md. rois (K, 6) rows [batch_index, cx, cy, w, h, angle], the
    angle in radians (counter-clockwise in image space unless `clockwise`)."""
    f = G.acc_type(x)
    x, rois = _f64(x), np.asarray(rois).astype(f)
    oh, ow = _pair(output_size)
    N, C, H, W = x.shape
    out = np.zeros((rois.shape[0], C, oh, ow))
    if out.size == 0:  # no work, and nothing checked (as in the kernels)
        return out
    s, o = f(spatial_scale), f(0.5) if aligned else f(0)
    sin_f, cos_f = _libm_sincos(f)
    for k in range(rois.shape[0]):
        b = _batch_index(rois, k, N)
        with np.errstate(all="ignore"):
            cx, cy = rois[k, 1] * s - o, rois[k, 2] * s - o
            w, h = rois[k, 3] * s, rois[k, 4] * s
            theta = -rois[k, 5] if clockwise else rois[k, 5]
            if not aligned:  # at least a pixel (NaN stays NaN)
                w, h = (f(1) if w < 1 else w), (f(1) if h < 1 else h)
            start_h, start_w = -h / f(2), -w / f(2)
            bin_h, bin_w = h / f(oh), w / f(ow)
            sin, cos = sin_f(theta), cos_f(theta)
            gh = min(G.grid_size(h, oh, sampling_ratio, f), MAX_ROTATED_GRID)
            gw = min(G.grid_size(w, ow, sampling_ratio, f), MAX_ROTATED_GRID)
            for p in range(oh):
                for q in range(ow):
                    total = _rotated_bin(x[b], (cy, cx, cos, sin), start_h + f(p) * bin_h, start_w + f(q) * bin_w,
                                         bin_h, bin_w, gh, gw, f)
                    out[k, :, p, q] = total / max(float(gh) * float(gw), 1.0)
    return out


# --------------------------------------------------------------------------------------------------
# DeformPSRoIPool


def deform_psroi_pool(x, rois, trans, spatial_scale, output_size, output_dim, group_size=1, part_size=None,
                      sample_per_part=4, trans_std=0.0):
    """DeformPSRoIPool (R-FCN), per docs/operators.md. trans None means no_trans. Returns (output, count)."""
    f = G.acc_type(x)
    x, rois = _f64(x), np.asarray(rois).astype(f)
    trans = None if trans is None else np.asarray(trans).astype(f)
    P = int(output_size)
    part_size = P if part_size is None or part_size <= 0 else int(part_size)
    N, C, H, W = x.shape
    K = rois.shape[0]
    num_classes = trans.shape[1] // 2 if trans is not None else 1
    per_class = output_dim // num_classes
    out = np.zeros((K, output_dim, P, P))
    count = np.zeros((K, output_dim, P, P))
    if out.size == 0:  # no work, and nothing checked (as in the kernels)
        return out, count
    s, half, std = f(spatial_scale), f(0.5), f(trans_std)
    steps = np.arange(sample_per_part).astype(f)
    for k in range(K):
        b = _batch_index(rois, k, N)
        with np.errstate(all="ignore"):
            x_start = f(_c_round(rois[k, 1])) * s - half
            y_start = f(_c_round(rois[k, 2])) * s - half
            x_end = (f(_c_round(rois[k, 3])) + f(1)) * s - half
            y_end = (f(_c_round(rois[k, 4])) + f(1)) * s - half
            roi_w, roi_h = x_end - x_start, y_end - y_start
            roi_w, roi_h = (f(0.1) if roi_w < f(0.1) else roi_w), (f(0.1) if roi_h < f(0.1) else roi_h)
            bin_w, bin_h = roi_w / f(P), roi_h / f(P)
            sub_w, sub_h = bin_w / f(sample_per_part), bin_h / f(sample_per_part)
        for class_id in range(num_classes):
            ctops = np.arange(class_id * per_class, (class_id + 1) * per_class)
            for p in range(P):
                for q in range(P):
                    # floor(p / P * part_size), computed exactly in integers
                    part_h, part_w = (p * part_size) // P, (q * part_size) // P
                    tx = ty = f(0)
                    with np.errstate(all="ignore"):
                        if trans is not None:
                            tx = trans[k, 2 * class_id, part_h, part_w] * std
                            ty = trans[k, 2 * class_id + 1, part_h, part_w] * std
                        w0 = f(q) * bin_w + x_start + tx * roi_w
                        h0 = f(p) * bin_h + y_start + ty * roi_h
                        hs, ws = h0 + steps * sub_h, w0 + steps * sub_w
                        hs = hs[(hs >= f(-0.5)) & (hs <= f(H) - half)]  # samples off the map are skipped
                        ws = ws[(ws >= f(-0.5)) & (ws <= f(W) - half)]
                    gw = min(max((q * group_size) // P, 0), group_size - 1)
                    gh = min(max((p * group_size) // P, 0), group_size - 1)
                    channels = (ctops * group_size + gh) * group_size + gw
                    cnt = hs.size * ws.size if H and W else 0
                    if cnt:
                        total = G.tap_sum(x[b, channels], G.psroi_taps(hs, H), G.psroi_taps(ws, W))
                        out[k, ctops, p, q] = total / cnt
                    count[k, ctops, p, q] = cnt
    return out, count
