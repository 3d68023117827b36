// The kernel state shared by the CPU and CUDA paths: one per graph node, for any op of the table.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ort_common.h"

namespace dcnkit::ort {

struct CudaState;  // ort_cuda.cpp: cuBLAS handle of an op with a GEMM (CUDA library only)

struct Kernel {
  const OpVariant* variant = nullptr;
  std::string prefix;  // "<domain>::<op_type> node '<name>': "
  ONNXTensorElementDataType dtype = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  bool cuda = false;
  OpAttrs attrs;  // checked once, at kernel creation
  CudaState* cuda_state = nullptr;
  // CPU: constant inputs (initializers) in the launcher's layout (OpEntry::pack), made once at kernel creation,
  // and the shape each had; empty otherwise.
  std::vector<char> packed[kMaxInputs];
  Shape packed_shape[kMaxInputs];
  // Those packed once more by the CPU GEMM (OpEntry::gemm_operand, cpu_gemm_pack); null where it does not pack.
  std::shared_ptr<const void> gemm_packed[kMaxInputs];
  Shape kernel_shape;  // the variant's kernel_shape attribute (OpVariant::kernel_shape_of; empty when absent)
  std::mutex mutex;  // serialises CUDA runs on this node's cuBLAS handle
};

const OpDecl& op_of(const Kernel& k);

// The node's inputs in canonical order (absent ones have value == nullptr; a variadic input's tensors in `variadic`,
// the first also at its canonical index), each checked for its element type.
struct NodeInputs {
  TensorView in[kMaxInputs];
  std::vector<TensorView> variadic;
};
Status gather_inputs(const Kernel& k, const OrtKernelContext* ctx, NodeInputs* in);

// A run's call (op, attributes, shapes) and its output shapes, checked by the op's declaration.
struct Run {
  NodeInputs inputs;
  OpCall call;
  Shape outputs[kMaxOutputs];
  OpBuffers buffers;
  OpTypes types;
  bool empty = false;  // every output has 0 elements: nothing to launch
};
Status prepare_run(const Kernel& k, OrtKernelContext* ctx, Run* r);

// Output `index` with `shape`; *data is null when ONNX Runtime gives no tensor.
Status output_tensor(OrtKernelContext* ctx, size_t index, const Shape& shape, void** data);
// Bytes of the outputs the node does not have (the launchers write every output): scratch the caller provides.
size_t missing_output_bytes(const Run& r, DType dtype);
// Points the missing outputs of `r` into `scratch` (missing_output_bytes long); returns the bytes used.
size_t place_missing_outputs(Run* r, DType dtype, void* scratch);

Status compute_cpu(Kernel& k, OrtKernelContext* ctx);

#ifdef DCNKIT_ORT_CUDA
Status compute_cuda(Kernel& k, OrtKernelContext* ctx);
// At kernel creation: the node's cuBLAS handle when its op runs a GEMM (else nothing); on failure none, and
// Compute makes it.
void create_cuda_state(Kernel& k, const OrtKernelInfo* info);
void destroy_cuda_state(CudaState* s);
#endif

}  // namespace dcnkit::ort
