"""The RoI references' sampling grids with bounded work (docs/operators.md, "Bounded work"), for dcnkit.reference.

A bin's grid can hold about 10^17 samples (an adaptive grid of a huge box). A sample off the map reads 0, so only the
samples that can land on it matter: per axis (or per row of a rotated box) the indices whose position lies on the
map are found arithmetically (a window around the solution of the affine position's inequality, then every
position in it evaluated with the loop's own expression and kept where it is on the map), and the bin is reduced
over those, with the divisor of the full grid. Bilinear sampling is separable: a bin's sum is the sum, over the map
pixels the samples touch, of the pixel times its summed weights, so an axis of n samples costs O(n) and the bin
O(rows touched x columns touched).

NaN and Inf follow the per-sample loop: a sample reads its taps even with weight 0 (0 * Inf is NaN), a sum takes
every sample, and a max starts from the first sample of the loop and then keeps a larger one (a NaN first sample
gives NaN; a later NaN is never larger), each sample off the map counting 0.

Sample positions are computed in the kernels' precision and order (float32 for float32 and 16-bit data, float64 for
float64): for a box of 1e12 pixels float32 positions are 65536 pixels apart, and which samples land on the map is
decided by that rounding, in every backend. Weights and sums are float64.
"""
from __future__ import annotations

import math

import numpy as np

# Axes of at most this many samples are evaluated whole (explicit grids are at most 1024).
WHOLE_AXIS = 4096
# An adaptive grid of 2^62 samples or more per axis (or a non-finite one) is empty, as in the kernels.
MAX_GRID_SAMPLES = 2**31 - 1  # samples per bin and axis at the most
MAX_GRID = 2.0**62


def acc_type(x) -> type:
    """The precision the kernels place samples in for data ``x``: float64 for float64, else float32."""
    return np.float64 if np.asarray(x).dtype == np.float64 else np.float32


def grid_size(extent, pooled: int, sampling_ratio: int, f: type = np.float64) -> int:
    """Samples per bin along one axis: the fixed ratio, or ceil(extent / pooled) in precision ``f``, at most
    2^31 - 1 (the kernels' kMaxGridSamples: torchvision's and mmcv's grid size is an int); an adaptive grid whose
    size is not a positive finite number (below 2^62) is empty."""
    if sampling_ratio > 0:
        return int(sampling_ratio)
    with np.errstate(all="ignore"):
        g = np.ceil(f(extent) / f(pooled))
    return min(int(g), MAX_GRID_SAMPLES) if (g > 0 and g < MAX_GRID) else 0


def window(g: int, position, lo: float, hi: float, f: type = np.float64) -> tuple[np.ndarray, np.ndarray]:
    """(indices, positions) of the samples i < g whose ``position(i)`` lies in [lo, hi], in increasing index order.
    ``position`` maps an array of indices (of type ``f``) to positions computed in ``f``, as the kernels compute
    them; it is affine in i up to that rounding, which the window around the affine solution is widened by."""
    if g <= 0:
        return np.zeros(0, np.int64), np.zeros(0, f)
    if g <= WHOLE_AXIS:
        idx = np.arange(g, dtype=np.int64)
    else:
        p0, p1 = (np.float64(position(np.array([v], f))[0]) for v in (0, g - 1))
        with np.errstate(all="ignore"):
            slope = (p1 - p0) / (g - 1)
            err = 4 * float(np.finfo(f).eps) * max(abs(p0), abs(p1), abs(lo), abs(hi)) + 1.0
            ends = np.array([(lo - err - p0) / slope, (hi + err - p0) / slope])
        # A NaN box, or positions that rounding holds equal over more than WHOLE_AXIS samples (so far off the map): none
        if not (np.all(np.isfinite(ends)) and slope != 0):
            return np.zeros(0, np.int64), np.zeros(0, f)
        first = max(0, math.floor(ends.min()) - 2)
        last = min(g - 1, math.ceil(ends.max()) + 2)
        if first > last:
            return np.zeros(0, np.int64), np.zeros(0, f)
        idx = np.arange(first, last + 1, dtype=np.int64)
    with np.errstate(all="ignore"):
        pos = position(idx.astype(f))
        keep = (pos >= f(lo)) & (pos <= f(hi))  # NaN fails: off the map
    return idx[keep], pos[keep]


def roi_taps(pos: np.ndarray, size: int):
    """The RoI border rule's two taps along an axis of ``size`` pixels at positions in [-1, size]:
    (low index, high index, low weight, high weight)."""
    p = np.maximum(np.asarray(pos, np.float64), 0.0)
    lo = np.floor(p).astype(np.int64)
    clamp = lo >= size - 1
    lo = np.where(clamp, size - 1, lo)
    hi = np.where(clamp, size - 1, lo + 1)
    frac = np.where(clamp, 0.0, p - lo)
    return lo, hi, 1.0 - frac, frac


def psroi_taps(pos: np.ndarray, size: int):
    """R-FCN's two taps (floor and ceil of the position clamped to [0, size - 1]) at positions in
    [-0.5, size - 0.5]."""
    p = np.clip(np.asarray(pos, np.float64), 0.0, size - 1.0)
    lo = np.floor(p).astype(np.int64)
    frac = p - lo
    return lo, np.ceil(p).astype(np.int64), 1.0 - frac, frac


def _pixel_weights(taps, size: int):
    """Per pixel of an axis: the summed weight of the taps on it, whether a tap touches it, and whether one touches it
    with weight 0."""
    lo, hi, wlo, whi = taps
    weight = np.bincount(lo, wlo, size) + np.bincount(hi, whi, size)
    touched = (np.bincount(lo, minlength=size) + np.bincount(hi, minlength=size)) > 0
    zero = (np.bincount(lo[wlo == 0], minlength=size) + np.bincount(hi[whi == 0], minlength=size)) > 0
    return weight, touched, zero


def tap_sum(img: np.ndarray, ty, tx) -> np.ndarray:
    """The sum over every pair (row sample, column sample) of the bilinear value of ``img`` (C, H, W) at it, the taps of
    each axis from :func:`roi_taps` / :func:`psroi_taps`: (C,). A pixel read with weight 0 by some pair adds 0 * its
    value (NaN for an infinite one), as the sample's own sum does."""
    C, H, W = img.shape
    wy, ty_on, zy = _pixel_weights(ty, H)
    wx, tx_on, zx = _pixel_weights(tx, W)
    rows, cols = np.flatnonzero(ty_on), np.flatnonzero(tx_on)
    if rows.size == 0 or cols.size == 0:
        return np.zeros(C)
    v = img[:, rows][:, :, cols].astype(np.float64)
    coef = np.outer(wy[rows], wx[cols])
    zero = zy[rows][:, None] | zx[cols][None, :]
    with np.errstate(invalid="ignore", over="ignore"):
        terms = coef * v + np.where(zero, 0.0 * v, 0.0)
        return terms.sum(axis=(1, 2))


def point_sum(img: np.ndarray, y: np.ndarray, x: np.ndarray, times: np.ndarray) -> np.ndarray:
    """The sum of the bilinear values of ``img`` (C, H, W) at points (y, x) on the map (RoI border rule, any
    arrangement of points), point i counted ``times[i]`` times: (C,), with :func:`tap_sum`'s NaN pattern."""
    C, H, W = img.shape
    if y.size == 0:
        return np.zeros(C)
    ylo, yhi, wylo, wyhi = roi_taps(y.astype(np.float64), H)
    xlo, xhi, wxlo, wxhi = roi_taps(x.astype(np.float64), W)
    pix = np.concatenate([ylo * W + xlo, ylo * W + xhi, yhi * W + xlo, yhi * W + xhi])
    w = np.concatenate([wylo * wxlo, wylo * wxhi, wyhi * wxlo, wyhi * wxhi]) * np.tile(times, 4)
    weight = np.bincount(pix, w, H * W)
    touched = np.flatnonzero(np.bincount(pix, minlength=H * W))
    zero = np.bincount(pix[w == 0], minlength=H * W)[touched] > 0
    v = img.reshape(C, H * W)[:, touched].astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        return (weight[touched] * v + np.where(zero, 0.0 * v, 0.0)).sum(axis=1)


def _run_ends(taps) -> np.ndarray:
    """The first and last sample of every run of consecutive samples on the same two taps."""
    lo, hi = taps[0], taps[1]
    keep = np.zeros(lo.size, bool)
    if lo.size:
        keep[[0, -1]] = True
        change = (lo[1:] != lo[:-1]) | (hi[1:] != hi[:-1])
        keep[1:] |= change
        keep[:-1] |= change
    return keep


def tap_max(img: np.ndarray, ty, tx, first_on_map: bool, all_on_map: bool) -> np.ndarray:
    """The loop's maximum over the grid (module docstring) of the bilinear values of ``img`` (C, H, W) at the pairs of
    the axes' samples on the map (their taps), each sample off it counting 0: (C,). ``first_on_map``: the loop's first
    sample, (0, 0), is on the map (it is then the first pair); ``all_on_map``: no sample of the grid is off it.

    Within a run of samples on the same taps a sample's value is linear in its weights, so the largest lies at the
    run's first or last sample: only those are evaluated."""
    C = img.shape[0]
    ky, kx = _run_ends(ty), _run_ends(tx)
    ylo, yhi, wylo, wyhi = (t[ky] for t in ty)
    xlo, xhi, wxlo, wxhi = (t[kx] for t in tx)
    if ylo.size == 0 or xlo.size == 0:
        return np.zeros(C)
    v = img.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        values = (np.outer(wylo, wxlo) * v[:, ylo[:, None], xlo[None, :]]
                  + np.outer(wylo, wxhi) * v[:, ylo[:, None], xhi[None, :]]
                  + np.outer(wyhi, wxlo) * v[:, yhi[:, None], xlo[None, :]]
                  + np.outer(wyhi, wxhi) * v[:, yhi[:, None], xhi[None, :]])
    flat = values.reshape(C, -1)
    best = np.fmax.reduce(flat, axis=1)
    if not all_on_map:
        best = np.fmax(best, 0.0)
    if first_on_map:
        best = np.where(np.isnan(flat[:, 0]), np.nan, best)
    return best
