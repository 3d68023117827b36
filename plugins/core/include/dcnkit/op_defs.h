// The rows of an operator's interface: its inputs, outputs and attributes, as every declaration
// (plugins/core/ops/<op>.cpp, see op_decl.h) writes them. Read by the ONNX Runtime kernels, the TensorRT plugin
// creators and the torch binding (through op_table()), and by the Python exporter, ONNX schemas, precision
// rules and reference runner (through dcnkit_op_defs_json(), exported by every dcnkit library). Names follow
// docs/design.md: snake_case ops, CamelCase ONNX op types / plugin names.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dcnkit {

enum class AttrKind : int { kInt = 0, kInts = 1, kFloat = 2, kString = 3, kFloats = 4 };

struct AttrDef {
  const char* name;
  AttrKind kind;
  const char* default_value;  // as written in ONNX/JSON ("1", "[1, 1]", "0.1", "avg", "[]": required floats)
  const char* doc;
};

struct TensorDef {
  const char* name;
  bool optional;
  const char* doc;
  bool variadic = false;  // the last input only: one or more tensors (MultiLevelRoIAlign's feature maps)
  bool int64 = false;     // an int64 index tensor (MultiScaleDeformableAttention's level tables); else the
                          // op's floating type
  bool rois = false;      // RoIs: the features' type, or float32 with 16-bit features (TensorRT; the precision
                          // rules keep them float32)
  bool grad = false;      // the backward gives its gradient (an input), or takes it (an output)
  bool cast = false;      // the eager op casts it to the first input's type (mmcv's attention: float32 locations
                          // with float16 value under autocast): the exporters write that cast where types differ

  constexpr TensorDef with_grad() const {
    TensorDef t = *this;
    t.grad = true;
    return t;
  }
  constexpr TensorDef as_rois() const {
    TensorDef t = *this;
    t.rois = true;
    return t;
  }
  constexpr TensorDef as_index() const {
    TensorDef t = *this;
    t.int64 = true;
    return t;
  }
  constexpr TensorDef cast_to_first() const {
    TensorDef t = *this;
    t.cast = true;
    return t;
  }
  constexpr TensorDef as_variadic() const {
    TensorDef t = *this;
    t.variadic = true;
    return t;
  }
};

struct OpDef {
  const char* name;       // snake_case: torch op and Python function
  const char* onnx_type;  // op type in the "dcnkit" ONNX domain, TensorRT plugin name
  const TensorDef* inputs;
  size_t num_inputs;
  const TensorDef* outputs;
  size_t num_outputs;
  const AttrDef* attrs;
  size_t num_attrs;
  bool gemm = false;  // its launchers run a GEMM (GemmFn; cuBLAS on CUDA): only such ops get a cuBLAS handle in
                      // the ONNX Runtime CUDA kernels and the TensorRT plugins
  // Its type in OpenVINO IR (opset "dcnkit") where onnx_type cannot be: OpenVINO's CPU plugin picks its own node for
  // an operation whose type name equals one of its node types ignoring case, and some of those nodes take any such
  // operation for OpenVINO's own (one of 2026.4's RoI nodes dereferences a failed cast). Null: onnx_type.
  const char* openvino_type = nullptr;

  constexpr OpDef with_openvino_type(const char* type) const {
    OpDef d = *this;
    d.openvino_type = type;
    return d;
  }
  constexpr const char* ir_type() const { return openvino_type ? openvino_type : onnx_type; }
};

constexpr const char* kOnnxDomain = "dcnkit";
constexpr int kOpsetVersion = 1;

// An OpDef from its three tables (attrs may be nullptr with count 0).
#define DCNKIT_OP_DEF(name, onnx_type, inputs, outputs, attrs, gemm)                                     \
  ::dcnkit::OpDef {                                                                                      \
    name, onnx_type, inputs, sizeof(inputs) / sizeof((inputs)[0]), outputs,                             \
        sizeof(outputs) / sizeof((outputs)[0]), attrs, ::dcnkit::table_size(attrs), gemm                \
  }

template <typename T, size_t N>
constexpr size_t table_size(const T (&)[N]) {
  return N;
}
constexpr size_t table_size(std::nullptr_t) { return 0; }

// ---------------------------------------------------------------------------------------------
// Attribute and input indices, looked up at compile time (a renamed attribute fails the build on the line that
// uses it instead of silently reading a default).

constexpr bool cstr_eq(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) {
    ++a;
    ++b;
  }
  return *a == *b;
}

template <typename Def, size_t N>
constexpr int def_index(const Def (&defs)[N], const char* name) {
  for (size_t i = 0; i < N; ++i)
    if (cstr_eq(defs[i].name, name)) return static_cast<int>(i);
  return -1;
}

template <int I>
constexpr int found_index() {
  static_assert(I >= 0, "an attribute or input named here is not in its table (renamed?)");
  return I;
}

#define DCNKIT_INDEX(table, name) ::dcnkit::found_index<::dcnkit::def_index(table, name)>()

}  // namespace dcnkit

// JSON of all ops: {"domain": "dcnkit", "opset": 1, "ops": [{"name", "onnx_type", "inputs": [{"name", "optional",
// "doc", "variadic", "int64", "rois", "grad"}], "outputs": [...], "attrs": [{"name", "kind", "default", "doc"}],
// "gemm", "variants": [{"domain", "op_type", "inputs": [{"canonical", "optional", "variadic"}], "attrs": [{"name",
// "canonical", "element", "enum"}], "loose_attrs", "empty_input_is_absent", "tensorrt_only", "per_head_output"}]}]}
// (kind: int | ints | float | floats | string; a variant's empty attrs: the canonical names). Exported by every
// dcnkit library.
extern "C" const char* dcnkit_op_defs_json();
