// RoIAlign CUDA launchers: grid-stride kernels over the per-element functions of roi_kernels.h.
#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/roi_kernels.h"

namespace dcnkit {
namespace {

constexpr const char* kOp = "roi_align";

// One thread per output element (k, c, ph, pw).
template <typename T, typename Acc>
__global__ void roi_align_forward_kernel(RoIAlignParams p, const T* input, const T* rois, T* output,
                                         int* flag) {
  const int64_t C = p.channels, H = p.height, W = p.width;
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  const bool max_mode = p.attrs.mode == PoolMode::kMax;
  DCNKIT_CUDA_KERNEL_LOOP(i, p.num_rois * C * oh * ow) {
    const RoIElement e = roi_element(i, C, oh, ow);
    const T* roi = rois + e.k * 5;
    int64_t b = 0;
    if (!roi_batch_index_or_flag<Acc>(roi, p.batch, flag, &b)) {
      output[i] = roi_store<T>(Acc(0));
      continue;
    }
    const RoIAlignBox<Acc> box = roi_align_box<Acc>(roi, static_cast<Acc>(p.attrs.spatial_scale),
                                                    p.attrs.aligned, oh, ow, p.attrs.sampling_ratio);
    Acc y0, x0;
    roi_bin_origin<Acc, T>(box, e.ph, e.pw, nullptr, nullptr, Acc(0), &y0, &x0);
    output[i] = roi_store<T>(
        roi_align_bin_forward<Acc>(input + (b * C + e.c) * H * W, H, W, box, y0, x0, max_mode));
  }
}

// One thread per output gradient element, scattering with atomicAdd.
template <typename T>
__global__ void roi_align_backward_kernel(RoIAlignParams p, const T* grad_output, const T* input,
                                          const T* rois, T* grad_input, int* flag) {
  const int64_t C = p.channels, H = p.height, W = p.width;
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  const bool max_mode = p.attrs.mode == PoolMode::kMax;
  DCNKIT_CUDA_KERNEL_LOOP(i, p.num_rois * C * oh * ow) {
    const RoIElement e = roi_element(i, C, oh, ow);
    const T* roi = rois + e.k * 5;
    int64_t b = 0;
    if (!roi_batch_index_or_flag<T>(roi, p.batch, flag, &b)) continue;
    const T g = grad_output[i];
    if (g == T(0)) continue;
    const RoIAlignBox<T> box = roi_align_box<T>(roi, static_cast<T>(p.attrs.spatial_scale),
                                                p.attrs.aligned, oh, ow, p.attrs.sampling_ratio);
    T y0, x0;
    roi_bin_origin<T, T>(box, e.ph, e.pw, nullptr, nullptr, T(0), &y0, &x0);
    RoIAtomicAdd<T> add{grad_input + (b * C + e.c) * H * W};
    roi_align_bin_backward<T, T>(input + (b * C + e.c) * H * W, H, W, box, y0, x0, max_mode, g, add);
  }
}

int64_t output_elements(const RoIAlignParams& p) {
  return p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w;
}

}  // namespace

size_t roi_align_workspace_cuda(const RoIAlignParams&) { return align_up(sizeof(int)); }

Status roi_align_forward_cuda(const RoIAlignParams& p, DType dtype, const void* input,
                              const void* rois, void* output, void* workspace,
                              const CudaContext& ctx) {
  const int64_t n = output_elements(p);
  if (n == 0) return Status::Ok();
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return roi_launch_checked(kOp, p.batch, workspace, s, [&](int* flag) {
    return dispatch_dtype(dtype, [&](auto tag) {
      using T = decltype(tag);
      roi_align_forward_kernel<T, typename AccType<T>::type><<<cuda_blocks(n), kCudaThreads, 0, s>>>(
          p, static_cast<const T*>(input), static_cast<const T*>(rois), static_cast<T*>(output), flag);
      return cuda_launch_status("roi_align_forward_cuda");
    });
  });
}

Status roi_align_backward_cuda(const RoIAlignParams& p, DType dtype, const void* grad_output,
                               const void* input, const void* rois, void* grad_input,
                               void* workspace, const CudaContext& ctx) {
  const int64_t n = output_elements(p);
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_backward_dtype(kOp, dtype, [&](auto tag) {
    using T = decltype(tag);
    return roi_launch_checked(kOp, p.batch, workspace, s, [&](int* flag) {
      const size_t bytes = sizeof(T) * static_cast<size_t>(p.batch * p.channels * p.height * p.width);
      DCNKIT_RETURN_IF_ERROR(
          cuda_status(cudaMemsetAsync(grad_input, 0, bytes, s), "roi_align_backward_cuda: memset"));
      if (n == 0) return Status::Ok();
      roi_align_backward_kernel<T><<<cuda_blocks(n), kCudaThreads, 0, s>>>(
          p, static_cast<const T*>(grad_output), static_cast<const T*>(input),
          static_cast<const T*>(rois), static_cast<T*>(grad_input), flag);
      return cuda_launch_status("roi_align_backward_cuda");
    });
  });
}

}  // namespace dcnkit
