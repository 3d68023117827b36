// Per-element math of the three RoI operators (RoIAlign, DeformRoIPool, DeformPSRoIPool), written once
// as DCNKIT_HD templates and called by the CPU launchers (loops) and the CUDA launchers (grid-stride
// kernels). T is the storage type, Acc the accumulation type. Sampling goes through bilinear.h
// (roi_taps / psroi_taps); nothing here interpolates by itself. See OPS.md for the contract.
//
// Every function only reads the four taps of a sample when the sample is inside the map, so a map with
// H == 0 or W == 0 is never read. Non-finite box coordinates or offsets give sampling points that are
// NaN or infinite: those sample as outside (0, or skipped), and an adaptive grid of a non-finite box
// is empty.
#pragma once

#include <cmath>
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

// Host check of every RoI's batch index (CPU launchers call it before any read).
template <typename T>
inline Status check_roi_batch_indices(const char* op, const T* rois, int64_t num_rois,
                                      int64_t batch) {
  for (int64_t k = 0; k < num_rois; ++k) {
    int64_t b = 0;
    if (!roi_batch_index<double>(rois + k * 5, batch, &b)) {
      return arg_error(op, "rois[" + std::to_string(k) + ", 0] (batch index)",
                       "a value in [0, " + std::to_string(batch) + ") (the batch size of input)",
                       to_str(static_cast<double>(rois[k * 5])));
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

// Sample (iy, ix) of a bin whose top-left corner is (y0, x0).
template <typename Acc>
DCNKIT_HD Taps<Acc> roi_bin_sample(const RoIAlignBox<Acc>& b, Acc y0, Acc x0, int64_t iy, int64_t ix,
                                   int64_t H, int64_t W) {
  const Acc y = y0 + (static_cast<Acc>(iy) + Acc(0.5)) * b.bin_h / static_cast<Acc>(b.gh);
  const Acc x = x0 + (static_cast<Acc>(ix) + Acc(0.5)) * b.bin_w / static_cast<Acc>(b.gw);
  return roi_taps(y, x, H, W);
}

template <typename Acc, typename T>
DCNKIT_HD Acc roi_sample_value(const T* img, const Taps<Acc>& t) {
  return t.inside ? taps_value(img, t) : Acc(0);
}

// Forward of one bin of one channel map `img` (H x W): the mean (avg) or the largest (max) of the
// gh x gw samples; 0 when the grid is empty. `argmax` (optional) receives the index iy * gw + ix of
// the largest sample (the first one on ties), -1 for an empty grid.
template <typename Acc, typename T>
DCNKIT_HD Acc roi_align_bin_forward(const T* img, int64_t H, int64_t W, const RoIAlignBox<Acc>& b,
                                    Acc y0, Acc x0, bool max_mode, int64_t* argmax = nullptr) {
  if (argmax != nullptr) *argmax = -1;
  if (b.gh <= 0 || b.gw <= 0) return Acc(0);
  Acc sum = Acc(0), best = Acc(0);
  int64_t best_i = -1;
  for (int64_t iy = 0; iy < b.gh; ++iy) {
    for (int64_t ix = 0; ix < b.gw; ++ix) {
      const Acc v = roi_sample_value(img, roi_bin_sample(b, y0, x0, iy, ix, H, W));
      if (max_mode) {
        if (best_i < 0 || v > best) {
          best = v;
          best_i = iy * b.gw + ix;
        }
      } else {
        sum += v;
      }
    }
  }
  if (argmax != nullptr) *argmax = best_i;
  return max_mode ? best : sum / static_cast<Acc>(b.gh * b.gw);
}

// Backward of one bin: scatters the bin's output gradient g into the channel's input gradient through
// add(index, value) (CPU: +=, CUDA: atomicAdd). avg: g / (gh*gw) to every sample; max: g to the
// arg-max sample, recomputed from `img`.
template <typename Acc, typename T, typename Add>
DCNKIT_HD void roi_align_bin_backward(const T* img, int64_t H, int64_t W, const RoIAlignBox<Acc>& b,
                                      Acc y0, Acc x0, bool max_mode, Acc g, Add& add) {
  if (b.gh <= 0 || b.gw <= 0) return;
  if (max_mode) {
    int64_t am = -1;
    roi_align_bin_forward(img, H, W, b, y0, x0, true, &am);
    if (am < 0) return;
    const Taps<Acc> t = roi_bin_sample(b, y0, x0, am / b.gw, am % b.gw, H, W);
    if (!t.inside) return;
    for (int i = 0; i < 4; ++i) add(t.idx[i], g * t.w[i]);
    return;
  }
  const Acc gs = g / static_cast<Acc>(b.gh * b.gw);
  for (int64_t iy = 0; iy < b.gh; ++iy) {
    for (int64_t ix = 0; ix < b.gw; ++ix) {
      const Taps<Acc> t = roi_bin_sample(b, y0, x0, iy, ix, H, W);
      if (!t.inside) continue;
      for (int i = 0; i < 4; ++i) add(t.idx[i], gs * t.w[i]);
    }
  }
}

// Derivatives of one avg bin's value with respect to its corner (y0, x0) (every sample moves with
// it): the mean over samples of dS/dy and dS/dx. DeformRoIPool's offset gradient is
// gamma * roi_w * (sum over channels of g * gx) in x and gamma * roi_h * (... gy) in y.
template <typename Acc, typename T>
DCNKIT_HD void roi_align_bin_coord_grad(const T* img, int64_t H, int64_t W, const RoIAlignBox<Acc>& b,
                                        Acc y0, Acc x0, Acc* gy, Acc* gx) {
  *gy = Acc(0);
  *gx = Acc(0);
  if (b.gh <= 0 || b.gw <= 0) return;
  Acc sy = Acc(0), sx = Acc(0);
  for (int64_t iy = 0; iy < b.gh; ++iy) {
    for (int64_t ix = 0; ix < b.gw; ++ix) {
      const Taps<Acc> t = roi_bin_sample(b, y0, x0, iy, ix, H, W);
      if (!t.inside) continue;
      Acc dy, dx;
      taps_coord_grad(img, t, dy, dx);
      sy += dy;
      sx += dx;
    }
  }
  const Acc n = static_cast<Acc>(b.gh * b.gw);
  *gy = sy / n;
  *gx = sx / n;
}

// ---------------------------------------------------------------------------------------------
// DeformPSRoIPool (R-FCN)

template <typename Acc>
struct PSRoIBin {
  int64_t channel;           // input channel (ctop * group_size + gh) * group_size + gw
  int64_t trans_x, trans_y;  // flat indices into trans of tx and ty; -1 without trans
  Acc h0, w0;                // first sample
  Acc sub_h, sub_w;          // sample spacing
  Acc roi_h, roi_w;
};

// Geometry of output (k, ctop, ph, pw). `roi` is row k of rois; `trans` the whole trans tensor or null.
template <typename Acc, typename T>
DCNKIT_HD PSRoIBin<Acc> psroi_bin(const DeformPSRoIPoolParams& p, const T* roi, const T* trans,
                                  int64_t k, int64_t ctop, int64_t ph, int64_t pw) {
  const int64_t P = p.attrs.output_size, G = p.attrs.group_size, ps = p.attrs.part_size;
  const int64_t spp = p.attrs.sample_per_part;
  const Acc s = static_cast<Acc>(p.attrs.spatial_scale);
  PSRoIBin<Acc> r;
  const Acc x_start = std::round(to_acc<Acc>(roi[1])) * s - Acc(0.5);
  const Acc y_start = std::round(to_acc<Acc>(roi[2])) * s - Acc(0.5);
  const Acc x_end = (std::round(to_acc<Acc>(roi[3])) + Acc(1)) * s - Acc(0.5);
  const Acc y_end = (std::round(to_acc<Acc>(roi[4])) + Acc(1)) * s - Acc(0.5);
  r.roi_w = x_end - x_start;
  r.roi_h = y_end - y_start;
  if (r.roi_w < Acc(0.1)) r.roi_w = Acc(0.1);
  if (r.roi_h < Acc(0.1)) r.roi_h = Acc(0.1);
  const Acc bin_w = r.roi_w / static_cast<Acc>(P), bin_h = r.roi_h / static_cast<Acc>(P);
  r.sub_w = bin_w / static_cast<Acc>(spp);
  r.sub_h = bin_h / static_cast<Acc>(spp);
  // floor(ph / P * part_size), in integers.
  const int64_t part_h = ph * ps / P, part_w = pw * ps / P;
  Acc tx = Acc(0), ty = Acc(0);
  r.trans_x = r.trans_y = -1;
  if (trans != nullptr) {
    const int64_t nc = p.num_classes;
    const int64_t class_id = ctop / (p.attrs.output_dim / nc);
    r.trans_x = ((k * 2 * nc + 2 * class_id) * ps + part_h) * ps + part_w;
    r.trans_y = r.trans_x + ps * ps;
    const Acc std_ = static_cast<Acc>(p.attrs.trans_std);
    tx = to_acc<Acc>(trans[r.trans_x]) * std_;
    ty = to_acc<Acc>(trans[r.trans_y]) * std_;
  }
  r.w0 = static_cast<Acc>(pw) * bin_w + x_start + tx * r.roi_w;
  r.h0 = static_cast<Acc>(ph) * bin_h + y_start + ty * r.roi_h;
  int64_t gw = pw * G / P, gh = ph * G / P;
  gw = gw < 0 ? 0 : (gw > G - 1 ? G - 1 : gw);
  gh = gh < 0 ? 0 : (gh > G - 1 ? G - 1 : gh);
  r.channel = (ctop * G + gh) * G + gw;
  return r;
}

template <typename Acc>
DCNKIT_HD Taps<Acc> psroi_bin_sample(const PSRoIBin<Acc>& r, int64_t ih, int64_t iw, int64_t H,
                                     int64_t W) {
  return psroi_taps(r.h0 + static_cast<Acc>(ih) * r.sub_h, r.w0 + static_cast<Acc>(iw) * r.sub_w, H, W);
}

// Forward of one output: mean of the samples taken (0 when none); *count receives their number.
template <typename Acc, typename T>
DCNKIT_HD Acc psroi_bin_forward(const T* img, int64_t H, int64_t W, const PSRoIBin<Acc>& r,
                                int64_t spp, Acc* count) {
  Acc sum = Acc(0);
  int64_t n = 0;
  for (int64_t ih = 0; ih < spp; ++ih) {
    for (int64_t iw = 0; iw < spp; ++iw) {
      const Taps<Acc> t = psroi_bin_sample(r, ih, iw, H, W);
      if (!t.inside) continue;
      sum += taps_value(img, t);
      ++n;
    }
  }
  *count = static_cast<Acc>(n);
  return n > 0 ? sum / static_cast<Acc>(n) : Acc(0);
}

// Backward of one output into the input map: g / count to every sample taken (count from the forward).
template <typename Acc, typename Add>
DCNKIT_HD void psroi_bin_backward(int64_t H, int64_t W, const PSRoIBin<Acc>& r, int64_t spp,
                                  Acc count, Acc g, Add& add) {
  if (!(count > Acc(0))) return;
  const Acc d = g / count;
  for (int64_t ih = 0; ih < spp; ++ih) {
    for (int64_t iw = 0; iw < spp; ++iw) {
      const Taps<Acc> t = psroi_bin_sample(r, ih, iw, H, W);
      if (!t.inside) continue;
      for (int i = 0; i < 4; ++i) add(t.idx[i], d * t.w[i]);
    }
  }
}

// Gradient of one output with respect to its trans entries: *gtx (for trans_x) and *gty (trans_y),
// the sums over samples taken of dS/dw and dS/dh times g / count, times trans_std * roi_w and
// trans_std * roi_h.
template <typename Acc, typename T>
DCNKIT_HD void psroi_bin_trans_grad(const T* img, int64_t H, int64_t W, const PSRoIBin<Acc>& r,
                                    int64_t spp, Acc trans_std, Acc count, Acc g, Acc* gtx,
                                    Acc* gty) {
  *gtx = Acc(0);
  *gty = Acc(0);
  if (!(count > Acc(0))) return;
  Acc sy = Acc(0), sx = Acc(0);
  for (int64_t ih = 0; ih < spp; ++ih) {
    for (int64_t iw = 0; iw < spp; ++iw) {
      const Taps<Acc> t = psroi_bin_sample(r, ih, iw, H, W);
      if (!t.inside) continue;
      Acc dy, dx;
      taps_coord_grad(img, t, dy, dx);
      sy += dy;
      sx += dx;
    }
  }
  const Acc d = g / count;
  *gtx = sx * d * trans_std * r.roi_w;
  *gty = sy * d * trans_std * r.roi_h;
}

// ---------------------------------------------------------------------------------------------
// CUDA helpers of the RoI launchers (nvcc only)

#if defined(__CUDACC__)
// Scatter functor of the backward functions: atomicAdd into `base` (float or double).
template <typename T>
struct RoIAtomicAdd {
  T* base;
  __device__ __forceinline__ void operator()(int64_t i, T v) const { atomicAdd(base + i, v); }
};

// Accumulated value -> storage type (exact for float and double, rounded for half and bfloat16).
template <typename T, typename Acc>
__device__ __forceinline__ T roi_store(Acc v) {
  if constexpr (std::is_same<T, Acc>::value) {
    return v;
  } else {
    return from_acc<T>(static_cast<float>(v));
  }
}
#endif

}  // namespace dcnkit
