// ONNX nodes -> OpenVINO operations, through the ONNX frontend's ConversionExtension, and the library's entry point.
//
//   ONNX node                                           OpenVINO operation
//   standard DeformConv (opset 19+)                     DeformableConvolution-8, bilinear_interpolation_pad = true
//                                                       (+ Add for the bias): OpenVINO's own op, same semantics
//   every op_variants() entry: dcnkit::* and the        the kit's operation of that op (KitOp<I>, ov_op.h), computed
//   mmdeploy / mmcv names of every op of the table      by its declaration's CPU entry point
//
// DeformPSRoIPool runs on the kit's kernel too: OpenVINO 2026.4's DeformablePSROIPooling-1 computes the same function
// on good input, but reads outside the input for a batch index of -2 or N (garbage out), zeroes every RoI after one of
// index -1, and crashes the process on a NaN or infinite box coordinate, batch index or offset (docs/openvino.md).
//
// Standard RoiAlign is converted by OpenVINO itself (ROIAlign-9). The Python backend decides before conversion which
// standard DeformConv nodes run on the kit's kernel instead (measured per node), and moves every avg RoiAlign to the
// kit's (OpenVINO's differs at the border), by rewriting them to dcnkit nodes
// (python/dcnkit/runtime/openvino_rewrite.py).
#include <cstring>
#include <string>
#include <vector>

#include "openvino/core/extension.hpp"
#include "openvino/frontend/onnx/extension/conversion.hpp"
#include "openvino/op/add.hpp"
#include "openvino/op/concat.hpp"
#include "openvino/op/constant.hpp"
#include "openvino/op/deformable_convolution.hpp"
#include "openvino/op/reshape.hpp"
#include "openvino/op/shape_of.hpp"
#include "openvino/op/slice.hpp"
#include "ov_op.h"

namespace dcnkit::ov_ext {

namespace {

// ---------------------------------------------------------------------------------------------
// Attributes as the ONNX frontend gives them (int64_t, double, std::string, vectors of those)

RawAttr raw_attr(const ov::Any& a) {
  RawAttr r;
  if (a.empty()) return r;  // kAbsent
  if (a.is<int64_t>()) {
    r.type = RawAttr::kInt;
    r.i = a.as<int64_t>();
  } else if (a.is<double>()) {
    r.type = RawAttr::kFloat;
    r.f = a.as<double>();
  } else if (a.is<float>()) {
    r.type = RawAttr::kFloat;
    r.f = a.as<float>();
  } else if (a.is<std::string>()) {
    r.type = RawAttr::kString;
    r.s = a.as<std::string>();
  } else if (a.is<std::vector<int64_t>>()) {
    r.type = RawAttr::kInts;
    r.ints = a.as<std::vector<int64_t>>();
  } else if (a.is<std::vector<double>>()) {
    r.type = RawAttr::kFloats;
    for (double d : a.as<std::vector<double>>()) r.floats.push_back(static_cast<float>(d));
  } else if (a.is<std::vector<float>>()) {
    r.type = RawAttr::kFloats;
    r.floats = a.as<std::vector<float>>();
  } else {
    r.type = RawAttr::kOther;
  }
  return r;
}

[[noreturn]] void fail(const ov::frontend::NodeContext& ctx, const OpVariant& v, const std::string& message) {
  OPENVINO_THROW(v.domain, "::", v.op_type, " node '", ctx.get_name(), "': ", message);
}

bool is_absent(const ov::Output<ov::Node>& input) {
  return input.get_node() == nullptr || std::strcmp(input.get_node()->get_type_name(), "NullNode") == 0;
}

bool is_empty_tensor(const ov::Output<ov::Node>& input) {
  const ov::PartialShape& s = input.get_partial_shape();
  if (s.rank().is_dynamic()) return false;
  for (const auto& d : s)
    if (d.is_static() && d.get_length() == 0) return true;
  return false;
}

// (N, Lq, M*D) -> (N, Lq, M, D) for the names whose output is split per head (MultiscaleDeformableAttnPlugin_TRT).
ov::Output<ov::Node> split_heads(const ov::Output<ov::Node>& y, const ov::Output<ov::Node>& value) {
  using namespace ov::op;
  auto i64 = [](std::vector<int64_t> v) { return v0::Constant::create(ov::element::i64, {v.size()}, v); };
  auto slice = [&](const ov::Output<ov::Node>& shape, int64_t b, int64_t e) {
    return std::make_shared<v8::Slice>(shape, i64({b}), i64({e}), i64({1}));
  };
  auto nq = slice(std::make_shared<v3::ShapeOf>(y), 0, 2);
  auto md = slice(std::make_shared<v3::ShapeOf>(value), 2, 4);
  auto shape = std::make_shared<v0::Concat>(ov::OutputVector{nq, md}, 0);
  return std::make_shared<v1::Reshape>(y, shape, false);
}

// A node of any variant -> the kit's operation of its kind, canonical attributes and inputs.
ov::OutputVector convert_variant(const OpVariant& v, const ov::frontend::NodeContext& ctx) {
  std::vector<AttrValue> values;
  Status s = read_attrs(v, [&](const char* name) { return raw_attr(ctx.get_attribute_as_any(name)); }, &values);
  OpAttrs attrs;
  if (s.ok()) s = make_op_attrs(v, std::move(values), &attrs);
  if (!s.ok()) fail(ctx, v, s.message());

  const OpDef& def = v.op->def;
  ov::OutputVector args;
  std::vector<int64_t> slots;
  std::vector<bool> present(def.num_inputs, false);
  const size_t n = ctx.get_input_size();
  for (size_t i = 0; i < n; ++i) {
    const size_t slot_index = std::min(i, v.inputs.size() - 1);
    const InputSlot& slot = v.inputs[slot_index];
    if (i >= v.inputs.size() && !slot.variadic) {
      fail(ctx, v, "expected at most " + std::to_string(v.inputs.size()) + " inputs, got " + std::to_string(n));
    }
    const ov::Output<ov::Node> in = ctx.get_input(static_cast<int>(i));
    if (is_absent(in)) continue;
    if (v.empty_input_is_absent && slot.optional && is_empty_tensor(in)) continue;
    args.push_back(in);
    slots.push_back(slot.canonical);
    present[slot.canonical] = true;
  }
  for (const InputSlot& slot : v.inputs) {
    if (!slot.optional && !present[slot.canonical]) {
      fail(ctx, v, std::string(def.inputs[slot.canonical].name) + ": expected a tensor, got no input");
    }
  }
  auto op = make_kit_op(*v.op, args, std::move(slots), attrs.values, static_cast<int64_t>(def.num_outputs));
  int64_t empty_absent = 0;
  for (const InputSlot& slot : v.inputs) {
    if (v.empty_input_is_absent && slot.optional) empty_absent |= int64_t(1) << slot.canonical;
  }
  std::static_pointer_cast<KitOpBase>(op)->set_empty_inputs_absent(empty_absent);
  op->set_friendly_name(ctx.get_name());
  ov::OutputVector out = op->outputs();
  if (v.per_head_output) out[0] = split_heads(out[0], args[0]);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Standard ONNX DeformConv (X, W, offset[, B][, mask]) -> DeformableConvolution-8 with bilinear_interpolation_pad:
// taps less than a pixel off the map interpolate with zeros (docs/operators.md; the op's default, false, clamps).

ov::OutputVector convert_onnx_deform_conv(const ov::frontend::NodeContext& ctx) {
  using namespace ov::op;
  const size_t n = ctx.get_input_size();
  OPENVINO_ASSERT(n >= 3, "DeformConv node '", ctx.get_name(), "': expected inputs X, W, offset, got ", n);
  const auto x = ctx.get_input(0), w = ctx.get_input(1), offset = ctx.get_input(2);
  const auto ints = [&](const char* name, std::vector<int64_t> def) {
    return ctx.has_attribute(name) ? ctx.get_attribute<std::vector<int64_t>>(name) : def;
  };
  const std::vector<int64_t> strides = ints("strides", {1, 1}), dilations = ints("dilations", {1, 1}),
                             pads = ints("pads", {0, 0, 0, 0});
  OPENVINO_ASSERT(strides.size() == 2 && dilations.size() == 2 && pads.size() == 4, "DeformConv node '",
                  ctx.get_name(), "': expected a 2-D convolution (2 strides, 2 dilations, 4 pads)");
  const int64_t group = ctx.get_attribute<int64_t>("group", 1);
  const int64_t offset_group = ctx.get_attribute<int64_t>("offset_group", 1);
  const ov::Strides st(strides.begin(), strides.end()), dil(dilations.begin(), dilations.end());
  const ov::CoordinateDiff begin{pads[0], pads[1]}, end{pads[2], pads[3]};
  std::shared_ptr<ov::Node> y;
  if (n > 4 && !is_absent(ctx.get_input(4))) {
    y = std::make_shared<v8::DeformableConvolution>(x, offset, w, ctx.get_input(4), st, begin, end, dil,
                                                    ov::op::PadType::EXPLICIT, group, offset_group, true);
  } else {
    y = std::make_shared<v8::DeformableConvolution>(x, offset, w, st, begin, end, dil, ov::op::PadType::EXPLICIT,
                                                    group, offset_group, true);
  }
  y->set_friendly_name(ctx.get_name());
  if (n > 3 && !is_absent(ctx.get_input(3))) {
    auto shape = v0::Constant::create(ov::element::i64, {4}, std::vector<int64_t>{1, -1, 1, 1});
    auto bias = std::make_shared<v1::Reshape>(ctx.get_input(3), shape, false);
    return {std::make_shared<v1::Add>(y, bias)};
  }
  return {y};
}

std::vector<ov::Extension::Ptr> extensions() {
  std::vector<ov::Extension::Ptr> ext = op_extensions();
  for (const OpVariant& v : op_variants()) {
    if (v.tensorrt_only || v.onnx_standard) continue;  // ONNX's own DeformConv: convert_onnx_deform_conv below
    const OpVariant* vp = &v;
    ext.push_back(std::make_shared<ov::frontend::onnx::ConversionExtension>(
        v.op_type, v.domain, [vp](const ov::frontend::NodeContext& ctx) { return convert_variant(*vp, ctx); }));
  }
  for (const char* domain : {"", "ai.onnx"}) {
    ext.push_back(std::make_shared<ov::frontend::onnx::ConversionExtension>("DeformConv", domain,
                                                                            &convert_onnx_deform_conv));
  }
  return ext;
}

}  // namespace

}  // namespace dcnkit::ov_ext

OPENVINO_CREATE_EXTENSIONS(dcnkit::ov_ext::extensions());
