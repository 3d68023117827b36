// DeformPSRoIPool: R-FCN deformable position-sensitive RoI pooling (Dai et al. 2017). See docs/operators.md.
//   input (N, output_dim * group_size^2, H, W), rois (K, 5),
//   trans (K, 2 * num_classes, part_size, part_size) absent when no_trans
//   -> output (K, output_dim, P, P), count (K, output_dim, P, P) (samples taken, reused by backward)
#pragma once

#include "dcnkit/common.h"
#include "dcnkit/context.h"

namespace dcnkit {

struct DeformPSRoIPoolAttrs {
  double spatial_scale = 1.0;
  int64_t output_size = 1;   // P
  int64_t output_dim = 1;
  int64_t group_size = 1;
  int64_t part_size = 0;     // <= 0: P
  int64_t sample_per_part = 4;
  double trans_std = 0.0;
  bool no_trans = false;
};

struct DeformPSRoIPoolParams {
  DeformPSRoIPoolAttrs attrs;  // part_size resolved (> 0)
  int64_t batch = 0, channels = 0, height = 0, width = 0, num_rois = 0;
  int64_t num_classes = 1;
  Shape output_shape() const {
    return {num_rois, attrs.output_dim, attrs.output_size, attrs.output_size};
  }
};

// `trans` null or attrs.no_trans: no transformation. Both must agree when given.
Status make_deform_psroi_pool_params(const char* op, const Shape& input, const Shape& rois,
                                     const Shape* trans, const DeformPSRoIPoolAttrs& attrs,
                                     DeformPSRoIPoolParams* p);

template <typename T>
Status deform_psroi_pool_forward_cpu(const DeformPSRoIPoolParams& p, const T* input, const T* rois,
                                     const T* trans, T* output, T* count, const CpuContext& ctx);
// grad_trans may be null; it is written (not accumulated).
template <typename T>
Status deform_psroi_pool_backward_cpu(const DeformPSRoIPoolParams& p, const T* grad_output,
                                      const T* input, const T* rois, const T* trans,
                                      const T* count, T* grad_input, T* grad_trans,
                                      const CpuContext& ctx);

// CUDA (float32, float64, float16, bfloat16; forward and backward). Never synchronises: a RoI whose batch
// index is outside [0, N) or NaN gives zeros (count 0). Workspace: deform_psroi_pool_workspace_cuda
// (forward), deform_psroi_pool_backward_workspace_cuda (backward: float32 accumulation of 16-bit
// grad_input and grad_trans). Deterministic mode (ctx.deterministic; psroi_gather.h): both gradients without
// atomics, in a fixed order; workspace (deterministic true): one footprint per RoI.
size_t deform_psroi_pool_workspace_cuda(const DeformPSRoIPoolParams& p);
size_t deform_psroi_pool_backward_workspace_cuda(const DeformPSRoIPoolParams& p, DType dtype,
                                                 bool deterministic = false);
Status deform_psroi_pool_forward_cuda(const DeformPSRoIPoolParams& p, DType dtype,
                                      const void* input, const void* rois, const void* trans,
                                      void* output, void* count, void* workspace,
                                      const CudaContext& ctx);
Status deform_psroi_pool_backward_cuda(const DeformPSRoIPoolParams& p, DType dtype,
                                       const void* grad_output, const void* input,
                                       const void* rois, const void* trans, const void* count,
                                       void* grad_input, void* grad_trans, void* workspace,
                                       const CudaContext& ctx);

}  // namespace dcnkit
