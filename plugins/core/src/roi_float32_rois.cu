// RoI forward launchers for 16-bit features with float32 RoIs (roi_float32_rois.h): grid-stride kernels over
// the per-element functions every RoI launcher uses, with the RoI rows in their own type R. One thread per
// output element (k, c, ph, pw).
#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/multi_level_roi_align_kernels.h"
#include "dcnkit/psroi_kernels.h"
#include "dcnkit/roi_float32_rois.h"
#include "dcnkit/roi_kernels.h"

namespace dcnkit {
namespace {

// One thread per output element (k, c, ph, pw) of a (K, C, oh, ow) output (element_launch): 0 for a RoI whose batch
// index is outside [0, N) or NaN, else bin(e, roi, b), the bin's value in the accumulation type.
template <typename T, typename R, typename Acc, typename Bin>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    roi_forward_kernel(int64_t K, int64_t C, int64_t oh, int64_t ow, int64_t batch, const R* rois, Bin bin,
                       T* output) {
  DCNKIT_CUDA_ELEMENT(i, K * C * oh * ow);
  const RoIElement e = roi_element(i, C, oh, ow);
  const R* roi = rois + e.k * 5;
  int64_t b = 0;
  output[i] = from_acc<T>(roi_batch_index<Acc>(roi, batch, &b) ? bin(e, roi, b) : Acc(0));
}

template <typename T, typename Acc>
struct RoIAlignBin {
  RoIAlignParams p;
  const T* input;
  template <typename R>
  __device__ Acc operator()(const RoIElement& e, const R* roi, int64_t b) const {
    const RoIAlignBox<Acc> box = roi_align_box<Acc>(roi, static_cast<Acc>(p.attrs.spatial_scale), p.attrs.aligned,
                                                    p.attrs.pooled_h, p.attrs.pooled_w, p.attrs.sampling_ratio);
    Acc y0, x0;
    roi_bin_origin<Acc, T>(box, e.ph, e.pw, nullptr, nullptr, Acc(0), &y0, &x0);
    return roi_align_bin_forward<Acc>(input + (b * p.channels + e.c) * p.height * p.width, p.height, p.width, box,
                                      y0, x0, p.attrs.mode == PoolMode::kMax, roi_thread_frame<Acc>());
  }
};

template <typename T, typename Acc>
struct DeformRoIPoolBin {
  DeformRoIPoolParams p;
  const T* input;
  const T* offset;
  template <typename R>
  __device__ Acc operator()(const RoIElement& e, const R* roi, int64_t b) const {
    const RoIAlignBox<Acc> box = deform_roi_pool_box<Acc>(p, roi);
    Acc y0, x0;
    deform_roi_pool_origin<Acc, T>(p, box, offset, e.k, e.ph, e.pw, &y0, &x0);
    return roi_align_bin_forward<Acc>(input + (b * p.channels + e.c) * p.height * p.width, p.height, p.width, box,
                                      y0, x0, false, roi_thread_frame<Acc>());
  }
};

template <typename P>
struct Levels {
  P ptr[kMaxFeatureLevels];
};

template <typename T, typename Acc>
struct MultiLevelBin {
  MultiLevelRoIAlignParams p;
  Levels<const T*> features;
  template <typename R>
  __device__ Acc operator()(const RoIElement& e, const R* roi, int64_t b) const {
    Acc box[5];
    const int64_t l = multi_level_roi_box<Acc>(p.attrs, roi, box);
    const int64_t H = level_pick(p.heights, l), W = level_pick(p.widths, l);
    const RoIAlignBox<Acc> rb = multi_level_roi_align_box<Acc>(p, box, l);
    Acc y0, x0;
    roi_bin_origin<Acc, T>(rb, e.ph, e.pw, nullptr, nullptr, Acc(0), &y0, &x0);
    return roi_align_bin_forward<Acc>(level_pick(features.ptr, l) + (b * p.channels + e.c) * H * W, H, W, rb, y0, x0,
                                      p.attrs.mode == PoolMode::kMax, roi_thread_frame<Acc>());
  }
};

// `trans` is the float32 copy of the 16-bit trans (psroi_bin reads RoIs and trans in one type).
template <typename T, typename R, typename Acc>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    deform_psroi_pool_mixed_kernel(DeformPSRoIPoolParams p, const T* input, const R* rois, const R* trans, T* output,
                                   T* count) {
  const int64_t P = p.attrs.output_size;
  DCNKIT_CUDA_ELEMENT(i, p.num_rois * p.attrs.output_dim * P * P);
  psroi_forward_output<Acc>(p, input, rois, trans, i, output, count);
}

template <typename T>
__global__ void to_float32_kernel(const T* __restrict__ in, int64_t n, float* __restrict__ out) {
  DCNKIT_CUDA_KERNEL_LOOP(i, n) { out[i] = to_acc<float>(in[i]); }
}

// Calls f(T{}) for the 16-bit feature types; anything else is an error naming `where`.
template <typename F>
Status dispatch_16bit(DType dtype, const char* where, F&& f) {
  switch (dtype) {
    case DType::kFloat16: return f(__half{});
    case DType::kBFloat16: return f(__nv_bfloat16{});
    default:
      return arg_error(where, "dtype", "float16 or bfloat16 features with float32 rois",
                       std::string(dtype_name(dtype)) + " features");
  }
}

int64_t trans_elements(const DeformPSRoIPoolParams& p) {
  return p.attrs.no_trans ? 0 : p.num_rois * 2 * p.num_classes * p.attrs.part_size * p.attrs.part_size;
}

}  // namespace

size_t deform_psroi_pool_workspace_cuda_f32_rois(const DeformPSRoIPoolParams& p) {
  const int64_t n = trans_elements(p);
  return n > 0 ? align_up(sizeof(float) * static_cast<size_t>(n)) : 0;
}

Status roi_align_forward_cuda_f32_rois(const RoIAlignParams& p, DType dtype, const void* input, const float* rois,
                                       void* output, void*, const CudaContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("roi_align_forward_cuda_f32_rois"));
  DCNKIT_RETURN_IF_ERROR(check_cuda_map_axes("roi_align_forward_cuda_f32_rois", "input", p.height, p.width));
  const int64_t n = p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w;
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_16bit(dtype, "roi_align_forward_cuda_f32_rois", [&](auto tag) {
    using T = decltype(tag);
    if (n == 0) return Status::Ok();
    const RoIAlignBin<T, float> bin{p, static_cast<const T*>(input)};
    const LaunchDims d = element_launch("roi_forward_kernel", n);
    DCNKIT_RETURN_IF_ERROR(check_launch(d));
    roi_forward_kernel<T, float, float><<<launch_grid(d), d.block, 0, s>>>(
        p.num_rois, p.channels, p.attrs.pooled_h, p.attrs.pooled_w, p.batch, rois, bin, static_cast<T*>(output));
    return cuda_launch_status("roi_align_forward_cuda_f32_rois");
  });
}

Status deform_roi_pool_forward_cuda_f32_rois(const DeformRoIPoolParams& p, DType dtype, const void* input,
                                             const float* rois, const void* offset, void* output, void*,
                                             const CudaContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("deform_roi_pool_forward_cuda_f32_rois"));
  DCNKIT_RETURN_IF_ERROR(check_cuda_map_axes("deform_roi_pool_forward_cuda_f32_rois", "input", p.height, p.width));
  const int64_t n = p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w;
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_16bit(dtype, "deform_roi_pool_forward_cuda_f32_rois", [&](auto tag) {
    using T = decltype(tag);
    if (n == 0) return Status::Ok();
    const DeformRoIPoolBin<T, float> bin{p, static_cast<const T*>(input),
                                         p.has_offset ? static_cast<const T*>(offset) : nullptr};
    const LaunchDims d = element_launch("roi_forward_kernel", n);
    DCNKIT_RETURN_IF_ERROR(check_launch(d));
    roi_forward_kernel<T, float, float><<<launch_grid(d), d.block, 0, s>>>(
        p.num_rois, p.channels, p.attrs.pooled_h, p.attrs.pooled_w, p.batch, rois, bin, static_cast<T*>(output));
    return cuda_launch_status("deform_roi_pool_forward_cuda_f32_rois");
  });
}

Status deform_psroi_pool_forward_cuda_f32_rois(const DeformPSRoIPoolParams& p, DType dtype, const void* input,
                                               const float* rois, const void* trans, void* output, void* count,
                                               void* workspace, const CudaContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("deform_psroi_pool_forward_cuda_f32_rois"));
  DCNKIT_RETURN_IF_ERROR(check_psroi_cuda("deform_psroi_pool_forward_cuda_f32_rois", p));
  const int64_t n = p.num_rois * p.attrs.output_dim * p.attrs.output_size * p.attrs.output_size;
  const int64_t nt = trans != nullptr ? trans_elements(p) : 0;  // no trans tensor: no transformation
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_16bit(dtype, "deform_psroi_pool_forward_cuda_f32_rois", [&](auto tag) {
    using T = decltype(tag);
    if (n == 0) return Status::Ok();
    float* trans32 = nullptr;
    if (nt > 0) {
      if (workspace == nullptr) {
        return arg_error("deform_psroi_pool_forward_cuda_f32_rois", "workspace",
                         std::to_string(deform_psroi_pool_workspace_cuda_f32_rois(p)) + " bytes", "none");
      }
      trans32 = static_cast<float*>(workspace);
      to_float32_kernel<T><<<cuda_blocks(nt), kCudaThreads, 0, s>>>(static_cast<const T*>(trans), nt, trans32);
      DCNKIT_RETURN_IF_ERROR(cuda_launch_status("deform_psroi_pool_forward_cuda_f32_rois: trans"));
    }
    const LaunchDims d = element_launch("deform_psroi_pool_mixed_kernel", n);
    DCNKIT_RETURN_IF_ERROR(check_launch(d));
    deform_psroi_pool_mixed_kernel<T, float, float><<<launch_grid(d), d.block, 0, s>>>(
        p, static_cast<const T*>(input), rois, trans32, static_cast<T*>(output), static_cast<T*>(count));
    return cuda_launch_status("deform_psroi_pool_forward_cuda_f32_rois");
  });
}

Status multi_level_roi_align_forward_cuda_f32_rois(const MultiLevelRoIAlignParams& p, DType dtype,
                                                   const void* const* features, const float* rois, void* output,
                                                   void*, const CudaContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("multi_level_roi_align_forward_cuda_f32_rois"));
  DCNKIT_RETURN_IF_ERROR(check_multi_level_cuda("multi_level_roi_align_forward_cuda_f32_rois", p));
  const int64_t n = p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w;
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_16bit(dtype, "multi_level_roi_align_forward_cuda_f32_rois", [&](auto tag) {
    using T = decltype(tag);
    if (n == 0) return Status::Ok();
    MultiLevelBin<T, float> bin{p, {}};
    for (int64_t l = 0; l < p.attrs.num_levels; ++l) bin.features.ptr[l] = static_cast<const T*>(features[l]);
    const LaunchDims d = element_launch("roi_forward_kernel", n);
    DCNKIT_RETURN_IF_ERROR(check_launch(d));
    roi_forward_kernel<T, float, float><<<launch_grid(d), d.block, 0, s>>>(
        p.num_rois, p.channels, p.attrs.pooled_h, p.attrs.pooled_w, p.batch, rois, bin, static_cast<T*>(output));
    return cuda_launch_status("multi_level_roi_align_forward_cuda_f32_rois");
  });
}

}  // namespace dcnkit
