// RoIAlign: params, checks and CPU launchers. The math is in roi_kernels.h.
#include <algorithm>
#include <cmath>
#include <vector>

#include "dcnkit/roi_align.h"
#include "dcnkit/roi_cpu_drivers.h"
#include "dcnkit/roi_gather_ops.h"
#include "dcnkit/roi_plan_serial.h"

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

// DCNKIT_ROI_CPU_PATH=cuda-schedule (roi_cuda_schedule_path): the CUDA launchers' block schedule of roi_plan.h
// run serially on the CPU, block by block and thread by thread, with the kernels' choice of plan or bounded
// visit per RoI, so that CPU tests check the GPU code's decomposition.

template <typename T, typename Block>
Status roi_cuda_schedule(const RoIAlignParams& p, const T* rois, const Block& block) {
  return roi_block_schedule_serial<T>(p, p.height * p.width, [&](int64_t k) { return roi_plan_head<T>(p, rois, k); },
                                      kCudaScheduleThreads, block);
}

template <typename T>
Status roi_align_forward_cuda_schedule(const RoIAlignParams& p, const T* input, const T* rois, T* output) {
  const bool max_mode = p.attrs.mode == PoolMode::kMax;
  return roi_cuda_schedule<T>(p, rois, [&](const RoIPlanHead<T>& h, int64_t k, int64_t c0, int64_t nc,
                                           const RoIPlanEntry<T>* plan, int tid) {
    if (plan != nullptr) {
      roi_plan_forward_items<T, T>(p, h, plan, input, k, c0, nc, tid, kCudaScheduleThreads, output, max_mode);
    } else {
      RoIVisitFrame<T> frame;
      roi_visit_forward_items<T, T>(p, h, p.height, p.width, input, k, c0, nc, tid, kCudaScheduleThreads, output,
                                    &frame, roi_pool_max_mode(p));
    }
  });
}

template <typename T>
Status roi_align_backward_cuda_schedule(const RoIAlignParams& p, const T* grad_output, const T* input, const T* rois,
                                        T* grad_input) {
  const bool max_mode = p.attrs.mode == PoolMode::kMax;
  std::fill(grad_input, grad_input + p.batch * p.channels * p.height * p.width, T(0));
  const auto add_at = [grad_input](int64_t offset) { return CpuAddTo<T>{grad_input + offset}; };
  return roi_cuda_schedule<T>(p, rois, [&](const RoIPlanHead<T>& h, int64_t k, int64_t c0, int64_t nc,
                                           const RoIPlanEntry<T>* plan, int tid) {
    if (plan != nullptr) {
      roi_plan_backward_items<T, T>(p, h, plan, grad_output, input, k, c0, nc, tid, kCudaScheduleThreads, add_at,
                                    max_mode);
    } else {
      RoIVisitFrame<T> frame;
      roi_visit_backward_items<T, T>(p, h, p.height, p.width, grad_output, input, k, c0, nc, tid, kCudaScheduleThreads,
                                     add_at, &frame, roi_pool_max_mode(p));
    }
  });
}

// DCNKIT_ROI_CPU_PATH=cuda-schedule-deterministic: the deterministic mode's grids (roi_gather.h) run serially in grid
// order: max mode's arg-max (every output's winning sample), the footprints and the tile gather.
template <typename T>
Status roi_align_backward_gather(const RoIAlignParams& p, const T* grad_output, const T* input, const T* rois,
                                 T* grad_input) {
  const int64_t n = p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w;
  const RoIAlignHeadOf<T, T> head_of{p, rois};
  std::vector<T> argmax;
  if (p.attrs.mode == PoolMode::kMax) {
    DCNKIT_RETURN_IF_ERROR(check_launch(element_launch("roi_gather_argmax_kernel", n)));
    argmax.resize(static_cast<size_t>(2 * n));
    RoIVisitFrame<T> frame;
    for (int64_t i = 0; i < n; ++i) {
      roi_gather_argmax_at<T>(head_of, RoIImageMap<T>{input, p.channels}, p.channels, p.attrs.pooled_w,
                              p.attrs.pooled_h * p.attrs.pooled_w, i, argmax.data(), &frame);
    }
  }
  auto gather = [&](auto max_mode) {
    const RoIAlignGather<T, T, RoIAlignHeadOf<T, T>, decltype(max_mode)::value> g{
        head_of, p.channels, p.attrs.pooled_h, p.attrs.pooled_w, 0, p.height, p.width, grad_output, argmax.data(), 0,
        nullptr};
    return roi_gather_serial(g, p.num_rois, roi_gather_grid<T>(p.batch, p.channels, p.height, p.width), grad_input);
  };
  return argmax.empty() ? gather(std::false_type{}) : gather(std::true_type{});
}

}  // namespace

template <typename T>
Status roi_align_forward_cpu(const RoIAlignParams& p, const T* input, const T* rois, T* output,
                             const CpuContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(check_roi_batch_indices("roi_align", rois, p.num_rois, p.batch));
  if (roi_cuda_schedule_path() || roi_cuda_schedule_deterministic_path()) {
    return roi_align_forward_cuda_schedule(p, input, rois, output);
  }
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
  if (roi_cuda_schedule_deterministic_path()) return roi_align_backward_gather(p, grad_output, input, rois, grad_input);
  if (roi_cuda_schedule_path()) return roi_align_backward_cuda_schedule(p, grad_output, input, rois, grad_input);
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
