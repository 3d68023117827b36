// DeformRoIPool CUDA launchers: grid-stride kernels over the per-element functions of roi_kernels.h.
// float32, float64, float16, bfloat16, forward and backward (the accumulation type follows the data; a 16-bit
// grad_input accumulates in a float32 workspace buffer). A RoI whose batch index is outside [0, N) gives zeros.
#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/roi_kernels.h"

namespace dcnkit {
namespace {

template <typename T, typename Acc>
__global__ void deform_roi_pool_forward_kernel(DeformRoIPoolParams p, const T* input, const T* rois,
                                               const T* offset, T* output) {
  const int64_t C = p.channels, H = p.height, W = p.width;
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  DCNKIT_CUDA_KERNEL_LOOP(i, p.num_rois * C * oh * ow) {
    const RoIElement e = roi_element(i, C, oh, ow);
    const T* roi = rois + e.k * 5;
    int64_t b = 0;
    if (!roi_batch_index<Acc>(roi, p.batch, &b)) {
      output[i] = from_acc<T>(Acc(0));
      continue;
    }
    const RoIAlignBox<Acc> box = deform_roi_pool_box<Acc>(p, roi);
    Acc y0, x0;
    deform_roi_pool_origin<Acc, T>(p, box, offset, e.k, e.ph, e.pw, &y0, &x0);
    output[i] = from_acc<T>(
        roi_align_bin_forward<Acc>(input + (b * C + e.c) * H * W, H, W, box, y0, x0, false));
  }
}

// grad_input: one thread per output gradient element (atomicAdd into the accumulation buffer, type Acc).
template <typename T, typename Acc>
__global__ void deform_roi_pool_grad_input_kernel(DeformRoIPoolParams p, const T* grad_output,
                                                  const T* rois, const T* offset, Acc* grad_input) {
  const int64_t C = p.channels, H = p.height, W = p.width;
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  DCNKIT_CUDA_KERNEL_LOOP(i, p.num_rois * C * oh * ow) {
    const RoIElement e = roi_element(i, C, oh, ow);
    const T* roi = rois + e.k * 5;
    int64_t b = 0;
    if (!roi_batch_index<Acc>(roi, p.batch, &b)) continue;
    const Acc g = to_acc<Acc>(grad_output[i]);
    if (g == Acc(0)) continue;
    const RoIAlignBox<Acc> box = deform_roi_pool_box<Acc>(p, roi);
    Acc y0, x0;
    deform_roi_pool_origin<Acc, T>(p, box, offset, e.k, e.ph, e.pw, &y0, &x0);
    RoIAtomicAdd<Acc> add{grad_input + (b * C + e.c) * H * W};
    roi_align_bin_backward<Acc, T>(static_cast<const T*>(nullptr), H, W, box, y0, x0, false, g, add);
  }
}

// grad_offset: one thread per (k, ph, pw), summing over channels in the accumulation type (no atomics).
template <typename T, typename Acc>
__global__ void deform_roi_pool_grad_offset_kernel(DeformRoIPoolParams p, const T* grad_output,
                                                   const T* input, const T* rois, const T* offset,
                                                   T* grad_offset) {
  const int64_t C = p.channels, H = p.height, W = p.width;
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  DCNKIT_CUDA_KERNEL_LOOP(i, p.num_rois * oh * ow) {
    const RoIElement e = roi_element(i, 1, oh, ow);
    const int64_t k = e.k, ph = e.ph, pw = e.pw;
    T* gox = grad_offset + (k * 2 * oh + ph) * ow + pw;
    T* goy = gox + oh * ow;
    const T* roi = rois + k * 5;
    int64_t b = 0;
    if (!roi_batch_index<Acc>(roi, p.batch, &b)) {
      *gox = from_acc<T>(Acc(0));
      *goy = from_acc<T>(Acc(0));
      continue;
    }
    const RoIAlignBox<Acc> box = deform_roi_pool_box<Acc>(p, roi);
    Acc y0, x0;
    deform_roi_pool_origin<Acc, T>(p, box, offset, k, ph, pw, &y0, &x0);
    Acc sx = Acc(0), sy = Acc(0);
    for (int64_t c = 0; c < C; ++c) {
      const Acc g = to_acc<Acc>(grad_output[((k * C + c) * oh + ph) * ow + pw]);
      if (g == Acc(0)) continue;
      Acc gy, gx;
      roi_align_bin_coord_grad<Acc>(input + (b * C + c) * H * W, H, W, box, y0, x0, &gy, &gx);
      sx += g * gx;
      sy += g * gy;
    }
    const Acc gamma = static_cast<Acc>(p.attrs.gamma);
    *gox = from_acc<T>(gamma * box.roi_w * sx);
    *goy = from_acc<T>(gamma * box.roi_h * sy);
  }
}

int64_t input_elements(const DeformRoIPoolParams& p) { return p.batch * p.channels * p.height * p.width; }

}  // namespace

size_t deform_roi_pool_workspace_cuda(const DeformRoIPoolParams&) { return 0; }

size_t deform_roi_pool_backward_workspace_cuda(const DeformRoIPoolParams& p, DType dtype) {
  return grad_acc_bytes(dtype, input_elements(p));
}

Status deform_roi_pool_forward_cuda(const DeformRoIPoolParams& p, DType dtype, const void* input,
                                    const void* rois, const void* offset, void* output,
                                    void* /*workspace*/, const CudaContext& ctx) {
  const int64_t n = p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w;
  if (n == 0) return Status::Ok();
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    deform_roi_pool_forward_kernel<T, typename AccType<T>::type><<<cuda_blocks(n), kCudaThreads, 0, s>>>(
        p, static_cast<const T*>(input), static_cast<const T*>(rois),
        p.has_offset ? static_cast<const T*>(offset) : nullptr, static_cast<T*>(output));
    return cuda_launch_status("deform_roi_pool_forward_cuda");
  });
}

Status deform_roi_pool_backward_cuda(const DeformRoIPoolParams& p, DType dtype,
                                     const void* grad_output, const void* input, const void* rois,
                                     const void* offset_, void* grad_input, void* grad_offset,
                                     void* workspace, const CudaContext& ctx) {
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using Acc = typename AccType<T>::type;
    const T* offset = p.has_offset ? static_cast<const T*>(offset_) : nullptr;
    const int64_t n = p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w;
    if (grad_input != nullptr) {
      char* ws = static_cast<char*>(workspace);
      const GradAcc<T> gin = grad_acc(static_cast<T*>(grad_input), input_elements(p), &ws);
      DCNKIT_RETURN_IF_ERROR(grad_acc_zero(gin, s, "deform_roi_pool_backward_cuda: memset"));
      if (n > 0) {
        deform_roi_pool_grad_input_kernel<T, Acc><<<cuda_blocks(n), kCudaThreads, 0, s>>>(
            p, static_cast<const T*>(grad_output), static_cast<const T*>(rois), offset, gin.acc);
        DCNKIT_RETURN_IF_ERROR(cuda_launch_status("deform_roi_pool_backward_cuda: grad_input"));
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
        deform_roi_pool_grad_offset_kernel<T, Acc><<<cuda_blocks(m), kCudaThreads, 0, s>>>(
            p, static_cast<const T*>(grad_output), static_cast<const T*>(input), static_cast<const T*>(rois),
            offset, static_cast<T*>(grad_offset));
        DCNKIT_RETURN_IF_ERROR(cuda_launch_status("deform_roi_pool_backward_cuda: grad_offset"));
      }
    }
    return Status::Ok();
  });
}

}  // namespace dcnkit
