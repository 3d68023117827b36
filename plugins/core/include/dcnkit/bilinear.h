// Bilinear sampling, the two boundary rules of docs/operators.md, written once for every backend.
//
// Each rule turns a sampling point into `Taps`: the four neighbours' linear indices into an H x W map,
// their interpolation weights, and the weights' derivatives with respect to the point's coordinates
// (the bilinear form on the cell that contains the point). A neighbour outside the map has ok = false,
// weight 0, derivative 0 and index 0, and is NEVER read (docs/operators.md: it contributes nothing, so an
// Inf or NaN elsewhere in the map cannot leak into a border sample): every reader tests `ok` (taps_value,
// taps_coord_grad and the kernels' own loops). A neighbour inside the map is read even when its weight is
// 0, as torchvision and grid_sample do. NaN and infinite coordinates sample as outside.
#pragma once

#include <cmath>

#include "dcnkit/common.h"

namespace dcnkit {

template <typename Acc>
struct Taps {
  int64_t idx[4];  // (y0, x0), (y0, x1), (y1, x0), (y1, x1) as y * W + x
  Acc w[4];        // interpolation weights
  Acc dwy[4];      // d w / d y
  Acc dwx[4];      // d w / d x
  bool ok[4];      // neighbour i is inside the map (read it); false: never read, contributes nothing
  bool inside;     // false: the point samples as 0 and has no neighbours
};

template <typename Acc>
DCNKIT_HD void taps_clear(Taps<Acc>& t) {
  for (int i = 0; i < 4; ++i) {
    t.idx[i] = 0;
    t.w[i] = Acc(0);
    t.dwy[i] = Acc(0);
    t.dwx[i] = Acc(0);
    t.ok[i] = false;
  }
  t.inside = false;
}

// Fills the taps of the cell with corners (y0, x0) .. (y1, x1) and fractional parts ly, lx; `ok[i]` says
// whether neighbour i exists in the map.
template <typename Acc>
DCNKIT_HD void taps_fill(Taps<Acc>& t, int64_t W, int64_t y0, int64_t x0, int64_t y1, int64_t x1,
                         Acc ly, Acc lx, const bool ok[4]) {
  const Acc hy = Acc(1) - ly, hx = Acc(1) - lx;
  const int64_t ys[4] = {y0, y0, y1, y1};
  const int64_t xs[4] = {x0, x1, x0, x1};
  const Acc w[4] = {hy * hx, hy * lx, ly * hx, ly * lx};
  const Acc dy[4] = {-hx, -lx, hx, lx};
  const Acc dx[4] = {-hy, hy, -ly, ly};
  for (int i = 0; i < 4; ++i) {
    t.idx[i] = ok[i] ? ys[i] * W + xs[i] : 0;
    t.w[i] = ok[i] ? w[i] : Acc(0);
    t.dwy[i] = ok[i] ? dy[i] : Acc(0);
    t.dwx[i] = ok[i] ? dx[i] : Acc(0);
    t.ok[i] = ok[i];
  }
  t.inside = true;
}

// Corner sampling S_dcn (deformable convolution, DCNv2 rule): 0 when py <= -1, py >= H, px <= -1 or
// px >= W; otherwise the four integer neighbours of (floor(py), floor(px)), each outside the map
// contributing 0 without being read (ok = false).
template <typename Acc>
DCNKIT_HD Taps<Acc> dcn_taps(Acc py, Acc px, int64_t H, int64_t W) {
  Taps<Acc> t;
  // Written so that NaN fails the test and samples as outside.
  if (!(py > Acc(-1) && py < Acc(H) && px > Acc(-1) && px < Acc(W))) {
    taps_clear(t);
    return t;
  }
  const Acc fy = std::floor(py), fx = std::floor(px);
  const int64_t y0 = static_cast<int64_t>(fy), x0 = static_cast<int64_t>(fx);
  const int64_t y1 = y0 + 1, x1 = x0 + 1;
  const bool y0ok = y0 >= 0, x0ok = x0 >= 0, y1ok = y1 <= H - 1, x1ok = x1 <= W - 1;
  const bool ok[4] = {y0ok && x0ok, y0ok && x1ok, y1ok && x0ok, y1ok && x1ok};
  taps_fill(t, W, y0, x0, y1, x1, py - fy, px - fx, ok);
  return t;
}

// One axis of S_roi (a coordinate v on an axis of n pixels): inside when -1 <= v <= n (and n > 0; NaN is
// outside); else clamped to >= 0, neighbours lo = floor(v) and hi = lo + 1, and a point at or past the last pixel
// samples that pixel (lo = hi = n - 1, l = 0). The weights are 1 - l (lo) and l (hi). roi_taps is the product of
// two of them; the deterministic RoI backward (roi_gather.h) sums them per axis.
// I: the integer type of the pixel indices (int32_t where the caller knows the axis has fewer than 2^31 pixels: the
// RoI plan, whose conversions then stay 32-bit).
template <typename Acc, typename I = int64_t>
struct RoIAxisTaps {
  I lo, hi;
  Acc l;
  bool inside;
};
template <typename Acc, typename I = int64_t>
DCNKIT_HD RoIAxisTaps<Acc, I> roi_axis_taps(Acc v, I n) {
  RoIAxisTaps<Acc, I> a;
  a.inside = v >= Acc(-1) && v <= Acc(n) && n > 0;
  a.lo = a.hi = 0;
  a.l = Acc(0);
  if (!a.inside) return a;
  if (v < Acc(0)) v = Acc(0);
  a.lo = static_cast<I>(std::floor(v));
  if (a.lo >= n - 1) {
    a.lo = a.hi = n - 1;
    v = Acc(a.lo);
  } else {
    a.hi = a.lo + 1;
  }
  a.l = v - Acc(a.lo);
  return a;
}

// The integer type of a pixel index along one axis inside the RoI kernels: int32_t on the device, whose launchers
// check that every map has fewer than 2^31 rows and columns (check_cuda_map_axes), so that a coordinate's floor is a
// 32-bit conversion; int64_t on the host. The same values either way.
#if defined(__CUDA_ARCH__)
using AxisIndex = int32_t;
#else
using AxisIndex = int64_t;
#endif

// Clamped sampling S_roi (RoIAlign family): 0 when y < -1, y > H, x < -1 or x > W; else clamp to >= 0,
// and a point at or past the last row/column samples that row/column (roi_axis_taps per axis).
template <typename Acc>
DCNKIT_HD Taps<Acc> roi_taps(Acc y, Acc x, int64_t H, int64_t W) {
  Taps<Acc> t;
  const RoIAxisTaps<Acc, AxisIndex> ay = roi_axis_taps(y, static_cast<AxisIndex>(H));
  const RoIAxisTaps<Acc, AxisIndex> ax = roi_axis_taps(x, static_cast<AxisIndex>(W));
  if (!(ay.inside && ax.inside)) {
    taps_clear(t);
    return t;
  }
  const bool ok[4] = {true, true, true, true};
  taps_fill(t, W, ay.lo, ax.lo, ay.hi, ax.hi, ay.l, ax.l, ok);
  return t;
}

// One axis of the DeformPSRoIPool rule (a coordinate v on an axis of n pixels): taken when -0.5 <= v <= n - 0.5
// (and n > 0); else clamped to [0, n - 1], neighbours lo = floor(v) and hi = ceil(v), l = v - lo.
template <typename Acc, typename I = int64_t>
DCNKIT_HD RoIAxisTaps<Acc, I> psroi_axis_taps(Acc v, I n) {
  RoIAxisTaps<Acc, I> a;
  a.inside = v >= Acc(-0.5) && v <= Acc(n) - Acc(0.5) && n > 0;
  a.lo = a.hi = 0;
  a.l = Acc(0);
  if (!a.inside) return a;
  v = v < Acc(0) ? Acc(0) : (v > Acc(n - 1) ? Acc(n - 1) : v);
  const Acc f = std::floor(v);
  a.lo = static_cast<I>(f);
  a.hi = static_cast<I>(std::ceil(v));
  a.l = v - f;
  return a;
}

// Sampling of deformable PS RoI pooling (R-FCN): skipped (inside = false) when w < -0.5, w > W - 0.5,
// h < -0.5 or h > H - 0.5; else clamped to [0, W-1] x [0, H-1] and interpolated between floor and ceil
// (psroi_axis_taps per axis).
template <typename Acc>
DCNKIT_HD Taps<Acc> psroi_taps(Acc h, Acc w, int64_t H, int64_t W) {
  Taps<Acc> t;
  const RoIAxisTaps<Acc, AxisIndex> ay = psroi_axis_taps(h, static_cast<AxisIndex>(H));
  const RoIAxisTaps<Acc, AxisIndex> ax = psroi_axis_taps(w, static_cast<AxisIndex>(W));
  if (!(ay.inside && ax.inside)) {
    taps_clear(t);
    return t;
  }
  const bool ok[4] = {true, true, true, true};
  taps_fill(t, W, ay.lo, ax.lo, ay.hi, ax.hi, ay.l, ax.l, ok);
  return t;
}

// Converts a stored element to the accumulation type (float for half and bfloat16 on the device).
template <typename Acc, typename T>
DCNKIT_HD Acc to_acc(const T& v) {
  return static_cast<Acc>(v);
}

// Converts an accumulated value back to the storage type T. Acc is deduced from the value, so a double
// stays double (CUDA specialises half and bfloat16 from float in cuda_utils.cuh).
template <typename T, typename Acc>
DCNKIT_HD T from_acc(Acc v) {
  return static_cast<T>(v);
}

// Interpolated value of `img` (an H x W map) at the taps.
template <typename Acc, typename T>
DCNKIT_HD Acc taps_value(const T* img, const Taps<Acc>& t) {
  Acc v = Acc(0);
  for (int i = 0; i < 4; ++i) {
    if (t.ok[i]) v += t.w[i] * to_acc<Acc>(img[t.idx[i]]);
  }
  return v;
}

// d value / d y and d value / d x at the taps.
template <typename Acc, typename T>
DCNKIT_HD void taps_coord_grad(const T* img, const Taps<Acc>& t, Acc& gy, Acc& gx) {
  gy = Acc(0);
  gx = Acc(0);
  for (int i = 0; i < 4; ++i) {
    if (!t.ok[i]) continue;
    const Acc v = to_acc<Acc>(img[t.idx[i]]);
    gy += t.dwy[i] * v;
    gx += t.dwx[i] * v;
  }
}

}  // namespace dcnkit
