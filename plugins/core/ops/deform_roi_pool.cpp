// The declaration of DeformRoIPool (see op_decl.h): what every adapter knows of it.
#include "dcnkit/deform_roi_pool.h"
#include "dcnkit/op_decl.h"
#include "dcnkit/roi_batch_assert.h"
#include "dcnkit/roi_float32_rois.h"
#include "dcnkit/roi_kernels.h"

namespace dcnkit {
namespace {

constexpr TensorDef kInputs[] = {
    TensorDef{"input", false, "(N, C, H, W)"}.with_grad(),
    TensorDef{"rois", false, "(K, 5) rows [batch_index, x1, y1, x2, y2]"}.as_rois(),
    TensorDef{"offset", true, "(K, 2, oh, ow)"}.with_grad(),
};
constexpr TensorDef kOutputs[] = {TensorDef{"output", false, "(K, C, oh, ow)"}.with_grad()};
constexpr AttrDef kAttrs[] = {
    {"output_size", AttrKind::kInts, "[1, 1]", "(oh, ow)"},
    {"spatial_scale", AttrKind::kFloat, "1.0", "scale from image to feature coordinates"},
    {"sampling_ratio", AttrKind::kInt, "0", "samples per bin and axis; <= 0: adaptive"},
    {"gamma", AttrKind::kFloat, "0.1", "offset scale"},
};
constexpr int kSize = DCNKIT_INDEX(kAttrs, "output_size"), kScale = DCNKIT_INDEX(kAttrs, "spatial_scale"),
              kSampling = DCNKIT_INDEX(kAttrs, "sampling_ratio"), kGamma = DCNKIT_INDEX(kAttrs, "gamma");
constexpr int kInput = DCNKIT_INDEX(kInputs, "input"), kRois = DCNKIT_INDEX(kInputs, "rois"),
              kOffset = DCNKIT_INDEX(kInputs, "offset");

DeformRoIPoolAttrs attrs_of(const AttrValue* v) {
  DeformRoIPoolAttrs a;
  a.pooled_h = v[kSize].at(0);
  a.pooled_w = v[kSize].at(1);
  a.spatial_scale = v[kScale].f;
  a.sampling_ratio = v[kSampling].i();
  a.gamma = v[kGamma].f;
  return a;
}

struct Op {
  using Params = DeformRoIPoolParams;

  static Status check(const char* op, const AttrValue* v) {
    Params p;
    return make_deform_roi_pool_params(op, {1, 1, 16, 16}, {1, 5}, nullptr, attrs_of(v), &p);
  }
  static Status params(const OpCall& c, Params* p) {
    return make_deform_roi_pool_params(c.op, *c.shapes.in[kInput], *c.shapes.in[kRois], c.shapes.in[kOffset],
                                       attrs_of(c.attrs), p);
  }
  static void outputs(const OpCall&, const Params& p, Shape* out) { out[0] = p.output_shape(); }
  static Status output_dims(const OpCall& c, DimArith& a, OpDims* d) {
    return roi_pool_output_dims(c, kInput, kRois, c.attrs[kSize].at(0), c.attrs[kSize].at(1), a, d);
  }
  static size_t workspace_cuda(const Params& p, Pass pass, const OpTypes& t, const CudaContext& ctx) {
    return pass == Pass::kForward ? deform_roi_pool_workspace_cuda(p)
                                  : deform_roi_pool_backward_workspace_cuda(p, t.dtype, ctx.deterministic);
  }
  static size_t workspace_bound(const OpCall& c, const OpTypes&) {
    Params p;
    p.attrs = attrs_of(c.attrs);
    known_roi_pool_dims(c, kInput, kRois, &p);
    p.has_offset = c.shapes.in[kOffset] != nullptr;
    return deform_roi_pool_workspace_cuda(p);
  }

  // Under torch.use_deterministic_algorithms the CUDA backward takes its atomic-free path (roi_gather.h).
  static bool deterministic(const Params&, DType) { return true; }

  static Status forward_cpu(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    return dispatch_cpu(t.dtype, [&](auto z) {
      using T = decltype(z);
      return deform_roi_pool_forward_cpu<T>(p, in_ptr<T>(b, kInput), in_ptr<T>(b, kRois), in_ptr<T>(b, kOffset),
                                            out_ptr<T>(b, 0), *dev.cpu);
    });
  }
  static Status backward_cpu(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    return dispatch_cpu(t.dtype, [&](auto z) {
      using T = decltype(z);
      return deform_roi_pool_backward_cpu<T>(p, static_cast<const T*>(b.grad_out[0]), in_ptr<T>(b, kInput),
                                             in_ptr<T>(b, kRois), in_ptr<T>(b, kOffset), grad_ptr<T>(b, kInput),
                                             grad_ptr<T>(b, kOffset), *dev.cpu);
    });
  }
  static Status forward_cuda(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    if (dev.device_asserts) {
      DCNKIT_RETURN_IF_ERROR(roi_assert_batch_indices_cuda("deform_roi_pool", b.in[kRois], t.rois,
                                                           p.num_rois, 5, p.batch, *dev.cuda));
    }
    if (t.rois != t.dtype) {
      return deform_roi_pool_forward_cuda_f32_rois(p, t.dtype, b.in[kInput], static_cast<const float*>(b.in[kRois]),
                                                   b.in[kOffset], b.out[0], b.workspace, *dev.cuda);
    }
    return deform_roi_pool_forward_cuda(p, t.dtype, b.in[kInput], b.in[kRois], b.in[kOffset], b.out[0], b.workspace,
                                        *dev.cuda);
  }
  static Status backward_cuda(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    if (dev.device_asserts) {
      DCNKIT_RETURN_IF_ERROR(
          roi_assert_batch_indices_cuda("deform_roi_pool", b.in[kRois], t.rois, p.num_rois, 5, p.batch, *dev.cuda));
    }
    return deform_roi_pool_backward_cuda(p, t.dtype, b.grad_out[0], b.in[kInput], b.in[kRois], b.in[kOffset],
                                         b.grad_in[kInput], b.grad_in[kOffset], b.workspace, *dev.cuda);
  }
};

// mmcv::MMCVDeformRoIPool: (input, rois[, offset]); pooled_height, pooled_width, spatial_scale, sampling_ratio
// (written as a float by mmcv), gamma.
void variants(const OpDecl* op, std::vector<OpVariant>* out) {
  out->push_back({"mmcv",
                  "MMCVDeformRoIPool",
                  op,
                  {{kInput, false}, {kRois, false}, {kOffset, true}},
                  {{"pooled_height", kAttrs[kSize].name, 0},
                   {"pooled_width", kAttrs[kSize].name, 1},
                   {"spatial_scale", kAttrs[kScale].name, -1},
                   {"sampling_ratio", kAttrs[kSampling].name, -1},
                   {"gamma", kAttrs[kGamma].name, -1}},
                  true,
                  true});
}

}  // namespace

DCNKIT_OP(deform_roi_pool, 3, Op,
          DCNKIT_OP_DEF("deform_roi_pool", "DeformRoIPool", kInputs, kOutputs, kAttrs, false),
          "deform_roi_pool(Tensor input, Tensor rois, Tensor? offset, int pooled_h, int pooled_w, "
          "float spatial_scale, int sampling_ratio, float gamma) -> Tensor",
          // (grad_input, grad_offset); grad_offset is empty when offset is None.
          "_deform_roi_pool_backward(Tensor grad_output, Tensor input, Tensor rois, Tensor? offset, "
          "int pooled_h, int pooled_w, float spatial_scale, int sampling_ratio, float gamma) "
          "-> (Tensor, Tensor)",
          &variants)

}  // namespace dcnkit
