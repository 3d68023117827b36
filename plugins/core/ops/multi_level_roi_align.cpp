// The declaration of MultiLevelRoIAlign (the FPN pooler, see op_decl.h): what every adapter knows of it.
#include <algorithm>

#include "dcnkit/multi_level_roi_align.h"
#include "dcnkit/op_attrs.h"
#include "dcnkit/op_decl.h"
#include "dcnkit/roi_batch_assert.h"
#include "dcnkit/roi_float32_rois.h"
#include "dcnkit/roi_kernels.h"

namespace dcnkit {
namespace {

// Inputs as mmdeploy orders them: rois, then the L feature maps (finest first).
constexpr TensorDef kInputs[] = {
    TensorDef{"rois", false, "(K, 5) rows [batch_index, x1, y1, x2, y2]"}.as_rois(),
    TensorDef{"features", false, "L maps (N, C, H_l, W_l), finest first (variadic: feat_0 .. feat_{L-1})"}
        .as_variadic()
        .with_grad(),
};
constexpr TensorDef kOutputs[] = {TensorDef{"output", false, "(K, C, oh, ow)"}.with_grad()};
constexpr AttrDef kAttrs[] = {
    {"output_size", AttrKind::kInts, "[1, 1]", "(oh, ow)"},
    {"featmap_strides", AttrKind::kFloats, "[]", "stride of every feature map (L values, required)"},
    {"sampling_ratio", AttrKind::kInt, "0", "samples per bin and axis; <= 0: adaptive"},
    {"finest_scale", AttrKind::kInt, "56", "RoI scale mapped to level 0"},
    {"roi_scale_factor", AttrKind::kFloat, "1.0", "RoI rescaling about its centre; <= 0: none"},
    {"aligned", AttrKind::kInt, "1", "1: shift by half a pixel (pixel-center convention)"},
    {"pool_mode", AttrKind::kString, "avg", "avg | max"},
};
constexpr int kSize = DCNKIT_INDEX(kAttrs, "output_size"), kStrides = DCNKIT_INDEX(kAttrs, "featmap_strides"),
              kSampling = DCNKIT_INDEX(kAttrs, "sampling_ratio"), kFinest = DCNKIT_INDEX(kAttrs, "finest_scale"),
              kScaleFactor = DCNKIT_INDEX(kAttrs, "roi_scale_factor"), kAligned = DCNKIT_INDEX(kAttrs, "aligned"),
              kPoolMode = DCNKIT_INDEX(kAttrs, "pool_mode");
constexpr int kRois = DCNKIT_INDEX(kInputs, "rois"), kFeatures = DCNKIT_INDEX(kInputs, "features");

// The attributes as given (the core's params check them against the maps: their number first).
Status attrs_of(const char* op, const AttrValue* a, MultiLevelRoIAlignAttrs* r) {
  const std::vector<double>& strides = a[kStrides].floats;
  r->pooled_h = a[kSize].at(0);
  r->pooled_w = a[kSize].at(1);
  r->num_levels = static_cast<int64_t>(strides.size());
  for (size_t l = 0; l < strides.size() && l < static_cast<size_t>(kMaxFeatureLevels); ++l) {
    r->featmap_strides[l] = strides[l];
  }
  r->sampling_ratio = a[kSampling].i();
  r->finest_scale = a[kFinest].i();
  r->roi_scale_factor = a[kScaleFactor].f;
  r->aligned = a[kAligned].i() != 0;
  return parse_pool_mode(op, a[kPoolMode].s, &r->mode);
}

template <typename T>
std::vector<const T*> maps(const OpBuffers& b) {
  std::vector<const T*> f;
  for (const void* m : b.variadic) f.push_back(static_cast<const T*>(m));
  return f;
}

struct Op {
  using Params = MultiLevelRoIAlignParams;

  // A node's attributes, before any map is known: 1 to kMaxFeatureLevels strides, then the core's checks with maps
  // that fit them.
  static Status check(const char* op, const AttrValue* v) {
    const std::vector<double>& strides = v[kStrides].floats;
    if (strides.empty() || strides.size() > static_cast<size_t>(kMaxFeatureLevels)) {
      RawAttr raw;
      raw.type = RawAttr::kFloats;
      for (double x : strides) raw.floats.push_back(static_cast<float>(x));
      return arg_error(op, "featmap_strides",
                       "1 to " + std::to_string(kMaxFeatureLevels) + " floats (one stride per feature map)",
                       raw_attr_str(raw));
    }
    MultiLevelRoIAlignAttrs r;
    DCNKIT_RETURN_IF_ERROR(attrs_of(op, v, &r));
    Params p;
    return make_multi_level_roi_align_params(op, std::vector<Shape>(r.num_levels, Shape{1, 1, 16, 16}), {1, 5}, r,
                                             &p);
  }
  static Status params(const OpCall& c, Params* p) {
    MultiLevelRoIAlignAttrs r;
    DCNKIT_RETURN_IF_ERROR(attrs_of(c.op, c.attrs, &r));
    return make_multi_level_roi_align_params(c.op, c.shapes.variadic, *c.shapes.in[kRois], r, p);
  }
  static void outputs(const OpCall&, const Params& p, Shape* out) { out[0] = p.output_shape(); }
  static Status output_dims(const OpCall& c, DimArith& a, OpDims* d) {
    return roi_pool_output_dims(c, kFeatures, kRois, c.attrs[kSize].at(0), c.attrs[kSize].at(1), a, d);
  }
  static size_t workspace_cuda(const Params& p, Pass pass, const OpTypes& t, const CudaContext& ctx) {
    return pass == Pass::kForward ? multi_level_roi_align_workspace_cuda(p)
                                  : multi_level_roi_align_backward_workspace_cuda(p, t.dtype, ctx.deterministic);
  }
  static size_t workspace_bound(const OpCall& c, const OpTypes&) {
    Params p;
    if (!attrs_of(c.op, c.attrs, &p.attrs).ok()) return 0;
    p.attrs.num_levels = std::min<int64_t>(p.attrs.num_levels, kMaxFeatureLevels);
    const Shape* rois = c.shapes.in[kRois];
    p.num_rois = rois != nullptr && !rois->empty() && (*rois)[0] > 0 ? (*rois)[0] : 0;
    const size_t levels = std::min(c.shapes.variadic.size(), static_cast<size_t>(kMaxFeatureLevels));
    p.attrs.num_levels = static_cast<int64_t>(levels);
    for (size_t l = 0; l < levels; ++l) {
      const Shape& f = c.shapes.variadic[l];
      if (f.size() != 4) continue;
      p.batch = std::max(p.batch, f[0]);
      p.channels = std::max(p.channels, f[1]);
      p.heights[l] = f[2];
      p.widths[l] = f[3];
    }
    return multi_level_roi_align_workspace_cuda(p);
  }

  // Under torch.use_deterministic_algorithms the CUDA backward takes its atomic-free path (roi_gather.h).
  static bool deterministic(const Params&, DType) { return true; }

  static Status forward_cpu(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    return dispatch_cpu(t.dtype, [&](auto z) {
      using T = decltype(z);
      const std::vector<const T*> f = maps<T>(b);
      return multi_level_roi_align_forward_cpu<T>(p, f.data(), in_ptr<T>(b, kRois), out_ptr<T>(b, 0), *dev.cpu);
    });
  }
  static Status backward_cpu(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    return dispatch_cpu(t.dtype, [&](auto z) {
      using T = decltype(z);
      const std::vector<const T*> f = maps<T>(b);
      std::vector<T*> g;
      for (void* x : b.grad_variadic) g.push_back(static_cast<T*>(x));
      return multi_level_roi_align_backward_cpu<T>(p, static_cast<const T*>(b.grad_out[0]), f.data(),
                                                   in_ptr<T>(b, kRois), g.data(), *dev.cpu);
    });
  }
  static Status forward_cuda(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    if (dev.device_asserts) {
      DCNKIT_RETURN_IF_ERROR(roi_assert_batch_indices_cuda("multi_level_roi_align", b.in[kRois], t.rois, p.num_rois,
                                                           5, p.batch, *dev.cuda));
    }
    if (t.rois != t.dtype) {
      return multi_level_roi_align_forward_cuda_f32_rois(p, t.dtype, b.variadic.data(),
                                                         static_cast<const float*>(b.in[kRois]), b.out[0],
                                                         b.workspace, *dev.cuda);
    }
    return multi_level_roi_align_forward_cuda(p, t.dtype, b.variadic.data(), b.in[kRois], b.out[0], b.workspace,
                                              *dev.cuda);
  }
  static Status backward_cuda(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    if (dev.device_asserts) {
      DCNKIT_RETURN_IF_ERROR(roi_assert_batch_indices_cuda("multi_level_roi_align", b.in[kRois], t.rois, p.num_rois,
                                                           5, p.batch, *dev.cuda));
    }
    return multi_level_roi_align_backward_cuda(p, t.dtype, b.grad_out[0], b.variadic.data(), b.in[kRois],
                                               b.grad_variadic.data(), b.workspace, *dev.cuda);
  }
};

// mmdeploy::MMCVMultiLevelRoiAlign: (rois, feat_0, ..., feat_{L-1}); output_height, output_width, featmap_strides
// (floats), sampling_ratio, finest_scale, roi_scale_factor (float), aligned, and pool_mode as an int (0: max, 1: avg).
void variants(const OpDecl* op, std::vector<OpVariant>* out) {
  out->push_back({"mmdeploy",
                  "MMCVMultiLevelRoiAlign",
                  op,
                  {{kRois, false}, {kFeatures, false, true}},
                  {{"output_height", kAttrs[kSize].name, 0},
                   {"output_width", kAttrs[kSize].name, 1},
                   {"featmap_strides", kAttrs[kStrides].name, -1},
                   {"sampling_ratio", kAttrs[kSampling].name, -1},
                   {"finest_scale", kAttrs[kFinest].name, -1},
                   {"roi_scale_factor", kAttrs[kScaleFactor].name, -1},
                   {"aligned", kAttrs[kAligned].name, -1},
                   {"pool_mode", kAttrs[kPoolMode].name, -1, "max|avg"}},
                  false,
                  true});
}

}  // namespace

DCNKIT_OP(multi_level_roi_align, 5, Op,
          DCNKIT_OP_DEF("multi_level_roi_align", "MultiLevelRoIAlign", kInputs, kOutputs, kAttrs, false),
          // features: L maps (N, C, H_l, W_l); rois (K, 5). Returns (K, C, pooled_h, pooled_w).
          "multi_level_roi_align(Tensor[] features, Tensor rois, int pooled_h, int pooled_w, "
          "float[] featmap_strides, int sampling_ratio, int finest_scale, float roi_scale_factor, bool aligned, "
          "str pool_mode) -> Tensor",
          // Returns the gradient of every feature map.
          "_multi_level_roi_align_backward(Tensor grad_output, Tensor[] features, Tensor rois, int pooled_h, "
          "int pooled_w, float[] featmap_strides, int sampling_ratio, int finest_scale, float roi_scale_factor, "
          "bool aligned, str pool_mode) -> Tensor[]",
          &variants)

}  // namespace dcnkit
