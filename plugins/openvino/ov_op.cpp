#include "ov_op.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <sstream>
#include <utility>

#include "dcnkit/cpu_gemm.h"
#include "openvino/core/attribute_visitor.hpp"
#include "openvino/core/op_extension.hpp"
#include "openvino/op/constant.hpp"
#include "ov_run.h"

namespace dcnkit::ov_ext {

const OpVariant& canonical_variant(const OpDecl& op) {
  for (const OpVariant& v : op_variants()) {
    if (v.op == &op && std::string(v.domain) == kOnnxDomain) return v;
  }
  OPENVINO_THROW("dcnkit: no canonical variant for ", op.def.onnx_type);
}

const char* kit_op_type(int i) {
  const auto& table = op_table();
  return i >= 0 && static_cast<size_t>(i) < table.size() ? table[static_cast<size_t>(i)]->def.ir_type() : "";
}

KitOpBase::KitOpBase(int index) : op_(op_table().at(static_cast<size_t>(index))) {
  const OpDef& def = op_->def;
  for (size_t i = 0; i < def.num_attrs; ++i) values_.push_back(parse_default(def.attrs[i]));
  for (size_t i = 0; i < def.num_inputs; ++i) slots_.push_back(static_cast<int64_t>(i));
  num_outputs_ = static_cast<int64_t>(def.num_outputs);
}

KitOpBase::KitOpBase(int index, const ov::OutputVector& args, std::vector<int64_t> slots,
                     std::vector<AttrValue> values, int64_t num_outputs)
    : ov::op::Op(args),
      op_(op_table().at(static_cast<size_t>(index))),
      values_(std::move(values)),
      slots_(std::move(slots)),
      num_outputs_(num_outputs) {}

void KitOpBase::copy_config_from(const KitOpBase& other) {
  values_ = other.values_;
  slots_ = other.slots_;
  num_outputs_ = other.num_outputs_;
  empty_is_absent_ = other.empty_is_absent_;
  constant_ = other.constant_;
}

std::string KitOpBase::where() const { return std::string(op_->def.onnx_type) + " node '" + get_friendly_name() + "': "; }

bool KitOpBase::visit_attributes(ov::AttributeVisitor& visitor) {
  const OpDef& def = op_->def;
  for (size_t i = 0; i < def.num_attrs && i < values_.size(); ++i) {
    AttrValue& v = values_[i];
    switch (def.attrs[i].kind) {
      case AttrKind::kInt:
        v.ints.resize(1);
        visitor.on_attribute(def.attrs[i].name, v.ints[0]);
        break;
      case AttrKind::kInts: visitor.on_attribute(def.attrs[i].name, v.ints); break;
      case AttrKind::kFloat: visitor.on_attribute(def.attrs[i].name, v.f); break;
      case AttrKind::kFloats: {  // the IR writes float lists, not double ones (ONNX's are float32 anyway)
        std::vector<float> f(v.floats.begin(), v.floats.end());
        visitor.on_attribute(def.attrs[i].name, f);
        v.floats.assign(f.begin(), f.end());
        break;
      }
      case AttrKind::kString: visitor.on_attribute(def.attrs[i].name, v.s); break;
    }
  }
  visitor.on_attribute("dcnkit_inputs", slots_);
  visitor.on_attribute("dcnkit_outputs", num_outputs_);
  visitor.on_attribute("dcnkit_empty_is_absent", empty_is_absent_);
  return true;
}

namespace {

// OpenVINO's partial dimensions as the declarations' DimArith: the output rules of the op over the dims it has
// (a dynamic dim where an input's is not known).
class DimensionArith final : public DimArith {
 public:
  Value of(const ov::Dimension& d) {
    pool_.push_back(d);
    return &pool_.back();
  }
  static const ov::Dimension& dim(Value v) { return *static_cast<const ov::Dimension*>(v); }
  Value constant(int64_t v) override { return of(ov::Dimension(v)); }
  Value add(Value x, Value y) override { return of(dim(x) + dim(y)); }
  Value sub(Value x, Value y) override { return of(dim(x) - dim(y)); }
  Value mul(Value x, Value y) override { return of(dim(x) * dim(y)); }
  Value either(Value x, Value y) override { return dim(x).is_dynamic() && dim(y).is_static() ? y : x; }
  Value floor_div(Value x, Value y) override {
    const ov::Dimension &a = dim(x), &b = dim(y);
    if (!a.is_static() || !b.is_static() || b.get_length() <= 0) return of(ov::Dimension::dynamic());
    const int64_t q = a.get_length() / b.get_length();
    return of(ov::Dimension(q - ((a.get_length() % b.get_length() != 0 && a.get_length() < 0) ? 1 : 0)));
  }

 private:
  std::deque<ov::Dimension> pool_;
};

// The output shape where some input dims are not known yet (dynamic batch, RoI count, map sizes): the op's output
// rule on the dims there are (the same rule its checks use once the shapes are known).
ov::PartialShape partial_output_shape(const OpAttrs& a, const std::vector<const ov::PartialShape*>& in, size_t o) {
  const OpEntry& e = a.op().entry;
  if (e.output_dims == nullptr) return ov::PartialShape::dynamic();
  DimensionArith arith;
  OpDims d;
  std::vector<std::vector<DimArith::Value>> values(in.size());
  for (size_t c = 0; c < in.size() && c < kMaxInputs; ++c) {
    if (in[c] == nullptr || in[c]->rank().is_dynamic()) continue;
    for (const ov::Dimension& x : *in[c]) values[c].push_back(arith.of(x));
    d.in[c] = values[c].data();
    d.rank[c] = static_cast<int>(values[c].size());
  }
  if (!e.output_dims(op_call(a, OpShapes()), arith, &d).ok()) return ov::PartialShape::dynamic();
  std::vector<ov::Dimension> dims;
  for (int k = 0; k < d.out_rank[o]; ++k) dims.push_back(DimensionArith::dim(d.out[o][k]));
  return ov::PartialShape(dims);
}

// The rt_info key of OpenVINO's KeepConstPrecision attribute (its type name and version, "keep_const_precision" "0":
// transformations/rt_info/keep_const_precision.hpp, not among the wheel's headers): the CPU plugin's precision pass
// leaves a Constant that has it in its own type.
constexpr const char* kKeepConstPrecision = "keep_const_precision_0";

// An int64 table that is a Constant of the model stays int64 for the kit's kernel: the CPU plugin otherwise converts
// every int64 Constant to int32, saturating (a spatial shape of 2^32 + 2 would reach the kernel as 2^31 - 1). (A graph
// input it wraps to int32 before any operation sees it: python/dcnkit/runtime/openvino.py works around that.)
void keep_int64_constant(const std::shared_ptr<ov::Node>& node) {
  const auto constant = std::dynamic_pointer_cast<ov::op::v0::Constant>(node);
  if (constant && constant->get_element_type() == ov::element::i64) constant->get_rt_info()[kKeepConstPrecision] = true;
}

}  // namespace

void KitOpBase::validate_and_infer_types() {
  const OpDef& def = op_->def;
  const OpVariant& variant = canonical_variant(*op_);
  NODE_VALIDATION_CHECK(this, slots_.size() == get_input_size(), where(), "dcnkit_inputs: expected ",
                        get_input_size(), " canonical input indices (one per input), got ", slots_.size());
  Status s = make_op_attrs(variant, values_, &attrs_);
  NODE_VALIDATION_CHECK(this, s.ok(), where(), s.message());

  // The inputs by canonical index (the first tensor of a variadic input), and whether every shape is known.
  std::vector<const ov::PartialShape*> by_slot(def.num_inputs, nullptr);
  std::vector<ov::PartialShape> shapes(get_input_size());
  bool all_static = true;
  // The floating inputs share one type: float32, or float16 / bfloat16 where OpenVINO's precision hints convert the
  // graph around the node (the kernels compute in float32 then: ov_run.cpp).
  ov::element::Type float_type = ov::element::dynamic;
  for (size_t i = 0; i < get_input_size(); ++i) {
    const int64_t slot = slots_[i];
    NODE_VALIDATION_CHECK(this, slot >= 0 && static_cast<size_t>(slot) < def.num_inputs, where(),
                          "dcnkit_inputs: expected indices in [0, ", def.num_inputs, "), got ", slot);
    shapes[i] = get_input_partial_shape(i);
    if (by_slot[slot] == nullptr) by_slot[slot] = &shapes[i];
    all_static = all_static && shapes[i].is_static();
    const ov::element::Type got = get_input_element_type(i);
    if (got.is_dynamic()) continue;
    if (def.inputs[slot].int64) {  // the CPU plugin may hand int64 tables over as int32 (ov_run.cpp widens them)
      NODE_VALIDATION_CHECK(this, got == ov::element::i64 || got == ov::element::i32, where(), def.inputs[slot].name,
                            ": expected element type i64 (or i32), got ", got.get_type_name());
      keep_int64_constant(get_input_node_shared_ptr(i));
      continue;
    }
    NODE_VALIDATION_CHECK(this, is_kernel_float_type(got), where(), def.inputs[slot].name,
                          ": expected element type f32 (or f16 / bf16 / f64), got ", got.get_type_name());
    NODE_VALIDATION_CHECK(this, float_type.is_dynamic() || got == float_type, where(), def.inputs[slot].name,
                          ": expected element type ", float_type.get_type_name(),
                          " (the type of the other inputs), got ", got.get_type_name());
    float_type = got;
  }
  const int64_t n_out = std::max<int64_t>(1, std::min<int64_t>(num_outputs_, static_cast<int64_t>(def.num_outputs)));
  std::vector<ov::PartialShape> out(static_cast<size_t>(n_out));
  for (int64_t o = 0; o < n_out; ++o) out[o] = partial_output_shape(attrs_, by_slot, static_cast<size_t>(o));
  if (all_static) {  // the declaration checks every shape and gives the exact output shapes
    std::vector<Shape> in(get_input_size());
    for (size_t i = 0; i < in.size(); ++i) {
      const ov::Shape st = shapes[i].to_shape();
      in[i].assign(st.begin(), st.end());
    }
    std::vector<Shape> y;
    s = output_shapes(*this, in, &y);
    NODE_VALIDATION_CHECK(this, s.ok(), where(), s.message());
    for (int64_t o = 0; o < n_out; ++o) out[o] = ov::PartialShape(std::vector<ov::Dimension>(y[o].begin(), y[o].end()));
  }
  set_output_size(static_cast<size_t>(n_out));
  const ov::element::Type out_type = float_type.is_dynamic() ? ov::element::f32 : float_type;
  for (int64_t o = 0; o < n_out; ++o) set_output_type(static_cast<size_t>(o), out_type, out[o]);
  note_constant_inputs();
}

void KitOpBase::note_constant_inputs() {
  constant_.assign(op_->def.num_inputs, false);
  if (op_->entry.pack == nullptr) return;
  for (size_t i = 0; i < get_input_size(); ++i) {
    if (std::dynamic_pointer_cast<ov::op::v0::Constant>(get_input_node_shared_ptr(i))) constant_[slots_[i]] = true;
  }
}

std::shared_ptr<const std::vector<char>> KitOpBase::packed(int i, const void* data, const Shape& shape,
                                                           std::shared_ptr<const void>* gemm) const {
  const OpEntry& e = op_->entry;
  if (e.pack == nullptr || data == nullptr || i < 0 || static_cast<size_t>(i) >= constant_.size() || !constant_[i]) {
    return nullptr;
  }
  bool bf16 = false;
  if (!gemm_bf16(&bf16).ok()) bf16 = false;  // run_f32 reports a bad value before packing
  std::lock_guard<std::mutex> lock(packed_mutex_);
  std::shared_ptr<const Packed>& slot = packed_[i];
  if (!slot || slot->source != data || slot->shape != shape || slot->gemm_bf16 != bf16) {
    OpShapes shapes;
    shapes.in[i] = &shape;
    const OpCall call = op_call(attrs_, shapes);
    auto p = std::make_shared<Packed>();
    p->source = data;
    p->shape = shape;
    p->data.resize(e.pack(call, i, data, DType::kFloat32, nullptr));
    if (p->data.empty()) return nullptr;
    e.pack(call, i, data, DType::kFloat32, p->data.data());
    GemmOperand a;
    p->gemm_bf16 = bf16;
    if (e.gemm_operand && e.gemm_operand(call, i, p->data.data(), &a)) {
      p->gemm = bf16 ? cpu_gemm_pack_bf16(a) : cpu_gemm_pack(a);
    }
    slot = std::move(p);
  }
  if (gemm != nullptr) *gemm = slot->gemm;
  return std::shared_ptr<const std::vector<char>>(slot, &slot->data);
}

Status KitOpBase::gemm_bf16(bool* bf16) const {
  *bf16 = false;
  const ov::RTMap& rt = get_rt_info();
  const auto it = rt.find(kGemmPrecision);
  if (it == rt.end()) return Status::Ok();
  std::string value;
  try {
    value = it->second.as<std::string>();
  } catch (const std::exception&) {
    value = std::string("a value of type ") + it->second.type_info().name();
  }
  if (value != "f32" && value != "bf16") {
    return Status::Invalid(std::string("rt_info ") + kGemmPrecision + ": expected \"f32\" or \"bf16\", got \"" + value +
                           "\"");
  }
  *bf16 = value == "bf16";
  return Status::Ok();
}

bool KitOpBase::evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const {
  const Status s = run_cpu(*this, outputs, inputs);
  if (!s.ok()) {
    poison_outputs(outputs);
    OPENVINO_THROW(where(), s.message());
  }
  return true;
}

namespace {

template <int I>
std::shared_ptr<ov::Node> make_op(const ov::OutputVector& args, std::vector<int64_t> slots,
                                  std::vector<AttrValue> values, int64_t num_outputs) {
  return std::make_shared<KitOp<I>>(args, std::move(slots), std::move(values), num_outputs);
}

using MakeFn = std::shared_ptr<ov::Node> (*)(const ov::OutputVector&, std::vector<int64_t>, std::vector<AttrValue>,
                                             int64_t);

template <int... I>
std::vector<MakeFn> makers(std::integer_sequence<int, I...>) {
  return {&make_op<I>...};
}

template <int I>
ov::Extension::Ptr extension() {
  return std::make_shared<ov::OpExtension<KitOp<I>>>();
}

using ExtFn = ov::Extension::Ptr (*)();

template <int... I>
std::vector<ExtFn> extension_makers(std::integer_sequence<int, I...>) {
  return {&extension<I>...};
}

int index_of(const OpDecl& op) {
  const auto& table = op_table();
  for (size_t i = 0; i < table.size(); ++i)
    if (table[i] == &op) return static_cast<int>(i);
  return -1;
}

}  // namespace

std::shared_ptr<ov::Node> make_kit_op(const OpDecl& op, const ov::OutputVector& args, std::vector<int64_t> slots,
                                      std::vector<AttrValue> values, int64_t num_outputs) {
  static const std::vector<MakeFn> make = makers(std::make_integer_sequence<int, kMaxOps>());
  const int i = index_of(op);
  OPENVINO_ASSERT(i >= 0 && i < kMaxOps, "dcnkit: ", op.def.onnx_type, " is past the ", kMaxOps,
                  " operators the OpenVINO library serves (raise kMaxOps)");
  return make[static_cast<size_t>(i)](args, std::move(slots), std::move(values), num_outputs);
}

std::vector<ov::Extension::Ptr> op_extensions() {
  static const std::vector<ExtFn> make = extension_makers(std::make_integer_sequence<int, kMaxOps>());
  OPENVINO_ASSERT(op_table().size() <= make.size(), "dcnkit: the op table has more than ", kMaxOps,
                  " operators (raise kMaxOps)");
  std::vector<ov::Extension::Ptr> out;
  for (size_t i = 0; i < op_table().size(); ++i) out.push_back(make[i]());
  return out;
}

}  // namespace dcnkit::ov_ext
