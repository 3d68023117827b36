// RoIAlign CUDA launchers: grid-stride kernels over the per-element functions of roi_kernels.h.
// float32, float64, float16, bfloat16, forward and backward (the accumulation type follows the data; 16-bit
// gradients accumulate in a float32 workspace buffer). A RoI whose batch index is outside [0, N) gives zeros.
#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/roi_kernels.h"

namespace dcnkit {
namespace {

// One thread per output element (k, c, ph, pw).
template <typename T, typename Acc>
__global__ void roi_align_forward_kernel(RoIAlignParams p, const T* input, const T* rois, T* output) {
  const int64_t C = p.channels, H = p.height, W = p.width;
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  const bool max_mode = p.attrs.mode == PoolMode::kMax;
  DCNKIT_CUDA_KERNEL_LOOP(i, p.num_rois * C * oh * ow) {
    const RoIElement e = roi_element(i, C, oh, ow);
    const T* roi = rois + e.k * 5;
    int64_t b = 0;
    if (!roi_batch_index<Acc>(roi, p.batch, &b)) {
      output[i] = from_acc<T>(Acc(0));
      continue;
    }
    const RoIAlignBox<Acc> box = roi_align_box<Acc>(roi, static_cast<Acc>(p.attrs.spatial_scale),
                                                    p.attrs.aligned, oh, ow, p.attrs.sampling_ratio);
    Acc y0, x0;
    roi_bin_origin<Acc, T>(box, e.ph, e.pw, nullptr, nullptr, Acc(0), &y0, &x0);
    output[i] = from_acc<T>(
        roi_align_bin_forward<Acc>(input + (b * C + e.c) * H * W, H, W, box, y0, x0, max_mode));
  }
}

// One thread per output gradient element, scattering with atomicAdd into grad_input's accumulation
// buffer (type Acc).
template <typename T, typename Acc>
__global__ void roi_align_backward_kernel(RoIAlignParams p, const T* grad_output, const T* input,
                                          const T* rois, Acc* grad_input) {
  const int64_t C = p.channels, H = p.height, W = p.width;
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  const bool max_mode = p.attrs.mode == PoolMode::kMax;
  DCNKIT_CUDA_KERNEL_LOOP(i, p.num_rois * C * oh * ow) {
    const RoIElement e = roi_element(i, C, oh, ow);
    const T* roi = rois + e.k * 5;
    int64_t b = 0;
    if (!roi_batch_index<Acc>(roi, p.batch, &b)) continue;
    const Acc g = to_acc<Acc>(grad_output[i]);
    if (g == Acc(0)) continue;
    const RoIAlignBox<Acc> box = roi_align_box<Acc>(roi, static_cast<Acc>(p.attrs.spatial_scale),
                                                    p.attrs.aligned, oh, ow, p.attrs.sampling_ratio);
    Acc y0, x0;
    roi_bin_origin<Acc, T>(box, e.ph, e.pw, nullptr, nullptr, Acc(0), &y0, &x0);
    RoIAtomicAdd<Acc> add{grad_input + (b * C + e.c) * H * W};
    roi_align_bin_backward<Acc, T>(input + (b * C + e.c) * H * W, H, W, box, y0, x0, max_mode, g, add);
  }
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
  const int64_t n = output_elements(p);
  if (n == 0) return Status::Ok();
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    roi_align_forward_kernel<T, typename AccType<T>::type><<<cuda_blocks(n), kCudaThreads, 0, s>>>(
        p, static_cast<const T*>(input), static_cast<const T*>(rois), static_cast<T*>(output));
    return cuda_launch_status("roi_align_forward_cuda");
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
      roi_align_backward_kernel<T, Acc><<<cuda_blocks(n), kCudaThreads, 0, s>>>(
          p, static_cast<const T*>(grad_output), static_cast<const T*>(input), static_cast<const T*>(rois),
          gin.acc);
      DCNKIT_RETURN_IF_ERROR(cuda_launch_status("roi_align_backward_cuda"));
    }
    return grad_acc_store(gin, s, "roi_align_backward_cuda: store");
  });
}

}  // namespace dcnkit
