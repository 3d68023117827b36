// Attributes of every operator as the front ends receive them, read once for every runtime.
//
// op_defs.h defines each op's canonical interface. This header adds the names other tools export
// (mmdeploy / mmcv 1.x: "variants" with their own input orders and attribute names), the conversion of
// a raw attribute (an ONNX attribute read through ONNX Runtime, a TensorRT PluginField) into the
// canonical value with the op's default where it is absent, and the checked core attrs of a node.
// The ONNX Runtime kernels and the TensorRT plugin creators both go through it, so an attribute name,
// kind, default or range is written once.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dcnkit/common.h"
#include "dcnkit/dcnv3.h"
#include "dcnkit/deform_conv2d.h"
#include "dcnkit/deform_psroi_pool.h"
#include "dcnkit/deform_roi_pool.h"
#include "dcnkit/msda.h"
#include "dcnkit/multi_level_roi_align.h"
#include "dcnkit/op_defs.h"
#include "dcnkit/roi_align.h"

namespace dcnkit {

// ---------------------------------------------------------------------------------------------
// Canonical attribute and input indices, looked up in op_defs.h at compile time (a renamed attribute
// there fails the build on the line that uses it instead of silently reading a default).

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
  static_assert(I >= 0, "op_defs.h: an attribute or input named here is not in its table (renamed?)");
  return I;
}

#define DCNKIT_INDEX(table, name) ::dcnkit::found_index<::dcnkit::def_index(table, name)>()

// DeformConv2d
constexpr int kDcStride = DCNKIT_INDEX(kDeformConv2dAttrs, "stride");
constexpr int kDcPadding = DCNKIT_INDEX(kDeformConv2dAttrs, "padding");
constexpr int kDcDilation = DCNKIT_INDEX(kDeformConv2dAttrs, "dilation");
constexpr int kDcGroups = DCNKIT_INDEX(kDeformConv2dAttrs, "groups");
constexpr int kDcDeformGroups = DCNKIT_INDEX(kDeformConv2dAttrs, "deformable_groups");
constexpr int kDcInput = DCNKIT_INDEX(kDeformConv2dInputs, "input");
constexpr int kDcOffset = DCNKIT_INDEX(kDeformConv2dInputs, "offset");
constexpr int kDcWeight = DCNKIT_INDEX(kDeformConv2dInputs, "weight");
constexpr int kDcBias = DCNKIT_INDEX(kDeformConv2dInputs, "bias");
constexpr int kDcMask = DCNKIT_INDEX(kDeformConv2dInputs, "mask");

// RoIAlign
constexpr int kRaOutputSize = DCNKIT_INDEX(kRoIAlignAttrs, "output_size");
constexpr int kRaScale = DCNKIT_INDEX(kRoIAlignAttrs, "spatial_scale");
constexpr int kRaSampling = DCNKIT_INDEX(kRoIAlignAttrs, "sampling_ratio");
constexpr int kRaAligned = DCNKIT_INDEX(kRoIAlignAttrs, "aligned");
constexpr int kRaPoolMode = DCNKIT_INDEX(kRoIAlignAttrs, "pool_mode");
constexpr int kRaInput = DCNKIT_INDEX(kRoIAlignInputs, "input");
constexpr int kRaRois = DCNKIT_INDEX(kRoIAlignInputs, "rois");

// DeformRoIPool
constexpr int kDrOutputSize = DCNKIT_INDEX(kDeformRoIPoolAttrs, "output_size");
constexpr int kDrScale = DCNKIT_INDEX(kDeformRoIPoolAttrs, "spatial_scale");
constexpr int kDrSampling = DCNKIT_INDEX(kDeformRoIPoolAttrs, "sampling_ratio");
constexpr int kDrGamma = DCNKIT_INDEX(kDeformRoIPoolAttrs, "gamma");
constexpr int kDrInput = DCNKIT_INDEX(kDeformRoIPoolInputs, "input");
constexpr int kDrRois = DCNKIT_INDEX(kDeformRoIPoolInputs, "rois");
constexpr int kDrOffset = DCNKIT_INDEX(kDeformRoIPoolInputs, "offset");

// DeformPSRoIPool
constexpr int kPsScale = DCNKIT_INDEX(kDeformPSRoIPoolAttrs, "spatial_scale");
constexpr int kPsOutputSize = DCNKIT_INDEX(kDeformPSRoIPoolAttrs, "output_size");
constexpr int kPsOutputDim = DCNKIT_INDEX(kDeformPSRoIPoolAttrs, "output_dim");
constexpr int kPsGroupSize = DCNKIT_INDEX(kDeformPSRoIPoolAttrs, "group_size");
constexpr int kPsPartSize = DCNKIT_INDEX(kDeformPSRoIPoolAttrs, "part_size");
constexpr int kPsSamplePerPart = DCNKIT_INDEX(kDeformPSRoIPoolAttrs, "sample_per_part");
constexpr int kPsTransStd = DCNKIT_INDEX(kDeformPSRoIPoolAttrs, "trans_std");
constexpr int kPsNoTrans = DCNKIT_INDEX(kDeformPSRoIPoolAttrs, "no_trans");
constexpr int kPsInput = DCNKIT_INDEX(kDeformPSRoIPoolInputs, "input");
constexpr int kPsRois = DCNKIT_INDEX(kDeformPSRoIPoolInputs, "rois");
constexpr int kPsTrans = DCNKIT_INDEX(kDeformPSRoIPoolInputs, "trans");

// MultiLevelRoIAlign (inputs: rois, then the variadic feature maps)
constexpr int kMlOutputSize = DCNKIT_INDEX(kMultiLevelRoIAlignAttrs, "output_size");
constexpr int kMlStrides = DCNKIT_INDEX(kMultiLevelRoIAlignAttrs, "featmap_strides");
constexpr int kMlSampling = DCNKIT_INDEX(kMultiLevelRoIAlignAttrs, "sampling_ratio");
constexpr int kMlFinestScale = DCNKIT_INDEX(kMultiLevelRoIAlignAttrs, "finest_scale");
constexpr int kMlRoIScaleFactor = DCNKIT_INDEX(kMultiLevelRoIAlignAttrs, "roi_scale_factor");
constexpr int kMlAligned = DCNKIT_INDEX(kMultiLevelRoIAlignAttrs, "aligned");
constexpr int kMlPoolMode = DCNKIT_INDEX(kMultiLevelRoIAlignAttrs, "pool_mode");
constexpr int kMlRois = DCNKIT_INDEX(kMultiLevelRoIAlignInputs, "rois");
constexpr int kMlFeatures = DCNKIT_INDEX(kMultiLevelRoIAlignInputs, "features");

// MultiScaleDeformableAttention (no attributes)
constexpr int kMsdaValue = DCNKIT_INDEX(kMsdaInputs, "value");
constexpr int kMsdaSpatialShapes = DCNKIT_INDEX(kMsdaInputs, "spatial_shapes");
constexpr int kMsdaLevelStart = DCNKIT_INDEX(kMsdaInputs, "level_start_index");
constexpr int kMsdaLocations = DCNKIT_INDEX(kMsdaInputs, "sampling_locations");
constexpr int kMsdaWeights = DCNKIT_INDEX(kMsdaInputs, "attention_weights");

// DCNv3 and DCNv4 (DCNv4: the same attributes at the same positions, then softmax)
constexpr int kD3KernelH = DCNKIT_INDEX(kDcnv3Attrs, "kernel_h");
constexpr int kD3KernelW = DCNKIT_INDEX(kDcnv3Attrs, "kernel_w");
constexpr int kD3StrideH = DCNKIT_INDEX(kDcnv3Attrs, "stride_h");
constexpr int kD3StrideW = DCNKIT_INDEX(kDcnv3Attrs, "stride_w");
constexpr int kD3PadH = DCNKIT_INDEX(kDcnv3Attrs, "pad_h");
constexpr int kD3PadW = DCNKIT_INDEX(kDcnv3Attrs, "pad_w");
constexpr int kD3DilationH = DCNKIT_INDEX(kDcnv3Attrs, "dilation_h");
constexpr int kD3DilationW = DCNKIT_INDEX(kDcnv3Attrs, "dilation_w");
constexpr int kD3Group = DCNKIT_INDEX(kDcnv3Attrs, "group");
constexpr int kD3GroupChannels = DCNKIT_INDEX(kDcnv3Attrs, "group_channels");
constexpr int kD3OffsetScale = DCNKIT_INDEX(kDcnv3Attrs, "offset_scale");
constexpr int kD3RemoveCenter = DCNKIT_INDEX(kDcnv3Attrs, "remove_center");
constexpr int kD4Softmax = DCNKIT_INDEX(kDcnv4Attrs, "softmax");
constexpr int kD3Input = DCNKIT_INDEX(kDcnv3Inputs, "input");
constexpr int kD3Offset = DCNKIT_INDEX(kDcnv3Inputs, "offset");
constexpr int kD3Mask = DCNKIT_INDEX(kDcnv3Inputs, "mask");
constexpr int kD4Value = DCNKIT_INDEX(kDcnv4Inputs, "value");
constexpr int kD4OffsetMask = DCNKIT_INDEX(kDcnv4Inputs, "offset_mask");
static_assert(DCNKIT_INDEX(kDcnv4Attrs, "remove_center") == kD3RemoveCenter && kD4Softmax == kD3RemoveCenter + 1,
              "op_defs.h: DCNv4's attributes are DCNv3's, then softmax");

// The feature map is the first input of every single-map operator; MultiLevelRoIAlign takes rois first
// (mmdeploy's order) and its maps as the last, variadic input.
static_assert(kDcInput == 0 && kRaInput == 0 && kDrInput == 0 && kPsInput == 0 && kD3Input == 0 && kD4Value == 0 &&
                  kD4OffsetMask == kD3Offset,
              "op_defs.h: input order changed");
static_assert(kMlRois == 0 && kMlFeatures == 1, "op_defs.h: MultiLevelRoIAlign input order changed");

// Inputs of any op (canonical order), an upper bound for fixed-size arrays of them.
constexpr size_t kMaxInputs = 8;

// ---------------------------------------------------------------------------------------------
// Operator variants: the kit's own ops (domain "dcnkit", names and defaults from op_defs.h) and the
// names mmdeploy / mmcv 1.x export, mapped onto the same kernels.

enum class OpKind : int {
  kDeformConv2d = 0,
  kRoIAlign = 1,
  kDeformRoIPool = 2,
  kDeformPSRoIPool = 3,
  kMultiLevelRoIAlign = 4,
  kMultiScaleDeformableAttention = 5,
  kDCNv3 = 6,
  kDCNv4 = 7,
};

const OpDef& op_def(OpKind kind);

// An attribute of a variant: its name in the model, the canonical attribute (AttrDef name) it sets,
// and which element of a canonical `ints` attribute (-1: the whole value). `enum_values` ("max|avg"):
// the variant writes an int that selects the i-th of these names of a canonical string attribute
// (mmdeploy's MMCVMultiLevelRoiAlign pool_mode: 0 = max, 1 = avg); see enum_index / enum_name.
struct AttrAlias {
  const char* onnx_name;
  const char* canonical;
  int element;
  const char* enum_values = nullptr;
};

// One node input of a variant: the canonical input (TensorDef index) it carries, whether the variant
// declares it optional, and whether it is variadic (the last slot only: one or more tensors, all of the
// canonical input; MultiLevelRoIAlign's feature maps).
struct InputSlot {
  int canonical;
  bool optional;
  bool variadic = false;
};

struct OpVariant {
  const char* domain;
  const char* op_type;
  OpKind kind;
  std::vector<InputSlot> inputs;
  std::vector<AttrAlias> aliases;   // empty: the canonical names and kinds of the OpDef
  bool empty_input_is_absent;       // mmcv convention: a 0-element optional input means "none"
  bool loose_attrs;                 // accept int for ints (broadcast), 1-element ints, float-valued ints,
                                    // and 4-element symmetric paddings (mmdeploy DeformConv2d)
  bool tensorrt_only = false;       // a TensorRT plugin name only (domain ""): the ONNX Runtime library skips it
  bool per_head_output = false;     // MultiScaleDeformableAttention: output (N, Lq, M, D), not (N, Lq, M*D)
                                    // (TensorRT's MultiscaleDeformableAttnPlugin_TRT; the same memory)
  bool onnx_standard = false;       // ONNX's own op (domain ""): 4-element paddings are ONNX pads [t, l, b, r]
                                    // (symmetric only); the ONNX Runtime library registers it where ONNX Runtime
                                    // has no kernel of its own, TensorRT's parser imports it natively
};

// All variants (the kit's ops first, in op_defs order; then mmdeploy's and mmcv 1.x's names, then TensorRT's own,
// then ONNX's own DeformConv).
const std::vector<OpVariant>& op_variants();

// One attribute of a variant as written in a model: its name, kind and element count
// (count 0: any length), and the canonical attribute (index into the OpDef's attrs) and element it sets;
// `enum_values` as in AttrAlias (kind kInt then, the canonical attribute a string).
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

// ---------------------------------------------------------------------------------------------
// Attribute values

// A canonical attribute value: ints (also for kInt, one element), float, floats or string.
struct AttrValue {
  std::vector<int64_t> ints;
  double f = 0.0;
  std::string s;
  std::vector<double> floats;
};

// The default of an AttrDef ("1", "[1, 1]", "0.1", "avg").
AttrValue parse_default(const AttrDef& d);

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

// Reads every canonical attribute of `variant` through `lookup(name as written in the model)`; absent
// ones take the OpDef's default. Errors name the op and the attribute as written in the model:
// "<op_type>: attribute <name>: expected <kind>, got <what>".
Status read_attrs(const OpVariant& variant, const std::function<RawAttr(const char*)>& lookup,
                  std::vector<AttrValue>* out);

// The core attrs of a node, checked once (with shapes built to fit them: any error left is the
// attributes'), whatever front end read them.
struct OpAttrs {
  OpKind kind = OpKind::kDeformConv2d;
  DeformConv2dAttrs dcn;
  RoIAlignAttrs roi;
  DeformRoIPoolAttrs droi;
  DeformPSRoIPoolAttrs psroi;
  MultiLevelRoIAlignAttrs mlroi;
  Dcnv3Attrs dcnv3{};          // DCNv3 and DCNv4
  bool dcnv4_softmax = false;  // DCNv4
};
Status make_op_attrs(const OpVariant& variant, const std::vector<AttrValue>& values, OpAttrs* out);

// A call's params from the node's attrs and its inputs' shapes in canonical order (`in[i]` null: input i
// absent), checked by the core: one overload per op kind, shared by every runtime. `op` names the node's
// op type in errors.
Status make_params(const char* op, const OpAttrs& a, const Shape* const* in, DeformConv2dParams* p);
Status make_params(const char* op, const OpAttrs& a, const Shape* const* in, RoIAlignParams* p);
Status make_params(const char* op, const OpAttrs& a, const Shape* const* in, DeformRoIPoolParams* p);
Status make_params(const char* op, const OpAttrs& a, const Shape* const* in, DeformPSRoIPoolParams* p);
// MultiLevelRoIAlign: rois and the L maps of the variadic input.
Status make_params(const char* op, const OpAttrs& a, const Shape& rois, const std::vector<Shape>& features,
                   MultiLevelRoIAlignParams* p);

// MultiScaleDeformableAttention: shapes only (the level tables' values are checked where they are read).
Status make_params(const char* op, const OpAttrs& a, const Shape* const* in, MsdaParams* p);

// DCNv3 (input, offset, mask) and DCNv4 (value, offset_mask), by a.kind.
Status make_params(const char* op, const OpAttrs& a, const Shape* const* in, Dcnv3Params* p);

// Back to canonical values (for serialization): the inverse of make_op_attrs.
std::vector<AttrValue> op_attr_values(const OpAttrs& a);

// Number of outputs a node of this op has at the most (DeformPSRoIPool: output and count).
inline size_t op_num_outputs(OpKind kind) { return op_def(kind).num_outputs; }

}  // namespace dcnkit
