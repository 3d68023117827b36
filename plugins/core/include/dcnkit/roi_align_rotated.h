// RoIAlignRotated (mmcv's roi_align_rotated; rotated detectors' RoI pooler). See docs/operators.md.
//   input (N, C, H, W), rois (K, 6) rows [batch_index, cx, cy, w, h, angle (radians)]  ->  output (K, C, oh, ow)
// The params and launchers, then the per-element math (DCNKIT_HD) that the CPU launchers and the CUDA kernels
// both run: one body per work item, driven by a CPU loop or by a CUDA grid.
#pragma once

#include <cmath>

#include "dcnkit/common.h"
#include "dcnkit/context.h"
#include "dcnkit/roi_gather.h"
#include "dcnkit/roi_kernels.h"

namespace dcnkit {

struct RoIAlignRotatedAttrs {
  int64_t pooled_h = 1, pooled_w = 1;
  double spatial_scale = 1.0;
  int64_t sampling_ratio = 0;  // <= 0: adaptive, ceil(roi / pooled)
  bool aligned = true;         // the centre shifted by half a pixel (mmcv's default)
  bool clockwise = false;      // the angle turns clockwise in image space (it is negated)
};

struct RoIAlignRotatedParams {
  RoIAlignRotatedAttrs attrs;
  int64_t batch = 0, channels = 0, height = 0, width = 0, num_rois = 0;
  // CUDA: a RoI whose batch index is outside [0, N) or NaN raises a device-side assert (the torch op), else zeros.
  bool assert_batch_index = false;
  Shape output_shape() const { return {num_rois, channels, attrs.pooled_h, attrs.pooled_w}; }
};

Status make_roi_align_rotated_params(const char* op, const Shape& input, const Shape& rois,
                                     const RoIAlignRotatedAttrs& attrs, RoIAlignRotatedParams* p);

// CPU (float32, float64): a batch index outside [0, N) (or NaN) is an Invalid status. The backward is
// deterministic (each task owns the gradient of one image's channels) and writes every grad_input element.
template <typename T>
Status roi_align_rotated_forward_cpu(const RoIAlignRotatedParams& p, const T* input, const T* rois, T* output,
                                     const CpuContext& ctx);
template <typename T>
Status roi_align_rotated_backward_cpu(const RoIAlignRotatedParams& p, const T* grad_output, const T* rois,
                                      T* grad_input, const CpuContext& ctx);

// CUDA (float32, float64, float16, bfloat16; `rois_dtype` is `dtype` or float32). Never synchronises; a bad batch
// index gives zeros (and no gradient). The backward scatters with atomics, or (ctx.deterministic) runs the tile gather
// of roi_gather.h (RotatedGather below): no atomics, the same bits on every run. Workspace: the float32 accumulation
// of a 16-bit grad_input (0 for float32 and float64), or the gather's (its RoIs' boxes, running sums).
size_t roi_align_rotated_backward_workspace_cuda(const RoIAlignRotatedParams& p, DType dtype, bool deterministic);
Status roi_align_rotated_forward_cuda(const RoIAlignRotatedParams& p, DType dtype, DType rois_dtype,
                                      const void* input, const void* rois, void* output, const CudaContext& ctx);
Status roi_align_rotated_backward_cuda(const RoIAlignRotatedParams& p, DType dtype, DType rois_dtype,
                                       const void* grad_output, const void* rois, void* grad_input, void* workspace,
                                       const CudaContext& ctx);

// ---------------------------------------------------------------------------------------------
// Per-element math

// Channels one work item carries: the sampling points (and their four taps) are computed once for all of them.
constexpr int64_t kRotatedChannels = 8;

// sin and cos of an angle. On the device through sincospi, whose argument reduction is exact: sin / cos carry a slow
// path for huge arguments that needs a local-memory stack frame (the kernel report's gate); theta / pi costs half an
// ulp of the angle.
template <typename Acc>
DCNKIT_HD void rotated_sincos(Acc theta, Acc* s, Acc* c) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(Acc) == 8) {
    sincospi(theta / 3.141592653589793, s, c);
  } else {
    sincospif(theta / 3.14159265f, s, c);
  }
#else
  *s = std::sin(theta);
  *c = std::cos(theta);
#endif
}

// Samples per bin and axis at the most (mmcv's grid is an int): a box of more than 2^31 feature pixels per bin keeps
// 2^31 - 1 samples, spread over the bin.
constexpr int64_t kMaxRotatedGrid = 0x7fffffff;

template <typename Acc>
struct RotatedBox {
  Acc cy, cx;            // centre in feature coordinates (minus half a pixel when aligned)
  Acc start_h, start_w;  // -roi_h / 2, -roi_w / 2: the box's corner in its own frame
  Acc bin_h, bin_w;
  Acc cos_t, sin_t;
  Acc count;             // the divisor: gh * gw, at least 1
  int64_t gh, gw;        // samples per bin and axis (0: empty grid)
};

// The box of one RoI row, as mmcv computes it: centre * scale - offset, size * scale (at least 1 when not
// aligned), the angle negated when clockwise, grid = sampling_ratio or ceil(size / pooled).
template <typename Acc, typename R>
DCNKIT_HD RotatedBox<Acc> roi_align_rotated_box(const R* roi, const RoIAlignRotatedAttrs& a) {
  const Acc scale = static_cast<Acc>(a.spatial_scale), o = a.aligned ? Acc(0.5) : Acc(0);
  RotatedBox<Acc> b;
  b.cx = to_acc<Acc>(roi[1]) * scale - o;
  b.cy = to_acc<Acc>(roi[2]) * scale - o;
  Acc w = to_acc<Acc>(roi[3]) * scale, h = to_acc<Acc>(roi[4]) * scale;
  const Acc theta = a.clockwise ? -to_acc<Acc>(roi[5]) : to_acc<Acc>(roi[5]);
  if (!a.aligned) {
    w = w < Acc(1) ? Acc(1) : w;
    h = h < Acc(1) ? Acc(1) : h;
  }
  b.start_h = -h / Acc(2);
  b.start_w = -w / Acc(2);
  b.bin_h = h / static_cast<Acc>(a.pooled_h);
  b.bin_w = w / static_cast<Acc>(a.pooled_w);
  rotated_sincos(theta, &b.sin_t, &b.cos_t);
  b.gh = roi_grid_size(h, a.pooled_h, a.sampling_ratio);
  b.gw = roi_grid_size(w, a.pooled_w, a.sampling_ratio);
  b.gh = b.gh > kMaxRotatedGrid ? kMaxRotatedGrid : b.gh;
  b.gw = b.gw > kMaxRotatedGrid ? kMaxRotatedGrid : b.gw;
  b.count = Acc(1);
  if (b.gh > 0 && b.gw > 0) {
    b.count = b.gh <= int64_t(0x7fffffffffffffff) / b.gw ? static_cast<Acc>(b.gh * b.gw)
                                                          : static_cast<Acc>(b.gh) * static_cast<Acc>(b.gw);
  }
  return b;
}

// A point (yy, xx) of the box's frame in feature coordinates.
template <typename Acc>
DCNKIT_HD Acc rotated_y(const RotatedBox<Acc>& b, Acc yy, Acc xx) {
  return yy * b.cos_t - xx * b.sin_t + b.cy;
}
template <typename Acc>
DCNKIT_HD Acc rotated_x(const RotatedBox<Acc>& b, Acc yy, Acc xx) {
  return yy * b.sin_t + xx * b.cos_t + b.cx;
}

// The sampling points of bin (ph, pw): yy(iy), xx(ix) in the box's frame (RoIAxis: origin + (i + 0.5) * bin / g),
// rotated about the centre: y = yy cos - xx sin + cy, x = yy sin + xx cos + cx.
template <typename Acc>
struct RotatedBin {
  const RotatedBox<Acc>& b;
  RoIAxis<Acc> ay, ax;
  DCNKIT_HD RotatedBin(const RotatedBox<Acc>& box, int64_t ph, int64_t pw)
      : b(box),
        ay{box.start_h + static_cast<Acc>(ph) * box.bin_h, box.bin_h, box.gh},
        ax{box.start_w + static_cast<Acc>(pw) * box.bin_w, box.bin_w, box.gw} {}
  DCNKIT_HD Acc y(Acc yy, int64_t ix) const { return rotated_y(b, yy, ax(ix)); }
  DCNKIT_HD Acc x(Acc yy, int64_t ix) const { return rotated_x(b, yy, ax(ix)); }
};

// Grids up to this size per axis are looped over in full; larger ones visit only the samples that can land on
// the map (below).
constexpr int64_t kRotatedFullGrid = 16;

// Calls visit(taps, m) for the samples of bin (ph, pw) that land on the map (roi_taps: -1 <= y <= H, -1 <= x <= W),
// in the order of the full loop (iy outer, ix inner); m is 1, or the length of a run of equal samples where
// rounding made them equal (boxes far beyond 2^22 feature pixels in float32). Samples off the map add nothing.
// Bounded work: the rows are those whose yy lies within the projection of the map onto the box's y axis (widened
// by more than the rounding of the coordinates), and in a row the samples inside are an index range found by
// bisection on the sampling expressions themselves (each coordinate is monotone in ix, in floating point too). So
// the work of a bin is bounded by the map's size, whatever the box.
template <typename Acc, typename Visit>
DCNKIT_HD void roi_align_rotated_visit(const RotatedBox<Acc>& b, int64_t ph, int64_t pw, int64_t H, int64_t W,
                                       Visit& visit) {
  if (b.gh <= 0 || b.gw <= 0 || H <= 0 || W <= 0) return;
  const RotatedBin<Acc> bin(b, ph, pw);
  if (b.gh <= kRotatedFullGrid && b.gw <= kRotatedFullGrid) {
    for (int64_t iy = 0; iy < b.gh; ++iy) {
      const Acc yy = bin.ay(iy);
      for (int64_t ix = 0; ix < b.gw; ++ix) {
        const Taps<Acc> t = roi_taps(bin.y(yy, ix), bin.x(yy, ix), H, W);
        if (t.inside) visit(t, Acc(1));
      }
    }
    return;
  }
  // Rows: yy = (y - cy) cos + (x - cx) sin over the corners of [-1, H] x [-1, W], widened by tol.
  const Acc ys[2] = {Acc(-1) - b.cy, static_cast<Acc>(H) - b.cy}, xs[2] = {Acc(-1) - b.cx, static_cast<Acc>(W) - b.cx};
  Acc lo = ys[0] * b.cos_t + xs[0] * b.sin_t, hi = lo;
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      const Acc v = ys[i] * b.cos_t + xs[j] * b.sin_t;
      lo = v < lo ? v : lo;
      hi = v > hi ? v : hi;
    }
  }
  const Acc eps = sizeof(Acc) == 8 ? Acc(2.3e-16) : Acc(1.2e-7);
  const Acc mag = std::fabs(b.cy) + std::fabs(b.cx) + std::fabs(b.start_h) + std::fabs(b.start_w) +
                  static_cast<Acc>(H + W);
  const Acc tol = Acc(1) + Acc(64) * eps * mag;
  const SampleRange ry = sample_range(b.gh, !(b.bin_h < Acc(0)), lo - tol, hi + tol, bin.ay);
  const int64_t cap = roi_axis_cap(H + W + 8);
  const bool y_runs = ry.hi - ry.lo > cap;
  for (int64_t iy = ry.lo; iy < ry.hi;) {
    const Acc yy = bin.ay(iy);
    const int64_t ey = y_runs ? sample_run_end(iy, ry.hi, yy, bin.ay) : iy + 1;
    const auto py = [&](int64_t ix) { return bin.y(yy, ix); };
    const auto px = [&](int64_t ix) { return bin.x(yy, ix); };
    // y decreases in ix when sin > 0, x when cos < 0 (bin_w < 0 reverses both).
    const bool up = !(b.bin_w < Acc(0));
    const SampleRange rx0 = sample_range(b.gw, up == !(b.sin_t > Acc(0)), Acc(-1), static_cast<Acc>(H), py);
    const SampleRange rx1 = sample_range(b.gw, up == !(b.cos_t < Acc(0)), Acc(-1), static_cast<Acc>(W), px);
    const int64_t xlo = rx0.lo > rx1.lo ? rx0.lo : rx1.lo, xhi = rx0.hi < rx1.hi ? rx0.hi : rx1.hi;
    const bool x_runs = xhi - xlo > cap;
    const Acc my = static_cast<Acc>(ey - iy);
    for (int64_t ix = xlo; ix < xhi;) {
      const Acc y = py(ix), x = px(ix);
      int64_t ex = ix + 1;
      if (x_runs && ex < xhi && py(ex) == y && px(ex) == x) {
        ex = first_true(ex + 1, xhi, [&](int64_t j) { return py(j) != y || px(j) != x; });
      }
      const Taps<Acc> t = roi_taps(y, x, H, W);
      if (t.inside) visit(t, my * static_cast<Acc>(ex - ix));
      ix = ex;
    }
    iy = ey;
  }
}

// A work item (k, channel slice, bin) in the order of the output: bin fastest, so that consecutive CUDA threads
// write consecutive outputs.
struct RotatedItem {
  int64_t k, c0, nc, ph, pw;
};
DCNKIT_HD int64_t roi_align_rotated_slices(int64_t channels) {
  return (channels + kRotatedChannels - 1) / kRotatedChannels;
}
DCNKIT_HD RotatedItem roi_align_rotated_item(const RoIAlignRotatedParams& p, int64_t i) {
  const int64_t bins = p.attrs.pooled_h * p.attrs.pooled_w, slices = roi_align_rotated_slices(p.channels);
  RotatedItem it;
  const int64_t bin = i % bins, rest = i / bins;
  it.ph = bin / p.attrs.pooled_w;
  it.pw = bin - it.ph * p.attrs.pooled_w;
  const int64_t s = rest % slices;
  it.k = rest / slices;
  it.c0 = s * kRotatedChannels;
  it.nc = p.channels - it.c0 < kRotatedChannels ? p.channels - it.c0 : kRotatedChannels;
  return it;
}

// Forward of one item: output[k, c, ph, pw] for its channels. A RoI whose batch index is outside [0, N) gives 0.
template <typename Acc, typename T, typename R>
DCNKIT_HD void roi_align_rotated_forward_item(const RoIAlignRotatedParams& p, const T* input, const R* rois,
                                              int64_t i, T* output) {
  const RotatedItem it = roi_align_rotated_item(p, i);
  const int64_t bins = p.attrs.pooled_h * p.attrs.pooled_w, bin = it.ph * p.attrs.pooled_w + it.pw;
  const int64_t H = p.height, W = p.width, HW = H * W;
  const R* roi = rois + it.k * 6;
  Acc acc[kRotatedChannels];
  for (int64_t c = 0; c < kRotatedChannels; ++c) acc[c] = Acc(0);
  int64_t b = 0;
  if (roi_batch_index<Acc>(roi, p.batch, &b)) {
    const RotatedBox<Acc> box = roi_align_rotated_box<Acc>(roi, p.attrs);
    const T* img = input + (b * p.channels + it.c0) * HW;
    auto visit = [&](const Taps<Acc>& t, Acc m) {
      for (int64_t c = 0; c < kRotatedChannels; ++c) {
        if (c < it.nc) acc[c] += m * taps_value<Acc>(img + c * HW, t);
      }
    };
    roi_align_rotated_visit<Acc>(box, it.ph, it.pw, H, W, visit);
    for (int64_t c = 0; c < kRotatedChannels; ++c) acc[c] /= box.count;
  }
  T* out = output + (it.k * p.channels + it.c0) * bins + bin;
  for (int64_t c = 0; c < kRotatedChannels; ++c) {
    if (c < it.nc) out[c * bins] = from_acc<T>(acc[c]);
  }
}

// Backward of one item: grad_output[k, c, ph, pw] / count times each tap's weight, added into grad_input through
// add(offset, value) (atomics on CUDA). Nothing for a bad batch index.
template <typename Acc, typename T, typename R, typename Add>
DCNKIT_HD void roi_align_rotated_backward_item(const RoIAlignRotatedParams& p, const T* grad_output, const R* rois,
                                               int64_t i, const Add& add) {
  const RotatedItem it = roi_align_rotated_item(p, i);
  const int64_t bins = p.attrs.pooled_h * p.attrs.pooled_w, bin = it.ph * p.attrs.pooled_w + it.pw;
  const int64_t HW = p.height * p.width;
  const R* roi = rois + it.k * 6;
  int64_t b = 0;
  if (!roi_batch_index<Acc>(roi, p.batch, &b)) return;
  const RotatedBox<Acc> box = roi_align_rotated_box<Acc>(roi, p.attrs);
  Acc g[kRotatedChannels];
  const T* go = grad_output + (it.k * p.channels + it.c0) * bins + bin;
  for (int64_t c = 0; c < kRotatedChannels; ++c) g[c] = c < it.nc ? to_acc<Acc>(go[c * bins]) / box.count : Acc(0);
  const int64_t base = (b * p.channels + it.c0) * HW;
  auto visit = [&](const Taps<Acc>& t, Acc m) {
    for (int j = 0; j < 4; ++j) {
      if (!t.ok[j]) continue;
      const Acc w = m * t.w[j];
      for (int64_t c = 0; c < kRotatedChannels; ++c) {
        if (c < it.nc) add(base + c * HW + t.idx[j], g[c] * w);
      }
    }
  };
  roi_align_rotated_visit<Acc>(box, it.ph, it.pw, p.height, p.width, visit);
}

// ---------------------------------------------------------------------------------------------
// The deterministic CUDA backward: the tile gather of roi_gather.h (one thread per pixel of a 16 x 16 tile, the RoIs
// that reach the tile in index order, each pixel's sum in a fixed order). A rotated box is not separable along the
// map's axes, so a RoI's table is its box (computed once per RoI by the table kernel) rather than RoIAlign's two
// factors, and a pixel's sum visits, bin by bin, the samples whose coordinates in the box's frame lie within the
// projection onto the box's axes of the pixel's reach (the samples whose taps can fall on it: [y - 1, y + 1] x
// [x - 1, x + 1], to -1 and H (W) at the borders), widened by the coordinates' rounding: a superset found by
// bisection, each sample then tested by its taps as the forward computes them. So the work of a (RoI, pixel) is the
// samples within about 3 pixels of it; runs of samples that rounding made equal (boxes beyond 2^22 pixels in float)
// are taken once each, times their length. Indices are 32-bit (kMaxRotatedGrid; check_roi_gather_grid).

// A RoI's table: its box, and its grid as two 16-bit halves (exact in float).
enum RotatedTable : int {
  kRtCy, kRtCx, kRtCos, kRtSin, kRtStartH, kRtStartW, kRtBinH, kRtBinW, kRtGh, kRtGw, kRtCount, kRtTol,
  kRtGhHi, kRtGhLo, kRtGwHi, kRtGwLo, kRtEntries
};

// Offset of element (k, c0, ph, pw) of a (K, C, oh, ow) tensor with bins = oh * ow, in 64 bits (every product:
// ph * ow alone passes 2^31 with 2^31 bins).
DCNKIT_HD int64_t rotated_bin_offset(int64_t k, int64_t C, int64_t c0, int64_t bins, int32_t ph, int64_t ow,
                                     int32_t pw) {
  return (k * C + c0) * bins + static_cast<int64_t>(ph) * ow + pw;
}

// Coordinate of sample i of a bin along one axis: RoIAxis's expression in 32-bit indices (the same value).
template <typename Acc>
struct RotatedAxis32 {
  Acc origin, bin, g;
  DCNKIT_HD Acc operator()(int32_t i) const { return origin + (static_cast<Acc>(i) + Acc(0.5)) * bin / g; }
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
                            static_cast<Acc>(H + W) + Acc(1));
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
    RoIFootprint f{b, 0, -1, 0, -1};
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
      case kRtGh: return static_cast<Acc>(box.gh);
      case kRtGw: return static_cast<Acc>(box.gw);
      case kRtCount: return box.count;
      case kRtTol: return tolerance(box, p.height, p.width);
      case kRtGhHi: return static_cast<Acc>(box.gh >> 16);
      case kRtGhLo: return static_cast<Acc>(box.gh & 0xffff);
      case kRtGwHi: return static_cast<Acc>(box.gw >> 16);
      default: return static_cast<Acc>(box.gw & 0xffff);
    }
  }

  DCNKIT_HD void add(int64_t k, int64_t c0, int nc, int64_t y, int64_t x, Acc* acc) const {
    const Acc* t = tables + (k - k0) * kRtEntries;
    const int32_t gh = static_cast<int32_t>(t[kRtGhHi]) * 65536 + static_cast<int32_t>(t[kRtGhLo]);
    const int32_t gw = static_cast<int32_t>(t[kRtGwHi]) * 65536 + static_cast<int32_t>(t[kRtGwLo]);
    if (gh <= 0 || gw <= 0) return;
    RotatedBox<Acc> box;
    box.cy = t[kRtCy];
    box.cx = t[kRtCx];
    box.cos_t = t[kRtCos];
    box.sin_t = t[kRtSin];
    const int32_t H = static_cast<int32_t>(p.height), W = static_cast<int32_t>(p.width);
    const int32_t y32 = static_cast<int32_t>(y), x32 = static_cast<int32_t>(x);
    // The pixel's reach, projected onto the box's axes (yy, xx), widened by the rounding.
    const Acc ylo = y32 == 0 ? Acc(-1) : static_cast<Acc>(y32 - 1), yhi = y32 == H - 1 ? static_cast<Acc>(H)
                                                                                     : static_cast<Acc>(y32 + 1);
    const Acc xlo = x32 == 0 ? Acc(-1) : static_cast<Acc>(x32 - 1), xhi = x32 == W - 1 ? static_cast<Acc>(W)
                                                                                     : static_cast<Acc>(x32 + 1);
    Acc yy0 = Acc(0), yy1 = Acc(0), xx0 = Acc(0), xx1 = Acc(0);
    for (int q = 0; q < 4; ++q) {
      const Acc dy = (q < 2 ? ylo : yhi) - box.cy, dx = ((q & 1) ? xhi : xlo) - box.cx;
      const Acc yy = dy * box.cos_t + dx * box.sin_t, xx = dx * box.cos_t - dy * box.sin_t;
      yy0 = q == 0 || yy < yy0 ? yy : yy0;
      yy1 = q == 0 || yy > yy1 ? yy : yy1;
      xx0 = q == 0 || xx < xx0 ? xx : xx0;
      xx1 = q == 0 || xx > xx1 ? xx : xx1;
    }
    const Acc tol = t[kRtTol];
    yy0 -= tol;
    yy1 += tol;
    xx0 -= tol;
    xx1 += tol;
    // Bins that can hold such samples (one more each side for the rounding of the division).
    const Acc start_h = t[kRtStartH], start_w = t[kRtStartW], bin_h = t[kRtBinH], bin_w = t[kRtBinW];
    const int32_t oh = static_cast<int32_t>(p.attrs.pooled_h), ow = static_cast<int32_t>(p.attrs.pooled_w);
    const Acc fh0 = (yy0 - start_h) / bin_h, fh1 = (yy1 - start_h) / bin_h;
    const Acc fw0 = (xx0 - start_w) / bin_w, fw1 = (xx1 - start_w) / bin_w;
    const int32_t ph0 = roi_floor32(fh0 < fh1 ? fh0 : fh1, -1, oh) - 1, ph1 = roi_floor32(fh0 < fh1 ? fh1 : fh0, -1, oh) + 1;
    const int32_t pw0 = roi_floor32(fw0 < fw1 ? fw0 : fw1, -1, ow) - 1, pw1 = roi_floor32(fw0 < fw1 ? fw1 : fw0, -1, ow) + 1;
    const Acc count = t[kRtCount], g_h = t[kRtGh], g_w = t[kRtGw];
    const int64_t bins = p.attrs.pooled_h * p.attrs.pooled_w;
    const T* go_k = grad_output + (k * p.channels + c0) * bins;
    for (int32_t ph = ph0 < 0 ? 0 : ph0; ph <= ph1 && ph < oh; ++ph) {
      const RotatedAxis32<Acc> ay{start_h + static_cast<Acc>(ph) * bin_h, bin_h, g_h};
      int32_t iy0, iy1;
      roi_range32(gh, !(bin_h < Acc(0)), yy0, yy1, ay, &iy0, &iy1);
      if (iy0 >= iy1) continue;
      for (int32_t pw = pw0 < 0 ? 0 : pw0; pw <= pw1 && pw < ow; ++pw) {
        const RotatedAxis32<Acc> ax{start_w + static_cast<Acc>(pw) * bin_w, bin_w, g_w};
        int32_t ix0, ix1;
        roi_range32(gw, !(bin_w < Acc(0)), xx0, xx1, ax, &ix0, &ix1);
        if (ix0 >= ix1) continue;
        const T* go = go_k + ph * ow + pw;
        bool loaded = false;
        Acc g[kRoIGatherChannels];
        const bool y_runs = iy1 - iy0 > kRotatedFullGrid, x_runs = ix1 - ix0 > kRotatedFullGrid;
        for (int32_t iy = iy0; iy < iy1;) {
          const Acc yy = ay(iy);
          const int32_t ey = y_runs ? roi_run_end32(iy, iy1, [&](int32_t j) { return ay(j) == yy; }) : iy + 1;
          const Acc my = static_cast<Acc>(ey - iy);
          for (int32_t ix = ix0; ix < ix1;) {
            const Acc sy = rotated_y(box, yy, ax(ix)), sx = rotated_x(box, yy, ax(ix));
            const int32_t ex = x_runs ? roi_run_end32(ix, ix1, [&](int32_t j) {
              return rotated_y(box, yy, ax(j)) == sy && rotated_x(box, yy, ax(j)) == sx;
            }) : ix + 1;
            const RoIAxisTaps<Acc, int32_t> ty = roi_axis_taps(sy, H), tx = roi_axis_taps(sx, W);
            const Acc wy = (ty.lo == y32 ? Acc(1) - ty.l : Acc(0)) + (ty.hi == y32 ? ty.l : Acc(0));
            const Acc wx = (tx.lo == x32 ? Acc(1) - tx.l : Acc(0)) + (tx.hi == x32 ? tx.l : Acc(0));
            if (ty.inside && tx.inside && wy * wx != Acc(0)) {
              if (!loaded) {
                for (int c = 0; c < kRoIGatherChannels; ++c) g[c] = c < nc ? to_acc<Acc>(go[c * bins]) / count : Acc(0);
                loaded = true;
              }
              const Acc w = my * static_cast<Acc>(ex - ix) * (wy * wx);
              for (int c = 0; c < kRoIGatherChannels; ++c) acc[c] += g[c] * w;
            }
            ix = ex;
          }
          iy = ey;
        }
      }
    }
  }
};

}  // namespace dcnkit
