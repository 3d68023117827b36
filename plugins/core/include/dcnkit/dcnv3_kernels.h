// DCNv3 / DCNv4: the per-thread math, written once for the CPU launchers (dcnv3.cpp) and the CUDA kernels
// (dcnv3.cu). One call covers a run of channels [c0, c0 + count) of one (n, ho, wo, group): each kernel point's
// location, weight and bilinear taps are computed once and reused for every channel of the run (the input is
// channels-last, so the run is contiguous at each tap).
//
// Sampling is S_zero: bilinear with zeros outside and pixel centres at integers, the corner rule of bilinear.h
// (dcn_taps): a neighbour outside the map is never read, one inside is read even with weight 0 (as
// InternImage's kernels and grid_sample); NaN and infinite locations sample as 0.
#pragma once

#include <cmath>

#include "dcnkit/bilinear.h"
#include "dcnkit/channel_runs.h"
#include "dcnkit/dcnv3.h"
#include "dcnkit/grad_adders.h"

namespace dcnkit {

// Channels per CUDA thread (dcnv3.cu), also run by the CPU over the same grid (DCNKIT_DCN_CPU_PATH=cuda-schedule).
constexpr int kDcnv3ForwardChunk = 8;
constexpr int kDcnv3BackwardChunk = 4;

// Kernel point k (0 <= k < K) as (i_h, i_w): w-major, the centre skipped when remove_center.
DCNKIT_HD void dcnv3_point_index(const Dcnv3Params& p, int64_t k, int64_t* i_h, int64_t* i_w) {
  int64_t kk = k;
  if (p.remove_center && kk >= (p.kernel_h * p.kernel_w - 1) / 2) ++kk;
  *i_w = kk / p.kernel_h;
  *i_h = kk - *i_w * p.kernel_h;
}

// Where (n, ho, wo, g)'s offsets and weights start, in elements.
struct Dcnv3Site {
  int64_t pos;     // (n*Ho + ho)*Wo + wo
  int64_t off0;    // offset of point 0's dx
  int64_t mask0;   // weight of point 0
  int64_t out0;    // (n, ho, wo, g*gc) in output / grad_output
  int64_t image0;  // (n, 0, 0, g*gc) in input / grad_input
};

DCNKIT_HD Dcnv3Site dcnv3_site(const Dcnv3Params& p, int64_t n, int64_t ho, int64_t wo, int64_t g) {
  Dcnv3Site s;
  const int64_t C = p.groups * p.group_channels;
  s.pos = (n * p.out_h + ho) * p.out_w + wo;
  s.off0 = s.pos * p.offset_row + g * p.offset_group;
  s.mask0 = p.mask_base + s.pos * p.mask_row + g * p.mask_group;
  s.out0 = s.pos * C + g * p.group_channels;
  s.image0 = n * p.height * p.width * C + g * p.group_channels;
  return s;
}

// The launch grid of the CUDA kernels, which the CPU forward runs too: thread i covers the site (n, ho, wo, g) and
// one run of kChunk of the group's channels (dcnkit/channel_runs.h).
struct Dcnv3Thread {
  int64_t n, ho, wo, g;
  ChannelRun run;
};

template <int kChunk>
DCNKIT_HD int64_t dcnv3_thread_count(const Dcnv3Params& p) {
  return p.batch * p.out_h * p.out_w * p.groups * channel_run_count<kChunk>(p.group_channels);
}

template <int kChunk>
DCNKIT_HD Dcnv3Thread dcnv3_thread(const Dcnv3Params& p, int64_t i) {
  Dcnv3Thread t;
  t.run = channel_run<kChunk>(i, channel_run_count<kChunk>(p.group_channels), p.group_channels);
  int64_t rest = t.run.site;
  t.g = rest % p.groups;
  rest /= p.groups;
  t.wo = rest % p.out_w;
  rest /= p.out_w;
  t.ho = rest % p.out_h;
  t.n = rest / p.out_h;
  return t;
}

// The sampling location (y, x) of point k (pixel coordinates of the unpadded map).
template <typename Acc, typename T>
DCNKIT_HD void dcnv3_location(const Dcnv3Params& p, const T* offset, const Dcnv3Site& s, int64_t ho, int64_t wo,
                              int64_t k, Acc* y, Acc* x) {
  int64_t i_h, i_w;
  dcnv3_point_index(p, k, &i_h, &i_w);
  const int64_t ch = (p.dilation_h * (p.kernel_h - 1)) / 2, cw = (p.dilation_w * (p.kernel_w - 1)) / 2;
  const Acc scale = Acc(p.offset_scale);
  const T* o = offset + s.off0 + 2 * k;
  *x = Acc(wo * p.stride_w - p.pad_w + cw) + (Acc(i_w * p.dilation_w - cw) + to_acc<Acc>(o[0])) * scale;
  *y = Acc(ho * p.stride_h - p.pad_h + ch) + (Acc(i_h * p.dilation_h - ch) + to_acc<Acc>(o[1])) * scale;
}

// Point k's bilinear taps (dcn_taps of its location; not inside: it samples 0).
template <typename Acc, typename T>
DCNKIT_HD Taps<Acc> dcnv3_point_taps(const Dcnv3Params& p, const T* offset, const Dcnv3Site& s, int64_t ho,
                                     int64_t wo, int64_t k) {
  Acc y, x;
  dcnv3_location<Acc, T>(p, offset, s, ho, wo, k, &y, &x);
  return dcn_taps<Acc>(y, x, p.height, p.width);
}

// The weights of one (n, ho, wo, g) as used: as given, or softmax over the K points (DCNv4's `softmax`). With
// softmax, weight(k) = exp(m_k - max) / sum.
template <typename Acc, typename T>
struct Dcnv3Weights {
  const T* m;  // point 0's raw weight
  bool softmax;
  Acc max = Acc(0), inv_sum = Acc(1);
  DCNKIT_HD Dcnv3Weights(const Dcnv3Params& p, const T* mask, const Dcnv3Site& s)
      : m(mask + s.mask0), softmax(p.softmax) {
    if (!softmax) return;
    max = to_acc<Acc>(m[0]);
    for (int64_t k = 1; k < p.points; ++k) max = to_acc<Acc>(m[k]) > max ? to_acc<Acc>(m[k]) : max;
    Acc sum = Acc(0);
    for (int64_t k = 0; k < p.points; ++k) sum += std::exp(to_acc<Acc>(m[k]) - max);
    inv_sum = Acc(1) / sum;
  }
  DCNKIT_HD Acc operator()(int64_t k) const {
    return softmax ? std::exp(to_acc<Acc>(m[k]) - max) * inv_sum : to_acc<Acc>(m[k]);
  }
};

// Forward: output channels [c0, c0 + count) of (n, ho, wo, g), count <= kChunk.
template <int kChunk, typename Acc, typename T>
DCNKIT_HD void dcnv3_forward_channels(const Dcnv3Params& p, const T* input, const T* offset, const T* mask,
                                      int64_t n, int64_t ho, int64_t wo, int64_t g, int64_t c0, int count,
                                      T* output) {
  Acc acc[kChunk];
  for (int c = 0; c < kChunk; ++c) acc[c] = Acc(0);
  const Dcnv3Site s = dcnv3_site(p, n, ho, wo, g);
  const Dcnv3Weights<Acc, T> weight(p, mask, s);
  const int64_t C = p.groups * p.group_channels;
  const T* img = input + s.image0 + c0;
  for (int64_t k = 0; k < p.points; ++k) {
    const Taps<Acc> t = dcnv3_point_taps<Acc, T>(p, offset, s, ho, wo, k);
    if (!t.inside) continue;
    const Acc m = weight(k);
    for (int q = 0; q < 4; ++q) {
      if (!t.ok[q]) continue;  // outside the map: never read
      const Acc w = m * t.w[q];
      const T* v = img + t.idx[q] * C;
      for_channels<kChunk>(count, [&](int c) { acc[c] += w * to_acc<Acc>(v[c]); });
    }
  }
  T* out = output + s.out0 + c0;
  for_channels<kChunk>(count, [&](int c) { out[c] = from_acc<T>(acc[c]); });
}

// Backward of channels [c0, c0 + count) of (n, ho, wo, g), count <= kChunk. Scatters the input gradient with
// add_input(index into grad_input, v), and reports this run's share of each point's gradients with
// add_point(offset index of dx, weight index, d raw weight, d dx, d dy): the callers add the runs of a point up
// (CPU: +=, CUDA: atomicAdd). Softmax's backward is linear in the sampled values' gradients, so the runs' shares
// add up to the whole: d raw_k = s_k * (g_k - sum_j s_j g_j), reported in two parts.
template <int kChunk, typename Acc, typename T, typename AddInput, typename AddPoint>
DCNKIT_HD void dcnv3_backward_channels(const Dcnv3Params& p, const T* grad_output, const T* input, const T* offset,
                                       const T* mask, int64_t n, int64_t ho, int64_t wo, int64_t g, int64_t c0,
                                       int count, AddInput& add_input, AddPoint& add_point) {
  const Dcnv3Site s = dcnv3_site(p, n, ho, wo, g);
  const Dcnv3Weights<Acc, T> weight(p, mask, s);
  const int64_t C = p.groups * p.group_channels;
  Acc go[kChunk];
  for (int c = 0; c < kChunk; ++c) go[c] = c < count ? to_acc<Acc>(grad_output[s.out0 + c0 + c]) : Acc(0);
  const int64_t img0 = s.image0 + c0;
  const Acc scale = Acc(p.offset_scale);
  Acc weighted_sum = Acc(0);  // softmax: sum_j s_j g_j
  for (int64_t k = 0; k < p.points; ++k) {
    const Taps<Acc> t = dcnv3_point_taps<Acc, T>(p, offset, s, ho, wo, k);
    if (!t.inside) continue;
    const Acc m = weight(k);
    Acc gm = Acc(0), gy = Acc(0), gx = Acc(0);
    for (int q = 0; q < 4; ++q) {
      if (!t.ok[q]) continue;  // outside the map: never read, no gradient
      const int64_t at = img0 + t.idx[q] * C;
      Acc dot = Acc(0);  // grad_output . input at this tap
      for_channels<kChunk>(count, [&](int c) { dot += go[c] * to_acc<Acc>(input[at + c]); });
      gm += t.w[q] * dot;
      gy += t.dwy[q] * dot;
      gx += t.dwx[q] * dot;
      if (t.w[q] == Acc(0)) continue;  // adds nothing
      const Acc w = m * t.w[q];
      for_channels<kChunk>(count, [&](int c) { add_input(at + c, w * go[c]); });
    }
    // x = ... + dx * scale: d x / d dx = scale.
    add_point(s.off0 + 2 * k, s.mask0 + k, p.softmax ? m * gm : gm, m * gx * scale, m * gy * scale);
    weighted_sum += m * gm;
  }
  if (p.softmax) {
    for (int64_t k = 0; k < p.points; ++k) add_point(s.off0 + 2 * k, s.mask0 + k, -weight(k) * weighted_sum, Acc(0),
                                                     Acc(0));
  }
}

// The work of one CUDA thread i of the forward kernel (kDcnv3ForwardChunk channels).
template <typename Acc, typename T>
DCNKIT_HD void dcnv3_forward_thread(const Dcnv3Params& p, const T* input, const T* offset, const T* mask, T* output,
                                    int64_t i) {
  const Dcnv3Thread t = dcnv3_thread<kDcnv3ForwardChunk>(p, i);
  dcnv3_forward_channels<kDcnv3ForwardChunk, Acc, T>(p, input, offset, mask, t.n, t.ho, t.wo, t.g, t.run.c0,
                                                     t.run.count, output);
}

// add_point of dcnv3_backward_channels through `Add` (AtomicAdd on CUDA, PlainAdd on the CPU); a zero share is not
// added (it changes nothing, and saves an atomic).
template <typename Acc, typename Add>
struct Dcnv3PointAdd {
  Acc* grad_offset;
  Acc* grad_mask;
  Add add;
  DCNKIT_HD void operator()(int64_t o, int64_t mi, Acc gw, Acc gx, Acc gy) const {
    if (gw != Acc(0)) add(grad_mask + mi, gw);
    if (gx != Acc(0)) add(grad_offset + o, gx);
    if (gy != Acc(0)) add(grad_offset + o + 1, gy);
  }
};

// The work of one CUDA thread i of the backward kernel (kDcnv3BackwardChunk channels), scattering through `Add`
// into the zeroed accumulation-type gradients (DCNv4: grad_mask is grad_offset, the fused offset_mask gradient).
template <typename Acc, typename T, typename Add>
DCNKIT_HD void dcnv3_backward_thread(const Dcnv3Params& p, const T* grad_output, const T* input, const T* offset,
                                     const T* mask, Acc* grad_input, Acc* grad_offset, Acc* grad_mask, int64_t i,
                                     Add add) {
  IndexAdd<Acc, Add> add_input{grad_input, add};
  Dcnv3PointAdd<Acc, Add> add_point{grad_offset, grad_mask, add};
  const Dcnv3Thread t = dcnv3_thread<kDcnv3BackwardChunk>(p, i);
  dcnv3_backward_channels<kDcnv3BackwardChunk, Acc, T>(p, grad_output, input, offset, mask, t.n, t.ho, t.wo, t.g,
                                                       t.run.c0, t.run.count, add_input, add_point);
}

}  // namespace dcnkit
