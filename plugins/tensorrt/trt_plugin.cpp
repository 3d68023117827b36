// The IPluginV3 lifecycle shared by every operator: fields, names, types, formats, validation, cloning,
// serialization, the per-instance cuBLAS handle. No kernel math here.
#include "trt_plugin.h"

#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>

#include "dcnkit/cublas_gemm.h"

using namespace nvinfer1;

namespace dcnkit::trt {

// ---------------------------------------------------------------------------------------------
// Logging (the logger finder is set by setLoggerFinder in trt_creators.cpp)

ILoggerFinder* g_logger_finder = nullptr;

void log(ILogger::Severity severity, const std::string& message) {
  const std::string line = "dcnkit: " + message;
  ILogger* logger = g_logger_finder != nullptr ? g_logger_finder->findLogger() : nullptr;
  if (logger != nullptr) {
    logger->log(severity, line.c_str());
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

void log_error(const std::string& message) { log(ILogger::Severity::kERROR, message); }

const char* plugin_namespace(const OpVariant& v) { return std::strcmp(v.domain, kOnnxDomain) == 0 ? kOnnxDomain : ""; }

// ---------------------------------------------------------------------------------------------
// Fields

void FieldStore::add(const char* name, PluginFieldType type, const void* data, int32_t length, size_t bytes) {
  names_.emplace_back(name);
  data_.emplace_back(static_cast<const char*>(data), static_cast<const char*>(data) + (data ? bytes : 0));
  fields_.emplace_back(names_.back().c_str(), data ? data_.back().data() : nullptr, type, length);
}

const PluginFieldCollection* FieldStore::collection() {
  fc_.nbFields = static_cast<int32_t>(fields_.size());
  fc_.fields = fields_.data();
  return &fc_;
}

void FieldStore::clear() {
  names_.clear();
  data_.clear();
  fields_.clear();
}

namespace {

// ONNX INT / INTS -> kINT32 (the parser's mapping), FLOAT -> kFLOAT32, STRING -> kCHAR.
PluginFieldType field_type(AttrKind k) {
  switch (k) {
    case AttrKind::kInt:
    case AttrKind::kInts: return PluginFieldType::kINT32;
    case AttrKind::kFloat:
    case AttrKind::kFloats: return PluginFieldType::kFLOAT32;
    case AttrKind::kString: return PluginFieldType::kCHAR;
  }
  return PluginFieldType::kUNKNOWN;
}

const char* field_type_name(PluginFieldType t) {
  switch (t) {
    case PluginFieldType::kFLOAT16: return "float16";
    case PluginFieldType::kFLOAT32: return "float32";
    case PluginFieldType::kFLOAT64: return "float64";
    case PluginFieldType::kINT8: return "int8";
    case PluginFieldType::kINT16: return "int16";
    case PluginFieldType::kINT32: return "int32";
    case PluginFieldType::kINT64: return "int64";
    case PluginFieldType::kCHAR: return "char";
    case PluginFieldType::kDIMS: return "dims";
    case PluginFieldType::kBF16: return "bfloat16";
    default: return "unknown";
  }
}

// A PluginField as the raw attribute the core's attribute reader takes.
RawAttr raw_from_field(const PluginField& f) {
  RawAttr r;
  const int32_t n = f.length;
  if (n < 0 || (n > 0 && f.data == nullptr)) {
    r.type = RawAttr::kOther;
    r.other = "a " + std::string(field_type_name(f.type)) + " field of length " + std::to_string(n) + " without data";
    return r;
  }
  switch (f.type) {
    case PluginFieldType::kINT32:
    case PluginFieldType::kINT64: {
      std::vector<int64_t> v(static_cast<size_t>(n));
      for (int32_t i = 0; i < n; ++i) {
        v[i] = f.type == PluginFieldType::kINT32 ? static_cast<const int32_t*>(f.data)[i]
                                                 : static_cast<const int64_t*>(f.data)[i];
      }
      if (n == 1) {
        r.type = RawAttr::kInt;
        r.i = v[0];
      } else {
        r.type = RawAttr::kInts;
        r.ints = std::move(v);
      }
      return r;
    }
    case PluginFieldType::kFLOAT32:
    case PluginFieldType::kFLOAT64: {
      std::vector<float> v(static_cast<size_t>(n));
      for (int32_t i = 0; i < n; ++i) {
        v[i] = f.type == PluginFieldType::kFLOAT32 ? static_cast<const float*>(f.data)[i]
                                                   : static_cast<float>(static_cast<const double*>(f.data)[i]);
      }
      if (n == 1) {
        r.type = RawAttr::kFloat;
        r.f = f.type == PluginFieldType::kFLOAT32 ? static_cast<const float*>(f.data)[0]
                                                  : static_cast<const double*>(f.data)[0];
      } else {
        r.type = RawAttr::kFloats;
        r.floats = std::move(v);
      }
      return r;
    }
    case PluginFieldType::kCHAR: {
      std::string s(static_cast<const char*>(f.data), static_cast<size_t>(n));
      s.resize(std::strlen(s.c_str()));  // the parser may count a terminating NUL
      r.type = RawAttr::kString;
      r.s = s;
      return r;
    }
    default:
      r.type = RawAttr::kOther;
      r.other = std::to_string(n) + " " + field_type_name(f.type) + " values";
      return r;
  }
}

}  // namespace

void declare_fields(const OpVariant& v, FieldStore* out) {
  out->clear();
  for (const VariantField& f : variant_fields(v)) out->add(f.name, field_type(f.kind), nullptr, f.count, 0);
}

void serialize_fields(const OpVariant& v, const OpAttrs& attrs, FieldStore* out) {
  out->clear();
  const std::vector<AttrValue> values = op_attr_values(attrs);
  for (const VariantField& f : variant_fields(v)) {
    const AttrValue& a = values[f.canonical];
    switch (f.kind) {
      case AttrKind::kInt:
      case AttrKind::kInts: {
      std::vector<int32_t> ints;
        if (f.enum_values != nullptr) {  // an int naming a canonical string (mmdeploy pool_mode)
          ints.push_back(static_cast<int32_t>(enum_index(f.enum_values, a.s)));
        } else if (f.element >= 0) {
          ints.push_back(static_cast<int32_t>(a.ints[f.element]));
        } else {
          for (int64_t x : a.ints) ints.push_back(static_cast<int32_t>(x));
        }
        out->add(f.name, PluginFieldType::kINT32, ints.data(), static_cast<int32_t>(ints.size()),
                 ints.size() * sizeof(int32_t));
        break;
      }
      case AttrKind::kFloat: {
        const float x = static_cast<float>(a.f);
        out->add(f.name, PluginFieldType::kFLOAT32, &x, 1, sizeof(float));
        break;
      }
      case AttrKind::kString:
        out->add(f.name, PluginFieldType::kCHAR, a.s.data(), static_cast<int32_t>(a.s.size()), a.s.size());
        break;
      case AttrKind::kFloats: {
        std::vector<float> xs(a.floats.begin(), a.floats.end());
        out->add(f.name, PluginFieldType::kFLOAT32, xs.data(), static_cast<int32_t>(xs.size()),
                 xs.size() * sizeof(float));
        break;
      }
    }
  }
}

Status attrs_from_fields(const OpVariant& v, const PluginFieldCollection* fc, OpAttrs* out) {
  auto lookup = [fc](const char* name) {
    RawAttr r;
    if (fc == nullptr) return r;
    for (int32_t i = 0; i < fc->nbFields; ++i) {
      const PluginField& f = fc->fields[i];
      if (f.name != nullptr && std::strcmp(f.name, name) == 0) return raw_from_field(f);
    }
    return r;  // absent: the op's default
  };
  std::vector<AttrValue> values;
  DCNKIT_RETURN_IF_ERROR(read_attrs(v, lookup, &values));
  return make_op_attrs(v, values, out);
}

// ---------------------------------------------------------------------------------------------
// Inputs and types

int32_t max_node_inputs(const OpVariant& v) {
  const auto slots = static_cast<int32_t>(v.inputs.size());
  return has_variadic_input(v) ? slots - 1 + static_cast<int32_t>(kMaxFeatureLevels) : slots;
}

const InputSlot& input_slot(const OpVariant& v, int32_t i) {
  const auto last = static_cast<int32_t>(v.inputs.size()) - 1;
  return v.inputs[static_cast<size_t>(has_variadic_input(v) && i > last ? last : i)];
}

Status canonical_inputs(const OpVariant& v, const Dims* dims, void const* const* data, int32_t nb,
                        CanonicalInputs* out) {
  const OpDef& def = op_def(v.kind);
  *out = CanonicalInputs();
  if (nb < 0 || nb > max_node_inputs(v)) {
    return arg_error(v.op_type, "inputs", "at most " + std::to_string(max_node_inputs(v)), std::to_string(nb));
  }
  for (int32_t i = 0; i < nb; ++i) {
    const InputSlot& slot = input_slot(v, i);
    Shape s(dims[i].d, dims[i].d + (dims[i].nbDims > 0 ? dims[i].nbDims : 0));
    if (slot.variadic) {
      out->variadic_shape.push_back(s);
      out->variadic_data.push_back(data ? data[i] : nullptr);
      if (out->shapes[slot.canonical] != nullptr) continue;  // the canonical entry is the first tensor
    } else if (v.empty_input_is_absent && slot.optional) {
      int64_t numel = 1;
      for (int64_t d : s) numel *= d;
      if (numel == 0) continue;
    }
    out->shape[slot.canonical] = std::move(s);
    out->shapes[slot.canonical] = &out->shape[slot.canonical];
    out->data[slot.canonical] = data ? data[i] : nullptr;
  }
  for (const InputSlot& slot : v.inputs) {
    if (!slot.optional && out->shapes[slot.canonical] == nullptr) {
      return arg_error(v.op_type, def.inputs[slot.canonical].name, "a tensor", "no input");
    }
  }
  return Status::Ok();
}

bool core_dtype(DataType t, DType* out) {
  switch (t) {
    case DataType::kFLOAT: *out = DType::kFloat32; return true;
    case DataType::kHALF: *out = DType::kFloat16; return true;
    case DataType::kBF16: *out = DType::kBFloat16; return true;
    default: return false;
  }
}

namespace {

Status inputs_from(const OpVariant& v, const DynamicPluginTensorDesc* in, int32_t nb, bool use_max,
                   CanonicalInputs* out) {
  std::vector<Dims> dims(static_cast<size_t>(nb > 0 ? nb : 0));
  for (int32_t i = 0; i < nb; ++i) dims[i] = use_max ? in[i].max : in[i].desc.dims;
  return canonical_inputs(v, dims.data(), nullptr, nb, out);
}

bool fully_known(const DynamicPluginTensorDesc* in, int32_t nb) {
  for (int32_t i = 0; i < nb; ++i) {
    if (in[i].desc.dims.nbDims < 0) return false;
    for (int32_t d = 0; d < in[i].desc.dims.nbDims; ++d)
      if (in[i].desc.dims.d[d] < 0) return false;
  }
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// PluginBase

struct PluginBase::Blas {
  CublasGemm gemm;
};

PluginBase::PluginBase(const OpVariant* variant, const OpAttrs& attrs, std::string name)
    : variant_(variant), attrs_(attrs), name_(std::move(name)) {}

PluginBase::PluginBase(const PluginBase& o)
    : IPluginV3(o),
      IPluginV3OneCore(o),
      IPluginV3OneBuild(o),
      IPluginV3OneRuntime(o),
      variant_(o.variant_),
      attrs_(o.attrs_),
      name_(o.name_),
      nb_inputs_(o.nb_inputs_) {}

PluginBase::~PluginBase() {
  if (blas_ != nullptr) {
    if (blas_->gemm.handle != nullptr) cublasDestroy(blas_->gemm.handle);
    delete blas_;
  }
}

void* PluginBase::blas_gemm(Status* s) {
  if (blas_ == nullptr) {
    auto b = std::make_unique<Blas>();
    *s = cublas_status(cublasCreate(&b->gemm.handle), "cublasCreate");
    if (!s->ok()) return nullptr;
    blas_ = b.release();
  }
  return &blas_->gemm;
}

std::string PluginBase::where() const { return std::string(variant_->op_type) + " node '" + name_ + "': "; }

int32_t PluginBase::min_inputs() const {
  int32_t n = 0;
  for (size_t i = 0; i < variant_->inputs.size(); ++i)
    if (!variant_->inputs[i].optional) n = static_cast<int32_t>(i) + 1;
  return n;
}

int32_t PluginBase::max_inputs() const { return max_node_inputs(*variant_); }

IPluginCapability* PluginBase::getCapabilityInterface(PluginCapabilityType type) noexcept {
  switch (type) {
    case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
    case PluginCapabilityType::kBUILD: return static_cast<IPluginV3OneBuild*>(this);
    case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime*>(this);
  }
  return nullptr;
}

IPluginV3* PluginBase::clone() noexcept {
  try {
    return make_copy();
  } catch (const std::exception& e) {
    log_error(where() + "clone failed: " + e.what());
    return nullptr;
  }
}

const char* PluginBase::getPluginName() const noexcept { return variant_->op_type; }
const char* PluginBase::getPluginVersion() const noexcept { return kPluginVersion; }
const char* PluginBase::getPluginNamespace() const noexcept { return plugin_namespace(*variant_); }

int32_t PluginBase::getNbOutputs() const noexcept { return static_cast<int32_t>(op_num_outputs(variant_->kind)); }

int32_t PluginBase::getOutputDataTypes(DataType* output_types, int32_t nb_outputs, const DataType* input_types,
                                       int32_t nb_inputs) const noexcept {
  if (nb_inputs < 1 || nb_outputs != getNbOutputs()) return -1;
  for (int32_t i = 0; i < nb_outputs; ++i) output_types[i] = input_types[0];  // outputs follow the features
  return 0;
}

int32_t PluginBase::getOutputShapes(const DimsExprs* inputs, int32_t nb_inputs, const DimsExprs*, int32_t,
                                    DimsExprs* outputs, int32_t nb_outputs, IExprBuilder& builder) noexcept {
  try {
    if (nb_inputs < min_inputs() || nb_inputs > max_inputs() || nb_outputs != getNbOutputs()) {
      log_error(where() + "expected " + std::to_string(min_inputs()) + " to " + std::to_string(max_inputs()) +
                " inputs and " + std::to_string(getNbOutputs()) + " outputs, got " + std::to_string(nb_inputs) +
                " and " + std::to_string(nb_outputs));
      return -1;
    }
    const DimsExprs* canonical[kMaxInputs] = {};
    for (int32_t i = 0; i < nb_inputs; ++i) {  // a variadic input's canonical entry is its first tensor
      const DimsExprs*& c = canonical[input_slot(*variant_, i).canonical];
      if (c == nullptr || !input_slot(*variant_, i).variadic) c = &inputs[i];
    }
    const Status s = output_shapes(canonical, builder, outputs);
    if (!s.ok()) {
      log_error(where() + s.message());
      return -1;
    }
    return 0;
  } catch (const std::exception& e) {
    log_error(where() + e.what());
    return -1;
  }
}

bool PluginBase::supportsFormatCombination(int32_t pos, const DynamicPluginTensorDesc* in_out, int32_t nb_inputs,
                                           int32_t nb_outputs) noexcept {
  if (pos < 0 || pos >= nb_inputs + nb_outputs) return false;
  const PluginTensorDesc& d = in_out[pos].desc;
  if (d.format != TensorFormat::kLINEAR) return false;  // the launchers take dense NCHW
  DType dt;
  if (pos == 0) return core_dtype(d.type, &dt);
  return d.type == in_out[0].desc.type;  // every tensor in the type of the features
}

int32_t PluginBase::configurePlugin(const DynamicPluginTensorDesc* in, int32_t nb_inputs,
                                    const DynamicPluginTensorDesc*, int32_t nb_outputs) noexcept {
  try {
    if (nb_inputs < min_inputs() || nb_inputs > max_inputs() || nb_outputs != getNbOutputs()) {
      log_error(where() + "expected " + std::to_string(min_inputs()) + " to " + std::to_string(max_inputs()) +
                " inputs, got " + std::to_string(nb_inputs));
      return -1;
    }
    // Dynamic dims are checked per shape (onShapeChange); fixed ones here, at build time.
    CanonicalInputs ci;
    Status s = inputs_from(*variant_, in, nb_inputs, false, &ci);
    if (s.ok() && fully_known(in, nb_inputs)) s = check(ci);
    if (!s.ok()) {
      log_error(where() + s.message());
      return -1;
    }
    return 0;
  } catch (const std::exception& e) {
    log_error(where() + e.what());
    return -1;
  }
}

size_t PluginBase::getWorkspaceSize(const DynamicPluginTensorDesc* inputs, int32_t nb_inputs,
                                    const DynamicPluginTensorDesc*, int32_t) const noexcept {
  try {
    CanonicalInputs ci;
    DType dt;
    if (nb_inputs < 1 || !core_dtype(inputs[0].desc.type, &dt)) return 0;
    if (!inputs_from(*variant_, inputs, nb_inputs, true, &ci).ok()) return 0;
    return workspace(ci, dt);
  } catch (const std::exception&) {
    return 0;
  }
}

int32_t PluginBase::onShapeChange(const PluginTensorDesc* in, int32_t nb_inputs, const PluginTensorDesc*,
                                  int32_t) noexcept {
  try {
    std::vector<Dims> dims(static_cast<size_t>(nb_inputs > 0 ? nb_inputs : 0));
    for (int32_t i = 0; i < nb_inputs; ++i) dims[i] = in[i].dims;
    CanonicalInputs ci;
    Status s = canonical_inputs(*variant_, dims.data(), nullptr, nb_inputs, &ci);
    if (s.ok()) s = check(ci);
    if (!s.ok()) {
      log_error(where() + s.message());
      return -1;
    }
    nb_inputs_ = nb_inputs;
    return 0;
  } catch (const std::exception& e) {
    log_error(where() + e.what());
    return -1;
  }
}

int32_t PluginBase::enqueue(const PluginTensorDesc* input_desc, const PluginTensorDesc*, const void* const* inputs,
                            void* const* outputs, void* workspace, cudaStream_t stream) noexcept {
  try {
    // enqueue does not say how many inputs the layer has: onShapeChange (always called first) did.
    const int32_t present = nb_inputs_;
    if (present < min_inputs() || present > max_inputs()) {
      log_error(where() + "enqueue before onShapeChange");
      return -1;
    }
    std::vector<Dims> dims(static_cast<size_t>(present));
    for (int32_t i = 0; i < present; ++i) dims[i] = input_desc[i].dims;
    CanonicalInputs ci;
    DType dt;
    Status s = core_dtype(input_desc[0].type, &dt) ? canonical_inputs(*variant_, dims.data(), inputs, present, &ci)
                                                   : Status::Invalid("unsupported input type");
    if (s.ok()) s = check(ci);
    if (s.ok()) s = run(ci, dt, outputs, workspace, stream);
    if (!s.ok()) {
      log_error(where() + s.message());
      return -1;
    }
    return 0;
  } catch (const std::exception& e) {
    log_error(where() + e.what());
    return -1;
  }
}

IPluginV3* PluginBase::attachToContext(IPluginResourceContext*) noexcept {
  PluginBase* copy = nullptr;
  try {
    copy = make_copy();
    Status s;
    if (needs_blas() && copy->blas_gemm(&s) == nullptr) {
      log_error(where() + s.message());
      delete copy;
      return nullptr;
    }
    return copy;
  } catch (const std::exception& e) {
    log_error(where() + e.what());
    delete copy;
    return nullptr;
  }
}

const PluginFieldCollection* PluginBase::getFieldsToSerialize() noexcept {
  try {
    serialize_fields(*variant_, attrs_, &serialized_);
    return serialized_.collection();
  } catch (const std::exception& e) {
    log_error(where() + e.what());
    return nullptr;
  }
}

}  // namespace dcnkit::trt
