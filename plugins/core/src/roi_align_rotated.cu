// RoIAlignRotated CUDA launchers: RoIAlign's block schedule (roi_plan_cuda.cuh: one block per RoI and channel group, the
// RoI's head once per block, its sampling plan where the grid fits one, else the bounded visit) over the bodies of
// roi_align_rotated.h, and in deterministic mode the tile gather of roi_gather_cuda.cuh over its RotatedGather.
// float32, float64, float16, bfloat16 features;
// RoIs of the features' type or float32. 16-bit gradients accumulate in a float32 workspace buffer. A RoI whose batch
// index is outside [0, N) or NaN gives zeros (and a device-side assert where the params ask for it).
#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/roi_align_rotated.h"
#include "dcnkit/roi_batch_assert.h"
#include "dcnkit/roi_gather_cuda.cuh"
#include "dcnkit/roi_plan_cuda.cuh"

namespace dcnkit {
namespace {

// One block per (RoI, group of kRotatedBlockChannels channels) = (blockIdx.x, blockIdx.y): thread 0 computes the RoI's
// head into shared memory (first, where the params ask, the batch-index assert) and its plan head (rotated_plan_head:
// planned or not), then the block plans every sample of the RoI (plan kernels) or samples on the fly per (channel,
// bin) (visit kernels: the grids too large to plan). No loop holds the head's divisions and trigonometry.
template <typename Acc, typename R>
__device__ __forceinline__ void rotated_block_head(const RoIAlignRotatedParams& p, const R* rois, bool all,
                                                   RotatedHead<Acc>* head, RoIPlanHead<Acc>* plan_head) {
  if (threadIdx.x == 0) {
    const int64_t k = blockIdx.x;
    int64_t b = 0;
    if (p.assert_batch_index && !roi_batch_index<Acc>(rois + k * 6, p.batch, &b)) roi_batch_index_assert_fail();
    *head = roi_align_rotated_head<Acc>(p, rois, k);
    *plan_head = roi_visit_head(rotated_plan_head<Acc>(p, *head), all);
  }
  __syncthreads();
}

template <typename T, typename R>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    roi_align_rotated_forward_kernel(RoIAlignRotatedParams p, const T* __restrict__ input, const R* __restrict__ rois,
                                     T* __restrict__ output) {
  using Acc = typename AccType<T>::type;
  __shared__ RotatedHead<Acc> head;
  __shared__ RoIPlanHead<Acc> plan_head;
  rotated_block_head<Acc>(p, rois, false, &head, &plan_head);
  if (plan_head.stride == 0) return;  // the visit kernel's RoI
  RoIPlanEntry<Acc>* plan = roi_plan_smem<Acc>();
  rotated_plan_fill<Acc>(p, head, plan_head.stride, threadIdx.x, blockDim.x, plan);
  __syncthreads();
  const int64_t g = blockIdx.y;
  roi_plan_forward_items<Acc, T>(p, plan_head, plan, input, blockIdx.x, g * kRotatedBlockChannels,
                                 roi_group_channels(p.channels, g), threadIdx.x, blockDim.x, output, false);
}

template <typename T, typename R>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    roi_align_rotated_visit_forward_kernel(RoIAlignRotatedParams p, const T* __restrict__ input,
                                           const R* __restrict__ rois, T* __restrict__ output, bool all) {
  using Acc = typename AccType<T>::type;
  __shared__ RotatedHead<Acc> head;
  __shared__ RoIPlanHead<Acc> plan_head;
  __shared__ RotatedFrame<Acc> frames[kCudaThreads];
  rotated_block_head<Acc>(p, rois, all, &head, &plan_head);
  if (plan_head.stride != 0) return;  // the plan kernel's RoI
  const int64_t k = blockIdx.x;
  RotatedFrameRef<Acc> f = frames + threadIdx.x;
  roi_align_rotated_block_items<1>(p, blockIdx.y, threadIdx.x, blockDim.x,
                                   [&](int64_t c0, int nc, int32_t ph, int32_t pw) {
                                     roi_align_rotated_forward_bin<Acc, 1>(p, head, input, k, c0, nc, ph, pw, output,
                                                                           f);
                                   });
}

template <typename Acc>
struct AtomicAddAt {
  Acc* base;
  __device__ __forceinline__ void operator()(int64_t i, Acc v) const { atomicAdd(base + i, v); }
};
template <typename Acc>
struct AtomicAddFrom {
  Acc* base;
  __device__ __forceinline__ RoIAtomicAdd<Acc> operator()(int64_t offset) const { return {base + offset}; }
};

template <typename T, typename R>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    roi_align_rotated_backward_kernel(RoIAlignRotatedParams p, const T* __restrict__ grad_output,
                                      const R* __restrict__ rois, typename AccType<T>::type* __restrict__ grad) {
  using Acc = typename AccType<T>::type;
  __shared__ RotatedHead<Acc> head;
  __shared__ RoIPlanHead<Acc> plan_head;
  rotated_block_head<Acc>(p, rois, false, &head, &plan_head);
  if (plan_head.stride == 0 || plan_head.b < 0) return;
  RoIPlanEntry<Acc>* plan = roi_plan_smem<Acc>();
  rotated_plan_fill<Acc>(p, head, plan_head.stride, threadIdx.x, blockDim.x, plan);
  __syncthreads();
  const int64_t g = blockIdx.y;
  roi_plan_backward_items<Acc, T>(p, plan_head, plan, grad_output, static_cast<const T*>(nullptr), blockIdx.x,
                                  g * kRotatedBlockChannels, roi_group_channels(p.channels, g), threadIdx.x,
                                  blockDim.x, AtomicAddFrom<Acc>{grad}, false);
}

template <typename T, typename R>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    roi_align_rotated_visit_backward_kernel(RoIAlignRotatedParams p, const T* __restrict__ grad_output,
                                            const R* __restrict__ rois, typename AccType<T>::type* __restrict__ grad,
                                            bool all) {
  using Acc = typename AccType<T>::type;
  __shared__ RotatedHead<Acc> head;
  __shared__ RoIPlanHead<Acc> plan_head;
  __shared__ RotatedFrame<Acc> frames[kCudaThreads];
  rotated_block_head<Acc>(p, rois, all, &head, &plan_head);
  if (plan_head.stride != 0) return;
  const int64_t k = blockIdx.x;
  RotatedFrameRef<Acc> f = frames + threadIdx.x;
  roi_align_rotated_block_items<1>(p, blockIdx.y, threadIdx.x, blockDim.x,
                                   [&](int64_t c0, int nc, int32_t ph, int32_t pw) {
                                     roi_align_rotated_backward_bin<Acc, 1>(p, head, grad_output, k, c0, nc, ph, pw,
                                                                            AtomicAddAt<Acc>{grad}, f);
                                   });
}

// Calls f(T{}, R{}) with the features' storage type T and the RoIs' R (T, or float with 16-bit features).
template <typename F>
Status dispatch_rois(DType dtype, DType rois_dtype, F&& f) {
  return dispatch_dtype(dtype, [&](auto t) -> Status {
    using T = decltype(t);
    if (rois_dtype == dtype) return f(t, T{});
    if (rois_dtype == DType::kFloat32 && is_16bit(dtype)) return f(t, float{});
    return Status::Invalid(std::string("roi_align_rotated: rois: expected dtype ") + dtype_name(dtype) +
                           " or float32 (with 16-bit features), got " + dtype_name(rois_dtype));
  });
}

// The deterministic gather's workspace: every RoI's footprint, one chunk's boxes, the float32 running sums of a
// 16-bit gradient.
RoIGatherSizes gather_sizes(const RoIAlignRotatedParams& p, DType dtype) {
  RoIGatherSizes s;
  s.num_rois = p.num_rois;
  s.table_entries = kRtEntries;
  s.partial = is_16bit(dtype) ? p.batch * p.channels * p.height * p.width : 0;
  s.acc_bytes = dtype == DType::kFloat64 ? 8 : 4;
  return s;
}

}  // namespace

size_t roi_align_rotated_backward_workspace_cuda(const RoIAlignRotatedParams& p, DType dtype, bool deterministic) {
  if (deterministic) {
    RoIGatherBuffers b;
    return roi_gather_carve(gather_sizes(p, dtype), nullptr, &b);
  }
  return grad_acc_bytes(dtype, p.batch * p.channels * p.height * p.width);
}

Status roi_align_rotated_forward_cuda(const RoIAlignRotatedParams& p, DType dtype, DType rois_dtype,
                                      const void* input, const void* rois, void* output, const CudaContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("roi_align_rotated_forward_cuda"));
  if (p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w == 0) return Status::Ok();
  DCNKIT_RETURN_IF_ERROR(check_rotated_cuda("roi_align_rotated_forward_cuda", p));
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_rois(dtype, rois_dtype, [&](auto t, auto r) -> Status {
    using T = decltype(t);
    using R = decltype(r);
    using Acc = typename AccType<T>::type;
    const T* x = static_cast<const T*>(input);
    const R* rr = static_cast<const R*>(rois);
    T* y = static_cast<T*>(output);
    const dim3 grid = roi_block_grid(p.num_rois, p.channels);
    return roi_block_launch<Acc>(
        "roi_align_rotated_forward_cuda", p.num_rois, p.channels, p.attrs.sampling_ratio,
        p.attrs.pooled_h * p.attrs.pooled_w, p.height * p.width, false,
        [&](auto, size_t smem) {
          roi_align_rotated_forward_kernel<T, R><<<grid, kCudaThreads, smem, stream>>>(p, x, rr, y);
        },
        [&](auto, bool all) {
          roi_align_rotated_visit_forward_kernel<T, R><<<grid, kCudaThreads, 0, stream>>>(p, x, rr, y, all);
        });
  });
}

Status roi_align_rotated_backward_cuda(const RoIAlignRotatedParams& p, DType dtype, DType rois_dtype,
                                       const void* grad_output, const void* rois, void* grad_input, void* workspace,
                                       const CudaContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("roi_align_rotated_backward_cuda"));
  const int64_t count = p.batch * p.channels * p.height * p.width;
  if (count == 0) return Status::Ok();
  DCNKIT_RETURN_IF_ERROR(check_rotated_cuda("roi_align_rotated_backward_cuda", p));
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_rois(dtype, rois_dtype, [&](auto t, auto r) -> Status {
    using T = decltype(t);
    using R = decltype(r);
    using Acc = typename AccType<T>::type;
    char* ws = static_cast<char*>(workspace);
    const auto* go = static_cast<const T*>(grad_output);
    const auto* rr = static_cast<const R*>(rois);
    if (ctx.deterministic) {  // the tile gather: every grad_input element written once, in a fixed order
      if (p.assert_batch_index) {
        DCNKIT_RETURN_IF_ERROR(roi_assert_batch_indices_cuda("roi_align_rotated_backward_cuda", rois, rois_dtype,
                                                             p.num_rois, 6, p.batch, ctx));
      }
      RoIGatherBuffers b;
      roi_gather_carve(gather_sizes(p, dtype), ws, &b);
      const RotatedGather<Acc, T, R> g{p, rr, go, 0, nullptr};
      return roi_gather_cuda<T>("roi_align_rotated_backward_cuda: deterministic gather", g, p.num_rois,
                                roi_gather_grid<Acc>(p.batch, p.channels, p.height, p.width), static_cast<const T*>(nullptr),
                                p.batch, false, b, static_cast<T*>(grad_input), stream);
    }
    const GradAcc<T> g = grad_acc(static_cast<T*>(grad_input), count, &ws);
    DCNKIT_RETURN_IF_ERROR(grad_acc_zero(g, stream, "roi_align_rotated_backward_cuda"));
    if (p.num_rois * p.attrs.pooled_h * p.attrs.pooled_w > 0) {
      const dim3 grid = roi_block_grid(p.num_rois, p.channels);
      DCNKIT_RETURN_IF_ERROR(roi_block_launch<Acc>(
          "roi_align_rotated_backward_cuda", p.num_rois, p.channels, p.attrs.sampling_ratio,
          p.attrs.pooled_h * p.attrs.pooled_w, p.height * p.width, false,
          [&](auto, size_t smem) {
            roi_align_rotated_backward_kernel<T, R><<<grid, kCudaThreads, smem, stream>>>(p, go, rr, g.acc);
          },
          [&](auto, bool all) {
            roi_align_rotated_visit_backward_kernel<T, R><<<grid, kCudaThreads, 0, stream>>>(p, go, rr, g.acc, all);
          }));
    }
    return grad_acc_store(g, stream, "roi_align_rotated_backward_cuda");
  });
}

}  // namespace dcnkit
