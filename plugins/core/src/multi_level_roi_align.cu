// MultiLevelRoIAlign CUDA launchers (deterministic backward: the tile gather of roi_gather.h, once per level):
// RoIAlign's block schedule (roi_plan.h, roi_plan_cuda.cuh) on each RoI's level:
// the RoI's level and box (multi_level_roi_align_kernels.h), then RoIAlign's plan or bounded visit on that level's
// map. The maps' pointers travel by value in the kernel arguments (no
// device copy, no synchronisation). float32, float64, float16, bfloat16; the accumulation type follows the
// data (16-bit gradients accumulate in a float32 workspace buffer). A RoI whose batch index is outside
// [0, N) or NaN gives zeros.
#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/multi_level_roi_align_kernels.h"
#include "dcnkit/roi_gather_cuda.cuh"
#include "dcnkit/roi_plan_cuda.cuh"

namespace dcnkit {
namespace {

// One block per (RoI, group of kRoIPlanChannels channels), RoIAlign's block schedule (roi_plan.h) on the RoI's
// level: thread 0 finds the level and the box, the block plans (plan kernels) or samples on the fly (visit
// kernels) and loops over its (channel, bin) pairs.
template <typename T, typename Acc, bool kMax>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    multi_level_roi_align_plan_forward_kernel(MultiLevelRoIAlignParams p, LevelPointers<const T*> features,
                                              const T* rois, T* output) {
  __shared__ RoIPlanHead<Acc> head;
  roi_block_head<Acc>([&](int64_t k) { return multi_level_plan_head<Acc>(p, rois, k); }, rois, p.batch, false,
                      &head);
  if (head.stride == 0) return;  // the visit kernel's RoI
  RoIPlanEntry<Acc>* plan = roi_plan_smem<Acc>();
  roi_plan_fill<Acc>(p, head, threadIdx.x, blockDim.x, plan);
  __syncthreads();
  const int64_t g = blockIdx.y;
  roi_plan_forward_items<Acc, T>(p, head, plan, level_pick(features.ptr, head.level), blockIdx.x,
                                 g * kRoIPlanChannels, roi_group_channels(p.channels, g), threadIdx.x, blockDim.x,
                                 output, kMax);
}

// The visit kernels (the fallback of grids too large to plan) keep the bounded visit's loop invariants in a per-thread
// frame in shared memory (roi_thread_frame), within 48 registers.
template <typename T, typename Acc, bool kMax>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    multi_level_roi_align_visit_forward_kernel(MultiLevelRoIAlignParams p, LevelPointers<const T*> features,
                                               const T* rois, T* output, bool all) {
  __shared__ RoIPlanHead<Acc> head;
  roi_block_head<Acc>([&](int64_t k) { return roi_visit_head(multi_level_plan_head<Acc>(p, rois, k), all); },
                      rois, p.batch, false,
                      &head);
  if (head.stride != 0) return;  // the plan kernel's RoI (none when `all`: roi_visit_head)
  const int64_t g = blockIdx.y;
  roi_visit_forward_items<Acc, T>(p, head, head.H, head.W, level_pick(features.ptr, head.level), blockIdx.x,
                                  g * kRoIPlanChannels, roi_group_channels(p.channels, g), threadIdx.x, blockDim.x,
                                  output, roi_thread_frame<Acc>(), kMax);
}

// Backward: the same blocks, scattering with atomicAdd into the level's accumulation buffer (type Acc).
template <typename Acc>
struct LevelAtomicAt {
  Acc* base;
  __device__ __forceinline__ RoIAtomicAdd<Acc> operator()(int64_t offset) const { return {base + offset}; }
};

template <typename T, typename Acc, bool kMax>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    multi_level_roi_align_plan_backward_kernel(MultiLevelRoIAlignParams p, const T* grad_output,
                                               LevelPointers<const T*> features, const T* rois,
                                               LevelPointers<Acc*> grad_features) {
  __shared__ RoIPlanHead<Acc> head;
  roi_block_head<Acc>([&](int64_t k) { return multi_level_plan_head<Acc>(p, rois, k); }, rois, p.batch, false,
                      &head);
  if (head.stride == 0) return;
  RoIPlanEntry<Acc>* plan = roi_plan_smem<Acc>();
  roi_plan_fill<Acc>(p, head, threadIdx.x, blockDim.x, plan);
  __syncthreads();
  const int64_t g = blockIdx.y;
  roi_plan_backward_items<Acc, T>(p, head, plan, grad_output, level_pick(features.ptr, head.level), blockIdx.x,
                                  g * kRoIPlanChannels, roi_group_channels(p.channels, g), threadIdx.x, blockDim.x,
                                  LevelAtomicAt<Acc>{level_pick(grad_features.ptr, head.level)}, kMax);
}

template <typename T, typename Acc, bool kMax>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    multi_level_roi_align_visit_backward_kernel(MultiLevelRoIAlignParams p, const T* grad_output,
                                                LevelPointers<const T*> features, const T* rois,
                                                LevelPointers<Acc*> grad_features, bool all) {
  __shared__ RoIPlanHead<Acc> head;
  roi_block_head<Acc>([&](int64_t k) { return roi_visit_head(multi_level_plan_head<Acc>(p, rois, k), all); },
                      rois, p.batch, false,
                      &head);
  if (head.stride != 0) return;
  const int64_t g = blockIdx.y;
  roi_visit_backward_items<Acc, T>(p, head, head.H, head.W, grad_output, level_pick(features.ptr, head.level),
                                   blockIdx.x, g * kRoIPlanChannels, roi_group_channels(p.channels, g), threadIdx.x,
                                   blockDim.x, LevelAtomicAt<Acc>{level_pick(grad_features.ptr, head.level)},
                                   roi_thread_frame<Acc>(), kMax);
}

int64_t output_elements(const MultiLevelRoIAlignParams& p) {
  return p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w;
}

int64_t level_elements(const MultiLevelRoIAlignParams& p, int64_t l) {
  return p.batch * p.channels * p.heights[l] * p.widths[l];
}

// The deterministic backward's workspace (roi_gather.h): tables and running sums sized for the largest level.
RoIGatherSizes gather_sizes(const MultiLevelRoIAlignParams& p, DType dtype) {
  RoIGatherSizes s;
  s.num_rois = p.num_rois;
  for (int64_t l = 0; l < p.attrs.num_levels; ++l) {
    const int64_t e = p.attrs.pooled_h * p.heights[l] + p.attrs.pooled_w * p.widths[l];
    s.table_entries = e > s.table_entries ? e : s.table_entries;
    s.partial = is_16bit(dtype) && level_elements(p, l) > s.partial ? level_elements(p, l) : s.partial;
  }
  s.argmax = p.attrs.mode == PoolMode::kMax ? output_elements(p) : 0;
  s.acc_bytes = dtype == DType::kFloat64 ? 8 : 4;
  return s;
}

}  // namespace

size_t multi_level_roi_align_workspace_cuda(const MultiLevelRoIAlignParams&) { return 0; }

size_t multi_level_roi_align_backward_workspace_cuda(const MultiLevelRoIAlignParams& p, DType dtype,
                                                     bool deterministic) {
  if (deterministic) {
    RoIGatherBuffers b;
    return roi_gather_carve(gather_sizes(p, dtype), nullptr, &b);
  }
  size_t bytes = 0;
  for (int64_t l = 0; l < p.attrs.num_levels; ++l) bytes += grad_acc_bytes(dtype, level_elements(p, l));
  return bytes;
}

Status multi_level_roi_align_forward_cuda(const MultiLevelRoIAlignParams& p, DType dtype,
                                          const void* const* features, const void* rois, void* output,
                                          void* /*workspace*/, const CudaContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("multi_level_roi_align_forward_cuda"));
  DCNKIT_RETURN_IF_ERROR(check_multi_level_cuda("multi_level_roi_align_forward_cuda", p));
  const int64_t n = output_elements(p);
  if (n == 0) return Status::Ok();
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    LevelPointers<const T*> f{};
    for (int64_t l = 0; l < p.attrs.num_levels; ++l) f.ptr[l] = static_cast<const T*>(features[l]);
    using Acc = typename AccType<T>::type;
    const T* r = static_cast<const T*>(rois);
    T* y = static_cast<T*>(output);
    const dim3 grid = roi_block_grid(p.num_rois, p.channels);
    return roi_block_launch<Acc>(
        "multi_level_roi_align_forward_cuda", p.num_rois, p.channels, p.attrs.sampling_ratio,
        p.attrs.pooled_h * p.attrs.pooled_w, multi_level_max_pixels(p), p.attrs.mode == PoolMode::kMax,
        [&](auto max_mode, size_t smem) {
          multi_level_roi_align_plan_forward_kernel<T, Acc, decltype(max_mode)::value>
              <<<grid, kCudaThreads, smem, s>>>(p, f, r, y);
        },
        [&](auto max_mode, bool all) {
          multi_level_roi_align_visit_forward_kernel<T, Acc, decltype(max_mode)::value>
              <<<grid, kCudaThreads, 0, s>>>(p, f, r, y, all);
        });
  });
}

Status multi_level_roi_align_backward_cuda(const MultiLevelRoIAlignParams& p, DType dtype,
                                           const void* grad_output, const void* const* features,
                                           const void* rois, void* const* grad_features, void* workspace,
                                           const CudaContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("multi_level_roi_align_backward_cuda"));
  DCNKIT_RETURN_IF_ERROR(check_multi_level_cuda("multi_level_roi_align_backward_cuda", p));
  const int64_t n = output_elements(p);
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using Acc = typename AccType<T>::type;
    char* ws = static_cast<char*>(workspace);
    const T *go = static_cast<const T*>(grad_output), *r = static_cast<const T*>(rois);
    LevelPointers<const T*> f{};
    for (int64_t l = 0; l < p.attrs.num_levels; ++l) {
      f.ptr[l] = features != nullptr ? static_cast<const T*>(features[l]) : nullptr;
    }
    if (ctx.deterministic) {
      // The tile gather (roi_gather.h) once per level: every element of the level's gradient written once, in a
      // fixed order; max mode first finds each output's winning sample on its RoI's level.
      RoIGatherBuffers b;
      roi_gather_carve(gather_sizes(p, dtype), ws, &b);
      Acc* argmax = p.attrs.mode == PoolMode::kMax ? static_cast<Acc*>(b.argmax) : nullptr;
      const MultiLevelHeadOf<Acc, T> head_of{p, r};
      if (argmax != nullptr && n > 0) {
        const LaunchDims d = element_launch("roi_gather_argmax_kernel", n);
        DCNKIT_RETURN_IF_ERROR(check_launch(d));
        roi_gather_argmax_kernel<Acc><<<launch_grid(d), d.block, 0, s>>>(
            head_of, LevelMapOf<T>{f, p.channels}, p.channels, p.attrs.pooled_w, p.attrs.pooled_h * p.attrs.pooled_w, n, argmax);
        DCNKIT_RETURN_IF_ERROR(cuda_launch_status("multi_level_roi_align_backward_cuda: deterministic arg-max"));
      }
      for (int64_t l = 0; l < p.attrs.num_levels; ++l) {
        auto gather = [&](auto max_mode) {
          const RoIAlignGather<Acc, T, MultiLevelHeadOf<Acc, T>, decltype(max_mode)::value> g{
              head_of, p.channels, p.attrs.pooled_h, p.attrs.pooled_w, static_cast<int32_t>(l), p.heights[l],
              p.widths[l], go, argmax, 0, nullptr};
          return roi_gather_cuda<T>("multi_level_roi_align_backward_cuda: deterministic gather", g, p.num_rois,
                                    roi_gather_grid<Acc>(p.batch, p.channels, p.heights[l], p.widths[l]), r, p.batch,
                                    false, b, static_cast<T*>(grad_features[l]), s);
        };
        DCNKIT_RETURN_IF_ERROR(argmax != nullptr ? gather(std::true_type{}) : gather(std::false_type{}));
      }
      return Status::Ok();
    }
    GradAcc<T> gin[kMaxFeatureLevels];
    LevelPointers<Acc*> g{};
    for (int64_t l = 0; l < p.attrs.num_levels; ++l) {
      gin[l] = grad_acc(static_cast<T*>(grad_features[l]), level_elements(p, l), &ws);
      DCNKIT_RETURN_IF_ERROR(grad_acc_zero(gin[l], s, "multi_level_roi_align_backward_cuda: memset"));
      g.ptr[l] = gin[l].acc;
    }
    if (n > 0) {
      const dim3 grid = roi_block_grid(p.num_rois, p.channels);
      DCNKIT_RETURN_IF_ERROR(roi_block_launch<Acc>(
          "multi_level_roi_align_backward_cuda", p.num_rois, p.channels, p.attrs.sampling_ratio,
          p.attrs.pooled_h * p.attrs.pooled_w, multi_level_max_pixels(p), p.attrs.mode == PoolMode::kMax,
          [&](auto max_mode, size_t smem) {
            multi_level_roi_align_plan_backward_kernel<T, Acc, decltype(max_mode)::value>
                <<<grid, kCudaThreads, smem, s>>>(p, go, f, r, g);
          },
          [&](auto max_mode, bool all) {
            multi_level_roi_align_visit_backward_kernel<T, Acc, decltype(max_mode)::value>
                <<<grid, kCudaThreads, 0, s>>>(p, go, f, r, g, all);
          }));
    }
    for (int64_t l = 0; l < p.attrs.num_levels; ++l) {
      DCNKIT_RETURN_IF_ERROR(grad_acc_store(gin[l], s, "multi_level_roi_align_backward_cuda: store"));
    }
    return Status::Ok();
  });
}

}  // namespace dcnkit
