// PluginFields <-> the operators' attributes: what a creator declares, what a plugin serializes, and the
// checked attributes read back from a collection (through dcnkit/op_attrs.h, shared with ONNX Runtime).
#include <cstring>

#include "trt_plugin.h"

using namespace nvinfer1;

namespace dcnkit::trt {

void FieldStore::add(const char* name, PluginFieldType type, const void* data, int32_t length, size_t bytes) {
  names_.emplace_back(name);
  data_.emplace_back(static_cast<const char*>(data), static_cast<const char*>(data) + (data ? bytes : 0));
  fields_.emplace_back(names_.back().c_str(), data ? data_.back().data() : nullptr, type, length);
}

const PluginFieldCollection* FieldStore::collection() {
  fc_.nbFields = static_cast<int32_t>(fields_.size());
  fc_.fields = fields_.data();
  return &fc_;
}

void FieldStore::clear() {
  names_.clear();
  data_.clear();
  fields_.clear();
}

namespace {

// ONNX INT / INTS -> kINT32 (the parser's mapping), FLOAT -> kFLOAT32, STRING -> kCHAR.
PluginFieldType field_type(AttrKind k) {
  switch (k) {
    case AttrKind::kInt:
    case AttrKind::kInts: return PluginFieldType::kINT32;
    case AttrKind::kFloat:
    case AttrKind::kFloats: return PluginFieldType::kFLOAT32;
    case AttrKind::kString: return PluginFieldType::kCHAR;
  }
  return PluginFieldType::kUNKNOWN;
}

const char* field_type_name(PluginFieldType t) {
  switch (t) {
    case PluginFieldType::kFLOAT16: return "float16";
    case PluginFieldType::kFLOAT32: return "float32";
    case PluginFieldType::kFLOAT64: return "float64";
    case PluginFieldType::kINT8: return "int8";
    case PluginFieldType::kINT16: return "int16";
    case PluginFieldType::kINT32: return "int32";
    case PluginFieldType::kINT64: return "int64";
    case PluginFieldType::kCHAR: return "char";
    case PluginFieldType::kDIMS: return "dims";
    case PluginFieldType::kBF16: return "bfloat16";
    default: return "unknown";
  }
}

// A PluginField as the raw attribute the core's attribute reader takes.
RawAttr raw_from_field(const PluginField& f) {
  RawAttr r;
  const int32_t n = f.length;
  if (n < 0 || (n > 0 && f.data == nullptr)) {
    r.type = RawAttr::kOther;
    r.other = "a " + std::string(field_type_name(f.type)) + " field of length " + std::to_string(n) + " without data";
    return r;
  }
  switch (f.type) {
    case PluginFieldType::kINT32:
    case PluginFieldType::kINT64: {
      std::vector<int64_t> v(static_cast<size_t>(n));
      for (int32_t i = 0; i < n; ++i) {
        v[i] = f.type == PluginFieldType::kINT32 ? static_cast<const int32_t*>(f.data)[i]
                                                 : static_cast<const int64_t*>(f.data)[i];
      }
      if (n == 1) {
        r.type = RawAttr::kInt;
        r.i = v[0];
      } else {
        r.type = RawAttr::kInts;
        r.ints = std::move(v);
      }
      return r;
    }
    case PluginFieldType::kFLOAT32:
    case PluginFieldType::kFLOAT64: {
      std::vector<float> v(static_cast<size_t>(n));
      for (int32_t i = 0; i < n; ++i) {
        v[i] = f.type == PluginFieldType::kFLOAT32 ? static_cast<const float*>(f.data)[i]
                                                   : static_cast<float>(static_cast<const double*>(f.data)[i]);
      }
      if (n == 1) {
        r.type = RawAttr::kFloat;
        r.f = f.type == PluginFieldType::kFLOAT32 ? static_cast<const float*>(f.data)[0]
                                                  : static_cast<const double*>(f.data)[0];
      } else {
        r.type = RawAttr::kFloats;
        r.floats = std::move(v);
      }
      return r;
    }
    case PluginFieldType::kCHAR: {
      std::string s(static_cast<const char*>(f.data), static_cast<size_t>(n));
      s.resize(std::strlen(s.c_str()));  // the parser may count a terminating NUL
      r.type = RawAttr::kString;
      r.s = s;
      return r;
    }
    default:
      r.type = RawAttr::kOther;
      r.other = std::to_string(n) + " " + field_type_name(f.type) + " values";
      return r;
  }
}

}  // namespace

void declare_fields(const OpVariant& v, FieldStore* out) {
  out->clear();
  for (const VariantField& f : variant_fields(v)) out->add(f.name, field_type(f.kind), nullptr, f.count, 0);
}

void serialize_fields(const OpVariant& v, const OpAttrs& attrs, FieldStore* out) {
  out->clear();
  const std::vector<AttrValue>& values = attrs.values;
  for (const VariantField& f : variant_fields(v)) {
    const AttrValue& a = values[f.canonical];
    switch (f.kind) {
      case AttrKind::kInt:
      case AttrKind::kInts: {
      std::vector<int32_t> ints;
        if (f.enum_values != nullptr) {  // an int naming a canonical string (mmdeploy pool_mode)
          ints.push_back(static_cast<int32_t>(enum_index(f.enum_values, a.s)));
        } else if (f.element >= 0) {
          ints.push_back(static_cast<int32_t>(a.ints[f.element]));
        } else {
          for (int64_t x : a.ints) ints.push_back(static_cast<int32_t>(x));
        }
        out->add(f.name, PluginFieldType::kINT32, ints.data(), static_cast<int32_t>(ints.size()),
                 ints.size() * sizeof(int32_t));
        break;
      }
      case AttrKind::kFloat: {
        const float x = static_cast<float>(a.f);
        out->add(f.name, PluginFieldType::kFLOAT32, &x, 1, sizeof(float));
        break;
      }
      case AttrKind::kString:
        out->add(f.name, PluginFieldType::kCHAR, a.s.data(), static_cast<int32_t>(a.s.size()), a.s.size());
        break;
      case AttrKind::kFloats: {
        std::vector<float> xs(a.floats.begin(), a.floats.end());
        out->add(f.name, PluginFieldType::kFLOAT32, xs.data(), static_cast<int32_t>(xs.size()),
                 xs.size() * sizeof(float));
        break;
      }
    }
  }
}

Status attrs_from_fields(const OpVariant& v, const PluginFieldCollection* fc, OpAttrs* out) {
  auto lookup = [fc](const char* name) {
    RawAttr r;
    if (fc == nullptr) return r;
    for (int32_t i = 0; i < fc->nbFields; ++i) {
      const PluginField& f = fc->fields[i];
      if (f.name != nullptr && std::strcmp(f.name, name) == 0) return raw_from_field(f);
    }
    return r;  // absent: the op's default
  };
  std::vector<AttrValue> values;
  DCNKIT_RETURN_IF_ERROR(read_attrs(v, lookup, &values));
  return make_op_attrs(v, std::move(values), out);
}

}  // namespace dcnkit::trt
