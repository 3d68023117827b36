// DeformRoIPool: params, checks and CPU launchers. The math is in roi_kernels.h.
#include <algorithm>
#include <cmath>

#include "dcnkit/deform_roi_pool.h"
#include "dcnkit/roi_cpu_drivers.h"
#include "dcnkit/roi_gather_ops.h"
#include "dcnkit/roi_plan_serial.h"

namespace dcnkit {

Status make_deform_roi_pool_params(const char* op, const Shape& input, const Shape& rois,
                                   const Shape* offset, const DeformRoIPoolAttrs& attrs,
                                   DeformRoIPoolParams* p) {
  DCNKIT_RETURN_IF_ERROR(
      check_roi_pool_args(op, input, rois, attrs.pooled_h, attrs.pooled_w, attrs.spatial_scale));
  DCNKIT_RETURN_IF_ERROR(check_sampling_ratio(op, "sampling_ratio", attrs.sampling_ratio, INT64_MIN));
  if (!std::isfinite(attrs.gamma)) {
    return arg_error(op, "gamma", "a finite value", to_str(attrs.gamma));
  }
  if (offset != nullptr) {
    DCNKIT_RETURN_IF_ERROR(check_rank(op, "offset", *offset, 4, "(K, 2, oh, ow)"));
    DCNKIT_RETURN_IF_ERROR(check_dim(op, "offset", *offset, 0, rois[0], "K, the number of rois"));
    DCNKIT_RETURN_IF_ERROR(check_dim(op, "offset", *offset, 1, 2, "(dx, dy)"));
    DCNKIT_RETURN_IF_ERROR(check_dim(op, "offset", *offset, 2, attrs.pooled_h, "oh"));
    DCNKIT_RETURN_IF_ERROR(check_dim(op, "offset", *offset, 3, attrs.pooled_w, "ow"));
  }
  p->attrs = attrs;
  p->batch = input[0];
  p->channels = input[1];
  p->height = input[2];
  p->width = input[3];
  p->num_rois = rois[0];
  p->has_offset = offset != nullptr;
  return Status::Ok();
}

namespace {

// DCNKIT_ROI_CPU_PATH=cuda-schedule (roi_cuda_schedule_path): the CUDA launchers' block schedule of the output and
// grad_input (roi_plan.h: the plan with each bin's offsets applied, or the bounded visit) run serially;
// cuda-schedule-deterministic: grad_input by the deterministic mode's tile gather.

template <typename T, typename Block>
Status deform_roi_cuda_schedule(const DeformRoIPoolParams& p, const T* rois, const T* offset, const Block& block) {
  return roi_block_schedule_serial<T>(
      p, p.height * p.width, [&](int64_t k) { return deform_roi_plan_head<T>(p, rois, k); }, kCudaScheduleThreads,
      [&](const RoIPlanHead<T>& h, int64_t k, int64_t c0, int64_t nc, const RoIPlanEntry<T>* plan, int tid) {
        block(h, k, c0, nc, plan, tid, DeformRoIOrigin<T>{p, offset, k});
      },
      [&](int64_t k) { return DeformRoIOrigin<T>{p, offset, k}; });
}

template <typename T>
Status deform_roi_forward_cuda_schedule(const DeformRoIPoolParams& p, const T* input, const T* rois, const T* offset,
                                        T* output) {
  return deform_roi_cuda_schedule<T>(p, rois, offset, [&](const RoIPlanHead<T>& h, int64_t k, int64_t c0, int64_t nc,
                                                          const RoIPlanEntry<T>* plan, int tid, const auto& origin) {
    if (plan != nullptr) {
      roi_plan_forward_items<T, T>(p, h, plan, input, k, c0, nc, tid, kCudaScheduleThreads, output, false);
    } else {
      RoIVisitFrame<T> frame;
      roi_visit_forward_items<T, T>(p, h, p.height, p.width, input, k, c0, nc, tid, kCudaScheduleThreads, output,
                                    &frame, false, origin);
    }
  });
}

template <typename T>
Status deform_roi_grad_input_cuda_schedule(const DeformRoIPoolParams& p, const T* grad_output, const T* rois,
                                           const T* offset, T* grad_input) {
  if (roi_cuda_schedule_deterministic_path()) {  // the deterministic mode's footprints and tile gather (roi_gather.h)
    const DeformRoIGather<T, T> g{p, rois, offset, grad_output, 0, nullptr};
    return roi_gather_serial(g, p.num_rois, roi_gather_grid<T>(p.batch, p.channels, p.height, p.width), grad_input);
  }
  std::fill(grad_input, grad_input + p.batch * p.channels * p.height * p.width, T(0));
  const auto add_at = [grad_input](int64_t at) { return CpuAddTo<T>{grad_input + at}; };
  const T* none = nullptr;
  return deform_roi_cuda_schedule<T>(p, rois, offset, [&](const RoIPlanHead<T>& h, int64_t k, int64_t c0, int64_t nc,
                                                          const RoIPlanEntry<T>* plan, int tid, const auto& origin) {
    if (plan != nullptr) {
      roi_plan_backward_items<T, T>(p, h, plan, grad_output, none, k, c0, nc, tid, kCudaScheduleThreads, add_at,
                                    false);
    } else {
      RoIVisitFrame<T> frame;
      roi_visit_backward_items<T, T>(p, h, p.height, p.width, grad_output, none, k, c0, nc, tid,
                                     kCudaScheduleThreads, add_at, &frame, false, origin);
    }
  });
}

}  // namespace

template <typename T>
Status deform_roi_pool_forward_cpu(const DeformRoIPoolParams& p, const T* input, const T* rois,
                                   const T* offset, T* output, const CpuContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(check_roi_batch_indices("deform_roi_pool", rois, p.num_rois, p.batch));
  if (!p.has_offset) offset = nullptr;
  if (roi_cuda_schedule_path() || roi_cuda_schedule_deterministic_path()) {
    return deform_roi_forward_cuda_schedule(p, input, rois, offset, output);
  }
  auto box_of = [&](const T* roi) { return deform_roi_pool_box<T>(p, roi); };
  auto origin_of = [&](int64_t k, const RoIAlignBox<T>& box, int64_t ph, int64_t pw, T* y0, T* x0) {
    deform_roi_pool_origin<T, T>(p, box, offset, k, ph, pw, y0, x0);
  };
  roi_pool_forward_cpu(ctx, p.num_rois, p.batch, p.channels, p.height, p.width, p.attrs.pooled_h,
                       p.attrs.pooled_w, false, input, rois, output, box_of, origin_of);
  return Status::Ok();
}

template <typename T>
Status deform_roi_pool_backward_cpu(const DeformRoIPoolParams& p, const T* grad_output,
                                    const T* input, const T* rois, const T* offset, T* grad_input,
                                    T* grad_offset, const CpuContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(check_roi_batch_indices("deform_roi_pool", rois, p.num_rois, p.batch));
  const int64_t N = p.batch, C = p.channels, H = p.height, W = p.width;
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w, bins = oh * ow;
  if (!p.has_offset) offset = nullptr;
  auto box_of = [&](const T* roi) { return deform_roi_pool_box<T>(p, roi); };
  auto origin_of = [&](int64_t k, const RoIAlignBox<T>& box, int64_t ph, int64_t pw, T* y0, T* x0) {
    deform_roi_pool_origin<T, T>(p, box, offset, k, ph, pw, y0, x0);
  };
  if (grad_input != nullptr && (roi_cuda_schedule_path() || roi_cuda_schedule_deterministic_path())) {
    DCNKIT_RETURN_IF_ERROR(deform_roi_grad_input_cuda_schedule(p, grad_output, rois, offset, grad_input));
  } else if (grad_input != nullptr) {
    roi_pool_backward_cpu(ctx, p.num_rois, N, C, H, W, oh, ow, false, grad_output, input, rois,
                          grad_input, box_of, origin_of);
  }
  if (grad_offset == nullptr) return Status::Ok();
  if (offset == nullptr) {
    for (int64_t i = 0; i < p.num_rois * 2 * bins; ++i) grad_offset[i] = T(0);
    return Status::Ok();
  }
  // grad_offset: one task per RoI; per bin, the sum over channels of g * d(bin value)/d(corner).
  const T gamma = static_cast<T>(p.attrs.gamma);
  parallel_for(ctx, p.num_rois, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const T* roi = rois + k * 5;
      int64_t b = 0;
      roi_batch_index<T>(roi, N, &b);
      const RoIAlignBox<T> box = box_of(roi);
      const T n = roi_bin_count(box);
      T* gox = grad_offset + k * 2 * bins;
      T* goy = gox + bins;
      for (int64_t bin = 0; bin < bins; ++bin) {
        T y0, x0;
        origin_of(k, box, bin / ow, bin % ow, &y0, &x0);
        RoISample<T> buf[kRoITapsBuffer];
        int64_t start[2] = {0, 0};
        const bool fits = roi_collect_bins(box, k, bin, bin + 1, ow, H, W, origin_of, buf, start) == 1;
        T sx = T(0), sy = T(0);
        for (int64_t c = 0; c < C; ++c) {
          const T g = grad_output[(k * C + c) * bins + bin];
          if (g == T(0)) continue;
          const T* img = input + (b * C + c) * H * W;
          T gy, gx;
          if (fits) {
            roi_bin_coord_grad<T>(img, n, TapsArray<T>{buf, start[1]}, &gy, &gx);
          } else {
            roi_align_bin_coord_grad(img, H, W, box, y0, x0, &gy, &gx);
          }
          sx += g * gx;
          sy += g * gy;
        }
        gox[bin] = gamma * box.roi_w * sx;
        goy[bin] = gamma * box.roi_h * sy;
      }
    }
  });
  return Status::Ok();
}

template Status deform_roi_pool_forward_cpu<float>(const DeformRoIPoolParams&, const float*,
                                                   const float*, const float*, float*,
                                                   const CpuContext&);
template Status deform_roi_pool_forward_cpu<double>(const DeformRoIPoolParams&, const double*,
                                                    const double*, const double*, double*,
                                                    const CpuContext&);
template Status deform_roi_pool_backward_cpu<float>(const DeformRoIPoolParams&, const float*,
                                                    const float*, const float*, const float*,
                                                    float*, float*, const CpuContext&);
template Status deform_roi_pool_backward_cpu<double>(const DeformRoIPoolParams&, const double*,
                                                     const double*, const double*, const double*,
                                                     double*, double*, const CpuContext&);

}  // namespace dcnkit
