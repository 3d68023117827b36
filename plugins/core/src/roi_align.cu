// RoIAlign CUDA launchers: block kernels over the plan / visit functions of roi_plan.h; in deterministic mode the
// backward is the tile gather of roi_gather.h (no atomics). float32, float64, float16, bfloat16, forward and backward
// (the accumulation type follows the data; the atomic path's 16-bit gradients accumulate in a float32 workspace
// buffer). A RoI whose batch index is outside [0, N) gives zeros.
#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/roi_gather_cuda.cuh"
#include "dcnkit/roi_plan_cuda.cuh"

namespace dcnkit {
namespace {

// One block per (RoI, group of kRoIPlanChannels channels) = (blockIdx.x, blockIdx.y): thread 0 computes the
// RoI's head into shared memory (and raises the batch-index assert where the params ask), then the block plans
// (plan kernels) or samples on the fly (visit kernels) and loops over its (channel, bin) pairs. The head's
// stride selects the RoIs a kernel serves: with an adaptive grid both kernels run, and each leaves the other's
// RoIs alone (roi_plan.h).
template <typename T, typename Acc, bool kMax>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    roi_align_plan_forward_kernel(RoIAlignParams p, const T* input, const T* rois, T* output) {
  __shared__ RoIPlanHead<Acc> head;
  roi_block_head<Acc>([&](int64_t k) { return roi_plan_head<Acc>(p, rois, k); }, rois + static_cast<int64_t>(blockIdx.x) * 5, p.batch,
                      p.assert_batch_index, &head);
  if (head.stride == 0) return;  // the visit kernel's RoI
  RoIPlanEntry<Acc>* plan = roi_plan_smem<Acc>();
  roi_plan_fill<Acc>(p, head, threadIdx.x, blockDim.x, plan);
  __syncthreads();
  const int64_t g = blockIdx.y;
  roi_plan_forward_items<Acc, T>(p, head, plan, input, blockIdx.x, g * kRoIPlanChannels,
                                 roi_group_channels(p.channels, g), threadIdx.x, blockDim.x, output, kMax);
}

// The visit kernels (the fallback of grids too large to plan) keep the bounded visit's loop invariants in a per-thread
// frame in shared memory (roi_thread_frame), within 48 registers.
template <typename T, typename Acc, bool kMax>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    roi_align_visit_forward_kernel(RoIAlignParams p, const T* input, const T* rois, T* output, bool all) {
  __shared__ RoIPlanHead<Acc> head;
  roi_block_head<Acc>([&](int64_t k) { return roi_visit_head(roi_plan_head<Acc>(p, rois, k), all); },
                      rois + static_cast<int64_t>(blockIdx.x) * 5, p.batch,
                      p.assert_batch_index, &head);
  if (head.stride != 0) return;  // the plan kernel's RoI (none when `all`: roi_visit_head)
  const int64_t g = blockIdx.y;
  roi_visit_forward_items<Acc, T>(p, head, p.height, p.width, input, blockIdx.x, g * kRoIPlanChannels,
                                  roi_group_channels(p.channels, g), threadIdx.x, blockDim.x, output,
                                  roi_thread_frame<Acc>(), kMax);
}

// Backward: the same blocks, scattering with atomicAdd into grad_input's accumulation buffer (type Acc).
template <typename Acc>
struct RoIAtomicAt {
  Acc* base;
  __device__ __forceinline__ RoIAtomicAdd<Acc> operator()(int64_t offset) const { return {base + offset}; }
};

template <typename T, typename Acc, bool kMax>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    roi_align_plan_backward_kernel(RoIAlignParams p, const T* grad_output, const T* input, const T* rois,
                                   Acc* grad_input) {
  __shared__ RoIPlanHead<Acc> head;
  roi_block_head<Acc>([&](int64_t k) { return roi_plan_head<Acc>(p, rois, k); }, rois + static_cast<int64_t>(blockIdx.x) * 5, p.batch,
                      p.assert_batch_index, &head);
  if (head.stride == 0) return;
  RoIPlanEntry<Acc>* plan = roi_plan_smem<Acc>();
  roi_plan_fill<Acc>(p, head, threadIdx.x, blockDim.x, plan);
  __syncthreads();
  const int64_t g = blockIdx.y;
  roi_plan_backward_items<Acc, T>(p, head, plan, grad_output, input, blockIdx.x, g * kRoIPlanChannels,
                                  roi_group_channels(p.channels, g), threadIdx.x, blockDim.x,
                                  RoIAtomicAt<Acc>{grad_input}, kMax);
}

template <typename T, typename Acc, bool kMax>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    roi_align_visit_backward_kernel(RoIAlignParams p, const T* grad_output, const T* input, const T* rois,
                                    Acc* grad_input, bool all) {
  __shared__ RoIPlanHead<Acc> head;
  roi_block_head<Acc>([&](int64_t k) { return roi_visit_head(roi_plan_head<Acc>(p, rois, k), all); },
                      rois + static_cast<int64_t>(blockIdx.x) * 5, p.batch,
                      p.assert_batch_index, &head);
  if (head.stride != 0) return;
  const int64_t g = blockIdx.y;
  roi_visit_backward_items<Acc, T>(p, head, p.height, p.width, grad_output, input, blockIdx.x, g * kRoIPlanChannels,
                                   roi_group_channels(p.channels, g), threadIdx.x, blockDim.x,
                                   RoIAtomicAt<Acc>{grad_input}, roi_thread_frame<Acc>(), kMax);
}

int64_t output_elements(const RoIAlignParams& p) {
  return p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w;
}

int64_t input_elements(const RoIAlignParams& p) { return p.batch * p.channels * p.height * p.width; }

// The deterministic backward's workspace (roi_gather.h).
RoIGatherSizes gather_sizes(const RoIAlignParams& p, DType dtype) {
  RoIGatherSizes s;
  s.num_rois = p.num_rois;
  s.table_entries = p.attrs.pooled_h * p.height + p.attrs.pooled_w * p.width;
  s.argmax = p.attrs.mode == PoolMode::kMax ? output_elements(p) : 0;
  s.partial = is_16bit(dtype) ? input_elements(p) : 0;
  s.acc_bytes = dtype == DType::kFloat64 ? 8 : 4;
  return s;
}

}  // namespace

size_t roi_align_workspace_cuda(const RoIAlignParams&) { return 0; }

size_t roi_align_backward_workspace_cuda(const RoIAlignParams& p, DType dtype, bool deterministic) {
  if (deterministic) {
    RoIGatherBuffers b;
    return roi_gather_carve(gather_sizes(p, dtype), nullptr, &b);
  }
  return grad_acc_bytes(dtype, input_elements(p));
}

Status roi_align_forward_cuda(const RoIAlignParams& p, DType dtype, const void* input,
                              const void* rois, void* output, void* /*workspace*/,
                              const CudaContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("roi_align_forward_cuda"));
  if (output_elements(p) == 0) return Status::Ok();
  DCNKIT_RETURN_IF_ERROR(check_cuda_map_axes("roi_align_forward_cuda", "input", p.height, p.width));
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using Acc = typename AccType<T>::type;
    const T *x = static_cast<const T*>(input), *r = static_cast<const T*>(rois);
    T* y = static_cast<T*>(output);
    const dim3 grid = roi_block_grid(p.num_rois, p.channels);
    return roi_block_launch<Acc>(
        "roi_align_forward_cuda", p.num_rois, p.channels, p.attrs.sampling_ratio, p.attrs.pooled_h * p.attrs.pooled_w,
        p.height * p.width, p.attrs.mode == PoolMode::kMax,
        [&](auto max_mode, size_t smem) {
          roi_align_plan_forward_kernel<T, Acc, decltype(max_mode)::value><<<grid, kCudaThreads, smem, s>>>(p, x, r, y);
        },
        [&](auto max_mode, bool all) {
          roi_align_visit_forward_kernel<T, Acc, decltype(max_mode)::value><<<grid, kCudaThreads, 0, s>>>(p, x, r, y, all);
        });
  });
}

Status roi_align_backward_cuda(const RoIAlignParams& p, DType dtype, const void* grad_output,
                               const void* input, const void* rois, void* grad_input,
                               void* workspace, const CudaContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("roi_align_backward_cuda"));
  DCNKIT_RETURN_IF_ERROR(check_cuda_map_axes("roi_align_backward_cuda", "input", p.height, p.width));
  const int64_t n = output_elements(p);
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using Acc = typename AccType<T>::type;
    const T *go = static_cast<const T*>(grad_output), *x = static_cast<const T*>(input);
    const T* r = static_cast<const T*>(rois);
    char* ws = static_cast<char*>(workspace);
    if (ctx.deterministic) {
      // The tile gather (roi_gather.h): every grad_input element written once, in a fixed order; max mode first
      // finds each output's winning sample.
      RoIGatherBuffers b;
      roi_gather_carve(gather_sizes(p, dtype), ws, &b);
      Acc* argmax = p.attrs.mode == PoolMode::kMax ? static_cast<Acc*>(b.argmax) : nullptr;
      const RoIAlignHeadOf<Acc, T> head_of{p, r};
      if (argmax != nullptr && n > 0) {
        const LaunchDims d = element_launch("roi_gather_argmax_kernel", n);
        DCNKIT_RETURN_IF_ERROR(check_launch(d));
        roi_gather_argmax_kernel<Acc><<<launch_grid(d), d.block, 0, s>>>(
            head_of, RoIImageMap<T>{x, p.channels}, p.channels, p.attrs.pooled_w, p.attrs.pooled_h * p.attrs.pooled_w,
            n, argmax);
        DCNKIT_RETURN_IF_ERROR(cuda_launch_status("roi_align_backward_cuda: deterministic arg-max"));
      }
      auto gather = [&](auto max_mode) {
        const RoIAlignGather<Acc, T, RoIAlignHeadOf<Acc, T>, decltype(max_mode)::value> g{
            head_of, p.channels, p.attrs.pooled_h, p.attrs.pooled_w, 0, p.height, p.width, go, argmax, 0, nullptr};
        return roi_gather_cuda<T>("roi_align_backward_cuda: deterministic gather", g, p.num_rois,
                                  roi_gather_grid<Acc>(p.batch, p.channels, p.height, p.width), r, p.batch,
                                  p.assert_batch_index, b, static_cast<T*>(grad_input), s);
      };
      return argmax != nullptr ? gather(std::true_type{}) : gather(std::false_type{});
    }
    const GradAcc<T> gin = grad_acc(static_cast<T*>(grad_input), input_elements(p), &ws);
    DCNKIT_RETURN_IF_ERROR(grad_acc_zero(gin, s, "roi_align_backward_cuda: memset"));
    if (n > 0) {
      const dim3 grid = roi_block_grid(p.num_rois, p.channels);
      DCNKIT_RETURN_IF_ERROR(roi_block_launch<Acc>(
          "roi_align_backward_cuda", p.num_rois, p.channels, p.attrs.sampling_ratio,
          p.attrs.pooled_h * p.attrs.pooled_w, p.height * p.width, p.attrs.mode == PoolMode::kMax,
          [&](auto max_mode, size_t smem) {
            roi_align_plan_backward_kernel<T, Acc, decltype(max_mode)::value>
                <<<grid, kCudaThreads, smem, s>>>(p, go, x, r, gin.acc);
          },
          [&](auto max_mode, bool all) {
            roi_align_visit_backward_kernel<T, Acc, decltype(max_mode)::value>
                <<<grid, kCudaThreads, 0, s>>>(p, go, x, r, gin.acc, all);
          }));
    }
    return grad_acc_store(gin, s, "roi_align_backward_cuda: store");
  });
}

}  // namespace dcnkit
