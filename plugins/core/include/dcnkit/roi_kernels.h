// Per-element math of the three RoI operators (RoIAlign, DeformRoIPool, DeformPSRoIPool), written once
// as DCNKIT_HD templates and called by the CPU launchers (loops) and the CUDA launchers (grid-stride
// kernels). T is the storage type, Acc the accumulation type. Sampling goes through bilinear.h
// (roi_taps / psroi_taps); nothing here interpolates by itself. See docs/operators.md for the contract.
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

// Number of samples of a bin (0: empty grid).
template <typename Acc>
DCNKIT_HD int64_t roi_bin_samples(const RoIAlignBox<Acc>& b) {
  return (b.gh > 0 && b.gw > 0) ? b.gh * b.gw : 0;
}

// Taps sources for the bin functions below: sample i (= iy * gw + ix) of a bin, computed on the fly
// (CUDA) or read from taps precomputed once per RoI and bin and reused for every channel (CPU).
template <typename Acc>
struct RoIBinTaps {
  const RoIAlignBox<Acc>* box;
  Acc y0, x0;
  int64_t H, W;
  DCNKIT_HD Taps<Acc> operator()(int64_t i) const {
    return roi_bin_sample(*box, y0, x0, i / box->gw, i % box->gw, H, W);
  }
};
template <typename Acc>
struct TapsArray {
  const Taps<Acc>* taps;
  DCNKIT_HD const Taps<Acc>& operator()(int64_t i) const { return taps[i]; }
};

// Forward of one bin of one channel map `img` from its n samples: the mean (avg) or the largest (max);
// 0 when n == 0. `argmax` (optional) receives the index of the largest sample (the first on ties).
template <typename Acc, typename T, typename TapsAt>
DCNKIT_HD Acc roi_bin_reduce(const T* img, int64_t n, const TapsAt& taps_at, bool max_mode,
                             int64_t* argmax = nullptr) {
  if (argmax != nullptr) *argmax = -1;
  if (n <= 0) return Acc(0);
  Acc sum = Acc(0), best = Acc(0);
  int64_t best_i = -1;
  for (int64_t i = 0; i < n; ++i) {
    const auto& t = taps_at(i);
    const Acc v = roi_sample_value(img, t);
    if (max_mode) {
      if (best_i < 0 || v > best) {
        best = v;
        best_i = i;
      }
    } else {
      sum += v;
    }
  }
  if (argmax != nullptr) *argmax = best_i;
  return max_mode ? best : sum / static_cast<Acc>(n);
}

// Backward of one bin: scatters the bin's output gradient g into the channel's input gradient through
// add(index, value) (CPU: +=, CUDA: atomicAdd). avg: g / n to every sample; max: g to the arg-max
// sample, recomputed from `img` (avg does not read `img`).
template <typename Acc, typename T, typename TapsAt, typename Add>
DCNKIT_HD void roi_bin_scatter(const T* img, int64_t n, const TapsAt& taps_at, bool max_mode, Acc g,
                               Add& add) {
  if (n <= 0) return;
  if (max_mode) {
    int64_t am = -1;
    roi_bin_reduce<Acc>(img, n, taps_at, true, &am);
    if (am < 0) return;
    const auto& t = taps_at(am);
    if (!t.inside) return;
    for (int i = 0; i < 4; ++i) add(t.idx[i], g * t.w[i]);
    return;
  }
  const Acc gs = g / static_cast<Acc>(n);
  for (int64_t s = 0; s < n; ++s) {
    const auto& t = taps_at(s);
    if (!t.inside) continue;
    for (int i = 0; i < 4; ++i) add(t.idx[i], gs * t.w[i]);
  }
}

// Derivatives of one avg bin's value with respect to its corner (y0, x0) (every sample moves with
// it): the mean over samples of dS/dy and dS/dx. DeformRoIPool's offset gradient is
// gamma * roi_w * (sum over channels of g * gx) in x and gamma * roi_h * (... gy) in y.
template <typename Acc, typename T, typename TapsAt>
DCNKIT_HD void roi_bin_coord_grad(const T* img, int64_t n, const TapsAt& taps_at, Acc* gy, Acc* gx) {
  *gy = Acc(0);
  *gx = Acc(0);
  if (n <= 0) return;
  Acc sy = Acc(0), sx = Acc(0);
  for (int64_t s = 0; s < n; ++s) {
    const auto& t = taps_at(s);
    if (!t.inside) continue;
    Acc dy, dx;
    taps_coord_grad(img, t, dy, dx);
    sy += dy;
    sx += dx;
  }
  *gy = sy / static_cast<Acc>(n);
  *gx = sx / static_cast<Acc>(n);
}

// The same three, sampling on the fly (one bin with corner (y0, x0)).
template <typename Acc, typename T>
DCNKIT_HD Acc roi_align_bin_forward(const T* img, int64_t H, int64_t W, const RoIAlignBox<Acc>& b,
                                    Acc y0, Acc x0, bool max_mode) {
  return roi_bin_reduce<Acc>(img, roi_bin_samples(b), RoIBinTaps<Acc>{&b, y0, x0, H, W}, max_mode);
}
template <typename Acc, typename T, typename Add>
DCNKIT_HD void roi_align_bin_backward(const T* img, int64_t H, int64_t W, const RoIAlignBox<Acc>& b,
                                      Acc y0, Acc x0, bool max_mode, Acc g, Add& add) {
  roi_bin_scatter<Acc>(img, roi_bin_samples(b), RoIBinTaps<Acc>{&b, y0, x0, H, W}, max_mode, g, add);
}
template <typename Acc, typename T>
DCNKIT_HD void roi_align_bin_coord_grad(const T* img, int64_t H, int64_t W, const RoIAlignBox<Acc>& b,
                                        Acc y0, Acc x0, Acc* gy, Acc* gx) {
  roi_bin_coord_grad<Acc>(img, roi_bin_samples(b), RoIBinTaps<Acc>{&b, y0, x0, H, W}, gy, gx);
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
// CPU drivers of RoIAlign and DeformRoIPool (host only). Per RoI, the taps of a chunk of bins are
// computed once and reused for every channel; the arithmetic is the bin functions above.
//   box_of(roi) -> RoIAlignBox<T>;  origin_of(k, box, ph, pw, &y0, &x0): corner of bin (ph, pw).

constexpr int64_t kRoITapsBuffer = 256;

template <typename T, typename OriginOf>
inline void roi_fill_taps(const RoIAlignBox<T>& box, int64_t k, int64_t bin0, int64_t nb, int64_t ow,
                          int64_t H, int64_t W, int64_t n, const OriginOf& origin_of, Taps<T>* buf) {
  for (int64_t j = 0; j < nb; ++j) {
    const int64_t bin = bin0 + j;
    T y0, x0;
    origin_of(k, box, bin / ow, bin % ow, &y0, &x0);
    const RoIBinTaps<T> src{&box, y0, x0, H, W};
    for (int64_t i = 0; i < n; ++i) buf[j * n + i] = src(i);
  }
}

// output (K, C, oh, ow); parallel over RoIs. Batch indices must have been checked.
template <typename T, typename BoxOf, typename OriginOf>
void roi_pool_forward_cpu(const CpuContext& ctx, int64_t K, int64_t N, int64_t C, int64_t H,
                          int64_t W, int64_t oh, int64_t ow, bool max_mode, const T* input,
                          const T* rois, T* output, const BoxOf& box_of, const OriginOf& origin_of) {
  const int64_t bins = oh * ow;
  parallel_for(ctx, K, [&](int64_t kb, int64_t ke) {
    Taps<T> buf[kRoITapsBuffer];
    for (int64_t k = kb; k < ke; ++k) {
      const T* roi = rois + k * 5;
      int64_t b = 0;
      roi_batch_index<T>(roi, N, &b);
      const RoIAlignBox<T> box = box_of(roi);
      const int64_t n = roi_bin_samples(box);
      const T* img_b = input + b * C * H * W;
      T* out_k = output + k * C * bins;
      if (n > kRoITapsBuffer) {  // very large bins: sample on the fly
        for (int64_t bin = 0; bin < bins; ++bin) {
          T y0, x0;
          origin_of(k, box, bin / ow, bin % ow, &y0, &x0);
          for (int64_t c = 0; c < C; ++c) {
            out_k[c * bins + bin] = roi_align_bin_forward(img_b + c * H * W, H, W, box, y0, x0, max_mode);
          }
        }
        continue;
      }
      const int64_t chunk = n > 0 ? kRoITapsBuffer / n : bins;
      for (int64_t bin0 = 0; bin0 < bins; bin0 += chunk) {
        const int64_t nb = chunk < bins - bin0 ? chunk : bins - bin0;
        roi_fill_taps(box, k, bin0, nb, ow, H, W, n, origin_of, buf);
        for (int64_t c = 0; c < C; ++c) {
          const T* img = img_b + c * H * W;
          T* out = out_k + c * bins + bin0;
          for (int64_t j = 0; j < nb; ++j) {
            out[j] = roi_bin_reduce<T>(img, n, TapsArray<T>{buf + j * n}, max_mode);
          }
        }
      }
    }
  });
}

template <typename T>
struct CpuAddTo {
  T* base;
  void operator()(int64_t i, T v) const { base[i] += v; }
};

// grad_input (N, C, H, W), written; parallel over channels: a task owns grad_input[:, c] for all
// RoIs (race-free, deterministic). `input` is read in max mode only.
template <typename T, typename BoxOf, typename OriginOf>
void roi_pool_backward_cpu(const CpuContext& ctx, int64_t K, int64_t N, int64_t C, int64_t H,
                           int64_t W, int64_t oh, int64_t ow, bool max_mode, const T* grad_output,
                           const T* input, const T* rois, T* grad_input, const BoxOf& box_of,
                           const OriginOf& origin_of) {
  const int64_t bins = oh * ow;
  parallel_for(ctx, C, [&](int64_t cb, int64_t ce) {
    Taps<T> buf[kRoITapsBuffer];
    for (int64_t n = 0; n < N; ++n) {
      T* g = grad_input + (n * C + cb) * H * W;
      for (int64_t i = 0; i < (ce - cb) * H * W; ++i) g[i] = T(0);
    }
    for (int64_t k = 0; k < K; ++k) {
      const T* roi = rois + k * 5;
      int64_t b = 0;
      roi_batch_index<T>(roi, N, &b);
      const RoIAlignBox<T> box = box_of(roi);
      const int64_t n = roi_bin_samples(box);
      if (n == 0) continue;
      const int64_t chunk = n <= kRoITapsBuffer ? kRoITapsBuffer / n : 0;
      for (int64_t bin0 = 0; bin0 < bins; bin0 += (chunk > 0 ? chunk : 1)) {
        const int64_t nb = chunk == 0 ? 1 : (chunk < bins - bin0 ? chunk : bins - bin0);
        T y0 = T(0), x0 = T(0);
        if (chunk > 0) {
          roi_fill_taps(box, k, bin0, nb, ow, H, W, n, origin_of, buf);
        } else {
          origin_of(k, box, bin0 / ow, bin0 % ow, &y0, &x0);
        }
        for (int64_t c = cb; c < ce; ++c) {
          const T* img = max_mode ? input + (b * C + c) * H * W : nullptr;
          CpuAddTo<T> add{grad_input + (b * C + c) * H * W};
          const T* go = grad_output + (k * C + c) * bins + bin0;
          for (int64_t j = 0; j < nb; ++j) {
            const T g = go[j];
            if (g == T(0)) continue;
            if (chunk > 0) {
              roi_bin_scatter<T>(img, n, TapsArray<T>{buf + j * n}, max_mode, g, add);
            } else {
              roi_align_bin_backward(img, H, W, box, y0, x0, max_mode, g, add);
            }
          }
        }
      }
    }
  });
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
#endif

}  // namespace dcnkit
