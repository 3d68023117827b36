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
#include "dcnkit/op_defs.h"

namespace dcnkit::ort {

// The API table handed to RegisterCustomOps.
const OrtApi& api();
void set_api(const OrtApi* api);

// Status <-> OrtStatus*. `prefix` names the node ("DeformConv2d node 'conv1': ").
OrtStatus* to_ort(const Status& s, const std::string& prefix = "");
// Converts (and releases) an OrtStatus* returned by an API call.
Status from_ort(OrtStatus* s, const std::string& what);

// ---------------------------------------------------------------------------------------------
// Operator variants: the kit's own ops (domain "dcnkit", names and defaults from op_defs.h) and the
// names mmdeploy / mmcv 1.x export, mapped onto the same kernels.

enum class OpKind : int { kDeformConv2d = 0, kRoIAlign = 1, kDeformRoIPool = 2, kDeformPSRoIPool = 3 };

// An attribute of a variant: its name in the model, the canonical attribute (AttrDef name) it sets,
// and which element of a canonical `ints` attribute (-1: the whole value).
struct AttrAlias {
  const char* onnx_name;
  const char* canonical;
  int element;
};

// One node input of a variant: the canonical input (TensorDef index) it carries, and whether the
// variant declares it optional.
struct InputSlot {
  int canonical;
  bool optional;
};

struct OpVariant {
  const char* domain;
  const char* op_type;
  OpKind kind;
  std::vector<InputSlot> inputs;
  std::vector<AttrAlias> aliases;   // empty: the canonical names and kinds of the OpDef
  bool empty_input_is_absent;       // mmcv convention: a 0-element optional input means "none"
  bool loose_attrs;                 // accept int for ints (broadcast), 1-element ints, float-valued ints,
                                    // and 4-element symmetric paddings (mmdeploy DeformConv2d)
};

// All variants the library registers (the kit's four ops first).
const std::vector<OpVariant>& op_variants();
const OpDef& op_def(OpKind kind);

// A canonical attribute value: ints (also for kInt, one element), float or string.
struct AttrValue {
  std::vector<int64_t> ints;
  double f = 0.0;
  std::string s;
};

// Reads every canonical attribute of `variant` from the node (defaults from the OpDef where absent).
// Errors name the attribute as written in the model.
Status read_attrs(const OrtKernelInfo* info, const OpVariant& variant, std::vector<AttrValue>* out);

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
Status openblas_gemm(void* self, const GemmArgs& g);

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
