// RoIAlign CUDA launchers: grid-stride kernels over the per-element functions of roi_kernels.h.
#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/roi_kernels.h"

namespace dcnkit {
namespace {

// One thread per output element (k, c, ph, pw).
template <typename T, typename Acc>
__global__ void roi_align_forward_kernel(RoIAlignParams p, const T* input, const T* rois, T* output,
                                         int* flag) {
  const int64_t C = p.channels, H = p.height, W = p.width;
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  const int64_t n = p.num_rois * C * oh * ow;
  const bool max_mode = p.attrs.mode == PoolMode::kMax;
  DCNKIT_CUDA_KERNEL_LOOP(i, n) {
    const int64_t pw = i % ow, ph = (i / ow) % oh, c = (i / (ow * oh)) % C, k = i / (ow * oh * C);
    const T* roi = rois + k * 5;
    int64_t b = 0;
    if (!roi_batch_index<Acc>(roi, p.batch, &b)) {
      *flag = 1;
      output[i] = roi_store<T>(Acc(0));
      continue;
    }
    const RoIAlignBox<Acc> box = roi_align_box<Acc>(roi, static_cast<Acc>(p.attrs.spatial_scale),
                                                    p.attrs.aligned, oh, ow, p.attrs.sampling_ratio);
    Acc y0, x0;
    roi_bin_origin<Acc, T>(box, ph, pw, nullptr, nullptr, Acc(0), &y0, &x0);
    output[i] = roi_store<T>(
        roi_align_bin_forward<Acc>(input + (b * C + c) * H * W, H, W, box, y0, x0, max_mode));
  }
}

// One thread per output gradient element, scattering with atomicAdd.
template <typename T>
__global__ void roi_align_backward_kernel(RoIAlignParams p, const T* grad_output, const T* input,
                                          const T* rois, T* grad_input, int* flag) {
  const int64_t C = p.channels, H = p.height, W = p.width;
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  const int64_t n = p.num_rois * C * oh * ow;
  const bool max_mode = p.attrs.mode == PoolMode::kMax;
  DCNKIT_CUDA_KERNEL_LOOP(i, n) {
    const int64_t pw = i % ow, ph = (i / ow) % oh, c = (i / (ow * oh)) % C, k = i / (ow * oh * C);
    const T* roi = rois + k * 5;
    int64_t b = 0;
    if (!roi_batch_index<T>(roi, p.batch, &b)) {
      *flag = 1;
      continue;
    }
    const T g = grad_output[i];
    if (g == T(0)) continue;
    const RoIAlignBox<T> box = roi_align_box<T>(roi, static_cast<T>(p.attrs.spatial_scale),
                                                p.attrs.aligned, oh, ow, p.attrs.sampling_ratio);
    T y0, x0;
    roi_bin_origin<T, T>(box, ph, pw, nullptr, nullptr, T(0), &y0, &x0);
    RoIAtomicAdd<T> add{grad_input + (b * C + c) * H * W};
    roi_align_bin_backward<T, T>(input + (b * C + c) * H * W, H, W, box, y0, x0, max_mode, g, add);
  }
}

template <typename T>
void launch_forward(const RoIAlignParams& p, const void* input, const void* rois, void* output,
                    int* flag, cudaStream_t s) {
  using Acc = typename AccType<T>::type;
  const int64_t n = p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w;
  roi_align_forward_kernel<T, Acc><<<cuda_blocks(n), kCudaThreads, 0, s>>>(
      p, static_cast<const T*>(input), static_cast<const T*>(rois), static_cast<T*>(output), flag);
}

template <typename T>
Status launch_backward(const RoIAlignParams& p, const void* grad_output, const void* input,
                       const void* rois, void* grad_input, int* flag, cudaStream_t s) {
  const int64_t n = p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w;
  const size_t bytes = sizeof(T) * p.batch * p.channels * p.height * p.width;
  DCNKIT_RETURN_IF_ERROR(
      cuda_status(cudaMemsetAsync(grad_input, 0, bytes, s), "roi_align_backward_cuda"));
  if (n == 0) return Status::Ok();
  roi_align_backward_kernel<T><<<cuda_blocks(n), kCudaThreads, 0, s>>>(
      p, static_cast<const T*>(grad_output), static_cast<const T*>(input),
      static_cast<const T*>(rois), static_cast<T*>(grad_input), flag);
  return Status::Ok();
}

}  // namespace

size_t roi_align_workspace_cuda(const RoIAlignParams&) { return align_up(sizeof(int)); }

Status roi_align_forward_cuda(const RoIAlignParams& p, DType dtype, const void* input,
                              const void* rois, void* output, void* workspace,
                              const CudaContext& ctx) {
  const int64_t n = p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w;
  if (n == 0) return Status::Ok();
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  DeviceErrorFlag flag{static_cast<int*>(workspace)};
  DCNKIT_RETURN_IF_ERROR(error_flag_reset(flag, s));
  switch (dtype) {
    case DType::kFloat32: launch_forward<float>(p, input, rois, output, flag.flag, s); break;
    case DType::kFloat64: launch_forward<double>(p, input, rois, output, flag.flag, s); break;
    case DType::kFloat16: launch_forward<__half>(p, input, rois, output, flag.flag, s); break;
    case DType::kBFloat16: launch_forward<__nv_bfloat16>(p, input, rois, output, flag.flag, s); break;
  }
  DCNKIT_RETURN_IF_ERROR(cuda_launch_status("roi_align_forward_cuda"));
  return error_flag_check(flag, s, roi_batch_device_message("roi_align", p.batch));
}

Status roi_align_backward_cuda(const RoIAlignParams& p, DType dtype, const void* grad_output,
                               const void* input, const void* rois, void* grad_input,
                               void* workspace, const CudaContext& ctx) {
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  DeviceErrorFlag flag{static_cast<int*>(workspace)};
  DCNKIT_RETURN_IF_ERROR(error_flag_reset(flag, s));
  if (dtype == DType::kFloat32) {
    DCNKIT_RETURN_IF_ERROR(
        launch_backward<float>(p, grad_output, input, rois, grad_input, flag.flag, s));
  } else if (dtype == DType::kFloat64) {
    DCNKIT_RETURN_IF_ERROR(
        launch_backward<double>(p, grad_output, input, rois, grad_input, flag.flag, s));
  } else {
    return arg_error("roi_align", "input", "dtype float32 or float64 (CUDA backward)",
                     dtype_name(dtype));
  }
  DCNKIT_RETURN_IF_ERROR(cuda_launch_status("roi_align_backward_cuda"));
  return error_flag_check(flag, s, roi_batch_device_message("roi_align", p.batch));
}

}  // namespace dcnkit
