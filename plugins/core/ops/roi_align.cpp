// The declaration of RoIAlign (see op_decl.h): what every adapter knows of it.
#include "dcnkit/op_decl.h"
#include "dcnkit/roi_align.h"
#include "dcnkit/roi_float32_rois.h"

namespace dcnkit {
namespace {

constexpr TensorDef kInputs[] = {
    TensorDef{"input", false, "(N, C, H, W)"}.with_grad(),
    TensorDef{"rois", false, "(K, 5) rows [batch_index, x1, y1, x2, y2]"}.as_rois(),
};
constexpr TensorDef kOutputs[] = {TensorDef{"output", false, "(K, C, oh, ow)"}.with_grad()};
constexpr AttrDef kAttrs[] = {
    {"output_size", AttrKind::kInts, "[1, 1]", "(oh, ow)"},
    {"spatial_scale", AttrKind::kFloat, "1.0", "scale from image to feature coordinates"},
    {"sampling_ratio", AttrKind::kInt, "0", "samples per bin and axis; <= 0: adaptive"},
    {"aligned", AttrKind::kInt, "0", "1: shift by half a pixel (pixel-center convention)"},
    {"pool_mode", AttrKind::kString, "avg", "avg | max"},
};
constexpr int kSize = DCNKIT_INDEX(kAttrs, "output_size"), kScale = DCNKIT_INDEX(kAttrs, "spatial_scale"),
              kSampling = DCNKIT_INDEX(kAttrs, "sampling_ratio"), kAligned = DCNKIT_INDEX(kAttrs, "aligned"),
              kPoolMode = DCNKIT_INDEX(kAttrs, "pool_mode");
constexpr int kInput = DCNKIT_INDEX(kInputs, "input"), kRois = DCNKIT_INDEX(kInputs, "rois");

Status attrs_of(const char* op, const AttrValue* v, RoIAlignAttrs* a) {
  a->pooled_h = v[kSize].at(0);
  a->pooled_w = v[kSize].at(1);
  a->spatial_scale = v[kScale].f;
  a->sampling_ratio = v[kSampling].i();
  a->aligned = v[kAligned].i() != 0;
  return parse_pool_mode(op, v[kPoolMode].s, &a->mode);
}

struct Op {
  using Params = RoIAlignParams;

  static Status check(const char* op, const AttrValue* v) {
    RoIAlignAttrs a;
    DCNKIT_RETURN_IF_ERROR(attrs_of(op, v, &a));
    Params p;
    return make_roi_align_params(op, {1, 1, 16, 16}, {1, 5}, a, &p);
  }
  static Status params(const OpCall& c, Params* p) {
    RoIAlignAttrs a;
    DCNKIT_RETURN_IF_ERROR(attrs_of(c.op, c.attrs, &a));
    return make_roi_align_params(c.op, *c.shapes.in[kInput], *c.shapes.in[kRois], a, p);
  }
  static void outputs(const OpCall&, const Params& p, Shape* out) { out[0] = p.output_shape(); }
  static Status output_dims(const OpCall& c, DimArith& a, OpDims* d) {
    return roi_pool_output_dims(c, kInput, kRois, c.attrs[kSize].at(0), c.attrs[kSize].at(1), a, d);
  }
  static size_t workspace_cuda(const Params& p, Pass pass, const OpTypes& t, const CudaContext& ctx) {
    return pass == Pass::kForward ? roi_align_workspace_cuda(p)
                                  : roi_align_backward_workspace_cuda(p, t.dtype, ctx.deterministic);
  }
  static size_t workspace_bound(const OpCall& c, const OpTypes&) {
    Params p;
    if (!attrs_of(c.op, c.attrs, &p.attrs).ok()) return 0;
    known_roi_pool_dims(c, kInput, kRois, &p);
    return roi_align_workspace_cuda(p);
  }
  // Under torch.use_deterministic_algorithms the CUDA backward takes its atomic-free path (roi_gather.h), for any
  // valid input.
  static bool deterministic(const Params&, DType) { return true; }

  static Status forward_cpu(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    return dispatch_cpu(t.dtype, [&](auto z) {
      using T = decltype(z);
      return roi_align_forward_cpu<T>(p, in_ptr<T>(b, kInput), in_ptr<T>(b, kRois), out_ptr<T>(b, 0), *dev.cpu);
    });
  }
  static Status backward_cpu(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    return dispatch_cpu(t.dtype, [&](auto z) {
      using T = decltype(z);
      return roi_align_backward_cpu<T>(p, static_cast<const T*>(b.grad_out[0]), in_ptr<T>(b, kInput),
                                       in_ptr<T>(b, kRois), grad_ptr<T>(b, kInput), *dev.cpu);
    });
  }
  // The kernels raise the batch-index assert themselves where the torch op asks (no extra kernel per call).
  static Status forward_cuda(const Params& params, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    Params p = params;
    p.assert_batch_index = dev.device_asserts;
    if (t.rois != t.dtype) {
      return roi_align_forward_cuda_f32_rois(p, t.dtype, b.in[kInput], static_cast<const float*>(b.in[kRois]),
                                             b.out[0], b.workspace, *dev.cuda);
    }
    return roi_align_forward_cuda(p, t.dtype, b.in[kInput], b.in[kRois], b.out[0], b.workspace, *dev.cuda);
  }
  static Status backward_cuda(const Params& params, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    Params p = params;
    p.assert_batch_index = dev.device_asserts;
    return roi_align_backward_cuda(p, t.dtype, b.grad_out[0], b.in[kInput], b.in[kRois], b.grad_in[kInput],
                                   b.workspace, *dev.cuda);
  }
};

// mmcv::MMCVRoiAlign: output_height, output_width, spatial_scale, sampling_ratio, mode, aligned.
void variants(const OpDecl* op, std::vector<OpVariant>* out) {
  out->push_back({"mmcv",
                  "MMCVRoiAlign",
                  op,
                  {{kInput, false}, {kRois, false}},
                  {{"output_height", kAttrs[kSize].name, 0},
                   {"output_width", kAttrs[kSize].name, 1},
                   {"spatial_scale", kAttrs[kScale].name, -1},
                   {"sampling_ratio", kAttrs[kSampling].name, -1},
                   {"mode", kAttrs[kPoolMode].name, -1},
                   {"aligned", kAttrs[kAligned].name, -1}},
                  true,
                  true});
}

}  // namespace

DCNKIT_OP(roi_align, 2, Op, DCNKIT_OP_DEF("roi_align", "RoIAlign", kInputs, kOutputs, kAttrs, false),
          "roi_align(Tensor input, Tensor rois, int pooled_h, int pooled_w, float spatial_scale, "
          "int sampling_ratio, bool aligned, str pool_mode) -> Tensor",
          "_roi_align_backward(Tensor grad_output, Tensor input, Tensor rois, int pooled_h, "
          "int pooled_w, float spatial_scale, int sampling_ratio, bool aligned, str pool_mode) -> Tensor",
          &variants)

}  // namespace dcnkit
