#include "dcnkit/op_attrs.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

namespace dcnkit {

const OpDef& op_def(OpKind kind) { return kOpDefs[static_cast<int>(kind)]; }

// ---------------------------------------------------------------------------------------------
// Variants

namespace {

std::vector<InputSlot> canonical_inputs(const OpDef& d) {
  std::vector<InputSlot> v;
  for (size_t i = 0; i < d.num_inputs; ++i) {
    v.push_back({static_cast<int>(i), d.inputs[i].optional, d.inputs[i].variadic});
  }
  return v;
}

std::vector<OpVariant> build_variants() {
  std::vector<OpVariant> v;
  // The kit's own operators: names, input order and defaults straight from op_defs.h.
  const OpKind kinds[] = {OpKind::kDeformConv2d, OpKind::kRoIAlign, OpKind::kDeformRoIPool,
                          OpKind::kDeformPSRoIPool, OpKind::kMultiLevelRoIAlign,
                          OpKind::kMultiScaleDeformableAttention, OpKind::kDCNv3, OpKind::kDCNv4};
  for (OpKind k : kinds) {
    const OpDef& d = op_def(k);
    v.push_back({kOnnxDomain, d.onnx_type, k, canonical_inputs(d), {}, false, false});
  }
  // mmcv 1.x / mmdeploy exports. ModulatedDeformConv2d: (input, offset, mask, weight[, bias]),
  // attributes stride, padding, dilation, groups, deform_groups.
  const std::vector<AttrAlias> dcn_aliases = {
      {"stride", kDeformConv2dAttrs[kDcStride].name, -1},
      {"padding", kDeformConv2dAttrs[kDcPadding].name, -1},
      {"dilation", kDeformConv2dAttrs[kDcDilation].name, -1},
      {"groups", kDeformConv2dAttrs[kDcGroups].name, -1},
      {"deform_groups", kDeformConv2dAttrs[kDcDeformGroups].name, -1},
  };
  const std::vector<InputSlot> mdcn_inputs = {
      {kDcInput, false}, {kDcOffset, false}, {kDcMask, false}, {kDcWeight, false}, {kDcBias, true}};
  const std::vector<InputSlot> dcn_inputs = {{kDcInput, false}, {kDcOffset, false}, {kDcWeight, false}};
  for (const char* domain : {"mmdeploy", "mmcv"}) {
    v.push_back({domain, "MMCVModulatedDeformConv2d", OpKind::kDeformConv2d, mdcn_inputs, dcn_aliases,
                 true, true});
    // mmcv 1.x DeformConv2d also writes bias (always 0) and im2col_step: ignored.
    v.push_back({domain, "MMCVDeformConv2d", OpKind::kDeformConv2d, dcn_inputs, dcn_aliases, true, true});
  }
  // mmcv::MMCVRoiAlign: output_height, output_width, spatial_scale, sampling_ratio, mode, aligned.
  v.push_back({"mmcv",
               "MMCVRoiAlign",
               OpKind::kRoIAlign,
               {{kRaInput, false}, {kRaRois, false}},
               {{"output_height", kRoIAlignAttrs[kRaOutputSize].name, 0},
                {"output_width", kRoIAlignAttrs[kRaOutputSize].name, 1},
                {"spatial_scale", kRoIAlignAttrs[kRaScale].name, -1},
                {"sampling_ratio", kRoIAlignAttrs[kRaSampling].name, -1},
                {"mode", kRoIAlignAttrs[kRaPoolMode].name, -1},
                {"aligned", kRoIAlignAttrs[kRaAligned].name, -1}},
               true,
               true});
  // mmcv::MMCVDeformRoIPool: (input, rois[, offset]); pooled_height, pooled_width, spatial_scale,
  // sampling_ratio (written as a float by mmcv), gamma.
  v.push_back({"mmcv",
               "MMCVDeformRoIPool",
               OpKind::kDeformRoIPool,
               {{kDrInput, false}, {kDrRois, false}, {kDrOffset, true}},
               {{"pooled_height", kDeformRoIPoolAttrs[kDrOutputSize].name, 0},
                {"pooled_width", kDeformRoIPoolAttrs[kDrOutputSize].name, 1},
                {"spatial_scale", kDeformRoIPoolAttrs[kDrScale].name, -1},
                {"sampling_ratio", kDeformRoIPoolAttrs[kDrSampling].name, -1},
                {"gamma", kDeformRoIPoolAttrs[kDrGamma].name, -1}},
               true,
               true});
  // mmdeploy::MMCVMultiLevelRoiAlign: (rois, feat_0, ..., feat_{L-1}); output_height, output_width,
  // featmap_strides (floats), sampling_ratio, finest_scale, roi_scale_factor (float), aligned, and pool_mode
  // as an int (0: max, 1: avg).
  v.push_back({"mmdeploy",
               "MMCVMultiLevelRoiAlign",
               OpKind::kMultiLevelRoIAlign,
               {{kMlRois, false}, {kMlFeatures, false, true}},
               {{"output_height", kMultiLevelRoIAlignAttrs[kMlOutputSize].name, 0},
                {"output_width", kMultiLevelRoIAlignAttrs[kMlOutputSize].name, 1},
                {"featmap_strides", kMultiLevelRoIAlignAttrs[kMlStrides].name, -1},
                {"sampling_ratio", kMultiLevelRoIAlignAttrs[kMlSampling].name, -1},
                {"finest_scale", kMultiLevelRoIAlignAttrs[kMlFinestScale].name, -1},
                {"roi_scale_factor", kMultiLevelRoIAlignAttrs[kMlRoIScaleFactor].name, -1},
                {"aligned", kMultiLevelRoIAlignAttrs[kMlAligned].name, -1},
                {"pool_mode", kMultiLevelRoIAlignAttrs[kMlPoolMode].name, -1, "max|avg"}},
               false,
               true});
  // mmdeploy's and mmcv's MMCVMultiScaleDeformableAttention: the canonical inputs, in the same order; their
  // im2col_step attribute is ignored.
  for (const char* domain : {"mmdeploy", "mmcv"}) {
    v.push_back({domain, "MMCVMultiScaleDeformableAttention", OpKind::kMultiScaleDeformableAttention,
                 canonical_inputs(op_def(OpKind::kMultiScaleDeformableAttention)), {}, false, false});
  }
  // InternImage's exporter: mmdeploy::TRTDCNv3 (input, offset, mask) with the canonical attribute names and an
  // im2col_step that is ignored.
  v.push_back({"mmdeploy", "TRTDCNv3", OpKind::kDCNv3, canonical_inputs(op_def(OpKind::kDCNv3)), {}, false, false});
  // TensorRT's own plugin name (no fields): the same five inputs (TensorRT's plugin takes the level tables in int32;
  // the kit's takes int32 or int64), output (N, Lq, M, D). TensorRT has no domains: the variant of domain "" is its
  // creator, and the ONNX Runtime library does not register it (the default ONNX domain). ONNX Runtime runs the
  // name in the domains the exporters that write it use (torch symbolics: "nvidia::", "trt::", "TRT::"), with
  // int64 tables as torch writes them (TensorRT's ONNX parser casts them to int32 for this plugin).
  for (const char* domain : {"", "nvidia", "trt", "TRT"}) {
    OpVariant trt_msda{domain, "MultiscaleDeformableAttnPlugin_TRT", OpKind::kMultiScaleDeformableAttention,
                       canonical_inputs(op_def(OpKind::kMultiScaleDeformableAttention)), {}, false, false};
    trt_msda.tensorrt_only = domain[0] == '\0';
    trt_msda.per_head_output = true;
    v.push_back(trt_msda);
  }
  // ONNX's DeformConv (opset 19): DeformConv(X, W, offset[, B][, mask]) with strides, pads [t, l, b, r],
  // dilations, group, offset_group (kernel_shape is checked against W by the ONNX Runtime kernel).
  OpVariant onnx_dcn{"",
                     "DeformConv",
                     OpKind::kDeformConv2d,
                     {{kDcInput, false}, {kDcWeight, false}, {kDcOffset, false}, {kDcBias, true}, {kDcMask, true}},
                     {{"strides", kDeformConv2dAttrs[kDcStride].name, -1},
                      {"pads", kDeformConv2dAttrs[kDcPadding].name, -1},
                      {"dilations", kDeformConv2dAttrs[kDcDilation].name, -1},
                      {"group", kDeformConv2dAttrs[kDcGroups].name, -1},
                      {"offset_group", kDeformConv2dAttrs[kDcDeformGroups].name, -1}},
                     false,
                     false};
  onnx_dcn.onnx_standard = true;
  v.push_back(onnx_dcn);
  return v;
}

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

const std::vector<OpVariant>& op_variants() {
  static const std::vector<OpVariant> v = build_variants();
  return v;
}

std::vector<VariantField> variant_fields(const OpVariant& v) {
  const OpDef& def = op_def(v.kind);
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
  const OpDef& def = op_def(variant.kind);
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
