"""Sample-by-sample references of RoIAlign and DeformRoIPool for the bounded-work tests.

Written independently of the kernels from docs/operators.md, in the data's own precision (NumPy float32 or float64
scalars, one rounding per operation, in the order docs/operators.md writes the formulas), summing the samples one by
one in loop order (iy outer, ix inner): results are bit-for-bit those of the full sampling loop.

``window=None`` visits every sample of the grid (feasible for small grids only). ``window=m`` visits, per
axis, only the indices whose exact coordinate is within ``m`` samples of the map's sampling region
[-1, H] (computed with Python floats), checking that the window's first and last indices sample outside
(so no sample inside was left out); outside samples add 0 to a sum and are 0 candidates of a max, of
which the window keeps one before and one after the inside indices.
"""
from __future__ import annotations

import math

import numpy as np


def _box(roi, s, aligned, oh, ow, sr, f):
    """RoIAlign geometry in precision f (np.float32 or np.float64)."""
    o = f(0.5) if aligned else f(0)
    x_start = f(roi[1]) * f(s) - o
    y_start = f(roi[2]) * f(s) - o
    roi_w = (f(roi[3]) * f(s) - o) - x_start
    roi_h = (f(roi[4]) * f(s) - o) - y_start
    if not aligned:
        roi_w = max(roi_w, f(1))
        roi_h = max(roi_h, f(1))
    bin_h, bin_w = roi_h / f(oh), roi_w / f(ow)

    def grid(extent, pooled):
        if sr > 0:
            return sr
        g = np.ceil(extent / f(pooled))
        return int(g) if (g > 0 and g < 2.0**62) else 0

    return dict(x_start=x_start, y_start=y_start, roi_w=roi_w, roi_h=roi_h, bin_h=bin_h, bin_w=bin_w,
                gh=grid(roi_h, oh), gw=grid(roi_w, ow))


def _taps(y, x, H, W, f):
    """S_roi's neighbours and weights at (y, x), or None outside."""
    if not (y >= f(-1) and y <= f(H) and x >= f(-1) and x <= f(W)) or H <= 0 or W <= 0:
        return None
    y = max(y, f(0))
    x = max(x, f(0))
    y0, x0 = int(np.floor(y)), int(np.floor(x))
    if y0 >= H - 1:
        y0 = y1 = H - 1
        y = f(y0)
    else:
        y1 = y0 + 1
    if x0 >= W - 1:
        x0 = x1 = W - 1
        x = f(x0)
    else:
        x1 = x0 + 1
    ly, lx = y - f(y0), x - f(x0)
    hy, hx = f(1) - ly, f(1) - lx
    # (row, column, weight, d weight / dy, d weight / dx): the bilinear form of the cell (docs/operators.md)
    return [(y0, x0, hy * hx, -hx, -hy), (y0, x1, hy * lx, -lx, hy), (y1, x0, ly * hx, hx, -ly),
            (y1, x1, ly * lx, lx, ly)]


def _axis(origin, bin_, g, edge, f, window):
    """(index, coordinate) of the samples of one axis to visit, plus whether samples were left out before
    and after them."""
    coord = lambda i: origin + (f(i) + f(0.5)) * bin_ / f(g)  # noqa: E731
    if window is None:
        return [(i, coord(i)) for i in range(g)], False, False
    o, b = float(origin), float(bin_)
    if b == 0:
        lo, hi = 0, g - 1
    else:
        a = (-1.0 - o) * g / b - 0.5
        c = (edge - o) * g / b - 0.5
        lo, hi = int(math.floor(min(a, c))) - window, int(math.ceil(max(a, c))) + window
        lo, hi = max(lo, 0), min(hi, g - 1)
    if lo > hi:
        return [], g > 0, False
    for i in (lo, hi):
        c_ = coord(i)
        if (lo > 0 and i == lo) or (hi < g - 1 and i == hi):
            assert not (c_ >= f(-1) and c_ <= f(edge)), "window too narrow"
    return [(i, coord(i)) for i in range(lo, hi + 1)], lo > 0, hi < g - 1


def _bin_samples(box, y0, x0, H, W, f, window):
    """The samples of one bin in loop order: taps lists, None for outside samples."""
    ys, y_before, y_after = _axis(y0, box["bin_h"], box["gh"], H, f, window)
    xs, x_before, x_after = _axis(x0, box["bin_w"], box["gw"], W, f, window)
    out = []
    if y_before:
        out.append(None)
    for _, y in ys:
        if x_before:
            out.append(None)
        out.extend(_taps(y, x, H, W, f) for _, x in xs)
        if x_after:
            out.append(None)
    if y_after:
        out.append(None)
    return out


def _reduce(img, samples, n, mode, f):
    C = img.shape[0]
    if n == 0:
        return np.zeros(C, dtype=f)
    best = None
    total = np.zeros(C, dtype=f)
    for t in samples:
        v = np.zeros(C, dtype=f)
        if t is not None:
            for (yy, xx, w, _, _) in t:
                v = v + w * img[:, yy, xx]
        if mode == "avg":
            total = total + v
        else:
            best = v if best is None else np.where(v > best, v, best)
    return total / f(n) if mode == "avg" else best


def _origin(box, ph, pw, off, gamma, f):
    ys, xs = box["y_start"], box["x_start"]
    if off is not None:
        xs = xs + f(gamma) * box["roi_w"] * f(off[0])
        ys = ys + f(gamma) * box["roi_h"] * f(off[1])
    return ys + f(ph) * box["bin_h"], xs + f(pw) * box["bin_w"]


def _pool(x, rois, offset, out, scale, sr, aligned, mode, gamma, window):
    x = np.asarray(x)
    f = x.dtype.type
    rois = np.asarray(rois, dtype=x.dtype)
    oh, ow = out
    N, C, H, W = x.shape
    y = np.zeros((rois.shape[0], C, oh, ow), dtype=x.dtype)
    grad_samples = []
    for k in range(rois.shape[0]):
        b = int(rois[k, 0])
        box = _box(rois[k], scale, aligned, oh, ow, sr, f)
        n = box["gh"] * box["gw"]
        for ph in range(oh):
            for pw in range(ow):
                off = None if offset is None else (offset[k, 0, ph, pw], offset[k, 1, ph, pw])
                y0, x0 = _origin(box, ph, pw, off, gamma, f)
                s = _bin_samples(box, y0, x0, H, W, f, window)
                y[k, :, ph, pw] = _reduce(x[b], s, n, mode, f)
                grad_samples.append((k, b, ph, pw, n, s))
    return y, grad_samples


def roi_align(x, rois, out, scale, sr, aligned, mode="avg", window=None):
    return _pool(x, rois, None, out, scale, sr, aligned, mode, 0.0, window)[0]


def deform_roi_pool(x, rois, offset, out, scale, sr, gamma, window=None):
    return _pool(x, rois, offset, out, scale, sr, True, "avg", gamma, window)[0]


def avg_input_grad(x, rois, offset, out, scale, sr, aligned, gamma, grad_out, window=None):
    """Gradient of an avg pool (RoIAlign avg, or DeformRoIPool when offset is given / aligned) with
    respect to x: g / n times each inside sample's weights (float64)."""
    _, bins = _pool(x, rois, offset, out, scale, sr, aligned, "avg", gamma, window)
    g = np.zeros(np.asarray(x).shape)
    for (k, b, ph, pw, n, samples) in bins:
        if n == 0:
            continue
        for t in samples:
            if t is None:
                continue
            for (yy, xx, w, _, _) in t:
                g[b, :, yy, xx] += float(w) * grad_out[k, :, ph, pw] / n
    return g


def deform_roi_pool_offset_grad(x, rois, offset, out, scale, sr, gamma, grad_out, window=None):
    """Gradient of DeformRoIPool with respect to offset (float64): per bin, gamma * roi_w (x) and
    gamma * roi_h (y) times the sum over channels of g times the mean over samples of dS/dx (dS/dy)."""
    x = np.asarray(x)
    _, bins = _pool(x, rois, offset, out, scale, sr, True, "avg", gamma, window)
    go = np.zeros(np.asarray(offset).shape)
    for (k, b, ph, pw, n, samples) in bins:
        if n == 0:
            continue
        sy = np.zeros(x.shape[1])
        sx = np.zeros(x.shape[1])
        for t in samples:
            if t is None:
                continue
            for (yy, xx, _, dy, dx) in t:
                sy += float(dy) * x[b, :, yy, xx]
                sx += float(dx) * x[b, :, yy, xx]
        box = _box(np.asarray(rois)[k], scale, True, out[0], out[1], sr, x.dtype.type)
        go[k, 0, ph, pw] = gamma * float(box["roi_w"]) * float((grad_out[k, :, ph, pw] * sx).sum()) / n
        go[k, 1, ph, pw] = gamma * float(box["roi_h"]) * float((grad_out[k, :, ph, pw] * sy).sum()) / n
    return go
