// The declaration of RoIAlignRotated (see op_decl.h): what every adapter knows of it.
#include "dcnkit/op_decl.h"
#include "dcnkit/roi_align_rotated.h"

namespace dcnkit {
namespace {

constexpr TensorDef kInputs[] = {
    TensorDef{"input", false, "(N, C, H, W)"}.with_grad(),
    TensorDef{"rois", false, "(K, 6) rows [batch_index, cx, cy, w, h, angle] (radians)"}.as_rois(),
};
constexpr TensorDef kOutputs[] = {TensorDef{"output", false, "(K, C, oh, ow)"}.with_grad()};
constexpr AttrDef kAttrs[] = {
    {"output_size", AttrKind::kInts, "[1, 1]", "(oh, ow)"},
    {"spatial_scale", AttrKind::kFloat, "1.0", "scale from image to feature coordinates"},
    {"sampling_ratio", AttrKind::kInt, "0", "samples per bin and axis; <= 0: adaptive"},
    {"aligned", AttrKind::kInt, "1", "1: shift the centre by half a pixel (pixel-center convention)"},
    {"clockwise", AttrKind::kInt, "0", "1: the angle turns clockwise in image space"},
};
constexpr int kSize = DCNKIT_INDEX(kAttrs, "output_size"), kScale = DCNKIT_INDEX(kAttrs, "spatial_scale"),
              kSampling = DCNKIT_INDEX(kAttrs, "sampling_ratio"), kAligned = DCNKIT_INDEX(kAttrs, "aligned"),
              kClockwise = DCNKIT_INDEX(kAttrs, "clockwise");
constexpr int kInput = DCNKIT_INDEX(kInputs, "input"), kRois = DCNKIT_INDEX(kInputs, "rois");

RoIAlignRotatedAttrs attrs_of(const AttrValue* v) {
  RoIAlignRotatedAttrs a;
  a.pooled_h = v[kSize].at(0);
  a.pooled_w = v[kSize].at(1);
  a.spatial_scale = v[kScale].f;
  a.sampling_ratio = v[kSampling].i();
  a.aligned = v[kAligned].i() != 0;
  a.clockwise = v[kClockwise].i() != 0;
  return a;
}

struct Op {
  using Params = RoIAlignRotatedParams;

  static Status check(const char* op, const AttrValue* v) {
    Params p;
    return make_roi_align_rotated_params(op, {1, 1, 16, 16}, {1, 6}, attrs_of(v), &p);
  }
  static Status params(const OpCall& c, Params* p) {
    return make_roi_align_rotated_params(c.op, *c.shapes.in[kInput], *c.shapes.in[kRois], attrs_of(c.attrs), p);
  }
  static void outputs(const OpCall&, const Params& p, Shape* out) { out[0] = p.output_shape(); }
  static Status output_dims(const OpCall& c, DimArith& a, OpDims* d) {
    return roi_pool_output_dims(c, kInput, kRois, c.attrs[kSize].at(0), c.attrs[kSize].at(1), a, d);
  }
  static size_t workspace_cuda(const Params& p, Pass pass, const OpTypes& t, const CudaContext& ctx) {
    return pass == Pass::kBackward ? roi_align_rotated_backward_workspace_cuda(p, t.dtype, ctx.deterministic) : 0;
  }
  // Under torch.use_deterministic_algorithms the CUDA backward takes the tile gather (roi_gather.h).
  static bool deterministic(const Params&, DType) { return true; }

  static Status forward_cpu(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    return dispatch_cpu(t.dtype, [&](auto z) {
      using T = decltype(z);
      return roi_align_rotated_forward_cpu<T>(p, in_ptr<T>(b, kInput), in_ptr<T>(b, kRois), out_ptr<T>(b, 0),
                                              *dev.cpu);
    });
  }
  static Status backward_cpu(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    return dispatch_cpu(t.dtype, [&](auto z) {
      using T = decltype(z);
      return roi_align_rotated_backward_cpu<T>(p, static_cast<const T*>(b.grad_out[0]), in_ptr<T>(b, kRois),
                                               grad_ptr<T>(b, kInput), *dev.cpu);
    });
  }
  static Status forward_cuda(const Params& params, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    Params p = params;
    p.assert_batch_index = dev.device_asserts;
    return roi_align_rotated_forward_cuda(p, t.dtype, t.rois, b.in[kInput], b.in[kRois], b.out[0], *dev.cuda);
  }
  static Status backward_cuda(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    return roi_align_rotated_backward_cuda(p, t.dtype, t.rois, b.grad_out[0], b.in[kRois], b.grad_in[kInput],
                                           b.workspace, *dev.cuda);
  }
};

// mmdeploy's and mmcv's exports: MMCVRoIAlignRotated(input, rois) with output_height, output_width, spatial_scale,
// sampling_ratio, aligned, clockwise.
void variants(const OpDecl* op, std::vector<OpVariant>* out) {
  const std::vector<AttrAlias> names = {
      {"output_height", kAttrs[kSize].name, 0},        {"output_width", kAttrs[kSize].name, 1},
      {"spatial_scale", kAttrs[kScale].name, -1},      {"sampling_ratio", kAttrs[kSampling].name, -1},
      {"aligned", kAttrs[kAligned].name, -1},          {"clockwise", kAttrs[kClockwise].name, -1}};
  for (const char* domain : {"mmdeploy", "mmcv"}) {
    out->push_back({domain, "MMCVRoIAlignRotated", op, canonical_inputs(op->def), names, true, true});
  }
}

}  // namespace

DCNKIT_OP(roi_align_rotated, 9, Op,
          DCNKIT_OP_DEF("roi_align_rotated", "RoIAlignRotated", kInputs, kOutputs, kAttrs, false)
              .with_openvino_type("DcnkitRoIAlignRotated"),  // OpenVINO's CPU plugin has a node named so (op_defs.h)
          "roi_align_rotated(Tensor input, Tensor rois, int pooled_h, int pooled_w, float spatial_scale, "
          "int sampling_ratio, bool aligned, bool clockwise) -> Tensor",
          "_roi_align_rotated_backward(Tensor grad_output, Tensor input, Tensor rois, int pooled_h, int pooled_w, "
          "float spatial_scale, int sampling_ratio, bool aligned, bool clockwise) -> Tensor",
          &variants)

}  // namespace dcnkit
