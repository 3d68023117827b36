#include "ov_op.h"

#include <memory>
#include <sstream>

#include "dcnkit/deform_conv2d.h"
#include "openvino/core/attribute_visitor.hpp"
#include "openvino/core/op_extension.hpp"
#include "openvino/op/constant.hpp"
#include "ov_run.h"

namespace dcnkit::ov_ext {

const OpVariant& canonical_variant(OpKind kind) {
  for (const OpVariant& v : op_variants()) {
    if (v.kind == kind && std::string(v.domain) == kOnnxDomain) return v;
  }
  OPENVINO_THROW("dcnkit: no canonical variant for op kind ", static_cast<int>(kind));
}

KitOpBase::KitOpBase(OpKind kind) : kind_(kind) {
  const OpDef& def = op_def(kind);
  for (size_t i = 0; i < def.num_attrs; ++i) values_.push_back(parse_default(def.attrs[i]));
  for (size_t i = 0; i < def.num_inputs; ++i) slots_.push_back(static_cast<int64_t>(i));
  num_outputs_ = static_cast<int64_t>(def.num_outputs);
}

KitOpBase::KitOpBase(OpKind kind, const ov::OutputVector& args, std::vector<int64_t> slots,
                     std::vector<AttrValue> values, int64_t num_outputs)
    : ov::op::Op(args), kind_(kind), values_(std::move(values)), slots_(std::move(slots)), num_outputs_(num_outputs) {}

void KitOpBase::copy_config_from(const KitOpBase& other) {
  values_ = other.values_;
  slots_ = other.slots_;
  num_outputs_ = other.num_outputs_;
  constant_weight_ = other.constant_weight_;
}

std::string KitOpBase::where() const {
  return std::string(op_def(kind_).onnx_type) + " node '" + get_friendly_name() + "': ";
}

bool KitOpBase::visit_attributes(ov::AttributeVisitor& visitor) {
  const OpDef& def = op_def(kind_);
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
  return true;
}

namespace {

// The shape an output dim takes from input `slot`'s dim `d` (dynamic when that input is absent or of unknown rank).
ov::Dimension dim_of(const std::vector<const ov::PartialShape*>& in, int slot, int64_t d) {
  const ov::PartialShape* s = slot >= 0 && static_cast<size_t>(slot) < in.size() ? in[slot] : nullptr;
  if (s == nullptr || s->rank().is_dynamic() || s->rank().get_length() <= d) return ov::Dimension::dynamic();
  return (*s)[d];
}

// The output shape where some input dims are not known yet (dynamic batch, RoI count, map sizes): each dim from
// the input that fixes it (the same rules make_params checks once the shapes are known).
ov::PartialShape partial_output_shape(OpKind kind, const OpAttrs& a, const std::vector<const ov::PartialShape*>& in) {
  switch (kind) {
    case OpKind::kDeformConv2d:
      return {dim_of(in, kDcInput, 0), dim_of(in, kDcWeight, 0), dim_of(in, kDcOffset, 2), dim_of(in, kDcOffset, 3)};
    case OpKind::kRoIAlign:
      return {dim_of(in, kRaRois, 0), dim_of(in, kRaInput, 1), a.roi.pooled_h, a.roi.pooled_w};
    case OpKind::kDeformRoIPool:
      return {dim_of(in, kDrRois, 0), dim_of(in, kDrInput, 1), a.droi.pooled_h, a.droi.pooled_w};
    case OpKind::kDeformPSRoIPool:
      return {dim_of(in, kPsRois, 0), a.psroi.output_dim, a.psroi.output_size, a.psroi.output_size};
    case OpKind::kMultiLevelRoIAlign:
      return {dim_of(in, kMlRois, 0), dim_of(in, kMlFeatures, 1), a.mlroi.pooled_h, a.mlroi.pooled_w};
    case OpKind::kMultiScaleDeformableAttention:
      return {dim_of(in, kMsdaValue, 0), dim_of(in, kMsdaLocations, 1),
              dim_of(in, kMsdaValue, 2) * dim_of(in, kMsdaValue, 3)};
    case OpKind::kDCNv3:
    case OpKind::kDCNv4:
      return {dim_of(in, kD3Input, 0), dim_of(in, kD3Offset, 1), dim_of(in, kD3Offset, 2), dim_of(in, kD3Input, 3)};
  }
  return ov::PartialShape::dynamic();
}

}  // namespace

void KitOpBase::validate_and_infer_types() {
  const OpDef& def = op_def(kind_);
  const OpVariant& variant = canonical_variant(kind_);
  NODE_VALIDATION_CHECK(this, slots_.size() == get_input_size(), where(), "dcnkit_inputs: expected ",
                        get_input_size(), " canonical input indices (one per input), got ", slots_.size());
  Status s = make_op_attrs(variant, values_, &attrs_);
  NODE_VALIDATION_CHECK(this, s.ok(), where(), s.message());

  // The inputs by canonical index (the first map of MultiLevelRoIAlign's variadic input), and whether every shape
  // is known.
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
      continue;
    }
    NODE_VALIDATION_CHECK(this, is_kernel_float_type(got), where(), def.inputs[slot].name,
                          ": expected element type f32 (or f16 / bf16), got ", got.get_type_name());
    NODE_VALIDATION_CHECK(this, float_type.is_dynamic() || got == float_type, where(), def.inputs[slot].name,
                          ": expected element type ", float_type.get_type_name(),
                          " (the type of the other inputs), got ", got.get_type_name());
    float_type = got;
  }
  ov::PartialShape out = partial_output_shape(kind_, attrs_, by_slot);
  if (all_static) {  // the core checks every shape and gives the exact output shape
    std::vector<Shape> in(get_input_size());
    for (size_t i = 0; i < in.size(); ++i) {
      const ov::Shape st = shapes[i].to_shape();
      in[i].assign(st.begin(), st.end());
    }
    Shape y;
    s = output_shape(*this, in, &y);
    NODE_VALIDATION_CHECK(this, s.ok(), where(), s.message());
    out = ov::PartialShape(std::vector<ov::Dimension>(y.begin(), y.end()));
  }
  const int64_t n_out = std::max<int64_t>(1, std::min<int64_t>(num_outputs_, static_cast<int64_t>(def.num_outputs)));
  set_output_size(static_cast<size_t>(n_out));
  const ov::element::Type out_type = float_type.is_dynamic() ? ov::element::f32 : float_type;
  for (int64_t o = 0; o < n_out; ++o) set_output_type(static_cast<size_t>(o), out_type, out);
  note_constant_weight();
}

void KitOpBase::note_constant_weight() {
  if (kind_ != OpKind::kDeformConv2d) return;
  for (size_t i = 0; i < get_input_size(); ++i) {
    if (slots_[i] == kDcWeight && std::dynamic_pointer_cast<ov::op::v0::Constant>(get_input_node_shared_ptr(i))) {
      constant_weight_ = true;
    }
  }
}

std::shared_ptr<const std::vector<float>> KitOpBase::weight_kc(const float* weight, const Shape& shape) const {
  if (!constant_weight_ || weight == nullptr || shape.size() != 4) return nullptr;
  const int64_t cout = shape[0], cin_g = shape[1], kk = shape[2] * shape[3];
  if (cout <= 0 || cin_g <= 0 || kk <= 0) return nullptr;
  std::lock_guard<std::mutex> lock(weight_mutex_);
  if (!weight_kc_ || weight_kc_->source != weight || weight_kc_->shape != shape) {
    auto packed = std::make_shared<PackedWeight>();
    packed->source = weight;
    packed->shape = shape;
    packed->data.resize(static_cast<size_t>(cout * cin_g * kk));
    deform_conv2d_weight_kc_cpu<float>(cout, cin_g, kk, weight, packed->data.data());
    weight_kc_ = std::move(packed);
  }
  return std::shared_ptr<const std::vector<float>>(weight_kc_, &weight_kc_->data);
}

bool KitOpBase::evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const {
  const Status s = run_cpu(*this, outputs, inputs);
  if (!s.ok()) OPENVINO_THROW(where(), s.message());
  return true;
}

std::shared_ptr<ov::Node> make_kit_op(OpKind kind, const ov::OutputVector& args, std::vector<int64_t> slots,
                                      std::vector<AttrValue> values, int64_t num_outputs) {
  switch (kind) {
#define DCNKIT_OV_CASE(K) \
  case K: return std::make_shared<KitOp<K>>(args, std::move(slots), std::move(values), num_outputs);
    DCNKIT_OV_CASE(OpKind::kDeformConv2d)
    DCNKIT_OV_CASE(OpKind::kRoIAlign)
    DCNKIT_OV_CASE(OpKind::kDeformRoIPool)
    DCNKIT_OV_CASE(OpKind::kDeformPSRoIPool)
    DCNKIT_OV_CASE(OpKind::kMultiLevelRoIAlign)
    DCNKIT_OV_CASE(OpKind::kMultiScaleDeformableAttention)
    DCNKIT_OV_CASE(OpKind::kDCNv3)
    DCNKIT_OV_CASE(OpKind::kDCNv4)
#undef DCNKIT_OV_CASE
  }
  OPENVINO_THROW("dcnkit: unknown op kind ", static_cast<int>(kind));
}

std::vector<ov::Extension::Ptr> op_extensions() {
  return {std::make_shared<ov::OpExtension<KitOp<OpKind::kDeformConv2d>>>(),
          std::make_shared<ov::OpExtension<KitOp<OpKind::kRoIAlign>>>(),
          std::make_shared<ov::OpExtension<KitOp<OpKind::kDeformRoIPool>>>(),
          std::make_shared<ov::OpExtension<KitOp<OpKind::kDeformPSRoIPool>>>(),
          std::make_shared<ov::OpExtension<KitOp<OpKind::kMultiLevelRoIAlign>>>(),
          std::make_shared<ov::OpExtension<KitOp<OpKind::kMultiScaleDeformableAttention>>>(),
          std::make_shared<ov::OpExtension<KitOp<OpKind::kDCNv3>>>(),
          std::make_shared<ov::OpExtension<KitOp<OpKind::kDCNv4>>>()};
}

}  // namespace dcnkit::ov_ext
