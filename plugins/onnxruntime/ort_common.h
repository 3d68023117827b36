// ONNX Runtime front end: the pieces every kernel shares. The library is built against the C API
// headers only (ORT_API_VERSION 21) and gets the API table from OrtApiBase in RegisterCustomOps, so it
// loads in any ONNX Runtime at least that new. No exceptions cross the C boundary: every callback
// returns an OrtStatus*.
#pragma once

#include <onnxruntime_c_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dcnkit/common.h"
#include "dcnkit/context.h"
#include "dcnkit/op_attrs.h"
#include "dcnkit/op_defs.h"
#include "dcnkit/openblas_gemm.h"

namespace dcnkit::ort {

// The API table handed to RegisterCustomOps.
const OrtApi& api();
void set_api(const OrtApi* api);

// Status <-> OrtStatus*. `prefix` names the node ("DeformConv2d node 'conv1': ").
OrtStatus* to_ort(const Status& s, const std::string& prefix = "");
// Converts (and releases) an OrtStatus* returned by an API call.
Status from_ort(OrtStatus* s, const std::string& what);

// ---------------------------------------------------------------------------------------------
// Attributes (variants, names, kinds and defaults live in the core: dcnkit/op_attrs.h)

// Reads every canonical attribute of `variant` from the node (defaults from the OpDef where absent).
// Errors name the attribute as written in the model.
Status read_attrs(const OrtKernelInfo* info, const OpVariant& variant, std::vector<AttrValue>* out);

// The node's name ("" when ONNX Runtime gives none).
std::string node_name(const OrtKernelInfo* info);

// ---------------------------------------------------------------------------------------------
// Tensors

struct TensorView {
  const OrtValue* value = nullptr;  // null: absent
  Shape shape;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  const void* data = nullptr;
  bool present() const { return value != nullptr; }
};

Status tensor_view(const OrtValue* v, TensorView* t);
const char* onnx_type_name(ONNXTensorElementDataType t);

// ---------------------------------------------------------------------------------------------
// CPU execution context over ONNX Runtime's intra-op thread pool and OpenBLAS.

struct CpuRun {
  const OrtKernelContext* context = nullptr;
  int chunks_per_thread = 4;
};

// num_threads, parallel_for (KernelContext_ParallelFor) and gemm (OpenBLAS, single-threaded).
CpuContext cpu_context(CpuRun* run);
int cpu_task_count();

// Scratch memory from the kernel context's allocator for `mem_info`; freed by the destructor.
class Workspace {
 public:
  Workspace() = default;
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  Status allocate(const OrtKernelContext* ctx, const OrtMemoryInfo* mem_info, size_t bytes);
  void* data() const { return data_; }

 private:
  OrtAllocator* allocator_ = nullptr;
  void* data_ = nullptr;
};

}  // namespace dcnkit::ort
