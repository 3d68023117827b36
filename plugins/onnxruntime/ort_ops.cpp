// The operators as ONNX Runtime custom ops: the kit's own (domain "dcnkit") and the names mmdeploy and
// mmcv 1.x export. Attributes are read once per node (errors at session creation), shapes are
// checked by the core's make_*_params on every run, and the kernels are the core launchers.
#include <climits>
#include <cstring>
#include <type_traits>

#include "ort_kernels.h"
#include "ort_qdeform_conv.h"

namespace dcnkit::ort {

Status gather_inputs(const Kernel& k, const OrtKernelContext* ctx, TensorView* inputs, size_t max_inputs) {
  for (size_t i = 0; i < max_inputs; ++i) inputs[i] = TensorView();
  size_t count = 0;
  DCNKIT_RETURN_IF_ERROR(from_ort(api().KernelContext_GetInputCount(ctx, &count), "KernelContext_GetInputCount"));
  const auto& slots = k.variant->inputs;
  const OpDef& def = op_def(k.variant->kind);
  for (size_t i = 0; i < slots.size() && i < count; ++i) {
    const OrtValue* v = nullptr;
    DCNKIT_RETURN_IF_ERROR(from_ort(api().KernelContext_GetInput(ctx, i, &v), "KernelContext_GetInput"));
    TensorView t;
    DCNKIT_RETURN_IF_ERROR(tensor_view(v, &t));
    if (!t.present()) continue;
    const TensorDef& td = def.inputs[slots[i].canonical];
    const ONNXTensorElementDataType want = td.int64 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 : k.dtype;
    if (t.type != want) {
      return arg_error(k.variant->op_type, td.name,
                       std::string("element type ") + onnx_type_name(want) +
                           (td.int64 ? " (an index tensor)" : " (the type of input)"),
                       onnx_type_name(t.type));
    }
    if (k.variant->empty_input_is_absent && slots[i].optional) {
      int64_t numel = 1;
      for (int64_t d : t.shape) numel *= d;
      if (numel == 0) continue;
    }
    inputs[slots[i].canonical] = t;
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    if (!slots[i].optional && !inputs[slots[i].canonical].present()) {
      return arg_error(k.variant->op_type, def.inputs[slots[i].canonical].name, "a tensor", "no input");
    }
  }
  return Status::Ok();
}

Status gather_multi_level_inputs(const Kernel& k, const OrtKernelContext* ctx, TensorView* rois,
                                 std::vector<TensorView>* features) {
  *rois = TensorView();
  features->clear();
  size_t count = 0;
  DCNKIT_RETURN_IF_ERROR(from_ort(api().KernelContext_GetInputCount(ctx, &count), "KernelContext_GetInputCount"));
  const OpDef& def = op_def(k.variant->kind);
  for (size_t i = 0; i < count; ++i) {
    const OrtValue* v = nullptr;
    DCNKIT_RETURN_IF_ERROR(from_ort(api().KernelContext_GetInput(ctx, i, &v), "KernelContext_GetInput"));
    TensorView t;
    DCNKIT_RETURN_IF_ERROR(tensor_view(v, &t));
    const std::string name = i == 0 ? def.inputs[kMlRois].name : "feat_" + std::to_string(i - 1);
    if (!t.present()) return arg_error(k.variant->op_type, name, "a tensor", "no input");
    if (t.type != k.dtype) {
      return arg_error(k.variant->op_type, name,
                       std::string("element type ") + onnx_type_name(k.dtype) + " (the type of the node)",
                       onnx_type_name(t.type));
    }
    if (i == 0) {
      *rois = t;
    } else {
      features->push_back(t);
    }
  }
  if (!rois->present()) return arg_error(k.variant->op_type, def.inputs[kMlRois].name, "a tensor", "no input");
  return Status::Ok();
}

Status prepare_multi_level_run(const Kernel& k, const TensorView& rois, const std::vector<TensorView>& features,
                               OrtKernelContext* ctx, MultiLevelRoIAlignParams* p, void** y) {
  std::vector<Shape> shapes;
  for (const TensorView& f : features) shapes.push_back(f.shape);
  DCNKIT_RETURN_IF_ERROR(::dcnkit::make_params(k.variant->op_type, k.attrs, rois.shape, shapes, p));
  return output_tensor(ctx, 0, p->output_shape(), y);
}

// ---------------------------------------------------------------------------------------------
// Per-run params and outputs (CPU and CUDA)

namespace {

// The canonical inputs' shapes (null: absent) and the core's params from them.
template <typename Params>
Status params_from(const Kernel& k, const TensorView* in, Params* p) {
  const Shape* shapes[kMaxInputs];
  for (size_t i = 0; i < kMaxInputs; ++i) shapes[i] = in[i].present() ? &in[i].shape : nullptr;
  return ::dcnkit::make_params(k.variant->op_type, k.attrs, shapes, p);
}

}  // namespace

Status make_params(const Kernel& k, const TensorView* in, DeformConv2dParams* p) {
  const Shape& w = in[kDcWeight].shape;
  if (!k.kernel_shape.empty() && in[kDcWeight].present() && w.size() == 4 &&
      (k.kernel_shape.size() != 2 || k.kernel_shape[0] != w[2] || k.kernel_shape[1] != w[3])) {
    return arg_error(k.variant->op_type, "attribute kernel_shape",
                     "the kernel size of W " + shape_str({w[2], w[3]}), shape_str(k.kernel_shape));
  }
  return params_from(k, in, p);
}
Status make_params(const Kernel& k, const TensorView* in, RoIAlignParams* p) { return params_from(k, in, p); }
Status make_params(const Kernel& k, const TensorView* in, DeformRoIPoolParams* p) { return params_from(k, in, p); }
Status make_params(const Kernel& k, const TensorView* in, DeformPSRoIPoolParams* p) { return params_from(k, in, p); }
Status make_params(const Kernel& k, const TensorView* in, MsdaParams* p) { return params_from(k, in, p); }
Status make_params(const Kernel& k, const TensorView* in, Dcnv3Params* p) { return params_from(k, in, p); }

Status output_tensor(OrtKernelContext* ctx, size_t index, const Shape& shape, void** data) {
  OrtValue* out = nullptr;
  DCNKIT_RETURN_IF_ERROR(
      from_ort(api().KernelContext_GetOutput(ctx, index, shape.data(), shape.size(), &out), "KernelContext_GetOutput"));
  *data = nullptr;
  if (out == nullptr) return Status::Ok();
  return from_ort(api().GetTensorMutableData(out, data), "GetTensorMutableData");
}

Status optional_output(OrtKernelContext* ctx, size_t index, const Shape& shape, void** data) {
  *data = nullptr;
  size_t n = 0;
  DCNKIT_RETURN_IF_ERROR(from_ort(api().KernelContext_GetOutputCount(ctx, &n), "GetOutputCount"));
  return n > index ? output_tensor(ctx, index, shape, data) : Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// CPU compute

namespace {

template <typename T>
const T* ptr(const TensorView& t) {
  return t.present() ? static_cast<const T*>(t.data) : nullptr;
}

}  // namespace

namespace {

Status compute_multi_level_cpu(Kernel& k, OrtKernelContext* ctx) {
  TensorView rois;
  std::vector<TensorView> features;
  DCNKIT_RETURN_IF_ERROR(gather_multi_level_inputs(k, ctx, &rois, &features));
  MultiLevelRoIAlignParams p;
  void* y = nullptr;
  DCNKIT_RETURN_IF_ERROR(prepare_multi_level_run(k, rois, features, ctx, &p, &y));
  if (y == nullptr) return Status::Ok();
  std::vector<const float*> f;
  for (const TensorView& t : features) f.push_back(ptr<float>(t));
  CpuRun run;
  run.context = ctx;
  return multi_level_roi_align_forward_cpu<float>(p, f.data(), ptr<float>(rois), static_cast<float*>(y),
                                                  cpu_context(&run));
}

}  // namespace

Status compute_cpu(Kernel& k, OrtKernelContext* ctx) {
  if (k.variant->kind == OpKind::kMultiLevelRoIAlign) return compute_multi_level_cpu(k, ctx);
  TensorView in[kMaxInputs];
  DCNKIT_RETURN_IF_ERROR(gather_inputs(k, ctx, in, kMaxInputs));
  CpuRun run;
  run.context = ctx;
  const CpuContext cpu = cpu_context(&run);
  OrtMemoryInfo* mem = nullptr;
  DCNKIT_RETURN_IF_ERROR(
      from_ort(api().CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &mem), "CreateCpuMemoryInfo"));
  std::unique_ptr<OrtMemoryInfo, void (*)(OrtMemoryInfo*)> mem_guard(mem, [](OrtMemoryInfo* m) {
    api().ReleaseMemoryInfo(m);
  });
  void* y = nullptr;

  switch (k.variant->kind) {
    case OpKind::kDeformConv2d: {
      DeformConv2dParams p;
      DCNKIT_RETURN_IF_ERROR(prepare_run(k, in, ctx, &p, &y));
      Workspace ws;
      DCNKIT_RETURN_IF_ERROR(
          ws.allocate(ctx, mem, deform_conv2d_forward_workspace_cpu(p, DType::kFloat32, cpu)));
      const bool packed = !k.weight_kc.empty() && in[kDcWeight].shape == k.weight_kc_shape;
      return deform_conv2d_forward_cpu<float>(p, ptr<float>(in[kDcInput]), ptr<float>(in[kDcOffset]),
                                              ptr<float>(in[kDcWeight]), ptr<float>(in[kDcBias]),
                                              ptr<float>(in[kDcMask]), static_cast<float*>(y), ws.data(), cpu,
                                              packed ? k.weight_kc.data() : nullptr);
    }
    case OpKind::kRoIAlign: {
      RoIAlignParams p;
      DCNKIT_RETURN_IF_ERROR(prepare_run(k, in, ctx, &p, &y));
      return roi_align_forward_cpu<float>(p, ptr<float>(in[kRaInput]), ptr<float>(in[kRaRois]),
                                          static_cast<float*>(y), cpu);
    }
    case OpKind::kDeformRoIPool: {
      DeformRoIPoolParams p;
      DCNKIT_RETURN_IF_ERROR(prepare_run(k, in, ctx, &p, &y));
      return deform_roi_pool_forward_cpu<float>(p, ptr<float>(in[kDrInput]), ptr<float>(in[kDrRois]),
                                                ptr<float>(in[kDrOffset]), static_cast<float*>(y), cpu);
    }
    case OpKind::kDeformPSRoIPool: {
      DeformPSRoIPoolParams p;
      DCNKIT_RETURN_IF_ERROR(prepare_run(k, in, ctx, &p, &y));
      // The count output is optional in the model, not in the launcher.
      void* count = nullptr;
      DCNKIT_RETURN_IF_ERROR(optional_output(ctx, 1, p.output_shape(), &count));
      std::vector<float> own_count;
      if (count == nullptr) {
        int64_t n = 1;
        for (int64_t d : p.output_shape()) n *= d;
        own_count.resize(static_cast<size_t>(n));
        count = own_count.data();
      }
      return deform_psroi_pool_forward_cpu<float>(p, ptr<float>(in[kPsInput]), ptr<float>(in[kPsRois]),
                                                  ptr<float>(in[kPsTrans]), static_cast<float*>(y),
                                                  static_cast<float*>(count), cpu);
    }
    case OpKind::kMultiLevelRoIAlign: break;  // compute_multi_level_cpu
    case OpKind::kMultiScaleDeformableAttention: {
      MsdaParams p;
      DCNKIT_RETURN_IF_ERROR(prepare_run(k, in, ctx, &p, &y));
      return msda_forward_cpu<float>(p, ptr<float>(in[kMsdaValue]), ptr<int64_t>(in[kMsdaSpatialShapes]),
                                     ptr<int64_t>(in[kMsdaLevelStart]), ptr<float>(in[kMsdaLocations]),
                                     ptr<float>(in[kMsdaWeights]), static_cast<float*>(y), cpu);
    }
    case OpKind::kDCNv3:
    case OpKind::kDCNv4: {  // DCNv4 reads its weights from offset_mask (p.fused)
      Dcnv3Params p;
      DCNKIT_RETURN_IF_ERROR(prepare_run(k, in, ctx, &p, &y));
      const float* offset = ptr<float>(in[kD3Offset]);
      return dcnv3_forward_cpu<float>(p, ptr<float>(in[kD3Input]), offset, p.fused ? offset : ptr<float>(in[kD3Mask]),
                                      static_cast<float*>(y), cpu);
    }
  }
  return Status::Internal("unknown op kind");
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

// A CPU DeformConv2d node whose weight is constant: the weight in the launcher's layout, once (nothing when the
// weight is a graph input, or not a float32 (Cout, Cin/groups, kh, kw) tensor: make_params reports that per run).
void pack_constant_weight(const OrtKernelInfo* info, Kernel* k) {
  const auto& slots = k->variant->inputs;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].canonical != kDcWeight) continue;
    int is_constant = 0;
    const OrtValue* v = nullptr;
    OrtStatus* st = api().KernelInfoGetConstantInput_tensor(info, i, &is_constant, &v);
    if (st != nullptr) {
      api().ReleaseStatus(st);
      return;
    }
    TensorView t;
    if (!is_constant || v == nullptr || !tensor_view(v, &t).ok() || t.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT ||
        t.shape.size() != 4 || t.data == nullptr) {
      return;
    }
    const int64_t cout = t.shape[0], cin_g = t.shape[1], kk = t.shape[2] * t.shape[3];
    if (cout <= 0 || cin_g <= 0 || kk <= 0) return;
    k->weight_kc.resize(static_cast<size_t>(cout * cin_g * kk));
    deform_conv2d_weight_kc_cpu<float>(cout, cin_g, kk, static_cast<const float*>(t.data), k->weight_kc.data());
    k->weight_kc_shape = t.shape;
    return;
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
  if (s.ok()) s = make_op_attrs(*o.variant, values, &k->attrs);
  if (!s.ok()) return to_ort(s, k->prefix);
  if (o.variant->onnx_standard) {  // kernel_shape: optional, checked against W on every run
    size_t n = 0;
    const auto get = api().KernelInfoGetAttributeArray_int64;
    if (from_ort(get(info, "kernel_shape", nullptr, &n), "").ok() && n > 0) {
      k->kernel_shape.resize(n);
      if (!from_ort(get(info, "kernel_shape", k->kernel_shape.data(), &n), "").ok()) k->kernel_shape.clear();
    }
  }
  if (o.variant->kind == OpKind::kDeformConv2d && !o.cuda) pack_constant_weight(info, k.get());
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
size_t ORT_API_CALL output_count_fn(const OrtCustomOp* op) { return op_def(self(op).variant->kind).num_outputs; }
ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp* op, size_t i) {
  const CustomOp& o = self(op);
  const InputSlot& slot = o.variant->inputs[i];
  return op_def(o.variant->kind).inputs[slot.canonical].int64 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 : o.dtype;
}
ONNXTensorElementDataType ORT_API_CALL output_type(const OrtCustomOp* op, size_t) { return self(op).dtype; }
OrtCustomOpInputOutputCharacteristic ORT_API_CALL input_char(const OrtCustomOp* op, size_t i) {
  const InputSlot& slot = self(op).variant->inputs[i];
  if (slot.variadic) return INPUT_OUTPUT_VARIADIC;  // the last input: one or more tensors
  return slot.optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}
OrtCustomOpInputOutputCharacteristic ORT_API_CALL output_char(const OrtCustomOp* op, size_t i) {
  return op_def(self(op).variant->kind).outputs[i].optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
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
