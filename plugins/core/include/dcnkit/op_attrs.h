// Attributes of every operator as the front ends receive them, read once for every runtime.
//
// The declarations (op_decl.h) give each op's canonical interface and the names other tools export ("variants" with
// their own input orders and attribute names). This header converts a raw attribute (an ONNX attribute read through
// ONNX Runtime, a TensorRT PluginField) into the canonical value, with the op's default where it is absent, and checks
// a node's attributes through its declaration. The ONNX Runtime kernels and the TensorRT plugin creators both go
// through it, so an attribute name, kind, default or range is written once.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dcnkit/common.h"
#include "dcnkit/op_decl.h"

namespace dcnkit {

// One attribute of a variant as written in a model: its name, kind and element count (count 0: any length), and the
// canonical attribute (index into the OpDef's attrs) and element it sets; `enum_values` as in AttrAlias (kind kInt
// then, the canonical attribute a string).
struct VariantField {
  const char* name;
  AttrKind kind;
  int count;
  int canonical;
  int element;
  const char* enum_values = nullptr;
};
std::vector<VariantField> variant_fields(const OpVariant& v);

// Whether the variant's last input is variadic (then a node has inputs.size() - 1 + L inputs, L >= 1).
inline bool has_variadic_input(const OpVariant& v) { return !v.inputs.empty() && v.inputs.back().variadic; }

// "max|avg": the index of `name` (-1 when absent), and the name of index i ("" when out of range).
int64_t enum_index(const char* enum_values, const std::string& name);
std::string enum_name(const char* enum_values, int64_t i);

// What a front end found under an attribute name (an ONNX attribute, a TensorRT PluginField).
struct RawAttr {
  enum Type { kAbsent, kInt, kFloat, kInts, kFloats, kString, kOther } type = kAbsent;
  int64_t i = 0;
  double f = 0;
  std::vector<int64_t> ints;
  std::vector<float> floats;
  std::string s;
  std::string other;  // kOther: what it was, for messages ("a tensor", "3 int8 values")
};

// "int 3", "2 ints [1, 1]", "string \"avg\"", ... for error messages.
std::string raw_attr_str(const RawAttr& r);

// Reads every canonical attribute of `variant` through `lookup(name as written in the model)`; absent ones take the
// OpDef's default. Errors name the op and the attribute as written in the model:
// "<op_type>: attribute <name>: expected <kind>, got <what>".
Status read_attrs(const OpVariant& variant, const std::function<RawAttr(const char*)>& lookup,
                  std::vector<AttrValue>* out);

// A node's attributes: its variant and the canonical values, checked once (the op's declaration), whatever front end
// read them.
struct OpAttrs {
  const OpVariant* variant = nullptr;
  std::vector<AttrValue> values;
  const OpDecl& op() const { return *variant->op; }
};
// Checks `values` through the op's declaration; errors add the names the model used ("(attribute output_height)").
Status make_op_attrs(const OpVariant& variant, std::vector<AttrValue> values, OpAttrs* out);

// The call of a node: its op type for messages, its attributes, and its inputs' shapes in canonical order.
inline OpCall op_call(const OpAttrs& a, const OpShapes& shapes) {
  OpCall c;
  c.op = a.variant->op_type;
  c.decl = a.variant->op;
  c.variant = a.variant;
  c.attrs = a.values.data();
  c.shapes = shapes;
  return c;
}

// Number of outputs a node of this op has at the most (DeformPSRoIPool: output and count).
inline size_t op_num_outputs(const OpVariant& v) { return v.op->def.num_outputs; }

// The canonical input of the features (the first input that is neither RoIs nor an index table; MultiLevelRoIAlign:
// its maps) and of the RoIs (-1: none).
int features_input(const OpDef& d);
int rois_input(const OpDef& d);

}  // namespace dcnkit
