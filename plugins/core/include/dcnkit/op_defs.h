// The one definition of every operator's interface: input order, attribute names, kinds and defaults.
// Read by the ONNX Runtime kernels and the TensorRT plugin creators (through these tables), and by
// the Python exporter and ONNX schemas (through dcnkit_op_defs_json(), exported by every dcnkit
// library). Names follow docs/design.md: snake_case ops, CamelCase ONNX op types / plugin names.
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
};

constexpr const char* kOnnxDomain = "dcnkit";
constexpr int kOpsetVersion = 1;

// ---- DeformConv2d -----------------------------------------------------------------------------
constexpr TensorDef kDeformConv2dInputs[] = {
    {"input", false, "(N, Cin, H, W)"},
    {"offset", false, "(N, 2*deformable_groups*kh*kw, Ho, Wo), (dy, dx) pairs"},
    {"weight", false, "(Cout, Cin/groups, kh, kw)"},
    {"bias", true, "(Cout)"},
    {"mask", true, "(N, deformable_groups*kh*kw, Ho, Wo); absent for DCNv1"},
};
constexpr TensorDef kDeformConv2dOutputs[] = {{"output", false, "(N, Cout, Ho, Wo)"}};
constexpr AttrDef kDeformConv2dAttrs[] = {
    {"stride", AttrKind::kInts, "[1, 1]", "(sh, sw)"},
    {"padding", AttrKind::kInts, "[0, 0]", "(ph, pw)"},
    {"dilation", AttrKind::kInts, "[1, 1]", "(dh, dw)"},
    {"groups", AttrKind::kInt, "1", "convolution groups"},
    {"deformable_groups", AttrKind::kInt, "1", "offset groups"},
};

// ---- RoIAlign ---------------------------------------------------------------------------------
constexpr TensorDef kRoIAlignInputs[] = {
    {"input", false, "(N, C, H, W)"},
    {"rois", false, "(K, 5) rows [batch_index, x1, y1, x2, y2]"},
};
constexpr TensorDef kRoIAlignOutputs[] = {{"output", false, "(K, C, oh, ow)"}};
constexpr AttrDef kRoIAlignAttrs[] = {
    {"output_size", AttrKind::kInts, "[1, 1]", "(oh, ow)"},
    {"spatial_scale", AttrKind::kFloat, "1.0", "scale from image to feature coordinates"},
    {"sampling_ratio", AttrKind::kInt, "0", "samples per bin and axis; <= 0: adaptive"},
    {"aligned", AttrKind::kInt, "0", "1: shift by half a pixel (pixel-center convention)"},
    {"pool_mode", AttrKind::kString, "avg", "avg | max"},
};

// ---- DeformRoIPool ----------------------------------------------------------------------------
constexpr TensorDef kDeformRoIPoolInputs[] = {
    {"input", false, "(N, C, H, W)"},
    {"rois", false, "(K, 5) rows [batch_index, x1, y1, x2, y2]"},
    {"offset", true, "(K, 2, oh, ow)"},
};
constexpr TensorDef kDeformRoIPoolOutputs[] = {{"output", false, "(K, C, oh, ow)"}};
constexpr AttrDef kDeformRoIPoolAttrs[] = {
    {"output_size", AttrKind::kInts, "[1, 1]", "(oh, ow)"},
    {"spatial_scale", AttrKind::kFloat, "1.0", "scale from image to feature coordinates"},
    {"sampling_ratio", AttrKind::kInt, "0", "samples per bin and axis; <= 0: adaptive"},
    {"gamma", AttrKind::kFloat, "0.1", "offset scale"},
};

// ---- DeformPSRoIPool --------------------------------------------------------------------------
constexpr TensorDef kDeformPSRoIPoolInputs[] = {
    {"input", false, "(N, output_dim*group_size^2, H, W)"},
    {"rois", false, "(K, 5) rows [batch_index, x1, y1, x2, y2]"},
    {"trans", true, "(K, 2*num_classes, part_size, part_size); absent when no_trans"},
};
constexpr TensorDef kDeformPSRoIPoolOutputs[] = {
    {"output", false, "(K, output_dim, P, P)"},
    {"count", true, "(K, output_dim, P, P) samples taken per bin"},
};
constexpr AttrDef kDeformPSRoIPoolAttrs[] = {
    {"spatial_scale", AttrKind::kFloat, "1.0", "scale from image to feature coordinates"},
    {"output_size", AttrKind::kInt, "7", "P"},
    {"output_dim", AttrKind::kInt, "1", "output channels"},
    {"group_size", AttrKind::kInt, "1", "position-sensitive groups per axis"},
    {"part_size", AttrKind::kInt, "0", "trans grid size; <= 0: output_size"},
    {"sample_per_part", AttrKind::kInt, "4", "samples per bin and axis"},
    {"trans_std", AttrKind::kFloat, "0.0", "scale of trans"},
    {"no_trans", AttrKind::kInt, "0", "1: no trans input"},
};

// ---- MultiLevelRoIAlign ------------------------------------------------------------------------
// Inputs as mmdeploy orders them: rois, then the L feature maps (finest first).
constexpr TensorDef kMultiLevelRoIAlignInputs[] = {
    {"rois", false, "(K, 5) rows [batch_index, x1, y1, x2, y2]"},
    {"features", false, "L maps (N, C, H_l, W_l), finest first (variadic: feat_0 .. feat_{L-1})", true},
};
constexpr TensorDef kMultiLevelRoIAlignOutputs[] = {{"output", false, "(K, C, oh, ow)"}};
constexpr AttrDef kMultiLevelRoIAlignAttrs[] = {
    {"output_size", AttrKind::kInts, "[1, 1]", "(oh, ow)"},
    {"featmap_strides", AttrKind::kFloats, "[]", "stride of every feature map (L values, required)"},
    {"sampling_ratio", AttrKind::kInt, "0", "samples per bin and axis; <= 0: adaptive"},
    {"finest_scale", AttrKind::kInt, "56", "RoI scale mapped to level 0"},
    {"roi_scale_factor", AttrKind::kFloat, "1.0", "RoI rescaling about its centre; <= 0: none"},
    {"aligned", AttrKind::kInt, "1", "1: shift by half a pixel (pixel-center convention)"},
    {"pool_mode", AttrKind::kString, "avg", "avg | max"},
};

// ---- MultiScaleDeformableAttention -----------------------------------------------------------
// Inputs in mmcv's order (MultiScaleDeformableAttnFunction, mmdeploy's MMCVMultiScaleDeformableAttention,
// TensorRT's MultiscaleDeformableAttnPlugin_TRT). No attributes: mmcv's im2col_step only batches its CUDA
// work and does not change the result; a node's im2col_step attribute is ignored.
constexpr TensorDef kMsdaInputs[] = {
    {"value", false, "(N, S, M, D), S = sum of H_l*W_l"},
    {"spatial_shapes", false, "(L, 2) int64 rows (H_l, W_l)", false, true},
    {"level_start_index", false, "(L) int64, first row of each level in value", false, true},
    {"sampling_locations", false, "(N, Lq, M, L, P, 2) as (x, y) in [0, 1]"},
    {"attention_weights", false, "(N, Lq, M, L, P)"},
};
constexpr TensorDef kMsdaOutputs[] = {{"output", false, "(N, Lq, M*D)"}};

// ---- DCNv3 / DCNv4 -----------------------------------------------------------------------------
// InternImage's attribute names (its exporter writes them on mmdeploy::TRTDCNv3, with an im2col_step that only
// batches its CUDA work: ignored). DCNv4 adds softmax. K = kernel_h*kernel_w (minus the centre: remove_center).
#define DCNKIT_DCNV3_ATTRS                                                                              \
  {"kernel_h", AttrKind::kInt, "3", "kernel height"}, {"kernel_w", AttrKind::kInt, "3", "kernel width"},  \
      {"stride_h", AttrKind::kInt, "1", "stride (h)"}, {"stride_w", AttrKind::kInt, "1", "stride (w)"},   \
      {"pad_h", AttrKind::kInt, "1", "padding (h)"}, {"pad_w", AttrKind::kInt, "1", "padding (w)"},       \
      {"dilation_h", AttrKind::kInt, "1", "dilation (h)"}, {"dilation_w", AttrKind::kInt, "1", "dilation (w)"}, \
      {"group", AttrKind::kInt, "1", "G, sampling groups"},                                             \
      {"group_channels", AttrKind::kInt, "1", "channels per group (C = G * group_channels)"},            \
      {"offset_scale", AttrKind::kFloat, "1.0", "scale of the offsets"},                                \
      {"remove_center", AttrKind::kInt, "0", "1: the kernel's centre point is not sampled"}
constexpr TensorDef kDcnv3Inputs[] = {
    {"input", false, "(N, H, W, C), channels last"},
    {"offset", false, "(N, Ho, Wo, G*K*2), per group and point (dx, dy)"},
    {"mask", false, "(N, Ho, Wo, G*K) weights, normalised by the caller"},
};
constexpr TensorDef kDcnv3Outputs[] = {{"output", false, "(N, Ho, Wo, C)"}};
constexpr AttrDef kDcnv3Attrs[] = {DCNKIT_DCNV3_ATTRS};

constexpr TensorDef kDcnv4Inputs[] = {
    {"value", false, "(N, H, W, C), channels last"},
    {"offset_mask", false, "(N, Ho, Wo, Cp): per group 2K offsets (dx, dy) then K weights; Cp = G*3K rounded up to 8"},
};
constexpr TensorDef kDcnv4Outputs[] = {{"output", false, "(N, Ho, Wo, C)"}};
constexpr AttrDef kDcnv4Attrs[] = {DCNKIT_DCNV3_ATTRS,
                                   {"softmax", AttrKind::kInt, "0", "1: softmax over each group's K weights"}};
#undef DCNKIT_DCNV3_ATTRS

#define DCNKIT_N(a) (sizeof(a) / sizeof((a)[0]))
constexpr OpDef kOpDefs[] = {
    {"deform_conv2d", "DeformConv2d", kDeformConv2dInputs, DCNKIT_N(kDeformConv2dInputs),
     kDeformConv2dOutputs, DCNKIT_N(kDeformConv2dOutputs), kDeformConv2dAttrs,
     DCNKIT_N(kDeformConv2dAttrs), /*gemm=*/true},
    {"roi_align", "RoIAlign", kRoIAlignInputs, DCNKIT_N(kRoIAlignInputs), kRoIAlignOutputs,
     DCNKIT_N(kRoIAlignOutputs), kRoIAlignAttrs, DCNKIT_N(kRoIAlignAttrs)},
    {"deform_roi_pool", "DeformRoIPool", kDeformRoIPoolInputs, DCNKIT_N(kDeformRoIPoolInputs),
     kDeformRoIPoolOutputs, DCNKIT_N(kDeformRoIPoolOutputs), kDeformRoIPoolAttrs,
     DCNKIT_N(kDeformRoIPoolAttrs)},
    {"deform_psroi_pool", "DeformPSRoIPool", kDeformPSRoIPoolInputs,
     DCNKIT_N(kDeformPSRoIPoolInputs), kDeformPSRoIPoolOutputs, DCNKIT_N(kDeformPSRoIPoolOutputs),
     kDeformPSRoIPoolAttrs, DCNKIT_N(kDeformPSRoIPoolAttrs)},
    {"multi_level_roi_align", "MultiLevelRoIAlign", kMultiLevelRoIAlignInputs,
     DCNKIT_N(kMultiLevelRoIAlignInputs), kMultiLevelRoIAlignOutputs, DCNKIT_N(kMultiLevelRoIAlignOutputs),
     kMultiLevelRoIAlignAttrs, DCNKIT_N(kMultiLevelRoIAlignAttrs)},
    {"multi_scale_deformable_attn", "MultiScaleDeformableAttention", kMsdaInputs, DCNKIT_N(kMsdaInputs),
     kMsdaOutputs, DCNKIT_N(kMsdaOutputs), nullptr, 0},
    {"dcnv3", "DCNv3", kDcnv3Inputs, DCNKIT_N(kDcnv3Inputs), kDcnv3Outputs, DCNKIT_N(kDcnv3Outputs), kDcnv3Attrs,
     DCNKIT_N(kDcnv3Attrs)},
    {"dcnv4", "DCNv4", kDcnv4Inputs, DCNKIT_N(kDcnv4Inputs), kDcnv4Outputs, DCNKIT_N(kDcnv4Outputs), kDcnv4Attrs,
     DCNKIT_N(kDcnv4Attrs)},
};
constexpr size_t kNumOpDefs = DCNKIT_N(kOpDefs);
#undef DCNKIT_N

// Looks an op up by snake_case name or ONNX type; nullptr when unknown.
const OpDef* find_op_def(const char* name);

}  // namespace dcnkit

// JSON of all OpDefs: {"domain": "dcnkit", "opset": 1, "ops": [{"name", "onnx_type", "inputs": [{"name",
// "optional", "doc", "variadic", "int64"}], "outputs": [...], "attrs": [{"name", "kind", "default", "doc"}],
// "gemm"}]}
// (kind: int | ints | float | floats | string). Exported by every dcnkit library.
extern "C" const char* dcnkit_op_defs_json();
