// The table of operator declarations: the list CMake generates from plugins/core/ops/*.cpp (dcnkit_op_list.inc, in
// the build folder, not committed), every op's variants, and the table as JSON (dcnkit_op_defs_json, exported by
// every dcnkit library). Compiled into each library once, with or without the CUDA entry points (DCNKIT_OP_CUDA).
#include <algorithm>
#include <cstring>
#include <string>

#include "dcnkit/op_decl.h"

namespace dcnkit {

#define DCNKIT_LISTED_OP(name) const OpDecl& op_decl_##name();
#include "dcnkit_op_list.inc"
#undef DCNKIT_LISTED_OP

const std::vector<const OpDecl*>& op_table() {
  static const std::vector<const OpDecl*> table = [] {
    std::vector<const OpDecl*> t = {
#define DCNKIT_LISTED_OP(name) &op_decl_##name(),
#include "dcnkit_op_list.inc"
#undef DCNKIT_LISTED_OP
    };
    std::stable_sort(t.begin(), t.end(), [](const OpDecl* a, const OpDecl* b) { return a->order < b->order; });
    return t;
  }();
  return table;
}

const OpDecl* find_op(const std::string& name) {
  for (const OpDecl* d : op_table()) {
    if (name == d->def.name || name == d->def.onnx_type) return d;
  }
  return nullptr;
}

const std::vector<OpVariant>& op_variants() {
  static const std::vector<OpVariant> variants = [] {
    std::vector<OpVariant> v;
    // The kit's own operators: names, input order and defaults straight from the declarations.
    for (const OpDecl* d : op_table()) {
      v.push_back({kOnnxDomain, d->def.onnx_type, d, canonical_inputs(d->def), {}, false, false});
    }
    for (const OpDecl* d : op_table()) {
      if (d->variants != nullptr) d->variants(d, &v);
    }
    return v;
  }();
  return variants;
}

namespace {

std::string quoted(const char* s) {
  std::string out = "\"";
  for (const char* c = s; *c; ++c) {
    if (*c == '"' || *c == '\\') out += '\\';
    out += *c;
  }
  return out + "\"";
}

const char* kind_name(AttrKind k) {
  switch (k) {
    case AttrKind::kInt: return "int";
    case AttrKind::kInts: return "ints";
    case AttrKind::kFloat: return "float";
    case AttrKind::kString: return "string";
    case AttrKind::kFloats: return "floats";
  }
  return "unknown";
}

const char* boolean(bool b) { return b ? "true" : "false"; }

std::string tensors_json(const TensorDef* t, size_t n) {
  std::string s = "[";
  for (size_t i = 0; i < n; ++i) {
    s += (i ? ", " : "");
    s += "{\"name\": " + quoted(t[i].name) + ", \"optional\": " + boolean(t[i].optional) +
         ", \"doc\": " + quoted(t[i].doc) + ", \"variadic\": " + boolean(t[i].variadic) +
         ", \"int64\": " + boolean(t[i].int64) + ", \"rois\": " + boolean(t[i].rois) +
         ", \"grad\": " + boolean(t[i].grad) + ", \"cast\": " + boolean(t[i].cast) + "}";
  }
  return s + "]";
}

std::string variant_json(const OpVariant& v) {
  std::string s = "{\"domain\": " + quoted(v.domain) + ", \"op_type\": " + quoted(v.op_type) + ", \"inputs\": [";
  for (size_t i = 0; i < v.inputs.size(); ++i) {
    s += std::string(i ? ", " : "") + "{\"canonical\": " + std::to_string(v.inputs[i].canonical) +
         ", \"optional\": " + boolean(v.inputs[i].optional) + ", \"variadic\": " + boolean(v.inputs[i].variadic) +
         "}";
  }
  s += "], \"attrs\": [";
  for (size_t i = 0; i < v.aliases.size(); ++i) {
    const AttrAlias& a = v.aliases[i];
    s += std::string(i ? ", " : "") + "{\"name\": " + quoted(a.onnx_name) + ", \"canonical\": " +
         quoted(a.canonical) + ", \"element\": " + std::to_string(a.element) +
         ", \"enum\": " + (a.enum_values ? quoted(a.enum_values) : std::string("null")) + "}";
  }
  return s + "], \"loose_attrs\": " + boolean(v.loose_attrs) + ", \"empty_input_is_absent\": " +
         boolean(v.empty_input_is_absent) + ", \"tensorrt_only\": " + boolean(v.tensorrt_only) +
         ", \"per_head_output\": " + boolean(v.per_head_output) + ", \"onnx_standard\": " +
         boolean(v.onnx_standard) + "}";
}

std::string build_json() {
  std::string s = "{\"domain\": " + quoted(kOnnxDomain) + ", \"opset\": " + std::to_string(kOpsetVersion) +
                  ", \"ops\": [";
  const auto& table = op_table();
  for (size_t i = 0; i < table.size(); ++i) {
    const OpDef& d = table[i]->def;
    s += (i ? ", " : "");
    s += "{\"name\": " + quoted(d.name) + ", \"onnx_type\": " + quoted(d.onnx_type) +
         ", \"inputs\": " + tensors_json(d.inputs, d.num_inputs) +
         ", \"outputs\": " + tensors_json(d.outputs, d.num_outputs) + ", \"attrs\": [";
    for (size_t a = 0; a < d.num_attrs; ++a) {
      const AttrDef& at = d.attrs[a];
      s += (a ? ", " : "");
      s += "{\"name\": " + quoted(at.name) + ", \"kind\": " + quoted(kind_name(at.kind)) +
           ", \"default\": " + quoted(at.default_value) + ", \"doc\": " + quoted(at.doc) + "}";
    }
    s += std::string("], \"gemm\": ") + boolean(d.gemm) + ", \"variants\": [";
    bool first = true;
    for (const OpVariant& v : op_variants()) {
      if (v.op != table[i]) continue;
      s += (first ? "" : ", ") + variant_json(v);
      first = false;
    }
    s += "]}";
  }
  return s + "]}";
}

}  // namespace
}  // namespace dcnkit

extern "C" __attribute__((visibility("default"))) const char* dcnkit_op_defs_json() {
  static const std::string json = dcnkit::build_json();
  return json.c_str();
}
