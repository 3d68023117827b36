// The expected creators of tensorrt_lifecycle_test.cpp: fields, shapes, bad inputs, written from the operator
// contract (docs/operators.md), not read from the library. Included once, inside that file's namespace.
#pragma once

// ---------------------------------------------------------------------------------------------
// The expected table

struct FieldDecl {
  const char* name;
  PluginFieldType type;
  int32_t length;  // 0: any (strings)
};

struct BadFields {
  std::vector<Field> fields;
  const char* field;  // the field the error must name
};

struct Case {
  const char* name;
  const char* ns;
  std::vector<FieldDecl> declared;
  std::vector<Field> fields;
  std::vector<std::vector<int64_t>> inputs;
  std::vector<std::vector<int64_t>> outputs;
  int batch_source;                                  // input whose dim 0 is the outputs' dim 0
  std::vector<std::vector<int64_t>> bad_inputs;      // inputs the shape checks must reject
  std::vector<BadFields> bad_fields;
  size_t min_workspace;                              // bytes, float32
  std::vector<Field> required = {};                  // fields without a default (the rest may be absent)
  std::vector<size_t> index_inputs = {};             // int64 or int32 index tables (int64 in the generic walk)
  bool tensorrt_own_name = false;                    // TensorRT's plugin library has this name: not in getCreators,
                                                     // registered through dcnkit_trt_register_creators only
};

const PluginFieldType I32 = PluginFieldType::kINT32, F32 = PluginFieldType::kFLOAT32, CHR = PluginFieldType::kCHAR;

// DCN output size: floor((H + 2p - (d(k-1)+1)) / s) + 1.
int64_t conv_out(int64_t h, int64_t k, int64_t s, int64_t p, int64_t d) { return (h + 2 * p - (d * (k - 1) + 1)) / s + 1; }

std::vector<Case> cases() {
  std::vector<Case> c;
  const std::vector<FieldDecl> dcn_decl = {{"stride", I32, 2}, {"padding", I32, 2}, {"dilation", I32, 2},
                                           {"groups", I32, 1}, {"deformable_groups", I32, 1}};
  {
    const int64_t ho = conv_out(17, 3, 2, 1, 1), wo = conv_out(19, 3, 2, 1, 1);  // 9, 10
    c.push_back({"DeformConv2d", "dcnkit", dcn_decl,
                 {ints("stride", {2, 2}), ints("padding", {1, 1}), ints("dilation", {1, 1}), ints("groups", {1}),
                  ints("deformable_groups", {2})},
                 {{2, 8, 17, 19}, {2, 36, ho, wo}, {16, 8, 3, 3}, {16}, {2, 18, ho, wo}},
                 {{2, 16, ho, wo}},
                 0,
                 {{2, 7, 17, 19}, {2, 36, ho, wo}, {16, 7, 3, 3}, {16}, {2, 18, ho, wo}},
                 {{{ints("stride", {0, 1})}, "stride"},
                  {{flt("stride", 2.f)}, "stride"},
                  {{ints("deformable_groups", {0})}, "deformable_groups"},
                  {{ints("padding", {1, 1, 1})}, "padding"}},
                 size_t(8) * 9 * ho * wo * 4});
  }
  c.push_back({"RoIAlign", "dcnkit",
               {{"output_size", I32, 2}, {"spatial_scale", F32, 1}, {"sampling_ratio", I32, 1}, {"aligned", I32, 1},
                {"pool_mode", CHR, 0}},
               {ints("output_size", {7, 7}), flt("spatial_scale", 0.25f), ints("sampling_ratio", {2}),
                ints("aligned", {1}), str("pool_mode", "max")},
               {{2, 16, 32, 32}, {5, 5}},
               {{5, 16, 7, 7}},
               1,
               {{2, 16, 32, 32}, {5, 4}},
               {{{str("pool_mode", "median")}, "pool_mode"},
                {{flt("spatial_scale", 0.f)}, "spatial_scale"},
                {{ints("output_size", {0, 7})}, "output_size"},
                {{ints("sampling_ratio", {1, 2, 3})}, "sampling_ratio"},
                // above kMaxSamplingRatio (1024): would make every bin sample 2^60 points
                {{ints("sampling_ratio", {1 << 30})}, "sampling_ratio"}},
               0});
  c.push_back({"DeformRoIPool", "dcnkit",
               {{"output_size", I32, 2}, {"spatial_scale", F32, 1}, {"sampling_ratio", I32, 1}, {"gamma", F32, 1}},
               {ints("output_size", {3, 3}), flt("spatial_scale", 0.5f), ints("sampling_ratio", {0}),
                flt("gamma", 0.1f)},
               {{1, 4, 10, 10}, {3, 5}, {3, 2, 3, 3}},
               {{3, 4, 3, 3}},
               1,
               {{1, 4, 10, 10}, {3, 5}, {3, 2, 4, 4}},
               {{{ints("gamma", {1})}, "gamma"}, {{ints("output_size", {3})}, "output_size"},
                {{ints("sampling_ratio", {1 << 30})}, "sampling_ratio"}},
               0});
  c.push_back({"DeformPSRoIPool", "dcnkit",
               {{"spatial_scale", F32, 1}, {"output_size", I32, 1}, {"output_dim", I32, 1}, {"group_size", I32, 1},
                {"part_size", I32, 1}, {"sample_per_part", I32, 1}, {"trans_std", F32, 1}, {"no_trans", I32, 1}},
               {flt("spatial_scale", 0.0625f), ints("output_size", {3}), ints("output_dim", {2}),
                ints("group_size", {3}), ints("part_size", {3}), ints("sample_per_part", {2}), flt("trans_std", 0.1f),
                ints("no_trans", {0})},
               {{1, 18, 12, 12}, {4, 5}, {4, 2, 3, 3}},
               {{4, 2, 3, 3}, {4, 2, 3, 3}},
               1,
               {{1, 17, 12, 12}, {4, 5}, {4, 2, 3, 3}},
               {{{ints("group_size", {0})}, "group_size"}, {{str("output_dim", "2")}, "output_dim"},
                {{ints("sample_per_part", {1 << 30})}, "sample_per_part"}},
               0});
  const std::vector<FieldDecl> mm_dcn_decl = {{"stride", I32, 2}, {"padding", I32, 2}, {"dilation", I32, 2},
                                              {"groups", I32, 1}, {"deform_groups", I32, 1}};
  const std::vector<Field> mm_dcn_fields = {ints("stride", {1, 1}), ints("padding", {1, 1}), ints("dilation", {1, 1}),
                                            ints("groups", {1}), ints("deform_groups", {1})};
  // mmdeploy's input order: (input, offset, mask, weight[, bias]).
  c.push_back({"MMCVModulatedDeformConv2d", "", mm_dcn_decl, mm_dcn_fields,
               {{1, 4, 8, 8}, {1, 18, 8, 8}, {1, 9, 8, 8}, {6, 4, 3, 3}, {6}},
               {{1, 6, 8, 8}},
               0,
               {{1, 4, 8, 8}, {1, 18, 8, 8}, {1, 9, 8, 8}, {6, 4, 3, 3}, {5}},
               {{{ints("deform_groups", {-1})}, "deform_groups"}, {{str("stride", "1")}, "stride"}},
               size_t(4) * 9 * 64 * 4});
  c.push_back({"MMCVDeformConv2d", "", mm_dcn_decl, mm_dcn_fields,
               {{1, 4, 8, 8}, {1, 18, 8, 8}, {6, 4, 3, 3}},
               {{1, 6, 8, 8}},
               0,
               {{1, 4, 8, 8}, {1, 16, 8, 8}, {6, 4, 3, 3}},
               {{{ints("groups", {0})}, "groups"}},
               size_t(4) * 9 * 64 * 4});
  c.push_back({"MMCVRoiAlign", "",
               {{"output_height", I32, 1}, {"output_width", I32, 1}, {"spatial_scale", F32, 1},
                {"sampling_ratio", I32, 1}, {"mode", CHR, 0}, {"aligned", I32, 1}},
               {ints("output_height", {2}), ints("output_width", {3}), flt("spatial_scale", 1.f),
                ints("sampling_ratio", {0}), str("mode", "avg"), ints("aligned", {0})},
               {{1, 3, 8, 8}, {2, 5}},
               {{2, 3, 2, 3}},
               1,
               {{1, 3, 8}, {2, 5}},
               {{{str("mode", "sum")}, "mode"}, {{ints("output_width", {-3})}, "output_width"},
                {{ints("sampling_ratio", {1 << 30})}, "sampling_ratio"}},
               0});
  c.push_back({"MMCVDeformRoIPool", "",
               {{"pooled_height", I32, 1}, {"pooled_width", I32, 1}, {"spatial_scale", F32, 1},
                {"sampling_ratio", I32, 1}, {"gamma", F32, 1}},
               // mmcv writes sampling_ratio as a float.
               {ints("pooled_height", {2}), ints("pooled_width", {2}), flt("spatial_scale", 1.f),
                flt("sampling_ratio", 2.f), flt("gamma", 0.1f)},
               {{1, 3, 8, 8}, {2, 5}},
               {{2, 3, 2, 2}},
               1,
               {{1, 3, 8, 8}, {2, 6}},
               {{{flt("sampling_ratio", 2.5f)}, "sampling_ratio"}, {{flt("sampling_ratio", 1073741824.f)}, "sampling_ratio"}},
               0});
  // Rotated RoIAlign (issue 38's new operator: served with no line in the plugin library): rois (K, 6).
  c.push_back({"RoIAlignRotated", "dcnkit",
               {{"output_size", I32, 2}, {"spatial_scale", F32, 1}, {"sampling_ratio", I32, 1}, {"aligned", I32, 1},
                {"clockwise", I32, 1}},
               {ints("output_size", {7, 5}), flt("spatial_scale", 0.25f), ints("sampling_ratio", {2}),
                ints("aligned", {1}), ints("clockwise", {0})},
               {{2, 16, 32, 32}, {5, 6}},
               {{5, 16, 7, 5}},
               1,
               {{2, 16, 32, 32}, {5, 5}},
               {{{flt("spatial_scale", 0.f)}, "spatial_scale"},
                {{ints("output_size", {0, 7})}, "output_size"},
                {{ints("sampling_ratio", {1 << 30})}, "sampling_ratio"}},
               0});
  c.push_back({"MMCVRoIAlignRotated", "",
               {{"output_height", I32, 1}, {"output_width", I32, 1}, {"spatial_scale", F32, 1},
                {"sampling_ratio", I32, 1}, {"aligned", I32, 1}, {"clockwise", I32, 1}},
               {ints("output_height", {2}), ints("output_width", {3}), flt("spatial_scale", 1.f),
                ints("sampling_ratio", {0}), ints("aligned", {0}), ints("clockwise", {1})},
               {{1, 3, 8, 8}, {2, 6}},
               {{2, 3, 2, 3}},
               1,
               {{1, 3, 8}, {2, 6}},
               {{{ints("output_width", {-3})}, "output_width"}, {{ints("sampling_ratio", {1 << 30})}, "sampling_ratio"}},
               0});
  // Multi-level RoIAlign: rois, then the L maps (variadic); level by box size, output (K, C, oh, ow).
  const std::vector<std::vector<int64_t>> ml_inputs = {{6, 5}, {2, 8, 32, 32}, {2, 8, 16, 16}, {2, 8, 8, 8}};
  const std::vector<std::vector<int64_t>> ml_bad = {{6, 5}, {2, 8, 32, 32}, {2, 7, 16, 16}, {2, 8, 8, 8}};
  c.push_back({"MultiLevelRoIAlign", "dcnkit",
               {{"output_size", I32, 2}, {"featmap_strides", F32, 0}, {"sampling_ratio", I32, 1},
                {"finest_scale", I32, 1}, {"roi_scale_factor", F32, 1}, {"aligned", I32, 1}, {"pool_mode", CHR, 0}},
               {ints("output_size", {7, 7}), flts("featmap_strides", {4.f, 8.f, 16.f}), ints("sampling_ratio", {2}),
                ints("finest_scale", {56}), flt("roi_scale_factor", 1.f), ints("aligned", {1}), str("pool_mode", "avg")},
               ml_inputs,
               {{6, 8, 7, 7}},
               0,
               ml_bad,
               {{{flts("featmap_strides", {4.f, 0.f, 16.f})}, "featmap_strides"},
                {{str("pool_mode", "median")}, "pool_mode"},
                {{ints("finest_scale", {0})}, "finest_scale"},
                {{ints("output_size", {7, 0})}, "output_size"},
                {{ints("sampling_ratio", {1 << 30})}, "sampling_ratio"}},
               0,
               {flts("featmap_strides", {4.f, 8.f, 16.f})}});
  // mmdeploy's node: output_height/output_width, pool_mode as an int (0 max, 1 avg).
  c.push_back({"MMCVMultiLevelRoiAlign", "",
               {{"output_height", I32, 1}, {"output_width", I32, 1}, {"featmap_strides", F32, 0},
                {"sampling_ratio", I32, 1}, {"finest_scale", I32, 1}, {"roi_scale_factor", F32, 1},
                {"aligned", I32, 1}, {"pool_mode", I32, 1}},
               {ints("output_height", {3}), ints("output_width", {5}), flts("featmap_strides", {4.f, 8.f, 16.f}),
                ints("sampling_ratio", {0}), ints("finest_scale", {56}), flt("roi_scale_factor", 2.f),
                ints("aligned", {0}), ints("pool_mode", {0})},
               ml_inputs,
               {{6, 8, 3, 5}},
               0,
               ml_bad,
               {{{ints("pool_mode", {2})}, "pool_mode"},
                {{flts("featmap_strides", {-4.f, 8.f, 16.f})}, "featmap_strides"},
                {{ints("output_height", {0})}, "output_height"},
                {{ints("sampling_ratio", {1 << 30})}, "sampling_ratio"}},
               0,
               {flts("featmap_strides", {4.f, 8.f, 16.f})}});
  // Multi-scale deformable attention: value (N, S, M, D), spatial_shapes (L, 2), level_start_index (L),
  // sampling_locations (N, Lq, M, L, P, 2), attention_weights (N, Lq, M, L, P); no fields. Levels 6x5 and 3x3:
  // S = 39; M = 4 heads of D = 8; Lq = 7; P = 3. Output (N, Lq, M*D); TensorRT's own name: (N, Lq, M, D).
  const std::vector<std::vector<int64_t>> msda_in = {{2, 39, 4, 8}, {2, 2}, {2}, {2, 7, 4, 2, 3, 2}, {2, 7, 4, 2, 3}};
  const std::vector<std::vector<int64_t>> msda_bad = {{2, 39, 4, 8}, {2, 2}, {2}, {2, 7, 4, 2, 3, 2}, {2, 7, 4, 2, 4}};
  c.push_back({"MultiScaleDeformableAttention", "dcnkit", {}, {}, msda_in, {{2, 7, 32}}, 0, msda_bad, {}, 0, {}, {1, 2}});
  c.push_back(
      {"MMCVMultiScaleDeformableAttention", "", {}, {}, msda_in, {{2, 7, 32}}, 0, msda_bad, {}, 0, {}, {1, 2}});
  c.push_back({"MultiscaleDeformableAttnPlugin_TRT", "", {}, {}, msda_in, {{2, 7, 4, 8}}, 0, msda_bad, {}, 0, {}, {1, 2},
               true});
  // DCNv3 / DCNv4, channels last, InternImage's attribute names: a (2, 9, 11, 8) map, 2 groups of 4 channels, 3x3,
  // stride 2, pad 1: Ho = 5, Wo = 6, K = 9. DCNv3: offset (.., G*K*2 = 36), mask (.., G*K = 18); DCNv4: offset_mask
  // (.., Cp = 54 rounded up to 56). Output (N, Ho, Wo, C).
  std::vector<FieldDecl> d3_decl;
  for (const char* f : {"kernel_h", "kernel_w", "stride_h", "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w",
                        "group", "group_channels"}) {
    d3_decl.push_back({f, I32, 1});
  }
  d3_decl.push_back({"offset_scale", F32, 1});
  d3_decl.push_back({"remove_center", I32, 1});
  const std::vector<Field> d3_fields = {ints("kernel_h", {3}), ints("kernel_w", {3}), ints("stride_h", {2}),
                                        ints("stride_w", {2}), ints("pad_h", {1}), ints("pad_w", {1}),
                                        ints("dilation_h", {1}), ints("dilation_w", {1}), ints("group", {2}),
                                        ints("group_channels", {4}), flt("offset_scale", 0.5f), ints("remove_center", {0})};
  const std::vector<BadFields> d3_bad = {{{ints("group", {0})}, "group"},
                                         {{ints("kernel_w", {0})}, "kernel_w"},
                                         {{ints("offset_scale", {1})}, "offset_scale"},
                                         {{ints("remove_center", {2})}, "remove_center"},
                                         {{ints("stride_h", {1, 1})}, "stride_h"}};
  const std::vector<std::vector<int64_t>> d3_in = {{2, 9, 11, 8}, {2, 5, 6, 36}, {2, 5, 6, 18}};
  const std::vector<std::vector<int64_t>> d3_bad_in = {{2, 9, 11, 8}, {2, 5, 6, 36}, {2, 5, 6, 17}};
  c.push_back({"DCNv3", "dcnkit", d3_decl, d3_fields, d3_in, {{2, 5, 6, 8}}, 0, d3_bad_in, d3_bad, 0});
  // InternImage's exporter: mmdeploy::TRTDCNv3, the same inputs and field names.
  c.push_back({"TRTDCNv3", "", d3_decl, d3_fields, d3_in, {{2, 5, 6, 8}}, 0, d3_bad_in, d3_bad, 0});
  std::vector<FieldDecl> d4_decl = d3_decl;
  d4_decl.push_back({"softmax", I32, 1});
  std::vector<Field> d4_fields = d3_fields;
  d4_fields.push_back(ints("softmax", {1}));
  std::vector<BadFields> d4_bad = d3_bad;
  d4_bad.push_back({{ints("softmax", {2})}, "softmax"});
  c.push_back({"DCNv4", "dcnkit", d4_decl, d4_fields, {{2, 9, 11, 8}, {2, 5, 6, 56}}, {{2, 5, 6, 8}}, 0,
               {{2, 9, 11, 8}, {2, 5, 6, 54}}, d4_bad, 0});
  return c;
}
