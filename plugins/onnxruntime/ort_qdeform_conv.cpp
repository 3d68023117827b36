// dcnkit::QDeformConv2d, the quantized DeformConv2d (docs/operators.md), as an ONNX Runtime CPU custom op.
// Inputs: X (uint8 or int8), x_scale, x_zero_point, W (int8), w_scale (per output channel), w_zero_point,
// offset, [mask], [bias (float32 or int32)], y_scale, y_zero_point; output Y of X's type. Attributes: those of
// dcnkit::DeformConv2d, read and checked by the same code. The kernel is the core's
// deform_conv2d_forward_quant_cpu with oneDNN's int8 GEMM (ort_onednn.h, loaded at first use).
#include "ort_qdeform_conv.h"

#include <climits>
#include <cmath>
#include <cstring>
#include <memory>

#include "dcnkit/deform_conv2d_quant.h"
#include "ort_kernels.h"
#include "ort_onednn.h"

namespace dcnkit::ort {

namespace {

constexpr const char* kOp = "QDeformConv2d";
enum QInput : int {
  kQX = 0, kQXScale, kQXZero, kQW, kQWScale, kQWZero, kQOffset, kQMask, kQBias, kQYScale, kQYZero, kQInputs
};
constexpr const char* kQNames[kQInputs] = {"X", "x_scale", "x_zero_point", "W", "w_scale", "w_zero_point",
                                           "offset", "mask", "bias", "y_scale", "y_zero_point"};

// DeformConv2d under its own name (its attributes, defaults and checks); its canonical inputs in its order: input,
// offset, weight, bias, mask.
const OpVariant& deform_conv2d_variant() {
  for (const OpVariant& v : op_variants())
    if (std::strcmp(v.op->def.name, "deform_conv2d") == 0 && std::strcmp(v.domain, "dcnkit") == 0) return v;
  return op_variants().front();
}
enum DcInput : int { kDcInput = 0, kDcOffset, kDcWeight, kDcBias, kDcMask };

struct QKernel {
  std::string prefix;
  ONNXTensorElementDataType qtype = ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
  OpAttrs attrs;
  std::vector<int8_t> weight_kc;  // a constant W in the launcher's layout (empty: reordered per run)
  Shape weight_kc_shape;
};

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + (s.size() == 1 ? ",)" : ")");
}

// A positive finite scale: one value, or `count` values (per channel).
Status check_scale(const TensorView& t, const char* name, int64_t count, const float** out) {
  const int64_t n = numel(t.shape);
  if (n != 1 && (count <= 1 || n != count || t.shape.size() != 1)) {
    return arg_error(kOp, name, count > 1 ? "1 or " + std::to_string(count) + " values (per output channel)"
                                          : std::string("a scalar"),
                     "shape " + shape_str(t.shape));
  }
  const float* v = static_cast<const float*>(t.data);
  for (int64_t i = 0; i < n; ++i) {
    if (!(v[i] > 0.f) || !std::isfinite(v[i])) {
      return arg_error(kOp, name, "positive finite scales", std::to_string(v[i]) + " at " + std::to_string(i));
    }
  }
  *out = v;
  return Status::Ok();
}

Status scalar_zero(const TensorView& t, const char* name, bool is_signed, int32_t* z) {
  if (numel(t.shape) != 1) return arg_error(kOp, name, "a scalar", "shape " + shape_str(t.shape));
  *z = is_signed ? int32_t(*static_cast<const int8_t*>(t.data)) : int32_t(*static_cast<const uint8_t*>(t.data));
  return Status::Ok();
}

Status compute(QKernel& k, OrtKernelContext* ctx) {
  size_t count = 0;
  DCNKIT_RETURN_IF_ERROR(from_ort(api().KernelContext_GetInputCount(ctx, &count), "KernelContext_GetInputCount"));
  TensorView in[kQInputs];
  for (size_t i = 0; i < count && i < kQInputs; ++i) {
    const OrtValue* v = nullptr;
    DCNKIT_RETURN_IF_ERROR(from_ort(api().KernelContext_GetInput(ctx, i, &v), "KernelContext_GetInput"));
    DCNKIT_RETURN_IF_ERROR(tensor_view(v, &in[i]));
  }
  for (int i = 0; i < kQInputs; ++i) {
    if (!in[i].present() && i != kQMask && i != kQBias) return arg_error(kOp, kQNames[i], "a tensor", "no input");
  }
  const bool sgn = k.qtype == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
  const TensorView* bias = in[kQBias].present() ? &in[kQBias] : nullptr;
  if (bias && bias->type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT && bias->type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32) {
    return arg_error(kOp, "bias", "element type float32 or int32", onnx_type_name(bias->type));
  }
  // Shapes as DeformConv2d's (canonical order), checked by the core.
  const Shape* shapes[kMaxInputs] = {};
  shapes[kDcInput] = &in[kQX].shape;
  shapes[kDcOffset] = &in[kQOffset].shape;
  shapes[kDcWeight] = &in[kQW].shape;
  shapes[kDcBias] = bias ? &bias->shape : nullptr;
  shapes[kDcMask] = in[kQMask].present() ? &in[kQMask].shape : nullptr;
  DeformConv2dParams p;
  DCNKIT_RETURN_IF_ERROR(deform_conv2d_params_from(kOp, k.attrs.values.data(), shapes, &p));
  const int64_t cout = p.out_channels;
  const float *x_scale = nullptr, *w_scale = nullptr, *y_scale = nullptr;
  DCNKIT_RETURN_IF_ERROR(check_scale(in[kQXScale], "x_scale", 1, &x_scale));
  DCNKIT_RETURN_IF_ERROR(check_scale(in[kQWScale], "w_scale", cout, &w_scale));
  DCNKIT_RETURN_IF_ERROR(check_scale(in[kQYScale], "y_scale", 1, &y_scale));
  DeformConv2dQuant q;
  q.x_signed = q.y_signed = sgn;
  DCNKIT_RETURN_IF_ERROR(scalar_zero(in[kQXZero], "x_zero_point", sgn, &q.x_zero));
  DCNKIT_RETURN_IF_ERROR(scalar_zero(in[kQYZero], "y_zero_point", sgn, &q.y_zero));
  {
    const TensorView& wz = in[kQWZero];
    const int64_t n = numel(wz.shape);
    if (n != 1 && n != cout) {
      return arg_error(kOp, "w_zero_point", "1 or " + std::to_string(cout) + " values", "shape " + shape_str(wz.shape));
    }
    const int8_t* v = static_cast<const int8_t*>(wz.data);
    for (int64_t i = 0; i < n; ++i) {
      if (v[i] != 0) {
        return arg_error(kOp, "w_zero_point", "zeros (symmetric int8 weights)",
                         std::to_string(int(v[i])) + " at " + std::to_string(i));
      }
    }
  }
  std::vector<float> table(static_cast<size_t>(2 * cout));
  std::vector<float> w_scales(static_cast<size_t>(cout), w_scale[0]);
  if (numel(in[kQWScale].shape) == cout) std::memcpy(w_scales.data(), w_scale, sizeof(float) * cout);
  deform_conv2d_quant_requant_table(
      cout, *x_scale, w_scales.data(), *y_scale,
      bias && bias->type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT ? static_cast<const float*>(bias->data) : nullptr,
      bias && bias->type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 ? static_cast<const int32_t*>(bias->data) : nullptr,
      table.data(), table.data() + cout);
  q.out_mult = table.data();
  q.out_bias = table.data() + cout;

  void* y = nullptr;
  DCNKIT_RETURN_IF_ERROR(output_tensor(ctx, 0, p.output_shape(), &y));
  if (y == nullptr) return Status::Ok();
  QGemmFn gemm = nullptr;
  DCNKIT_RETURN_IF_ERROR(onednn_gemm_u8s8s32(&gemm));
  std::vector<int8_t> own_kc;
  const int8_t* wkc = k.weight_kc.data();
  if (k.weight_kc.empty() || in[kQW].shape != k.weight_kc_shape) {
    own_kc.resize(static_cast<size_t>(numel(in[kQW].shape)));
    deform_conv2d_weight_kc_quant_cpu(cout, p.in_per_group(), p.kernel_size(), static_cast<const int8_t*>(in[kQW].data),
                                      own_kc.data());
    wkc = own_kc.data();
  }
  CpuRun run;
  run.context = ctx;
  CpuContext cpu = cpu_context(&run);
  cpu.gemm_min_n = 0;  // oneDNN's int8 GEMM is efficient on narrow tiles (the float path's OpenBLAS is not)
  OrtMemoryInfo* mem = nullptr;
  DCNKIT_RETURN_IF_ERROR(
      from_ort(api().CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &mem), "CreateCpuMemoryInfo"));
  std::unique_ptr<OrtMemoryInfo, void (*)(OrtMemoryInfo*)> mem_guard(mem, [](OrtMemoryInfo* m) {
    api().ReleaseMemoryInfo(m);
  });
  Workspace ws;
  DCNKIT_RETURN_IF_ERROR(ws.allocate(ctx, mem, deform_conv2d_forward_quant_workspace_cpu(p, cpu)));
  return deform_conv2d_forward_quant_cpu(p, q, in[kQX].data, static_cast<const float*>(in[kQOffset].data), wkc,
                                         in[kQMask].present() ? static_cast<const float*>(in[kQMask].data) : nullptr,
                                         y, ws.data(), cpu, gemm, nullptr);
}

// ---------------------------------------------------------------------------------------------
// OrtCustomOp

struct QOp : OrtCustomOp {
  ONNXTensorElementDataType qtype = ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
};

const QOp& qself(const OrtCustomOp* op) { return *static_cast<const QOp*>(op); }

// A constant W (an initializer) reordered once.
void pack_constant_weight(const OrtKernelInfo* info, QKernel* k) {
  int is_constant = 0;
  const OrtValue* v = nullptr;
  OrtStatus* st = api().KernelInfoGetConstantInput_tensor(info, kQW, &is_constant, &v);
  if (st != nullptr) {
    api().ReleaseStatus(st);
    return;
  }
  TensorView t;
  if (!is_constant || v == nullptr || !tensor_view(v, &t).ok() || t.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 ||
      t.shape.size() != 4 || t.data == nullptr || numel(t.shape) <= 0) {
    return;
  }
  k->weight_kc.resize(static_cast<size_t>(numel(t.shape)));
  deform_conv2d_weight_kc_quant_cpu(t.shape[0], t.shape[1], t.shape[2] * t.shape[3],
                                    static_cast<const int8_t*>(t.data), k->weight_kc.data());
  k->weight_kc_shape = t.shape;
}

OrtStatusPtr ORT_API_CALL create_kernel(const OrtCustomOp* op, const OrtApi*, const OrtKernelInfo* info,
                                        void** kernel) {
  auto k = std::make_unique<QKernel>();
  k->qtype = qself(op).qtype;
  k->prefix = std::string("dcnkit::") + kOp + " node '" + node_name(info) + "': ";
  std::vector<AttrValue> values;
  const OpVariant& v = deform_conv2d_variant();
  Status s = read_attrs(info, v, &values);
  if (s.ok()) s = make_op_attrs(v, std::move(values), &k->attrs);
  if (!s.ok()) return to_ort(s, k->prefix);
  pack_constant_weight(info, k.get());
  *kernel = k.release();
  return nullptr;
}

OrtStatusPtr ORT_API_CALL kernel_compute(void* kernel, OrtKernelContext* ctx) {
  QKernel& k = *static_cast<QKernel*>(kernel);
  Status s;
  try {
    s = compute(k, ctx);
  } catch (const std::exception& e) {
    s = Status::Internal(std::string("unexpected error: ") + e.what());
  }
  return to_ort(s, k.prefix);
}

void ORT_API_CALL kernel_destroy(void* kernel) { delete static_cast<QKernel*>(kernel); }
const char* ORT_API_CALL get_name(const OrtCustomOp*) { return kOp; }
const char* ORT_API_CALL get_ep(const OrtCustomOp*) { return nullptr; }
size_t ORT_API_CALL input_count(const OrtCustomOp*) { return kQInputs; }
size_t ORT_API_CALL output_count(const OrtCustomOp*) { return 1; }
ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp* op, size_t i) {
  switch (i) {
    case kQX: case kQXZero: case kQYZero: return qself(op).qtype;
    case kQW: case kQWZero: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
    case kQBias: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;  // float32 or int32, checked per run
    default: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
}
ONNXTensorElementDataType ORT_API_CALL output_type(const OrtCustomOp* op, size_t) { return qself(op).qtype; }
OrtCustomOpInputOutputCharacteristic ORT_API_CALL input_char(const OrtCustomOp*, size_t i) {
  return i == kQMask || i == kQBias ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
}
OrtCustomOpInputOutputCharacteristic ORT_API_CALL output_char(const OrtCustomOp*, size_t) {
  return INPUT_OUTPUT_REQUIRED;
}
OrtMemType ORT_API_CALL input_mem(const OrtCustomOp*, size_t) { return OrtMemTypeDefault; }
int ORT_API_CALL one(const OrtCustomOp*) { return 1; }
int ORT_API_CALL end_version(const OrtCustomOp*) { return INT_MAX; }

std::unique_ptr<QOp> make_qop(ONNXTensorElementDataType qtype) {
  auto op = std::make_unique<QOp>();
  std::memset(static_cast<OrtCustomOp*>(op.get()), 0, sizeof(OrtCustomOp));
  op->version = custom_op_version();  // ort_common.h
  op->GetName = &get_name;
  op->GetExecutionProviderType = &get_ep;
  op->GetInputType = &input_type;
  op->GetInputTypeCount = &input_count;
  op->GetOutputType = &output_type;
  op->GetOutputTypeCount = &output_count;
  op->KernelDestroy = &kernel_destroy;
  op->GetInputCharacteristic = &input_char;
  op->GetOutputCharacteristic = &output_char;
  op->GetInputMemoryType = &input_mem;
  op->GetVariadicInputMinArity = &one;
  op->GetVariadicInputHomogeneity = &one;
  op->GetVariadicOutputMinArity = &one;
  op->GetVariadicOutputHomogeneity = &one;
  op->CreateKernelV2 = &create_kernel;
  op->KernelComputeV2 = &kernel_compute;
#if ORT_API_VERSION >= 17
  op->GetStartVersion = &one;
  op->GetEndVersion = &end_version;
#endif
  op->qtype = qtype;
  return op;
}

}  // namespace

const std::vector<OrtCustomOp*>& qdeform_conv_ops() {
  static const std::vector<std::unique_ptr<QOp>> owned = [] {
    std::vector<std::unique_ptr<QOp>> v;
    v.push_back(make_qop(ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8));
    v.push_back(make_qop(ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8));
    return v;
  }();
  static const std::vector<OrtCustomOp*> ops = [] {
    std::vector<OrtCustomOp*> v;
    for (const auto& o : owned) v.push_back(o.get());
    return v;
  }();
  return ops;
}

}  // namespace dcnkit::ort
