#include "dcnkit/op_attrs.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace dcnkit {

// ---------------------------------------------------------------------------------------------
// Variants

std::vector<InputSlot> canonical_inputs(const OpDef& d) {
  std::vector<InputSlot> v;
  for (size_t i = 0; i < d.num_inputs; ++i) {
    v.push_back({static_cast<int>(i), d.inputs[i].optional, d.inputs[i].variadic});
  }
  return v;
}

int features_input(const OpDef& d) {
  for (size_t i = 0; i < d.num_inputs; ++i)
    if (!d.inputs[i].rois && !d.inputs[i].int64) return static_cast<int>(i);
  return -1;
}

int rois_input(const OpDef& d) {
  for (size_t i = 0; i < d.num_inputs; ++i)
    if (d.inputs[i].rois) return static_cast<int>(i);
  return -1;
}

namespace {

int canonical_index(const OpDef& def, const char* name) {
  for (size_t i = 0; i < def.num_attrs; ++i)
    if (std::strcmp(def.attrs[i].name, name) == 0) return static_cast<int>(i);
  return -1;
}

int kind_count(AttrKind k) {
  return k == AttrKind::kInts ? 2 : ((k == AttrKind::kString || k == AttrKind::kFloats) ? 0 : 1);
}

}  // namespace

int64_t enum_index(const char* enum_values, const std::string& name) {
  if (enum_values == nullptr) return -1;
  int64_t i = 0;
  const char* p = enum_values;
  while (true) {
    const char* e = std::strchr(p, '|');
    const size_t n = e ? static_cast<size_t>(e - p) : std::strlen(p);
    if (name.size() == n && name.compare(0, n, p, n) == 0) return i;
    if (e == nullptr) return -1;
    p = e + 1;
    ++i;
  }
}

std::string enum_name(const char* enum_values, int64_t i) {
  if (enum_values == nullptr || i < 0) return "";
  const char* p = enum_values;
  for (int64_t k = 0; k < i; ++k) {
    p = std::strchr(p, '|');
    if (p == nullptr) return "";
    ++p;
  }
  const char* e = std::strchr(p, '|');
  return e ? std::string(p, e) : std::string(p);
}

std::vector<VariantField> variant_fields(const OpVariant& v) {
  const OpDef& def = v.op->def;
  std::vector<VariantField> out;
  if (v.aliases.empty()) {
    for (size_t i = 0; i < def.num_attrs; ++i) {
      out.push_back({def.attrs[i].name, def.attrs[i].kind, kind_count(def.attrs[i].kind), static_cast<int>(i), -1});
    }
    return out;
  }
  for (const AttrAlias& a : v.aliases) {
    const int idx = canonical_index(def, a.canonical);
    const AttrKind kind = (a.element >= 0 || a.enum_values != nullptr) ? AttrKind::kInt : def.attrs[idx].kind;
    out.push_back({a.onnx_name, kind, kind_count(kind), idx, a.element, a.enum_values});
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Raw attributes -> canonical values

AttrValue parse_default(const AttrDef& d) {
  AttrValue v;
  const std::string s = d.default_value;
  switch (d.kind) {
    case AttrKind::kString: v.s = s; break;
    case AttrKind::kFloat: v.f = std::strtod(s.c_str(), nullptr); break;
    case AttrKind::kInt: v.ints = {std::strtoll(s.c_str(), nullptr, 10)}; break;
    case AttrKind::kInts: {
      const char* p = s.c_str();
      while (*p) {
        if ((*p >= '0' && *p <= '9') || *p == '-') {
          char* end = nullptr;
          v.ints.push_back(std::strtoll(p, &end, 10));
          p = end;
        } else {
          ++p;
        }
      }
      break;
    }
    case AttrKind::kFloats: {
      const char* p = s.c_str();
      while (*p) {
        if ((*p >= '0' && *p <= '9') || *p == '-' || *p == '.') {
          char* end = nullptr;
          v.floats.push_back(std::strtod(p, &end));
          p = end;
        } else {
          ++p;
        }
      }
      break;
    }
  }
  return v;
}

std::string raw_attr_str(const RawAttr& r) {
  switch (r.type) {
    case RawAttr::kAbsent: return "nothing";
    case RawAttr::kInt: return "int " + std::to_string(r.i);
    case RawAttr::kFloat: return "float " + to_str(r.f);
    case RawAttr::kInts: return std::to_string(r.ints.size()) + " ints " + shape_str(r.ints);
    case RawAttr::kFloats: {
      std::string s = std::to_string(r.floats.size()) + " floats [";
      for (size_t i = 0; i < r.floats.size(); ++i) s += (i ? ", " : "") + to_str(r.floats[i]);
      return s + "]";
    }
    case RawAttr::kString: return "string \"" + r.s + "\"";
    case RawAttr::kOther: return r.other.empty() ? "an attribute of another type" : r.other;
  }
  return "?";
}

namespace {

// An integer from an int attribute, or (loose) from a float attribute holding an integer.
bool as_int(const RawAttr& r, bool loose, int64_t* v) {
  if (r.type == RawAttr::kInt) {
    *v = r.i;
    return true;
  }
  if (loose && r.type == RawAttr::kFloat && std::isfinite(r.f) && r.f == std::floor(r.f) &&
      std::fabs(r.f) < 9.0e15) {
    *v = static_cast<int64_t>(r.f);
    return true;
  }
  if (loose && r.type == RawAttr::kInts && r.ints.size() == 1) {
    *v = r.ints[0];
    return true;
  }
  return false;
}

Status convert(const char* op, const char* onnx_name, const AttrDef& def, int element, const char* enum_values,
               bool loose, bool onnx_pads, const RawAttr& r, AttrValue* out) {
  const std::string arg = std::string("attribute ") + onnx_name;
  if (enum_values != nullptr) {  // an int naming one value of a canonical string
    int64_t v = 0;
    std::string choices;
    for (int64_t i = 0; !enum_name(enum_values, i).empty(); ++i) {
      choices += (i ? ", " : "") + std::to_string(i) + " (" + enum_name(enum_values, i) + ")";
    }
    if (!as_int(r, loose, &v) || enum_name(enum_values, v).empty()) {
      return arg_error(op, arg, "an int: " + choices, raw_attr_str(r));
    }
    out->s = enum_name(enum_values, v);
    return Status::Ok();
  }
  if (element >= 0) {  // one element of a canonical pair
    int64_t v = 0;
    if (!as_int(r, loose, &v)) return arg_error(op, arg, "an int", raw_attr_str(r));
    if (out->ints.size() <= static_cast<size_t>(element)) out->ints.resize(element + 1, 0);
    out->ints[element] = v;
    return Status::Ok();
  }
  switch (def.kind) {
    case AttrKind::kInt: {
      int64_t v = 0;
      if (!as_int(r, loose, &v)) return arg_error(op, arg, "an int", raw_attr_str(r));
      out->ints = {v};
      return Status::Ok();
    }
    case AttrKind::kFloat:
      if (r.type == RawAttr::kFloat) {
        out->f = r.f;
      } else if (r.type == RawAttr::kInt && loose) {
        out->f = static_cast<double>(r.i);
      } else {
        return arg_error(op, arg, "a float", raw_attr_str(r));
      }
      return Status::Ok();
    case AttrKind::kString:
      if (r.type != RawAttr::kString) return arg_error(op, arg, "a string", raw_attr_str(r));
      out->s = r.s;
      return Status::Ok();
    case AttrKind::kFloats:
      out->floats.clear();
      if (r.type == RawAttr::kFloats) {
        for (float x : r.floats) out->floats.push_back(static_cast<double>(x));
      } else if (r.type == RawAttr::kInts && (loose || r.ints.empty())) {
        for (int64_t x : r.ints) out->floats.push_back(static_cast<double>(x));
      } else if (r.type == RawAttr::kFloat) {  // one value (a TensorRT field of length 1)
        out->floats.push_back(r.f);
      } else if (loose && r.type == RawAttr::kInt) {
        out->floats.push_back(static_cast<double>(r.i));
      } else {
        return arg_error(op, arg, "floats", raw_attr_str(r));
      }
      return Status::Ok();
    case AttrKind::kInts: {
      if (r.type == RawAttr::kInts && r.ints.size() == 2) {
        out->ints = r.ints;
        return Status::Ok();
      }
      if (onnx_pads && r.type == RawAttr::kInts && r.ints.size() == 4) {  // ONNX pads [t, l, b, r]
        if (r.ints[0] == r.ints[2] && r.ints[1] == r.ints[3]) {
          out->ints = {r.ints[0], r.ints[1]};
          return Status::Ok();
        }
        return arg_error(op, arg, "symmetric pads [t, l, b, r] with t == b and l == r", raw_attr_str(r));
      }
      if (loose) {
        int64_t v = 0;
        if (as_int(r, true, &v)) {  // one value for both axes
          out->ints = {v, v};
          return Status::Ok();
        }
        if (r.type == RawAttr::kInts && r.ints.size() == 4) {
          const auto& p = r.ints;
          // mmdeploy writes paddings as [ph, ph, pw, pw]; ONNX pads are [ph, pw, ph, pw].
          if (p[0] == p[1] && p[2] == p[3]) {
            out->ints = {p[0], p[2]};
            return Status::Ok();
          }
          if (p[0] == p[2] && p[1] == p[3]) {
            out->ints = {p[0], p[1]};
            return Status::Ok();
          }
          return arg_error(op, arg, "symmetric 4 ints ([h, h, w, w] or [h, w, h, w])", raw_attr_str(r));
        }
        return arg_error(op, arg, "an int or 2 ints (h, w)", raw_attr_str(r));
      }
      return arg_error(op, arg, "2 ints (h, w)", raw_attr_str(r));
    }
  }
  return Status::Internal("unknown attribute kind");
}

}  // namespace

Status read_attrs(const OpVariant& variant, const std::function<RawAttr(const char*)>& lookup,
                  std::vector<AttrValue>* out) {
  const OpDef& def = variant.op->def;
  out->clear();
  for (size_t i = 0; i < def.num_attrs; ++i) out->push_back(parse_default(def.attrs[i]));
  for (const VariantField& f : variant_fields(variant)) {
    if (f.canonical < 0) return Status::Internal(std::string("unknown canonical attribute of ") + f.name);
    const RawAttr r = lookup(f.name);
    if (r.type == RawAttr::kAbsent) continue;
    DCNKIT_RETURN_IF_ERROR(convert(variant.op_type, f.name, def.attrs[f.canonical], f.element, f.enum_values,
                                   variant.loose_attrs, variant.onnx_standard, r, &(*out)[f.canonical]));
  }
  return Status::Ok();
}

}  // namespace dcnkit

namespace dcnkit {

Status make_op_attrs(const OpVariant& variant, std::vector<AttrValue> values, OpAttrs* out) {
  out->variant = &variant;
  out->values = std::move(values);
  const auto check = variant.op->entry.check;
  const Status s = check ? check(variant.op_type, out->values.data()) : Status::Ok();
  if (s.ok() || variant.aliases.empty()) return s;
  // The core names canonical attributes ("<op>: <arg>: expected ..."): add the names the model used.
  const std::string& m = s.message();
  const size_t b = std::strlen(variant.op_type) + 2, e = m.find(": ", b);
  if (m.compare(0, b, std::string(variant.op_type) + ": ") != 0 || e == std::string::npos) return s;
  const std::string arg = ", " + m.substr(b, e - b) + ",";
  std::string names;
  for (const AttrAlias& al : variant.aliases) {
    if (arg.find(std::string(", ") + al.canonical + ",") != std::string::npos) {
      names += (names.empty() ? "" : ", ") + std::string(al.onnx_name);
    }
  }
  return names.empty() ? s : Status(s.code(), m + " (attribute " + names + ")");
}

Status roi_pool_output_dims(const OpCall& c, int features, int rois, int64_t oh, int64_t ow, DimArith& a,
                            OpDims* d) {
  const OpDef& def = c.decl->def;
  for (const auto& [i, rank] : {std::pair<int, int>{features, 4}, {rois, 2}}) {
    if (d->rank[i] != rank) {
      return arg_error(c.op, def.inputs[i].name, std::to_string(rank) + "-D tensor", std::to_string(d->rank[i]) + "-D");
    }
  }
  d->out_rank[0] = 4;
  d->out[0][0] = d->in[rois][0];
  d->out[0][1] = d->in[features][1];
  d->out[0][2] = a.constant(oh);
  d->out[0][3] = a.constant(ow);
  return Status::Ok();
}

}  // namespace dcnkit

namespace dcnkit::op_decl_detail {

Status require_inputs(const OpCall& c) {
  const OpDef& d = c.decl->def;
  for (size_t i = 0; i < d.num_inputs; ++i) {
    // A variadic input's count is the op's to check (its params: "1 to 8 feature maps, got 0").
    if (!d.inputs[i].optional && !d.inputs[i].variadic && c.shapes.in[i] == nullptr) {
      return arg_error(c.op, d.inputs[i].name, "a tensor", "no input");
    }
  }
  return Status::Ok();
}

}  // namespace dcnkit::op_decl_detail
