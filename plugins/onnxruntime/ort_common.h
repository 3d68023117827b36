// ONNX Runtime front end: the pieces every kernel shares. The library is built against the C API
// headers only (no link to libonnxruntime) and asks OrtApiBase in RegisterCustomOps for the lowest C API
// version whose entries it uses: 16 (ONNX Runtime 1.16.0, the floor). Newer entries (17: the intra-op
// thread pool, 18: stream-ordered scratch memory) are used only where the running ONNX Runtime has them, and
// each OrtCustomOp's `version` says which of its fields are filled (custom_op_version()). The build against
// the floor's API (tests/test_ort_api_floor.py) compiles these sources with ORT_API_VERSION 16, where the
// newer entries are left out. No exceptions cross the C boundary: every callback returns an OrtStatus*.
#pragma once

#include <onnxruntime_c_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dcnkit/common.h"
#include "dcnkit/context.h"
#include "dcnkit/op_attrs.h"
#include "dcnkit/op_defs.h"
#include "dcnkit/cpu_gemm.h"

namespace dcnkit::ort {

// The C API: the floor (ONNX Runtime 1.16.0) and the newest version whose entries the library uses.
constexpr uint32_t kApiFloor = 16;
constexpr uint32_t kApiNewestUsed = ORT_API_VERSION < 18 ? ORT_API_VERSION : 18;
// ONNX Runtime's own DeformConv kernel (CPU and CUDA EP) exists from 1.26.
constexpr int kBuiltinDeformConvMinor = 26;

// Called by RegisterCustomOps: reads the running ONNX Runtime's version and asks it for the API table of
// min(its C API version, kApiNewestUsed). An older runtime than the floor gets one line naming the floor and
// the version found (an error status); nothing else fails.
OrtStatus* negotiate_api(const OrtApiBase* base);
// The table and its version, as negotiated (api_version() >= 17: KernelContext_ParallelFor, >= 18:
// KernelContext_GetScratchBuffer and KernelInfoGetAllocator).
const OrtApi& api();
uint32_t api_version();
// The `version` of every OrtCustomOp the library registers: the fields it fills go up to GetStartVersion /
// GetEndVersion (C API 17), and ONNX Runtime refuses an op of a newer version than its own.
uint32_t custom_op_version();
// Whether the running ONNX Runtime has its own ONNX-domain DeformConv kernel (decided from its version string).
bool runtime_has_deform_conv();
// The parts of an ONNX Runtime version string "1.16.3" (false when it is not of that form).
bool parse_runtime_version(const char* s, int* major, int* minor);

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
