// The declaration of DCNv3 (InternImage, see op_decl.h): what every adapter knows of it.
#include "dcnv3_common.h"

namespace dcnkit {
namespace {

using dcnv3_decl::attrs_of;

constexpr TensorDef kInputs[] = {
    TensorDef{"input", false, "(N, H, W, C), channels last"}.with_grad(),
    TensorDef{"offset", false, "(N, Ho, Wo, G*K*2), per group and point (dx, dy)"}.with_grad(),
    TensorDef{"mask", false, "(N, Ho, Wo, G*K) weights, normalised by the caller"}.with_grad(),
};
constexpr TensorDef kOutputs[] = {TensorDef{"output", false, "(N, Ho, Wo, C)"}.with_grad()};
constexpr int kInput = DCNKIT_INDEX(kInputs, "input"), kOffset = DCNKIT_INDEX(kInputs, "offset"),
              kMask = DCNKIT_INDEX(kInputs, "mask");

struct Op : dcnv3_decl::SharedEntries {

  static Status check(const char* op, const AttrValue* v) { return check_dcnv3_attrs(op, attrs_of(v)); }
  static Status params(const OpCall& c, Params* p) {
    const OpShapes& s = c.shapes;
    return make_dcnv3_params(c.op, attrs_of(c.attrs), *s.in[kInput], *s.in[kOffset], *s.in[kMask], p);
  }

  static Status forward_cpu(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    return dispatch_cpu(t.dtype, [&](auto z) {
      using T = decltype(z);
      return dcnv3_forward_cpu<T>(p, in_ptr<T>(b, kInput), in_ptr<T>(b, kOffset), in_ptr<T>(b, kMask),
                                  out_ptr<T>(b, 0), *dev.cpu);
    });
  }
  static Status backward_cpu(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    if (p.batch * p.height * p.width * p.channels() == 0) return Status::Ok();  // the gradients are 0
    return dispatch_cpu(t.dtype, [&](auto z) {
      using T = decltype(z);
      return dcnv3_backward_cpu<T>(p, static_cast<const T*>(b.grad_out[0]), in_ptr<T>(b, kInput),
                                   in_ptr<T>(b, kOffset), in_ptr<T>(b, kMask), grad_ptr<T>(b, kInput),
                                   grad_ptr<T>(b, kOffset), grad_ptr<T>(b, kMask), *dev.cpu);
    });
  }
  static Status forward_cuda(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    return dcnv3_forward_cuda(p, t.dtype, b.in[kInput], b.in[kOffset], b.in[kMask], b.out[0], *dev.cuda);
  }
  static Status backward_cuda(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    if (p.batch * p.height * p.width * p.channels() == 0) return Status::Ok();
    return dcnv3_backward_cuda(p, t.dtype, b.grad_out[0], b.in[kInput], b.in[kOffset], b.in[kMask],
                               b.grad_in[kInput], b.grad_in[kOffset], b.grad_in[kMask], b.workspace, *dev.cuda);
  }
};

// InternImage's exporter: mmdeploy::TRTDCNv3 (input, offset, mask) with the canonical attribute names and an
// im2col_step that is ignored.
void variants(const OpDecl* op, std::vector<OpVariant>* out) {
  out->push_back({"mmdeploy", "TRTDCNv3", op, canonical_inputs(op->def), {}, false, false});
}

}  // namespace

DCNKIT_OP(dcnv3, 7, Op, DCNKIT_OP_DEF("dcnv3", "DCNv3", kInputs, kOutputs, dcnv3_decl::kAttrs, false),
          // DCNv3 (InternImage): input (N, H, W, C), offset (N, Ho, Wo, G*K*2), mask (N, Ho, Wo, G*K).
          "dcnv3(Tensor input, Tensor offset, Tensor mask, int kernel_h, int kernel_w, int stride_h, int stride_w, "
          "int pad_h, int pad_w, int dilation_h, int dilation_w, int group, int group_channels, float offset_scale, "
          "int remove_center) -> Tensor",
          // Returns (grad_input, grad_offset, grad_mask).
          "_dcnv3_backward(Tensor grad_output, Tensor input, Tensor offset, Tensor mask, int kernel_h, int kernel_w, "
          "int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int group, "
          "int group_channels, float offset_scale, int remove_center) -> (Tensor, Tensor, Tensor)",
          &variants)

}  // namespace dcnkit
