// DeformConv2d: parameter validation (the core's one check of shapes and attributes, for every front end).
#include <string>

#include "dcnkit/deform_conv2d.h"

namespace dcnkit {

namespace {

std::string pair_str(int64_t a, int64_t b) { return "(" + std::to_string(a) + ", " + std::to_string(b) + ")"; }

}  // namespace

Status make_deform_conv2d_params(const char* op, const Shape& input, const Shape& offset,
                                 const Shape& weight, const Shape* bias, const Shape* mask,
                                 const DeformConv2dAttrs& a, DeformConv2dParams* p) {
  DCNKIT_RETURN_IF_ERROR(check_rank(op, "input", input, 4, "(N, Cin, H, W)"));
  DCNKIT_RETURN_IF_ERROR(check_rank(op, "offset", offset, 4, "(N, 2*deformable_groups*kh*kw, Ho, Wo)"));
  DCNKIT_RETURN_IF_ERROR(check_rank(op, "weight", weight, 4, "(Cout, Cin/groups, kh, kw)"));
  if (mask) DCNKIT_RETURN_IF_ERROR(check_rank(op, "mask", *mask, 4, "(N, deformable_groups*kh*kw, Ho, Wo)"));
  if (bias) DCNKIT_RETURN_IF_ERROR(check_rank(op, "bias", *bias, 1, "(Cout)"));

  if (a.stride_h < 1 || a.stride_w < 1)
    return arg_error(op, "stride", "values >= 1", pair_str(a.stride_h, a.stride_w));
  if (a.pad_h < 0 || a.pad_w < 0)
    return arg_error(op, "padding", "values >= 0", pair_str(a.pad_h, a.pad_w));
  if (a.dilation_h < 1 || a.dilation_w < 1)
    return arg_error(op, "dilation", "values >= 1", pair_str(a.dilation_h, a.dilation_w));
  if (a.groups < 1) return arg_error(op, "groups", ">= 1", std::to_string(a.groups));
  if (a.deformable_groups < 1)
    return arg_error(op, "deformable_groups", ">= 1", std::to_string(a.deformable_groups));

  const int64_t N = input[0], Cin = input[1], H = input[2], W = input[3];
  const int64_t Cout = weight[0], kh = weight[2], kw = weight[3];
  if (Cin < 1) return arg_error(op, "input", "at least 1 channel (dim 1)", shape_str(input));
  if (H < 1 || W < 1)
    return arg_error(op, "input", "height and width >= 1", "shape " + shape_str(input));
  if (kh < 1 || kw < 1)
    return arg_error(op, "weight", "kernel size (dims 2, 3) >= 1", "shape " + shape_str(weight));
  if (Cin % a.groups != 0)
    return arg_error(op, "input", "channels divisible by groups = " + std::to_string(a.groups),
                     std::to_string(Cin) + " channels");
  if (Cin % a.deformable_groups != 0)
    return arg_error(op, "input",
                     "channels divisible by deformable_groups = " + std::to_string(a.deformable_groups),
                     std::to_string(Cin) + " channels");
  if (Cout % a.groups != 0)
    return arg_error(op, "weight",
                     "output channels (dim 0) divisible by groups = " + std::to_string(a.groups),
                     std::to_string(Cout) + " (shape " + shape_str(weight) + ")");
  DCNKIT_RETURN_IF_ERROR(check_dim(op, "weight", weight, 1, Cin / a.groups, "Cin/groups"));

  const int64_t Ho = deform_conv2d_out_size(H, kh, a.stride_h, a.pad_h, a.dilation_h);
  const int64_t Wo = deform_conv2d_out_size(W, kw, a.stride_w, a.pad_w, a.dilation_w);
  if (Ho < 1 || Wo < 1)
    return arg_error(op, "input",
                     "padded size (H + 2*pad, W + 2*pad) at least the dilated kernel size " +
                         pair_str(a.dilation_h * (kh - 1) + 1, a.dilation_w * (kw - 1) + 1),
                     pair_str(H + 2 * a.pad_h, W + 2 * a.pad_w) + " (output size would be " +
                         pair_str(Ho, Wo) + ")");

  const int64_t K = kh * kw;
  const int64_t Gd = a.deformable_groups;
  DCNKIT_RETURN_IF_ERROR(check_dim(op, "offset", offset, 0, N, "N of input"));
  DCNKIT_RETURN_IF_ERROR(check_dim(op, "offset", offset, 1, 2 * Gd * K, "2*deformable_groups*kh*kw"));
  DCNKIT_RETURN_IF_ERROR(check_dim(op, "offset", offset, 2, Ho, "output height"));
  DCNKIT_RETURN_IF_ERROR(check_dim(op, "offset", offset, 3, Wo, "output width"));
  if (mask) {
    DCNKIT_RETURN_IF_ERROR(check_dim(op, "mask", *mask, 0, N, "N of input"));
    DCNKIT_RETURN_IF_ERROR(check_dim(op, "mask", *mask, 1, Gd * K, "deformable_groups*kh*kw"));
    DCNKIT_RETURN_IF_ERROR(check_dim(op, "mask", *mask, 2, Ho, "output height"));
    DCNKIT_RETURN_IF_ERROR(check_dim(op, "mask", *mask, 3, Wo, "output width"));
  }
  if (bias) DCNKIT_RETURN_IF_ERROR(check_dim(op, "bias", *bias, 0, Cout, "Cout of weight"));

  p->attrs = a;
  p->batch = N;
  p->in_channels = Cin;
  p->height = H;
  p->width = W;
  p->out_channels = Cout;
  p->kernel_h = kh;
  p->kernel_w = kw;
  p->out_h = Ho;
  p->out_w = Wo;
  p->has_bias = bias != nullptr;
  p->has_mask = mask != nullptr;
  return Status::Ok();
}


}  // namespace dcnkit
