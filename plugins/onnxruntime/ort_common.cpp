#include "ort_common.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace dcnkit::ort {

namespace {
const OrtApi* g_api = nullptr;
uint32_t g_api_version = 0;
bool g_builtin_deform_conv = false;
}  // namespace

const OrtApi& api() { return *g_api; }
uint32_t api_version() { return g_api_version; }
uint32_t custom_op_version() { return std::min<uint32_t>(g_api_version, ORT_API_VERSION < 17 ? ORT_API_VERSION : 17); }
bool runtime_has_deform_conv() { return g_builtin_deform_conv; }

bool parse_runtime_version(const char* s, int* major, int* minor) {
  if (s == nullptr) return false;
  char* end = nullptr;
  const long ma = std::strtol(s, &end, 10);
  if (end == s || *end != '.') return false;
  const char* m = end + 1;
  const long mi = std::strtol(m, &end, 10);
  if (end == m || ma < 0 || mi < 0 || ma > 1000 || mi > 100000) return false;
  *major = static_cast<int>(ma);
  *minor = static_cast<int>(mi);
  return true;
}

OrtStatus* negotiate_api(const OrtApiBase* base) {
  const char* version = base->GetVersionString != nullptr ? base->GetVersionString() : nullptr;
  int major = 0, minor = 0;
  const bool parsed = parse_runtime_version(version, &major, &minor);
  if (parsed && major == 1 && minor < static_cast<int>(kApiFloor)) {
    const OrtApi* v1 = base->GetApi(1);  // every ONNX Runtime has API 1 (CreateStatus)
    const std::string msg = std::string("dcnkit: this custom-op library needs ONNX Runtime >= 1.") +
                            std::to_string(kApiFloor) + ".0; found ONNX Runtime " + version;
    return v1 != nullptr ? v1->CreateStatus(ORT_FAIL, msg.c_str()) : nullptr;
  }
  // ONNX Runtime 1.x provides C API versions 1..x. A version string of another form: the floor.
  const uint32_t want = (parsed && major == 1) ? std::min<uint32_t>(static_cast<uint32_t>(minor), kApiNewestUsed)
                                               : (parsed && major > 1 ? kApiNewestUsed : kApiFloor);
  const OrtApi* a = base->GetApi(want);
  if (a == nullptr) {
    const OrtApi* v1 = base->GetApi(1);
    const std::string msg = std::string("dcnkit: this custom-op library needs ONNX Runtime >= 1.") +
                            std::to_string(kApiFloor) + ".0 (C API " + std::to_string(want) + "); found ONNX Runtime " +
                            (version ? version : "of unknown version");
    return v1 != nullptr ? v1->CreateStatus(ORT_FAIL, msg.c_str()) : nullptr;
  }
  g_api = a;
  g_api_version = want;
  g_builtin_deform_conv = parsed && (major > 1 || minor >= kBuiltinDeformConvMinor);
  return nullptr;
}

OrtStatus* to_ort(const Status& s, const std::string& prefix) {
  if (s.ok()) return nullptr;
  const OrtErrorCode code = s.code() == StatusCode::kInvalidArgument ? ORT_INVALID_ARGUMENT : ORT_FAIL;
  return api().CreateStatus(code, (prefix + s.message()).c_str());
}

Status from_ort(OrtStatus* s, const std::string& what) {
  if (s == nullptr) return Status::Ok();
  std::string msg = what + ": " + api().GetErrorMessage(s);
  const OrtErrorCode code = api().GetErrorCode(s);
  api().ReleaseStatus(s);
  return code == ORT_INVALID_ARGUMENT ? Status::Invalid(msg) : Status::Internal(msg);
}

// ---------------------------------------------------------------------------------------------
// Attributes: what a node holds, read through the typed KernelInfo getters

namespace {

bool status_ok(OrtStatus* st, std::string* msg = nullptr) {
  if (st == nullptr) return true;
  if (msg) *msg = api().GetErrorMessage(st);
  api().ReleaseStatus(st);
  return false;
}

RawAttr read_raw(const OrtKernelInfo* info, const char* name) {
  RawAttr r;
  const OrtApi& a = api();
  std::string missing_msg;
  if (status_ok(a.KernelInfoGetAttribute_int64(info, name, &r.i), &missing_msg)) {
    r.type = RawAttr::kInt;
    return r;
  }
  float f = 0;
  if (status_ok(a.KernelInfoGetAttribute_float(info, name, &f))) {
    r.type = RawAttr::kFloat;
    r.f = f;
    return r;
  }
  size_t n = 0;
  if (status_ok(a.KernelInfoGetAttribute_string(info, name, nullptr, &n))) {
    std::string buf(n + 1, '\0');
    if (status_ok(a.KernelInfoGetAttribute_string(info, name, buf.data(), &n))) {
      buf.resize(std::strlen(buf.c_str()));
      r.type = RawAttr::kString;
      r.s = buf;
      return r;
    }
  }
  // The array getters report size 0 (and success) for attributes of other types: only a non-empty
  // array identifies the type.
  bool empty_array = false;
  // Reads the array into `values` with `get`; true when it holds elements.
  auto read_array = [&](auto get, auto& values) {
    size_t len = 0;
    if (!status_ok(get(info, name, nullptr, &len))) return false;
    if (len > 0) {
      values.resize(len);
      if (status_ok(get(info, name, values.data(), &len))) return true;
    }
    empty_array = true;
    return false;
  };
  if (read_array(a.KernelInfoGetAttributeArray_int64, r.ints)) {
    r.type = RawAttr::kInts;
    return r;
  }
  if (read_array(a.KernelInfoGetAttributeArray_float, r.floats)) {
    r.type = RawAttr::kFloats;
    return r;
  }
  if (empty_array && missing_msg.find("No attribute") == std::string::npos) {
    r.type = RawAttr::kInts;  // an empty list
    return r;
  }
  // ONNX Runtime says "No attribute with name:'x'is defined." when the node lacks it.
  r.type = (missing_msg.find("No attribute") != std::string::npos) ? RawAttr::kAbsent : RawAttr::kOther;
  return r;
}

}  // namespace

std::string node_name(const OrtKernelInfo* info) {
  size_t n = 0;
  OrtStatus* st = api().KernelInfo_GetNodeName(info, nullptr, &n);
  if (st != nullptr) {
    api().ReleaseStatus(st);
    return "";
  }
  std::string s(n + 1, '\0');
  st = api().KernelInfo_GetNodeName(info, s.data(), &n);
  if (st != nullptr) {
    api().ReleaseStatus(st);
    return "";
  }
  s.resize(std::strlen(s.c_str()));
  return s;
}

Status read_attrs(const OrtKernelInfo* info, const OpVariant& variant, std::vector<AttrValue>* out) {
  return ::dcnkit::read_attrs(variant, [info](const char* name) { return read_raw(info, name); }, out);
}

// ---------------------------------------------------------------------------------------------
// Tensors

const char* onnx_type_name(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "float64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "int32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return "int8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return "uint8";
    default: return "another element type";
  }
}

Status tensor_view(const OrtValue* v, TensorView* t) {
  *t = TensorView();
  if (v == nullptr) return Status::Ok();
  const OrtApi& a = api();
  OrtTensorTypeAndShapeInfo* info = nullptr;
  DCNKIT_RETURN_IF_ERROR(from_ort(a.GetTensorTypeAndShape(v, &info), "GetTensorTypeAndShape"));
  size_t rank = 0;
  Status s = from_ort(a.GetDimensionsCount(info, &rank), "GetDimensionsCount");
  if (s.ok()) {
    t->shape.resize(rank);
    s = from_ort(a.GetDimensions(info, t->shape.data(), rank), "GetDimensions");
  }
  if (s.ok()) s = from_ort(a.GetTensorElementType(info, &t->type), "GetTensorElementType");
  a.ReleaseTensorTypeAndShapeInfo(info);
  DCNKIT_RETURN_IF_ERROR(s);
  void* data = nullptr;
  DCNKIT_RETURN_IF_ERROR(from_ort(a.GetTensorMutableData(const_cast<OrtValue*>(v), &data), "GetTensorData"));
  t->value = v;
  t->data = data;
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// CPU context

namespace {

struct ChunkJob {
  int64_t n;
  int64_t chunks;
  void (*body)(void*, int64_t, int64_t);
  void* body_ctx;
};

void run_chunk(void* p, size_t i) {
  const auto* j = static_cast<const ChunkJob*>(p);
  const int64_t b = j->n * static_cast<int64_t>(i) / j->chunks;
  const int64_t e = j->n * (static_cast<int64_t>(i) + 1) / j->chunks;
  if (e > b) j->body(j->body_ctx, b, e);
}

void ort_parallel_for(void* self, int64_t n, void (*body)(void*, int64_t, int64_t), void* body_ctx) {
  if (n <= 0) return;
  auto* run = static_cast<CpuRun*>(self);
  const int64_t max_chunks = static_cast<int64_t>(cpu_task_count()) * run->chunks_per_thread;
  ChunkJob job{n, std::min<int64_t>(n, std::max<int64_t>(max_chunks, 1)), body, body_ctx};
#if ORT_API_VERSION >= 17
  // ONNX Runtime's intra-op pool (C API 17); ONNX Runtime 1.16 gives custom ops none: this thread does the work.
  if (job.chunks > 1 && run->context != nullptr && api_version() >= 17) {
    OrtStatus* st = api().KernelContext_ParallelFor(run->context, &run_chunk,
                                                    static_cast<size_t>(job.chunks), 0, &job);
    if (st == nullptr) return;
    api().ReleaseStatus(st);  // no thread pool available: run on this thread
  }
#endif
  body(body_ctx, 0, n);
}

}  // namespace

int cpu_task_count() {
  static const int n = [] {
    const unsigned hc = std::thread::hardware_concurrency();
    return static_cast<int>(std::clamp<unsigned>(hc == 0 ? 1u : hc, 1u, 256u));
  }();
  return n;
}

CpuContext cpu_context(CpuRun* run) {
  CpuContext ctx;
  ctx.num_threads = api_version() >= 17 ? cpu_task_count() : 1;  // no thread pool before C API 17 (ort_parallel_for)
  ctx.parallel_for = &ort_parallel_for;
  ctx.parallel_self = run;
  ctx.gemm = &cpu_gemm;
  ctx.gemm_self = nullptr;
  // Without a packed operand, OpenBLAS sgemm, which reaches full speed only on wide right-hand sides (measured on
  // the DCNv2 benchmark, N4 C256 32x32: tiles of 48 columns ran 10-20% slower than ONNX Runtime's own DeformConv,
  // tiles of 512-2048 columns 6-20% faster); compute_cpu narrows it for a node with a packed weight.
  ctx.gemm_min_n = cpu_gemm_min_n(false);
  return ctx;
}

// ---------------------------------------------------------------------------------------------
// Workspace

Workspace::~Workspace() {
  if (allocator_ != nullptr && data_ != nullptr) {
    OrtStatus* st = api().AllocatorFree(allocator_, data_);
    if (st) api().ReleaseStatus(st);
  }
  if (allocator_ != nullptr) api().ReleaseAllocator(allocator_);
}

Status Workspace::allocate(const OrtKernelContext* ctx, const OrtMemoryInfo* mem_info, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  DCNKIT_RETURN_IF_ERROR(
      from_ort(api().KernelContext_GetAllocator(ctx, mem_info, &allocator_), "KernelContext_GetAllocator"));
  DCNKIT_RETURN_IF_ERROR(from_ort(api().AllocatorAlloc(allocator_, bytes, &data_),
                                  "workspace allocation of " + std::to_string(bytes) + " bytes"));
  return Status::Ok();
}

}  // namespace dcnkit::ort
