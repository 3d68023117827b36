// The declaration of DCNv4 (FlashInternImage, see op_decl.h): what every adapter knows of it. The same kernels as
// DCNv3, with offsets and weights in one tensor (the params' `fused`).
#include "dcnv3_common.h"

namespace dcnkit {
namespace {

using dcnv3_decl::attrs_of;

constexpr TensorDef kInputs[] = {
    TensorDef{"value", false, "(N, H, W, C), channels last"}.with_grad(),
    TensorDef{"offset_mask", false,
              "(N, Ho, Wo, Cp): per group 2K offsets (dx, dy) then K weights; Cp = G*3K rounded up to 8"}
        .with_grad(),
};
constexpr TensorDef kOutputs[] = {TensorDef{"output", false, "(N, Ho, Wo, C)"}.with_grad()};
constexpr AttrDef kAttrs[] = {DCNKIT_DCNV3_ATTRS,
                              {"softmax", AttrKind::kInt, "0", "1: softmax over each group's K weights"}};
#undef DCNKIT_DCNV3_ATTRS
constexpr int kSoftmax = DCNKIT_INDEX(kAttrs, "softmax");
static_assert(kSoftmax == dcnv3_decl::kNumAttrs, "DCNv4's attributes are DCNv3's, then softmax");
constexpr int kValue = DCNKIT_INDEX(kInputs, "value"), kOffsetMask = DCNKIT_INDEX(kInputs, "offset_mask");

struct Op : dcnv3_decl::SharedEntries {

  static Status check(const char* op, const AttrValue* v) {
    const int64_t softmax = v[kSoftmax].i();
    if (softmax != 0 && softmax != 1) return arg_error(op, "softmax", "0 or 1", std::to_string(softmax));
    return check_dcnv3_attrs(op, attrs_of(v));
  }
  static Status params(const OpCall& c, Params* p) {
    return make_dcnv4_params(c.op, attrs_of(c.attrs), c.attrs[kSoftmax].i() != 0, *c.shapes.in[kValue],
                             *c.shapes.in[kOffsetMask], p);
  }

  // The weights are read from offset_mask (p.fused): it is passed as the mask too, and its gradient as both.
  static Status forward_cpu(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    return dispatch_cpu(t.dtype, [&](auto z) {
      using T = decltype(z);
      const T* om = in_ptr<T>(b, kOffsetMask);
      return dcnv3_forward_cpu<T>(p, in_ptr<T>(b, kValue), om, om, out_ptr<T>(b, 0), *dev.cpu);
    });
  }
  static Status backward_cpu(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    if (p.batch * p.height * p.width * p.channels() == 0) return Status::Ok();  // the gradients are 0
    return dispatch_cpu(t.dtype, [&](auto z) {
      using T = decltype(z);
      const T* om = in_ptr<T>(b, kOffsetMask);
      T* gom = grad_ptr<T>(b, kOffsetMask);
      return dcnv3_backward_cpu<T>(p, static_cast<const T*>(b.grad_out[0]), in_ptr<T>(b, kValue), om, om,
                                   grad_ptr<T>(b, kValue), gom, gom, *dev.cpu);
    });
  }
  static Status forward_cuda(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    return dcnv3_forward_cuda(p, t.dtype, b.in[kValue], b.in[kOffsetMask], b.in[kOffsetMask], b.out[0], *dev.cuda);
  }
  static Status backward_cuda(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    if (p.batch * p.height * p.width * p.channels() == 0) return Status::Ok();
    return dcnv3_backward_cuda(p, t.dtype, b.grad_out[0], b.in[kValue], b.in[kOffsetMask], b.in[kOffsetMask],
                               b.grad_in[kValue], b.grad_in[kOffsetMask], b.grad_in[kOffsetMask], b.workspace,
                               *dev.cuda);
  }
};

}  // namespace

DCNKIT_OP(dcnv4, 8, Op, DCNKIT_OP_DEF("dcnv4", "DCNv4", kInputs, kOutputs, kAttrs, false),
          // DCNv4: value (N, H, W, C), offset_mask (N, Ho, Wo, Cp). Returns (N, Ho, Wo, C).
          "dcnv4(Tensor value, Tensor offset_mask, int kernel_h, int kernel_w, int stride_h, int stride_w, "
          "int pad_h, int pad_w, int dilation_h, int dilation_w, int group, int group_channels, float offset_scale, "
          "int remove_center, bool softmax) -> Tensor",
          // Returns (grad_value, grad_offset_mask).
          "_dcnv4_backward(Tensor grad_output, Tensor value, Tensor offset_mask, int kernel_h, int kernel_w, "
          "int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int group, "
          "int group_channels, float offset_scale, int remove_center, bool softmax) -> (Tensor, Tensor)",
          nullptr)

}  // namespace dcnkit
