// DeformPSRoIPool CUDA launchers: grid-stride kernels over the per-element functions of roi_kernels.h.
#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/roi_kernels.h"

namespace dcnkit {
namespace {

constexpr const char* kOp = "deform_psroi_pool";

// One thread per output (k, ctop, ph, pw).
template <typename T, typename Acc>
__global__ void deform_psroi_pool_forward_kernel(DeformPSRoIPoolParams p, const T* input,
                                                 const T* rois, const T* trans, T* output, T* count,
                                                 int* flag) {
  const int64_t C = p.channels, H = p.height, W = p.width, D = p.attrs.output_dim;
  const int64_t P = p.attrs.output_size;
  DCNKIT_CUDA_KERNEL_LOOP(i, p.num_rois * D * P * P) {
    const RoIElement e = roi_element(i, D, P, P);
    const T* roi = rois + e.k * 5;
    int64_t b = 0;
    if (!roi_batch_index_or_flag<Acc>(roi, p.batch, flag, &b)) {
      output[i] = roi_store<T>(Acc(0));
      if (count != nullptr) count[i] = roi_store<T>(Acc(0));
      continue;
    }
    const PSRoIBin<Acc> r = psroi_bin<Acc>(p, roi, trans, e.k, e.c, e.ph, e.pw);
    Acc cnt;
    const Acc v = psroi_bin_forward<Acc>(input + (b * C + r.channel) * H * W, H, W, r,
                                         p.attrs.sample_per_part, &cnt);
    output[i] = roi_store<T>(v);
    if (count != nullptr) count[i] = roi_store<T>(cnt);
  }
}

// One thread per output gradient element, scattering into grad_input and grad_trans (atomicAdd).
template <typename T>
__global__ void deform_psroi_pool_backward_kernel(DeformPSRoIPoolParams p, const T* grad_output,
                                                  const T* input, const T* rois, const T* trans,
                                                  const T* count, T* grad_input, T* grad_trans,
                                                  int* flag) {
  const int64_t C = p.channels, H = p.height, W = p.width, D = p.attrs.output_dim;
  const int64_t P = p.attrs.output_size, spp = p.attrs.sample_per_part;
  DCNKIT_CUDA_KERNEL_LOOP(i, p.num_rois * D * P * P) {
    const RoIElement e = roi_element(i, D, P, P);
    const T* roi = rois + e.k * 5;
    int64_t b = 0;
    if (!roi_batch_index_or_flag<T>(roi, p.batch, flag, &b)) continue;
    const T g = grad_output[i];
    if (g == T(0)) continue;
    const PSRoIBin<T> r = psroi_bin<T>(p, roi, trans, e.k, e.c, e.ph, e.pw);
    const T* img = input + (b * C + r.channel) * H * W;
    if (grad_input != nullptr) {
      RoIAtomicAdd<T> add{grad_input + (b * C + r.channel) * H * W};
      psroi_bin_backward<T>(H, W, r, spp, count[i], g, add);
    }
    if (grad_trans != nullptr && trans != nullptr) {
      T gtx, gty;
      psroi_bin_trans_grad<T>(img, H, W, r, spp, static_cast<T>(p.attrs.trans_std), count[i], g,
                              &gtx, &gty);
      atomicAdd(grad_trans + r.trans_x, gtx);
      atomicAdd(grad_trans + r.trans_y, gty);
    }
  }
}

int64_t output_elements(const DeformPSRoIPoolParams& p) {
  return p.num_rois * p.attrs.output_dim * p.attrs.output_size * p.attrs.output_size;
}

}  // namespace

size_t deform_psroi_pool_workspace_cuda(const DeformPSRoIPoolParams&) {
  return align_up(sizeof(int));
}

Status deform_psroi_pool_forward_cuda(const DeformPSRoIPoolParams& p, DType dtype,
                                      const void* input, const void* rois, const void* trans,
                                      void* output, void* count, void* workspace,
                                      const CudaContext& ctx) {
  const int64_t n = output_elements(p);
  if (n == 0) return Status::Ok();
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return roi_launch_checked(kOp, p.batch, workspace, s, [&](int* flag) {
    return dispatch_dtype(dtype, [&](auto tag) {
      using T = decltype(tag);
      deform_psroi_pool_forward_kernel<T, typename AccType<T>::type><<<cuda_blocks(n), kCudaThreads, 0, s>>>(
          p, static_cast<const T*>(input), static_cast<const T*>(rois),
          p.attrs.no_trans ? nullptr : static_cast<const T*>(trans), static_cast<T*>(output),
          static_cast<T*>(count), flag);
      return cuda_launch_status("deform_psroi_pool_forward_cuda");
    });
  });
}

Status deform_psroi_pool_backward_cuda(const DeformPSRoIPoolParams& p, DType dtype,
                                       const void* grad_output, const void* input,
                                       const void* rois, const void* trans_, const void* count,
                                       void* grad_input, void* grad_trans, void* workspace,
                                       const CudaContext& ctx) {
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  const int64_t n = output_elements(p), ps = p.attrs.part_size;
  return dispatch_backward_dtype(kOp, dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* trans = p.attrs.no_trans ? nullptr : static_cast<const T*>(trans_);
    return roi_launch_checked(kOp, p.batch, workspace, s, [&](int* flag) {
      if (grad_input != nullptr) {
        const size_t bytes = sizeof(T) * static_cast<size_t>(p.batch * p.channels * p.height * p.width);
        DCNKIT_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(grad_input, 0, bytes, s),
                                           "deform_psroi_pool_backward_cuda: memset"));
      }
      if (grad_trans != nullptr) {
        const size_t bytes = sizeof(T) * static_cast<size_t>(p.num_rois * 2 * p.num_classes * ps * ps);
        DCNKIT_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(grad_trans, 0, bytes, s),
                                           "deform_psroi_pool_backward_cuda: memset"));
      }
      if (n == 0 || (grad_input == nullptr && (grad_trans == nullptr || trans == nullptr))) {
        return Status::Ok();
      }
      deform_psroi_pool_backward_kernel<T><<<cuda_blocks(n), kCudaThreads, 0, s>>>(
          p, static_cast<const T*>(grad_output), static_cast<const T*>(input),
          static_cast<const T*>(rois), trans, static_cast<const T*>(count), static_cast<T*>(grad_input),
          static_cast<T*>(grad_trans), flag);
      return cuda_launch_status("deform_psroi_pool_backward_cuda");
    });
  });
}

}  // namespace dcnkit
