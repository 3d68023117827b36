// RoIAlign CUDA launchers: block kernels over the plan / visit functions of roi_plan.h.
// float32, float64, float16, bfloat16, forward and backward (the accumulation type follows the data; 16-bit
// gradients accumulate in a float32 workspace buffer). A RoI whose batch index is outside [0, N) gives zeros.
#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/roi_plan.h"

namespace dcnkit {
namespace {

// One block per (RoI, group of kRoIPlanChannels channels) = (blockIdx.x, blockIdx.y): thread 0 computes the
// RoI's head into shared memory (and raises the batch-index assert where the params ask), then the block plans
// (plan kernels) or samples on the fly (visit kernels) and loops over its (channel, bin) pairs. The head's
// stride selects the RoIs a kernel serves: with an adaptive grid both kernels run, and each leaves the other's
// RoIs alone (roi_plan.h).
template <typename T, typename Acc>
__device__ __forceinline__ void roi_block_head(const RoIAlignParams& p, const T* rois, RoIPlanHead<Acc>* head) {
  if (threadIdx.x == 0) {
    *head = roi_plan_head<Acc>(p, rois, blockIdx.x);
    if (head->b < 0 && p.assert_batch_index) roi_batch_index_assert_fail();
  }
  __syncthreads();
}

template <typename Acc>
__device__ __forceinline__ RoIPlanEntry<Acc>* roi_plan_smem() {
  extern __shared__ __align__(16) unsigned char roi_plan_bytes[];
  return reinterpret_cast<RoIPlanEntry<Acc>*>(roi_plan_bytes);
}

template <typename T, typename Acc, bool kMax>
__global__ void __launch_bounds__(kCudaThreads)
    roi_align_plan_forward_kernel(RoIAlignParams p, const T* input, const T* rois, T* output) {
  __shared__ RoIPlanHead<Acc> head;
  roi_block_head<T, Acc>(p, rois, &head);
  if (head.stride == 0) return;  // the visit kernel's RoI
  RoIPlanEntry<Acc>* plan = roi_plan_smem<Acc>();
  roi_plan_fill<Acc>(p, head, threadIdx.x, blockDim.x, plan);
  __syncthreads();
  const int64_t g = blockIdx.y;
  roi_plan_forward_items<Acc, T>(p, head, plan, input, blockIdx.x, g * kRoIPlanChannels,
                                 roi_group_channels(p.channels, g), threadIdx.x, blockDim.x, output, kMax);
}

template <typename T, typename Acc>
__global__ void __launch_bounds__(kCudaThreads)
    roi_align_visit_forward_kernel(RoIAlignParams p, const T* input, const T* rois, T* output) {
  __shared__ RoIPlanHead<Acc> head;
  roi_block_head<T, Acc>(p, rois, &head);
  if (head.stride != 0) return;  // the plan kernel's RoI
  const int64_t g = blockIdx.y;
  roi_visit_forward_items<Acc, T>(p, head, input, blockIdx.x, g * kRoIPlanChannels,
                                  roi_group_channels(p.channels, g), threadIdx.x, blockDim.x, output);
}

// Backward: the same blocks, scattering with atomicAdd into grad_input's accumulation buffer (type Acc).
template <typename Acc>
struct RoIAtomicAt {
  Acc* base;
  __device__ __forceinline__ RoIAtomicAdd<Acc> operator()(int64_t offset) const { return {base + offset}; }
};

template <typename T, typename Acc, bool kMax>
__global__ void __launch_bounds__(kCudaThreads)
    roi_align_plan_backward_kernel(RoIAlignParams p, const T* grad_output, const T* input, const T* rois,
                                   Acc* grad_input) {
  __shared__ RoIPlanHead<Acc> head;
  roi_block_head<T, Acc>(p, rois, &head);
  if (head.stride == 0) return;
  RoIPlanEntry<Acc>* plan = roi_plan_smem<Acc>();
  roi_plan_fill<Acc>(p, head, threadIdx.x, blockDim.x, plan);
  __syncthreads();
  const int64_t g = blockIdx.y;
  roi_plan_backward_items<Acc, T>(p, head, plan, grad_output, input, blockIdx.x, g * kRoIPlanChannels,
                                  roi_group_channels(p.channels, g), threadIdx.x, blockDim.x,
                                  RoIAtomicAt<Acc>{grad_input}, kMax);
}

template <typename T, typename Acc>
__global__ void __launch_bounds__(kCudaThreads)
    roi_align_visit_backward_kernel(RoIAlignParams p, const T* grad_output, const T* input, const T* rois,
                                    Acc* grad_input) {
  __shared__ RoIPlanHead<Acc> head;
  roi_block_head<T, Acc>(p, rois, &head);
  if (head.stride != 0) return;
  const int64_t g = blockIdx.y;
  roi_visit_backward_items<Acc, T>(p, head, grad_output, input, blockIdx.x, g * kRoIPlanChannels,
                                   roi_group_channels(p.channels, g), threadIdx.x, blockDim.x,
                                   RoIAtomicAt<Acc>{grad_input});
}

// Grid of the block kernels: x = RoI, y = channel group (roi_block_launch checks the limits).
int64_t roi_channel_groups(const RoIAlignParams& p) {
  return (p.channels + kRoIPlanChannels - 1) / kRoIPlanChannels;
}
dim3 roi_block_grid(const RoIAlignParams& p) {
  return dim3(static_cast<unsigned int>(p.num_rois), static_cast<unsigned int>(roi_channel_groups(p)));
}

// Launches the plan and/or the visit kernel (roi_plan_launch): plan(max mode tag, smem bytes), visit().
template <typename Acc, typename Plan, typename Visit>
Status roi_block_launch(const RoIAlignParams& p, const char* where, const Plan& plan, const Visit& visit) {
  if (p.num_rois > 0x7fffffff) {
    return arg_error(where, "rois", "at most 2^31 - 1 RoIs on CUDA", std::to_string(p.num_rois));
  }
  if (roi_channel_groups(p) > 65535) {
    return arg_error(where, "input", "at most " + std::to_string(65535 * kRoIPlanChannels) + " channels on CUDA",
                     std::to_string(p.channels));
  }
  int64_t entries = 0;
  const RoIPlanLaunch how = roi_plan_launch<Acc>(p, &entries);
  if (how != RoIPlanLaunch::kVisitOnly) {
    const size_t smem = static_cast<size_t>(entries) * sizeof(RoIPlanEntry<Acc>);
    if (p.attrs.mode == PoolMode::kMax) {
      plan(std::true_type{}, smem);
    } else {
      plan(std::false_type{}, smem);
    }
    DCNKIT_RETURN_IF_ERROR(cuda_launch_status(where));
  }
  if (how != RoIPlanLaunch::kPlanOnly) {
    visit();
    DCNKIT_RETURN_IF_ERROR(cuda_launch_status(where));
  }
  return Status::Ok();
}

int64_t output_elements(const RoIAlignParams& p) {
  return p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w;
}

int64_t input_elements(const RoIAlignParams& p) { return p.batch * p.channels * p.height * p.width; }

}  // namespace

size_t roi_align_workspace_cuda(const RoIAlignParams&) { return 0; }

size_t roi_align_backward_workspace_cuda(const RoIAlignParams& p, DType dtype) {
  return grad_acc_bytes(dtype, input_elements(p));
}

Status roi_align_forward_cuda(const RoIAlignParams& p, DType dtype, const void* input,
                              const void* rois, void* output, void* /*workspace*/,
                              const CudaContext& ctx) {
  if (output_elements(p) == 0) return Status::Ok();
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using Acc = typename AccType<T>::type;
    const T *x = static_cast<const T*>(input), *r = static_cast<const T*>(rois);
    T* y = static_cast<T*>(output);
    const dim3 grid = roi_block_grid(p);
    return roi_block_launch<Acc>(
        p, "roi_align_forward_cuda",
        [&](auto max_mode, size_t smem) {
          roi_align_plan_forward_kernel<T, Acc, decltype(max_mode)::value><<<grid, kCudaThreads, smem, s>>>(p, x, r, y);
        },
        [&] { roi_align_visit_forward_kernel<T, Acc><<<grid, kCudaThreads, 0, s>>>(p, x, r, y); });
  });
}

Status roi_align_backward_cuda(const RoIAlignParams& p, DType dtype, const void* grad_output,
                               const void* input, const void* rois, void* grad_input,
                               void* workspace, const CudaContext& ctx) {
  const int64_t n = output_elements(p);
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using Acc = typename AccType<T>::type;
    char* ws = static_cast<char*>(workspace);
    const GradAcc<T> gin = grad_acc(static_cast<T*>(grad_input), input_elements(p), &ws);
    DCNKIT_RETURN_IF_ERROR(grad_acc_zero(gin, s, "roi_align_backward_cuda: memset"));
    if (n > 0) {
      const T *go = static_cast<const T*>(grad_output), *x = static_cast<const T*>(input);
      const T* r = static_cast<const T*>(rois);
      const dim3 grid = roi_block_grid(p);
      DCNKIT_RETURN_IF_ERROR(roi_block_launch<Acc>(
          p, "roi_align_backward_cuda",
          [&](auto max_mode, size_t smem) {
            roi_align_plan_backward_kernel<T, Acc, decltype(max_mode)::value>
                <<<grid, kCudaThreads, smem, s>>>(p, go, x, r, gin.acc);
          },
          [&] { roi_align_visit_backward_kernel<T, Acc><<<grid, kCudaThreads, 0, s>>>(p, go, x, r, gin.acc); }));
    }
    return grad_acc_store(gin, s, "roi_align_backward_cuda: store");
  });
}

}  // namespace dcnkit
