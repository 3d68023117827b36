// DeformRoIPool: aligned RoIAlign (avg) whose bins are shifted by learned offsets (mmcv semantics).
//   input (N, C, H, W), rois (K, 5), offset (K, 2, oh, ow) optional  ->  output (K, C, oh, ow)
#pragma once

#include "dcnkit/common.h"
#include "dcnkit/context.h"

namespace dcnkit {

struct DeformRoIPoolAttrs {
  int64_t pooled_h = 1, pooled_w = 1;
  double spatial_scale = 1.0;
  int64_t sampling_ratio = 0;
  double gamma = 0.1;
};

struct DeformRoIPoolParams {
  DeformRoIPoolAttrs attrs;
  int64_t batch = 0, channels = 0, height = 0, width = 0, num_rois = 0;
  bool has_offset = false;
  Shape output_shape() const { return {num_rois, channels, attrs.pooled_h, attrs.pooled_w}; }
};

Status make_deform_roi_pool_params(const char* op, const Shape& input, const Shape& rois,
                                   const Shape* offset, const DeformRoIPoolAttrs& attrs,
                                   DeformRoIPoolParams* p);

template <typename T>
Status deform_roi_pool_forward_cpu(const DeformRoIPoolParams& p, const T* input, const T* rois,
                                   const T* offset, T* output, const CpuContext& ctx);
// grad_offset may be null; it is written (not accumulated).
template <typename T>
Status deform_roi_pool_backward_cpu(const DeformRoIPoolParams& p, const T* grad_output,
                                    const T* input, const T* rois, const T* offset, T* grad_input,
                                    T* grad_offset, const CpuContext& ctx);

// CUDA (float32, float64, float16, bfloat16; forward and backward). Never synchronises: a RoI whose batch
// index is outside [0, N) or NaN gives zeros. Workspace: deform_roi_pool_workspace_cuda (forward),
// deform_roi_pool_backward_workspace_cuda (backward: float32 accumulation of a 16-bit grad_input). Deterministic
// mode (ctx.deterministic; roi_gather.h): grad_input without atomics, in a fixed order (grad_offset has none in
// either mode); workspace (deterministic true): one footprint per RoI.
size_t deform_roi_pool_workspace_cuda(const DeformRoIPoolParams& p);
size_t deform_roi_pool_backward_workspace_cuda(const DeformRoIPoolParams& p, DType dtype, bool deterministic = false);
Status deform_roi_pool_forward_cuda(const DeformRoIPoolParams& p, DType dtype, const void* input,
                                    const void* rois, const void* offset, void* output,
                                    void* workspace, const CudaContext& ctx);
Status deform_roi_pool_backward_cuda(const DeformRoIPoolParams& p, DType dtype,
                                     const void* grad_output, const void* input, const void* rois,
                                     const void* offset, void* grad_input, void* grad_offset,
                                     void* workspace, const CudaContext& ctx);

}  // namespace dcnkit
