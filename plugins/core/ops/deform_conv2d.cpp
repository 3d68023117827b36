// The declaration of DeformConv2d (DCNv1 / DCNv2, see op_decl.h): what every adapter knows of it.
#include <algorithm>

#include "dcnkit/deform_conv2d.h"
#include "dcnkit/deform_conv2d_quant.h"
#include "dcnkit/op_decl.h"

namespace dcnkit {
namespace {

constexpr TensorDef kInputs[] = {
    TensorDef{"input", false, "(N, Cin, H, W)"}.with_grad(),
    TensorDef{"offset", false, "(N, 2*deformable_groups*kh*kw, Ho, Wo), (dy, dx) pairs"}.with_grad(),
    TensorDef{"weight", false, "(Cout, Cin/groups, kh, kw)"}.with_grad(),
    TensorDef{"bias", true, "(Cout)"}.with_grad(),
    TensorDef{"mask", true, "(N, deformable_groups*kh*kw, Ho, Wo); absent for DCNv1"}.with_grad(),
};
constexpr TensorDef kOutputs[] = {TensorDef{"output", false, "(N, Cout, Ho, Wo)"}.with_grad()};
constexpr AttrDef kAttrs[] = {
    {"stride", AttrKind::kInts, "[1, 1]", "(sh, sw)"},
    {"padding", AttrKind::kInts, "[0, 0]", "(ph, pw)"},
    {"dilation", AttrKind::kInts, "[1, 1]", "(dh, dw)"},
    {"groups", AttrKind::kInt, "1", "convolution groups"},
    {"deformable_groups", AttrKind::kInt, "1", "offset groups"},
};
constexpr int kStride = DCNKIT_INDEX(kAttrs, "stride"), kPadding = DCNKIT_INDEX(kAttrs, "padding"),
              kDilation = DCNKIT_INDEX(kAttrs, "dilation"), kGroups = DCNKIT_INDEX(kAttrs, "groups"),
              kDeformGroups = DCNKIT_INDEX(kAttrs, "deformable_groups");
constexpr int kInput = DCNKIT_INDEX(kInputs, "input"), kOffset = DCNKIT_INDEX(kInputs, "offset"),
              kWeight = DCNKIT_INDEX(kInputs, "weight"), kBias = DCNKIT_INDEX(kInputs, "bias"),
              kMask = DCNKIT_INDEX(kInputs, "mask");

DeformConv2dAttrs attrs_of(const AttrValue* v) {
  DeformConv2dAttrs d;
  d.stride_h = v[kStride].at(0);
  d.stride_w = v[kStride].at(1);
  d.pad_h = v[kPadding].at(0);
  d.pad_w = v[kPadding].at(1);
  d.dilation_h = v[kDilation].at(0);
  d.dilation_w = v[kDilation].at(1);
  d.groups = v[kGroups].i();
  d.deformable_groups = v[kDeformGroups].i();
  return d;
}

struct Op {
  using Params = DeformConv2dParams;

  // With shapes built to fit the attributes: any error left is the attributes'.
  static Status check(const char* op, const AttrValue* v) {
    const DeformConv2dAttrs d = attrs_of(v);
    const int64_t g = d.groups > 0 ? d.groups : 1, dg = d.deformable_groups > 0 ? d.deformable_groups : 1;
    if (g > (int64_t(1) << 24) || dg > (int64_t(1) << 24)) {
      return arg_error(op, "groups, deformable_groups", "values <= 2^24",
                       "(" + std::to_string(d.groups) + ", " + std::to_string(d.deformable_groups) + ")");
    }
    const int64_t cin = g * dg, hw = 16;
    const int64_t ho = (d.stride_h > 0 && d.dilation_h > 0 && d.pad_h >= 0)
                           ? deform_conv2d_out_size(hw, 1, d.stride_h, d.pad_h, d.dilation_h) : 1;
    const int64_t wo = (d.stride_w > 0 && d.dilation_w > 0 && d.pad_w >= 0)
                           ? deform_conv2d_out_size(hw, 1, d.stride_w, d.pad_w, d.dilation_w) : 1;
    Params p;
    return make_deform_conv2d_params(op, {1, cin, hw, hw}, {1, 2 * dg, ho, wo}, {g, dg, 1, 1}, nullptr, nullptr, d,
                                     &p);
  }
  static Status params(const OpCall& c, Params* p) {
    return deform_conv2d_params_from(c.op, c.attrs, c.shapes.in, p);
  }
  static void outputs(const OpCall&, const Params& p, Shape* out) { out[0] = p.output_shape(); }
  static Status output_dims(const OpCall& c, DimArith& a, OpDims* d) {
    if (d->rank[kInput] != 4) return arg_error(c.op, "input", "4-D tensor", std::to_string(d->rank[kInput]) + "-D");
    if (d->rank[kWeight] != 4) return arg_error(c.op, "weight", "4-D tensor", std::to_string(d->rank[kWeight]) + "-D");
    const DeformConv2dAttrs at = attrs_of(c.attrs);
    const DimArith::Value* x = d->in[kInput];
    const DimArith::Value* w = d->in[kWeight];
    d->out_rank[0] = 4;
    d->out[0][0] = x[0];
    d->out[0][1] = w[0];
    d->out[0][2] = deform_conv2d_out_size_rule(a, x[2], w[2], at.stride_h, at.pad_h, at.dilation_h);
    d->out[0][3] = deform_conv2d_out_size_rule(a, x[3], w[3], at.stride_w, at.pad_w, at.dilation_w);
    if (d->rank[kOffset] == 4) {  // a checked call's offsets are (N, 2 * dg * kh * kw, Ho, Wo)
      d->out[0][2] = a.either(d->out[0][2], d->in[kOffset][2]);
      d->out[0][3] = a.either(d->out[0][3], d->in[kOffset][3]);
    }
    return Status::Ok();
  }
  // The ONNX Runtime CPU kernels: a constant float32 (Cout, Cin/groups, kh, kw) weight in the launcher's layout.
  static size_t pack(const OpCall& c, int i, const void* data, DType dtype, void* out) {
    const Shape* w = c.shapes.in[kWeight];
    if (i != kWeight || dtype != DType::kFloat32 || w == nullptr || w->size() != 4 || data == nullptr) return 0;
    const int64_t cout = (*w)[0], cin_g = (*w)[1], kk = (*w)[2] * (*w)[3];
    if (cout <= 0 || cin_g <= 0 || kk <= 0) return 0;
    if (out != nullptr) deform_conv2d_weight_kc_cpu<float>(cout, cin_g, kk, static_cast<const float*>(data),
                                                           static_cast<float*>(out));
    return static_cast<size_t>(cout * cin_g * kk) * sizeof(float);
  }
  // The packed weight as the forward's GEMM operand: per convolution group, (Cout/groups) x (kh*kw*Cin/groups).
  static bool gemm_operand(const OpCall& c, int i, const void* packed, GemmOperand* a) {
    const Shape* w = c.shapes.in[kWeight];
    if (i != kWeight || w == nullptr || w->size() != 4 || packed == nullptr) return false;
    const int64_t groups = attrs_of(c.attrs).groups, cout = (*w)[0];
    if (groups <= 0 || cout % groups != 0) return false;
    a->dtype = DType::kFloat32;
    a->batch = groups;
    a->rows = cout / groups;
    a->cols = (*w)[1] * (*w)[2] * (*w)[3];
    a->ld = a->cols;
    a->stride = a->rows * a->cols;
    a->data = packed;
    return a->rows > 0 && a->cols > 0;
  }
  static size_t workspace_cpu(const Params& p, Pass pass, const OpTypes& t, const CpuContext& ctx) {
    return pass == Pass::kForward ? deform_conv2d_forward_workspace_cpu(p, t.dtype, ctx)
                                  : deform_conv2d_backward_workspace_cpu(p, t.dtype, ctx);
  }
  static size_t workspace_cuda(const Params& p, Pass pass, const OpTypes& t, const CudaContext& ctx) {
    return pass == Pass::kForward ? deform_conv2d_forward_workspace_cuda(p, t.dtype)
                                  : deform_conv2d_backward_workspace_cuda(p, t.dtype, ctx.deterministic);
  }
  // The columns take (images) x Cin x kh x kw x Ho x Wo elements; a checked call has the offset's spatial dims as
  // (Ho, Wo), so the offset's maxima bound them whatever the input's maxima say.
  static size_t workspace_bound(const OpCall& c, const OpTypes& t) {
    const auto dim = [&](int i, size_t k) { return known_dim(c, i, k); };
    Params p;
    p.attrs = attrs_of(c.attrs);
    p.batch = dim(kInput, 0);
    p.in_channels = dim(kInput, 1);
    p.kernel_h = dim(kWeight, 2);
    p.kernel_w = dim(kWeight, 3);
    p.out_h = dim(kOffset, 2);
    p.out_w = dim(kOffset, 3);
    return deform_conv2d_forward_workspace_cuda_bound(p, t.dtype);
  }
  // Under torch.use_deterministic_algorithms the CUDA backward takes its atomic-free path (deform_conv2d_sorted.h).
  static bool deterministic(const Params&, DType) { return true; }

  static Status forward_cpu(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    return dispatch_cpu(t.dtype, [&](auto z) {
      using T = decltype(z);
      return deform_conv2d_forward_cpu<T>(p, in_ptr<T>(b, kInput), in_ptr<T>(b, kOffset), in_ptr<T>(b, kWeight),
                                          in_ptr<T>(b, kBias), in_ptr<T>(b, kMask), out_ptr<T>(b, 0), b.workspace,
                                          *dev.cpu, static_cast<const T*>(b.packed[kWeight]), b.gemm_packed[kWeight]);
    });
  }
  static Status backward_cpu(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    return dispatch_cpu(t.dtype, [&](auto z) {
      using T = decltype(z);
      return deform_conv2d_backward_cpu<T>(p, static_cast<const T*>(b.grad_out[0]), in_ptr<T>(b, kInput),
                                           in_ptr<T>(b, kOffset), in_ptr<T>(b, kWeight), in_ptr<T>(b, kMask),
                                           grad_ptr<T>(b, kInput), grad_ptr<T>(b, kOffset), grad_ptr<T>(b, kWeight),
                                           grad_ptr<T>(b, kBias), grad_ptr<T>(b, kMask), b.workspace, *dev.cpu);
    });
  }
  static Status forward_cuda(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    return deform_conv2d_forward_cuda(p, t.dtype, b.in[kInput], b.in[kOffset], b.in[kWeight], b.in[kBias],
                                      b.in[kMask], b.out[0], b.workspace, *dev.cuda);
  }
  static Status backward_cuda(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    return deform_conv2d_backward_cuda(p, t.dtype, b.grad_out[0], b.in[kInput], b.in[kOffset], b.in[kWeight],
                                       b.in[kMask], b.grad_in[kInput], b.grad_in[kOffset], b.grad_in[kWeight],
                                       b.grad_in[kBias], b.grad_in[kMask], b.workspace, *dev.cuda);
  }
};

// mmcv 1.x / mmdeploy exports. ModulatedDeformConv2d: (input, offset, mask, weight[, bias]); DeformConv2d: (input,
// offset, weight) (mmcv 1.x also writes bias (always 0) and im2col_step: ignored); attributes stride, padding,
// dilation, groups, deform_groups, loosely typed.
void variants(const OpDecl* op, std::vector<OpVariant>* out) {
  const std::vector<AttrAlias> names = {
      {"stride", kAttrs[kStride].name, -1},   {"padding", kAttrs[kPadding].name, -1},
      {"dilation", kAttrs[kDilation].name, -1}, {"groups", kAttrs[kGroups].name, -1},
      {"deform_groups", kAttrs[kDeformGroups].name, -1},
  };
  const std::vector<InputSlot> modulated = {
      {kInput, false}, {kOffset, false}, {kMask, false}, {kWeight, false}, {kBias, true}};
  const std::vector<InputSlot> plain = {{kInput, false}, {kOffset, false}, {kWeight, false}};
  for (const char* domain : {"mmdeploy", "mmcv"}) {
    out->push_back({domain, "MMCVModulatedDeformConv2d", op, modulated, names, true, true});
    out->push_back({domain, "MMCVDeformConv2d", op, plain, names, true, true});
  }
  // ONNX's DeformConv (opset 19): DeformConv(X, W, offset[, B][, mask]) with strides, pads [t, l, b, r], dilations,
  // group, offset_group, and kernel_shape checked against W.
  OpVariant onnx{"",
                 "DeformConv",
                 op,
                 {{kInput, false}, {kWeight, false}, {kOffset, false}, {kBias, true}, {kMask, true}},
                 {{"strides", kAttrs[kStride].name, -1},
                  {"pads", kAttrs[kPadding].name, -1},
                  {"dilations", kAttrs[kDilation].name, -1},
                  {"group", kAttrs[kGroups].name, -1},
                  {"offset_group", kAttrs[kDeformGroups].name, -1}},
                 false,
                 false};
  onnx.onnx_standard = true;
  onnx.kernel_shape_of = kWeight;
  out->push_back(onnx);
}

}  // namespace

Status deform_conv2d_params_from(const char* op, const AttrValue* attrs, const Shape* const* in,
                                 DeformConv2dParams* p) {
  for (int i : {kInput, kOffset, kWeight}) {
    if (in[i] == nullptr) return arg_error(op, kInputs[i].name, "a tensor", "no input");
  }
  return make_deform_conv2d_params(op, *in[kInput], *in[kOffset], *in[kWeight], in[kBias], in[kMask],
                                   attrs_of(attrs), p);
}

DCNKIT_OP(deform_conv2d, 1, Op, DCNKIT_OP_DEF("deform_conv2d", "DeformConv2d", kInputs, kOutputs, kAttrs, true),
          "deform_conv2d(Tensor input, Tensor offset, Tensor weight, Tensor? bias, Tensor? mask, "
          "int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, "
          "int groups, int deformable_groups) -> Tensor",
          // (grad_input, grad_offset, grad_weight, grad_bias, grad_mask); grad_bias / grad_mask are empty (numel 0)
          // when bias / mask are None.
          "_deform_conv2d_backward(Tensor grad_output, Tensor input, Tensor offset, Tensor weight, "
          "Tensor? bias, Tensor? mask, int stride_h, int stride_w, int pad_h, int pad_w, "
          "int dilation_h, int dilation_w, int groups, int deformable_groups) "
          "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
          &variants)

}  // namespace dcnkit
