#include "dcnkit/op_defs.h"

#include <cstring>
#include <string>

namespace dcnkit {

const OpDef* find_op_def(const char* name) {
  for (const OpDef& d : kOpDefs) {
    if (std::strcmp(d.name, name) == 0 || std::strcmp(d.onnx_type, name) == 0) return &d;
  }
  return nullptr;
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

std::string tensors_json(const TensorDef* t, size_t n) {
  std::string s = "[";
  for (size_t i = 0; i < n; ++i) {
    s += (i ? ", " : "");
    s += "{\"name\": " + quoted(t[i].name) + ", \"optional\": " + (t[i].optional ? "true" : "false") +
         ", \"doc\": " + quoted(t[i].doc) +
         ", \"variadic\": " + (t[i].variadic ? "true" : "false") +
         ", \"int64\": " + (t[i].int64 ? "true" : "false") + "}";
  }
  return s + "]";
}

std::string build_json() {
  std::string s = "{\"domain\": " + quoted(kOnnxDomain) +
                  ", \"opset\": " + std::to_string(kOpsetVersion) + ", \"ops\": [";
  for (size_t i = 0; i < kNumOpDefs; ++i) {
    const OpDef& d = kOpDefs[i];
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
    s += std::string("], \"gemm\": ") + (d.gemm ? "true" : "false") + "}";
  }
  return s + "]}";
}

}  // namespace
}  // namespace dcnkit

extern "C" __attribute__((visibility("default"))) const char* dcnkit_op_defs_json() {
  static const std::string json = dcnkit::build_json();
  return json.c_str();
}
