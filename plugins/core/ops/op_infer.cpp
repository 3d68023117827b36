// ONNX shape inference of the kit's nodes through their declarations (dcnkit_op_infer, exported by the ONNX Runtime
// and PyTorch libraries; python/dcnkit/export/schemas.py calls it): an op's output dims from its attributes and its
// inputs' dims, each a number, a name (a symbolic dim) or unknown. With every input dim known the declaration checks
// the call (its messages are the core's); otherwise its output rule runs on the dims it has (OpEntry::output_dims).
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "dcnkit/op_attrs.h"

namespace dcnkit {
namespace {

// A JSON value of the request: null, a number, a string or an array (nothing else is needed).
struct Json {
  enum Kind { kNull, kNumber, kString, kArray } kind = kNull;
  double number = 0;
  bool integral = false;
  int64_t integer = 0;
  std::string text;
  std::vector<Json> items;
};

struct Parser {
  const char* p;
  bool ok = true;
  void space() {
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') ++p;
  }
  Json value() {
    space();
    Json j;
    if (*p == '[') {
      ++p;
      j.kind = Json::kArray;
      space();
      if (*p == ']') {
        ++p;
        return j;
      }
      while (ok) {
        j.items.push_back(value());
        space();
        if (*p == ',') {
          ++p;
        } else if (*p == ']') {
          ++p;
          break;
        } else {
          ok = false;
        }
      }
    } else if (*p == '"') {
      ++p;
      j.kind = Json::kString;
      while (*p != '"' && *p != '\0') {
        if (*p == '\\' && p[1] != '\0') ++p;
        j.text += *p++;
      }
      ok = ok && *p == '"';
      if (*p == '"') ++p;
    } else if (std::strncmp(p, "null", 4) == 0) {
      p += 4;
    } else {
      char* end = nullptr;
      j.kind = Json::kNumber;
      j.number = std::strtod(p, &end);
      const std::string lexeme(p, static_cast<const char*>(end));
      j.integral = lexeme.find_first_of(".eE") == std::string::npos;
      if (j.integral) j.integer = std::strtoll(p, nullptr, 10);
      ok = ok && end != p;
      p = end;
    }
    return j;
  }
};

// Dims that are known, named or unknown, for the output rules.
class SymbolicDims final : public DimArith {
 public:
  struct Dim {
    bool known = false;
    int64_t value = 0;
    std::string name;  // a symbolic dim of the model ("" with !known: unknown)
  };
  Value constant(int64_t v) override { return make({true, v, ""}); }
  Value named(const std::string& n) { return make({false, 0, n}); }
  Value unknown() { return make({}); }
  Value add(Value x, Value y) override { return binary(x, y, [](int64_t a, int64_t b) { return a + b; }); }
  Value sub(Value x, Value y) override { return binary(x, y, [](int64_t a, int64_t b) { return a - b; }); }
  Value mul(Value x, Value y) override { return binary(x, y, [](int64_t a, int64_t b) { return a * b; }); }
  Value floor_div(Value x, Value y) override {
    const Dim& b = dim(y);
    if (!b.known || b.value <= 0) return unknown();
    return binary(x, y, [](int64_t a, int64_t d) { return a / d - ((a % d != 0 && a < 0) ? 1 : 0); });
  }
  static const Dim& dim(Value v) { return *static_cast<const Dim*>(v); }

 private:
  Value make(Dim d) {
    pool_.push_back(std::move(d));
    return &pool_.back();
  }
  template <typename F>
  Value binary(Value x, Value y, F f) {
    if (x == nullptr || y == nullptr) return unknown();
    const Dim &a = dim(x), &b = dim(y);
    return a.known && b.known ? constant(f(a.value, b.value)) : unknown();
  }
  std::deque<Dim> pool_;
};

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += (c == '\n' ? ' ' : c);
  }
  return out + "\"";
}

Status attr_values(const OpDef& def, const Json& a, std::vector<AttrValue>* out) {
  if (a.kind != Json::kArray || a.items.size() != def.num_attrs) {
    return Status::Invalid(std::string(def.onnx_type) + ": expected " + std::to_string(def.num_attrs) + " attributes");
  }
  for (size_t i = 0; i < def.num_attrs; ++i) {
    const Json& j = a.items[i];
    AttrValue v;
    switch (def.attrs[i].kind) {
      case AttrKind::kInt: v.ints = {j.integral ? j.integer : static_cast<int64_t>(j.number)}; break;
      case AttrKind::kFloat: v.f = j.number; break;
      case AttrKind::kString: v.s = j.text; break;
      case AttrKind::kInts:
        for (const Json& x : j.items) v.ints.push_back(x.integral ? x.integer : static_cast<int64_t>(x.number));
        break;
      case AttrKind::kFloats:
        for (const Json& x : j.items) v.floats.push_back(x.number);
        break;
    }
    out->push_back(std::move(v));
  }
  return Status::Ok();
}

bool all_known(const Json& dims) {
  for (const Json& d : dims.items)
    if (d.kind != Json::kNumber) return false;
  return true;
}

Shape shape_of(const Json& dims) {
  Shape s;
  for (const Json& d : dims.items) s.push_back(d.integral ? d.integer : static_cast<int64_t>(d.number));
  return s;
}

// The outputs as JSON dims: numbers, names, null.
std::string infer(const std::string& op_type, const char* request) {
  const OpDecl* decl = find_op(op_type);
  if (decl == nullptr) return "{\"error\": " + quoted("no operator " + op_type + " in the op table") + "}";
  const OpDef& def = decl->def;
  const OpVariant* variant = nullptr;
  for (const OpVariant& v : op_variants())
    if (v.op == decl && variant == nullptr) variant = &v;
  Parser parser{request};
  const Json req = parser.value();
  if (!parser.ok || req.kind != Json::kArray || req.items.size() != 3) {
    return "{\"error\": \"dcnkit_op_infer: expected [attrs, inputs, variadic]\"}";
  }
  std::vector<AttrValue> values;
  Status s = attr_values(def, req.items[0], &values);
  const auto error = [](const Status& st) { return "{\"error\": " + quoted(st.message()) + "}"; };
  if (!s.ok()) return error(s);
  OpAttrs attrs;
  s = make_op_attrs(*variant, values, &attrs);
  if (!s.ok()) return error(s);
  const Json& inputs = req.items[1];
  const Json& variadic = req.items[2];
  bool known = true;
  for (const Json& in : inputs.items) known = known && (in.kind == Json::kNull || all_known(in));
  for (const Json& in : variadic.items) known = known && all_known(in);
  std::string out = "{\"outputs\": [";
  if (known) {  // every dim known: the declaration checks the call
    Shape storage[kMaxInputs];
    OpShapes shapes;
    for (size_t i = 0; i < inputs.items.size() && i < kMaxInputs; ++i) {
      if (inputs.items[i].kind != Json::kArray) continue;
      storage[i] = shape_of(inputs.items[i]);
      shapes.in[i] = &storage[i];
    }
    for (const Json& v : variadic.items) shapes.variadic.push_back(shape_of(v));
    Shape result[kMaxOutputs];
    s = decl->entry.outputs(op_call(attrs, shapes), result);
    if (!s.ok()) return error(s);
    for (size_t o = 0; o < def.num_outputs; ++o) {
      out += (o ? "], [" : "[");
      for (size_t k = 0; k < result[o].size(); ++k) out += (k ? ", " : "") + std::to_string(result[o][k]);
    }
    return out + (def.num_outputs ? "]" : "") + "]}";
  }
  if (decl->entry.output_dims == nullptr) return "{\"outputs\": null}";
  SymbolicDims arith;
  OpDims d;
  std::vector<std::vector<DimArith::Value>> in_dims(kMaxInputs);
  for (size_t i = 0; i < inputs.items.size() && i < kMaxInputs; ++i) {
    const Json& in = inputs.items[i];
    if (in.kind != Json::kArray) continue;
    for (const Json& x : in.items) {
      in_dims[i].push_back(x.kind == Json::kNumber   ? arith.constant(x.integral ? x.integer : int64_t(x.number))
                           : x.kind == Json::kString ? arith.named(x.text)
                                                     : arith.unknown());
    }
    d.in[i] = in_dims[i].data();
    d.rank[i] = static_cast<int>(in_dims[i].size());
  }
  s = decl->entry.output_dims(op_call(attrs, OpShapes()), arith, &d);
  if (!s.ok()) return error(s);
  for (size_t o = 0; o < def.num_outputs; ++o) {
    out += (o ? "], [" : "[");
    for (int k = 0; k < d.out_rank[o]; ++k) {
      const SymbolicDims::Dim& x = SymbolicDims::dim(d.out[o][k] ? d.out[o][k] : arith.unknown());
      out += (k ? ", " : "") + (x.known ? std::to_string(x.value) : x.name.empty() ? "null" : quoted(x.name));
    }
  }
  return out + (def.num_outputs ? "]" : "") + "]}";
}

}  // namespace
}  // namespace dcnkit

// Writes the JSON answer ({"outputs": [[dims]...]} or {"error": message}) into out (at most cap bytes, NUL
// included); returns its length (a larger cap is needed when that is >= cap). request: [attrs (the table's order,
// canonical kinds), inputs (canonical order: null or a list of dims), variadic (the dims of each tensor of a variadic
// last input)], a dim a number, a name or null.
extern "C" __attribute__((visibility("default"))) int dcnkit_op_infer(const char* op_type, const char* request,
                                                                      char* out, int cap) {
  const std::string answer = dcnkit::infer(op_type ? op_type : "", request ? request : "");
  if (out != nullptr && cap > 0) {
    std::strncpy(out, answer.c_str(), static_cast<size_t>(cap));
    out[cap - 1] = '\0';
  }
  return static_cast<int>(answer.size());
}
