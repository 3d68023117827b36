// The declaration of an operator: everything an adapter (PyTorch, ONNX Runtime, TensorRT, the exporter, the ONNX
// schemas, the precision rules, the reference runner, Polygraphy) needs to know about it, in one place per op
// (plugins/core/ops/<op>.cpp). The adapters read the table of declarations (op_table()) and never name an op.
//
// A declaration holds
//   - the op's names: snake_case (torch op, Python function), CamelCase (ONNX op type in the "dcnkit" domain,
//     TensorRT plugin), and other tools' names with their own input orders and attribute names (OpVariant:
//     mmcv, mmdeploy, InternImage, TensorRT's plugin names);
//   - inputs and outputs with their type rules (TensorDef: the features' type, RoIs that may stay float32 with
//     16-bit features, int64 index tables; which inputs get a gradient);
//   - attributes with kinds and defaults (AttrDef), checked once per node (check);
//   - the entry points: output shapes (concrete and symbolic), workspace, and the forward and backward
//     launchers on the CPU and on CUDA; whether its launchers run a GEMM;
//   - the torch schema of its op and of its backward op.
// See docs/architecture.md for how to add an operator.
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include "dcnkit/common.h"
#include "dcnkit/context.h"
#include "dcnkit/op_defs.h"

namespace dcnkit {

// Inputs and outputs of any op (canonical order): upper bounds for fixed-size arrays of them.
constexpr size_t kMaxInputs = 8;
constexpr size_t kMaxOutputs = 4;
// Tensors a variadic last input takes at most (MultiLevelRoIAlign's maps: kMaxFeatureLevels).
constexpr int kMaxVariadic = 8;

// ---------------------------------------------------------------------------------------------
// Attribute values

// A canonical attribute value: ints (also for kInt, one element), float, floats or string.
struct AttrValue {
  std::vector<int64_t> ints;
  double f = 0.0;
  std::string s;
  std::vector<double> floats;
  int64_t i() const { return ints.empty() ? 0 : ints[0]; }
  int64_t at(size_t k) const { return k < ints.size() ? ints[k] : 0; }
};

// The default of an AttrDef ("1", "[1, 1]", "0.1", "avg").
AttrValue parse_default(const AttrDef& d);

// ---------------------------------------------------------------------------------------------
// Other names of an op (what other tools export), mapped onto its canonical interface

// An attribute of a variant: its name in the model, the canonical attribute (AttrDef name) it sets, and which
// element of a canonical `ints` attribute (-1: the whole value). `enum_values` ("max|avg"): the variant writes an int
// that selects the i-th of these names of a canonical string attribute (mmdeploy's MMCVMultiLevelRoiAlign pool_mode).
struct AttrAlias {
  const char* onnx_name;
  const char* canonical;
  int element;
  const char* enum_values = nullptr;
};

// One node input of a variant: the canonical input (TensorDef index) it carries, whether the variant declares it
// optional, and whether it is variadic (the last slot only: one or more tensors of the canonical input).
struct InputSlot {
  int canonical;
  bool optional;
  bool variadic = false;
};

struct OpDecl;

struct OpVariant {
  const char* domain;
  const char* op_type;
  const OpDecl* op;
  std::vector<InputSlot> inputs;
  std::vector<AttrAlias> aliases;  // empty: the canonical names and kinds of the OpDef
  bool empty_input_is_absent;      // mmcv convention: a 0-element optional input means "none"
  bool loose_attrs;                // accept int for ints (broadcast), 1-element ints, float-valued ints,
                                   // and 4-element symmetric paddings (mmdeploy DeformConv2d)
  bool tensorrt_only = false;      // a TensorRT plugin name only (domain ""): the ONNX Runtime library skips it
  bool per_head_output = false;    // MultiScaleDeformableAttention: output (N, Lq, M, D), not (N, Lq, M*D)
                                   // (TensorRT's MultiscaleDeformableAttnPlugin_TRT; the same memory)
  bool onnx_standard = false;      // ONNX's own op (domain ""): 4-element paddings are ONNX pads [t, l, b, r]
                                   // (symmetric only); the ONNX Runtime library registers it where ONNX Runtime
                                   // has no kernel of its own (from its opset 19), TensorRT's parser and
                                   // OpenVINO's importer take it natively
  int kernel_shape_of = -1;        // >= 0: an optional `kernel_shape` attribute (ONNX's DeformConv) must equal the
                                   // last two dims of this canonical input (W), checked on every run
};

// The canonical input slots of an op (its own order, optional and variadic as declared).
std::vector<InputSlot> canonical_inputs(const OpDef& d);

// ---------------------------------------------------------------------------------------------
// A call

// The shapes of one call's canonical inputs.
struct OpShapes {
  const Shape* in[kMaxInputs] = {};  // null: absent; a variadic input: its first tensor
  std::vector<Shape> variadic;       // every tensor of a variadic last input, in node order
};

struct OpCall {
  const char* op = "";                 // the name errors carry (the node's op type, the torch op)
  const OpDecl* decl = nullptr;        // the op
  const OpVariant* variant = nullptr;  // the name the model used (null: the op itself)
  const AttrValue* attrs = nullptr;    // canonical attribute values, in the table's order
  OpShapes shapes;
};

// The element types of a call.
struct OpTypes {
  DType dtype = DType::kFloat32;  // the features': every floating tensor but the RoIs
  DType rois = DType::kFloat32;   // the RoIs' (TensorDef::rois): dtype, or float32 with 16-bit features
  bool int32_index = false;       // index tables (TensorDef::int64) in int32 (TensorRT) rather than int64
};

// The buffers of a call (canonical order).
struct OpBuffers {
  const void* in[kMaxInputs] = {};
  std::vector<const void*> variadic;
  void* out[kMaxOutputs] = {};  // every output (an adapter gives scratch for one the model does not want)
  // A constant input already in the launcher's layout (OpEntry::pack, made once per node), or null.
  const void* packed[kMaxInputs] = {};
  // That input also packed by the front end's CPU GEMM (OpEntry::gemm_operand, GemmArgs::a_packed), or null.
  const void* gemm_packed[kMaxInputs] = {};
  // Backward only.
  const void* grad_out[kMaxOutputs] = {};  // gradients of the outputs with TensorDef::grad
  void* grad_in[kMaxInputs] = {};          // gradients of the inputs with TensorDef::grad (null: not wanted)
  std::vector<void*> grad_variadic;
  void* workspace = nullptr;
};

// Where a call runs: exactly one of the two contexts.
struct OpDevice {
  const CpuContext* cpu = nullptr;
  const CudaContext* cuda = nullptr;
  bool device_asserts = false;  // CUDA: bad device data (a RoI's batch index) raises a device-side assert (torch)
};

// Symbolic dimensions (TensorRT's IDimensionExpr; the ONNX schemas' known / named / unknown dims), for the rules
// that give an op's output dims. The same interface as the core's integer rules (IntArith, deform_conv2d.h).
struct DimArith {
  using Value = const void*;
  virtual ~DimArith() = default;
  virtual Value constant(int64_t v) = 0;
  virtual Value add(Value x, Value y) = 0;
  virtual Value sub(Value x, Value y) = 0;
  virtual Value mul(Value x, Value y) = 0;
  virtual Value floor_div(Value x, Value y) = 0;  // y > 0
  // One dim found two ways that a checked call has equal (a rule's result, an input's dim the contract ties to it):
  // x where its value is known, else y where that is (or, for the ONNX schemas, named), else x.
  virtual Value either(Value x, Value /*y*/) { return x; }
};

// Input dims for the rules (canonical order; rank -1: absent).
struct OpDims {
  const DimArith::Value* in[kMaxInputs] = {};
  int rank[kMaxInputs] = {-1, -1, -1, -1, -1, -1, -1, -1};
  int variadic_count = 0;  // tensors of a variadic last input (their dims: the first's)
  DimArith::Value out[kMaxOutputs][8] = {};
  int out_rank[kMaxOutputs] = {};
};

// Dim k of canonical input i of the call where it is known and positive, else 0 (the per-dimension maxima that
// workspace_bound gets may be anything).
inline int64_t known_dim(const OpCall& c, int i, size_t k) {
  const Shape* s = c.shapes.in[i];
  return s != nullptr && k < s->size() && (*s)[k] > 0 ? (*s)[k] : int64_t(0);
}

// A RoI pooling op's sizes for workspace_bound: batch, channels, height, width of its (N, C, H, W) feature map and
// num_rois of its (K, ...) RoIs, each as known_dim gives it.
template <typename P>
void known_roi_pool_dims(const OpCall& c, int features, int rois, P* p) {
  p->batch = known_dim(c, features, 0);
  p->channels = known_dim(c, features, 1);
  p->height = known_dim(c, features, 2);
  p->width = known_dim(c, features, 3);
  p->num_rois = known_dim(c, rois, 0);
}

// The output dims of a RoI pooling op, (K, C, oh, ow), from its 4-D feature map and 2-D RoIs (canonical inputs).
Status roi_pool_output_dims(const OpCall& c, int features, int rois, int64_t oh, int64_t ow, DimArith& a,
                            OpDims* d);

// ---------------------------------------------------------------------------------------------
// The declaration

enum class Pass : int { kForward = 0, kBackward = 1 };

// Type-erased entry points, made from an op's struct by op_entry<Op>() below.
struct OpEntry {
  Status (*check)(const char* op, const AttrValue* attrs) = nullptr;      // once per node: the attributes
  // A constant input (an initializer) in the launcher's layout, made once per node by the ONNX Runtime CPU kernels:
  // the bytes written to `out` (null: the size), 0 when the op has no such layout for input i.
  size_t (*pack)(const OpCall& c, int i, const void* data, DType dtype, void* out) = nullptr;
  // What pack writes for input i (at `packed`) as its launcher's GEMM operand A (GemmOperand), which the front end's
  // GEMM may pack once more into its own layout (OpBuffers::gemm_packed); false when it is not one.
  bool (*gemm_operand)(const OpCall& c, int i, const void* packed, GemmOperand* out) = nullptr;
  Status (*outputs)(const OpCall& c, Shape* out) = nullptr;               // checks the call; output shapes
  Status (*output_dims)(const OpCall& c, DimArith& a, OpDims* d) = nullptr;  // symbolic (c.shapes unused)
  size_t (*workspace)(const OpCall& c, Pass pass, const OpTypes& t, const OpDevice& dev) = nullptr;
  // TensorRT: workspace of every call whose dims are at most c.shapes in each dimension (one profile's maxima,
  // which need not form a consistent problem: bounded dimension by dimension, never through the shape checks).
  size_t (*workspace_bound)(const OpCall& c, const OpTypes& t) = nullptr;
  Status (*forward_cpu)(const OpCall& c, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) = nullptr;
  Status (*backward_cpu)(const OpCall& c, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) = nullptr;
  // CUDA entry points: set in the libraries built with CUDA (op tables compiled with DCNKIT_OP_CUDA), else null.
  Status (*forward_cuda)(const OpCall& c, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) = nullptr;
  Status (*backward_cuda)(const OpCall& c, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) = nullptr;
  // Whether the CUDA backward of this call has an atomic-free path (null: never; the torch op then reports torch's
  // "no deterministic implementation" under torch.use_deterministic_algorithms).
  bool (*deterministic)(const OpCall& c, DType dtype) = nullptr;
};

struct OpDecl {
  OpDef def;
  // The op's place in the table (op_table(), the JSON, the docs' tables): the order operators were added in.
  int order;
  // The torch ops (TORCH_LIBRARY dcnkit): the op, then its backward ("_<name>_backward"; null: none). Tensor
  // arguments carry the table's input names (a backward also takes grad_<output> and the outputs without a
  // gradient); scalars fill the table's attributes in order (an `ints` attribute as that many ints); an attribute
  // without an argument says whether the optional inputs are absent (DeformPSRoIPool's no_trans).
  const char* torch_schema;
  const char* torch_backward_schema;
  // Other names of the op, appended after the op's own (which op_variants() adds first).
  void (*variants)(const OpDecl* self, std::vector<OpVariant>* out);
  OpEntry entry;
};

// Every operator of this library (generated at build time from plugins/core/ops/*.cpp), by OpDecl::order.
const std::vector<const OpDecl*>& op_table();
// An op by snake_case name or ONNX op type; nullptr when unknown.
const OpDecl* find_op(const std::string& name);
// Every variant: each op under its own name (domain "dcnkit"), then the other names, in table order.
const std::vector<OpVariant>& op_variants();

// Index of an attribute / input of an op by name, checked at compile time by DCNKIT_INDEX (op_defs.h).
inline const AttrDef& attr_def(const OpDecl& op, int i) { return op.def.attrs[i]; }

// ---------------------------------------------------------------------------------------------
// Writing a declaration: an op's struct with
//   using Params;                                  the core params of a call
//   static Status params(const OpCall&, Params*);  attributes and shapes -> checked params
//   static void outputs(const OpCall&, const Params&, Shape*);  output shapes
//   static Status check(const char* op, const AttrValue*);                 (optional) node attributes
//   static size_t pack(const OpCall&, int input, const void*, DType, void* out);  (optional) constant inputs
//   static bool gemm_operand(const OpCall&, int input, const void* packed, GemmOperand*);  (optional, with pack)
//   static Status output_dims(const OpCall&, DimArith&, OpDims*);         (optional) symbolic output dims
//   static size_t workspace_cpu(const Params&, Pass, const OpTypes&, const CpuContext&);   (optional, else 0)
//   static size_t workspace_cuda(const Params&, Pass, const OpTypes&, const CudaContext&); (optional, else 0)
//   static size_t workspace_bound(const OpCall&, const OpTypes&);         (optional, else 0; CUDA)
//   static Status forward_cpu / backward_cpu / forward_cuda / backward_cuda(
//       const Params&, const OpTypes&, const OpBuffers&, const OpDevice&);  (each optional)
//   static bool deterministic(const Params&, DType);                       (optional)
// and DCNKIT_OP(name, order, Op, def, torch_schema, torch_backward_schema, variants) below.

namespace op_decl_detail {

template <typename Op, typename = void>
struct HasCheck : std::false_type {};
template <typename Op>
struct HasCheck<Op, std::void_t<decltype(&Op::check)>> : std::true_type {};
template <typename Op, typename = void>
struct HasPack : std::false_type {};
template <typename Op>
struct HasPack<Op, std::void_t<decltype(&Op::pack)>> : std::true_type {};
template <typename Op, typename = void>
struct HasGemmOperand : std::false_type {};
template <typename Op>
struct HasGemmOperand<Op, std::void_t<decltype(&Op::gemm_operand)>> : std::true_type {};
template <typename Op, typename = void>
struct HasDims : std::false_type {};
template <typename Op>
struct HasDims<Op, std::void_t<decltype(&Op::output_dims)>> : std::true_type {};
template <typename Op, typename = void>
struct HasWorkspaceCpu : std::false_type {};
template <typename Op>
struct HasWorkspaceCpu<Op, std::void_t<decltype(&Op::workspace_cpu)>> : std::true_type {};
template <typename Op, typename = void>
struct HasWorkspaceCuda : std::false_type {};
template <typename Op>
struct HasWorkspaceCuda<Op, std::void_t<decltype(&Op::workspace_cuda)>> : std::true_type {};
template <typename Op, typename = void>
struct HasBound : std::false_type {};
template <typename Op>
struct HasBound<Op, std::void_t<decltype(&Op::workspace_bound)>> : std::true_type {};
template <typename Op, typename = void>
struct HasBackward : std::false_type {};
template <typename Op>
struct HasBackward<Op, std::void_t<decltype(&Op::backward_cpu)>> : std::true_type {};
template <typename Op, typename = void>
struct HasDeterministic : std::false_type {};
template <typename Op>
struct HasDeterministic<Op, std::void_t<decltype(&Op::deterministic)>> : std::true_type {};

// The params of a call: every required input present, then the op's checks.
Status require_inputs(const OpCall& c);
template <typename Op>
Status params(const OpCall& c, typename Op::Params* p) {
  DCNKIT_RETURN_IF_ERROR(require_inputs(c));
  return Op::params(c, p);
}

template <typename Op>
Status outputs(const OpCall& c, Shape* out) {
  typename Op::Params p;
  DCNKIT_RETURN_IF_ERROR(params<Op>(c, &p));
  Op::outputs(c, p, out);
  return Status::Ok();
}

// The CUDA sizes are taken only where the table is compiled with its CUDA entry points (their launchers' library).
template <typename Op>
size_t workspace(const OpCall& c, Pass pass, const OpTypes& t, const OpDevice& dev) {
  typename Op::Params p;
  if (!params<Op>(c, &p).ok()) return 0;
  if (dev.cpu != nullptr) {
    if constexpr (HasWorkspaceCpu<Op>::value) return Op::workspace_cpu(p, pass, t, *dev.cpu);
    return 0;
  }
#ifdef DCNKIT_OP_CUDA
  if constexpr (HasWorkspaceCuda<Op>::value) {
    if (dev.cuda != nullptr) return Op::workspace_cuda(p, pass, t, *dev.cuda);
  }
#endif
  return 0;
}

template <typename Op, Status (*Fn)(const typename Op::Params&, const OpTypes&, const OpBuffers&, const OpDevice&)>
Status run(const OpCall& c, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
  typename Op::Params p;
  DCNKIT_RETURN_IF_ERROR(params<Op>(c, &p));
  return Fn(p, t, b, dev);
}

template <typename Op>
bool deterministic(const OpCall& c, DType dtype) {
  typename Op::Params p;
  return params<Op>(c, &p).ok() && Op::deterministic(p, dtype);
}

}  // namespace op_decl_detail

template <typename Op>
OpEntry op_entry() {
  namespace d = op_decl_detail;
  OpEntry e;
  if constexpr (d::HasCheck<Op>::value) e.check = &Op::check;
  if constexpr (d::HasPack<Op>::value) e.pack = &Op::pack;
  if constexpr (d::HasGemmOperand<Op>::value) e.gemm_operand = &Op::gemm_operand;
  e.outputs = &d::outputs<Op>;
  if constexpr (d::HasDims<Op>::value) e.output_dims = &Op::output_dims;
  e.workspace = &d::workspace<Op>;
  e.forward_cpu = &d::run<Op, &Op::forward_cpu>;
  if constexpr (d::HasBackward<Op>::value) e.backward_cpu = &d::run<Op, &Op::backward_cpu>;
#ifdef DCNKIT_OP_CUDA
  if constexpr (d::HasBound<Op>::value) e.workspace_bound = &Op::workspace_bound;
  e.forward_cuda = &d::run<Op, &Op::forward_cuda>;
  if constexpr (d::HasBackward<Op>::value) e.backward_cuda = &d::run<Op, &Op::backward_cuda>;
#endif
  if constexpr (d::HasDeterministic<Op>::value) e.deterministic = &d::deterministic<Op>;
  return e;
}

// Calls f(T{}) with the CPU launchers' type of `dtype` (float or double).
template <typename F>
Status dispatch_cpu(DType dtype, F&& f) {
  if (dtype == DType::kFloat32) return f(float{});
  if (dtype == DType::kFloat64) return f(double{});
  return Status::Invalid(std::string("input: expected float32 or float64 on the CPU, got ") + dtype_name(dtype));
}

template <typename T>
const T* in_ptr(const OpBuffers& b, int i) {
  return static_cast<const T*>(b.in[i]);
}
template <typename T>
T* out_ptr(const OpBuffers& b, int i) {
  return static_cast<T*>(b.out[i]);
}
template <typename T>
T* grad_ptr(const OpBuffers& b, int i) {
  return static_cast<T*>(b.grad_in[i]);
}

// Defines the op's declaration, op_decl_<name>(), which the generated table lists.
#define DCNKIT_OP(name, order, Op, def, torch_schema, torch_backward_schema, variants)                      \
  const ::dcnkit::OpDecl& op_decl_##name() {                                                               \
    static const ::dcnkit::OpDecl d{def, order, torch_schema, torch_backward_schema, variants,              \
                                    ::dcnkit::op_entry<Op>()};                                              \
    return d;                                                                                               \
  }

}  // namespace dcnkit
