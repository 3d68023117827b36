// RoIAlignRotated: params, checks and CPU launchers. The CPU runs the CUDA kernels' bodies
// (roi_align_rotated.h): the forward over the same work items, the backward over the deterministic kernel's owners
// (one task per image and channel slice), so the CPU tests check the GPU's math and indexing.
#include "dcnkit/roi_align_rotated.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace dcnkit {

Status make_roi_align_rotated_params(const char* op, const Shape& input, const Shape& rois,
                                     const RoIAlignRotatedAttrs& a, RoIAlignRotatedParams* p) {
  DCNKIT_RETURN_IF_ERROR(check_rank(op, "input", input, 4, "(N, C, H, W)"));
  DCNKIT_RETURN_IF_ERROR(check_rank(op, "rois", rois, 2, "(K, 6)"));
  DCNKIT_RETURN_IF_ERROR(check_dim(op, "rois", rois, 1, 6, "[batch_index, cx, cy, w, h, angle]"));
  if (a.pooled_h < 1 || a.pooled_w < 1 || a.pooled_h > (int64_t(1) << 20) || a.pooled_w > (int64_t(1) << 20)) {
    return arg_error(op, "output_size", "(oh, ow) in [1, 2^20]",
                     "(" + std::to_string(a.pooled_h) + ", " + std::to_string(a.pooled_w) + ")");
  }
  if (!(std::isfinite(a.spatial_scale) && a.spatial_scale > 0)) {
    return arg_error(op, "spatial_scale", "a finite value > 0", to_str(a.spatial_scale));
  }
  DCNKIT_RETURN_IF_ERROR(check_sampling_ratio(op, "sampling_ratio", a.sampling_ratio, INT64_MIN));
  for (size_t d = 0; d < 4; ++d) {
    if (input[d] < 0) return arg_error(op, "input", "non-negative sizes", shape_str(input));
  }
  if (rois[0] < 0) return arg_error(op, "rois", "non-negative sizes", shape_str(rois));
  p->attrs = a;
  p->batch = input[0];
  p->channels = input[1];
  p->height = input[2];
  p->width = input[3];
  p->num_rois = rois[0];
  return Status::Ok();
}

namespace {

template <typename T>
Status check_batch_indices(const T* rois, int64_t num_rois, int64_t batch) {
  for (int64_t k = 0; k < num_rois; ++k) {
    int64_t b = 0;
    if (!roi_batch_index<double>(rois + k * 6, batch, &b)) {
      return arg_error("roi_align_rotated", "rois[" + std::to_string(k) + ", 0] (batch index)",
                       "a value in [0, " + std::to_string(batch) + ") (the batch size of input)",
                       to_str(static_cast<double>(rois[k * 6])));
    }
  }
  return Status::Ok();
}

// DCNKIT_ROI_CPU_PATH=cuda-schedule: the backward runs the CUDA atomic kernel's items serially (plain adds).
bool atomic_schedule_on_cpu() {
  static const bool on = [] {
    const char* e = std::getenv("DCNKIT_ROI_CPU_PATH");
    return e != nullptr && std::strcmp(e, "cuda-schedule") == 0;
  }();
  return on;
}

template <typename T>
struct PlainAddAt {
  T* base;
  void operator()(int64_t i, T v) const { base[i] += v; }
};

}  // namespace

template <typename T>
Status roi_align_rotated_forward_cpu(const RoIAlignRotatedParams& p, const T* input, const T* rois, T* output,
                                     const CpuContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(check_batch_indices(rois, p.num_rois, p.batch));
  const int64_t items =
      p.num_rois * roi_align_rotated_slices(p.channels) * p.attrs.pooled_h * p.attrs.pooled_w;
  if (p.channels == 0) return Status::Ok();
  parallel_for(ctx, items, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) roi_align_rotated_forward_item<T>(p, input, rois, i, output);
  });
  return Status::Ok();
}

template <typename T>
Status roi_align_rotated_backward_cpu(const RoIAlignRotatedParams& p, const T* grad_output, const T* rois,
                                      T* grad_input, const CpuContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(check_batch_indices(rois, p.num_rois, p.batch));
  const int64_t slices = roi_align_rotated_slices(p.channels), HW = p.height * p.width;
  std::fill(grad_input, grad_input + p.batch * p.channels * HW, T(0));
  if (p.channels == 0 || HW == 0) return Status::Ok();
  if (atomic_schedule_on_cpu()) {
    const int64_t items = p.num_rois * slices * p.attrs.pooled_h * p.attrs.pooled_w;
    for (int64_t i = 0; i < items; ++i) {
      roi_align_rotated_backward_item<T>(p, grad_output, rois, i, PlainAddAt<T>{grad_input});
    }
    return Status::Ok();
  }
  parallel_for(ctx, p.batch * slices, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) roi_align_rotated_backward_owner<T>(p, grad_output, rois, o, grad_input);
  });
  return Status::Ok();
}

template Status roi_align_rotated_forward_cpu<float>(const RoIAlignRotatedParams&, const float*, const float*, float*,
                                                     const CpuContext&);
template Status roi_align_rotated_forward_cpu<double>(const RoIAlignRotatedParams&, const double*, const double*,
                                                      double*, const CpuContext&);
template Status roi_align_rotated_backward_cpu<float>(const RoIAlignRotatedParams&, const float*, const float*,
                                                      float*, const CpuContext&);
template Status roi_align_rotated_backward_cpu<double>(const RoIAlignRotatedParams&, const double*, const double*,
                                                       double*, const CpuContext&);

}  // namespace dcnkit
