// DeformPSRoIPool's block schedule (its CUDA forward and grad_input, and the CPU test path
// DCNKIT_ROI_CPU_PATH=cuda-schedule):
// RoIAlign's (roi_plan.h) for the position-sensitive bins. One block per (RoI, group of kRoIPlanChannels output
// channels): thread 0 computes the RoI's box once (psroi_plan_head: the only RoI-field loads), the block plans every
// sample of every bin (psroi_plan_fill: int32 taps and weights; a tap's offset counts from the first input map of its
// output channel's group of group_size^2, so it names the bin's map too), then loops over (output channel, bin)
// pairs, bin fastest. A bin's geometry does not depend on the output channel when there is no trans or a single
// class (psroi_plan_fits); class-specific trans, more than kRoIPlanSamples samples per bin or groups of
// group_size^2 maps of 2^31 pixels keep the grid-stride kernel. The sums are psroi_bin_forward's: the samples
// taken, in its order, so the same bits.
#pragma once

#include <cstdint>
#if !defined(__CUDACC__)
#include <vector>
#endif

#include "dcnkit/psroi_kernels.h"
#include "dcnkit/roi_plan.h"

namespace dcnkit {

template <typename Acc>
struct PSRoIPlanHead {
  PSRoIBox<Acc> box;
  int64_t b;  // batch index; -1 when outside [0, N) or NaN (the block writes zeros)
};

// Plan entries of a DeformPSRoIPool call (output_size^2 bins of sample_per_part^2 samples).
inline int64_t psroi_plan_entries(const DeformPSRoIPoolParams& p) {
  const int64_t P = p.attrs.output_size, spp = p.attrs.sample_per_part;
  return P * P * spp * spp;
}

// Bytes of shared memory of a plan.
template <typename Acc>
inline int64_t psroi_plan_bytes(const DeformPSRoIPoolParams& p) {
  return psroi_plan_entries(p) * static_cast<int64_t>(sizeof(RoIPlanEntry<Acc>));
}

// Whether a call is planned (every RoI alike: the grid is explicit).
template <typename Acc>
inline bool psroi_plan_fits(const DeformPSRoIPoolParams& p) {
  const int64_t spp = p.attrs.sample_per_part, P = p.attrs.output_size;
  const bool one_geometry = p.attrs.no_trans || p.num_classes == 1;
  const int64_t G = p.attrs.group_size;
  return one_geometry && spp * spp <= kRoIPlanSamples && P <= 1024 && psroi_plan_bytes<Acc>(p) <= kRoIPlanBytes &&
         p.height * p.width <= int64_t(0x7fffffff) / (G * G);
}

// The head of RoI k (one thread per block).
template <typename Acc, typename T>
DCNKIT_HD PSRoIPlanHead<Acc> psroi_plan_head(const DeformPSRoIPoolParams& p, const T* rois, int64_t k) {
  const T* roi = rois + k * 5;
  PSRoIPlanHead<Acc> h;
  if (!roi_batch_index<Acc>(roi, p.batch, &h.b)) h.b = -1;
  h.box = psroi_box<Acc, T>(p, roi);
  return h;
}

// The plan of RoI k: entry e = bin * spp^2 + ih * spp + iw is sample (ih, iw) of bin `bin` (idx[0] = -1: not
// taken), its taps counted from the first map of the output channel's group (the bin's map within the group times
// H * W, plus the tap). `trans`: null without trans (one class otherwise: its geometry is output channel 0's).
template <typename Acc, typename T>
DCNKIT_HD void psroi_plan_fill(const DeformPSRoIPoolParams& p, const PSRoIPlanHead<Acc>& h, const T* trans, int64_t k,
                               int tid, int step, RoIPlanEntry<Acc>* plan) {
  const uint32_t P = static_cast<uint32_t>(p.attrs.output_size), spp = static_cast<uint32_t>(p.attrs.sample_per_part);
  const uint32_t S = spp * spp, total = P * P * S;
  for (uint32_t e = static_cast<uint32_t>(tid); e < total; e += static_cast<uint32_t>(step)) {
    const uint32_t bin = e / S, s = e % S;
    const PSRoIBin<Acc> r = psroi_bin_of_box<Acc, T>(p, h.box, trans, k, 0, bin / P, bin % P);
    const Taps<Acc> t = psroi_bin_sample(r, s / spp, s % spp, p.height, p.width);
    const int64_t map = r.channel * p.height * p.width;  // output channel 0: the map within the group
    for (int i = 0; i < 4; ++i) {
      plan[e].idx[i] = t.inside ? static_cast<int32_t>(map + t.idx[i]) : -1;
      plan[e].w[i] = t.w[i];
    }
  }
}

// Forward of a planned block: output and count (K, output_dim, P, P) of RoI k, output channels [c0, c0 + nc);
// count may be null. roi_plan_forward_items' walk (RoIPlanWalk) over the groups' first maps.
template <typename Acc, typename T>
DCNKIT_HD void psroi_plan_forward_items(const DeformPSRoIPoolParams& p, const PSRoIPlanHead<Acc>& h,
                                        const RoIPlanEntry<Acc>* plan, const T* input, int64_t k, int64_t c0,
                                        int64_t nc, int tid, int step, T* output, T* count) {
  const int64_t GHW = p.attrs.group_size * p.attrs.group_size * p.height * p.width;
  const int32_t S = static_cast<int32_t>(p.attrs.sample_per_part * p.attrs.sample_per_part);
  const int32_t bins = static_cast<int32_t>(p.attrs.output_size * p.attrs.output_size);
  const uint32_t ub = static_cast<uint32_t>(bins), ut = static_cast<uint32_t>(tid), us = static_cast<uint32_t>(step);
  const int32_t total = static_cast<int32_t>(nc) * bins, dc = static_cast<int32_t>(us / ub),
                db = static_cast<int32_t>(us % ub);
  const int32_t bin = static_cast<int32_t>(ut % ub);
  RoIPlanWalk<Acc, T> w{input + (h.b < 0 ? 0 : h.b) * p.channels * p.height * p.width + (c0 + ut / ub) * GHW,
                        plan + bin * S, bin};
  const int64_t o = (k * p.attrs.output_dim + c0) * bins + tid;
  T* out = output + o;
  T* cnt = count != nullptr ? count + o : nullptr;
  const int64_t dimg = dc * GHW;
  const int32_t n = h.b >= 0 ? S : 0;
  for (int32_t item = tid; item < total; item += step) {
    Acc sum = Acc(0);
    int32_t taken = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll 1
#endif
    for (int32_t i = 0; i < n; ++i) {
      const RoIPlanEntry<Acc> s = w.e[i];
      if (s.idx[0] < 0) continue;
      sum += roi_plan_value(w.img, s);
      ++taken;
    }
    *out = from_acc<T>(taken > 0 ? div_count(sum, static_cast<Acc>(taken)) : Acc(0));
    out += step;
    if (cnt != nullptr) {
      *cnt = from_acc<T>(static_cast<Acc>(taken));
      cnt += step;
    }
    w.next(dimg, GHW, db, S, bins);
  }
}

// grad_input of a planned block: scatters grad_output of RoI k, output channels [c0, c0 + nc), through add(index,
// value) into grad_input's (N, C, H, W) accumulation buffer: g / count (the forward's count) times each weight of
// every sample taken, as psroi_bin_backward (grad_trans keeps the grid-stride kernel).
template <typename Acc, typename T, typename AddAt>
DCNKIT_HD void psroi_plan_backward_items(const DeformPSRoIPoolParams& p, const PSRoIPlanHead<Acc>& h,
                                         const RoIPlanEntry<Acc>* plan, const T* grad_output, const T* count,
                                         int64_t k, int64_t c0, int64_t nc, int tid, int step, const AddAt& add_at) {
  if (h.b < 0) return;
  const int64_t GHW = p.attrs.group_size * p.attrs.group_size * p.height * p.width;
  const int32_t S = static_cast<int32_t>(p.attrs.sample_per_part * p.attrs.sample_per_part);
  const int32_t bins = static_cast<int32_t>(p.attrs.output_size * p.attrs.output_size);
  const int64_t base = h.b * p.channels * p.height * p.width + c0 * GHW, o0 = (k * p.attrs.output_dim + c0) * bins;
  roi_block_items<int32_t>(static_cast<int32_t>(nc), bins, tid, step, [&](int32_t c, int32_t bin) {
    const Acc g = to_acc<Acc>(grad_output[o0 + c * bins + bin]);
    if (g == Acc(0)) return;
    const Acc cnt = to_acc<Acc>(count[o0 + c * bins + bin]);
    if (!(cnt > Acc(0))) return;
    const Acc d = div_rn(g, cnt);
    auto add = add_at(base + c * GHW);
    const RoIPlanEntry<Acc>* e = plan + bin * S;
    for (int32_t i = 0; i < S; ++i) {
      if (e[i].idx[0] < 0) continue;
      for (int j = 0; j < 4; ++j) add(e[i].idx[j], d * e[i].w[j]);
    }
  });
}

#if !defined(__CUDACC__)
// The CUDA grid of the planned kernels run serially on the host (the CPU test path): the launch checked against
// CUDA's limits, then block by block, thread by thread. block(h, k, c0, nc, plan, tid): one thread's share of a
// planned block.
template <typename T, typename Block>
Status psroi_schedule_serial(const DeformPSRoIPoolParams& p, const T* rois, const T* trans, int threads,
                             const Block& block) {
  const int64_t D = p.attrs.output_dim, groups = (D + kRoIPlanChannels - 1) / kRoIPlanChannels;
  if (p.num_rois * D == 0) return Status::Ok();
  DCNKIT_RETURN_IF_ERROR(check_launch(roi_block_dims("deform_psroi_pool_plan kernel", p.num_rois, D,
                                                     psroi_plan_bytes<T>(p))));
  std::vector<RoIPlanEntry<T>> plan(static_cast<size_t>(psroi_plan_entries(p)));
  for (int64_t k = 0; k < p.num_rois; ++k) {
    for (int64_t g = 0; g < groups; ++g) {
      const PSRoIPlanHead<T> h = psroi_plan_head<T>(p, rois, k);
      for (int tid = 0; tid < threads; ++tid) psroi_plan_fill<T>(p, h, trans, k, tid, threads, plan.data());
      for (int tid = 0; tid < threads; ++tid) {
        block(h, k, g * kRoIPlanChannels, roi_group_channels(D, g), plan.data(), tid);
      }
    }
  }
  return Status::Ok();
}
#endif

}  // namespace dcnkit
