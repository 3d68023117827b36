// DeformRoIPool CUDA launchers: RoIAlign's block schedule for the output and grad_input (roi_plan.h; deterministic
// mode: grad_input by the tile gather of roi_gather.h), a grid-stride kernel over the per-element functions of
// roi_kernels.h for grad_offset (no atomics in either mode).
// float32, float64, float16, bfloat16, forward and backward (the accumulation type follows the data; a 16-bit
// grad_input accumulates in a float32 workspace buffer). A RoI whose batch index is outside [0, N) gives zeros.
#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/roi_kernels.h"
#include "dcnkit/roi_gather_cuda.cuh"
#include "dcnkit/roi_plan_cuda.cuh"

namespace dcnkit {
namespace {

// Forward and grad_input: RoIAlign's block schedule (roi_plan.h, roi_plan_cuda.cuh): one block per (RoI, group of
// kRoIPlanChannels channels); thread 0 computes the RoI's head, the block plans every bin's samples with the bin's
// offsets applied (plan kernels; DeformRoIOrigin) or samples on the fly (visit kernels, grids too large to plan),
// then loops over its (channel, bin) pairs. Avg pooling only.
template <typename T, typename Acc>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    deform_roi_pool_plan_forward_kernel(DeformRoIPoolParams p, const T* input, const T* rois, const T* offset,
                                        T* output) {
  __shared__ RoIPlanHead<Acc> head;
  roi_block_head<Acc>([&](int64_t k) { return deform_roi_plan_head<Acc>(p, rois, k); }, rois, p.batch, false,
                      &head);
  if (head.stride == 0) return;  // the visit kernel's RoI
  RoIPlanEntry<Acc>* plan = roi_plan_smem<Acc>();
  roi_plan_fill<Acc>(p, head, threadIdx.x, blockDim.x, plan, DeformRoIOrigin<T>{p, offset, blockIdx.x});
  __syncthreads();
  const int64_t g = blockIdx.y;
  roi_plan_forward_items<Acc, T>(p, head, plan, input, blockIdx.x, g * kRoIPlanChannels,
                                 roi_group_channels(p.channels, g), threadIdx.x, blockDim.x, output, false);
}

// The visit kernels (the fallback of grids too large to plan) keep the bounded visit's loop invariants in a per-thread
// frame in shared memory (roi_thread_frame), within 48 registers.
template <typename T, typename Acc>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    deform_roi_pool_visit_forward_kernel(DeformRoIPoolParams p, const T* input, const T* rois, const T* offset,
                                         T* output, bool all) {
  __shared__ RoIPlanHead<Acc> head;
  roi_block_head<Acc>([&](int64_t k) { return roi_visit_head(deform_roi_plan_head<Acc>(p, rois, k), all); },
                      rois, p.batch, false,
                      &head);
  if (head.stride != 0) return;  // the plan kernel's RoI (none when `all`: roi_visit_head)
  const int64_t g = blockIdx.y;
  roi_visit_forward_items<Acc, T>(p, head, p.height, p.width, input, blockIdx.x, g * kRoIPlanChannels,
                                  roi_group_channels(p.channels, g), threadIdx.x, blockDim.x, output,
                                  roi_thread_frame<Acc>(), false, DeformRoIOrigin<T>{p, offset, blockIdx.x});
}

// grad_input: the same blocks, scattering with atomicAdd into the accumulation buffer (type Acc).
template <typename Acc>
struct DeformRoIAtomicAt {
  Acc* base;
  __device__ __forceinline__ RoIAtomicAdd<Acc> operator()(int64_t offset) const { return {base + offset}; }
};

template <typename T, typename Acc>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    deform_roi_pool_plan_grad_input_kernel(DeformRoIPoolParams p, const T* grad_output, const T* rois,
                                           const T* offset, Acc* grad_input) {
  __shared__ RoIPlanHead<Acc> head;
  roi_block_head<Acc>([&](int64_t k) { return deform_roi_plan_head<Acc>(p, rois, k); }, rois, p.batch, false,
                      &head);
  if (head.stride == 0) return;
  RoIPlanEntry<Acc>* plan = roi_plan_smem<Acc>();
  roi_plan_fill<Acc>(p, head, threadIdx.x, blockDim.x, plan, DeformRoIOrigin<T>{p, offset, blockIdx.x});
  __syncthreads();
  const int64_t g = blockIdx.y;
  roi_plan_backward_items<Acc, T>(p, head, plan, grad_output, static_cast<const T*>(nullptr), blockIdx.x,
                                  g * kRoIPlanChannels, roi_group_channels(p.channels, g), threadIdx.x, blockDim.x,
                                  DeformRoIAtomicAt<Acc>{grad_input}, false);
}

template <typename T, typename Acc>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    deform_roi_pool_visit_grad_input_kernel(DeformRoIPoolParams p, const T* grad_output, const T* rois,
                                            const T* offset, Acc* grad_input, bool all) {
  __shared__ RoIPlanHead<Acc> head;
  roi_block_head<Acc>([&](int64_t k) { return roi_visit_head(deform_roi_plan_head<Acc>(p, rois, k), all); },
                      rois, p.batch, false,
                      &head);
  if (head.stride != 0) return;
  const int64_t g = blockIdx.y;
  roi_visit_backward_items<Acc, T>(p, head, p.height, p.width, grad_output, static_cast<const T*>(nullptr),
                                   blockIdx.x, g * kRoIPlanChannels, roi_group_channels(p.channels, g), threadIdx.x,
                                   blockDim.x, DeformRoIAtomicAt<Acc>{grad_input}, roi_thread_frame<Acc>(), false,
                                   DeformRoIOrigin<T>{p, offset, blockIdx.x});
}

// grad_offset: one thread per (k, ph, pw) (element_launch), summing over channels in the accumulation type (no
// atomics). The channel loop's invariants (the element, the box, the bin's corner, the sample count) and its two sums
// sit in the thread's RoIThreadSlot (shared memory, read through volatile): held in registers across the visit they
// would not fit in 48.
template <typename Acc>
struct GradOffsetState {
  RoIAlignBox<Acc> box;
  Acc y0, x0, n, sy, sx;
  int64_t k, ph, pw;
};

template <typename T, typename Acc>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    deform_roi_pool_grad_offset_kernel(DeformRoIPoolParams p, const T* grad_output, const T* input, const T* rois,
                                       const T* offset, T* grad_offset) {
  const int64_t C = p.channels, H = p.height, W = p.width;
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  DCNKIT_CUDA_ELEMENT(i, p.num_rois * oh * ow);
  const RoIThreadSlot<GradOffsetState<Acc>> slot;
  volatile GradOffsetState<Acc>* st = slot.p;
  {
    const RoIElement e = roi_element(i, 1, oh, ow);
    st->k = e.k;
    st->ph = e.ph;
    st->pw = e.pw;
  }
  st->sy = Acc(0);
  st->sx = Acc(0);
  const T* roi = rois + st->k * 5;
  int64_t b = 0;
  if (roi_batch_index<Acc>(roi, p.batch, &b)) {
    const RoIAlignBox<Acc> box = deform_roi_pool_box<Acc>(p, roi);
    Acc y0, x0;
    deform_roi_pool_origin<Acc, T>(p, box, offset, st->k, st->ph, st->pw, &y0, &x0);
    roi_box_store(&st->box, box);
    st->y0 = y0;
    st->x0 = x0;
    st->n = roi_bin_count(box);
    const T* go = grad_output + (st->k * C * oh + st->ph) * ow + st->pw;
    const T* img = input + b * C * H * W;
    using Box = volatile RoIAlignBox<Acc>;
    for (int64_t c = 0; c < C; ++c, go += oh * ow, img += H * W) {
      const Acc g = to_acc<Acc>(*go);
      if (g == Acc(0)) continue;
      Acc gy, gx;
      const RoIBinTaps<Acc, RoIFrameRef<Acc>, Box> src{&st->box, st->y0, st->x0, H, W, roi_thread_frame<Acc>()};
      roi_bin_coord_grad<Acc>(img, static_cast<Acc>(st->n), src, &gy, &gx);
      st->sx = st->sx + g * gx;
      st->sy = st->sy + g * gy;
    }
    const Acc gamma = static_cast<Acc>(p.attrs.gamma);
    st->sx = gamma * st->box.roi_w * st->sx;
    st->sy = gamma * st->box.roi_h * st->sy;
  }
  T* gox = grad_offset + (st->k * 2 * oh + st->ph) * ow + st->pw;
  gox[0] = from_acc<T>(st->sx);
  gox[oh * ow] = from_acc<T>(st->sy);
}

int64_t input_elements(const DeformRoIPoolParams& p) { return p.batch * p.channels * p.height * p.width; }

// The deterministic backward's workspace (roi_gather.h).
RoIGatherSizes gather_sizes(const DeformRoIPoolParams& p, DType dtype) {
  RoIGatherSizes s;
  s.num_rois = p.num_rois;
  s.table_entries = p.attrs.pooled_h * p.attrs.pooled_w * (p.height + p.width);
  s.partial = is_16bit(dtype) ? input_elements(p) : 0;
  s.acc_bytes = dtype == DType::kFloat64 ? 8 : 4;
  return s;
}

}  // namespace

size_t deform_roi_pool_workspace_cuda(const DeformRoIPoolParams&) { return 0; }

size_t deform_roi_pool_backward_workspace_cuda(const DeformRoIPoolParams& p, DType dtype, bool deterministic) {
  RoIGatherBuffers b;
  if (deterministic) return roi_gather_carve(gather_sizes(p, dtype), nullptr, &b);
  return grad_acc_bytes(dtype, input_elements(p));
}

Status deform_roi_pool_forward_cuda(const DeformRoIPoolParams& p, DType dtype, const void* input,
                                    const void* rois, const void* offset, void* output,
                                    void* /*workspace*/, const CudaContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("deform_roi_pool_forward_cuda"));
  const int64_t n = p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w;
  if (n == 0) return Status::Ok();
  DCNKIT_RETURN_IF_ERROR(check_cuda_map_axes("deform_roi_pool_forward_cuda", "input", p.height, p.width));
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using Acc = typename AccType<T>::type;
    const T *x = static_cast<const T*>(input), *r = static_cast<const T*>(rois);
    const T* off = p.has_offset ? static_cast<const T*>(offset) : nullptr;
    T* y = static_cast<T*>(output);
    const dim3 grid = roi_block_grid(p.num_rois, p.channels);
    return roi_block_launch<Acc>(
        "deform_roi_pool_forward_cuda", p.num_rois, p.channels, p.attrs.sampling_ratio,
        p.attrs.pooled_h * p.attrs.pooled_w, p.height * p.width, false,
        [&](auto, size_t smem) {
          deform_roi_pool_plan_forward_kernel<T, Acc><<<grid, kCudaThreads, smem, s>>>(p, x, r, off, y);
        },
        [&](auto, bool all) {
          deform_roi_pool_visit_forward_kernel<T, Acc><<<grid, kCudaThreads, 0, s>>>(p, x, r, off, y, all);
        });
  });
}

Status deform_roi_pool_backward_cuda(const DeformRoIPoolParams& p, DType dtype,
                                     const void* grad_output, const void* input, const void* rois,
                                     const void* offset_, void* grad_input, void* grad_offset,
                                     void* workspace, const CudaContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("deform_roi_pool_backward_cuda"));
  DCNKIT_RETURN_IF_ERROR(check_cuda_map_axes("deform_roi_pool_backward_cuda", "input", p.height, p.width));
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using Acc = typename AccType<T>::type;
    const T* offset = p.has_offset ? static_cast<const T*>(offset_) : nullptr;
    const int64_t n = p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w;
    if (grad_input != nullptr && ctx.deterministic) {
      // The tile gather (roi_gather.h): every grad_input element written once, in a fixed order.
      RoIGatherBuffers b;
      roi_gather_carve(gather_sizes(p, dtype), static_cast<char*>(workspace), &b);
      const DeformRoIGather<Acc, T> g{p, static_cast<const T*>(rois), offset, static_cast<const T*>(grad_output), 0,
                                      nullptr};
      DCNKIT_RETURN_IF_ERROR(roi_gather_cuda<T>("deform_roi_pool_backward_cuda: deterministic gather", g, p.num_rois,
                                                roi_gather_grid<Acc>(p.batch, p.channels, p.height, p.width),
                                                static_cast<const T*>(rois), p.batch, false, b,
                                                static_cast<T*>(grad_input), s));
    } else if (grad_input != nullptr) {
      char* ws = static_cast<char*>(workspace);
      const GradAcc<T> gin = grad_acc(static_cast<T*>(grad_input), input_elements(p), &ws);
      DCNKIT_RETURN_IF_ERROR(grad_acc_zero(gin, s, "deform_roi_pool_backward_cuda: memset"));
      if (n > 0) {
        const T *go = static_cast<const T*>(grad_output), *r = static_cast<const T*>(rois);
        const dim3 grid = roi_block_grid(p.num_rois, p.channels);
        DCNKIT_RETURN_IF_ERROR(roi_block_launch<Acc>(
            "deform_roi_pool_backward_cuda", p.num_rois, p.channels, p.attrs.sampling_ratio,
            p.attrs.pooled_h * p.attrs.pooled_w, p.height * p.width, false,
            [&](auto, size_t smem) {
              deform_roi_pool_plan_grad_input_kernel<T, Acc><<<grid, kCudaThreads, smem, s>>>(p, go, r, offset,
                                                                                              gin.acc);
            },
            [&](auto, bool all) {
              deform_roi_pool_visit_grad_input_kernel<T, Acc><<<grid, kCudaThreads, 0, s>>>(p, go, r, offset, gin.acc,
                                                                                             all);
            }));
      }
      DCNKIT_RETURN_IF_ERROR(grad_acc_store(gin, s, "deform_roi_pool_backward_cuda: store"));
    }
    if (grad_offset != nullptr) {
      const int64_t m = p.num_rois * p.attrs.pooled_h * p.attrs.pooled_w;
      if (offset == nullptr) {
        return cuda_status(cudaMemsetAsync(grad_offset, 0, sizeof(T) * 2 * static_cast<size_t>(m), s),
                           "deform_roi_pool_backward_cuda: memset");
      }
      if (m > 0) {
        const LaunchDims d = element_launch("deform_roi_pool_grad_offset_kernel", m);
        DCNKIT_RETURN_IF_ERROR(check_launch(d));
        deform_roi_pool_grad_offset_kernel<T, Acc><<<launch_grid(d), d.block, 0, s>>>(
            p, static_cast<const T*>(grad_output), static_cast<const T*>(input), static_cast<const T*>(rois),
            offset, static_cast<T*>(grad_offset));
        DCNKIT_RETURN_IF_ERROR(cuda_launch_status("deform_roi_pool_backward_cuda: grad_offset"));
      }
    }
    return Status::Ok();
  });
}

}  // namespace dcnkit
