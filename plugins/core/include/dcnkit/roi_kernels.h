// Per-element math of the RoI operators (RoIAlign, DeformRoIPool; DeformPSRoIPool in psroi_kernels.h), written once
// as DCNKIT_HD templates and called by the CPU launchers (loops) and the CUDA launchers (grid-stride
// kernels). T is the storage type, Acc the accumulation type. Sampling goes through bilinear.h
// (roi_taps / psroi_taps); nothing here interpolates by itself. See docs/operators.md for the contract.
//
// Every function only reads the four taps of a sample when the sample is inside the map, so a map with
// H == 0 or W == 0 is never read. Non-finite box coordinates or offsets give sampling points that are
// NaN or infinite: those sample as outside (0, or skipped), and an adaptive grid of a non-finite box
// is empty. The work per output element is bounded whatever the box ("Bounded sampling grids" below).
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>

#include "dcnkit/bilinear.h"
#include "dcnkit/common.h"
#include "dcnkit/deform_psroi_pool.h"
#include "dcnkit/deform_roi_pool.h"
#include "dcnkit/roi_align.h"
#if defined(__CUDACC__)
#include "dcnkit/cuda_utils.cuh"
#endif

namespace dcnkit {

// ---------------------------------------------------------------------------------------------
// Checks shared by the RoIAlign-style ops (host): input (N, C, H, W), rois (K, 5), output size
// (oh, ow) >= 1, spatial_scale finite and > 0.
inline Status check_roi_pool_args(const char* op, const Shape& input, const Shape& rois, int64_t pooled_h,
                                  int64_t pooled_w, double spatial_scale) {
  DCNKIT_RETURN_IF_ERROR(check_rank(op, "input", input, 4, "(N, C, H, W)"));
  DCNKIT_RETURN_IF_ERROR(check_rank(op, "rois", rois, 2, "(K, 5)"));
  DCNKIT_RETURN_IF_ERROR(check_dim(op, "rois", rois, 1, 5, "[batch_index, x1, y1, x2, y2]"));
  if (pooled_h < 1 || pooled_w < 1) {
    return arg_error(op, "output_size", "(oh, ow) >= 1",
                     "(" + std::to_string(pooled_h) + ", " + std::to_string(pooled_w) + ")");
  }
  if (!(std::isfinite(spatial_scale) && spatial_scale > 0)) {
    return arg_error(op, "spatial_scale", "a finite value > 0", to_str(spatial_scale));
  }
  return Status::Ok();
}

// An explicit sampling grid (`arg`: sampling_ratio or sample_per_part) is at most kMaxSamplingRatio per
// axis; `lo` is the smallest value allowed (sampling_ratio: any, <= 0 is adaptive; sample_per_part: 1).
inline Status check_sampling_ratio(const char* op, const char* arg, int64_t value, int64_t lo) {
  const std::string limit = std::to_string(kMaxSamplingRatio);
  if (value > kMaxSamplingRatio) {
    return arg_error(op, arg,
                     lo <= 0 ? "a value <= " + limit + " (<= 0: adaptive; the limit of an explicit grid)"
                             : "a value in [" + std::to_string(lo) + ", " + limit + "]",
                     std::to_string(value));
  }
  if (value < lo) return arg_error(op, arg, "a value >= " + std::to_string(lo), std::to_string(value));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// RoI rows

// Batch index of the RoI row `roi` ([batch_index, x1, y1, x2, y2]); false when it is outside
// [0, batch) or NaN.
template <typename Acc, typename T>
DCNKIT_HD bool roi_batch_index(const T* roi, int64_t batch, int64_t* b) {
  const Acc v = to_acc<Acc>(roi[0]);
  if (!(v >= Acc(0) && v < Acc(batch))) return false;
  *b = static_cast<int64_t>(v);
  return true;
}

// Host check of every RoI's batch index (CPU launchers call it before any read); rows of `row` values.
template <typename T>
inline Status check_roi_batch_indices(const char* op, const T* rois, int64_t num_rois,
                                      int64_t batch, int64_t row = 5) {
  for (int64_t k = 0; k < num_rois; ++k) {
    int64_t b = 0;
    if (!roi_batch_index<double>(rois + k * row, batch, &b)) {
      return arg_error(op, "rois[" + std::to_string(k) + ", 0] (batch index)",
                       "a value in [0, " + std::to_string(batch) + ") (the batch size of input)",
                       to_str(static_cast<double>(rois[k * row])));
    }
  }
  return Status::Ok();
}

// The message of a batch index that a CUDA kernel found out of range.
inline std::string roi_batch_device_message(const char* op, int64_t batch) {
  return std::string(op) + ": rois[:, 0] (batch index): expected values in [0, " +
         std::to_string(batch) + ") (the batch size of input), got a value outside that range or NaN";
}

// Samples per bin along one axis: the fixed ratio, or ceil(extent / pooled) (adaptive). An adaptive
// grid of a non-positive or non-finite extent is empty.
template <typename Acc>
DCNKIT_HD int64_t roi_grid_size(Acc extent, int64_t pooled, int64_t sampling_ratio) {
  if (sampling_ratio > 0) return sampling_ratio;
  const Acc g = std::ceil(extent / static_cast<Acc>(pooled));
  // NaN and infinities fail; 2^62 keeps the conversion defined.
  if (!(g > Acc(0) && g < Acc(4611686018427387904.0))) return 0;
  return static_cast<int64_t>(g);
}

// ---------------------------------------------------------------------------------------------
// RoIAlign / DeformRoIPool: a box and its bins

template <typename Acc>
struct RoIAlignBox {
  Acc y_start, x_start;  // top-left corner in feature coordinates
  Acc roi_h, roi_w;
  Acc bin_h, bin_w;
  int64_t gh, gw;        // samples per bin (0: empty grid)
};

// Geometry of one RoI row: x_start = x1 * s - o, roi_w = x2 * s - o - x_start (o = 0.5 when aligned;
// when not aligned roi_w >= 1), bin = roi / pooled, grid from the sampling ratio.
template <typename Acc, typename T>
DCNKIT_HD RoIAlignBox<Acc> roi_align_box(const T* roi, Acc scale, bool aligned, int64_t pooled_h,
                                         int64_t pooled_w, int64_t sampling_ratio) {
  const Acc o = aligned ? Acc(0.5) : Acc(0);
  RoIAlignBox<Acc> b;
  b.x_start = to_acc<Acc>(roi[1]) * scale - o;
  b.y_start = to_acc<Acc>(roi[2]) * scale - o;
  b.roi_w = (to_acc<Acc>(roi[3]) * scale - o) - b.x_start;
  b.roi_h = (to_acc<Acc>(roi[4]) * scale - o) - b.y_start;
  if (!aligned) {
    if (b.roi_w < Acc(1)) b.roi_w = Acc(1);
    if (b.roi_h < Acc(1)) b.roi_h = Acc(1);
  }
  b.bin_h = b.roi_h / static_cast<Acc>(pooled_h);
  b.bin_w = b.roi_w / static_cast<Acc>(pooled_w);
  b.gh = roi_grid_size(b.roi_h, pooled_h, sampling_ratio);
  b.gw = roi_grid_size(b.roi_w, pooled_w, sampling_ratio);
  return b;
}

// Top-left corner (y0, x0) of bin (ph, pw); DeformRoIPool shifts the box start by
// gamma * roi_w * offset[0] in x and gamma * roi_h * offset[1] in y, where offset_x / offset_y are
// that bin's entries of offset[k, 0] and offset[k, 1] (null: no offset).
template <typename Acc, typename T>
DCNKIT_HD void roi_bin_origin(const RoIAlignBox<Acc>& b, int64_t ph, int64_t pw, const T* offset_x,
                              const T* offset_y, Acc gamma, Acc* y0, Acc* x0) {
  Acc ys = b.y_start, xs = b.x_start;
  if (offset_x != nullptr) {
    xs += gamma * b.roi_w * to_acc<Acc>(*offset_x);
    ys += gamma * b.roi_h * to_acc<Acc>(*offset_y);
  }
  *y0 = ys + static_cast<Acc>(ph) * b.bin_h;
  *x0 = xs + static_cast<Acc>(pw) * b.bin_w;
}

// ---------------------------------------------------------------------------------------------
// Bounded sampling grids
//
// An adaptive grid has ceil(roi / pooled) samples per bin and axis: unbounded for a huge box (a box of
// 1e9 pixels on an 8 x 8 map asks for ~1e17 samples). Only the samples whose coordinate falls in the
// sampling region of the map can contribute, about twice the map size per axis at most, and the
// functions below visit only those. Per axis, the index range of the samples inside is found by
// bisection on the sampling expression itself (the coordinate is monotone in the index in floating
// point too), so exactly the samples a full loop finds inside are visited, in the loop's order, and the
// divisor stays the full sample count: results are those of the full loop. Samples outside add 0 to a
// sum; for a max, each run of consecutive outside samples is one candidate 0 at the place of its first
// sample in the loop, which keeps the full loop's maximum and arg-max (ties: the first).
// In exact arithmetic at most 2 * extent + 3 samples of an adaptive axis land on the map (they are more
// than 0.5 apart). Rounding can put more there where box coordinates are huge: in float32 beyond ~2^22
// feature pixels, consecutive samples round to the same point. An axis with more samples inside than
// roi_axis_cap visits each run of equal samples once, weighted by its length (the sum then differs from
// the sequential one in the last bits), which keeps the work bounded; below the cap every sample inside
// is visited one by one.

// First i in [lo, hi) with pred(i), for a predicate that is false then true on [lo, hi); hi if none.
template <typename Pred>
DCNKIT_HD int64_t first_true(int64_t lo, int64_t hi, const Pred& pred) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (pred(mid)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// Samples [lo, hi) of one axis (empty when lo >= hi).
struct SampleRange {
  int64_t lo, hi;
};

// The samples i in [0, n) whose coordinate coord(i) lies in [a, b], for a coordinate non-decreasing in
// i (`increasing`) or non-increasing. NaN is outside.
template <typename Acc, typename Coord>
DCNKIT_HD SampleRange sample_range(int64_t n, bool increasing, Acc a, Acc b, const Coord& coord) {
  SampleRange r;
  if (increasing) {
    r.lo = first_true(int64_t(0), n, [&](int64_t i) { return coord(i) >= a; });
    r.hi = first_true(r.lo, n, [&](int64_t i) { return !(coord(i) <= b); });
  } else {
    r.lo = first_true(int64_t(0), n, [&](int64_t i) { return coord(i) <= b; });
    r.hi = first_true(r.lo, n, [&](int64_t i) { return !(coord(i) >= a); });
  }
  return r;
}

// End (exclusive) of the run of samples from i on whose coordinate equals c = coord(i), within [i, hi).
template <typename Acc, typename Coord>
DCNKIT_HD int64_t sample_run_end(int64_t i, int64_t hi, Acc c, const Coord& coord) {
  if (i + 1 >= hi || coord(i + 1) != c) return i + 1;
  return first_true(i + 2, hi, [&](int64_t j) { return coord(j) != c; });
}

// Coordinate of sample i along one axis of a RoIAlign bin: origin + (i + 0.5) * bin / g.
template <typename Acc>
struct RoIAxis {
  Acc origin, bin;
  int64_t g;
  DCNKIT_HD Acc operator()(int64_t i) const {
    return origin + (static_cast<Acc>(i) + Acc(0.5)) * bin / static_cast<Acc>(g);
  }
};

// Sample (iy, ix) of a bin whose top-left corner is (y0, x0).
template <typename Acc>
DCNKIT_HD Taps<Acc> roi_bin_sample(const RoIAlignBox<Acc>& b, Acc y0, Acc x0, int64_t iy, int64_t ix,
                                   int64_t H, int64_t W) {
  return roi_taps(RoIAxis<Acc>{y0, b.bin_h, b.gh}(iy), RoIAxis<Acc>{x0, b.bin_w, b.gw}(ix), H, W);
}

// Number of samples of a bin (0: empty grid), saturated at 2^63 - 1.
template <typename Acc>
DCNKIT_HD int64_t roi_bin_samples(const RoIAlignBox<Acc>& b) {
  if (b.gh <= 0 || b.gw <= 0) return 0;
  const int64_t kMax = int64_t(0x7fffffffffffffff);
  return b.gh <= kMax / b.gw ? b.gh * b.gw : kMax;
}

// The divisor of an avg bin: its number of samples gh * gw (0: empty grid).
template <typename Acc>
DCNKIT_HD Acc roi_bin_count(const RoIAlignBox<Acc>& b) {
  if (b.gh <= 0 || b.gw <= 0) return Acc(0);
  if (b.gh <= int64_t(0x7fffffffffffffff) / b.gw) return static_cast<Acc>(b.gh * b.gw);
  return static_cast<Acc>(b.gh) * static_cast<Acc>(b.gw);
}

// Most samples inside visited one by one along an axis of the map's `extent` (see above).
DCNKIT_HD int64_t roi_axis_cap(int64_t extent) {
  const int64_t c = 4 * (extent + 2);
  return c > kMaxSamplingRatio ? c : kMaxSamplingRatio;
}

// Visits the samples of one RoIAlign bin with corner (y0, x0) that can contribute, in the order of the
// full loop (iy outer, ix inner): visit(taps, m, y, x) for each sample inside the map (m = 1), or each run of
// m equal samples beyond roi_axis_cap, at its coordinates (y, x), and visit(outside, 0, NaN, NaN) (taps.inside
// false) where a run of samples outside the map begins. Stops early when visit returns false.
template <typename Acc, typename Visit>
DCNKIT_HD void roi_bin_visit_at(const RoIAlignBox<Acc>& b, Acc y0, Acc x0, int64_t H, int64_t W, Visit& visit) {
  if (b.gh <= 0 || b.gw <= 0) return;
  const RoIAxis<Acc> ay{y0, b.bin_h, b.gh}, ax{x0, b.bin_w, b.gw};
  SampleRange ry{0, 0}, rx{0, 0};
  if (H > 0 && W > 0) {  // roi_taps: inside when -1 <= y <= H and -1 <= x <= W
    ry = sample_range(b.gh, !(b.bin_h < Acc(0)), Acc(-1), static_cast<Acc>(H), ay);
    if (ry.lo < ry.hi) rx = sample_range(b.gw, !(b.bin_w < Acc(0)), Acc(-1), static_cast<Acc>(W), ax);
  }
  Taps<Acc> out;
  taps_clear(out);
  const Acc nan = std::numeric_limits<Acc>::quiet_NaN();
  if (ry.lo >= ry.hi || rx.lo >= rx.hi) {
    visit(out, Acc(0), nan, nan);
    return;
  }
  const bool y_runs = ry.hi - ry.lo > roi_axis_cap(H), x_runs = rx.hi - rx.lo > roi_axis_cap(W);
  if (ry.lo > 0 && !visit(out, Acc(0), nan, nan)) return;
  for (int64_t iy = ry.lo; iy < ry.hi;) {
    const Acc y = ay(iy);
    const int64_t ey = y_runs ? sample_run_end(iy, ry.hi, y, ay) : iy + 1;
    const Acc my = static_cast<Acc>(ey - iy);
    if (rx.lo > 0 && !visit(out, Acc(0), nan, nan)) return;
    for (int64_t ix = rx.lo; ix < rx.hi;) {
      const Acc x = ax(ix);
      const int64_t ex = x_runs ? sample_run_end(ix, rx.hi, x, ax) : ix + 1;
      if (!visit(roi_taps(y, x, H, W), my * static_cast<Acc>(ex - ix), y, x)) return;
      ix = ex;
    }
    if (rx.hi < b.gw && !visit(out, Acc(0), nan, nan)) return;
    iy = ey;
  }
  if (ry.hi < b.gh) visit(out, Acc(0), nan, nan);
}

// The same for visitors of the taps only: visit(taps, m).
template <typename Visit>
struct RoIVisitTaps {
  Visit& v;
  template <typename Acc>
  DCNKIT_HD bool operator()(const Taps<Acc>& t, Acc m, Acc, Acc) { return v(t, m); }
};
template <typename Acc, typename Visit>
DCNKIT_HD void roi_bin_visit(const RoIAlignBox<Acc>& b, Acc y0, Acc x0, int64_t H, int64_t W, Visit& visit) {
  RoIVisitTaps<Visit> at{visit};
  roi_bin_visit_at(b, y0, x0, H, W, at);
}

// Sample sources for the bin functions below, both visited in the same order: the samples of a bin
// computed on the fly (CUDA), or collected once per RoI and bin and reused for every channel (CPU).
template <typename Acc>
struct RoISample {
  Taps<Acc> t;
  Acc m;  // number of equal samples (0 for an outside run)
};
template <typename Acc>
struct RoIBinTaps {
  const RoIAlignBox<Acc>* box;
  Acc y0, x0;
  int64_t H, W;
  template <typename Visit>
  DCNKIT_HD void visit(Visit& v) const {
    roi_bin_visit(*box, y0, x0, H, W, v);
  }
};
template <typename Acc>
struct TapsArray {
  const RoISample<Acc>* s;
  int64_t n;
  template <typename Visit>
  DCNKIT_HD void visit(Visit& v) const {
    for (int64_t i = 0; i < n; ++i)
      if (!v(s[i].t, s[i].m)) return;
  }
};

// Visitors of the bin functions.
template <typename Acc, typename T>
struct RoIBinSum {  // sum of the samples inside
  const T* img;
  Acc sum;
  DCNKIT_HD bool operator()(const Taps<Acc>& t, Acc m) {
    if (t.inside) sum += taps_value(img, t) * m;
    return true;
  }
};
template <typename Acc, typename T>
struct RoIBinMax {  // largest sample (outside: 0), the first on ties; its taps when `keep`
  const T* img;
  bool keep, any;
  Acc best;
  Taps<Acc> best_taps;
  DCNKIT_HD bool operator()(const Taps<Acc>& t, Acc) {
    const Acc v = t.inside ? taps_value(img, t) : Acc(0);
    if (!any || v > best) {
      any = true;
      best = v;
      if (keep) best_taps = t;
    }
    return true;
  }
};
template <typename Acc, typename Add>
struct RoIBinSpread {  // g to every sample inside, times its weights
  Acc g;
  Add* add;
  DCNKIT_HD bool operator()(const Taps<Acc>& t, Acc m) {
    if (!t.inside) return true;
    const Acc gm = g * m;
    for (int i = 0; i < 4; ++i) (*add)(t.idx[i], gm * t.w[i]);
    return true;
  }
};
template <typename Acc, typename T>
struct RoIBinCoordSum {  // sums of dS/dy and dS/dx over the samples inside
  const T* img;
  Acc sy, sx;
  DCNKIT_HD bool operator()(const Taps<Acc>& t, Acc m) {
    if (!t.inside) return true;
    Acc dy, dx;
    taps_coord_grad(img, t, dy, dx);
    sy += dy * m;
    sx += dx * m;
    return true;
  }
};

// Forward of one bin of one channel map `img` from its samples (`n` of them, roi_bin_count): the mean
// (avg) or the largest (max); 0 when n == 0.
template <typename Acc, typename T, typename Src>
DCNKIT_HD Acc roi_bin_reduce(const T* img, Acc n, const Src& src, bool max_mode) {
  if (!(n > Acc(0))) return Acc(0);
  if (max_mode) {
    RoIBinMax<Acc, T> v{img, false, false, Acc(0), {}};
    src.visit(v);
    return v.best;
  }
  RoIBinSum<Acc, T> v{img, Acc(0)};
  src.visit(v);
  return v.sum / n;
}

// Backward of one bin: scatters the bin's output gradient g into the channel's input gradient through
// add(index, value) (CPU: +=, CUDA: atomicAdd). avg: g / n to every sample; max: g to the arg-max
// sample, recomputed from `img` (avg does not read `img`).
template <typename Acc, typename T, typename Src, typename Add>
DCNKIT_HD void roi_bin_scatter(const T* img, Acc n, const Src& src, bool max_mode, Acc g, Add& add) {
  if (!(n > Acc(0))) return;
  if (max_mode) {
    RoIBinMax<Acc, T> v{img, true, false, Acc(0), {}};
    src.visit(v);
    if (!v.any || !v.best_taps.inside) return;
    for (int i = 0; i < 4; ++i) add(v.best_taps.idx[i], g * v.best_taps.w[i]);
    return;
  }
  RoIBinSpread<Acc, Add> v{g / n, &add};
  src.visit(v);
}

// Derivatives of one avg bin's value with respect to its corner (y0, x0) (every sample moves with
// it): the mean over samples of dS/dy and dS/dx. DeformRoIPool's offset gradient is
// gamma * roi_w * (sum over channels of g * gx) in x and gamma * roi_h * (... gy) in y.
template <typename Acc, typename T, typename Src>
DCNKIT_HD void roi_bin_coord_grad(const T* img, Acc n, const Src& src, Acc* gy, Acc* gx) {
  *gy = Acc(0);
  *gx = Acc(0);
  if (!(n > Acc(0))) return;
  RoIBinCoordSum<Acc, T> v{img, Acc(0), Acc(0)};
  src.visit(v);
  *gy = v.sy / n;
  *gx = v.sx / n;
}

// The same three, sampling on the fly (one bin with corner (y0, x0)).
template <typename Acc, typename T>
DCNKIT_HD Acc roi_align_bin_forward(const T* img, int64_t H, int64_t W, const RoIAlignBox<Acc>& b,
                                    Acc y0, Acc x0, bool max_mode) {
  return roi_bin_reduce<Acc>(img, roi_bin_count(b), RoIBinTaps<Acc>{&b, y0, x0, H, W}, max_mode);
}
template <typename Acc, typename T, typename Add>
DCNKIT_HD void roi_align_bin_backward(const T* img, int64_t H, int64_t W, const RoIAlignBox<Acc>& b,
                                      Acc y0, Acc x0, bool max_mode, Acc g, Add& add) {
  roi_bin_scatter<Acc>(img, roi_bin_count(b), RoIBinTaps<Acc>{&b, y0, x0, H, W}, max_mode, g, add);
}
template <typename Acc, typename T>
DCNKIT_HD void roi_align_bin_coord_grad(const T* img, int64_t H, int64_t W, const RoIAlignBox<Acc>& b,
                                        Acc y0, Acc x0, Acc* gy, Acc* gx) {
  roi_bin_coord_grad<Acc>(img, roi_bin_count(b), RoIBinTaps<Acc>{&b, y0, x0, H, W}, gy, gx);
}

// DeformRoIPool: the box of an aligned RoIAlign, bins shifted by the offsets of RoI k (null: none).
template <typename Acc, typename T>
DCNKIT_HD RoIAlignBox<Acc> deform_roi_pool_box(const DeformRoIPoolParams& p, const T* roi) {
  return roi_align_box<Acc>(roi, static_cast<Acc>(p.attrs.spatial_scale), true, p.attrs.pooled_h,
                            p.attrs.pooled_w, p.attrs.sampling_ratio);
}
template <typename Acc, typename T>
DCNKIT_HD void deform_roi_pool_origin(const DeformRoIPoolParams& p, const RoIAlignBox<Acc>& box,
                                      const T* offset, int64_t k, int64_t ph, int64_t pw, Acc* y0,
                                      Acc* x0) {
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  const T* ox = offset ? offset + (k * 2 * oh + ph) * ow + pw : nullptr;
  const T* oy = offset ? ox + oh * ow : nullptr;
  roi_bin_origin<Acc, T>(box, ph, pw, ox, oy, static_cast<Acc>(p.attrs.gamma), y0, x0);
}

// ---------------------------------------------------------------------------------------------
// CUDA helpers of the RoI launchers (nvcc only)

// Element i of a (K, C, oh, ow) tensor (outputs of the RoI ops; C is output_dim for DeformPSRoIPool).
struct RoIElement {
  int64_t k, c, ph, pw;
};
DCNKIT_HD RoIElement roi_element(int64_t i, int64_t C, int64_t oh, int64_t ow) {
  return {i / (ow * oh * C), (i / (ow * oh)) % C, (i / ow) % oh, i % ow};
}

#if defined(__CUDACC__)
// The CUDA launchers never synchronise and never read device data on the host: a RoI whose batch index is
// outside [0, N) or NaN (roi_batch_index false) gives zeros on the device (forward writes 0, backward
// skips it), never an out-of-bounds read. A front end may report it asynchronously (the torch ops run a
// device-side assert with roi_batch_device_message).

// Scatter functor of the backward functions: atomicAdd into `base`, a buffer of the accumulation type
// (the gradient itself for float and double, its float32 accumulator for 16-bit types; see GradAcc).
template <typename Acc>
struct RoIAtomicAdd {
  Acc* base;
  __device__ __forceinline__ void operator()(int64_t i, Acc v) const { atomicAdd(base + i, v); }
};

}  // namespace dcnkit
// glibc's assert handler, which CUDA implements on the device (declared here: <assert.h> does not under NDEBUG).
extern "C" __host__ __device__ void __assert_fail(const char*, const char*, unsigned int, const char*) noexcept;
namespace dcnkit {

// The device-side assert of a RoI whose batch index is outside [0, N) or NaN, raised where the params ask for
// it (RoIAlignParams::assert_batch_index: the torch ops). It holds under NDEBUG too (as torch's kernel asserts).
__device__ __noinline__ inline void roi_batch_index_assert_fail() {
  __assert_fail("rois[:, 0] (batch index): expected values in [0, N) (the batch size of input)", __FILE__,
                __LINE__, "roi batch index");
}
#endif

}  // namespace dcnkit
