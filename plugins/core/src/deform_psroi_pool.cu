// DeformPSRoIPool CUDA launchers: grid-stride kernels over the per-element functions of roi_kernels.h.
#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/roi_kernels.h"

namespace dcnkit {
namespace {

// One thread per output (k, ctop, ph, pw).
template <typename T, typename Acc>
__global__ void deform_psroi_pool_forward_kernel(DeformPSRoIPoolParams p, const T* input,
                                                 const T* rois, const T* trans, T* output, T* count,
                                                 int* flag) {
  const int64_t C = p.channels, H = p.height, W = p.width, D = p.attrs.output_dim;
  const int64_t P = p.attrs.output_size;
  const int64_t n = p.num_rois * D * P * P;
  DCNKIT_CUDA_KERNEL_LOOP(i, n) {
    const int64_t pw = i % P, ph = (i / P) % P, ctop = (i / (P * P)) % D, k = i / (P * P * D);
    const T* roi = rois + k * 5;
    int64_t b = 0;
    if (!roi_batch_index<Acc>(roi, p.batch, &b)) {
      *flag = 1;
      output[i] = roi_store<T>(Acc(0));
      if (count != nullptr) count[i] = roi_store<T>(Acc(0));
      continue;
    }
    const PSRoIBin<Acc> r = psroi_bin<Acc>(p, roi, trans, k, ctop, ph, pw);
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
  const int64_t n = p.num_rois * D * P * P;
  DCNKIT_CUDA_KERNEL_LOOP(i, n) {
    const int64_t pw = i % P, ph = (i / P) % P, ctop = (i / (P * P)) % D, k = i / (P * P * D);
    const T* roi = rois + k * 5;
    int64_t b = 0;
    if (!roi_batch_index<T>(roi, p.batch, &b)) {
      *flag = 1;
      continue;
    }
    const T g = grad_output[i];
    if (g == T(0)) continue;
    const PSRoIBin<T> r = psroi_bin<T>(p, roi, trans, k, ctop, ph, pw);
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

template <typename T>
void launch_forward(const DeformPSRoIPoolParams& p, const void* input, const void* rois,
                    const void* trans, void* output, void* count, int* flag, cudaStream_t s) {
  using Acc = typename AccType<T>::type;
  const int64_t P = p.attrs.output_size;
  const int64_t n = p.num_rois * p.attrs.output_dim * P * P;
  deform_psroi_pool_forward_kernel<T, Acc><<<cuda_blocks(n), kCudaThreads, 0, s>>>(
      p, static_cast<const T*>(input), static_cast<const T*>(rois),
      p.attrs.no_trans ? nullptr : static_cast<const T*>(trans), static_cast<T*>(output),
      static_cast<T*>(count), flag);
}

template <typename T>
Status launch_backward(const DeformPSRoIPoolParams& p, const void* grad_output, const void* input,
                       const void* rois, const void* trans_, const void* count, void* grad_input,
                       void* grad_trans, int* flag, cudaStream_t s) {
  const int64_t P = p.attrs.output_size, ps = p.attrs.part_size;
  const int64_t n = p.num_rois * p.attrs.output_dim * P * P;
  const T* trans = p.attrs.no_trans ? nullptr : static_cast<const T*>(trans_);
  if (grad_input != nullptr) {
    const size_t bytes = sizeof(T) * p.batch * p.channels * p.height * p.width;
    DCNKIT_RETURN_IF_ERROR(
        cuda_status(cudaMemsetAsync(grad_input, 0, bytes, s), "deform_psroi_pool_backward_cuda"));
  }
  if (grad_trans != nullptr) {
    const size_t bytes = sizeof(T) * p.num_rois * 2 * p.num_classes * ps * ps;
    DCNKIT_RETURN_IF_ERROR(
        cuda_status(cudaMemsetAsync(grad_trans, 0, bytes, s), "deform_psroi_pool_backward_cuda"));
  }
  if (n == 0) return Status::Ok();
  deform_psroi_pool_backward_kernel<T><<<cuda_blocks(n), kCudaThreads, 0, s>>>(
      p, static_cast<const T*>(grad_output), static_cast<const T*>(input),
      static_cast<const T*>(rois), trans, static_cast<const T*>(count), static_cast<T*>(grad_input),
      static_cast<T*>(grad_trans), flag);
  return Status::Ok();
}

}  // namespace

size_t deform_psroi_pool_workspace_cuda(const DeformPSRoIPoolParams&) {
  return align_up(sizeof(int));
}

Status deform_psroi_pool_forward_cuda(const DeformPSRoIPoolParams& p, DType dtype,
                                      const void* input, const void* rois, const void* trans,
                                      void* output, void* count, void* workspace,
                                      const CudaContext& ctx) {
  const int64_t P = p.attrs.output_size;
  if (p.num_rois * p.attrs.output_dim * P * P == 0) return Status::Ok();
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  DeviceErrorFlag flag{static_cast<int*>(workspace)};
  DCNKIT_RETURN_IF_ERROR(error_flag_reset(flag, s));
  switch (dtype) {
    case DType::kFloat32:
      launch_forward<float>(p, input, rois, trans, output, count, flag.flag, s);
      break;
    case DType::kFloat64:
      launch_forward<double>(p, input, rois, trans, output, count, flag.flag, s);
      break;
    case DType::kFloat16:
      launch_forward<__half>(p, input, rois, trans, output, count, flag.flag, s);
      break;
    case DType::kBFloat16:
      launch_forward<__nv_bfloat16>(p, input, rois, trans, output, count, flag.flag, s);
      break;
  }
  DCNKIT_RETURN_IF_ERROR(cuda_launch_status("deform_psroi_pool_forward_cuda"));
  return error_flag_check(flag, s, roi_batch_device_message("deform_psroi_pool", p.batch));
}

Status deform_psroi_pool_backward_cuda(const DeformPSRoIPoolParams& p, DType dtype,
                                       const void* grad_output, const void* input,
                                       const void* rois, const void* trans, const void* count,
                                       void* grad_input, void* grad_trans, void* workspace,
                                       const CudaContext& ctx) {
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  DeviceErrorFlag flag{static_cast<int*>(workspace)};
  DCNKIT_RETURN_IF_ERROR(error_flag_reset(flag, s));
  if (dtype == DType::kFloat32) {
    DCNKIT_RETURN_IF_ERROR(launch_backward<float>(p, grad_output, input, rois, trans, count,
                                                  grad_input, grad_trans, flag.flag, s));
  } else if (dtype == DType::kFloat64) {
    DCNKIT_RETURN_IF_ERROR(launch_backward<double>(p, grad_output, input, rois, trans, count,
                                                   grad_input, grad_trans, flag.flag, s));
  } else {
    return arg_error("deform_psroi_pool", "input", "dtype float32 or float64 (CUDA backward)",
                     dtype_name(dtype));
  }
  DCNKIT_RETURN_IF_ERROR(cuda_launch_status("deform_psroi_pool_backward_cuda"));
  return error_flag_check(flag, s, roi_batch_device_message("deform_psroi_pool", p.batch));
}

}  // namespace dcnkit
