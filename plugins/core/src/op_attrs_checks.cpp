// The op table's canonical attribute values -> the core's checked attributes and params (make_op_attrs,
// make_params), and back (op_attr_values). The variants and the parsing of raw attributes: op_attrs.cpp.
#include <cstring>

#include "dcnkit/op_attrs.h"

namespace dcnkit {

// ---------------------------------------------------------------------------------------------
// Canonical values -> checked core attrs

namespace {
Status check_op_attrs(const OpVariant& variant, const std::vector<AttrValue>& a, OpAttrs* out);

// DCNv3 / DCNv4's int attributes (op_defs.h index) and the Dcnv3Attrs field each one sets.
struct Dcnv3IntField {
  int index;
  int64_t Dcnv3Attrs::*field;
};
constexpr Dcnv3IntField kDcnv3IntFields[] = {
    {kD3KernelH, &Dcnv3Attrs::kernel_h},     {kD3KernelW, &Dcnv3Attrs::kernel_w},
    {kD3StrideH, &Dcnv3Attrs::stride_h},     {kD3StrideW, &Dcnv3Attrs::stride_w},
    {kD3PadH, &Dcnv3Attrs::pad_h},           {kD3PadW, &Dcnv3Attrs::pad_w},
    {kD3DilationH, &Dcnv3Attrs::dilation_h}, {kD3DilationW, &Dcnv3Attrs::dilation_w},
    {kD3Group, &Dcnv3Attrs::group},          {kD3GroupChannels, &Dcnv3Attrs::group_channels},
    {kD3RemoveCenter, &Dcnv3Attrs::remove_center}};
}  // namespace

Status make_op_attrs(const OpVariant& variant, const std::vector<AttrValue>& a, OpAttrs* out) {
  const Status s = check_op_attrs(variant, a, out);
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

namespace {

Status check_op_attrs(const OpVariant& variant, const std::vector<AttrValue>& a, OpAttrs* out) {
  const char* op = variant.op_type;
  out->kind = variant.kind;
  switch (variant.kind) {
    case OpKind::kDeformConv2d: {
      DeformConv2dAttrs& d = out->dcn;
      d.stride_h = a[kDcStride].ints[0];
      d.stride_w = a[kDcStride].ints[1];
      d.pad_h = a[kDcPadding].ints[0];
      d.pad_w = a[kDcPadding].ints[1];
      d.dilation_h = a[kDcDilation].ints[0];
      d.dilation_w = a[kDcDilation].ints[1];
      d.groups = a[kDcGroups].ints[0];
      d.deformable_groups = a[kDcDeformGroups].ints[0];
      // Shapes that fit the attributes: any error left is the attributes'.
      const int64_t g = d.groups > 0 ? d.groups : 1, dg = d.deformable_groups > 0 ? d.deformable_groups : 1;
      if (g > (int64_t(1) << 24) || dg > (int64_t(1) << 24)) {
        return arg_error(op, "groups, deformable_groups", "values <= 2^24",
                         "(" + std::to_string(d.groups) + ", " + std::to_string(d.deformable_groups) + ")");
      }
      const int64_t cin = g * dg, hw = 16;
      const int64_t ho = (d.stride_h > 0 && d.dilation_h > 0 && d.pad_h >= 0)
                             ? deform_conv2d_out_size(hw, 1, d.stride_h, d.pad_h, d.dilation_h) : 1;
      const int64_t wo = (d.stride_w > 0 && d.dilation_w > 0 && d.pad_w >= 0)
                             ? deform_conv2d_out_size(hw, 1, d.stride_w, d.pad_w, d.dilation_w) : 1;
      DeformConv2dParams p;
      return make_deform_conv2d_params(op, {1, cin, hw, hw}, {1, 2 * dg, ho, wo}, {g, dg, 1, 1}, nullptr,
                                       nullptr, d, &p);
    }
    case OpKind::kRoIAlign: {
      RoIAlignAttrs& r = out->roi;
      r.pooled_h = a[kRaOutputSize].ints[0];
      r.pooled_w = a[kRaOutputSize].ints[1];
      r.spatial_scale = a[kRaScale].f;
      r.sampling_ratio = a[kRaSampling].ints[0];
      r.aligned = a[kRaAligned].ints[0] != 0;
      DCNKIT_RETURN_IF_ERROR(parse_pool_mode(op, a[kRaPoolMode].s, &r.mode));
      RoIAlignParams p;
      return make_roi_align_params(op, {1, 1, 16, 16}, {1, 5}, r, &p);
    }
    case OpKind::kDeformRoIPool: {
      DeformRoIPoolAttrs& r = out->droi;
      r.pooled_h = a[kDrOutputSize].ints[0];
      r.pooled_w = a[kDrOutputSize].ints[1];
      r.spatial_scale = a[kDrScale].f;
      r.sampling_ratio = a[kDrSampling].ints[0];
      r.gamma = a[kDrGamma].f;
      DeformRoIPoolParams p;
      return make_deform_roi_pool_params(op, {1, 1, 16, 16}, {1, 5}, nullptr, r, &p);
    }
    case OpKind::kDeformPSRoIPool: {
      DeformPSRoIPoolAttrs& r = out->psroi;
      r.spatial_scale = a[kPsScale].f;
      r.output_size = a[kPsOutputSize].ints[0];
      r.output_dim = a[kPsOutputDim].ints[0];
      r.group_size = a[kPsGroupSize].ints[0];
      r.part_size = a[kPsPartSize].ints[0];
      r.sample_per_part = a[kPsSamplePerPart].ints[0];
      r.trans_std = a[kPsTransStd].f;
      r.no_trans = a[kPsNoTrans].ints[0] != 0;
      const int64_t od = r.output_dim > 0 ? r.output_dim : 1, gs = r.group_size > 0 ? r.group_size : 1;
      if (od > (int64_t(1) << 24) || gs > (int64_t(1) << 16)) {
        return arg_error(op, "output_dim, group_size", "output_dim <= 2^24 and group_size <= 2^16",
                         "(" + std::to_string(r.output_dim) + ", " + std::to_string(r.group_size) + ")");
      }
      const int64_t ps = r.part_size > 0 ? r.part_size : (r.output_size > 0 ? r.output_size : 1);
      const Shape trans = {1, 2, ps, ps};
      DeformPSRoIPoolParams p;
      return make_deform_psroi_pool_params(op, {1, od * gs * gs, 16, 16}, {1, 5},
                                           r.no_trans ? nullptr : &trans, r, &p);
    }
    case OpKind::kMultiLevelRoIAlign: {
      MultiLevelRoIAlignAttrs& r = out->mlroi;
      const std::vector<double>& strides = a[kMlStrides].floats;
      if (strides.empty() || strides.size() > static_cast<size_t>(kMaxFeatureLevels)) {
        RawAttr raw;
        raw.type = RawAttr::kFloats;
        for (double x : strides) raw.floats.push_back(static_cast<float>(x));
        return arg_error(op, "featmap_strides",
                         "1 to " + std::to_string(kMaxFeatureLevels) + " floats (one stride per feature map)",
                         raw_attr_str(raw));
      }
      r.pooled_h = a[kMlOutputSize].ints[0];
      r.pooled_w = a[kMlOutputSize].ints[1];
      r.num_levels = static_cast<int64_t>(strides.size());
      for (size_t l = 0; l < strides.size(); ++l) r.featmap_strides[l] = strides[l];
      r.sampling_ratio = a[kMlSampling].ints[0];
      r.finest_scale = a[kMlFinestScale].ints[0];
      r.roi_scale_factor = a[kMlRoIScaleFactor].f;
      r.aligned = a[kMlAligned].ints[0] != 0;
      DCNKIT_RETURN_IF_ERROR(parse_pool_mode(op, a[kMlPoolMode].s, &r.mode));
      MultiLevelRoIAlignParams p;
      return make_multi_level_roi_align_params(op, std::vector<Shape>(strides.size(), Shape{1, 1, 16, 16}), {1, 5},
                                               r, &p);
    }
    case OpKind::kMultiScaleDeformableAttention: return Status::Ok();  // no attributes
    case OpKind::kDCNv3:
    case OpKind::kDCNv4: {
      Dcnv3Attrs& d = out->dcnv3;
      for (const auto& [i, field] : kDcnv3IntFields) d.*field = a[i].ints[0];
      d.offset_scale = a[kD3OffsetScale].f;
      d.remove_center = a[kD3RemoveCenter].ints[0];
      if (variant.kind == OpKind::kDCNv4) {
        const int64_t softmax = a[kD4Softmax].ints[0];
        if (softmax != 0 && softmax != 1) return arg_error(op, "softmax", "0 or 1", std::to_string(softmax));
        out->dcnv4_softmax = softmax != 0;
      }
      return check_dcnv3_attrs(op, d);
    }
  }
  return Status::Internal("unknown op kind");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Params of a call

namespace {
// Required inputs are present (the front ends check arity before): an absent one is an internal error.
Status need(const char* op, const Shape* const* in, int i, const TensorDef* defs) {
  if (in[i] == nullptr) return arg_error(op, defs[i].name, "a tensor", "no input");
  return Status::Ok();
}
}  // namespace

Status make_params(const char* op, const OpAttrs& a, const Shape* const* in, DeformConv2dParams* p) {
  for (int i : {kDcInput, kDcOffset, kDcWeight}) DCNKIT_RETURN_IF_ERROR(need(op, in, i, kDeformConv2dInputs));
  return make_deform_conv2d_params(op, *in[kDcInput], *in[kDcOffset], *in[kDcWeight], in[kDcBias], in[kDcMask],
                                   a.dcn, p);
}

Status make_params(const char* op, const OpAttrs& a, const Shape* const* in, RoIAlignParams* p) {
  for (int i : {kRaInput, kRaRois}) DCNKIT_RETURN_IF_ERROR(need(op, in, i, kRoIAlignInputs));
  return make_roi_align_params(op, *in[kRaInput], *in[kRaRois], a.roi, p);
}

Status make_params(const char* op, const OpAttrs& a, const Shape* const* in, DeformRoIPoolParams* p) {
  for (int i : {kDrInput, kDrRois}) DCNKIT_RETURN_IF_ERROR(need(op, in, i, kDeformRoIPoolInputs));
  return make_deform_roi_pool_params(op, *in[kDrInput], *in[kDrRois], in[kDrOffset], a.droi, p);
}

Status make_params(const char* op, const OpAttrs& a, const Shape* const* in, DeformPSRoIPoolParams* p) {
  for (int i : {kPsInput, kPsRois}) DCNKIT_RETURN_IF_ERROR(need(op, in, i, kDeformPSRoIPoolInputs));
  return make_deform_psroi_pool_params(op, *in[kPsInput], *in[kPsRois], in[kPsTrans], a.psroi, p);
}

Status make_params(const char* op, const OpAttrs& a, const Shape& rois, const std::vector<Shape>& features,
                   MultiLevelRoIAlignParams* p) {
  return make_multi_level_roi_align_params(op, features, rois, a.mlroi, p);
}

Status make_params(const char* op, const OpAttrs&, const Shape* const* in, MsdaParams* p) {
  for (int i : {kMsdaValue, kMsdaSpatialShapes, kMsdaLevelStart, kMsdaLocations, kMsdaWeights}) {
    DCNKIT_RETURN_IF_ERROR(need(op, in, i, kMsdaInputs));
  }
  return make_msda_params(op, *in[kMsdaValue], *in[kMsdaSpatialShapes], *in[kMsdaLevelStart], *in[kMsdaLocations],
                          *in[kMsdaWeights], p);
}

Status make_params(const char* op, const OpAttrs& a, const Shape* const* in, Dcnv3Params* p) {
  if (a.kind == OpKind::kDCNv4) {
    for (int i : {kD4Value, kD4OffsetMask}) DCNKIT_RETURN_IF_ERROR(need(op, in, i, kDcnv4Inputs));
    return make_dcnv4_params(op, a.dcnv3, a.dcnv4_softmax, *in[kD4Value], *in[kD4OffsetMask], p);
  }
  for (int i : {kD3Input, kD3Offset, kD3Mask}) DCNKIT_RETURN_IF_ERROR(need(op, in, i, kDcnv3Inputs));
  return make_dcnv3_params(op, a.dcnv3, *in[kD3Input], *in[kD3Offset], *in[kD3Mask], p);
}

std::vector<AttrValue> op_attr_values(const OpAttrs& a) {
  const OpDef& def = op_def(a.kind);
  std::vector<AttrValue> v;
  for (size_t i = 0; i < def.num_attrs; ++i) v.push_back(parse_default(def.attrs[i]));
  switch (a.kind) {
    case OpKind::kDeformConv2d: {
      const DeformConv2dAttrs& d = a.dcn;
      v[kDcStride].ints = {d.stride_h, d.stride_w};
      v[kDcPadding].ints = {d.pad_h, d.pad_w};
      v[kDcDilation].ints = {d.dilation_h, d.dilation_w};
      v[kDcGroups].ints = {d.groups};
      v[kDcDeformGroups].ints = {d.deformable_groups};
      break;
    }
    case OpKind::kRoIAlign: {
      const RoIAlignAttrs& r = a.roi;
      v[kRaOutputSize].ints = {r.pooled_h, r.pooled_w};
      v[kRaScale].f = r.spatial_scale;
      v[kRaSampling].ints = {r.sampling_ratio};
      v[kRaAligned].ints = {r.aligned ? 1 : 0};
      v[kRaPoolMode].s = pool_mode_name(r.mode);
      break;
    }
    case OpKind::kDeformRoIPool: {
      const DeformRoIPoolAttrs& r = a.droi;
      v[kDrOutputSize].ints = {r.pooled_h, r.pooled_w};
      v[kDrScale].f = r.spatial_scale;
      v[kDrSampling].ints = {r.sampling_ratio};
      v[kDrGamma].f = r.gamma;
      break;
    }
    case OpKind::kDeformPSRoIPool: {
      const DeformPSRoIPoolAttrs& r = a.psroi;
      v[kPsScale].f = r.spatial_scale;
      v[kPsOutputSize].ints = {r.output_size};
      v[kPsOutputDim].ints = {r.output_dim};
      v[kPsGroupSize].ints = {r.group_size};
      v[kPsPartSize].ints = {r.part_size};
      v[kPsSamplePerPart].ints = {r.sample_per_part};
      v[kPsTransStd].f = r.trans_std;
      v[kPsNoTrans].ints = {r.no_trans ? 1 : 0};
      break;
    }
    case OpKind::kMultiLevelRoIAlign: {
      const MultiLevelRoIAlignAttrs& r = a.mlroi;
      v[kMlOutputSize].ints = {r.pooled_h, r.pooled_w};
      v[kMlStrides].floats.assign(r.featmap_strides, r.featmap_strides + r.num_levels);
      v[kMlSampling].ints = {r.sampling_ratio};
      v[kMlFinestScale].ints = {r.finest_scale};
      v[kMlRoIScaleFactor].f = r.roi_scale_factor;
      v[kMlAligned].ints = {r.aligned ? 1 : 0};
      v[kMlPoolMode].s = pool_mode_name(r.mode);
      break;
    }
    case OpKind::kMultiScaleDeformableAttention: break;  // no attributes
    case OpKind::kDCNv3:
    case OpKind::kDCNv4: {
      const Dcnv3Attrs& d = a.dcnv3;
      for (const auto& [i, field] : kDcnv3IntFields) v[i].ints = {d.*field};
      v[kD3OffsetScale].f = d.offset_scale;
      if (a.kind == OpKind::kDCNv4) v[kD4Softmax].ints = {a.dcnv4_softmax ? 1 : 0};
      break;
    }
  }
  return v;
}

}  // namespace dcnkit
