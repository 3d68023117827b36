// OpenVINO front end: the kit's operators as OpenVINO operations (ov::op::Op) computed by the core's CPU launchers.
//
// One class template, KitOp<OpKind>, serves every operator of the op table: its type name is the op's ONNX type
// (op_defs.h) in the opset "dcnkit", its attributes are the canonical ones (names, kinds and defaults from the
// table, so an IR written by `dcnkit convert` names them as docs/operators.md does), and what it computes is the
// launcher of its kind. A node holds:
//   - the canonical attribute values (read from any variant by read_attrs, checked by make_op_attrs),
//   - `dcnkit_inputs`: the canonical input (TensorDef index) each of its inputs carries (absent optional inputs
//     are left out; MultiLevelRoIAlign's feature maps repeat the variadic index),
//   - `dcnkit_outputs`: how many outputs (DeformPSRoIPool: output and count).
// Shapes are checked by the core's make_params wherever the input shapes are static (validate_and_infer_types and
// every evaluate), so a mistake reads the same as on every other backend.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dcnkit/op_attrs.h"
#include "openvino/core/extension.hpp"
#include "openvino/op/op.hpp"

namespace dcnkit::ov_ext {

constexpr const char* kOpset = "dcnkit";  // the IR opset (version) of every kit operation

// The kit's own variant (domain "dcnkit", canonical names and input order) of an op kind.
const OpVariant& canonical_variant(OpKind kind);

class KitOpBase : public ov::op::Op {
 public:
  bool visit_attributes(ov::AttributeVisitor& visitor) override;
  void validate_and_infer_types() override;
  bool has_evaluate() const override { return true; }
  bool evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const override;

  OpKind kind() const { return kind_; }
  const OpAttrs& attrs() const { return attrs_; }
  const std::vector<int64_t>& slots() const { return slots_; }
  // DeformConv2d whose weight is a constant of the model: that weight in the launcher's layout, made on the first
  // run from `weight` (the constant's memory, which the plugin keeps) and kept; null for a weight that is an input.
  std::shared_ptr<const std::vector<float>> weight_kc(const float* weight, const Shape& weight_shape) const;

 protected:
  explicit KitOpBase(OpKind kind);
  KitOpBase(OpKind kind, const ov::OutputVector& args, std::vector<int64_t> slots, std::vector<AttrValue> values,
            int64_t num_outputs);
  // The same op over new inputs (clone_with_new_inputs of the derived class).
  void copy_config_from(const KitOpBase& other);

  OpKind kind_;
  std::vector<AttrValue> values_;  // canonical attribute values, in op_defs order
  std::vector<int64_t> slots_;     // canonical input index of each input
  int64_t num_outputs_ = 1;
  OpAttrs attrs_;                  // from values_, checked
  // DeformConv2d: whether the weight input is a Constant of the model (seen when the node was made: the plugin's
  // copies may see other nodes there), and the weight in the launcher's layout, made once.
  bool constant_weight_ = false;
  struct PackedWeight {
    const float* source = nullptr;
    Shape shape;
    std::vector<float> data;
  };
  mutable std::mutex weight_mutex_;
  mutable std::shared_ptr<const PackedWeight> weight_kc_;

 private:
  std::string where() const;  // "<op type> node '<name>': " for messages
  void note_constant_weight();
};

template <OpKind K>
class KitOp : public KitOpBase {
 public:
  OPENVINO_OP(kOpDefs[static_cast<int>(K)].onnx_type, kOpset, KitOpBase);
  KitOp() : KitOpBase(K) {}
  KitOp(const ov::OutputVector& args, std::vector<int64_t> slots, std::vector<AttrValue> values, int64_t num_outputs)
      : KitOpBase(K, args, std::move(slots), std::move(values), num_outputs) {
    constructor_validate_and_infer_types();
  }
  std::shared_ptr<ov::Node> clone_with_new_inputs(const ov::OutputVector& new_args) const override {
    auto op = std::make_shared<KitOp<K>>();
    op->set_arguments(new_args);
    op->copy_config_from(*this);
    op->constructor_validate_and_infer_types();
    return op;
  }
};

// A kit operation of `kind` over `args` (one per entry of `slots`), with canonical attribute values.
std::shared_ptr<ov::Node> make_kit_op(OpKind kind, const ov::OutputVector& args, std::vector<int64_t> slots,
                                      std::vector<AttrValue> values, int64_t num_outputs);

// Every KitOp<K> as an OpExtension (IR reading and writing), in op_defs order.
std::vector<ov::Extension::Ptr> op_extensions();

}  // namespace dcnkit::ov_ext
