// The kernel state shared by the CPU and CUDA paths: one per graph node.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "dcnkit/deform_conv2d.h"
#include "dcnkit/deform_psroi_pool.h"
#include "dcnkit/deform_roi_pool.h"
#include "dcnkit/roi_align.h"
#include "ort_common.h"

namespace dcnkit::ort {

// ---------------------------------------------------------------------------------------------
// Canonical attribute indices, looked up in op_defs.h at compile time (a renamed attribute there
// fails the build here instead of silently reading a default).

constexpr bool cstr_eq(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) {
    ++a;
    ++b;
  }
  return *a == *b;
}

template <size_t N>
constexpr int attr_index(const AttrDef (&defs)[N], const char* name) {
  for (size_t i = 0; i < N; ++i)
    if (cstr_eq(defs[i].name, name)) return static_cast<int>(i);
  return -1;
}

template <size_t N>
constexpr int input_index(const TensorDef (&defs)[N], const char* name) {
  for (size_t i = 0; i < N; ++i)
    if (cstr_eq(defs[i].name, name)) return static_cast<int>(i);
  return -1;
}

#define DCNKIT_ATTR(table, name) std::integral_constant<int, attr_index(table, name)>::value
#define DCNKIT_INPUT(table, name) std::integral_constant<int, input_index(table, name)>::value

// DeformConv2d
constexpr int kDcStride = DCNKIT_ATTR(kDeformConv2dAttrs, "stride");
constexpr int kDcPadding = DCNKIT_ATTR(kDeformConv2dAttrs, "padding");
constexpr int kDcDilation = DCNKIT_ATTR(kDeformConv2dAttrs, "dilation");
constexpr int kDcGroups = DCNKIT_ATTR(kDeformConv2dAttrs, "groups");
constexpr int kDcDeformGroups = DCNKIT_ATTR(kDeformConv2dAttrs, "deformable_groups");
constexpr int kDcInput = DCNKIT_INPUT(kDeformConv2dInputs, "input");
constexpr int kDcOffset = DCNKIT_INPUT(kDeformConv2dInputs, "offset");
constexpr int kDcWeight = DCNKIT_INPUT(kDeformConv2dInputs, "weight");
constexpr int kDcBias = DCNKIT_INPUT(kDeformConv2dInputs, "bias");
constexpr int kDcMask = DCNKIT_INPUT(kDeformConv2dInputs, "mask");
static_assert(kDcStride >= 0 && kDcPadding >= 0 && kDcDilation >= 0 && kDcGroups >= 0 &&
                  kDcDeformGroups >= 0,
              "op_defs.h: DeformConv2d attributes changed");
static_assert(kDcInput >= 0 && kDcOffset >= 0 && kDcWeight >= 0 && kDcBias >= 0 && kDcMask >= 0,
              "op_defs.h: DeformConv2d inputs changed");

// RoIAlign
constexpr int kRaOutputSize = DCNKIT_ATTR(kRoIAlignAttrs, "output_size");
constexpr int kRaScale = DCNKIT_ATTR(kRoIAlignAttrs, "spatial_scale");
constexpr int kRaSampling = DCNKIT_ATTR(kRoIAlignAttrs, "sampling_ratio");
constexpr int kRaAligned = DCNKIT_ATTR(kRoIAlignAttrs, "aligned");
constexpr int kRaPoolMode = DCNKIT_ATTR(kRoIAlignAttrs, "pool_mode");
constexpr int kRaInput = DCNKIT_INPUT(kRoIAlignInputs, "input");
constexpr int kRaRois = DCNKIT_INPUT(kRoIAlignInputs, "rois");
static_assert(kRaOutputSize >= 0 && kRaScale >= 0 && kRaSampling >= 0 && kRaAligned >= 0 &&
                  kRaPoolMode >= 0 && kRaInput >= 0 && kRaRois >= 0,
              "op_defs.h: RoIAlign definition changed");

// DeformRoIPool
constexpr int kDrOutputSize = DCNKIT_ATTR(kDeformRoIPoolAttrs, "output_size");
constexpr int kDrScale = DCNKIT_ATTR(kDeformRoIPoolAttrs, "spatial_scale");
constexpr int kDrSampling = DCNKIT_ATTR(kDeformRoIPoolAttrs, "sampling_ratio");
constexpr int kDrGamma = DCNKIT_ATTR(kDeformRoIPoolAttrs, "gamma");
constexpr int kDrInput = DCNKIT_INPUT(kDeformRoIPoolInputs, "input");
constexpr int kDrRois = DCNKIT_INPUT(kDeformRoIPoolInputs, "rois");
constexpr int kDrOffset = DCNKIT_INPUT(kDeformRoIPoolInputs, "offset");
static_assert(kDrOutputSize >= 0 && kDrScale >= 0 && kDrSampling >= 0 && kDrGamma >= 0 &&
                  kDrInput >= 0 && kDrRois >= 0 && kDrOffset >= 0,
              "op_defs.h: DeformRoIPool definition changed");

// DeformPSRoIPool
constexpr int kPsScale = DCNKIT_ATTR(kDeformPSRoIPoolAttrs, "spatial_scale");
constexpr int kPsOutputSize = DCNKIT_ATTR(kDeformPSRoIPoolAttrs, "output_size");
constexpr int kPsOutputDim = DCNKIT_ATTR(kDeformPSRoIPoolAttrs, "output_dim");
constexpr int kPsGroupSize = DCNKIT_ATTR(kDeformPSRoIPoolAttrs, "group_size");
constexpr int kPsPartSize = DCNKIT_ATTR(kDeformPSRoIPoolAttrs, "part_size");
constexpr int kPsSamplePerPart = DCNKIT_ATTR(kDeformPSRoIPoolAttrs, "sample_per_part");
constexpr int kPsTransStd = DCNKIT_ATTR(kDeformPSRoIPoolAttrs, "trans_std");
constexpr int kPsNoTrans = DCNKIT_ATTR(kDeformPSRoIPoolAttrs, "no_trans");
constexpr int kPsInput = DCNKIT_INPUT(kDeformPSRoIPoolInputs, "input");
constexpr int kPsRois = DCNKIT_INPUT(kDeformPSRoIPoolInputs, "rois");
constexpr int kPsTrans = DCNKIT_INPUT(kDeformPSRoIPoolInputs, "trans");
static_assert(kPsScale >= 0 && kPsOutputSize >= 0 && kPsOutputDim >= 0 && kPsGroupSize >= 0 &&
                  kPsPartSize >= 0 && kPsSamplePerPart >= 0 && kPsTransStd >= 0 && kPsNoTrans >= 0 &&
                  kPsInput >= 0 && kPsRois >= 0 && kPsTrans >= 0,
              "op_defs.h: DeformPSRoIPool definition changed");

// The feature map is the first input of every operator (the CUDA path takes its memory info).
static_assert(kDcInput == 0 && kRaInput == 0 && kDrInput == 0 && kPsInput == 0, "op_defs.h: input order changed");

constexpr size_t kMaxInputs = 8;

struct CudaState;  // ort_cuda.cpp: cuBLAS handle (CUDA library only)

struct Kernel {
  const OpVariant* variant = nullptr;
  std::string prefix;  // "<domain>::<op_type> node '<name>': "
  ONNXTensorElementDataType dtype = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  bool cuda = false;
  DeformConv2dAttrs dcn;
  RoIAlignAttrs roi;
  DeformRoIPoolAttrs droi;
  DeformPSRoIPoolAttrs psroi;
  CudaState* cuda_state = nullptr;
  std::mutex mutex;  // serialises CUDA runs on this node's cuBLAS handle
};

// The node's inputs in canonical order (absent ones have value == nullptr).
Status gather_inputs(const Kernel& k, const OrtKernelContext* ctx, TensorView* inputs, size_t max_inputs);

Status compute_cpu(Kernel& k, OrtKernelContext* ctx);

#ifdef DCNKIT_ORT_CUDA
Status compute_cuda(Kernel& k, OrtKernelContext* ctx);
void destroy_cuda_state(CudaState* s);
#endif

}  // namespace dcnkit::ort
