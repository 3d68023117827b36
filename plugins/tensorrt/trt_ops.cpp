// One plugin per operator: output shapes (the core's rules over TensorRT's dimension expressions),
// workspace (the core's sizing, bounded per dimension for a profile) and enqueue (the core's forward
// launcher; the float32-RoI launchers of dcnkit/roi_float32_rois.h for float32 RoIs with 16-bit features).
#include <algorithm>
#include <string>

#include "dcnkit/cublas_gemm.h"
#include "dcnkit/roi_float32_rois.h"
#include "trt_ops_common.h"

using namespace nvinfer1;

namespace dcnkit::trt {

namespace {

// (K, C, oh, ow): K RoIs from rois dim 0.
Status roi_output(const char* op, const DimsExprs* rois, const IDimensionExpr* channels, int64_t oh, int64_t ow,
                  IExprBuilder& b, DimsExprs* out) {
  DCNKIT_RETURN_IF_ERROR(need_rank(op, "rois", rois, 2));
  out->nbDims = 4;
  out->d[0] = rois->d[0];
  out->d[1] = channels;
  out->d[2] = b.constant(oh);
  out->d[3] = b.constant(ow);
  return Status::Ok();
}

// The fields every single-map RoI params struct has, from per-dimension maxima (input (N, C, H, W),
// rois (K, 5)): the core's workspace functions grow with each of them.
template <typename Params>
void roi_params_bound(const CanonicalInputs& max_in, int input, int rois, Params* p) {
  p->batch = dim(max_in, input, 0);
  p->channels = dim(max_in, input, 1);
  p->height = dim(max_in, input, 2);
  p->width = dim(max_in, input, 3);
  p->num_rois = dim(max_in, rois, 0);
}

const float* f32(const void* p) { return static_cast<const float*>(p); }

// ---------------------------------------------------------------------------------------------

class DeformConv2dPlugin final : public PluginBase {
 public:
  using PluginBase::PluginBase;

 protected:
  PluginBase* make_copy() const override { return new DeformConv2dPlugin(*this); }

  Status output_shapes(const DimsExprs* const* in, IExprBuilder& b, DimsExprs* out) const override {
    const char* op = variant_->op_type;
    DCNKIT_RETURN_IF_ERROR(need_rank(op, "input", in[kDcInput], 4));
    DCNKIT_RETURN_IF_ERROR(need_rank(op, "weight", in[kDcWeight], 4));
    const DimsExprs& x = *in[kDcInput];
    const DimsExprs& w = *in[kDcWeight];
    const DeformConv2dAttrs& a = attrs_.dcn;
    ExprArith e{b};
    out[0].nbDims = 4;
    out[0].d[0] = x.d[0];
    out[0].d[1] = w.d[0];
    out[0].d[2] = deform_conv2d_out_size_rule(e, x.d[2], w.d[2], a.stride_h, a.pad_h, a.dilation_h);
    out[0].d[3] = deform_conv2d_out_size_rule(e, x.d[3], w.d[3], a.stride_w, a.pad_w, a.dilation_w);
    if (out[0].d[2] == nullptr || out[0].d[3] == nullptr) return Status::Internal("IExprBuilder failed");
    return Status::Ok();
  }

  Status check(const CanonicalInputs& in) const override {
    DeformConv2dParams p;
    return params_of(*variant_, attrs_, in, &p);
  }

  // The columns take (images) x Cin x kh x kw x Ho x Wo elements; a checked call has the offset's spatial dims
  // as (Ho, Wo), so the offset's maxima bound them whatever the input's maxima say.
  size_t workspace_bound(const CanonicalInputs& max_in, const TensorTypes& t) const override {
    DeformConv2dParams p;
    p.attrs = attrs_.dcn;
    p.batch = dim(max_in, kDcInput, 0);
    p.in_channels = dim(max_in, kDcInput, 1);
    p.kernel_h = dim(max_in, kDcWeight, 2);
    p.kernel_w = dim(max_in, kDcWeight, 3);
    p.out_h = dim(max_in, kDcOffset, 2);
    p.out_w = dim(max_in, kDcOffset, 3);
    return deform_conv2d_forward_workspace_cuda_bound(p, t.features);
  }

  size_t workspace_needed(const CanonicalInputs& in, const TensorTypes& t) const override {
    DeformConv2dParams p;
    return params_of(*variant_, attrs_, in, &p).ok() ? deform_conv2d_forward_workspace_cuda(p, t.features) : 0;
  }

  Status run(const CanonicalInputs& in, const TensorTypes& t, void* const* outputs, void* ws,
             cudaStream_t stream) override {
    DeformConv2dParams p;
    DCNKIT_RETURN_IF_ERROR(params_of(*variant_, attrs_, in, &p));
    gemm_->stream = stream;  // enqueue attached a handle (attachToContext, or its own on the first enqueue)
    CudaContext ctx = cuda_context(stream);
    ctx.gemm = &cublas_gemm;
    ctx.gemm_self = gemm_;
    return deform_conv2d_forward_cuda(p, t.features, in.data[kDcInput], in.data[kDcOffset], in.data[kDcWeight],
                                      in.data[kDcBias], in.data[kDcMask], outputs[0], ws, ctx);
  }
};

class RoIAlignPlugin final : public PluginBase {
 public:
  using PluginBase::PluginBase;

 protected:
  PluginBase* make_copy() const override { return new RoIAlignPlugin(*this); }

  Status output_shapes(const DimsExprs* const* in, IExprBuilder& b, DimsExprs* out) const override {
    DCNKIT_RETURN_IF_ERROR(need_rank(variant_->op_type, "input", in[kRaInput], 4));
    return roi_output(variant_->op_type, in[kRaRois], in[kRaInput]->d[1], attrs_.roi.pooled_h,
                      attrs_.roi.pooled_w, b, out);
  }

  Status check(const CanonicalInputs& in) const override {
    RoIAlignParams p;
    return params_of(*variant_, attrs_, in, &p);
  }

  size_t workspace_bound(const CanonicalInputs& max_in, const TensorTypes&) const override {
    RoIAlignParams p;
    p.attrs = attrs_.roi;
    roi_params_bound(max_in, kRaInput, kRaRois, &p);
    return roi_align_workspace_cuda(p);
  }

  size_t workspace_needed(const CanonicalInputs& in, const TensorTypes&) const override {
    RoIAlignParams p;
    return params_of(*variant_, attrs_, in, &p).ok() ? roi_align_workspace_cuda(p) : 0;
  }

  Status run(const CanonicalInputs& in, const TensorTypes& t, void* const* outputs, void* ws,
             cudaStream_t stream) override {
    RoIAlignParams p;
    DCNKIT_RETURN_IF_ERROR(params_of(*variant_, attrs_, in, &p));
    const void* x = in.data[kRaInput];
    if (t.float32_rois()) {
      return roi_align_forward_cuda_f32_rois(p, t.features, x, f32(in.data[kRaRois]), outputs[0], ws,
                                             cuda_context(stream));
    }
    return roi_align_forward_cuda(p, t.features, x, in.data[kRaRois], outputs[0], ws, cuda_context(stream));
  }
};

class DeformRoIPoolPlugin final : public PluginBase {
 public:
  using PluginBase::PluginBase;

 protected:
  PluginBase* make_copy() const override { return new DeformRoIPoolPlugin(*this); }

  Status output_shapes(const DimsExprs* const* in, IExprBuilder& b, DimsExprs* out) const override {
    DCNKIT_RETURN_IF_ERROR(need_rank(variant_->op_type, "input", in[kDrInput], 4));
    return roi_output(variant_->op_type, in[kDrRois], in[kDrInput]->d[1], attrs_.droi.pooled_h,
                      attrs_.droi.pooled_w, b, out);
  }

  Status check(const CanonicalInputs& in) const override {
    DeformRoIPoolParams p;
    return params_of(*variant_, attrs_, in, &p);
  }

  size_t workspace_bound(const CanonicalInputs& max_in, const TensorTypes&) const override {
    DeformRoIPoolParams p;
    p.attrs = attrs_.droi;
    roi_params_bound(max_in, kDrInput, kDrRois, &p);
    p.has_offset = max_in.shapes[kDrOffset] != nullptr;
    return deform_roi_pool_workspace_cuda(p);
  }

  size_t workspace_needed(const CanonicalInputs& in, const TensorTypes&) const override {
    DeformRoIPoolParams p;
    return params_of(*variant_, attrs_, in, &p).ok() ? deform_roi_pool_workspace_cuda(p) : 0;
  }

  Status run(const CanonicalInputs& in, const TensorTypes& t, void* const* outputs, void* ws,
             cudaStream_t stream) override {
    DeformRoIPoolParams p;
    DCNKIT_RETURN_IF_ERROR(params_of(*variant_, attrs_, in, &p));
    const void* x = in.data[kDrInput];
    if (t.float32_rois()) {
      return deform_roi_pool_forward_cuda_f32_rois(p, t.features, x, f32(in.data[kDrRois]), in.data[kDrOffset],
                                                   outputs[0], ws, cuda_context(stream));
    }
    return deform_roi_pool_forward_cuda(p, t.features, x, in.data[kDrRois], in.data[kDrOffset], outputs[0], ws,
                                        cuda_context(stream));
  }
};

// Two outputs: the pooled values and the per-bin sample count (the launcher always writes both).
class DeformPSRoIPoolPlugin final : public PluginBase {
 public:
  using PluginBase::PluginBase;

 protected:
  PluginBase* make_copy() const override { return new DeformPSRoIPoolPlugin(*this); }

  Status output_shapes(const DimsExprs* const* in, IExprBuilder& b, DimsExprs* out) const override {
    const DeformPSRoIPoolAttrs& a = attrs_.psroi;
    DCNKIT_RETURN_IF_ERROR(need_rank(variant_->op_type, "input", in[kPsInput], 4));
    DCNKIT_RETURN_IF_ERROR(
        roi_output(variant_->op_type, in[kPsRois], b.constant(a.output_dim), a.output_size, a.output_size, b, &out[0]));
    out[1] = out[0];
    return Status::Ok();
  }

  Status check(const CanonicalInputs& in) const override {
    DeformPSRoIPoolParams p;
    return params_of(*variant_, attrs_, in, &p);
  }

  // With float32 RoIs the launcher reads a float32 copy of trans (K, 2 * classes, part, part): the product of
  // the trans maxima bounds it.
  size_t workspace_bound(const CanonicalInputs& max_in, const TensorTypes& t) const override {
    DeformPSRoIPoolParams p;
    p.attrs = attrs_.psroi;
    roi_params_bound(max_in, kPsInput, kPsRois, &p);
    const Shape* trans = max_in.shapes[kPsTrans];
    p.attrs.no_trans = p.attrs.no_trans || trans == nullptr;
    if (!p.attrs.no_trans) {  // trans elements = num_rois * 2 * num_classes * part_size^2
      p.num_rois = std::max(p.num_rois, dim(max_in, kPsTrans, 0));
      p.num_classes = (dim(max_in, kPsTrans, 1) + 1) / 2;
      p.attrs.part_size = std::max(dim(max_in, kPsTrans, 2), dim(max_in, kPsTrans, 3));
    }
    return deform_psroi_pool_workspace_cuda(p) + (t.float32_rois() ? deform_psroi_pool_workspace_cuda_f32_rois(p) : 0);
  }

  size_t workspace_needed(const CanonicalInputs& in, const TensorTypes& t) const override {
    DeformPSRoIPoolParams p;
    if (!params_of(*variant_, attrs_, in, &p).ok()) return 0;
    return deform_psroi_pool_workspace_cuda(p) + (t.float32_rois() ? deform_psroi_pool_workspace_cuda_f32_rois(p) : 0);
  }

  Status run(const CanonicalInputs& in, const TensorTypes& t, void* const* outputs, void* ws,
             cudaStream_t stream) override {
    DeformPSRoIPoolParams p;
    DCNKIT_RETURN_IF_ERROR(params_of(*variant_, attrs_, in, &p));
    const void* x = in.data[kPsInput];
    if (t.float32_rois()) {
      return deform_psroi_pool_forward_cuda_f32_rois(p, t.features, x, f32(in.data[kPsRois]), in.data[kPsTrans],
                                                     outputs[0], outputs[1], ws, cuda_context(stream));
    }
    return deform_psroi_pool_forward_cuda(p, t.features, x, in.data[kPsRois], in.data[kPsTrans], outputs[0],
                                          outputs[1], ws, cuda_context(stream));
  }
};

// Inputs (rois, feat_0 .. feat_{L-1}) as mmdeploy orders them: the maps are the variadic last input.
class MultiLevelRoIAlignPlugin final : public PluginBase {
 public:
  using PluginBase::PluginBase;

 protected:
  PluginBase* make_copy() const override { return new MultiLevelRoIAlignPlugin(*this); }

  Status output_shapes(const DimsExprs* const* in, IExprBuilder& b, DimsExprs* out) const override {
    DCNKIT_RETURN_IF_ERROR(need_rank(variant_->op_type, "features", in[kMlFeatures], 4));
    return roi_output(variant_->op_type, in[kMlRois], in[kMlFeatures]->d[1], attrs_.mlroi.pooled_h,
                      attrs_.mlroi.pooled_w, b, out);
  }

  Status params(const CanonicalInputs& in, MultiLevelRoIAlignParams* p) const {
    return make_params(variant_->op_type, attrs_, in.shape[kMlRois], in.variadic_shape, p);
  }

  Status check(const CanonicalInputs& in) const override {
    MultiLevelRoIAlignParams p;
    return params(in, &p);
  }

  size_t workspace_bound(const CanonicalInputs& max_in, const TensorTypes&) const override {
    MultiLevelRoIAlignParams p;
    p.attrs = attrs_.mlroi;
    p.num_rois = dim(max_in, kMlRois, 0);
    const size_t levels = std::min(max_in.variadic_shape.size(), static_cast<size_t>(kMaxFeatureLevels));
    p.attrs.num_levels = static_cast<int64_t>(levels);
    for (size_t l = 0; l < levels; ++l) {
      const Shape& f = max_in.variadic_shape[l];
      if (f.size() != 4) continue;
      p.batch = std::max(p.batch, f[0]);
      p.channels = std::max(p.channels, f[1]);
      p.heights[l] = f[2];
      p.widths[l] = f[3];
    }
    return multi_level_roi_align_workspace_cuda(p);
  }

  size_t workspace_needed(const CanonicalInputs& in, const TensorTypes&) const override {
    MultiLevelRoIAlignParams p;
    return params(in, &p).ok() ? multi_level_roi_align_workspace_cuda(p) : 0;
  }

  Status run(const CanonicalInputs& in, const TensorTypes& t, void* const* outputs, void* ws,
             cudaStream_t stream) override {
    MultiLevelRoIAlignParams p;
    DCNKIT_RETURN_IF_ERROR(params(in, &p));  // at most kMaxFeatureLevels maps
    const void* const* maps = in.variadic_data.data();
    if (t.float32_rois()) {
      return multi_level_roi_align_forward_cuda_f32_rois(p, t.features, maps, f32(in.data[kMlRois]), outputs[0], ws,
                                                         cuda_context(stream));
    }
    return multi_level_roi_align_forward_cuda(p, t.features, maps, in.data[kMlRois], outputs[0], ws,
                                              cuda_context(stream));
  }
};

}  // namespace

PluginBase* make_plugin(const OpVariant* variant, const OpAttrs& attrs, const std::string& name) {
  switch (variant->kind) {
    case OpKind::kDeformConv2d: return new DeformConv2dPlugin(variant, attrs, name);
    case OpKind::kRoIAlign: return new RoIAlignPlugin(variant, attrs, name);
    case OpKind::kDeformRoIPool: return new DeformRoIPoolPlugin(variant, attrs, name);
    case OpKind::kDeformPSRoIPool: return new DeformPSRoIPoolPlugin(variant, attrs, name);
    case OpKind::kMultiLevelRoIAlign: return new MultiLevelRoIAlignPlugin(variant, attrs, name);
    case OpKind::kMultiScaleDeformableAttention: return make_msda_plugin(variant, attrs, name);
    case OpKind::kDCNv3:
    case OpKind::kDCNv4: return make_dcnv3_plugin(variant, attrs, name);
  }
  return nullptr;
}

}  // namespace dcnkit::trt
