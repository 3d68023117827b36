// RoIAlignRotated (mmcv's roi_align_rotated; rotated detectors' RoI pooler). See docs/operators.md.
//   input (N, C, H, W), rois (K, 6) rows [batch_index, cx, cy, w, h, angle (radians)]  ->  output (K, C, oh, ow)
// The params and launchers, then the per-element math (DCNKIT_HD) that the CPU launchers and the CUDA kernels
// both run: a RoI's head (its box, computed once), then one body per (RoI, slice of channels, bin), driven by a CPU
// loop or by a CUDA block (roi_align_rotated.cu: one block per (RoI, group of 32 channels), the head in shared memory).
// The deterministic CUDA backward's gather is in roi_align_rotated_gather.h.
#pragma once

#include <cmath>

#include "dcnkit/common.h"
#include "dcnkit/context.h"
#include "dcnkit/roi_gather.h"
#include "dcnkit/roi_kernels.h"
#include "dcnkit/roi_plan.h"

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
// of roi_gather.h (RotatedGather): no atomics, the same bits on every run. Workspace: the float32 accumulation of a
// 16-bit grad_input (0 for float32 and float64), or the gather's (its RoIs' boxes, running sums).
size_t roi_align_rotated_backward_workspace_cuda(const RoIAlignRotatedParams& p, DType dtype, bool deterministic);
Status roi_align_rotated_forward_cuda(const RoIAlignRotatedParams& p, DType dtype, DType rois_dtype,
                                      const void* input, const void* rois, void* output, const CudaContext& ctx);
Status roi_align_rotated_backward_cuda(const RoIAlignRotatedParams& p, DType dtype, DType rois_dtype,
                                       const void* grad_output, const void* rois, void* grad_input, void* workspace,
                                       const CudaContext& ctx);

// ---------------------------------------------------------------------------------------------
// Per-element math

// Channels one work item carries: its sampling points (and their four taps) are computed once for all of them. Four
// for double (its accumulators take two registers each: the kernels stay within 48).
template <typename Acc>
DCNKIT_HD constexpr int rotated_channels() {
  return sizeof(Acc) == 8 ? 4 : 8;
}
constexpr int kRotatedMaxChannels = 8;

// sin and cos of an angle. On the device through sincospi, whose argument reduction is exact: sin / cos carry a slow
// path for huge arguments that needs a local-memory stack frame (the kernel report's gate); theta / pi costs half an
// ulp of the angle.
template <typename Acc>
DCNKIT_HD void rotated_sincos(Acc theta, Acc* s, Acc* c) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(Acc) == 8) {
    sincospi(div_count(theta, 3.141592653589793), s, c);
  } else {
    sincospif(div_count(theta, 3.14159265f), s, c);
  }
#else
  *s = std::sin(theta);
  *c = std::cos(theta);
#endif
}

template <typename Acc>
struct RotatedBox {
  Acc cy, cx;            // centre in feature coordinates (minus half a pixel when aligned)
  Acc start_h, start_w;  // -roi_h / 2, -roi_w / 2: the box's corner in its own frame
  Acc bin_h, bin_w;
  Acc cos_t, sin_t;
  Acc count;             // the divisor: gh * gw, at least 1
  Acc ghf, gwf;          // gh, gw as Acc: the sample axes' divisors
  int32_t gh, gw;        // samples per bin and axis (0: empty grid)
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
  b.start_h = -h * Acc(0.5);  // -h / 2, the same bits
  b.start_w = -w * Acc(0.5);
  b.bin_h = div_count(h, index_to_acc<Acc>(a.pooled_h));
  b.bin_w = div_count(w, index_to_acc<Acc>(a.pooled_w));
  rotated_sincos(theta, &b.sin_t, &b.cos_t);
  b.gh = roi_grid_size(h, a.pooled_h, a.sampling_ratio);  // at most kMaxGridSamples (mmcv's grid is an int)
  b.gw = roi_grid_size(w, a.pooled_w, a.sampling_ratio);
  b.ghf = static_cast<Acc>(b.gh);
  b.gwf = static_cast<Acc>(b.gw);
  b.count = b.gh > 0 && b.gw > 0 ? index_to_acc<Acc>(int64_t(b.gh) * b.gw) : Acc(1);
  return b;
}

// What a block knows about its RoI: the box and the batch index (-1: outside [0, N) or NaN; the RoI pools zeros).
template <typename Acc>
struct RotatedHead {
  RotatedBox<Acc> box;
  int64_t b;
};
template <typename Acc, typename R>
DCNKIT_HD RotatedHead<Acc> roi_align_rotated_head(const RoIAlignRotatedParams& p, const R* rois, int64_t k) {
  RotatedHead<Acc> h;
  if (!roi_batch_index<Acc>(rois + k * 6, p.batch, &h.b)) h.b = -1;
  h.box = roi_align_rotated_box<Acc>(rois + k * 6, p.attrs);
  return h;
}

// A point (yy, xx) of the box's frame in feature coordinates. Box: a RotatedBox<Acc>, possibly volatile (a block's
// head read from shared memory at each use).
template <typename Acc, typename Box>
DCNKIT_HD Acc rotated_y(const Box& b, Acc yy, Acc xx) {
  return yy * b.cos_t - xx * b.sin_t + b.cy;
}
template <typename Acc, typename Box>
DCNKIT_HD Acc rotated_x(const Box& b, Acc yy, Acc xx) {
  return yy * b.sin_t + xx * b.cos_t + b.cx;
}

// Grids up to this size per axis are looped over in full; larger ones visit only the samples that can land on
// the map (below).
constexpr int32_t kRotatedFullGrid = 16;

// What the visit's loops read but do not change (the bin's axes' origins, the rows' end, the row's coordinate, the
// map's size): a per-thread slot of shared memory on the device (RotatedFrameRef, volatile), a local elsewhere; the
// box's fields are read from the head (volatile on the device) at each use.
template <typename Acc>
struct RotatedFrame {
  Acc y0, x0, yy;
  int32_t yhi;
  AxisIndex H, W;
};
template <typename Acc>
using RotatedFrameRef = DeviceVolatile<RotatedFrame<Acc>>*;

// Calls visit(s) (RoIBinSample) for the samples of bin (ph, pw) that land on the map (roi_taps: -1 <= y <= H, -1 <= x
// <= W), in the order of the full loop (iy outer, ix inner); s.m is 1, or the length of a run of equal samples where
// rounding made them equal (boxes far beyond 2^22 feature pixels in float32). Samples off the map add nothing.
// Sample (iy, ix) is at yy(iy), xx(ix) in the box's frame (RoIAxis: origin + (i + 0.5) * bin / g), rotated about the
// centre: y = yy cos - xx sin + cy, x = yy sin + xx cos + cx.
// Bounded work: the rows are those whose yy lies within the projection of the map onto the box's y axis (widened
// by more than the rounding of the coordinates), and in a row the samples inside are an index range found by
// bisection on the sampling expressions themselves (each coordinate is monotone in ix, in floating point too). So
// the work of a bin is bounded by the map's size, whatever the box. Sample indices are 32-bit (kMaxGridSamples).
template <typename Acc, typename Box, typename Visit, typename F>
DCNKIT_HD void roi_align_rotated_visit(const Box& b, int32_t ph, int32_t pw, int64_t H, int64_t W, Visit& visit, F f) {
  const int32_t gh = b.gh, gw = b.gw;
  if (gh <= 0 || gw <= 0 || H <= 0 || W <= 0) return;
  f->y0 = b.start_h + static_cast<Acc>(ph) * b.bin_h;
  f->x0 = b.start_w + static_cast<Acc>(pw) * b.bin_w;
  f->H = static_cast<AxisIndex>(H);
  f->W = static_cast<AxisIndex>(W);
  const auto ay = [&](int32_t i) { return roi_sample_coord<Acc>(f->y0, b.bin_h, b.ghf, i); };
  const auto ax = [&](int32_t i) { return roi_sample_coord<Acc>(f->x0, b.bin_w, b.gwf, i); };
  RoIBinSample<Acc> s;
  s.m = Acc(1);
  if (gh <= kRotatedFullGrid && gw <= kRotatedFullGrid) {
    for (int32_t iy = 0; iy < gh; ++iy) {
      f->yy = ay(iy);
      for (int32_t ix = 0; ix < gw; ++ix) {
        const Acc xx = ax(ix);
        s.y = roi_axis_taps(rotated_y<Acc>(b, f->yy, xx), f->H);
        s.x = roi_axis_taps(rotated_x<Acc>(b, f->yy, xx), f->W);
        s.W = f->W;
        if (s.inside()) visit(s);
      }
    }
    return;
  }
  // Rows: yy = (y - cy) cos + (x - cx) sin over the corners of [-1, H] x [-1, W], widened by tol.
  // (converted from the frame: a conversion of the kernel's parameter would be hoisted out of the caller's loops)
  const Acc Hf = index_to_acc<Acc>(static_cast<AxisIndex>(f->H)), Wf = index_to_acc<Acc>(static_cast<AxisIndex>(f->W));
  Acc lo = Acc(0), hi = Acc(0);
  for (int q = 0; q < 4; ++q) {
    const Acc v = ((q & 2) ? Hf - b.cy : Acc(-1) - b.cy) * b.cos_t + ((q & 1) ? Wf - b.cx : Acc(-1) - b.cx) * b.sin_t;
    lo = q == 0 || v < lo ? v : lo;
    hi = q == 0 || v > hi ? v : hi;
  }
  const Acc eps = sizeof(Acc) == 8 ? Acc(2.3e-16) : Acc(1.2e-7);
  const Acc mag = std::fabs(b.cy) + std::fabs(b.cx) + std::fabs(b.start_h) + std::fabs(b.start_w) + (Hf + Wf);
  const Acc tol = Acc(1) + Acc(64) * eps * mag;
  const SampleRange ry = sample_range(gh, !(b.bin_h < Acc(0)), lo - tol, hi + tol, ay);
  const int64_t cap = roi_axis_cap(H + W + 8);
  const bool y_runs = ry.hi - ry.lo > cap;
  f->yhi = ry.hi;
  for (int32_t iy = ry.lo; iy < f->yhi;) {
    f->yy = ay(iy);
    const int32_t ey = y_runs ? sample_run_end(iy, f->yhi, static_cast<Acc>(f->yy), ay) : iy + 1;
    const auto py = [&](int32_t ix) { return rotated_y<Acc>(b, f->yy, ax(ix)); };
    const auto px = [&](int32_t ix) { return rotated_x<Acc>(b, f->yy, ax(ix)); };
    // y decreases in ix when sin > 0, x when cos < 0 (bin_w < 0 reverses both).
    const bool up = !(b.bin_w < Acc(0));
    const SampleRange rx0 = sample_range(gw, up == !(b.sin_t > Acc(0)), Acc(-1), Hf, py);
    const SampleRange rx1 = sample_range(gw, up == !(b.cos_t < Acc(0)), Acc(-1), Wf, px);
    const int32_t xlo = rx0.lo > rx1.lo ? rx0.lo : rx1.lo, xhi = rx0.hi < rx1.hi ? rx0.hi : rx1.hi;
    const bool x_runs = xhi - xlo > cap;
    const Acc my = static_cast<Acc>(ey - iy);
    for (int32_t ix = xlo; ix < xhi;) {
      const Acc y = py(ix), x = px(ix);
      const int32_t ex = x_runs ? run_end(ix, xhi, [&](int32_t j) { return py(j) == y && px(j) == x; }) : ix + 1;
      s.y = roi_axis_taps(y, f->H);
      s.x = roi_axis_taps(x, f->W);
      s.W = f->W;
      s.m = my * static_cast<Acc>(ex - ix);
      if (s.inside()) visit(s);
      ix = ex;
    }
    iy = ey;
  }
}

// Offset of element (k, c0, ph, pw) of a (K, C, oh, ow) tensor with bins = oh * ow, in 64 bits (every product:
// ph * ow alone passes 2^31 with 2^31 bins).
DCNKIT_HD int64_t rotated_bin_offset(int64_t k, int64_t C, int64_t c0, int64_t bins, int32_t ph, int64_t ow,
                                     int32_t pw) {
  return (k * C + c0) * bins + static_cast<int64_t>(ph) * ow + pw;
}

// ---------------------------------------------------------------------------------------------
// Work items: per RoI, (slice of rotated_channels<Acc>() channels, bin) pairs, bin fastest (consecutive threads
// write consecutive outputs). A CUDA block takes the slices of its group of kRotatedBlockChannels channels.

constexpr int64_t kRotatedBlockChannels = 32;

// The head's view in the bodies below: on the device read from shared memory at each use (volatile), so that its
// fields take no registers across the loops.
#if defined(__CUDA_ARCH__)
template <typename Acc>
using RotatedHeadView = const volatile RotatedHead<Acc>&;
#else
template <typename Acc>
using RotatedHeadView = const RotatedHead<Acc>&;
#endif

// Forward of bin (ph, pw) of RoI k for channels [c0, c0 + nc) (nc <= kC): output[k, c, ph, pw] is the mean of the
// bin's samples; 0 for a RoI outside the batch. f: the visit's frame. kC: the CPU's rotated_channels<Acc>(), the CUDA
// visit kernels' 1.
template <typename Acc, int kC, typename T, typename F>
DCNKIT_HD void roi_align_rotated_forward_bin(const RoIAlignRotatedParams& p, RotatedHeadView<Acc> h, const T* input,
                                             int64_t k, int64_t c0, int nc, int32_t ph, int32_t pw, T* output, F f) {
  const int64_t bins = p.attrs.pooled_h * p.attrs.pooled_w, H = p.height, W = p.width, HW = H * W;
  Acc acc[kC];
  for (int c = 0; c < kC; ++c) acc[c] = Acc(0);
  const int64_t b = h.b;
  if (b >= 0) {
    const T* img = input + (b * p.channels + c0) * HW;
    auto visit = [&](const RoIBinSample<Acc>& s) {
      for (int c = 0; c < kC; ++c) {
        if (c < nc) acc[c] += s.m * s.value(img + c * HW);
      }
      return true;
    };
    roi_align_rotated_visit<Acc>(h.box, ph, pw, H, W, visit, f);
    for (int c = 0; c < kC; ++c) acc[c] = div_count(acc[c], static_cast<Acc>(h.box.count));
  }
  T* out = output + rotated_bin_offset(k, p.channels, c0, bins, ph, p.attrs.pooled_w, pw);
  for (int c = 0; c < kC; ++c) {
    if (c < nc) out[c * bins] = from_acc<T>(acc[c]);
  }
}

// Backward of bin (ph, pw) of RoI k for channels [c0, c0 + nc): grad_output[k, c, ph, pw] / count times each tap's
// weight, added into grad_input through add(offset, value) (atomics on CUDA). Nothing for a RoI outside the batch.
template <typename Acc, int kC, typename T, typename Add, typename F>
DCNKIT_HD void roi_align_rotated_backward_bin(const RoIAlignRotatedParams& p, RotatedHeadView<Acc> h,
                                              const T* grad_output, int64_t k, int64_t c0, int nc, int32_t ph,
                                              int32_t pw, const Add& add, F f) {
  const int64_t b = h.b;
  if (b < 0) return;
  const int64_t bins = p.attrs.pooled_h * p.attrs.pooled_w, HW = p.height * p.width;
  Acc g[kC];
  const T* go = grad_output + rotated_bin_offset(k, p.channels, c0, bins, ph, p.attrs.pooled_w, pw);
  for (int c = 0; c < kC; ++c) {
    g[c] = c < nc ? div_count(to_acc<Acc>(go[c * bins]), static_cast<Acc>(h.box.count)) : Acc(0);
  }
  const int64_t base = (b * p.channels + c0) * HW;
  auto visit = [&](const RoIBinSample<Acc>& s) {
    const Taps<Acc> t = s.taps();
    for (int j = 0; j < 4; ++j) {
      const Acc w = s.m * t.w[j];
      for (int c = 0; c < kC; ++c) {
        if (c < nc) add(base + c * HW + t.idx[j], g[c] * w);
      }
    }
    return true;
  };
  roi_align_rotated_visit<Acc>(h.box, ph, pw, p.height, p.width, visit, f);
}

// A block's items (channel group g of kRotatedBlockChannels channels, one thread in `step` from `tid`): f(c0, nc, ph,
// pw) for each of its (slice of kC channels, bin) pairs, slice c0 of nc channels. The pairs are walked with 32-bit
// counters (fewer than 2^31 bins: check_rotated_cuda), no division in the loop.
template <int kC, typename F>
DCNKIT_HD void roi_align_rotated_block_items(const RoIAlignRotatedParams& p, int64_t g, int tid, int step, const F& f) {
  const int64_t first = g * kRotatedBlockChannels;
  const int64_t rest = p.channels - first, group = rest < kRotatedBlockChannels ? rest : kRotatedBlockChannels;
  const int32_t slices = static_cast<int32_t>((group + kC - 1) / kC);
  roi_block_bins<int32_t>(slices, static_cast<int32_t>(p.attrs.pooled_h), static_cast<int32_t>(p.attrs.pooled_w), tid,
                          step, [&](int32_t s, int32_t ph, int32_t pw) {
                            const int64_t c0 = first + int64_t(s) * kC;
                            const int nc = static_cast<int>(group - int64_t(s) * kC < kC ? group - int64_t(s) * kC : kC);
                            f(c0, nc, ph, pw);
                          });
}

// Channel groups of the blocks (grid y).
DCNKIT_HD int64_t roi_align_rotated_groups(int64_t channels) {
  return (channels + kRotatedBlockChannels - 1) / kRotatedBlockChannels;
}

// ---------------------------------------------------------------------------------------------
// The sampling plan (CUDA's default path, as RoIAlign's: roi_plan.h): a RoI whose grid fits a plan (roi_plan_fits: at
// most kRoIPlanSamples samples per bin) has every sample of every bin computed once per block as taps (RoIPlanEntry),
// then RoIAlign's plan apply sums them per (channel, bin) (roi_plan_forward_items, roi_plan_backward_items): the
// samples of roi_align_rotated_visit's full loop, in its order, so the same bits. The others take the visit kernels.

// The plan head of a rotated RoI: batch index, map, divisor and plan stride (0: not planned).
template <typename Acc>
DCNKIT_HD RoIPlanHead<Acc> rotated_plan_head(const RoIAlignRotatedParams& p, const RotatedHead<Acc>& r) {
  RoIPlanHead<Acc> h;
  h.box = RoIAlignBox<Acc>{};
  h.b = r.b;
  h.H = p.height;
  h.W = p.width;
  h.level = 0;
  h.n = r.box.count;
  const int64_t gh = r.box.gh, gw = r.box.gw;
  h.stride = roi_plan_fits<Acc>(gh, gw, p.attrs.pooled_h * p.attrs.pooled_w, h.H * h.W) ? int32_t(gh * gw) : 0;
  return h;
}

// The plan of a planned rotated head (roi_plan_fill's layout: entry bin * stride + iy * gw + ix), this thread's share.
template <typename Acc>
DCNKIT_HD void rotated_plan_fill(const RoIAlignRotatedParams& p, RotatedHeadView<Acc> h, int32_t stride, int tid,
                                 int step, RoIPlanEntry<Acc>* plan) {
  const uint32_t ow = static_cast<uint32_t>(p.attrs.pooled_w), S = static_cast<uint32_t>(stride);
  const uint32_t gw = static_cast<uint32_t>(h.box.gw), total = static_cast<uint32_t>(p.attrs.pooled_h) * ow * S;
  const int32_t H = static_cast<int32_t>(p.height), W = static_cast<int32_t>(p.width);
  for (uint32_t e = static_cast<uint32_t>(tid); e < total; e += static_cast<uint32_t>(step)) {
    const uint32_t bin = e / S, s = e % S;
    const Acc yy = roi_sample_coord<Acc>(h.box.start_h + static_cast<Acc>(bin / ow) * h.box.bin_h, h.box.bin_h,
                                         h.box.ghf, s / gw);
    const Acc xx = roi_sample_coord<Acc>(h.box.start_w + static_cast<Acc>(bin % ow) * h.box.bin_w, h.box.bin_w,
                                         h.box.gwf, s % gw);
    roi_plan_store(roi_axis_taps(rotated_y<Acc>(h.box, yy, xx), H), roi_axis_taps(rotated_x<Acc>(h.box, yy, xx), W), W,
                   &plan[e]);
  }
}

// The CUDA launchers' limits, checked once per launch on the host: fewer than 2^31 rows, columns and bins, at most
// 2^31 - 1 RoIs and 65535 channel groups.
inline Status check_rotated_cuda(const char* op, const RoIAlignRotatedParams& p) {
  DCNKIT_RETURN_IF_ERROR(check_cuda_map_axes(op, "input", p.height, p.width));
  if (p.attrs.pooled_h * p.attrs.pooled_w >= (int64_t(1) << 31)) {
    return arg_error(op, "output_size", "fewer than 2^31 bins on CUDA",
                     std::to_string(p.attrs.pooled_h) + " x " + std::to_string(p.attrs.pooled_w));
  }
  if (p.num_rois > kCudaMaxGridX) {
    return arg_error(op, "rois", "at most 2^31 - 1 RoIs on CUDA", std::to_string(p.num_rois));
  }
  if (roi_align_rotated_groups(p.channels) > kCudaMaxGridYZ) {
    return arg_error(op, "input", "at most " + std::to_string(kCudaMaxGridYZ * kRotatedBlockChannels) +
                     " channels on CUDA", std::to_string(p.channels));
  }
  return Status::Ok();
}

}  // namespace dcnkit

#include "dcnkit/roi_align_rotated_gather.h"
