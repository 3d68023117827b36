// What the declarations of DCNv3 and DCNv4 share (plugins/core/ops/dcnv3.cpp, dcnv4.cpp): InternImage's attribute
// names (its exporter writes them on mmdeploy::TRTDCNv3, with an im2col_step that only batches its CUDA work:
// ignored), their reading into the core's Dcnv3Attrs, and the output rule. K = kernel_h*kernel_w (minus the centre:
// remove_center). DCNv4 adds softmax after these.
#pragma once

#include "dcnkit/dcnv3.h"
#include "dcnkit/deform_conv2d.h"
#include "dcnkit/op_decl.h"

namespace dcnkit::dcnv3_decl {

#define DCNKIT_DCNV3_ATTRS                                                                                  \
  {"kernel_h", AttrKind::kInt, "3", "kernel height"}, {"kernel_w", AttrKind::kInt, "3", "kernel width"},      \
      {"stride_h", AttrKind::kInt, "1", "stride (h)"}, {"stride_w", AttrKind::kInt, "1", "stride (w)"},       \
      {"pad_h", AttrKind::kInt, "1", "padding (h)"}, {"pad_w", AttrKind::kInt, "1", "padding (w)"},           \
      {"dilation_h", AttrKind::kInt, "1", "dilation (h)"}, {"dilation_w", AttrKind::kInt, "1", "dilation (w)"}, \
      {"group", AttrKind::kInt, "1", "G, sampling groups"},                                                 \
      {"group_channels", AttrKind::kInt, "1", "channels per group (C = G * group_channels)"},                \
      {"offset_scale", AttrKind::kFloat, "1.0", "scale of the offsets"},                                    \
      {"remove_center", AttrKind::kInt, "0", "1: the kernel's centre point is not sampled"}

constexpr AttrDef kAttrs[] = {DCNKIT_DCNV3_ATTRS};
constexpr int kOffsetScale = DCNKIT_INDEX(kAttrs, "offset_scale");
constexpr int kNumAttrs = static_cast<int>(sizeof(kAttrs) / sizeof(kAttrs[0]));

// The ints of Dcnv3Attrs in the table's order (kernel_h .. group_channels, then remove_center after offset_scale).
inline Dcnv3Attrs attrs_of(const AttrValue* v) {
  return Dcnv3Attrs{v[0].i(), v[1].i(), v[2].i(), v[3].i(),          v[4].i(), v[5].i(),
                    v[6].i(), v[7].i(), v[8].i(), v[9].i(), v[kOffsetScale].f, v[11].i()};
}
static_assert(DCNKIT_INDEX(kAttrs, "group_channels") == 9 && DCNKIT_INDEX(kAttrs, "remove_center") == 11,
              "dcnv3_common.h: attribute order");

// (N, Ho, Wo, C) from (N, H, W, C): the convolution rule of the kernel, stride, pad and dilation.
inline Status output_dims(const OpCall& c, DimArith& a, OpDims* d) {
  if (d->rank[0] != 4) {
    return arg_error(c.op, c.decl->def.inputs[0].name, "4-D tensor", std::to_string(d->rank[0]) + "-D");
  }
  const Dcnv3Attrs at = attrs_of(c.attrs);
  const DimArith::Value* x = d->in[0];
  d->out_rank[0] = 4;
  d->out[0][0] = x[0];
  d->out[0][1] = deform_conv2d_out_size_rule(a, x[1], a.constant(at.kernel_h), at.stride_h, at.pad_h, at.dilation_h);
  d->out[0][2] = deform_conv2d_out_size_rule(a, x[2], a.constant(at.kernel_w), at.stride_w, at.pad_w, at.dilation_w);
  d->out[0][3] = x[3];
  return Status::Ok();
}

// The entries DCNv3's and DCNv4's declarations share (each `struct Op` derives from it).
struct SharedEntries {
  using Params = Dcnv3Params;

  static void outputs(const OpCall&, const Params& p, Shape* out) { out[0] = p.output_shape(); }
  static Status output_dims(const OpCall& c, DimArith& a, OpDims* d) { return dcnv3_decl::output_dims(c, a, d); }
  static size_t workspace_cuda(const Params& p, Pass pass, const OpTypes& t, const CudaContext&) {
    return pass == Pass::kBackward ? dcnv3_backward_workspace_cuda(p, t.dtype) : 0;
  }
};

}  // namespace dcnkit::dcnv3_decl
