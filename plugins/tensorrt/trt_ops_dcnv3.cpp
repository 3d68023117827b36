// The DCNv3 / DCNv4 plugin: dcnkit's DCNv3 and DCNv4 and InternImage's mmdeploy TRTDCNv3, channels last. DCNv3:
// input (N, H, W, C), offset (N, Ho, Wo, G*K*2), mask (N, Ho, Wo, G*K); DCNv4: value (N, H, W, C), offset_mask
// (N, Ho, Wo, Cp); output (N, Ho, Wo, C) with Ho, Wo the convolution rule of the kernel, stride, pad and dilation.
// One class for both ops: the core's params (make_params dispatches on the attrs' kind) and forward launcher are
// shared, and DCNv4 reads its weights from offset_mask itself. No workspace (forward only).
#include "trt_ops_common.h"

using namespace nvinfer1;

namespace dcnkit::trt {

namespace {

static_assert(kD3Input == kD4Value && kD3Offset == kD4OffsetMask, "op_defs.h: DCNv3/DCNv4 input order changed");

class Dcnv3Plugin final : public PluginBase {
 public:
  using PluginBase::PluginBase;

 protected:
  PluginBase* make_copy() const override { return new Dcnv3Plugin(*this); }

  Status output_shapes(const DimsExprs* const* in, IExprBuilder& b, DimsExprs* out) const override {
    DCNKIT_RETURN_IF_ERROR(need_rank(variant_->op_type, op_def(variant_->kind).inputs[kD3Input].name, in[kD3Input], 4));
    const DimsExprs& x = *in[kD3Input];  // (N, H, W, C)
    const Dcnv3Attrs& a = attrs_.dcnv3;
    ExprArith e{b};
    out[0].nbDims = 4;
    out[0].d[0] = x.d[0];
    out[0].d[1] = deform_conv2d_out_size_rule(e, x.d[1], b.constant(a.kernel_h), a.stride_h, a.pad_h, a.dilation_h);
    out[0].d[2] = deform_conv2d_out_size_rule(e, x.d[2], b.constant(a.kernel_w), a.stride_w, a.pad_w, a.dilation_w);
    out[0].d[3] = x.d[3];
    if (out[0].d[1] == nullptr || out[0].d[2] == nullptr) return Status::Internal("IExprBuilder failed");
    return Status::Ok();
  }

  Status check(const CanonicalInputs& in) const override {
    Dcnv3Params p;
    return params_of(*variant_, attrs_, in, &p);
  }

  size_t workspace_bound(const CanonicalInputs&, const TensorTypes&) const override { return 0; }
  size_t workspace_needed(const CanonicalInputs&, const TensorTypes&) const override { return 0; }

  Status run(const CanonicalInputs& in, const TensorTypes& t, void* const* outputs, void*,
             cudaStream_t stream) override {
    Dcnv3Params p;
    DCNKIT_RETURN_IF_ERROR(params_of(*variant_, attrs_, in, &p));
    const void* offset = in.data[kD3Offset];
    return dcnv3_forward_cuda(p, t.features, in.data[kD3Input], offset, p.fused ? offset : in.data[kD3Mask],
                              outputs[0], cuda_context(stream));
  }
};

}  // namespace

PluginBase* make_dcnv3_plugin(const OpVariant* variant, const OpAttrs& attrs, const std::string& name) {
  return new Dcnv3Plugin(variant, attrs, name);
}

}  // namespace dcnkit::trt
