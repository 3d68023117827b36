// TensorRT front end: IPluginV3 plugins over the core launchers.
//
// A plugin translates between TensorRT's types and the core: PluginFields <-> the op's attributes (read
// and checked by dcnkit/op_attrs.h, shared with the ONNX Runtime library), DimsExprs <-> the core's shape
// rules, PluginTensorDesc <-> pointers and dtype. Everything else (validation, workspace sizing, kernels)
// is core code that the other backends already run and test.
//
// One class serves every op of the table: the op's declaration (dcnkit/op_decl.h) supplies its output dims (over
// TensorRT's dimension expressions), checks, workspace and forward launcher; PluginBase does the IPluginV3
// lifecycle around them. No op is named here.
//
// Types: every tensor is in the features' type (float32, float16 or bfloat16), except the RoIs (TensorDef.rois),
// which may also be float32 with 16-bit features, and the index tables (TensorDef.int64), int64 or int32, all of one
// type.
#pragma once

#include <NvInferRuntime.h>

#include <deque>
#include <string>
#include <vector>

#include "dcnkit/common.h"
#include "dcnkit/op_attrs.h"

namespace dcnkit {
struct CublasGemm;
}

namespace dcnkit::trt {

// Logs through the logger TensorRT handed to setLoggerFinder, through the running TensorRT's ABI (stderr when there
// is none, or when this library does not serve the running release) (trt_log.cpp).
void log(nvinfer1::ILogger::Severity severity, const std::string& message);
void log_error(const std::string& message);
void set_logger_finder(void* finder);
// The running TensorRT's major where this library serves it; else 0, after one line on stderr (once per process)
// that names the release found, the releases served and `what` follows from it.
int served_running_major(const char* what);

// The namespace of the kit's own creators ("dcnkit"); mmdeploy's names live in "".
const char* plugin_namespace(const OpVariant& v);
constexpr const char* kPluginVersion = "1";

// ---------------------------------------------------------------------------------------------
// Fields

// A PluginFieldCollection that owns its names and data.
class FieldStore {
 public:
  void add(const char* name, nvinfer1::PluginFieldType type, const void* data, int32_t length, size_t bytes);
  const nvinfer1::PluginFieldCollection* collection();
  void clear();

 private:
  std::deque<std::string> names_;
  std::deque<std::vector<char>> data_;
  std::vector<nvinfer1::PluginField> fields_;
  nvinfer1::PluginFieldCollection fc_{};
};

// The fields a creator declares (names, types, lengths; no data): what the ONNX parser fills.
void declare_fields(const OpVariant& v, FieldStore* out);
// The fields of checked attrs in the variant's own naming (createPlugin(kRUNTIME) reads them back).
void serialize_fields(const OpVariant& v, const OpAttrs& attrs, FieldStore* out);
// Reads and checks the attrs from a field collection (absent fields take the op's defaults).
Status attrs_from_fields(const OpVariant& v, const nvinfer1::PluginFieldCollection* fc, OpAttrs* out);

// ---------------------------------------------------------------------------------------------
// Inputs in canonical order

// The node's inputs mapped onto the op's canonical inputs (op_defs.h order).
struct CanonicalInputs {
  Shape shape[kMaxInputs];
  const Shape* shapes[kMaxInputs] = {};  // null: absent
  const void* data[kMaxInputs] = {};
  // A variadic last input (MultiLevelRoIAlign's feature maps): every tensor it got, in node order;
  // shapes[c] / data[c] of its canonical index describe the first.
  std::vector<Shape> variadic_shape;
  std::vector<const void*> variadic_data;
};

// Node inputs a variant takes at most: its slots, with a variadic last slot taking up to kMaxVariadic.
int32_t max_node_inputs(const OpVariant& v);
// The variant's slot that node input i fills (the variadic last slot for every i past it).
const InputSlot& input_slot(const OpVariant& v, int32_t i);

// From TensorRT dims (nb node inputs); a 0-element optional input of an mmcv-style variant is absent.
Status canonical_inputs(const OpVariant& v, const nvinfer1::Dims* dims, void const* const* data, int32_t nb,
                        CanonicalInputs* out);

// DataType <-> the core's DType (float32, float16, bfloat16: the types the launchers take).
bool core_dtype(nvinfer1::DataType t, DType* out);

// The types of one call: the features' (and every other float tensor's), the RoIs' (= features, or float32
// with 16-bit features) and the index tables' (int64, or int32: widened into the workspace before the kernels).
struct TensorTypes {
  DType features = DType::kFloat32;
  DType rois = DType::kFloat32;
  bool int32_index = false;
  bool float32_rois() const { return rois != features; }
};
// Whether RoIs of type `rois` go with features of type `features` (the same type, or float32).
bool rois_type_fits(nvinfer1::DataType rois, nvinfer1::DataType features);
// Whether node input i of a layer of `v` is an index table (TensorDef.int64), and the types one may have.
bool index_input(const OpVariant& v, int32_t i);
inline bool index_type(nvinfer1::DataType t) {
  return t == nvinfer1::DataType::kINT32 || t == nvinfer1::DataType::kINT64;
}

// ---------------------------------------------------------------------------------------------
// The plugin

class PluginBase : public nvinfer1::IPluginV3,
                   public nvinfer1::IPluginV3OneCore,
                   public nvinfer1::IPluginV3OneBuild,
                   public nvinfer1::IPluginV3OneRuntime {
 public:
  PluginBase(const OpVariant* variant, const OpAttrs& attrs, std::string name);
  // A copy has the same op, attrs, name and workspace bound, and no cuBLAS handle (attachToContext takes one).
  PluginBase(const PluginBase& other);
  PluginBase& operator=(const PluginBase&) = delete;
  ~PluginBase() override;
  PluginBase* make_copy() const { return new PluginBase(*this); }

  // IPluginV3
  nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
  nvinfer1::IPluginV3* clone() noexcept override;

  // IPluginV3OneCore
  const char* getPluginName() const noexcept override;
  const char* getPluginVersion() const noexcept override;
  const char* getPluginNamespace() const noexcept override;

  // IPluginV3OneBuild
  int32_t configurePlugin(const nvinfer1::DynamicPluginTensorDesc* in, int32_t nb_inputs,
                          const nvinfer1::DynamicPluginTensorDesc* out, int32_t nb_outputs) noexcept override;
  int32_t getOutputDataTypes(nvinfer1::DataType* output_types, int32_t nb_outputs,
                             const nvinfer1::DataType* input_types, int32_t nb_inputs) const noexcept override;
  int32_t getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nb_inputs, const nvinfer1::DimsExprs* shape_inputs,
                          int32_t nb_shape_inputs, nvinfer1::DimsExprs* outputs, int32_t nb_outputs,
                          nvinfer1::IExprBuilder& builder) noexcept override;
  bool supportsFormatCombination(int32_t pos, const nvinfer1::DynamicPluginTensorDesc* in_out, int32_t nb_inputs,
                                 int32_t nb_outputs) noexcept override;
  int32_t getNbOutputs() const noexcept override;
  // From the op and its canonical attribute values (see trt_plugin.cpp); TensorRT adds the I/O shapes and types.
  const char* getTimingCacheID() noexcept override;
  size_t getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* inputs, int32_t nb_inputs,
                          const nvinfer1::DynamicPluginTensorDesc* outputs, int32_t nb_outputs) const noexcept override;

  // IPluginV3OneRuntime
  int32_t onShapeChange(const nvinfer1::PluginTensorDesc* in, int32_t nb_inputs, const nvinfer1::PluginTensorDesc* out,
                        int32_t nb_outputs) noexcept override;
  int32_t enqueue(const nvinfer1::PluginTensorDesc* input_desc, const nvinfer1::PluginTensorDesc* output_desc,
                  const void* const* inputs, void* const* outputs, void* workspace,
                  cudaStream_t stream) noexcept override;
  nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
  const nvinfer1::PluginFieldCollection* getFieldsToSerialize() noexcept override;

 protected:
  // The call of a node's inputs (canonical order, see CanonicalInputs) for the op's entry points.
  OpCall call(const CanonicalInputs& in) const;
  // Output dims from the inputs' dims expressions (canonical order, null: absent).
  Status output_shapes(const nvinfer1::DimsExprs* const* in, nvinfer1::IExprBuilder& b,
                       nvinfer1::DimsExprs* outputs) const;
  // Validates the shapes of one call (the op's declaration).
  Status check(const CanonicalInputs& in) const;
  // Workspace bytes of every call whose dims are at most `max_in` in each dimension. `max_in` is one
  // optimisation profile's maxima per input, which need not form a consistent problem (TensorRT takes each
  // input's range separately), so it is bounded dimension by dimension, never through the shape checks.
  size_t workspace_bound(const CanonicalInputs& max_in, const TensorTypes& t) const;
  // Workspace bytes of one checked call.
  size_t workspace_needed(const CanonicalInputs& in, const TensorTypes& t) const;
  // Runs the forward launcher on `stream` (never synchronises).
  Status run(const CanonicalInputs& in, const TensorTypes& t, void* const* outputs, void* workspace,
             cudaStream_t stream);
  // Whether the op runs a GEMM (OpDef::gemm; then attached instances share their context's cuBLAS handle).
  bool needs_blas() const { return variant_->op->def.gemm; }

  // The message prefix "<op_type> node '<name>': ".
  std::string where() const;
  // Number of node inputs the variant accepts: [min, max].
  int32_t min_inputs() const;
  int32_t max_inputs() const;
  // Node input positions (of a layer with nb inputs) of the first feature map and of the RoIs (-1: none).
  int32_t features_position(int32_t nb) const;
  int32_t rois_position(int32_t nb) const;
  // The types of a layer's inputs; false when they are not a supported combination.
  bool tensor_types(const nvinfer1::DataType* input_types, int32_t nb, TensorTypes* out) const;

  const OpVariant* variant_;
  OpAttrs attrs_;
  std::string name_;
  // The GEMM of the execution context this instance is attached to (ops with a GEMM only, see trt_blas.h):
  // shared with the context's other instances, taken in attachToContext, released with the instance. An instance
  // that enqueues unattached (TensorRT timing it during the build) takes one of its own on its first enqueue.
  CublasGemm* gemm_ = nullptr;
  const void* gemm_key_ = nullptr;
  int32_t nb_inputs_ = -1;  // the layer's input count, from onShapeChange (enqueue does not pass it)
  // The largest workspace this instance (or the one it was cloned from) returned from getWorkspaceSize
  // (-1: none): enqueue refuses a call that needs more. TensorRT does not tell a deserialized plugin the
  // size it provides, so there only a missing workspace is caught.
  mutable int64_t workspace_bound_ = -1;

 private:
  FieldStore serialized_;
  std::string timing_cache_id_;
};

// The plugin of `variant`'s op, with checked attrs (creators call it).
PluginBase* make_plugin(const OpVariant* variant, const OpAttrs& attrs, const std::string& name);

}  // namespace dcnkit::trt
