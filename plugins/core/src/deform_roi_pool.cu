// DeformRoIPool CUDA launchers: grid-stride kernels over the per-element functions of roi_kernels.h.
#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/roi_kernels.h"

namespace dcnkit {
namespace {

template <typename T, typename Acc>
__device__ __forceinline__ void deform_origin(const DeformRoIPoolParams& p,
                                              const RoIAlignBox<Acc>& box, const T* offset,
                                              int64_t k, int64_t ph, int64_t pw, Acc* y0, Acc* x0) {
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  const T* ox = offset ? offset + (k * 2 * oh + ph) * ow + pw : nullptr;
  const T* oy = offset ? ox + oh * ow : nullptr;
  roi_bin_origin<Acc, T>(box, ph, pw, ox, oy, static_cast<Acc>(p.attrs.gamma), y0, x0);
}

template <typename Acc, typename T>
__device__ __forceinline__ RoIAlignBox<Acc> deform_box(const DeformRoIPoolParams& p, const T* roi) {
  return roi_align_box<Acc>(roi, static_cast<Acc>(p.attrs.spatial_scale), true, p.attrs.pooled_h,
                            p.attrs.pooled_w, p.attrs.sampling_ratio);
}

template <typename T, typename Acc>
__global__ void deform_roi_pool_forward_kernel(DeformRoIPoolParams p, const T* input, const T* rois,
                                               const T* offset, T* output, int* flag) {
  const int64_t C = p.channels, H = p.height, W = p.width;
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  const int64_t n = p.num_rois * C * oh * ow;
  DCNKIT_CUDA_KERNEL_LOOP(i, n) {
    const int64_t pw = i % ow, ph = (i / ow) % oh, c = (i / (ow * oh)) % C, k = i / (ow * oh * C);
    const T* roi = rois + k * 5;
    int64_t b = 0;
    if (!roi_batch_index<Acc>(roi, p.batch, &b)) {
      *flag = 1;
      output[i] = roi_store<T>(Acc(0));
      continue;
    }
    const RoIAlignBox<Acc> box = deform_box<Acc>(p, roi);
    Acc y0, x0;
    deform_origin<T, Acc>(p, box, offset, k, ph, pw, &y0, &x0);
    output[i] = roi_store<T>(
        roi_align_bin_forward<Acc>(input + (b * C + c) * H * W, H, W, box, y0, x0, false));
  }
}

// grad_input: one thread per output gradient element (atomicAdd).
template <typename T>
__global__ void deform_roi_pool_grad_input_kernel(DeformRoIPoolParams p, const T* grad_output,
                                                  const T* rois, const T* offset, T* grad_input,
                                                  int* flag) {
  const int64_t C = p.channels, H = p.height, W = p.width;
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  const int64_t n = p.num_rois * C * oh * ow;
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
    const RoIAlignBox<T> box = deform_box<T>(p, roi);
    T y0, x0;
    deform_origin<T, T>(p, box, offset, k, ph, pw, &y0, &x0);
    RoIAtomicAdd<T> add{grad_input + (b * C + c) * H * W};
    roi_align_bin_backward<T, T>(static_cast<const T*>(nullptr), H, W, box, y0, x0, false, g, add);
  }
}

// grad_offset: one thread per (k, ph, pw), summing over channels (no atomics).
template <typename T>
__global__ void deform_roi_pool_grad_offset_kernel(DeformRoIPoolParams p, const T* grad_output,
                                                   const T* input, const T* rois, const T* offset,
                                                   T* grad_offset, int* flag) {
  const int64_t C = p.channels, H = p.height, W = p.width;
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  const int64_t n = p.num_rois * oh * ow;
  DCNKIT_CUDA_KERNEL_LOOP(i, n) {
    const int64_t pw = i % ow, ph = (i / ow) % oh, k = i / (ow * oh);
    T* gox = grad_offset + (k * 2 * oh + ph) * ow + pw;
    T* goy = gox + oh * ow;
    const T* roi = rois + k * 5;
    int64_t b = 0;
    if (!roi_batch_index<T>(roi, p.batch, &b)) {
      *flag = 1;
      *gox = T(0);
      *goy = T(0);
      continue;
    }
    const RoIAlignBox<T> box = deform_box<T>(p, roi);
    T y0, x0;
    deform_origin<T, T>(p, box, offset, k, ph, pw, &y0, &x0);
    T sx = T(0), sy = T(0);
    for (int64_t c = 0; c < C; ++c) {
      const T g = grad_output[((k * C + c) * oh + ph) * ow + pw];
      if (g == T(0)) continue;
      T gy, gx;
      roi_align_bin_coord_grad<T>(input + (b * C + c) * H * W, H, W, box, y0, x0, &gy, &gx);
      sx += g * gx;
      sy += g * gy;
    }
    const T gamma = static_cast<T>(p.attrs.gamma);
    *gox = gamma * box.roi_w * sx;
    *goy = gamma * box.roi_h * sy;
  }
}

template <typename T>
void launch_forward(const DeformRoIPoolParams& p, const void* input, const void* rois,
                    const void* offset, void* output, int* flag, cudaStream_t s) {
  using Acc = typename AccType<T>::type;
  const int64_t n = p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w;
  deform_roi_pool_forward_kernel<T, Acc><<<cuda_blocks(n), kCudaThreads, 0, s>>>(
      p, static_cast<const T*>(input), static_cast<const T*>(rois),
      p.has_offset ? static_cast<const T*>(offset) : nullptr, static_cast<T*>(output), flag);
}

template <typename T>
Status launch_backward(const DeformRoIPoolParams& p, const void* grad_output, const void* input,
                       const void* rois, const void* offset_, void* grad_input, void* grad_offset,
                       int* flag, cudaStream_t s) {
  const int64_t n = p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w;
  const T* offset = p.has_offset ? static_cast<const T*>(offset_) : nullptr;
  if (grad_input != nullptr) {
    const size_t bytes = sizeof(T) * p.batch * p.channels * p.height * p.width;
    DCNKIT_RETURN_IF_ERROR(
        cuda_status(cudaMemsetAsync(grad_input, 0, bytes, s), "deform_roi_pool_backward_cuda"));
    if (n > 0) {
      deform_roi_pool_grad_input_kernel<T><<<cuda_blocks(n), kCudaThreads, 0, s>>>(
          p, static_cast<const T*>(grad_output), static_cast<const T*>(rois), offset,
          static_cast<T*>(grad_input), flag);
    }
  }
  if (grad_offset != nullptr) {
    const int64_t m = p.num_rois * p.attrs.pooled_h * p.attrs.pooled_w;
    if (offset == nullptr) {
      DCNKIT_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(grad_offset, 0, sizeof(T) * 2 * m, s),
                                         "deform_roi_pool_backward_cuda"));
    } else if (m > 0) {
      deform_roi_pool_grad_offset_kernel<T><<<cuda_blocks(m), kCudaThreads, 0, s>>>(
          p, static_cast<const T*>(grad_output), static_cast<const T*>(input),
          static_cast<const T*>(rois), offset, static_cast<T*>(grad_offset), flag);
    }
  }
  return Status::Ok();
}

}  // namespace

size_t deform_roi_pool_workspace_cuda(const DeformRoIPoolParams&) { return align_up(sizeof(int)); }

Status deform_roi_pool_forward_cuda(const DeformRoIPoolParams& p, DType dtype, const void* input,
                                    const void* rois, const void* offset, void* output,
                                    void* workspace, const CudaContext& ctx) {
  const int64_t n = p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w;
  if (n == 0) return Status::Ok();
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  DeviceErrorFlag flag{static_cast<int*>(workspace)};
  DCNKIT_RETURN_IF_ERROR(error_flag_reset(flag, s));
  switch (dtype) {
    case DType::kFloat32: launch_forward<float>(p, input, rois, offset, output, flag.flag, s); break;
    case DType::kFloat64: launch_forward<double>(p, input, rois, offset, output, flag.flag, s); break;
    case DType::kFloat16: launch_forward<__half>(p, input, rois, offset, output, flag.flag, s); break;
    case DType::kBFloat16:
      launch_forward<__nv_bfloat16>(p, input, rois, offset, output, flag.flag, s);
      break;
  }
  DCNKIT_RETURN_IF_ERROR(cuda_launch_status("deform_roi_pool_forward_cuda"));
  return error_flag_check(flag, s, roi_batch_device_message("deform_roi_pool", p.batch));
}

Status deform_roi_pool_backward_cuda(const DeformRoIPoolParams& p, DType dtype,
                                     const void* grad_output, const void* input, const void* rois,
                                     const void* offset, void* grad_input, void* grad_offset,
                                     void* workspace, const CudaContext& ctx) {
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  DeviceErrorFlag flag{static_cast<int*>(workspace)};
  DCNKIT_RETURN_IF_ERROR(error_flag_reset(flag, s));
  if (dtype == DType::kFloat32) {
    DCNKIT_RETURN_IF_ERROR(launch_backward<float>(p, grad_output, input, rois, offset, grad_input,
                                                  grad_offset, flag.flag, s));
  } else if (dtype == DType::kFloat64) {
    DCNKIT_RETURN_IF_ERROR(launch_backward<double>(p, grad_output, input, rois, offset, grad_input,
                                                   grad_offset, flag.flag, s));
  } else {
    return arg_error("deform_roi_pool", "input", "dtype float32 or float64 (CUDA backward)",
                     dtype_name(dtype));
  }
  DCNKIT_RETURN_IF_ERROR(cuda_launch_status("deform_roi_pool_backward_cuda"));
  return error_flag_check(flag, s, roi_batch_device_message("deform_roi_pool", p.batch));
}

}  // namespace dcnkit
