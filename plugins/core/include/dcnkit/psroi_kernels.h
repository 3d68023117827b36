// Per-element math of DeformPSRoIPool (R-FCN), written once as DCNKIT_HD templates for the CPU loops and the
// CUDA kernels, on the bounded sampling ranges and taps of roi_kernels.h. See docs/operators.md.
#pragma once

#include "dcnkit/deform_psroi_pool.h"
#include "dcnkit/launch_limits.h"
#include "dcnkit/roi_kernels.h"

namespace dcnkit {
// DeformPSRoIPool (R-FCN)

template <typename Acc>
struct PSRoIBin {
  int64_t channel;           // input channel (ctop * group_size + gh) * group_size + gw
  int64_t trans_x, trans_y;  // flat indices into trans of tx and ty; -1 without trans
  Acc h0, w0;                // first sample
  Acc sub_h, sub_w;          // sample spacing
  Acc roi_h, roi_w;
};

// The RoI's part of the geometry (from row `roi` alone): box start, size and sample spacing.
template <typename Acc>
struct PSRoIBox {
  Acc x_start, y_start, roi_w, roi_h, bin_w, bin_h, sub_w, sub_h;
};
template <typename Acc, typename T>
DCNKIT_HD PSRoIBox<Acc> psroi_box(const DeformPSRoIPoolParams& p, const T* roi) {
  const Acc P = index_to_acc<Acc>(p.attrs.output_size), spp = index_to_acc<Acc>(p.attrs.sample_per_part);
  const Acc s = static_cast<Acc>(p.attrs.spatial_scale);
  PSRoIBox<Acc> b;
  b.x_start = std::round(to_acc<Acc>(roi[1])) * s - Acc(0.5);
  b.y_start = std::round(to_acc<Acc>(roi[2])) * s - Acc(0.5);
  const Acc x_end = (std::round(to_acc<Acc>(roi[3])) + Acc(1)) * s - Acc(0.5);
  const Acc y_end = (std::round(to_acc<Acc>(roi[4])) + Acc(1)) * s - Acc(0.5);
  b.roi_w = x_end - b.x_start;
  b.roi_h = y_end - b.y_start;
  if (b.roi_w < Acc(0.1)) b.roi_w = Acc(0.1);
  if (b.roi_h < Acc(0.1)) b.roi_h = Acc(0.1);
  b.bin_w = div_count(b.roi_w, P);
  b.bin_h = div_count(b.roi_h, P);
  b.sub_w = div_count(b.bin_w, spp);
  b.sub_h = div_count(b.bin_h, spp);
  return b;
}

// floor(a * b / c) of non-negative indices: in 32 bits on the device, whose launcher checks that the products stay
// below 2^31 (psroi_cuda_indices_fit); in 64 bits on the host.
DCNKIT_HD int64_t psroi_scaled_index(int64_t a, int64_t b, int64_t c) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(a) * static_cast<uint32_t>(b) / static_cast<uint32_t>(c);
#else
  return a * b / c;
#endif
}

// The CUDA kernels' 32-bit index arithmetic (psroi_scaled_index, AxisIndex), checked once per launch.
inline Status check_psroi_cuda(const char* op, const DeformPSRoIPoolParams& p) {
  const int64_t lim = int64_t(1) << 31, P = p.attrs.output_size;
  if (P * p.attrs.group_size >= lim || P * p.attrs.part_size >= lim || p.attrs.output_dim >= lim) {
    return arg_error(op, "output_size", "output_size x group_size, output_size x part_size and output_dim below 2^31 "
                     "on CUDA", std::to_string(P));
  }
  return check_cuda_map_axes(op, "input", p.height, p.width);
}

// Geometry of output (k, ctop, ph, pw) of RoI k's box. `trans`: the whole trans tensor or null.
template <typename Acc, typename T>
DCNKIT_HD PSRoIBin<Acc> psroi_bin_of_box(const DeformPSRoIPoolParams& p, const PSRoIBox<Acc>& b, const T* trans,
                                         int64_t k, int64_t ctop, int64_t ph, int64_t pw) {
  const int64_t P = p.attrs.output_size, G = p.attrs.group_size, ps = p.attrs.part_size;
  PSRoIBin<Acc> r;
  r.roi_w = b.roi_w;
  r.roi_h = b.roi_h;
  r.sub_w = b.sub_w;
  r.sub_h = b.sub_h;
  // floor(ph / P * part_size), in integers.
  const int64_t part_h = psroi_scaled_index(ph, ps, P), part_w = psroi_scaled_index(pw, ps, P);
  Acc tx = Acc(0), ty = Acc(0);
  r.trans_x = r.trans_y = -1;
  if (trans != nullptr) {
    const int64_t nc = p.num_classes;
    const int64_t class_id = psroi_scaled_index(ctop, 1, psroi_scaled_index(p.attrs.output_dim, 1, nc));
    r.trans_x = ((k * 2 * nc + 2 * class_id) * ps + part_h) * ps + part_w;
    r.trans_y = r.trans_x + ps * ps;
    const Acc std_ = static_cast<Acc>(p.attrs.trans_std);
    tx = to_acc<Acc>(trans[r.trans_x]) * std_;
    ty = to_acc<Acc>(trans[r.trans_y]) * std_;
  }
  r.w0 = index_to_acc<Acc>(pw) * b.bin_w + b.x_start + tx * r.roi_w;
  r.h0 = index_to_acc<Acc>(ph) * b.bin_h + b.y_start + ty * r.roi_h;
  int64_t gw = psroi_scaled_index(pw, G, P), gh = psroi_scaled_index(ph, G, P);
  gw = gw < 0 ? 0 : (gw > G - 1 ? G - 1 : gw);
  gh = gh < 0 ? 0 : (gh > G - 1 ? G - 1 : gh);
  r.channel = (ctop * G + gh) * G + gw;
  return r;
}

// Geometry of output (k, ctop, ph, pw). `roi` is row k of rois; `trans` the whole trans tensor or null.
template <typename Acc, typename T>
DCNKIT_HD PSRoIBin<Acc> psroi_bin(const DeformPSRoIPoolParams& p, const T* roi, const T* trans,
                                  int64_t k, int64_t ctop, int64_t ph, int64_t pw) {
  return psroi_bin_of_box<Acc, T>(p, psroi_box<Acc, T>(p, roi), trans, k, ctop, ph, pw);
}

// Coordinate of sample i along one axis of a DeformPSRoIPool bin: origin + i * step.
template <typename Acc>
struct PSRoIAxis {
  Acc origin, step;
  template <typename I>
  DCNKIT_HD Acc operator()(I i) const {
    return origin + index_to_acc<Acc>(i) * step;
  }
};

template <typename Acc>
DCNKIT_HD Taps<Acc> psroi_bin_sample(const PSRoIBin<Acc>& r, int64_t ih, int64_t iw, int64_t H,
                                     int64_t W) {
  return psroi_taps(PSRoIAxis<Acc>{r.h0, r.sub_h}(ih), PSRoIAxis<Acc>{r.w0, r.sub_w}(iw), H, W);
}

// The samples of an spp x spp grid that are taken (psroi_taps: -0.5 <= h <= H - 0.5, the same for w),
// as index ranges (see "Bounded sampling grids"): loops over them visit exactly the samples taken.
template <typename Acc>
DCNKIT_HD void psroi_bin_ranges(const PSRoIBin<Acc>& r, int64_t spp, int64_t H, int64_t W,
                                SampleRange* rh, SampleRange* rw) {
  *rh = SampleRange{0, 0};
  *rw = SampleRange{0, 0};
  if (H <= 0 || W <= 0) return;
  *rh = sample_range(spp, !(r.sub_h < Acc(0)), Acc(-0.5), index_to_acc<Acc>(H) - Acc(0.5),
                     PSRoIAxis<Acc>{r.h0, r.sub_h});
  if (rh->lo >= rh->hi) return;
  *rw = sample_range(spp, !(r.sub_w < Acc(0)), Acc(-0.5), index_to_acc<Acc>(W) - Acc(0.5),
                     PSRoIAxis<Acc>{r.w0, r.sub_w});
}

// Forward of one output: mean of the samples taken (0 when none); *count receives their number.
template <typename Acc, typename T>
DCNKIT_HD Acc psroi_bin_forward(const T* img, int64_t H, int64_t W, const PSRoIBin<Acc>& r,
                                int64_t spp, Acc* count) {
  Acc sum = Acc(0);
  int64_t n = 0;
  SampleRange rh, rw;
  psroi_bin_ranges(r, spp, H, W, &rh, &rw);
  for (int64_t ih = rh.lo; ih < rh.hi; ++ih) {
    for (int64_t iw = rw.lo; iw < rw.hi; ++iw) {
      const Taps<Acc> t = psroi_bin_sample(r, ih, iw, H, W);
      if (!t.inside) continue;
      sum += taps_value(img, t);
      ++n;
    }
  }
  *count = index_to_acc<Acc>(n);
  return n > 0 ? div_count(sum, *count) : Acc(0);
}

// Backward of one output into the input map: g / count to every sample taken (count from the forward).
template <typename Acc, typename Add>
DCNKIT_HD void psroi_bin_backward(int64_t H, int64_t W, const PSRoIBin<Acc>& r, int64_t spp,
                                  Acc count, Acc g, Add& add) {
  if (!(count > Acc(0))) return;
  const Acc d = div_rn(g, count);
  SampleRange rh, rw;
  psroi_bin_ranges(r, spp, H, W, &rh, &rw);
  for (int64_t ih = rh.lo; ih < rh.hi; ++ih) {
    for (int64_t iw = rw.lo; iw < rw.hi; ++iw) {
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
  SampleRange rh, rw;
  psroi_bin_ranges(r, spp, H, W, &rh, &rw);
  for (int64_t ih = rh.lo; ih < rh.hi; ++ih) {
    for (int64_t iw = rw.lo; iw < rw.hi; ++iw) {
      const Taps<Acc> t = psroi_bin_sample(r, ih, iw, H, W);
      if (!t.inside) continue;
      Acc dy, dx;
      taps_coord_grad(img, t, dy, dx);
      sy += dy;
      sx += dx;
    }
  }
  const Acc d = div_rn(g, count);
  *gtx = sx * d * trans_std * r.roi_w;
  *gty = sy * d * trans_std * r.roi_h;
}

// Output i = (k, ctop, ph, pw) of the forward and its sample count (count may be null); zeros for a RoI outside the
// batch. R: the RoIs' and trans's type (T, or float32 RoIs beside 16-bit data).
template <typename Acc, typename T, typename R>
DCNKIT_HD void psroi_forward_output(const DeformPSRoIPoolParams& p, const T* input, const R* rois, const R* trans,
                                    int64_t i, T* output, T* count) {
  const int64_t C = p.channels, H = p.height, W = p.width, P = p.attrs.output_size;
  const RoIElement e = roi_element(i, p.attrs.output_dim, P, P);
  const R* roi = rois + e.k * 5;
  int64_t b = 0;
  Acc v = Acc(0), cnt = Acc(0);
  if (roi_batch_index<Acc>(roi, p.batch, &b)) {
    const PSRoIBin<Acc> r = psroi_bin<Acc>(p, roi, trans, e.k, e.c, e.ph, e.pw);
    v = psroi_bin_forward<Acc>(input + (b * C + r.channel) * H * W, H, W, r, p.attrs.sample_per_part, &cnt);
  }
  output[i] = from_acc<T>(v);
  if (count != nullptr) count[i] = from_acc<T>(cnt);
}

}  // namespace dcnkit
