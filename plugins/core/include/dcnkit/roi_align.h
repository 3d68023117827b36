// RoIAlign, avg and max pooling, aligned or not, adaptive or fixed sampling. See docs/operators.md.
//   input (N, C, H, W), rois (K, 5) rows [batch_index, x1, y1, x2, y2]  ->  output (K, C, oh, ow)
#pragma once

#include "dcnkit/common.h"
#include "dcnkit/context.h"

namespace dcnkit {

enum class PoolMode : int { kAvg = 0, kMax = 1 };

// "avg" | "max" -> PoolMode; anything else is an error naming `pool_mode`.
Status parse_pool_mode(const char* op, const std::string& s, PoolMode* mode);
inline const char* pool_mode_name(PoolMode m) { return m == PoolMode::kMax ? "max" : "avg"; }

struct RoIAlignAttrs {
  int64_t pooled_h = 1, pooled_w = 1;
  double spatial_scale = 1.0;
  int64_t sampling_ratio = 0;  // <= 0: adaptive, ceil(roi / pooled)
  bool aligned = false;
  PoolMode mode = PoolMode::kAvg;
};

struct RoIAlignParams {
  RoIAlignAttrs attrs;
  int64_t batch = 0, channels = 0, height = 0, width = 0, num_rois = 0;
  // CUDA: a RoI whose batch index is outside [0, N) or NaN raises a device-side assert (the torch ops set it,
  // as torch reports a bad index); false (ONNX Runtime, TensorRT): its output is zeros and it has no gradient.
  bool assert_batch_index = false;
  Shape output_shape() const { return {num_rois, channels, attrs.pooled_h, attrs.pooled_w}; }
};

Status make_roi_align_params(const char* op, const Shape& input, const Shape& rois,
                             const RoIAlignAttrs& attrs, RoIAlignParams* p);

// CPU (float32, float64). A batch index outside [0, N) (or NaN) is an Invalid status.
template <typename T>
Status roi_align_forward_cpu(const RoIAlignParams& p, const T* input, const T* rois, T* output,
                             const CpuContext& ctx);
// Max mode recomputes the arg-max from `input`; avg mode does not read `input` (may be null).
template <typename T>
Status roi_align_backward_cpu(const RoIAlignParams& p, const T* grad_output, const T* input,
                              const T* rois, T* grad_input, const CpuContext& ctx);

// CUDA (float32, float64, float16, bfloat16; forward and backward). The launchers never synchronise: a RoI
// whose batch index is outside [0, N) or NaN gives zeros (forward output 0, no gradient), never an
// out-of-bounds read. Workspace bytes: roi_align_workspace_cuda for the forward (0 today),
// roi_align_backward_workspace_cuda for the backward (float32 accumulation of a 16-bit grad_input).
// Deterministic mode (ctx.deterministic; roi_gather.h): the backward writes grad_input without atomics, for any
// valid input, in a fixed order (bit-identical from run to run); its workspace (roi_align_backward_workspace_cuda with
// deterministic true) is one footprint per RoI and, in max mode, two coordinates per output element.
size_t roi_align_workspace_cuda(const RoIAlignParams& p);
size_t roi_align_backward_workspace_cuda(const RoIAlignParams& p, DType dtype, bool deterministic = false);
Status roi_align_forward_cuda(const RoIAlignParams& p, DType dtype, const void* input,
                              const void* rois, void* output, void* workspace,
                              const CudaContext& ctx);
Status roi_align_backward_cuda(const RoIAlignParams& p, DType dtype, const void* grad_output,
                               const void* input, const void* rois, void* grad_input,
                               void* workspace, const CudaContext& ctx);

}  // namespace dcnkit
