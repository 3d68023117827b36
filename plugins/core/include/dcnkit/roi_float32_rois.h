// Forward launchers of the RoI operators for float16 / bfloat16 features with float32 RoIs.
//
// The launchers of roi_align.h, deform_roi_pool.h, deform_psroi_pool.h and multi_level_roi_align.h take the
// RoIs in the features' dtype. A float16 RoI steps by 1 px above 1024 px (2 px above 2048), which moves boxes
// and flips the FPN level of MultiLevelRoIAlign; strongly typed TensorRT networks keep the RoIs in float32
// while the features are 16-bit. These launchers take exactly that pair: `dtype` is the features' (and every
// other tensor's: offset, trans, output, count), float16 or bfloat16; `rois` is float32. The per-element math
// is the same DCNKIT_HD functions (roi_kernels.h, psroi_kernels.h, multi_level_roi_align_kernels.h), which
// read RoI rows of any type into the accumulation type (float), so the results are those of the float32-RoI
// computation on 16-bit features. Same contract otherwise: no synchronisation, zeros for a RoI whose batch
// index is outside [0, N) or NaN.
#pragma once

#include "dcnkit/common.h"
#include "dcnkit/context.h"
#include "dcnkit/deform_psroi_pool.h"
#include "dcnkit/deform_roi_pool.h"
#include "dcnkit/multi_level_roi_align.h"
#include "dcnkit/roi_align.h"

namespace dcnkit {

// Whether features of `dtype` take float32 RoIs through the launchers below (float16, bfloat16).
inline bool float32_rois_supported(DType dtype) { return dtype == DType::kFloat16 || dtype == DType::kBFloat16; }

// Workspace bytes of each launcher below: 0, except DeformPSRoIPool, which reads trans (dtype) as a float32
// copy next to the float32 RoIs.
size_t deform_psroi_pool_workspace_cuda_f32_rois(const DeformPSRoIPoolParams& p);

Status roi_align_forward_cuda_f32_rois(const RoIAlignParams& p, DType dtype, const void* input, const float* rois,
                                       void* output, void* workspace, const CudaContext& ctx);
Status deform_roi_pool_forward_cuda_f32_rois(const DeformRoIPoolParams& p, DType dtype, const void* input,
                                             const float* rois, const void* offset, void* output, void* workspace,
                                             const CudaContext& ctx);
Status deform_psroi_pool_forward_cuda_f32_rois(const DeformPSRoIPoolParams& p, DType dtype, const void* input,
                                               const float* rois, const void* trans, void* output, void* count,
                                               void* workspace, const CudaContext& ctx);
Status multi_level_roi_align_forward_cuda_f32_rois(const MultiLevelRoIAlignParams& p, DType dtype,
                                                   const void* const* features, const float* rois, void* output,
                                                   void* workspace, const CudaContext& ctx);

}  // namespace dcnkit
