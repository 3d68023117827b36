// ONNX shape inference of the kit's nodes through their declarations (dcnkit_op_infer, exported by the ONNX Runtime
// and PyTorch libraries; python/dcnkit/export/schemas.py and the quantizer's shape walk call it): an op's output dims
// from its attributes and its inputs' dims (any of its names: a node as a model has it), each a number, a name (a symbolic dim) or unknown. With every input dim known the declaration checks
// the call (its messages are the core's); otherwise its output rule runs on the dims it has (OpEntry::output_dims).
#include <algorithm>
#include <cmath>
#include <cstdio>
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
  Value either(Value x, Value y) override {
    if (x != nullptr && dim(x).known) return x;
    return y != nullptr && (dim(y).known || !dim(y).name.empty()) ? y : x;
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

// A node of a variant: its attributes as [name, kind, value] triples (kind "int", "float", "string", "ints",
// "floats"; read and checked as every backend reads them) and its inputs in node order (null: absent) mapped to the
// canonical order (`inputs`, `variadic`: the dims of each tensor of a variadic last input).
Status variant_node(const OpVariant& v, const Json& attrs, const Json& node_inputs, OpAttrs* out,
                    std::vector<const Json*>* inputs, std::vector<const Json*>* variadic) {
  std::vector<AttrValue> values;
  DCNKIT_RETURN_IF_ERROR(read_attrs(
      v,
      [&](const char* name) {
        RawAttr r;
        for (const Json& t : attrs.items) {
          if (t.items.size() != 3 || t.items[0].text != name) continue;
          const std::string& kind = t.items[1].text;
          const Json& x = t.items[2];
          const auto integer = [](const Json& j) { return j.integral ? j.integer : static_cast<int64_t>(j.number); };
          if (kind == "int") {
            r.type = RawAttr::kInt;
            r.i = integer(x);
          } else if (kind == "float") {
            r.type = RawAttr::kFloat;
            r.f = static_cast<float>(x.number);
          } else if (kind == "string") {
            r.type = RawAttr::kString;
            r.s = x.text;
          } else if (kind == "ints") {
            r.type = RawAttr::kInts;
            for (const Json& e : x.items) r.ints.push_back(integer(e));
          } else if (kind == "floats") {
            r.type = RawAttr::kFloats;
            for (const Json& e : x.items) r.floats.push_back(static_cast<float>(e.number));
          } else {
            r.type = RawAttr::kOther;
          }
        }
        return r;
      },
      &values));
  DCNKIT_RETURN_IF_ERROR(make_op_attrs(v, std::move(values), out));
  inputs->assign(kMaxInputs, nullptr);
  for (size_t i = 0; i < node_inputs.items.size(); ++i) {
    const InputSlot& slot = v.inputs[std::min(i, v.inputs.size() - 1)];
    if (i >= v.inputs.size() && !slot.variadic) {
      return arg_error(v.op_type, "inputs", "at most " + std::to_string(v.inputs.size()),
                       std::to_string(node_inputs.items.size()));
    }
    const Json& in = node_inputs.items[i];
    if (in.kind != Json::kArray) continue;
    bool empty = false;
    for (const Json& d : in.items) empty = empty || (d.kind == Json::kNumber && d.number == 0);
    if (v.empty_input_is_absent && slot.optional && empty) continue;
    if (slot.variadic) variadic->push_back(&in);
    if ((*inputs)[slot.canonical] == nullptr) (*inputs)[slot.canonical] = &in;
  }
  return Status::Ok();
}

// A double as JSON (Python's json reads NaN, Infinity and -Infinity).
std::string json_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

// The canonical attribute values as a JSON object, in the table's order.
std::string attrs_json(const OpDef& def, const OpAttrs& a) {
  std::string out = "{";
  for (size_t i = 0; i < def.num_attrs && i < a.values.size(); ++i) {
    const AttrValue& v = a.values[i];
    out += (i ? ", " : "") + quoted(def.attrs[i].name) + ": ";
    switch (def.attrs[i].kind) {
      case AttrKind::kInt: out += std::to_string(v.ints.empty() ? 0 : v.ints[0]); break;
      case AttrKind::kFloat: out += json_number(v.f); break;
      case AttrKind::kString: out += quoted(v.s); break;
      case AttrKind::kInts:
        out += "[";
        for (size_t k = 0; k < v.ints.size(); ++k) out += (k ? ", " : "") + std::to_string(v.ints[k]);
        out += "]";
        break;
      case AttrKind::kFloats:
        out += "[";
        for (size_t k = 0; k < v.floats.size(); ++k) out += (k ? ", " : "") + json_number(v.floats[k]);
        out += "]";
        break;
    }
  }
  return out + "}";
}

// The outputs as JSON dims: numbers, names, null; for a variant's node also its canonical attributes ("attrs": as
// every backend reads them). op_type: an op of the table (the request's attributes canonical, its inputs in canonical
// order) or "<domain>::<op type>", a variant (see variant_node).
std::string infer(const std::string& op_type, const char* request) {
  const auto error = [](const Status& st) { return "{\"error\": " + quoted(st.message()) + "}"; };
  Parser parser{request};
  const Json req = parser.value();
  if (!parser.ok || req.kind != Json::kArray || req.items.size() != 3) {
    return "{\"error\": \"dcnkit_op_infer: expected [attrs, inputs, variadic]\"}";
  }
  OpAttrs attrs;
  std::vector<const Json*> inputs(kMaxInputs, nullptr), variadic;
  const OpDecl* decl = nullptr;
  const size_t sep = op_type.find("::");
  if (sep != std::string::npos) {
    std::string domain = op_type.substr(0, sep);
    if (domain == "ai.onnx") domain.clear();
    const std::string type = op_type.substr(sep + 2);
    const OpVariant* variant = nullptr;
    for (const OpVariant& v : op_variants())
      if (variant == nullptr && domain == v.domain && type == v.op_type) variant = &v;
    if (variant == nullptr) return "{\"error\": " + quoted("no operator " + op_type + " in the op table") + "}";
    decl = variant->op;
    const Status s = variant_node(*variant, req.items[0], req.items[1], &attrs, &inputs, &variadic);
    if (!s.ok()) return error(s);
  } else {
    decl = find_op(op_type);
    if (decl == nullptr) return "{\"error\": " + quoted("no operator " + op_type + " in the op table") + "}";
    const OpVariant* variant = nullptr;
    for (const OpVariant& v : op_variants())
      if (v.op == decl && variant == nullptr) variant = &v;
    std::vector<AttrValue> values;
    Status s = attr_values(decl->def, req.items[0], &values);
    if (s.ok()) s = make_op_attrs(*variant, values, &attrs);
    if (!s.ok()) return error(s);
    for (size_t i = 0; i < req.items[1].items.size() && i < kMaxInputs; ++i) {
      if (req.items[1].items[i].kind == Json::kArray) inputs[i] = &req.items[1].items[i];
    }
    for (const Json& v : req.items[2].items) variadic.push_back(&v);
  }
  const OpDef& def = decl->def;
  bool known = true;
  for (const Json* in : inputs) known = known && (in == nullptr || all_known(*in));
  for (const Json* in : variadic) known = known && all_known(*in);
  std::string out = "{" + (sep != std::string::npos ? "\"attrs\": " + attrs_json(def, attrs) + ", " : "") +
                    "\"outputs\": [";
  if (known) {  // every dim known: the declaration checks the call
    Shape storage[kMaxInputs];
    OpShapes shapes;
    for (size_t i = 0; i < kMaxInputs; ++i) {
      if (inputs[i] == nullptr) continue;
      storage[i] = shape_of(*inputs[i]);
      shapes.in[i] = &storage[i];
    }
    for (const Json* v : variadic) shapes.variadic.push_back(shape_of(*v));
    Shape result[kMaxOutputs];
    const Status s = decl->entry.outputs(op_call(attrs, shapes), result);
    if (!s.ok()) return error(s);
    for (size_t o = 0; o < def.num_outputs; ++o) {
      out += (o ? "], [" : "[");
      for (size_t k = 0; k < result[o].size(); ++k) out += (k ? ", " : "") + std::to_string(result[o][k]);
    }
    return out + (def.num_outputs ? "]" : "") + "]}";
  }
  if (decl->entry.output_dims == nullptr) return out.substr(0, out.size() - 1) + "null}";
  SymbolicDims arith;
  OpDims d;
  std::vector<std::vector<DimArith::Value>> in_dims(kMaxInputs);
  for (size_t i = 0; i < kMaxInputs; ++i) {
    if (inputs[i] == nullptr) continue;
    for (const Json& x : inputs[i]->items) {
      in_dims[i].push_back(x.kind == Json::kNumber   ? arith.constant(x.integral ? x.integer : int64_t(x.number))
                           : x.kind == Json::kString ? arith.named(x.text)
                                                     : arith.unknown());
    }
    d.in[i] = in_dims[i].data();
    d.rank[i] = static_cast<int>(in_dims[i].size());
  }
  d.variadic_count = static_cast<int>(variadic.size());
  const Status s = decl->entry.output_dims(op_call(attrs, OpShapes()), arith, &d);
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
// last input)], a dim a number, a name or null. With op_type "<domain>::<op type>" (any name of an op, "" or
// "ai.onnx" for ONNX's own): [attrs as [name, kind, value] triples as the node has them, the node's inputs' dims in
// its order, []].
extern "C" __attribute__((visibility("default"))) int dcnkit_op_infer(const char* op_type, const char* request,
                                                                      char* out, int cap) {
  const std::string answer = dcnkit::infer(op_type ? op_type : "", request ? request : "");
  if (out != nullptr && cap > 0) {
    std::strncpy(out, answer.c_str(), static_cast<size_t>(cap));
    out[cap - 1] = '\0';
  }
  return static_cast<int>(answer.size());
}
