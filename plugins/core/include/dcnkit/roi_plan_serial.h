// The RoI block schedule of roi_plan.h run serially on the host: the CPU test paths (DCNKIT_ROI_CPU_PATH) and the
// counting harness. Host only.
#pragma once

#include <cstdlib>
#include <cstring>
#include <vector>

#include "dcnkit/roi_plan.h"

namespace dcnkit {

// Threads of a block of the CUDA RoI kernels, run one after the other by the serial schedules.
constexpr int kCudaScheduleThreads = 256;

// The CUDA grid of the block kernels run serially: the launches the CUDA launcher makes (roi_plan_launch: the plan
// kernel, the visit kernel or both) checked against CUDA's limits (check_launch), then for each block (RoI k, channel
// group), its head (head_of(k)), its plan where the plan kernel serves it (every thread's share), then
// block(head, k, c0, nc, plan or null (visit), tid) for each thread, in grid order. max_hw: the largest map's pixels
// (roi_plan_launch); origin_of(k): the bin origin of RoI k (RoIAlign's by default; DeformRoIPool: DeformRoIOrigin).
struct RoIBoxOriginOf {
  RoIBoxOrigin operator()(int64_t) const { return {}; }
};
template <typename Acc, typename P, typename HeadOf, typename Block, typename OriginOf = RoIBoxOriginOf>
Status roi_block_schedule_serial(const P& p, int64_t max_hw, const HeadOf& head_of, int threads, const Block& block,
                                 const OriginOf& origin_of = OriginOf()) {
  const int64_t bins = p.attrs.pooled_h * p.attrs.pooled_w;
  if (p.num_rois * p.channels * bins == 0) return Status::Ok();  // the launchers launch nothing
  DCNKIT_RETURN_IF_ERROR(check_roi_block_bins("roi_block_schedule_serial", bins));
  int64_t entries = 0;
  const RoIPlanLaunch how = roi_plan_launch<Acc>(p.attrs.sampling_ratio, bins, max_hw, &entries);
  if (how != RoIPlanLaunch::kVisitOnly) {
    DCNKIT_RETURN_IF_ERROR(check_launch(roi_block_dims("roi plan kernel", p.num_rois, p.channels,
                                                       entries * static_cast<int64_t>(sizeof(RoIPlanEntry<Acc>)))));
  }
  if (how != RoIPlanLaunch::kPlanOnly) {
    DCNKIT_RETURN_IF_ERROR(check_launch(roi_block_dims("roi visit kernel", p.num_rois, p.channels, 0)));
  }
  std::vector<RoIPlanEntry<Acc>> plan(static_cast<size_t>(roi_plan_capacity<Acc>()));
  const int64_t groups = (p.channels + kRoIPlanChannels - 1) / kRoIPlanChannels;
  for (int64_t k = 0; k < p.num_rois; ++k) {
    for (int64_t g = 0; g < groups; ++g) {
      const RoIPlanHead<Acc> h = head_of(k);
      const bool planned = how != RoIPlanLaunch::kVisitOnly && h.stride != 0;
      if (planned) {
        for (int tid = 0; tid < threads; ++tid) roi_plan_fill<Acc>(p, h, tid, threads, plan.data(), origin_of(k));
      }
      for (int tid = 0; tid < threads; ++tid) {
        block(h, k, g * kRoIPlanChannels, roi_group_channels(p.channels, g), planned ? plan.data() : nullptr, tid);
      }
    }
  }
  return Status::Ok();
}

// DCNKIT_ROI_CPU_PATH=cuda-schedule (read once per process; for tests): the CPU launchers of the RoI ops run the
// CUDA block schedule above instead of their own drivers.
inline bool roi_cuda_schedule_path() {
  static const bool on = [] {
    const char* e = std::getenv("DCNKIT_ROI_CPU_PATH");
    return e != nullptr && std::strcmp(e, "cuda-schedule") == 0;
  }();
  return on;
}
// DCNKIT_ROI_CPU_PATH=cuda-schedule-deterministic: their backward runs the deterministic mode's grids (roi_gather.h:
// the footprints, max mode's arg-max, the tile gather) serially; their forward runs the cuda-schedule blocks.
inline bool roi_cuda_schedule_deterministic_path() {
  static const bool on = [] {
    const char* e = std::getenv("DCNKIT_ROI_CPU_PATH");
    return e != nullptr && std::strcmp(e, "cuda-schedule-deterministic") == 0;
  }();
  return on;
}

}  // namespace dcnkit
