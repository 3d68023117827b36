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

// Index of the entry called `name` in an AttrDef or TensorDef table (-1: none).
template <typename Def, size_t N>
constexpr int def_index(const Def (&defs)[N], const char* name) {
  for (size_t i = 0; i < N; ++i)
    if (cstr_eq(defs[i].name, name)) return static_cast<int>(i);
  return -1;
}

template <int I>
constexpr int found_index() {
  static_assert(I >= 0, "op_defs.h: an attribute or input named here is not in its table (renamed?)");
  return I;
}

// The index of attribute or input `name` in `table`, at compile time; a name missing there fails the
// build on the line that uses it.
#define DCNKIT_INDEX(table, name) found_index<def_index(table, name)>()

// DeformConv2d
constexpr int kDcStride = DCNKIT_INDEX(kDeformConv2dAttrs, "stride");
constexpr int kDcPadding = DCNKIT_INDEX(kDeformConv2dAttrs, "padding");
constexpr int kDcDilation = DCNKIT_INDEX(kDeformConv2dAttrs, "dilation");
constexpr int kDcGroups = DCNKIT_INDEX(kDeformConv2dAttrs, "groups");
constexpr int kDcDeformGroups = DCNKIT_INDEX(kDeformConv2dAttrs, "deformable_groups");
constexpr int kDcInput = DCNKIT_INDEX(kDeformConv2dInputs, "input");
constexpr int kDcOffset = DCNKIT_INDEX(kDeformConv2dInputs, "offset");
constexpr int kDcWeight = DCNKIT_INDEX(kDeformConv2dInputs, "weight");
constexpr int kDcBias = DCNKIT_INDEX(kDeformConv2dInputs, "bias");
constexpr int kDcMask = DCNKIT_INDEX(kDeformConv2dInputs, "mask");

// RoIAlign
constexpr int kRaOutputSize = DCNKIT_INDEX(kRoIAlignAttrs, "output_size");
constexpr int kRaScale = DCNKIT_INDEX(kRoIAlignAttrs, "spatial_scale");
constexpr int kRaSampling = DCNKIT_INDEX(kRoIAlignAttrs, "sampling_ratio");
constexpr int kRaAligned = DCNKIT_INDEX(kRoIAlignAttrs, "aligned");
constexpr int kRaPoolMode = DCNKIT_INDEX(kRoIAlignAttrs, "pool_mode");
constexpr int kRaInput = DCNKIT_INDEX(kRoIAlignInputs, "input");
constexpr int kRaRois = DCNKIT_INDEX(kRoIAlignInputs, "rois");

// DeformRoIPool
constexpr int kDrOutputSize = DCNKIT_INDEX(kDeformRoIPoolAttrs, "output_size");
constexpr int kDrScale = DCNKIT_INDEX(kDeformRoIPoolAttrs, "spatial_scale");
constexpr int kDrSampling = DCNKIT_INDEX(kDeformRoIPoolAttrs, "sampling_ratio");
constexpr int kDrGamma = DCNKIT_INDEX(kDeformRoIPoolAttrs, "gamma");
constexpr int kDrInput = DCNKIT_INDEX(kDeformRoIPoolInputs, "input");
constexpr int kDrRois = DCNKIT_INDEX(kDeformRoIPoolInputs, "rois");
constexpr int kDrOffset = DCNKIT_INDEX(kDeformRoIPoolInputs, "offset");

// DeformPSRoIPool
constexpr int kPsScale = DCNKIT_INDEX(kDeformPSRoIPoolAttrs, "spatial_scale");
constexpr int kPsOutputSize = DCNKIT_INDEX(kDeformPSRoIPoolAttrs, "output_size");
constexpr int kPsOutputDim = DCNKIT_INDEX(kDeformPSRoIPoolAttrs, "output_dim");
constexpr int kPsGroupSize = DCNKIT_INDEX(kDeformPSRoIPoolAttrs, "group_size");
constexpr int kPsPartSize = DCNKIT_INDEX(kDeformPSRoIPoolAttrs, "part_size");
constexpr int kPsSamplePerPart = DCNKIT_INDEX(kDeformPSRoIPoolAttrs, "sample_per_part");
constexpr int kPsTransStd = DCNKIT_INDEX(kDeformPSRoIPoolAttrs, "trans_std");
constexpr int kPsNoTrans = DCNKIT_INDEX(kDeformPSRoIPoolAttrs, "no_trans");
constexpr int kPsInput = DCNKIT_INDEX(kDeformPSRoIPoolInputs, "input");
constexpr int kPsRois = DCNKIT_INDEX(kDeformPSRoIPoolInputs, "rois");
constexpr int kPsTrans = DCNKIT_INDEX(kDeformPSRoIPoolInputs, "trans");

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

// The run's core params from the node's attributes and the shapes of its inputs `in` (canonical order),
// checked by the core: one overload per op kind, shared by the CPU and CUDA paths.
Status make_params(const Kernel& k, const TensorView* in, DeformConv2dParams* p);
Status make_params(const Kernel& k, const TensorView* in, RoIAlignParams* p);
Status make_params(const Kernel& k, const TensorView* in, DeformRoIPoolParams* p);
Status make_params(const Kernel& k, const TensorView* in, DeformPSRoIPoolParams* p);

// Output `index` with `shape`; *data is null when ONNX Runtime gives no tensor.
Status output_tensor(OrtKernelContext* ctx, size_t index, const Shape& shape, void** data);
// Output `index` when the node has that many outputs (else *data = nullptr).
Status optional_output(OrtKernelContext* ctx, size_t index, const Shape& shape, void** data);

// make_params, then output 0 allocated to the params' output shape.
template <typename Params>
Status prepare_run(const Kernel& k, const TensorView* in, OrtKernelContext* ctx, Params* p, void** y) {
  DCNKIT_RETURN_IF_ERROR(make_params(k, in, p));
  return output_tensor(ctx, 0, p->output_shape(), y);
}

Status compute_cpu(Kernel& k, OrtKernelContext* ctx);

#ifdef DCNKIT_ORT_CUDA
Status compute_cuda(Kernel& k, OrtKernelContext* ctx);
void destroy_cuda_state(CudaState* s);
#endif

}  // namespace dcnkit::ort
