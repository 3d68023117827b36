// The IPluginV3 lifecycle of every operator: names, types, formats, validation, cloning, serialization, workspace
// checks, the context's cuBLAS handle, the timing-cache ID (the calls into the op's declaration: trt_plugin_decl.cpp).
// No kernel math here, and no op named.
#include "trt_plugin.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>

#include "dcnkit/cublas_gemm.h"
#include "trt_blas.h"

using namespace nvinfer1;

namespace dcnkit::trt {

const char* plugin_namespace(const OpVariant& v) { return std::strcmp(v.domain, kOnnxDomain) == 0 ? kOnnxDomain : ""; }

// ---------------------------------------------------------------------------------------------
// Inputs and types

int32_t max_node_inputs(const OpVariant& v) {
  const auto slots = static_cast<int32_t>(v.inputs.size());
  return has_variadic_input(v) ? slots - 1 + static_cast<int32_t>(kMaxVariadic) : slots;
}

const InputSlot& input_slot(const OpVariant& v, int32_t i) {
  const auto last = static_cast<int32_t>(v.inputs.size()) - 1;
  return v.inputs[static_cast<size_t>(has_variadic_input(v) && i > last ? last : i)];
}

Status canonical_inputs(const OpVariant& v, const Dims* dims, void const* const* data, int32_t nb,
                        CanonicalInputs* out) {
  const OpDef& def = v.op->def;
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

bool rois_type_fits(DataType rois, DataType features) { return rois == features || rois == DataType::kFLOAT; }

bool index_input(const OpVariant& v, int32_t i) {
  return i >= 0 && i < max_node_inputs(v) && v.op->def.inputs[input_slot(v, i).canonical].int64;
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
      nb_inputs_(o.nb_inputs_),
      workspace_bound_(o.workspace_bound_) {}

PluginBase::~PluginBase() {
  if (gemm_key_ != nullptr) release_context_gemm(gemm_key_);
}

std::string PluginBase::where() const { return std::string(variant_->op_type) + " node '" + name_ + "': "; }

int32_t PluginBase::min_inputs() const {
  int32_t n = 0;
  for (size_t i = 0; i < variant_->inputs.size(); ++i)
    if (!variant_->inputs[i].optional) n = static_cast<int32_t>(i) + 1;
  return n;
}

int32_t PluginBase::max_inputs() const { return max_node_inputs(*variant_); }

namespace {

// The first node input (of nb) that carries canonical input c; -1 if none.
int32_t node_position(const OpVariant& v, int c, int32_t nb) {
  for (int32_t i = 0; c >= 0 && i < nb; ++i)
    if (input_slot(v, i).canonical == c) return i;
  return -1;
}

}  // namespace

int32_t PluginBase::features_position(int32_t nb) const {
  return node_position(*variant_, features_input(variant_->op->def), nb);
}

int32_t PluginBase::rois_position(int32_t nb) const {
  return node_position(*variant_, rois_input(variant_->op->def), nb);
}

bool PluginBase::tensor_types(const DataType* input_types, int32_t nb, TensorTypes* out) const {
  const int32_t f = features_position(nb), r = rois_position(nb);
  if (f < 0 || !core_dtype(input_types[f], &out->features)) return false;
  int32_t first_index = -1;
  for (int32_t i = 0; i < nb; ++i) {
    if (!index_input(*variant_, i)) continue;
    if (!index_type(input_types[i]) || (first_index >= 0 && input_types[i] != input_types[first_index])) return false;
    if (first_index < 0) first_index = i;
  }
  out->int32_index = first_index >= 0 && input_types[first_index] == DataType::kINT32;
  out->rois = out->features;
  if (r < 0) return true;
  return rois_type_fits(input_types[r], input_types[f]) && core_dtype(input_types[r], &out->rois);
}

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

int32_t PluginBase::getNbOutputs() const noexcept { return static_cast<int32_t>(op_num_outputs(*variant_)); }

int32_t PluginBase::getOutputDataTypes(DataType* output_types, int32_t nb_outputs, const DataType* input_types,
                                       int32_t nb_inputs) const noexcept {
  const int32_t f = features_position(nb_inputs);
  if (f < 0 || nb_outputs != getNbOutputs()) return -1;
  for (int32_t i = 0; i < nb_outputs; ++i) output_types[i] = input_types[f];  // outputs follow the features
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

// TensorRT asks position by position and has fixed in_out[0 .. pos-1] when it asks about pos, so each answer
// looks back only: features (their first map) in a float type the launchers take, RoIs in the features' type
// or float32 (MultiLevelRoIAlign takes its RoIs first: any float type, checked against the maps at the first
// map), index tables in int32 or int64 (the first table fixes the type of the others), everything else in the
// features' type; linear (dense, row-major) only. No int8 (nor fp8) tensors: in an INT8 network (Q/DQ nodes,
// `dcnkit build --int8`) the plugin runs in float between TensorRT's DequantizeLinear and QuantizeLinear layers,
// which TensorRT places, with the reformats, around it.
bool PluginBase::supportsFormatCombination(int32_t pos, const DynamicPluginTensorDesc* in_out, int32_t nb_inputs,
                                           int32_t nb_outputs) noexcept {
  if (pos < 0 || pos >= nb_inputs + nb_outputs) return false;
  const PluginTensorDesc& d = in_out[pos].desc;
  if (d.format != TensorFormat::kLINEAR) return false;
  if (pos < nb_inputs && index_input(*variant_, pos)) {
    for (int32_t i = 0; i < pos; ++i)
      if (index_input(*variant_, i)) return d.type == in_out[i].desc.type;
    return index_type(d.type);
  }
  const int32_t f = features_position(nb_inputs), r = rois_position(nb_inputs);
  DType dt;
  if (f < 0) return false;
  if (pos == r) return r < f ? core_dtype(d.type, &dt) : rois_type_fits(d.type, in_out[f].desc.type);
  if (pos == f) return core_dtype(d.type, &dt) && (r < 0 || r > f || rois_type_fits(in_out[r].desc.type, d.type));
  return pos > f && d.type == in_out[f].desc.type;
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
    std::vector<DataType> types(static_cast<size_t>(nb_inputs > 0 ? nb_inputs : 0));
    for (int32_t i = 0; i < nb_inputs; ++i) types[i] = inputs[i].desc.type;
    TensorTypes t;
    CanonicalInputs ci;
    Status s = tensor_types(types.data(), nb_inputs, &t)
                   ? inputs_from(*variant_, inputs, nb_inputs, true, &ci)
                   : Status::Invalid("unsupported input types");
    if (!s.ok()) {
      // Without a size TensorRT provides no workspace; enqueue then refuses any call that needs one.
      log_error(where() + "getWorkspaceSize: " + s.message());
      return 0;
    }
    const size_t bytes = workspace_bound(ci, t);
    workspace_bound_ = std::max<int64_t>(workspace_bound_, static_cast<int64_t>(bytes));
    return bytes;
  } catch (const std::exception& e) {
    log_error(where() + "getWorkspaceSize: " + e.what());
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
    std::vector<DataType> types(static_cast<size_t>(present));
    for (int32_t i = 0; i < present; ++i) {
      dims[i] = input_desc[i].dims;
      types[i] = input_desc[i].type;
    }
    CanonicalInputs ci;
    TensorTypes t;
    Status s = tensor_types(types.data(), present, &t) ? canonical_inputs(*variant_, dims.data(), inputs, present, &ci)
                                                       : Status::Invalid("unsupported input types");
    if (s.ok()) s = check(ci);
    if (s.ok()) {
      const auto need = static_cast<int64_t>(workspace_needed(ci, t));
      if (need > 0 && workspace == nullptr) {
        s = Status::Invalid("enqueue: workspace: expected " + std::to_string(need) +
                            " bytes, got none (getWorkspaceSize returned 0 for this profile?)");
      } else if (workspace_bound_ >= 0 && need > workspace_bound_) {
        s = Status::Invalid("enqueue: workspace: expected " + std::to_string(need) + " bytes, got " +
                            std::to_string(workspace_bound_) + " (getWorkspaceSize of dims below these)");
      } else if (needs_blas() && gemm_ == nullptr) {
        // Not attached to an execution context (TensorRT may time a plugin while it builds): a handle of this
        // instance's own, taken once and released with the instance (trt_blas.h, keyed by the instance).
        gemm_ = acquire_context_gemm(this, &s);
        if (s.ok()) gemm_key_ = this;
      }
    }
    if (s.ok()) s = run(ci, t, outputs, workspace, stream);
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

IPluginV3* PluginBase::attachToContext(IPluginResourceContext* context) noexcept {
  PluginBase* copy = nullptr;
  try {
    copy = make_copy();
    if (needs_blas()) {
      Status s = context != nullptr ? Status::Ok() : Status::Invalid("attachToContext: no resource context");
      if (s.ok()) copy->gemm_ = acquire_context_gemm(context, &s);
      if (!s.ok()) {
        log_error(where() + s.message());
        delete copy;
        return nullptr;
      }
      copy->gemm_key_ = context;
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

namespace {

void append_value(const AttrDef& def, const AttrValue& v, std::string* out) {
  char buf[64];
  switch (def.kind) {
    case AttrKind::kInt:
    case AttrKind::kInts:
      for (int64_t x : v.ints) *out += std::to_string(x) + ",";
      return;
    case AttrKind::kFloat:
      std::snprintf(buf, sizeof(buf), "%a", v.f);  // exact: 0.25 and 0.2500001 are different kernels' work
      *out += buf;
      return;
    case AttrKind::kFloats:
      for (double x : v.floats) {
        std::snprintf(buf, sizeof(buf), "%a,", x);
        *out += buf;
      }
      return;
    case AttrKind::kString: *out += v.s; return;
  }
}

}  // namespace

// The op (not the variant: mmdeploy's MMCVRoiAlign and RoIAlign with the same attributes run the same kernel)
// and every canonical attribute value, defaults applied (an absent field and its default, mmdeploy's
// pool_mode 1 and "avg", a float-written sampling_ratio 2.0 and 2 are the same). TensorRT prefixes the I/O
// shapes, types and formats, so the RoIs' type (the float32-RoI launchers) is already told apart.
const char* PluginBase::getTimingCacheID() noexcept {
  try {
    const OpDef& def = variant_->op->def;
    const std::vector<AttrValue>& values = attrs_.values;
    std::string id = std::string("dcnkit.") + def.onnx_type;
    for (size_t i = 0; i < def.num_attrs && i < values.size(); ++i) {
      id += std::string(";") + def.attrs[i].name + "=";
      append_value(def.attrs[i], values[i], &id);
    }
    timing_cache_id_ = std::move(id);
    return timing_cache_id_.c_str();
  } catch (const std::exception& e) {
    log_error(where() + "getTimingCacheID: " + e.what());
    return nullptr;  // no timing caching for this layer
  }
}

}  // namespace dcnkit::trt
