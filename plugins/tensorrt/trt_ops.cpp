// One plugin per operator: output shapes (the core's rules over TensorRT's dimension expressions),
// workspace (the core's sizing) and enqueue (the core's forward launcher). A few lines each.
#include <string>

#include "dcnkit/cublas_gemm.h"
#include "trt_plugin.h"

using namespace nvinfer1;

namespace dcnkit::trt {

namespace {

// The core's shape rules evaluated on TensorRT's symbolic dimensions (see deform_conv2d_out_size_rule).
struct ExprArith {
  IExprBuilder& b;
  using Value = const IDimensionExpr*;
  Value op(DimensionOperation o, Value x, Value y) const {
    return (x != nullptr && y != nullptr) ? b.operation(o, *x, *y) : nullptr;
  }
  Value constant(int64_t v) const { return b.constant(v); }
  Value add(Value x, Value y) const { return op(DimensionOperation::kSUM, x, y); }
  Value sub(Value x, Value y) const { return op(DimensionOperation::kSUB, x, y); }
  Value mul(Value x, Value y) const { return op(DimensionOperation::kPROD, x, y); }
  Value floor_div(Value x, Value y) const { return op(DimensionOperation::kFLOOR_DIV, x, y); }
};

Status need_rank(const char* op, const char* arg, const DimsExprs* d, int32_t rank) {
  if (d == nullptr) return arg_error(op, arg, "a tensor", "no input");
  if (d->nbDims != rank) {
    return arg_error(op, arg, std::to_string(rank) + "-D tensor", std::to_string(d->nbDims) + "-D tensor");
  }
  return Status::Ok();
}

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

template <typename Params>
Status params_of(const OpVariant& v, const OpAttrs& a, const CanonicalInputs& in, Params* p) {
  return make_params(v.op_type, a, in.shapes, p);
}

CudaContext cuda_context(cudaStream_t stream) {
  CudaContext ctx;
  ctx.stream = stream;
  return ctx;
}

// ---------------------------------------------------------------------------------------------

class DeformConv2dPlugin final : public PluginBase {
 public:
  using PluginBase::PluginBase;

 protected:
  PluginBase* make_copy() const override { return new DeformConv2dPlugin(*this); }
  bool needs_blas() const override { return true; }

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

  size_t workspace(const CanonicalInputs& max_in, DType dt) const override {
    DeformConv2dParams p;
    return params_of(*variant_, attrs_, max_in, &p).ok() ? deform_conv2d_forward_workspace_cuda_bound(p, dt) : 0;
  }

  Status run(const CanonicalInputs& in, DType dt, void* const* outputs, void* ws, cudaStream_t stream) override {
    DeformConv2dParams p;
    DCNKIT_RETURN_IF_ERROR(params_of(*variant_, attrs_, in, &p));
    Status s;
    auto* gemm = static_cast<CublasGemm*>(blas_gemm(&s));
    if (gemm == nullptr) return s;
    gemm->stream = stream;
    CudaContext ctx = cuda_context(stream);
    ctx.gemm = &cublas_gemm;
    ctx.gemm_self = gemm;
    return deform_conv2d_forward_cuda(p, dt, in.data[kDcInput], in.data[kDcOffset], in.data[kDcWeight],
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

  size_t workspace(const CanonicalInputs& max_in, DType) const override {
    RoIAlignParams p;
    return params_of(*variant_, attrs_, max_in, &p).ok() ? roi_align_workspace_cuda(p) : 0;
  }

  Status run(const CanonicalInputs& in, DType dt, void* const* outputs, void* ws, cudaStream_t stream) override {
    RoIAlignParams p;
    DCNKIT_RETURN_IF_ERROR(params_of(*variant_, attrs_, in, &p));
    return roi_align_forward_cuda(p, dt, in.data[kRaInput], in.data[kRaRois], outputs[0], ws, cuda_context(stream));
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

  size_t workspace(const CanonicalInputs& max_in, DType) const override {
    DeformRoIPoolParams p;
    return params_of(*variant_, attrs_, max_in, &p).ok() ? deform_roi_pool_workspace_cuda(p) : 0;
  }

  Status run(const CanonicalInputs& in, DType dt, void* const* outputs, void* ws, cudaStream_t stream) override {
    DeformRoIPoolParams p;
    DCNKIT_RETURN_IF_ERROR(params_of(*variant_, attrs_, in, &p));
    return deform_roi_pool_forward_cuda(p, dt, in.data[kDrInput], in.data[kDrRois], in.data[kDrOffset], outputs[0],
                                        ws, cuda_context(stream));
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

  size_t workspace(const CanonicalInputs& max_in, DType) const override {
    DeformPSRoIPoolParams p;
    return params_of(*variant_, attrs_, max_in, &p).ok() ? deform_psroi_pool_workspace_cuda(p) : 0;
  }

  Status run(const CanonicalInputs& in, DType dt, void* const* outputs, void* ws, cudaStream_t stream) override {
    DeformPSRoIPoolParams p;
    DCNKIT_RETURN_IF_ERROR(params_of(*variant_, attrs_, in, &p));
    return deform_psroi_pool_forward_cuda(p, dt, in.data[kPsInput], in.data[kPsRois], in.data[kPsTrans], outputs[0],
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

  size_t workspace(const CanonicalInputs& max_in, DType) const override {
    MultiLevelRoIAlignParams p;
    return params(max_in, &p).ok() ? multi_level_roi_align_workspace_cuda(p) : 0;
  }

  Status run(const CanonicalInputs& in, DType dt, void* const* outputs, void* ws, cudaStream_t stream) override {
    MultiLevelRoIAlignParams p;
    DCNKIT_RETURN_IF_ERROR(params(in, &p));  // at most kMaxFeatureLevels maps
    return multi_level_roi_align_forward_cuda(p, dt, in.variadic_data.data(), in.data[kMlRois], outputs[0], ws,
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
    case OpKind::kMultiScaleDeformableAttention: return nullptr;  // no TensorRT plugin yet (trt_creators.cpp)
  }
  return nullptr;
}

}  // namespace dcnkit::trt
