// MultiLevelRoIAlign CUDA launchers: grid-stride kernels over the output, one thread per output element
// (k, c, ph, pw): the RoI's level and box (multi_level_roi_align_kernels.h), then RoIAlign's bin functions
// (roi_kernels.h) on that level's map. The maps' pointers travel by value in the kernel arguments (no
// device copy, no synchronisation). float32, float64, float16, bfloat16; the accumulation type follows the
// data (16-bit gradients accumulate in a float32 workspace buffer). A RoI whose batch index is outside
// [0, N) or NaN gives zeros.
#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/multi_level_roi_align_kernels.h"

namespace dcnkit {
namespace {

// The L maps (or their gradients' accumulation buffers), by value.
template <typename P>
struct LevelPointers {
  P ptr[kMaxFeatureLevels];
};

template <typename T, typename Acc>
__global__ void multi_level_roi_align_forward_kernel(MultiLevelRoIAlignParams p, LevelPointers<const T*> features,
                                                     const T* rois, T* output) {
  const int64_t C = p.channels, oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  const bool max_mode = p.attrs.mode == PoolMode::kMax;
  DCNKIT_CUDA_KERNEL_LOOP(i, p.num_rois * C * oh * ow) {
    const RoIElement e = roi_element(i, C, oh, ow);
    const T* roi = rois + e.k * 5;
    int64_t b = 0;
    if (!roi_batch_index<Acc>(roi, p.batch, &b)) {
      output[i] = from_acc<T>(Acc(0));
      continue;
    }
    Acc box[5];
    const int64_t l = multi_level_roi_box<Acc>(p.attrs, roi, box);
    const int64_t H = level_pick(p.heights, l), W = level_pick(p.widths, l);
    const RoIAlignBox<Acc> rb = multi_level_roi_align_box<Acc>(p, box, l);
    Acc y0, x0;
    roi_bin_origin<Acc, T>(rb, e.ph, e.pw, nullptr, nullptr, Acc(0), &y0, &x0);
    output[i] = from_acc<T>(
        roi_align_bin_forward<Acc>(level_pick(features.ptr, l) + (b * C + e.c) * H * W, H, W, rb, y0, x0,
                                   max_mode));
  }
}

// One thread per output gradient element, scattering with atomicAdd into the level's accumulation buffer.
template <typename T, typename Acc>
__global__ void multi_level_roi_align_backward_kernel(MultiLevelRoIAlignParams p, const T* grad_output,
                                                      LevelPointers<const T*> features, const T* rois,
                                                      LevelPointers<Acc*> grad_features) {
  const int64_t C = p.channels, oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  const bool max_mode = p.attrs.mode == PoolMode::kMax;
  DCNKIT_CUDA_KERNEL_LOOP(i, p.num_rois * C * oh * ow) {
    const RoIElement e = roi_element(i, C, oh, ow);
    const T* roi = rois + e.k * 5;
    int64_t b = 0;
    if (!roi_batch_index<Acc>(roi, p.batch, &b)) continue;
    const Acc g = to_acc<Acc>(grad_output[i]);
    if (g == Acc(0)) continue;
    Acc box[5];
    const int64_t l = multi_level_roi_box<Acc>(p.attrs, roi, box);
    const int64_t H = level_pick(p.heights, l), W = level_pick(p.widths, l);
    const RoIAlignBox<Acc> rb = multi_level_roi_align_box<Acc>(p, box, l);
    Acc y0, x0;
    roi_bin_origin<Acc, T>(rb, e.ph, e.pw, nullptr, nullptr, Acc(0), &y0, &x0);
    const T* img = max_mode ? level_pick(features.ptr, l) + (b * C + e.c) * H * W : nullptr;
    RoIAtomicAdd<Acc> add{level_pick(grad_features.ptr, l) + (b * C + e.c) * H * W};
    roi_align_bin_backward<Acc, T>(img, H, W, rb, y0, x0, max_mode, g, add);
  }
}

int64_t output_elements(const MultiLevelRoIAlignParams& p) {
  return p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w;
}

int64_t level_elements(const MultiLevelRoIAlignParams& p, int64_t l) {
  return p.batch * p.channels * p.heights[l] * p.widths[l];
}

}  // namespace

size_t multi_level_roi_align_workspace_cuda(const MultiLevelRoIAlignParams&) { return 0; }

size_t multi_level_roi_align_backward_workspace_cuda(const MultiLevelRoIAlignParams& p, DType dtype) {
  size_t bytes = 0;
  for (int64_t l = 0; l < p.attrs.num_levels; ++l) bytes += grad_acc_bytes(dtype, level_elements(p, l));
  return bytes;
}

Status multi_level_roi_align_forward_cuda(const MultiLevelRoIAlignParams& p, DType dtype,
                                          const void* const* features, const void* rois, void* output,
                                          void* /*workspace*/, const CudaContext& ctx) {
  const int64_t n = output_elements(p);
  if (n == 0) return Status::Ok();
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    LevelPointers<const T*> f{};
    for (int64_t l = 0; l < p.attrs.num_levels; ++l) f.ptr[l] = static_cast<const T*>(features[l]);
    multi_level_roi_align_forward_kernel<T, typename AccType<T>::type><<<cuda_blocks(n), kCudaThreads, 0, s>>>(
        p, f, static_cast<const T*>(rois), static_cast<T*>(output));
    return cuda_launch_status("multi_level_roi_align_forward_cuda");
  });
}

Status multi_level_roi_align_backward_cuda(const MultiLevelRoIAlignParams& p, DType dtype,
                                           const void* grad_output, const void* const* features,
                                           const void* rois, void* const* grad_features, void* workspace,
                                           const CudaContext& ctx) {
  const int64_t n = output_elements(p);
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using Acc = typename AccType<T>::type;
    char* ws = static_cast<char*>(workspace);
    GradAcc<T> gin[kMaxFeatureLevels];
    LevelPointers<const T*> f{};
    LevelPointers<Acc*> g{};
    for (int64_t l = 0; l < p.attrs.num_levels; ++l) {
      gin[l] = grad_acc(static_cast<T*>(grad_features[l]), level_elements(p, l), &ws);
      DCNKIT_RETURN_IF_ERROR(grad_acc_zero(gin[l], s, "multi_level_roi_align_backward_cuda: memset"));
      f.ptr[l] = features != nullptr ? static_cast<const T*>(features[l]) : nullptr;
      g.ptr[l] = gin[l].acc;
    }
    if (n > 0) {
      multi_level_roi_align_backward_kernel<T, Acc><<<cuda_blocks(n), kCudaThreads, 0, s>>>(
          p, static_cast<const T*>(grad_output), f, static_cast<const T*>(rois), g);
      DCNKIT_RETURN_IF_ERROR(cuda_launch_status("multi_level_roi_align_backward_cuda"));
    }
    for (int64_t l = 0; l < p.attrs.num_levels; ++l) {
      DCNKIT_RETURN_IF_ERROR(grad_acc_store(gin[l], s, "multi_level_roi_align_backward_cuda: store"));
    }
    return Status::Ok();
  });
}

}  // namespace dcnkit
