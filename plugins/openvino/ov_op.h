// OpenVINO front end: the kit's operators as OpenVINO operations (ov::op::Op) computed by the core's CPU launchers.
//
// One class template, KitOp<I>, serves the I-th operator of the op table (op_table(), dcnkit/op_decl.h): its type
// name is the op's ONNX type (or its declared OpDef::openvino_type) in the opset "dcnkit", its attributes are the canonical ones (names, kinds and defaults
// from the table, so an IR written by `dcnkit convert` names them as docs/operators.md does), and what it computes is
// the op's forward_cpu entry point. No operator is named here. A node holds:
//   - the canonical attribute values (read from any variant by read_attrs, checked by make_op_attrs),
//   - `dcnkit_inputs`: the canonical input (TensorDef index) each of its inputs carries (absent optional inputs
//     are left out; a variadic input's tensors repeat its index),
//   - `dcnkit_outputs`: how many outputs (DeformPSRoIPool: output and count),
//   - `dcnkit_empty_is_absent`: a bit per canonical input that is "none" when empty (mmcv's optional inputs).
// Shapes are checked by the op's declaration wherever the input shapes are static (validate_and_infer_types and
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
// Operators the library can serve (KitOp<0> .. KitOp<kMaxOps - 1>); the table has fewer.
constexpr int kMaxOps = 32;
// The rt_info entry by which the OpenVINO backend tells a node the precision of its GEMM, from the precision the model
// is compiled with (python/dcnkit/runtime/openvino.py): "f32" (also where absent) or "bf16" (the constant weight packed
// as bfloat16 for oneDNN's bf16 matmul, cpu_gemm_pack_bf16). Set before compile_model; the CPU plugin's copy of the
// model keeps a node's rt_info.
constexpr const char* kGemmPrecision = "dcnkit_gemm_precision";

// The kit's own variant (domain "dcnkit", canonical names and input order) of an op.
const OpVariant& canonical_variant(const OpDecl& op);
// The op type of the table's I-th op ("" past its end).
const char* kit_op_type(int i);

class KitOpBase : public ov::op::Op {
 public:
  bool visit_attributes(ov::AttributeVisitor& visitor) override;
  void validate_and_infer_types() override;
  bool has_evaluate() const override { return true; }
  bool evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const override;

  const OpDecl& op() const { return *op_; }
  const OpAttrs& attrs() const { return attrs_; }
  const std::vector<int64_t>& slots() const { return slots_; }
  int64_t num_outputs() const { return num_outputs_; }
  // Whether canonical input `slot`, when it has zero elements, is no input (the mmcv / mmdeploy names' convention
  // for their optional inputs, OpVariant::empty_input_is_absent): the conversion drops such an input where its shape
  // is known; where it turns out empty only when the node runs (dynamic shapes), the run leaves it out, as ONNX
  // Runtime does. `mask`: bit i for canonical input i.
  bool empty_input_is_absent(int64_t slot) const { return slot >= 0 && slot < 63 && ((empty_is_absent_ >> slot) & 1); }
  void set_empty_inputs_absent(int64_t mask) { empty_is_absent_ = mask; }
  // A constant input of the model (canonical input i) in the launcher's layout (OpEntry::pack), made on the first run
  // from `data` (the constant's memory, which the plugin keeps) and kept; null where the op has no such layout or the
  // input is not a constant.
  // With it, `gemm` is set to the same packed once more by the CPU GEMM (cpu_gemm_pack; null where it does not pack).
  std::shared_ptr<const std::vector<char>> packed(int i, const void* data, const Shape& shape,
                                                  std::shared_ptr<const void>* gemm = nullptr) const;
  // Whether the rt_info entry kGemmPrecision asks for a bf16 GEMM; an error naming it for a value not "f32" / "bf16".
  Status gemm_bf16(bool* bf16) const;

 protected:
  explicit KitOpBase(int index);
  KitOpBase(int index, const ov::OutputVector& args, std::vector<int64_t> slots, std::vector<AttrValue> values,
            int64_t num_outputs);
  // The same op over new inputs (clone_with_new_inputs of the derived class).
  void copy_config_from(const KitOpBase& other);

  const OpDecl* op_;
  std::vector<AttrValue> values_;  // canonical attribute values, in the table's order
  std::vector<int64_t> slots_;     // canonical input index of each input
  int64_t num_outputs_ = 1;
  int64_t empty_is_absent_ = 0;    // IR attribute dcnkit_empty_is_absent, a bit per canonical input (older IR: 0)
  OpAttrs attrs_;                  // from values_, checked
  // The canonical inputs that are Constants of the model (seen when the node was made: the plugin's copies may see
  // other nodes there), and their packed layouts, made once.
  std::vector<bool> constant_;
  struct Packed {
    const void* source = nullptr;
    Shape shape;
    std::vector<char> data;
    std::shared_ptr<const void> gemm;  // data packed by the CPU GEMM, or null
    bool gemm_bf16 = false;            // packed by cpu_gemm_pack_bf16
  };
  mutable std::mutex packed_mutex_;
  mutable std::shared_ptr<const Packed> packed_[kMaxInputs];

 private:
  std::string where() const;  // "<op type> node '<name>': " for messages
  void note_constant_inputs();
};

template <int I>
class KitOp : public KitOpBase {
 public:
  OPENVINO_OP(kit_op_type(I), kOpset, KitOpBase);
  KitOp() : KitOpBase(I) {}
  KitOp(const ov::OutputVector& args, std::vector<int64_t> slots, std::vector<AttrValue> values, int64_t num_outputs)
      : KitOpBase(I, args, std::move(slots), std::move(values), num_outputs) {
    constructor_validate_and_infer_types();
  }
  std::shared_ptr<ov::Node> clone_with_new_inputs(const ov::OutputVector& new_args) const override {
    auto op = std::make_shared<KitOp<I>>();
    op->set_arguments(new_args);
    op->copy_config_from(*this);
    op->constructor_validate_and_infer_types();
    return op;
  }
};

// A kit operation of `op` over `args` (one per entry of `slots`), with canonical attribute values.
std::shared_ptr<ov::Node> make_kit_op(const OpDecl& op, const ov::OutputVector& args, std::vector<int64_t> slots,
                                      std::vector<AttrValue> values, int64_t num_outputs);

// Every KitOp<I> of the table as an OpExtension (IR reading and writing), in table order.
std::vector<ov::Extension::Ptr> op_extensions();

}  // namespace dcnkit::ov_ext
