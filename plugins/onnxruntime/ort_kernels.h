// The kernel state shared by the CPU and CUDA paths: one per graph node.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dcnkit/dcnv3.h"
#include "dcnkit/deform_conv2d.h"
#include "dcnkit/deform_psroi_pool.h"
#include "dcnkit/deform_roi_pool.h"
#include "dcnkit/msda.h"
#include "dcnkit/multi_level_roi_align.h"
#include "dcnkit/roi_align.h"
#include "ort_common.h"

namespace dcnkit::ort {

// Attribute and input indices (kDcStride, kRaRois, ...) and kMaxInputs come from dcnkit/op_attrs.h.

struct CudaState;  // ort_cuda.cpp: cuBLAS handle of an op with a GEMM (CUDA library only)

struct Kernel {
  const OpVariant* variant = nullptr;
  std::string prefix;  // "<domain>::<op_type> node '<name>': "
  ONNXTensorElementDataType dtype = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  bool cuda = false;
  OpAttrs attrs;  // checked once, at kernel creation
  CudaState* cuda_state = nullptr;
  // DeformConv2d on the CPU with a constant weight (an initializer): the weight reordered once for the
  // launcher (deform_conv2d_weight_kc_cpu), and the shape it had; empty otherwise.
  std::vector<float> weight_kc;
  Shape weight_kc_shape;
  Shape kernel_shape;  // ONNX DeformConv's kernel_shape attribute (empty when absent): must match W's (kh, kw)
  std::mutex mutex;  // serialises CUDA runs on this node's cuBLAS handle
};

// The node's inputs in canonical order (absent ones have value == nullptr).
Status gather_inputs(const Kernel& k, const OrtKernelContext* ctx, TensorView* inputs, size_t max_inputs);

// MultiLevelRoIAlign's inputs: rois, then every tensor of the variadic input (the L feature maps), each of
// the node's element type.
Status gather_multi_level_inputs(const Kernel& k, const OrtKernelContext* ctx, TensorView* rois,
                                 std::vector<TensorView>* features);
// Its params (checked by the core) and output 0 allocated to their output shape.
Status prepare_multi_level_run(const Kernel& k, const TensorView& rois, const std::vector<TensorView>& features,
                               OrtKernelContext* ctx, MultiLevelRoIAlignParams* p, void** y);

// The run's core params from the node's attributes and the shapes of its inputs `in` (canonical order),
// checked by the core: one overload per op kind, shared by the CPU and CUDA paths.
Status make_params(const Kernel& k, const TensorView* in, DeformConv2dParams* p);
Status make_params(const Kernel& k, const TensorView* in, RoIAlignParams* p);
Status make_params(const Kernel& k, const TensorView* in, DeformRoIPoolParams* p);
Status make_params(const Kernel& k, const TensorView* in, DeformPSRoIPoolParams* p);
Status make_params(const Kernel& k, const TensorView* in, MsdaParams* p);
Status make_params(const Kernel& k, const TensorView* in, Dcnv3Params* p);  // DCNv3 and DCNv4

// Output `index` with `shape`; *data is null when ONNX Runtime gives no tensor.
Status output_tensor(OrtKernelContext* ctx, size_t index, const Shape& shape, void** data);
// Output `index` when the node has that many outputs (else *data = nullptr).
Status optional_output(OrtKernelContext* ctx, size_t index, const Shape& shape, void** data);

// The node's output shape: the params', or (MultiscaleDeformableAttnPlugin_TRT) split per head.
template <typename Params>
Shape node_output_shape(const Kernel&, const Params& p) {
  return p.output_shape();
}
inline Shape node_output_shape(const Kernel& k, const MsdaParams& p) {
  return k.variant->per_head_output ? p.per_head_output_shape() : p.output_shape();
}

// make_params, then output 0 allocated to the node's output shape.
template <typename Params>
Status prepare_run(const Kernel& k, const TensorView* in, OrtKernelContext* ctx, Params* p, void** y) {
  DCNKIT_RETURN_IF_ERROR(make_params(k, in, p));
  return output_tensor(ctx, 0, node_output_shape(k, *p), y);
}

Status compute_cpu(Kernel& k, OrtKernelContext* ctx);

#ifdef DCNKIT_ORT_CUDA
Status compute_cuda(Kernel& k, OrtKernelContext* ctx);
// At kernel creation: the node's cuBLAS handle when its op runs a GEMM (else nothing); on failure none, and
// Compute makes it.
void create_cuda_state(Kernel& k, const OrtKernelInfo* info);
void destroy_cuda_state(CudaState* s);
#endif

}  // namespace dcnkit::ort
