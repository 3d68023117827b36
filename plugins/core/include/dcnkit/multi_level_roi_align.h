// MultiLevelRoIAlign: the FPN pooler of two-stage detectors (mmdeploy's MMCVMultiLevelRoiAlign) as one
// operator. See docs/operators.md.
//   features: L maps (N, C, H_l, W_l), rois (K, 5) rows [batch_index, x1, y1, x2, y2]  ->  (K, C, oh, ow)
// Per RoI: level l = clamp(floor(log2(sqrt((x2 - x1) * (y2 - y1)) / finest_scale + 1e-6)), 0, L - 1) from
// the box as given (a non-finite or negative value gives 0); when roi_scale_factor > 0 (and != 1) the box
// is rescaled about its centre to half sizes (w + 1) * f / 2 - 0.5; then RoIAlign (roi_align.h, same
// per-bin functions) on map l with spatial_scale = 1 / featmap_strides[l]. One pass over the RoIs.
#pragma once

#include <vector>

#include "dcnkit/common.h"
#include "dcnkit/context.h"
#include "dcnkit/roi_align.h"

namespace dcnkit {

// Feature levels an op takes at most (mmdet/torchvision FPNs have 4 or 5). A fixed bound keeps the
// params, with every level's size and stride, a plain struct that CUDA kernels receive by value.
constexpr int kMaxFeatureLevels = 8;

struct MultiLevelRoIAlignAttrs {
  int64_t pooled_h = 1, pooled_w = 1;
  int64_t num_levels = 0;                           // L, the number of featmap_strides
  double featmap_strides[kMaxFeatureLevels] = {};   // stride of level l (> 0)
  int64_t sampling_ratio = 0;                       // <= 0: adaptive, ceil(roi / pooled)
  int64_t finest_scale = 56;                        // > 0
  double roi_scale_factor = 1.0;                    // <= 0 or 1: the box as given
  bool aligned = true;
  PoolMode mode = PoolMode::kAvg;
};

struct MultiLevelRoIAlignParams {
  MultiLevelRoIAlignAttrs attrs;
  int64_t batch = 0, channels = 0, num_rois = 0;
  int64_t heights[kMaxFeatureLevels] = {}, widths[kMaxFeatureLevels] = {};
  double spatial_scales[kMaxFeatureLevels] = {};  // 1 / featmap_strides[l]
  Shape output_shape() const { return {num_rois, channels, attrs.pooled_h, attrs.pooled_w}; }
  Shape feature_shape(int64_t l) const { return {batch, channels, heights[l], widths[l]}; }
};

// Checks everything once: at least one and at most kMaxFeatureLevels maps, one stride per map (finite,
// > 0), every map 4-D with the batch size and channel count of features[0], rois (K, 5), output_size >= 1,
// finest_scale > 0, roi_scale_factor finite, pool_mode avg | max, sampling_ratio <= the bound of
// roi_align. Errors name the argument ("features[2]", "featmap_strides", ...), expected and actual value.
Status make_multi_level_roi_align_params(const char* op, const std::vector<Shape>& features,
                                         const Shape& rois, const MultiLevelRoIAlignAttrs& attrs,
                                         MultiLevelRoIAlignParams* p);

// The level of a RoI row (host; the kernels use multi_level_roi_level in multi_level_roi_align_kernels.h).
int64_t multi_level_roi_align_level(const MultiLevelRoIAlignParams& p, const double* roi);

// CPU (float32, float64). `features[l]` points to map l. A batch index outside [0, N) (or NaN) is an
// Invalid status naming the RoI.
template <typename T>
Status multi_level_roi_align_forward_cpu(const MultiLevelRoIAlignParams& p, const T* const* features,
                                         const T* rois, T* output, const CpuContext& ctx);
// grad_features[l] (shaped like map l) are written (zeros where no RoI pooled). Max mode recomputes the
// arg-max from `features`; avg mode does not read them (may be null).
template <typename T>
Status multi_level_roi_align_backward_cpu(const MultiLevelRoIAlignParams& p, const T* grad_output,
                                          const T* const* features, const T* rois, T* const* grad_features,
                                          const CpuContext& ctx);

// CUDA (float32, float64, float16, bfloat16; forward and backward). `features` / `grad_features` are host
// arrays of L device pointers (copied by value into the kernel's arguments: no device copy). The launchers
// never synchronise: a RoI whose batch index is outside [0, N) or NaN gives zeros (forward output 0, no
// gradient), never an out-of-bounds read. Workspace bytes: 0 for the forward; the backward needs a float32
// accumulation buffer for 16-bit gradients (every level's, one after the other). Deterministic mode
// (ctx.deterministic; roi_gather.h): the backward writes every level's gradient without atomics, in a fixed order;
// its workspace (deterministic true) is one footprint per RoI and, in max mode, two coordinates per output element.
size_t multi_level_roi_align_workspace_cuda(const MultiLevelRoIAlignParams& p);
size_t multi_level_roi_align_backward_workspace_cuda(const MultiLevelRoIAlignParams& p, DType dtype,
                                                     bool deterministic = false);
Status multi_level_roi_align_forward_cuda(const MultiLevelRoIAlignParams& p, DType dtype,
                                          const void* const* features, const void* rois, void* output,
                                          void* workspace, const CudaContext& ctx);
Status multi_level_roi_align_backward_cuda(const MultiLevelRoIAlignParams& p, DType dtype,
                                           const void* grad_output, const void* const* features,
                                           const void* rois, void* const* grad_features, void* workspace,
                                           const CudaContext& ctx);

}  // namespace dcnkit
