// DeformPSRoIPool CUDA launchers: the forward and grad_input on RoIAlign's block schedule where the geometry allows
// (psroi_plan.h), else, and for grad_trans, grid-stride kernels over the per-element functions of psroi_kernels.h;
// deterministic mode: grad_input by the tile gather, grad_trans one thread per entry (psroi_gather.h).
// float32, float64, float16, bfloat16, forward and backward (the accumulation type follows the data; 16-bit
// grad_input and grad_trans accumulate in float32 workspace buffers). A RoI whose batch index is outside
// [0, N) gives zeros.
#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/psroi_kernels.h"
#include "dcnkit/psroi_gather.h"
#include "dcnkit/psroi_plan.h"
#include "dcnkit/roi_gather_cuda.cuh"
#include "dcnkit/roi_plan_cuda.cuh"

namespace dcnkit {
namespace {

// One thread per output (k, ctop, ph, pw) (element_launch: no loop holds its RoI's geometry).
template <typename T, typename Acc>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    deform_psroi_pool_forward_kernel(DeformPSRoIPoolParams p, const T* input, const T* rois, const T* trans,
                                     T* output, T* count) {
  const int64_t P = p.attrs.output_size;
  DCNKIT_CUDA_ELEMENT(i, p.num_rois * p.attrs.output_dim * P * P);
  psroi_forward_output<Acc>(p, input, rois, trans, i, output, count);
}

// One block per (RoI, group of kRoIPlanChannels output channels) (psroi_plan.h): thread 0 computes the RoI's box,
// the block plans every bin's samples once, then loops over its (output channel, bin) pairs.
template <typename T, typename Acc>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    deform_psroi_pool_plan_forward_kernel(DeformPSRoIPoolParams p, const T* input, const T* rois, const T* trans,
                                          T* output, T* count) {
  __shared__ PSRoIPlanHead<Acc> head;
  if (threadIdx.x == 0) head = psroi_plan_head<Acc>(p, rois, blockIdx.x);
  __syncthreads();
  RoIPlanEntry<Acc>* plan = roi_plan_smem<Acc>();
  psroi_plan_fill<Acc>(p, head, trans, blockIdx.x, threadIdx.x, blockDim.x, plan);
  __syncthreads();
  const int64_t g = blockIdx.y;
  psroi_plan_forward_items<Acc, T>(p, head, plan, input, blockIdx.x, g * kRoIPlanChannels,
                                   roi_group_channels(p.attrs.output_dim, g), threadIdx.x, blockDim.x, output, count);
}

// grad_input on the forward's blocks: each block plans its RoI once and scatters its (output channel, bin) pairs.
template <typename T, typename Acc>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    deform_psroi_pool_plan_grad_input_kernel(DeformPSRoIPoolParams p, const T* grad_output, const T* rois,
                                             const T* trans, const T* count, Acc* grad_input) {
  __shared__ PSRoIPlanHead<Acc> head;
  if (threadIdx.x == 0) head = psroi_plan_head<Acc>(p, rois, blockIdx.x);
  __syncthreads();
  if (head.b < 0) return;
  RoIPlanEntry<Acc>* plan = roi_plan_smem<Acc>();
  psroi_plan_fill<Acc>(p, head, trans, blockIdx.x, threadIdx.x, blockDim.x, plan);
  __syncthreads();
  const int64_t g = blockIdx.y;
  psroi_plan_backward_items<Acc, T>(p, head, plan, grad_output, count, blockIdx.x, g * kRoIPlanChannels,
                                    roi_group_channels(p.attrs.output_dim, g), threadIdx.x, blockDim.x,
                                    [grad_input](int64_t at) { return RoIAtomicAdd<Acc>{grad_input + at}; });
}

// One thread per output gradient element, scattering into the accumulation buffers (type Acc) of
// grad_input and grad_trans (atomicAdd).
template <typename T, typename Acc>
__global__ void __launch_bounds__(kCudaThreads)
    deform_psroi_pool_backward_kernel(DeformPSRoIPoolParams p, const T* grad_output, const T* input, const T* rois,
                                      const T* trans, const T* count, Acc* grad_input, Acc* grad_trans) {
  const int64_t C = p.channels, H = p.height, W = p.width, D = p.attrs.output_dim;
  const int64_t P = p.attrs.output_size, spp = p.attrs.sample_per_part;
  DCNKIT_CUDA_ELEMENT(i, p.num_rois * D * P * P);
  const RoIElement e = roi_element(i, D, P, P);
  const T* roi = rois + e.k * 5;
  int64_t b = 0;
  if (!roi_batch_index<Acc>(roi, p.batch, &b)) return;
  const Acc g = to_acc<Acc>(grad_output[i]);
  if (g == Acc(0)) return;
  const PSRoIBin<Acc> r = psroi_bin<Acc>(p, roi, trans, e.k, e.c, e.ph, e.pw);
  const T* img = input + (b * C + r.channel) * H * W;
  const Acc cnt = to_acc<Acc>(count[i]);
  if (grad_input != nullptr) {
    RoIAtomicAdd<Acc> add{grad_input + (b * C + r.channel) * H * W};
    psroi_bin_backward<Acc>(H, W, r, spp, cnt, g, add);
  }
  if (grad_trans != nullptr && trans != nullptr) {
    Acc gtx, gty;
    psroi_bin_trans_grad<Acc>(img, H, W, r, spp, static_cast<Acc>(p.attrs.trans_std), cnt, g, &gtx, &gty);
    atomicAdd(grad_trans + r.trans_x, gtx);
    atomicAdd(grad_trans + r.trans_y, gty);
  }
}

// Deterministic grad_trans: one thread per (RoI, class, part) writing its two entries (psroi_trans_grad_entry).
template <typename T, typename Acc>
__global__ void __launch_bounds__(kCudaThreads)
    deform_psroi_pool_trans_grad_kernel(DeformPSRoIPoolParams p, const T* grad_output, const T* input, const T* rois,
                                        const T* trans, const T* count, int64_t n, T* grad_trans) {
  DCNKIT_CUDA_ELEMENT(i, n);
  psroi_trans_grad_entry<Acc, T>(p, grad_output, input, rois, trans, count, i, grad_trans);
}

// Deterministic grad_input's per-output factor g / count (psroi_gather_scale), one thread per output.
template <typename T, typename Acc>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    deform_psroi_pool_scale_kernel(const T* grad_output, const T* count, int64_t n, Acc* scale) {
  DCNKIT_CUDA_ELEMENT(o, n);
  scale[o] = psroi_gather_scale<Acc>(grad_output, count, o);
}

int64_t output_elements(const DeformPSRoIPoolParams& p) {
  return p.num_rois * p.attrs.output_dim * p.attrs.output_size * p.attrs.output_size;
}
int64_t input_elements(const DeformPSRoIPoolParams& p) { return p.batch * p.channels * p.height * p.width; }
int64_t trans_elements(const DeformPSRoIPoolParams& p) {
  return p.num_rois * 2 * p.num_classes * p.attrs.part_size * p.attrs.part_size;
}

// The deterministic backward's workspace (roi_gather.h).
RoIGatherSizes gather_sizes(const DeformPSRoIPoolParams& p, DType dtype) {
  RoIGatherSizes s;
  s.num_rois = p.num_rois;
  s.table_entries = (p.attrs.no_trans ? 1 : p.num_classes) * p.attrs.output_size * p.attrs.output_size *
                    (p.height + p.width);
  s.partial = is_16bit(dtype) ? input_elements(p) : 0;
  s.scale = output_elements(p);
  s.acc_bytes = dtype == DType::kFloat64 ? 8 : 4;
  return s;
}

}  // namespace

size_t deform_psroi_pool_workspace_cuda(const DeformPSRoIPoolParams&) { return 0; }

size_t deform_psroi_pool_backward_workspace_cuda(const DeformPSRoIPoolParams& p, DType dtype, bool deterministic) {
  RoIGatherBuffers b;
  if (deterministic) return roi_gather_carve(gather_sizes(p, dtype), nullptr, &b);
  return grad_acc_bytes(dtype, input_elements(p)) + grad_acc_bytes(dtype, trans_elements(p));
}

Status deform_psroi_pool_forward_cuda(const DeformPSRoIPoolParams& p, DType dtype,
                                      const void* input, const void* rois, const void* trans,
                                      void* output, void* count, void* /*workspace*/,
                                      const CudaContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("deform_psroi_pool_forward_cuda"));
  const int64_t n = output_elements(p);
  if (n == 0) return Status::Ok();
  DCNKIT_RETURN_IF_ERROR(check_psroi_cuda("deform_psroi_pool_forward_cuda", p));
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using Acc = typename AccType<T>::type;
    if (psroi_plan_fits<Acc>(p) && p.num_rois <= 0x7fffffff && roi_channel_groups(p.attrs.output_dim) <= 65535) {
      deform_psroi_pool_plan_forward_kernel<T, Acc>
          <<<roi_block_grid(p.num_rois, p.attrs.output_dim), kCudaThreads,
             static_cast<size_t>(psroi_plan_bytes<Acc>(p)), s>>>(
              p, static_cast<const T*>(input), static_cast<const T*>(rois),
              p.attrs.no_trans ? nullptr : static_cast<const T*>(trans), static_cast<T*>(output),
              static_cast<T*>(count));
      return cuda_launch_status("deform_psroi_pool_forward_cuda");
    }
    const LaunchDims d = element_launch("deform_psroi_pool_forward_kernel", n);
    DCNKIT_RETURN_IF_ERROR(check_launch(d));
    deform_psroi_pool_forward_kernel<T, Acc><<<launch_grid(d), d.block, 0, s>>>(
        p, static_cast<const T*>(input), static_cast<const T*>(rois),
        p.attrs.no_trans ? nullptr : static_cast<const T*>(trans), static_cast<T*>(output),
        static_cast<T*>(count));
    return cuda_launch_status("deform_psroi_pool_forward_cuda");
  });
}

Status deform_psroi_pool_backward_cuda(const DeformPSRoIPoolParams& p, DType dtype,
                                       const void* grad_output, const void* input,
                                       const void* rois, const void* trans_, const void* count,
                                       void* grad_input, void* grad_trans, void* workspace,
                                       const CudaContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("deform_psroi_pool_backward_cuda"));
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  const int64_t n = output_elements(p);
  DCNKIT_RETURN_IF_ERROR(check_psroi_cuda("deform_psroi_pool_backward_cuda", p));
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using Acc = typename AccType<T>::type;
    const T* trans = p.attrs.no_trans ? nullptr : static_cast<const T*>(trans_);
    if (ctx.deterministic) {
      // grad_input by the tile gather (psroi_gather.h), grad_trans one entry per thread: each element written once,
      // in a fixed order.
      const T *go = static_cast<const T*>(grad_output), *r = static_cast<const T*>(rois);
      const T* cnt = static_cast<const T*>(count);
      if (grad_input != nullptr) {
        if (!psroi_gather_supported(p)) {
          return arg_error("deform_psroi_pool_backward_cuda", "output_size",
                           "output_size and group_size within 32-bit indices", std::to_string(p.attrs.output_size));
        }
        RoIGatherBuffers b;
        roi_gather_carve(gather_sizes(p, dtype), static_cast<char*>(workspace), &b);
        Acc* scale = static_cast<Acc*>(b.scale);
        if (n > 0) {
          const LaunchDims d = element_launch("deform_psroi_pool_scale_kernel", n);
          DCNKIT_RETURN_IF_ERROR(check_launch(d));
          deform_psroi_pool_scale_kernel<T, Acc><<<launch_grid(d), d.block, 0, s>>>(go, cnt, n, scale);
          DCNKIT_RETURN_IF_ERROR(cuda_launch_status("deform_psroi_pool_backward_cuda: deterministic scale"));
        }
        const PSRoIGather<Acc, T> g = PSRoIGather<Acc, T>::make(p, r, trans, scale);
        DCNKIT_RETURN_IF_ERROR(roi_gather_cuda<T>("deform_psroi_pool_backward_cuda: deterministic gather", g,
                                                  p.num_rois, roi_gather_grid<Acc>(p.batch, p.channels, p.height, p.width),
                                                  r, p.batch, false, b, static_cast<T*>(grad_input), s));
      }
      if (grad_trans == nullptr) return Status::Ok();
      const int64_t m = trans_elements(p) / 2;
      if (trans == nullptr || m == 0) {
        return cuda_status(cudaMemsetAsync(grad_trans, 0, sizeof(T) * static_cast<size_t>(2 * m), s),
                           "deform_psroi_pool_backward_cuda: memset");
      }
      const LaunchDims d = element_launch("deform_psroi_pool_trans_grad_kernel", m);
      DCNKIT_RETURN_IF_ERROR(check_launch(d));
      deform_psroi_pool_trans_grad_kernel<T, Acc><<<launch_grid(d), d.block, 0, s>>>(
          p, go, static_cast<const T*>(input), r, trans, cnt, m, static_cast<T*>(grad_trans));
      return cuda_launch_status("deform_psroi_pool_backward_cuda: deterministic grad_trans");
    }
    char* ws = static_cast<char*>(workspace);
    const GradAcc<T> gin = grad_acc(static_cast<T*>(grad_input), input_elements(p), &ws);
    const GradAcc<T> gtr = grad_acc(static_cast<T*>(grad_trans), trans_elements(p), &ws);
    DCNKIT_RETURN_IF_ERROR(grad_acc_zero(gin, s, "deform_psroi_pool_backward_cuda: memset"));
    DCNKIT_RETURN_IF_ERROR(grad_acc_zero(gtr, s, "deform_psroi_pool_backward_cuda: memset"));
    // grad_input on the plan's blocks where the forward planned; then the grid-stride kernel for the rest
    const bool planned = grad_input != nullptr && n > 0 && psroi_plan_fits<Acc>(p) && p.num_rois <= 0x7fffffff &&
                         roi_channel_groups(p.attrs.output_dim) <= 65535;
    if (planned) {
      deform_psroi_pool_plan_grad_input_kernel<T, Acc>
          <<<roi_block_grid(p.num_rois, p.attrs.output_dim), kCudaThreads,
             static_cast<size_t>(psroi_plan_bytes<Acc>(p)), s>>>(p, static_cast<const T*>(grad_output),
                                                                  static_cast<const T*>(rois), trans,
                                                                  static_cast<const T*>(count), gin.acc);
      DCNKIT_RETURN_IF_ERROR(cuda_launch_status("deform_psroi_pool_backward_cuda: grad_input"));
    }
    Acc* rest_gin = planned ? nullptr : gin.acc;
    if (n > 0 && (rest_gin != nullptr || (grad_trans != nullptr && trans != nullptr))) {
      const LaunchDims d = element_launch("deform_psroi_pool_backward_kernel", n);
      DCNKIT_RETURN_IF_ERROR(check_launch(d));
      deform_psroi_pool_backward_kernel<T, Acc><<<launch_grid(d), d.block, 0, s>>>(
          p, static_cast<const T*>(grad_output), static_cast<const T*>(input), static_cast<const T*>(rois),
          trans, static_cast<const T*>(count), rest_gin, gtr.acc);
      DCNKIT_RETURN_IF_ERROR(cuda_launch_status("deform_psroi_pool_backward_cuda"));
    }
    DCNKIT_RETURN_IF_ERROR(grad_acc_store(gin, s, "deform_psroi_pool_backward_cuda: store"));
    return grad_acc_store(gtr, s, "deform_psroi_pool_backward_cuda: store");
  });
}

}  // namespace dcnkit
