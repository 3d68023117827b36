// CUDA side of the RoI block schedule (roi_plan.h), shared by the RoIAlign and MultiLevelRoIAlign launchers:
// the block's head in shared memory, the plan's dynamic shared memory, the grid and the launch decision.
#pragma once

#include <string>
#include <type_traits>

#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/roi_plan.h"

namespace dcnkit {

// Thread 0 computes the block's head (head_of(k), k = blockIdx.x) into shared memory; first, where `assert_batch`
// asks, it raises the batch-index assert for a RoI row `roi` whose batch index is outside [0, batch) (before the
// head: nothing is live across that call, so no registers are saved to the stack). Then the block reads it.
template <typename Acc, typename T, typename HeadOf>
__device__ __forceinline__ void roi_block_head(const HeadOf& head_of, const T* roi, int64_t batch, bool assert_batch,
                                               RoIPlanHead<Acc>* head) {
  if (threadIdx.x == 0) {
    int64_t b = 0;
    if (assert_batch && !roi_batch_index<Acc>(roi, batch, &b)) roi_batch_index_assert_fail();
    *head = head_of(static_cast<int64_t>(blockIdx.x));
  }
  __syncthreads();
}

template <typename Acc>
__device__ __forceinline__ RoIPlanEntry<Acc>* roi_plan_smem() {
  extern __shared__ __align__(16) unsigned char roi_plan_bytes[];
  return reinterpret_cast<RoIPlanEntry<Acc>*>(roi_plan_bytes);
}

// Grid of the block kernels: x = RoI, y = channel group (roi_block_dims; roi_block_launch checks the limits).
inline int64_t roi_channel_groups(int64_t channels) { return (channels + kRoIPlanChannels - 1) / kRoIPlanChannels; }
inline dim3 roi_block_grid(int64_t num_rois, int64_t channels) {
  return launch_grid(roi_block_dims("roi block kernel", num_rois, channels, 0));
}

// Launches the plan and/or the visit kernel (roi_plan_launch): plan(max mode tag, smem bytes), visit(max mode tag,
// all): `all`
// when the plan kernel is not launched (kVisitOnly), so that the visit kernel serves every RoI -- also those whose
// own head would be planned (MultiLevelRoIAlign: a small level's RoI when the largest level is too large to plan).
template <typename Acc, typename Plan, typename Visit>
Status roi_block_launch(const char* where, int64_t num_rois, int64_t channels, int64_t sampling_ratio, int64_t bins,
                        int64_t max_hw, bool max_mode, const Plan& plan, const Visit& visit) {
  if (num_rois > kCudaMaxGridX) {
    return arg_error(where, "rois", "at most 2^31 - 1 RoIs on CUDA", std::to_string(num_rois));
  }
  DCNKIT_RETURN_IF_ERROR(check_roi_block_bins(where, bins));
  if (roi_channel_groups(channels) > kCudaMaxGridYZ) {
    return arg_error(where, "input", "at most " + std::to_string(kCudaMaxGridYZ * kRoIPlanChannels) +
                     " channels on CUDA", std::to_string(channels));
  }
  int64_t entries = 0;
  const RoIPlanLaunch how = roi_plan_launch<Acc>(sampling_ratio, bins, max_hw, &entries);
  if (how != RoIPlanLaunch::kVisitOnly) {
    const size_t smem = static_cast<size_t>(entries) * sizeof(RoIPlanEntry<Acc>);
    if (max_mode) {
      plan(std::true_type{}, smem);
    } else {
      plan(std::false_type{}, smem);
    }
    DCNKIT_RETURN_IF_ERROR(cuda_launch_status(where));
  }
  if (how != RoIPlanLaunch::kPlanOnly) {
    if (max_mode) {
      visit(std::true_type{}, how == RoIPlanLaunch::kVisitOnly);
    } else {
      visit(std::false_type{}, how == RoIPlanLaunch::kVisitOnly);
    }
    DCNKIT_RETURN_IF_ERROR(cuda_launch_status(where));
  }
  return Status::Ok();
}

}  // namespace dcnkit
