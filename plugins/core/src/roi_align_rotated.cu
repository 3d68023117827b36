// RoIAlignRotated CUDA launchers: block kernels over the bodies of roi_align_rotated.h (one block per RoI and channel
// group, the RoI's head once per block), and in deterministic mode the tile gather of roi_gather_cuda.cuh over its RotatedGather. float32, float64, float16, bfloat16 features;
// RoIs of the features' type or float32. 16-bit gradients accumulate in a float32 workspace buffer. A RoI whose batch
// index is outside [0, N) or NaN gives zeros (and a device-side assert where the params ask for it).
#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/roi_align_rotated.h"
#include "dcnkit/roi_batch_assert.h"
#include "dcnkit/roi_gather_cuda.cuh"

namespace dcnkit {
namespace {

// One block per (RoI, group of kRotatedBlockChannels channels) = (blockIdx.x, blockIdx.y): thread 0 computes the RoI's
// head into shared memory (first, where the params ask, the batch-index assert), then the block's threads take its
// (slice, bin) items (roi_align_rotated_block_items). No loop holds the head's divisions and trigonometry.
template <typename Acc, typename R>
__device__ __forceinline__ void rotated_block_head(const RoIAlignRotatedParams& p, const R* rois,
                                                   RotatedHead<Acc>* head) {
  if (threadIdx.x == 0) {
    const int64_t k = blockIdx.x;
    int64_t b = 0;
    if (p.assert_batch_index && !roi_batch_index<Acc>(rois + k * 6, p.batch, &b)) roi_batch_index_assert_fail();
    *head = roi_align_rotated_head<Acc>(p, rois, k);
  }
  __syncthreads();
}

template <typename T, typename R>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    roi_align_rotated_forward_kernel(RoIAlignRotatedParams p, const T* __restrict__ input, const R* __restrict__ rois,
                                     T* __restrict__ output) {
  using Acc = typename AccType<T>::type;
  __shared__ RotatedHead<Acc> head;
  rotated_block_head<Acc>(p, rois, &head);
  const int64_t k = blockIdx.x;
  roi_align_rotated_block_items<Acc>(p, blockIdx.y, threadIdx.x, blockDim.x,
                                     [&](int64_t c0, int nc, int32_t ph, int32_t pw) {
                                       roi_align_rotated_forward_bin<Acc>(p, head, input, k, c0, nc, ph, pw, output);
                                     });
}

template <typename Acc>
struct AtomicAddAt {
  Acc* base;
  __device__ __forceinline__ void operator()(int64_t i, Acc v) const { atomicAdd(base + i, v); }
};

template <typename T, typename R>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    roi_align_rotated_backward_kernel(RoIAlignRotatedParams p, const T* __restrict__ grad_output,
                                      const R* __restrict__ rois, typename AccType<T>::type* __restrict__ grad) {
  using Acc = typename AccType<T>::type;
  __shared__ RotatedHead<Acc> head;
  rotated_block_head<Acc>(p, rois, &head);
  const int64_t k = blockIdx.x;
  roi_align_rotated_block_items<Acc>(p, blockIdx.y, threadIdx.x, blockDim.x,
                                     [&](int64_t c0, int nc, int32_t ph, int32_t pw) {
                                       roi_align_rotated_backward_bin<Acc>(p, head, grad_output, k, c0, nc, ph, pw,
                                                                           AtomicAddAt<Acc>{grad});
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

// The blocks of the forward and the atomic backward: (RoI, channel group), checked against CUDA's limits.
LaunchDims rotated_blocks(const char* kernel, const RoIAlignRotatedParams& p) {
  LaunchDims d;
  d.kernel = kernel;
  d.grid[0] = p.num_rois;
  d.grid[1] = roi_align_rotated_groups(p.channels);
  d.block = kCudaThreads;
  return d;
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
  const LaunchDims d = rotated_blocks("roi_align_rotated_forward_kernel", p);
  DCNKIT_RETURN_IF_ERROR(check_launch(d));
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_rois(dtype, rois_dtype, [&](auto t, auto r) -> Status {
    using T = decltype(t);
    using R = decltype(r);
    roi_align_rotated_forward_kernel<T, R><<<launch_grid(d), d.block, 0, stream>>>(
        p, static_cast<const T*>(input), static_cast<const R*>(rois), static_cast<T*>(output));
    return cuda_launch_status("roi_align_rotated_forward_cuda");
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
    char* ws = static_cast<char*>(workspace);
    const auto* go = static_cast<const T*>(grad_output);
    const auto* rr = static_cast<const R*>(rois);
    if (ctx.deterministic) {  // the tile gather: every grad_input element written once, in a fixed order
      using Acc = typename AccType<T>::type;
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
      const LaunchDims d = rotated_blocks("roi_align_rotated_backward_kernel", p);
      DCNKIT_RETURN_IF_ERROR(check_launch(d));
      roi_align_rotated_backward_kernel<T, R><<<launch_grid(d), d.block, 0, stream>>>(p, go, rr, g.acc);
    }
    DCNKIT_RETURN_IF_ERROR(cuda_launch_status("roi_align_rotated_backward_cuda"));
    return grad_acc_store(g, stream, "roi_align_rotated_backward_cuda");
  });
}

}  // namespace dcnkit
