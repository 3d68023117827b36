// The declaration of DeformPSRoIPool (R-FCN, see op_decl.h): what every adapter knows of it.
#include <algorithm>

#include "dcnkit/deform_psroi_pool.h"
#include "dcnkit/op_decl.h"
#include "dcnkit/roi_batch_assert.h"
#include "dcnkit/roi_float32_rois.h"
#include "dcnkit/roi_kernels.h"

namespace dcnkit {
namespace {

constexpr TensorDef kInputs[] = {
    TensorDef{"input", false, "(N, output_dim*group_size^2, H, W)"}.with_grad(),
    TensorDef{"rois", false, "(K, 5) rows [batch_index, x1, y1, x2, y2]"}.as_rois(),
    TensorDef{"trans", true, "(K, 2*num_classes, part_size, part_size); absent when no_trans"}.with_grad(),
};
constexpr TensorDef kOutputs[] = {
    TensorDef{"output", false, "(K, output_dim, P, P)"}.with_grad(),
    {"count", true, "(K, output_dim, P, P) samples taken per bin"},
};
constexpr AttrDef kAttrs[] = {
    {"spatial_scale", AttrKind::kFloat, "1.0", "scale from image to feature coordinates"},
    {"output_size", AttrKind::kInt, "7", "P"},
    {"output_dim", AttrKind::kInt, "1", "output channels"},
    {"group_size", AttrKind::kInt, "1", "position-sensitive groups per axis"},
    {"part_size", AttrKind::kInt, "0", "trans grid size; <= 0: output_size"},
    {"sample_per_part", AttrKind::kInt, "4", "samples per bin and axis"},
    {"trans_std", AttrKind::kFloat, "0.0", "scale of trans"},
    {"no_trans", AttrKind::kInt, "0", "1: no trans input"},
};
constexpr int kScale = DCNKIT_INDEX(kAttrs, "spatial_scale"), kSize = DCNKIT_INDEX(kAttrs, "output_size"),
              kDim = DCNKIT_INDEX(kAttrs, "output_dim"), kGroup = DCNKIT_INDEX(kAttrs, "group_size"),
              kPart = DCNKIT_INDEX(kAttrs, "part_size"), kSamples = DCNKIT_INDEX(kAttrs, "sample_per_part"),
              kTransStd = DCNKIT_INDEX(kAttrs, "trans_std"), kNoTrans = DCNKIT_INDEX(kAttrs, "no_trans");
constexpr int kInput = DCNKIT_INDEX(kInputs, "input"), kRois = DCNKIT_INDEX(kInputs, "rois"),
              kTrans = DCNKIT_INDEX(kInputs, "trans");
constexpr int kCount = DCNKIT_INDEX(kOutputs, "count");

DeformPSRoIPoolAttrs attrs_of(const AttrValue* v) {
  DeformPSRoIPoolAttrs r;
  r.spatial_scale = v[kScale].f;
  r.output_size = v[kSize].i();
  r.output_dim = v[kDim].i();
  r.group_size = v[kGroup].i();
  r.part_size = v[kPart].i();
  r.sample_per_part = v[kSamples].i();
  r.trans_std = v[kTransStd].f;
  r.no_trans = v[kNoTrans].i() != 0;
  return r;
}

struct Op {
  using Params = DeformPSRoIPoolParams;

  static Status check(const char* op, const AttrValue* v) {
    const DeformPSRoIPoolAttrs r = attrs_of(v);
    const int64_t od = r.output_dim > 0 ? r.output_dim : 1, gs = r.group_size > 0 ? r.group_size : 1;
    if (od > (int64_t(1) << 24) || gs > (int64_t(1) << 16)) {
      return arg_error(op, "output_dim, group_size", "output_dim <= 2^24 and group_size <= 2^16",
                       "(" + std::to_string(r.output_dim) + ", " + std::to_string(r.group_size) + ")");
    }
    const int64_t ps = r.part_size > 0 ? r.part_size : (r.output_size > 0 ? r.output_size : 1);
    const Shape trans = {1, 2, ps, ps};
    Params p;
    return make_deform_psroi_pool_params(op, {1, od * gs * gs, 16, 16}, {1, 5}, r.no_trans ? nullptr : &trans, r, &p);
  }
  static Status params(const OpCall& c, Params* p) {
    return make_deform_psroi_pool_params(c.op, *c.shapes.in[kInput], *c.shapes.in[kRois], c.shapes.in[kTrans],
                                         attrs_of(c.attrs), p);
  }
  static void outputs(const OpCall&, const Params& p, Shape* out) { out[0] = out[kCount] = p.output_shape(); }
  static Status output_dims(const OpCall& c, DimArith& a, OpDims* d) {
    if (d->rank[kInput] != 4) return arg_error(c.op, "input", "4-D tensor", std::to_string(d->rank[kInput]) + "-D");
    if (d->rank[kRois] != 2) return arg_error(c.op, "rois", "2-D tensor", std::to_string(d->rank[kRois]) + "-D");
    const DeformPSRoIPoolAttrs r = attrs_of(c.attrs);
    for (int o : {0, kCount}) {
      d->out_rank[o] = 4;
      d->out[o][0] = d->in[kRois][0];
      d->out[o][1] = a.constant(r.output_dim);
      d->out[o][2] = a.constant(r.output_size);
      d->out[o][3] = a.constant(r.output_size);
    }
    return Status::Ok();
  }
  static size_t workspace_cuda(const Params& p, Pass pass, const OpTypes& t, const CudaContext& ctx) {
    if (pass == Pass::kBackward) return deform_psroi_pool_backward_workspace_cuda(p, t.dtype, ctx.deterministic);
    return deform_psroi_pool_workspace_cuda(p) + (t.rois != t.dtype ? deform_psroi_pool_workspace_cuda_f32_rois(p) : 0);
  }
  // With float32 RoIs the launcher reads a float32 copy of trans (K, 2 * classes, part, part): the product of the
  // trans maxima bounds it.
  static size_t workspace_bound(const OpCall& c, const OpTypes& t) {
    const auto dim = [&](int i, size_t k) { return known_dim(c, i, k); };
    Params p;
    p.attrs = attrs_of(c.attrs);
    known_roi_pool_dims(c, kInput, kRois, &p);
    p.attrs.no_trans = p.attrs.no_trans || c.shapes.in[kTrans] == nullptr;
    if (!p.attrs.no_trans) {  // trans elements = num_rois * 2 * num_classes * part_size^2
      p.num_rois = std::max(p.num_rois, dim(kTrans, 0));
      p.num_classes = (dim(kTrans, 1) + 1) / 2;
      p.attrs.part_size = std::max(dim(kTrans, 2), dim(kTrans, 3));
    }
    return deform_psroi_pool_workspace_cuda(p) + (t.rois != t.dtype ? deform_psroi_pool_workspace_cuda_f32_rois(p) : 0);
  }

  // Under torch.use_deterministic_algorithms the CUDA backward takes its atomic-free path (psroi_gather.h).
  static bool deterministic(const Params&, DType) { return true; }

  static Status forward_cpu(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    return dispatch_cpu(t.dtype, [&](auto z) {
      using T = decltype(z);
      return deform_psroi_pool_forward_cpu<T>(p, in_ptr<T>(b, kInput), in_ptr<T>(b, kRois), in_ptr<T>(b, kTrans),
                                              out_ptr<T>(b, 0), out_ptr<T>(b, kCount), *dev.cpu);
    });
  }
  static Status backward_cpu(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    return dispatch_cpu(t.dtype, [&](auto z) {
      using T = decltype(z);
      return deform_psroi_pool_backward_cpu<T>(p, static_cast<const T*>(b.grad_out[0]), in_ptr<T>(b, kInput),
                                               in_ptr<T>(b, kRois), in_ptr<T>(b, kTrans), out_ptr<T>(b, kCount),
                                               grad_ptr<T>(b, kInput), grad_ptr<T>(b, kTrans), *dev.cpu);
    });
  }
  static Status forward_cuda(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    if (dev.device_asserts) {
      DCNKIT_RETURN_IF_ERROR(roi_assert_batch_indices_cuda("deform_psroi_pool", b.in[kRois], t.rois, p.num_rois, 5,
                                                           p.batch, *dev.cuda));
    }
    if (t.rois != t.dtype) {
      return deform_psroi_pool_forward_cuda_f32_rois(p, t.dtype, b.in[kInput], static_cast<const float*>(b.in[kRois]),
                                                     b.in[kTrans], b.out[0], b.out[kCount], b.workspace, *dev.cuda);
    }
    return deform_psroi_pool_forward_cuda(p, t.dtype, b.in[kInput], b.in[kRois], b.in[kTrans], b.out[0],
                                          b.out[kCount], b.workspace, *dev.cuda);
  }
  static Status backward_cuda(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    if (dev.device_asserts) {
      DCNKIT_RETURN_IF_ERROR(roi_assert_batch_indices_cuda("deform_psroi_pool", b.in[kRois], t.rois, p.num_rois, 5,
                                                           p.batch, *dev.cuda));
    }
    return deform_psroi_pool_backward_cuda(p, t.dtype, b.grad_out[0], b.in[kInput], b.in[kRois], b.in[kTrans],
                                           b.out[kCount], b.grad_in[kInput], b.grad_in[kTrans], b.workspace,
                                           *dev.cuda);
  }
};

}  // namespace

DCNKIT_OP(deform_psroi_pool, 4, Op,
          DCNKIT_OP_DEF("deform_psroi_pool", "DeformPSRoIPool", kInputs, kOutputs, kAttrs, false),
          // Returns (output, count).
          "deform_psroi_pool(Tensor input, Tensor rois, Tensor? trans, float spatial_scale, "
          "int output_size, int output_dim, int group_size, int part_size, int sample_per_part, "
          "float trans_std) -> (Tensor, Tensor)",
          // (grad_input, grad_trans); grad_trans is empty when trans is None.
          "_deform_psroi_pool_backward(Tensor grad_output, Tensor input, Tensor rois, Tensor? trans, "
          "Tensor count, float spatial_scale, int output_size, int output_dim, int group_size, "
          "int part_size, int sample_per_part, float trans_std) -> (Tensor, Tensor)",
          nullptr)

}  // namespace dcnkit
