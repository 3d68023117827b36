// RoIAlign: params, checks and CPU launchers. The math is in roi_kernels.h.
#include <cmath>

#include "dcnkit/roi_align.h"
#include "dcnkit/roi_cpu_drivers.h"

namespace dcnkit {

Status parse_pool_mode(const char* op, const std::string& s, PoolMode* mode) {
  if (s == "avg") {
    *mode = PoolMode::kAvg;
  } else if (s == "max") {
    *mode = PoolMode::kMax;
  } else {
    return arg_error(op, "pool_mode", "'avg' or 'max'", "'" + s + "'");
  }
  return Status::Ok();
}

Status make_roi_align_params(const char* op, const Shape& input, const Shape& rois,
                             const RoIAlignAttrs& attrs, RoIAlignParams* p) {
  DCNKIT_RETURN_IF_ERROR(
      check_roi_pool_args(op, input, rois, attrs.pooled_h, attrs.pooled_w, attrs.spatial_scale));
  DCNKIT_RETURN_IF_ERROR(check_sampling_ratio(op, "sampling_ratio", attrs.sampling_ratio, INT64_MIN));
  if (attrs.mode != PoolMode::kAvg && attrs.mode != PoolMode::kMax) {
    return arg_error(op, "pool_mode", "'avg' or 'max'", std::to_string(static_cast<int>(attrs.mode)));
  }
  p->attrs = attrs;
  p->batch = input[0];
  p->channels = input[1];
  p->height = input[2];
  p->width = input[3];
  p->num_rois = rois[0];
  return Status::Ok();
}

namespace {

// RoI row -> box of RoIAlign, and a bin's origin (no offsets): the geometry both CPU passes use.
template <typename T>
auto roi_align_box_of(const RoIAlignAttrs& a) {
  const T scale = static_cast<T>(a.spatial_scale);
  return [scale, a](const T* roi) {
    return roi_align_box<T>(roi, scale, a.aligned, a.pooled_h, a.pooled_w, a.sampling_ratio);
  };
}

template <typename T>
auto roi_align_origin_of() {
  return [](int64_t, const RoIAlignBox<T>& box, int64_t ph, int64_t pw, T* y0, T* x0) {
    roi_bin_origin<T, T>(box, ph, pw, nullptr, nullptr, T(0), y0, x0);
  };
}

}  // namespace

template <typename T>
Status roi_align_forward_cpu(const RoIAlignParams& p, const T* input, const T* rois, T* output,
                             const CpuContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(check_roi_batch_indices("roi_align", rois, p.num_rois, p.batch));
  const RoIAlignAttrs& a = p.attrs;
  const auto box_of = roi_align_box_of<T>(a);
  const auto origin_of = roi_align_origin_of<T>();
  roi_pool_forward_cpu(ctx, p.num_rois, p.batch, p.channels, p.height, p.width, a.pooled_h,
                       a.pooled_w, a.mode == PoolMode::kMax, input, rois, output, box_of, origin_of);
  return Status::Ok();
}

template <typename T>
Status roi_align_backward_cpu(const RoIAlignParams& p, const T* grad_output, const T* input,
                              const T* rois, T* grad_input, const CpuContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(check_roi_batch_indices("roi_align", rois, p.num_rois, p.batch));
  const RoIAlignAttrs& a = p.attrs;
  const auto box_of = roi_align_box_of<T>(a);
  const auto origin_of = roi_align_origin_of<T>();
  roi_pool_backward_cpu(ctx, p.num_rois, p.batch, p.channels, p.height, p.width, a.pooled_h,
                        a.pooled_w, a.mode == PoolMode::kMax, grad_output, input, rois, grad_input,
                        box_of, origin_of);
  return Status::Ok();
}

template Status roi_align_forward_cpu<float>(const RoIAlignParams&, const float*, const float*, float*,
                                             const CpuContext&);
template Status roi_align_forward_cpu<double>(const RoIAlignParams&, const double*, const double*,
                                              double*, const CpuContext&);
template Status roi_align_backward_cpu<float>(const RoIAlignParams&, const float*, const float*,
                                              const float*, float*, const CpuContext&);
template Status roi_align_backward_cpu<double>(const RoIAlignParams&, const double*, const double*,
                                               const double*, double*, const CpuContext&);

}  // namespace dcnkit
