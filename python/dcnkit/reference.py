"""Slow, obviously-correct NumPy references of the operators, written straight from docs/operators.md.

They compute in float64 with plain loops (vectorised only over whole feature maps or channels), share no
code with the C++ core, and are what the tests, `dcnkit compare` and the Polygraphy reference runner
check every backend against. Forward only; gradients are checked with gradcheck.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["deform_conv2d", "roi_align", "deform_roi_pool", "deform_psroi_pool", "multi_level_roi_align",
           "sample_dcn", "sample_roi"]
__all__ += ["multi_scale_deformable_attn", "roi_align_rotated"]


def _pair(v) -> tuple[int, int]:
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"expected an int or a pair, got {v!r}")
        return int(v[0]), int(v[1])
    return int(v), int(v)


def _f64(a):
    return None if a is None else np.asarray(a, dtype=np.float64)


# --------------------------------------------------------------------------------------------------
# Sampling rules


def sample_dcn(img: np.ndarray, py: np.ndarray, px: np.ndarray) -> np.ndarray:
    """S_dcn: corner sampling of the H x W map `img` at every (py, px) (arrays of one shape)."""
    H, W = img.shape
    py = np.asarray(py, dtype=np.float64)
    px = np.asarray(px, dtype=np.float64)
    out = np.zeros(py.shape)
    with np.errstate(invalid="ignore"):
        valid = (py > -1) & (py < H) & (px > -1) & (px < W)  # NaN compares False: outside
    y, x = py[valid], px[valid]
    y0, x0 = np.floor(y), np.floor(x)
    ly, lx = y - y0, x - x0
    acc = np.zeros(y.shape)
    for dy, dx, w in ((0, 0, (1 - ly) * (1 - lx)), (0, 1, (1 - ly) * lx), (1, 0, ly * (1 - lx)), (1, 1, ly * lx)):
        yy, xx = y0 + dy, x0 + dx
        inside = (yy >= 0) & (yy <= H - 1) & (xx >= 0) & (xx <= W - 1)
        v = np.zeros(y.shape)
        v[inside] = img[yy[inside].astype(np.int64), xx[inside].astype(np.int64)]
        acc += w * v
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


def _sample_psroi(img: np.ndarray, h: float, w: float):
    """R-FCN sampling of the (H, W) map `img`: None when skipped, else the interpolated value."""
    H, W = img.shape
    if not (-0.5 <= w <= W - 0.5 and -0.5 <= h <= H - 0.5):
        return None
    h = min(max(h, 0.0), H - 1.0)
    w = min(max(w, 0.0), W - 1.0)
    y1, y2 = int(math.floor(h)), int(math.ceil(h))
    x1, x2 = int(math.floor(w)), int(math.ceil(w))
    dy, dx = h - y1, w - x1
    return ((1 - dy) * (1 - dx) * img[y1, x1] + (1 - dy) * dx * img[y1, x2]
            + dy * (1 - dx) * img[y2, x1] + dy * dx * img[y2, x2])


def _batch_index(rois: np.ndarray, k: int, n: int) -> int:
    b = rois[k, 0]
    if not (0 <= b < n):
        raise ValueError(f"rois: expected batch indices in [0, {n}), got {b} in row {k}")
    return int(b)


def _c_round(v: float) -> float:
    """C's round(): halves away from zero."""
    return math.copysign(math.floor(abs(v) + 0.5), v)


# --------------------------------------------------------------------------------------------------
# Operators


def deform_conv2d(x, offset, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), mask=None):
    """DeformConv2d (mask None) / modulated DeformConv2d, per docs/operators.md. Groups inferred from shapes."""
    x, offset, weight, bias, mask = map(_f64, (x, offset, weight, bias, mask))
    sh, sw = _pair(stride)
    ph, pw = _pair(padding)
    dh, dw = _pair(dilation)
    N, Cin, H, W = x.shape
    Cout, Cg, kh, kw = weight.shape
    K = kh * kw
    groups = Cin // Cg
    Gd = offset.shape[1] // (2 * K)
    Ho = (H + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    Wo = (W + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
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
                    cols[ci, i, j] = m * sample_dcn(x[n, ci], py, px)
        for co in range(Cout):
            grp = co // (Cout // groups)
            out[n, co] = np.einsum("cij,cijhw->hw", weight[co], cols[grp * Cg:(grp + 1) * Cg])
            if bias is not None:
                out[n, co] += bias[co]
    return out


def roi_align(x, rois, output_size, spatial_scale=1.0, sampling_ratio=0, aligned=False, pool_mode="avg"):
    """RoIAlign (avg | max), per docs/operators.md. rois (K, 5) rows [batch_index, x1, y1, x2, y2]."""
    if pool_mode not in ("avg", "max"):
        raise ValueError(f"pool_mode: expected 'avg' or 'max', got {pool_mode!r}")
    x, rois = _f64(x), _f64(rois)
    oh, ow = _pair(output_size)
    N, C, H, W = x.shape
    out = np.zeros((rois.shape[0], C, oh, ow))
    o = 0.5 if aligned else 0.0
    for k in range(rois.shape[0]):
        b = _batch_index(rois, k, N)
        x_start, y_start = rois[k, 1] * spatial_scale - o, rois[k, 2] * spatial_scale - o
        roi_w = rois[k, 3] * spatial_scale - o - x_start
        roi_h = rois[k, 4] * spatial_scale - o - y_start
        if not aligned:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / oh, roi_w / ow
        gh = sampling_ratio if sampling_ratio > 0 else int(math.ceil(roi_h / oh))
        gw = sampling_ratio if sampling_ratio > 0 else int(math.ceil(roi_w / ow))
        gh, gw = max(gh, 0), max(gw, 0)
        for p in range(oh):
            for q in range(ow):
                samples = [sample_roi(x[b], y_start + p * bin_h + (iy + 0.5) * bin_h / gh,
                                      x_start + q * bin_w + (ix + 0.5) * bin_w / gw)
                           for iy in range(gh) for ix in range(gw)]
                if not samples:
                    continue
                stack = np.stack(samples)
                out[k, :, p, q] = stack.mean(axis=0) if pool_mode == "avg" else stack.max(axis=0)
    return out


def roi_align_rotated(x, rois, output_size, spatial_scale=1.0, sampling_ratio=0, aligned=True, clockwise=False):
    """RoIAlignRotated (mmcv's), per docs/operators.md. rois (K, 6) rows [batch_index, cx, cy, w, h, angle], the
    angle in radians (counter-clockwise in image space unless `clockwise`)."""
    x, rois = _f64(x), _f64(rois)
    oh, ow = _pair(output_size)
    N, C, H, W = x.shape
    out = np.zeros((rois.shape[0], C, oh, ow))
    o = 0.5 if aligned else 0.0
    for k in range(rois.shape[0]):
        b = _batch_index(rois, k, N)
        cx, cy = rois[k, 1] * spatial_scale - o, rois[k, 2] * spatial_scale - o
        roi_w, roi_h = rois[k, 3] * spatial_scale, rois[k, 4] * spatial_scale
        theta = -rois[k, 5] if clockwise else rois[k, 5]
        if not aligned:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / oh, roi_w / ow
        gh = sampling_ratio if sampling_ratio > 0 else int(math.ceil(roi_h / oh))
        gw = sampling_ratio if sampling_ratio > 0 else int(math.ceil(roi_w / ow))
        gh, gw = max(gh, 0), max(gw, 0)
        cos, sin = math.cos(theta), math.sin(theta)
        for p in range(oh):
            for q in range(ow):
                acc = np.zeros(C)
                for iy in range(gh):
                    yy = -roi_h / 2 + p * bin_h + (iy + 0.5) * bin_h / gh
                    for ix in range(gw):
                        xx = -roi_w / 2 + q * bin_w + (ix + 0.5) * bin_w / gw
                        acc += sample_roi(x[b], yy * cos - xx * sin + cy, yy * sin + xx * cos + cx)
                out[k, :, p, q] = acc / max(gh * gw, 1)
    return out


def multi_level_roi_align(features, rois, output_size, featmap_strides, sampling_ratio=0, finest_scale=56,
                          roi_scale_factor=1.0, aligned=True, pool_mode="avg"):
    """MultiLevelRoIAlign, per docs/operators.md: per RoI the level clamp(floor(log2(sqrt(w * h) / finest_scale + 1e-6)),
    0, L-1) of the box as given (NaN: 0), the box rescaled about its centre to half sizes (w + 1) * f / 2 - 0.5
    when f = roi_scale_factor > 0, then :func:`roi_align` on that level with spatial_scale 1 / stride."""
    features, rois = [_f64(f) for f in features], _f64(rois)
    if len(features) < 1 or len(featmap_strides) != len(features):
        raise ValueError(f"featmap_strides: expected one stride per feature map ({len(features)}), "
                         f"got {list(featmap_strides)}")
    oh, ow = _pair(output_size)
    out = np.zeros((rois.shape[0], features[0].shape[1], oh, ow))
    for k in range(rois.shape[0]):
        x1, y1, x2, y2 = rois[k, 1:]
        with np.errstate(invalid="ignore", divide="ignore"):
            v = math.floor(math.log2(math.sqrt((x2 - x1) * (y2 - y1)) / finest_scale + 1e-6)) \
                if (x2 - x1) * (y2 - y1) >= 0 else float("nan")
        level = 0 if not v > 0 else min(int(v), len(features) - 1)
        box = rois[k].copy()
        if roi_scale_factor > 0:
            cx, cy = (x1 + x2) * 0.5, (y1 + y2) * 0.5
            hw = (x2 - x1 + 1) * roi_scale_factor * 0.5 - 0.5
            hh = (y2 - y1 + 1) * roi_scale_factor * 0.5 - 0.5
            box[1:] = [cx - hw, cy - hh, cx + hw, cy + hh]
        out[k] = roi_align(features[level], box[None], (oh, ow), 1.0 / featmap_strides[level], sampling_ratio,
                           aligned, pool_mode)[0]
    return out


def deform_roi_pool(x, rois, offset, output_size, spatial_scale=1.0, sampling_ratio=0, gamma=0.1):
    """DeformRoIPool (mmcv semantics), per docs/operators.md. offset (K, 2, oh, ow) or None."""
    x, rois, offset = _f64(x), _f64(rois), _f64(offset)
    oh, ow = _pair(output_size)
    N, C, H, W = x.shape
    out = np.zeros((rois.shape[0], C, oh, ow))
    for k in range(rois.shape[0]):
        b = _batch_index(rois, k, N)
        x_start, y_start = rois[k, 1] * spatial_scale - 0.5, rois[k, 2] * spatial_scale - 0.5
        roi_w = rois[k, 3] * spatial_scale - 0.5 - x_start
        roi_h = rois[k, 4] * spatial_scale - 0.5 - y_start
        bin_h, bin_w = roi_h / oh, roi_w / ow
        gh = sampling_ratio if sampling_ratio > 0 else int(math.ceil(roi_h / oh))
        gw = sampling_ratio if sampling_ratio > 0 else int(math.ceil(roi_w / ow))
        gh, gw = max(gh, 0), max(gw, 0)
        for p in range(oh):
            for q in range(ow):
                sx, sy = x_start + q * bin_w, y_start + p * bin_h
                if offset is not None:
                    sx += gamma * roi_w * offset[k, 0, p, q]
                    sy += gamma * roi_h * offset[k, 1, p, q]
                samples = [sample_roi(x[b], sy + (iy + 0.5) * bin_h / gh, sx + (ix + 0.5) * bin_w / gw)
                           for iy in range(gh) for ix in range(gw)]
                if samples:
                    out[k, :, p, q] = np.stack(samples).mean(axis=0)
    return out


def deform_psroi_pool(x, rois, trans, spatial_scale, output_size, output_dim, group_size=1, part_size=None,
                      sample_per_part=4, trans_std=0.0):
    """DeformPSRoIPool (R-FCN), per docs/operators.md. trans None means no_trans. Returns (output, count)."""
    x, rois, trans = _f64(x), _f64(rois), _f64(trans)
    P = int(output_size)
    part_size = P if part_size is None or part_size <= 0 else int(part_size)
    N, C, H, W = x.shape
    K = rois.shape[0]
    num_classes = trans.shape[1] // 2 if trans is not None else 1
    per_class = output_dim // num_classes
    out = np.zeros((K, output_dim, P, P))
    count = np.zeros((K, output_dim, P, P))
    for k in range(K):
        b = _batch_index(rois, k, N)
        x_start = _c_round(rois[k, 1]) * spatial_scale - 0.5
        y_start = _c_round(rois[k, 2]) * spatial_scale - 0.5
        x_end = (_c_round(rois[k, 3]) + 1.0) * spatial_scale - 0.5
        y_end = (_c_round(rois[k, 4]) + 1.0) * spatial_scale - 0.5
        roi_w, roi_h = max(x_end - x_start, 0.1), max(y_end - y_start, 0.1)
        bin_w, bin_h = roi_w / P, roi_h / P
        sub_w, sub_h = bin_w / sample_per_part, bin_h / sample_per_part
        for ctop in range(output_dim):
            class_id = ctop // per_class
            for p in range(P):
                for q in range(P):
                    # floor(p / P * part_size), computed exactly in integers
                    part_h, part_w = (p * part_size) // P, (q * part_size) // P
                    tx = ty = 0.0
                    if trans is not None:
                        tx = trans[k, 2 * class_id, part_h, part_w] * trans_std
                        ty = trans[k, 2 * class_id + 1, part_h, part_w] * trans_std
                    w0 = q * bin_w + x_start + tx * roi_w
                    h0 = p * bin_h + y_start + ty * roi_h
                    gw = min(max((q * group_size) // P, 0), group_size - 1)
                    gh = min(max((p * group_size) // P, 0), group_size - 1)
                    c = (ctop * group_size + gh) * group_size + gw
                    total, cnt = 0.0, 0
                    for ih in range(sample_per_part):
                        for iw in range(sample_per_part):
                            v = _sample_psroi(x[b, c], h0 + ih * sub_h, w0 + iw * sub_w)
                            if v is not None:
                                total += v
                                cnt += 1
                    out[k, ctop, p, q] = total / cnt if cnt else 0.0
                    count[k, ctop, p, q] = cnt
    return out, count


# --------------------------------------------------------------------------------------------------
# MultiScaleDeformableAttention


def _sample_zero(img: np.ndarray, py: float, px: float) -> np.ndarray:
    """S_zero: bilinear sampling of `img` (H, W, D) at pixel (py, px) with zeros outside the map, pixel
    centres at integers (grid_sample's padding_mode='zeros'); returns the (D,) values. Each of the four
    neighbours counts when it lies in the map; a non-finite point samples as 0."""
    H, W, D = img.shape
    if not (math.isfinite(py) and math.isfinite(px)) or not (-1.0 < py < H and -1.0 < px < W):
        return np.zeros(D)
    y0, x0 = math.floor(py), math.floor(px)
    ly, lx = py - y0, px - x0
    out = np.zeros(D)
    for yy, xx, w in ((y0, x0, (1 - ly) * (1 - lx)), (y0, x0 + 1, (1 - ly) * lx),
                      (y0 + 1, x0, ly * (1 - lx)), (y0 + 1, x0 + 1, ly * lx)):
        if 0 <= yy < H and 0 <= xx < W:
            out += w * img[yy, xx]
    return out


def multi_scale_deformable_attn(value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
    """Multi-scale deformable attention (docs/operators.md): value (N, S, M, D), spatial_shapes (L, 2) rows
    (H_l, W_l), level_start_index (L), sampling_locations (N, Lq, M, L, P, 2) as (x, y) in [0, 1],
    attention_weights (N, Lq, M, L, P) -> (N, Lq, M*D). A level whose rows are not inside value samples 0."""
    value = _f64(value)
    shapes = np.asarray(spatial_shapes, dtype=np.int64)
    starts = np.asarray(level_start_index, dtype=np.int64)
    loc = _f64(sampling_locations)
    attn = _f64(attention_weights)
    N, S, M, D = value.shape
    _, Lq, _, L, P, _ = loc.shape
    out = np.zeros((N, Lq, M, D))
    for l in range(L):
        H, W, start = int(shapes[l, 0]), int(shapes[l, 1]), int(starts[l])
        if H <= 0 or W <= 0 or start < 0 or start + H * W > S:
            continue
        for n in range(N):
            for m in range(M):
                img = value[n, start:start + H * W, m].reshape(H, W, D)
                for q in range(Lq):
                    for p in range(P):
                        x, y = loc[n, q, m, l, p]
                        px, py = x * W - 0.5, y * H - 0.5
                        if -1.0 < py < H and -1.0 < px < W:  # else nothing (its weight is not read)
                            out[n, q, m] += attn[n, q, m, l, p] * _sample_zero(img, py, px)
    return out.reshape(N, Lq, M * D)


__all__ += ["dcnv3", "dcnv4"]


def _dcnv3_points(kernel_h, kernel_w, remove_center):
    """The kernel points (i_h, i_w) in the order of the offsets: w-major, the centre left out on request."""
    pts = [(i_h, i_w) for i_w in range(kernel_w) for i_h in range(kernel_h)]
    if remove_center:
        pts.pop((kernel_h * kernel_w - 1) // 2)
    return pts


def dcnv3(x, offset, mask, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group,
          group_channels, offset_scale, remove_center=0):
    """DCNv3 (docs/operators.md): x (N, H, W, C), offset (N, Ho, Wo, G*K*2) as [g][k][dx, dy], mask (N, Ho, Wo, G*K)
    -> (N, Ho, Wo, C). Point k = (i_h, i_w) samples group g's channels at
    x = wo*sw - pw + cw + (i_w*dw - cw + dx) * s, y likewise (cw = (dw*(kw-1))//2), bilinear with zeros outside."""
    x, offset, mask = _f64(x), _f64(offset), _f64(mask)
    N, H, W, C = x.shape
    pts = _dcnv3_points(kernel_h, kernel_w, remove_center)
    K, gc = len(pts), group_channels
    Ho = (H + 2 * pad_h - (dilation_h * (kernel_h - 1) + 1)) // stride_h + 1
    Wo = (W + 2 * pad_w - (dilation_w * (kernel_w - 1) + 1)) // stride_w + 1
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
                            out[n, ho, wo, g] += m[n, ho, wo, g, k] * _sample_zero(img, py, px)
    return out.reshape(N, Ho, Wo, C)


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
