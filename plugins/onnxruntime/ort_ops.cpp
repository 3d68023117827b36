// The operators as ONNX Runtime custom ops: every op of the table (domain "dcnkit") and every other name its
// declaration lists (mmdeploy, mmcv 1.x, ...). Attributes are read and checked once per node (errors at session
// creation), shapes are checked by the op's declaration on every run, and the kernels are its entry points. No op is
// named here.
#include <climits>
#include <cstring>

#include "ort_kernels.h"
#include "ort_qdeform_conv.h"

namespace dcnkit::ort {

const OpDecl& op_of(const Kernel& k) { return *k.variant->op; }

Status gather_inputs(const Kernel& k, const OrtKernelContext* ctx, NodeInputs* in) {
  *in = NodeInputs();
  size_t count = 0;
  DCNKIT_RETURN_IF_ERROR(from_ort(api().KernelContext_GetInputCount(ctx, &count), "KernelContext_GetInputCount"));
  const auto& slots = k.variant->inputs;
  const OpDef& def = op_of(k).def;
  const bool variadic = has_variadic_input(*k.variant);
  for (size_t i = 0; i < count && (variadic || i < slots.size()); ++i) {
    const InputSlot& slot = slots[i < slots.size() ? i : slots.size() - 1];
    const OrtValue* v = nullptr;
    DCNKIT_RETURN_IF_ERROR(from_ort(api().KernelContext_GetInput(ctx, i, &v), "KernelContext_GetInput"));
    TensorView t;
    DCNKIT_RETURN_IF_ERROR(tensor_view(v, &t));
    const TensorDef& td = def.inputs[slot.canonical];
    const std::string name = slot.variadic ? std::string(td.name) + "[" + std::to_string(in->variadic.size()) + "]"
                                           : std::string(td.name);
    if (slot.variadic && !t.present()) return arg_error(k.variant->op_type, name, "a tensor", "no input");
    if (!t.present()) continue;
    const ONNXTensorElementDataType want = td.int64 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 : k.dtype;
    if (t.type != want) {
      return arg_error(k.variant->op_type, name,
                       std::string("element type ") + onnx_type_name(want) +
                           (td.int64 ? " (an index tensor)" : " (the type of input)"),
                       onnx_type_name(t.type));
    }
    if (slot.variadic) {
      in->variadic.push_back(t);
      if (in->in[slot.canonical].present()) continue;
    } else if (k.variant->empty_input_is_absent && slot.optional) {
      int64_t numel = 1;
      for (int64_t d : t.shape) numel *= d;
      if (numel == 0) continue;
    }
    in->in[slot.canonical] = t;
  }
  for (const InputSlot& slot : slots) {
    if (!slot.optional && !in->in[slot.canonical].present()) {
      return arg_error(k.variant->op_type, def.inputs[slot.canonical].name, "a tensor", "no input");
    }
  }
  return Status::Ok();
}

Status output_tensor(OrtKernelContext* ctx, size_t index, const Shape& shape, void** data) {
  OrtValue* out = nullptr;
  DCNKIT_RETURN_IF_ERROR(
      from_ort(api().KernelContext_GetOutput(ctx, index, shape.data(), shape.size(), &out), "KernelContext_GetOutput"));
  *data = nullptr;
  if (out == nullptr) return Status::Ok();
  return from_ort(api().GetTensorMutableData(out, data), "GetTensorMutableData");
}

namespace {

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

}  // namespace

// The variant's kernel_shape attribute (if any) against the last two dims of its input (OpVariant::kernel_shape_of).
Status check_kernel_shape(const Kernel& k, const NodeInputs& in) {
  const int i = k.variant->kernel_shape_of;
  if (i < 0 || k.kernel_shape.empty() || !in.in[i].present() || in.in[i].shape.size() < 2) return Status::Ok();
  const Shape& w = in.in[i].shape;
  const Shape want = {w[w.size() - 2], w[w.size() - 1]};
  if (k.kernel_shape == want) return Status::Ok();
  return arg_error(k.variant->op_type, "attribute kernel_shape",
                   std::string("the kernel size of ") + op_of(k).def.inputs[i].name + " " + shape_str(want),
                   shape_str(k.kernel_shape));
}

Status prepare_run(const Kernel& k, OrtKernelContext* ctx, Run* r) {
  DCNKIT_RETURN_IF_ERROR(gather_inputs(k, ctx, &r->inputs));
  DCNKIT_RETURN_IF_ERROR(check_kernel_shape(k, r->inputs));
  OpShapes shapes;
  for (size_t i = 0; i < kMaxInputs; ++i) {
    const TensorView& t = r->inputs.in[i];
    shapes.in[i] = t.present() ? &t.shape : nullptr;
    r->buffers.in[i] = t.present() ? t.data : nullptr;
  }
  for (const TensorView& t : r->inputs.variadic) {
    shapes.variadic.push_back(t.shape);
    r->buffers.variadic.push_back(t.data);
  }
  r->call = op_call(k.attrs, shapes);
  const OpDef& def = op_of(k).def;
  DCNKIT_RETURN_IF_ERROR(op_of(k).entry.outputs(r->call, r->outputs));
  // The pointers of r->call.shapes point into r->inputs, which lives as long as r.
  size_t count = 0;
  DCNKIT_RETURN_IF_ERROR(from_ort(api().KernelContext_GetOutputCount(ctx, &count), "GetOutputCount"));
  r->empty = true;
  for (size_t o = 0; o < def.num_outputs; ++o) {
    r->empty = r->empty && numel(r->outputs[o]) == 0;
    if (o < count) DCNKIT_RETURN_IF_ERROR(output_tensor(ctx, o, r->outputs[o], &r->buffers.out[o]));
  }
  r->types.dtype = k.dtype == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ? DType::kFloat16 : DType::kFloat32;
  r->types.rois = r->types.dtype;
  return Status::Ok();
}

size_t missing_output_bytes(const Run& r, DType dtype) {
  size_t bytes = 0;
  for (size_t o = 0; o < kMaxOutputs; ++o) {
    if (r.buffers.out[o] == nullptr && !r.outputs[o].empty()) {
      bytes += align_up(static_cast<size_t>(numel(r.outputs[o])) * dtype_size(dtype));
    }
  }
  return bytes;
}

size_t place_missing_outputs(Run* r, DType dtype, void* scratch) {
  size_t used = 0;
  for (size_t o = 0; o < kMaxOutputs; ++o) {
    if (r->buffers.out[o] == nullptr && !r->outputs[o].empty()) {
      r->buffers.out[o] = static_cast<char*>(scratch) + used;
      used += align_up(static_cast<size_t>(numel(r->outputs[o])) * dtype_size(dtype));
    }
  }
  return used;
}

// ---------------------------------------------------------------------------------------------
// CPU compute

Status compute_cpu(Kernel& k, OrtKernelContext* ctx) {
  Run r;
  DCNKIT_RETURN_IF_ERROR(prepare_run(k, ctx, &r));
  if (r.empty) return Status::Ok();
  CpuRun run;
  run.context = ctx;
  CpuContext cpu = cpu_context(&run);
  OpDevice dev;
  dev.cpu = &cpu;
  for (size_t i = 0; i < kMaxInputs; ++i) {
    if (!k.packed[i].empty() && r.inputs.in[i].present() && r.inputs.in[i].shape == k.packed_shape[i]) {
      r.buffers.packed[i] = k.packed[i].data();
      r.buffers.gemm_packed[i] = k.gemm_packed[i].get();
      if (k.gemm_packed[i]) cpu.gemm_min_n = cpu_gemm_min_n(true);
    }
  }
  const OpEntry& e = op_of(k).entry;
  const size_t ws = e.workspace ? e.workspace(r.call, Pass::kForward, r.types, dev) : 0;
  const size_t missing = missing_output_bytes(r, r.types.dtype);
  OrtMemoryInfo* mem = nullptr;
  DCNKIT_RETURN_IF_ERROR(
      from_ort(api().CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &mem), "CreateCpuMemoryInfo"));
  std::unique_ptr<OrtMemoryInfo, void (*)(OrtMemoryInfo*)> mem_guard(mem, [](OrtMemoryInfo* m) {
    api().ReleaseMemoryInfo(m);
  });
  Workspace scratch;
  DCNKIT_RETURN_IF_ERROR(scratch.allocate(ctx, mem, align_up(ws) + missing));
  r.buffers.workspace = ws > 0 ? scratch.data() : nullptr;
  if (missing > 0) place_missing_outputs(&r, r.types.dtype, static_cast<char*>(scratch.data()) + align_up(ws));
  return e.forward_cpu(r.call, r.types, r.buffers, dev);
}

// ---------------------------------------------------------------------------------------------
// OrtCustomOp

namespace {

constexpr const char* kCudaProvider = "CUDAExecutionProvider";

struct CustomOp : OrtCustomOp {
  const OpVariant* variant = nullptr;
  bool cuda = false;
  ONNXTensorElementDataType dtype = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
};

const CustomOp& self(const OrtCustomOp* op) { return *static_cast<const CustomOp*>(op); }

// A CPU node's constant inputs (initializers) in the launcher's layout, once, where the op has one (OpEntry::pack:
// DeformConv2d's weight), and packed for the CPU GEMM where that is its GEMM operand (OpEntry::gemm_operand).
// KernelInfoGetConstantInput_tensor is C API 15, below the floor: every supported release has it. Nothing when an
// input is a graph input or of another type or shape (the checks of each run report that; the launcher then
// reorders it, and the GEMM packs it, on every run).
void pack_constant_inputs(const OrtKernelInfo* info, Kernel* k) {
  const OpEntry& e = op_of(*k).entry;
  if (e.pack == nullptr) return;
  const auto& slots = k->variant->inputs;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].variadic) continue;
    int is_constant = 0;
    const OrtValue* v = nullptr;
    OrtStatus* st = api().KernelInfoGetConstantInput_tensor(info, i, &is_constant, &v);
    if (st != nullptr) {
      api().ReleaseStatus(st);
      continue;
    }
    TensorView t;
    if (!is_constant || v == nullptr || !tensor_view(v, &t).ok() || t.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT ||
        t.data == nullptr) {
      continue;
    }
    const int c = slots[i].canonical;
    OpShapes shapes;
    shapes.in[c] = &t.shape;
    OpCall call = op_call(k->attrs, shapes);
    const size_t bytes = e.pack(call, c, t.data, DType::kFloat32, nullptr);
    if (bytes == 0) continue;
    k->packed[c].resize(bytes);
    e.pack(call, c, t.data, DType::kFloat32, k->packed[c].data());
    k->packed_shape[c] = t.shape;
    GemmOperand a;
    if (e.gemm_operand && e.gemm_operand(call, c, k->packed[c].data(), &a)) k->gemm_packed[c] = cpu_gemm_pack(a);
  }
}

OrtStatusPtr ORT_API_CALL create_kernel(const OrtCustomOp* op, const OrtApi*, const OrtKernelInfo* info,
                                        void** kernel) {
  const CustomOp& o = self(op);
  auto k = std::make_unique<Kernel>();
  k->variant = o.variant;
  k->dtype = o.dtype;
  k->cuda = o.cuda;
  const std::string name = node_name(info);
  const std::string domain = o.variant->domain;  // "" for ONNX's own DeformConv
  k->prefix = (domain.empty() ? "" : domain + "::") + o.variant->op_type + " node '" + name + "': ";
  std::vector<AttrValue> values;
  Status s = read_attrs(info, *o.variant, &values);
  if (s.ok()) s = make_op_attrs(*o.variant, std::move(values), &k->attrs);
  if (!s.ok()) return to_ort(s, k->prefix);
  if (o.variant->kernel_shape_of >= 0) {  // kernel_shape: optional, checked against that input on every run
    size_t n = 0;
    const auto get = api().KernelInfoGetAttributeArray_int64;
    if (from_ort(get(info, "kernel_shape", nullptr, &n), "").ok() && n > 0) {
      k->kernel_shape.resize(n);
      if (!from_ort(get(info, "kernel_shape", k->kernel_shape.data(), &n), "").ok()) k->kernel_shape.clear();
    }
  }
  if (!o.cuda) pack_constant_inputs(info, k.get());
#ifdef DCNKIT_ORT_CUDA
  if (k->cuda) create_cuda_state(*k, info);
#endif
  *kernel = k.release();
  return nullptr;
}

OrtStatusPtr ORT_API_CALL kernel_compute(void* kernel, OrtKernelContext* ctx) {
  Kernel& k = *static_cast<Kernel*>(kernel);
  Status s;
  try {
#ifdef DCNKIT_ORT_CUDA
    s = k.cuda ? compute_cuda(k, ctx) : compute_cpu(k, ctx);
#else
    s = compute_cpu(k, ctx);
#endif
  } catch (const std::exception& e) {
    s = Status::Internal(std::string("unexpected error: ") + e.what());
  }
  return to_ort(s, k.prefix);
}

void ORT_API_CALL kernel_destroy(void* kernel) {
  auto* k = static_cast<Kernel*>(kernel);
#ifdef DCNKIT_ORT_CUDA
  if (k->cuda_state) destroy_cuda_state(k->cuda_state);
#endif
  delete k;
}

const char* ORT_API_CALL get_name(const OrtCustomOp* op) { return self(op).variant->op_type; }
const char* ORT_API_CALL get_ep(const OrtCustomOp* op) { return self(op).cuda ? kCudaProvider : nullptr; }
size_t ORT_API_CALL input_count(const OrtCustomOp* op) { return self(op).variant->inputs.size(); }
size_t ORT_API_CALL output_count_fn(const OrtCustomOp* op) { return self(op).variant->op->def.num_outputs; }
ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp* op, size_t i) {
  const CustomOp& o = self(op);
  const InputSlot& slot = o.variant->inputs[i];
  return o.variant->op->def.inputs[slot.canonical].int64 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 : o.dtype;
}
ONNXTensorElementDataType ORT_API_CALL output_type(const OrtCustomOp* op, size_t) { return self(op).dtype; }
OrtCustomOpInputOutputCharacteristic ORT_API_CALL input_char(const OrtCustomOp* op, size_t i) {
  const InputSlot& slot = self(op).variant->inputs[i];
  if (slot.variadic) return INPUT_OUTPUT_VARIADIC;  // the last input: one or more tensors
  return slot.optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}
OrtCustomOpInputOutputCharacteristic ORT_API_CALL output_char(const OrtCustomOp* op, size_t i) {
  return self(op).variant->op->def.outputs[i].optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}
OrtMemType ORT_API_CALL input_mem(const OrtCustomOp*, size_t) { return OrtMemTypeDefault; }
int ORT_API_CALL variadic_min(const OrtCustomOp*) { return 1; }
int ORT_API_CALL variadic_homog(const OrtCustomOp*) { return 1; }
// ONNX's DeformConv from its opset 19 (read by ONNX Runtime from C API 17; before, every op starts at 1).
int ORT_API_CALL start_version(const OrtCustomOp* op) { return self(op).variant->onnx_standard ? 19 : 1; }
int ORT_API_CALL end_version(const OrtCustomOp*) { return INT_MAX; }

CustomOp make_op(const OpVariant* v, bool cuda, ONNXTensorElementDataType dtype) {
  CustomOp op;
  std::memset(static_cast<OrtCustomOp*>(&op), 0, sizeof(OrtCustomOp));  // unused fields (newer ones too): null
  op.version = custom_op_version();
  op.CreateKernel = nullptr;
  op.GetName = &get_name;
  op.GetExecutionProviderType = &get_ep;
  op.GetInputType = &input_type;
  op.GetInputTypeCount = &input_count;
  op.GetOutputType = &output_type;
  op.GetOutputTypeCount = &output_count_fn;
  op.KernelCompute = nullptr;
  op.KernelDestroy = &kernel_destroy;
  op.GetInputCharacteristic = &input_char;
  op.GetOutputCharacteristic = &output_char;
  op.GetInputMemoryType = &input_mem;
  op.GetVariadicInputMinArity = &variadic_min;
  op.GetVariadicInputHomogeneity = &variadic_homog;
  op.GetVariadicOutputMinArity = &variadic_min;
  op.GetVariadicOutputHomogeneity = &variadic_homog;
  op.CreateKernelV2 = &create_kernel;
  op.KernelComputeV2 = &kernel_compute;
#if ORT_API_VERSION >= 17
  op.GetStartVersion = &start_version;
  op.GetEndVersion = &end_version;
#endif
  op.variant = v;
  op.cuda = cuda;
  op.dtype = dtype;
  return op;
}

// Every op the library registers, grouped by domain (CPU float32; CUDA float32 and float16).
struct Registry {
  std::vector<std::unique_ptr<CustomOp>> ops;
  Registry() {
    for (const OpVariant& v : op_variants()) {
      if (v.tensorrt_only) continue;
      ops.push_back(std::make_unique<CustomOp>(make_op(&v, false, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT)));
#ifdef DCNKIT_ORT_CUDA
      ops.push_back(std::make_unique<CustomOp>(make_op(&v, true, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT)));
      ops.push_back(std::make_unique<CustomOp>(make_op(&v, true, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16)));
#endif
    }
  }
};

const Registry& registry() {
  static const Registry r;
  return r;
}

// Whether this ONNX Runtime gets the variant: not TensorRT's own names, and ONNX's DeformConv only where ONNX Runtime
// has no kernel for it (before 1.26; from then on its kernel runs, and dcnkit.runtime.ort_session chooses per node).
bool registered_here(const OpVariant& v) { return !v.tensorrt_only && !(v.onnx_standard && runtime_has_deform_conv()); }

}  // namespace

OrtStatus* register_all(OrtSessionOptions* options) {
  const OrtApi& a = api();
  std::vector<std::string> domains;
  for (const OpVariant& v : op_variants()) {
    if (!registered_here(v)) continue;
    bool seen = false;
    for (const auto& d : domains) seen = seen || d == v.domain;
    if (!seen) domains.push_back(v.domain);
  }
  for (const std::string& d : domains) {
    OrtCustomOpDomain* domain = nullptr;
    if (OrtStatus* st = a.CreateCustomOpDomain(d.c_str(), &domain)) return st;
    for (const auto& op : registry().ops) {
      if (d != op->variant->domain || !registered_here(*op->variant)) continue;
      if (OrtStatus* st = a.CustomOpDomain_Add(domain, op.get())) return st;
    }
    if (d == "dcnkit") {
      for (OrtCustomOp* op : qdeform_conv_ops())
        if (OrtStatus* st = a.CustomOpDomain_Add(domain, op)) return st;
    }
    // The domain must outlive every session that uses it: it is never released.
    if (OrtStatus* st = a.AddCustomOpDomain(options, domain)) return st;
  }
  return nullptr;
}

}  // namespace dcnkit::ort

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  if (api_base == nullptr) return nullptr;
  if (OrtStatus* st = dcnkit::ort::negotiate_api(api_base)) return st;  // older than the floor: one line
  return dcnkit::ort::register_all(options);
}
