// The deterministic CUDA backward of RoIAlignRotated: the tile gather of roi_gather.h (one thread per pixel of a 16 x
// 16 tile, the RoIs that reach the tile in index order, each pixel's sum in a fixed order). A rotated box is not
// separable along the map's axes, so a RoI's table is its box (computed once per RoI by the table kernel) rather than
// RoIAlign's two factors, and a pixel's sum visits, bin by bin, the samples whose coordinates in the box's frame lie
// within the projection onto the box's axes of the pixel's reach (the samples whose taps can fall on it: [y - 1, y +
// 1] x [x - 1, x + 1], to -1 and H (W) at the borders), widened by the coordinates' rounding: a superset found by
// bisection, each sample then tested by its taps as the forward computes them. So the work of a (RoI, pixel) is the
// samples within about 3 pixels of it; runs of samples that rounding made equal (boxes beyond 2^22 pixels in float)
// are taken once each, times their length. A bin's samples' weights on the pixel are summed first, then the bin's
// gradient times that sum is added per channel. Indices are 32-bit (kMaxGridSamples; check_roi_gather_grid); the
// offset of a bin's gradient is 64-bit (rotated_bin_offset: 2^31 bins and more).
// Included by roi_align_rotated.h.
#pragma once

namespace dcnkit {

// A RoI's table: its box, the reciprocals of its bin sizes (the bins a pixel can reach are found by multiplying:
// one more each side covers their rounding), and its grid as two 16-bit halves (exact in float).
enum RotatedTable : int {
  kRtCy, kRtCx, kRtCos, kRtSin, kRtStartH, kRtStartW, kRtBinH, kRtBinW, kRtGh, kRtGw, kRtCount, kRtTol,
  kRtInvBinH, kRtInvBinW, kRtGhHi, kRtGhLo, kRtGwHi, kRtGwLo, kRtEntries
};

template <typename AccT, typename T, typename R>
struct RotatedGather {
  using Acc = AccT;
  RoIAlignRotatedParams p;
  const R* rois;
  const T* grad_output;
  int64_t k0;          // the chunk's first RoI and its tables
  const Acc* tables;

  // The rounding of RoI coordinates of this magnitude (feature pixels), with a margin.
  static DCNKIT_HD Acc tolerance(const RotatedBox<Acc>& b, int64_t H, int64_t W) {
    const Acc eps = sizeof(Acc) == 8 ? Acc(2.3e-16) : Acc(1.2e-7);
    return Acc(16) * eps * (std::fabs(b.cy) + std::fabs(b.cx) + std::fabs(b.start_h) + std::fabs(b.start_w) +
                            index_to_acc<Acc>(H + W) + Acc(1));
  }

  DCNKIT_HD RoIFootprint footprint(int64_t k) const {
    int64_t b = 0;
    if (!roi_batch_index<Acc>(rois + k * 6, p.batch, &b)) return roi_no_footprint();
    const RotatedBox<Acc> box = roi_align_rotated_box<Acc>(rois + k * 6, p.attrs);
    if (box.gh <= 0 || box.gw <= 0) return roi_no_footprint();
    // The box's extent along the map's axes (its samples lie inside it), widened by the rounding.
    const Acc hh = std::fabs(box.start_h), hw = std::fabs(box.start_w), c = std::fabs(box.cos_t);
    const Acc sn = std::fabs(box.sin_t), tol = tolerance(box, p.height, p.width);
    const Acc ey = hh * c + hw * sn + tol, ex = hh * sn + hw * c + tol;
    RoIFootprint f{static_cast<int32_t>(b), 0, -1, 0, -1};
    if (!roi_footprint_axis(box.cy - ey, box.cy + ey, p.height, &f.y0, &f.y1) ||
        !roi_footprint_axis(box.cx - ex, box.cx + ex, p.width, &f.x0, &f.x1)) {
      return roi_no_footprint();
    }
    return f;
  }
  DCNKIT_HD int64_t table_entries() const { return kRtEntries; }
  DCNKIT_HD Acc table(int64_t k, int64_t e) const {
    int64_t b = 0;
    if (!roi_batch_index<Acc>(rois + k * 6, p.batch, &b)) return Acc(0);
    const RotatedBox<Acc> box = roi_align_rotated_box<Acc>(rois + k * 6, p.attrs);
    switch (e) {
      case kRtCy: return box.cy;
      case kRtCx: return box.cx;
      case kRtCos: return box.cos_t;
      case kRtSin: return box.sin_t;
      case kRtStartH: return box.start_h;
      case kRtStartW: return box.start_w;
      case kRtBinH: return box.bin_h;
      case kRtBinW: return box.bin_w;
      case kRtGh: return box.ghf;
      case kRtGw: return box.gwf;
      case kRtCount: return box.count;
      case kRtTol: return tolerance(box, p.height, p.width);
      case kRtInvBinH: return div_rn(Acc(1), box.bin_h);
      case kRtInvBinW: return div_rn(Acc(1), box.bin_w);
      case kRtGhHi: return static_cast<Acc>(box.gh >> 16);
      case kRtGhLo: return static_cast<Acc>(box.gh & 0xffff);
      case kRtGwHi: return static_cast<Acc>(box.gw >> 16);
      default: return static_cast<Acc>(box.gw & 0xffff);
    }
  }

  // The bins [*b0, *b1] of `n` along one axis whose samples can lie within [v0, v1] of the box's frame.
  static DCNKIT_HD void reach_bins(Acc v0, Acc v1, Acc start, Acc inv_bin, int32_t n, int32_t* b0, int32_t* b1) {
    const Acc f0 = (v0 - start) * inv_bin, f1 = (v1 - start) * inv_bin;
    *b0 = floor_within(f0 < f1 ? f0 : f1, -1, n) - 1;
    *b1 = floor_within(f0 < f1 ? f1 : f0, -1, n) + 1;
    *b0 = *b0 < 0 ? 0 : *b0;
    *b1 = *b1 > n - 1 ? n - 1 : *b1;
  }

  // A table read at each use: volatile on the device, so that the RoI's entries take no registers across the loops.
#if defined(__CUDA_ARCH__)
  using TableRef = const volatile Acc*;
#else
  using TableRef = const Acc*;
#endif

  // add()'s state that the loops read but do not change, kept in the gather's scratch (shared memory, volatile): the
  // reach's frame bounds, the bins' ranges, the current bin, and within it the sample rows' end, the columns' range,
  // the row's frame coordinate and run length, the map's size (whose conversions the compiler would otherwise hoist out
  // of every loop into registers).
  struct Scratch {
    Acc yy0, yy1, xx0, xx1, yy, my;
    int32_t ph, ph1, pw, pw0, pw1, yhi, xlo, xhi, H, W;
  };

  // The sum of the samples' weights of bin (sc->ph, sc->pw) on pixel (y, x): the taps of every sample whose frame
  // coordinates lie in [yy0, yy1] x [xx0, xx1], runs of equal samples once times their length.
  template <typename S>
  DCNKIT_HD Acc bin_weight(TableRef t, S sc, int32_t y, int32_t x) const {
    const int32_t gh = static_cast<int32_t>(t[kRtGhHi]) * 65536 + static_cast<int32_t>(t[kRtGhLo]);
    const int32_t gw = static_cast<int32_t>(t[kRtGwHi]) * 65536 + static_cast<int32_t>(t[kRtGwLo]);
    const auto ay = [&](int32_t i) {
      return roi_sample_coord<Acc>(t[kRtStartH] + static_cast<Acc>(sc->ph) * t[kRtBinH], t[kRtBinH], t[kRtGh], i);
    };
    const auto ax = [&](int32_t i) {
      return roi_sample_coord<Acc>(t[kRtStartW] + static_cast<Acc>(sc->pw) * t[kRtBinW], t[kRtBinW], t[kRtGw], i);
    };
    const auto sy_of = [&](Acc yy, Acc xx) { return yy * t[kRtCos] - xx * t[kRtSin] + t[kRtCy]; };  // rotated_y
    const auto sx_of = [&](Acc yy, Acc xx) { return yy * t[kRtSin] + xx * t[kRtCos] + t[kRtCx]; };  // rotated_x
    const SampleRange ry = sample_range(gh, !(t[kRtBinH] < Acc(0)), static_cast<Acc>(sc->yy0),
                                        static_cast<Acc>(sc->yy1), ay);
    if (ry.lo >= ry.hi) return Acc(0);
    const SampleRange rx = sample_range(gw, !(t[kRtBinW] < Acc(0)), static_cast<Acc>(sc->xx0),
                                        static_cast<Acc>(sc->xx1), ax);
    if (rx.lo >= rx.hi) return Acc(0);
    const bool y_runs = ry.hi - ry.lo > kRotatedFullGrid, x_runs = rx.hi - rx.lo > kRotatedFullGrid;
    sc->yhi = ry.hi;
    sc->xlo = rx.lo;
    sc->xhi = rx.hi;
    Acc sum = Acc(0);
    for (int32_t iy = ry.lo; iy < sc->yhi;) {
      sc->yy = ay(iy);
      const int32_t ey = y_runs ? sample_run_end(iy, sc->yhi, static_cast<Acc>(sc->yy), ay) : iy + 1;
      sc->my = static_cast<Acc>(ey - iy);
      for (int32_t ix = sc->xlo; ix < sc->xhi;) {
        const Acc yy = sc->yy, xx = ax(ix), sy = sy_of(yy, xx), sx = sx_of(yy, xx);
        const int32_t ex = x_runs ? run_end(ix, sc->xhi, [&](int32_t j) {
          const Acc xj = ax(j);
          return sy_of(static_cast<Acc>(sc->yy), xj) == sy && sx_of(static_cast<Acc>(sc->yy), xj) == sx;
        }) : ix + 1;
        const RoIAxisTaps<Acc, int32_t> ty = roi_axis_taps(sy, static_cast<int32_t>(sc->H));
        const RoIAxisTaps<Acc, int32_t> tx = roi_axis_taps(sx, static_cast<int32_t>(sc->W));
        const Acc wy = (ty.lo == y ? Acc(1) - ty.l : Acc(0)) + (ty.hi == y ? ty.l : Acc(0));
        const Acc wx = (tx.lo == x ? Acc(1) - tx.l : Acc(0)) + (tx.hi == x ? tx.l : Acc(0));
        if (ty.inside && tx.inside) sum += sc->my * static_cast<Acc>(ex - ix) * (wy * wx);
        ix = ex;
      }
      iy = ey;
    }
    return sum;
  }

  DCNKIT_HD void add(int64_t k, int64_t c0, int nc, int32_t y, int32_t x, Acc* acc, RoIScratch scratch) const {
    constexpr int kC = roi_gather_channels<Acc>();
    auto* sc = roi_scratch<Scratch>(scratch);
    TableRef t = tables + (k - k0) * kRtEntries;
    if (!(t[kRtCount] > Acc(0)) || t[kRtGhHi] + t[kRtGhLo] == Acc(0) || t[kRtGwHi] + t[kRtGwLo] == Acc(0)) return;
    sc->H = static_cast<int32_t>(p.height);
    sc->W = static_cast<int32_t>(p.width);
    // The pixel's reach, projected onto the box's axes (yy, xx), widened by the rounding: [y - 1, y + 1] x [x - 1,
    // x + 1] (at the borders -1 and H, W: the same values).
    const Acc ylo = static_cast<Acc>(y - 1), yhi = static_cast<Acc>(y + 1);
    const Acc xlo = static_cast<Acc>(x - 1), xhi = static_cast<Acc>(x + 1);
    Acc yy0 = Acc(0), yy1 = Acc(0), xx0 = Acc(0), xx1 = Acc(0);
    for (int q = 0; q < 4; ++q) {
      const Acc dy = (q < 2 ? ylo : yhi) - t[kRtCy], dx = ((q & 1) ? xhi : xlo) - t[kRtCx];
      const Acc yy = dy * t[kRtCos] + dx * t[kRtSin], xx = dx * t[kRtCos] - dy * t[kRtSin];
      yy0 = q == 0 || yy < yy0 ? yy : yy0;
      yy1 = q == 0 || yy > yy1 ? yy : yy1;
      xx0 = q == 0 || xx < xx0 ? xx : xx0;
      xx1 = q == 0 || xx > xx1 ? xx : xx1;
    }
    const Acc tol = t[kRtTol];
    sc->yy0 = yy0 - tol;
    sc->yy1 = yy1 + tol;
    sc->xx0 = xx0 - tol;
    sc->xx1 = xx1 + tol;
    const int32_t oh = static_cast<int32_t>(p.attrs.pooled_h), ow = static_cast<int32_t>(p.attrs.pooled_w);
    int32_t ph0, ph1, pw0, pw1;
    reach_bins(sc->yy0, sc->yy1, t[kRtStartH], t[kRtInvBinH], oh, &ph0, &ph1);
    reach_bins(sc->xx0, sc->xx1, t[kRtStartW], t[kRtInvBinW], ow, &pw0, &pw1);
    sc->ph1 = ph1;
    sc->pw0 = pw0;
    sc->pw1 = pw1;
    const int64_t bins = p.attrs.pooled_h * p.attrs.pooled_w;
    for (sc->ph = ph0; sc->ph <= sc->ph1; sc->ph = sc->ph + 1) {
      for (sc->pw = sc->pw0; sc->pw <= sc->pw1; sc->pw = sc->pw + 1) {
        const Acc w = bin_weight(t, sc, y, x);
        if (w == Acc(0)) continue;
        const T* go = grad_output + rotated_bin_offset(k, p.channels, c0, bins, sc->ph, ow, sc->pw);
        for (int c = 0; c < kC; ++c) {
          if (c < nc) acc[c] += div_count(to_acc<Acc>(go[c * bins]), static_cast<Acc>(t[kRtCount])) * w;
        }
      }
    }
  }
};

}  // namespace dcnkit
