// MultiLevelRoIAlign: params, checks and CPU launchers. Per RoI the level and box come from
// multi_level_roi_align_kernels.h; everything per bin is RoIAlign's CPU driver and bin functions
// (roi_kernels.h) on the chosen level's map.
#include <algorithm>
#include <cmath>
#include <string>

#include "dcnkit/multi_level_roi_align.h"
#include "dcnkit/multi_level_roi_align_kernels.h"
#include "dcnkit/roi_cpu_drivers.h"
#include "dcnkit/roi_gather_ops.h"
#include "dcnkit/roi_plan_serial.h"

namespace dcnkit {

namespace {

std::string strides_str(const MultiLevelRoIAlignAttrs& a) {
  std::string s = "[";
  for (int64_t l = 0; l < a.num_levels && l < kMaxFeatureLevels; ++l) s += (l ? ", " : "") + to_str(a.featmap_strides[l]);
  return s + "]";
}

}  // namespace

Status make_multi_level_roi_align_params(const char* op, const std::vector<Shape>& features,
                                         const Shape& rois, const MultiLevelRoIAlignAttrs& attrs,
                                         MultiLevelRoIAlignParams* p) {
  const int64_t L = static_cast<int64_t>(features.size());
  if (L < 1 || L > kMaxFeatureLevels) {
    return arg_error(op, "features", "1 to " + std::to_string(kMaxFeatureLevels) + " feature maps",
                     std::to_string(L));
  }
  if (attrs.num_levels != L) {
    return arg_error(op, "featmap_strides",
                     "one stride per feature map (" + std::to_string(L) + " values)",
                     std::to_string(attrs.num_levels) + " values " + strides_str(attrs));
  }
  for (int64_t l = 0; l < L; ++l) {
    const double s = attrs.featmap_strides[l];
    if (!(std::isfinite(s) && s > 0)) {
      return arg_error(op, "featmap_strides[" + std::to_string(l) + "]", "a finite stride > 0",
                       to_str(s) + " (featmap_strides " + strides_str(attrs) + ")");
    }
  }
  for (int64_t l = 0; l < L; ++l) {
    const std::string arg = "features[" + std::to_string(l) + "]";
    DCNKIT_RETURN_IF_ERROR(check_rank(op, arg.c_str(), features[l], 4, "(N, C, H, W)"));
    if (l == 0) continue;
    if (features[l][0] != features[0][0]) {
      return arg_error(op, arg, "batch size " + std::to_string(features[0][0]) + " (that of features[0])",
                       std::to_string(features[l][0]) + " (shape " + shape_str(features[l]) + ")");
    }
    if (features[l][1] != features[0][1]) {
      return arg_error(op, arg, std::to_string(features[0][1]) + " channels (those of features[0])",
                       std::to_string(features[l][1]) + " (shape " + shape_str(features[l]) + ")");
    }
  }
  if (attrs.finest_scale < 1) {
    return arg_error(op, "finest_scale", "an int > 0", std::to_string(attrs.finest_scale));
  }
  if (!std::isfinite(attrs.roi_scale_factor)) {
    return arg_error(op, "roi_scale_factor", "a finite value (<= 0: no rescaling)", to_str(attrs.roi_scale_factor));
  }
  // Everything RoIAlign checks (rois (K, 5), output_size, pool_mode, sampling_ratio), per level.
  for (int64_t l = 0; l < L; ++l) {
    RoIAlignAttrs ra;
    ra.pooled_h = attrs.pooled_h;
    ra.pooled_w = attrs.pooled_w;
    ra.spatial_scale = 1.0 / attrs.featmap_strides[l];
    ra.sampling_ratio = attrs.sampling_ratio;
    ra.aligned = attrs.aligned;
    ra.mode = attrs.mode;
    RoIAlignParams rp;
    DCNKIT_RETURN_IF_ERROR(make_roi_align_params(op, features[l], rois, ra, &rp));
    p->heights[l] = features[l][2];
    p->widths[l] = features[l][3];
    p->spatial_scales[l] = ra.spatial_scale;
  }
  for (int64_t l = L; l < kMaxFeatureLevels; ++l) {
    p->heights[l] = p->widths[l] = 0;
    p->spatial_scales[l] = 0;
  }
  p->attrs = attrs;
  p->batch = features[0][0];
  p->channels = features[0][1];
  p->num_rois = rois[0];
  return Status::Ok();
}

int64_t multi_level_roi_align_level(const MultiLevelRoIAlignParams& p, const double* roi) {
  double box[5];
  return multi_level_roi_box<double>(p.attrs, roi, box);
}

namespace {

// DCNKIT_ROI_CPU_PATH=cuda-schedule (roi_cuda_schedule_path): the CUDA launchers' block schedule run serially.

template <typename T, typename Block>
Status multi_level_cuda_schedule(const MultiLevelRoIAlignParams& p, const T* rois, const Block& block) {
  return roi_block_schedule_serial<T>(p, multi_level_max_pixels(p),
                                      [&](int64_t k) { return multi_level_plan_head<T>(p, rois, k); },
                                      kCudaScheduleThreads, block);
}

template <typename T>
Status multi_level_forward_cuda_schedule(const MultiLevelRoIAlignParams& p, const T* const* features, const T* rois,
                                         T* output) {
  const bool max_mode = p.attrs.mode == PoolMode::kMax;
  return multi_level_cuda_schedule<T>(p, rois, [&](const RoIPlanHead<T>& h, int64_t k, int64_t c0, int64_t nc,
                                                   const RoIPlanEntry<T>* plan, int tid) {
    const T* input = features[h.level];
    if (plan != nullptr) {
      roi_plan_forward_items<T, T>(p, h, plan, input, k, c0, nc, tid, kCudaScheduleThreads, output, max_mode);
    } else {
      RoIVisitFrame<T> frame;
      roi_visit_forward_items<T, T>(p, h, h.H, h.W, input, k, c0, nc, tid, kCudaScheduleThreads, output, &frame,
                                    roi_pool_max_mode(p));
    }
  });
}

template <typename T>
Status multi_level_backward_cuda_schedule(const MultiLevelRoIAlignParams& p, const T* grad_output,
                                          const T* const* features, const T* rois, T* const* grad_features) {
  const bool max_mode = p.attrs.mode == PoolMode::kMax;
  for (int64_t l = 0; l < p.attrs.num_levels; ++l) {
    std::fill(grad_features[l], grad_features[l] + p.batch * p.channels * p.heights[l] * p.widths[l], T(0));
  }
  return multi_level_cuda_schedule<T>(p, rois, [&](const RoIPlanHead<T>& h, int64_t k, int64_t c0, int64_t nc,
                                                   const RoIPlanEntry<T>* plan, int tid) {
    T* grad = grad_features[h.level];
    const auto add_at = [grad](int64_t offset) { return CpuAddTo<T>{grad + offset}; };
    const T* input = features != nullptr ? features[h.level] : nullptr;
    if (plan != nullptr) {
      roi_plan_backward_items<T, T>(p, h, plan, grad_output, input, k, c0, nc, tid, kCudaScheduleThreads, add_at,
                                    max_mode);
    } else {
      RoIVisitFrame<T> frame;
      roi_visit_backward_items<T, T>(p, h, h.H, h.W, grad_output, input, k, c0, nc, tid, kCudaScheduleThreads, add_at,
                                     &frame, roi_pool_max_mode(p));
    }
  });
}

// DCNKIT_ROI_CPU_PATH=cuda-schedule-deterministic: the deterministic mode's grids (roi_gather.h) run serially: max
// mode's arg-max on each RoI's level, then per level the footprints and the tile gather.
template <typename T>
Status multi_level_backward_gather(const MultiLevelRoIAlignParams& p, const T* grad_output, const T* const* features,
                                   const T* rois, T* const* grad_features) {
  const int64_t n = p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w;
  const MultiLevelHeadOf<T, T> head_of{p, rois};
  std::vector<T> argmax;
  if (p.attrs.mode == PoolMode::kMax) {
    DCNKIT_RETURN_IF_ERROR(check_launch(element_launch("roi_gather_argmax_kernel", n)));
    LevelMapOf<T> f{{}, p.channels};
    for (int64_t l = 0; l < p.attrs.num_levels; ++l) f.levels.ptr[l] = features[l];
    argmax.resize(static_cast<size_t>(2 * n));
    RoIVisitFrame<T> frame;
    for (int64_t i = 0; i < n; ++i) {
      roi_gather_argmax_at<T>(head_of, f, p.channels, p.attrs.pooled_w, p.attrs.pooled_h * p.attrs.pooled_w, i,
                              argmax.data(), &frame);
    }
  }
  for (int64_t l = 0; l < p.attrs.num_levels; ++l) {
    auto gather = [&](auto max_mode) {
      const RoIAlignGather<T, T, MultiLevelHeadOf<T, T>, decltype(max_mode)::value> g{
          head_of, p.channels, p.attrs.pooled_h, p.attrs.pooled_w, static_cast<int32_t>(l), p.heights[l],
          p.widths[l], grad_output, argmax.data(), 0, nullptr};
      return roi_gather_serial(g, p.num_rois, roi_gather_grid<T>(p.batch, p.channels, p.heights[l], p.widths[l]),
                               grad_features[l]);
    };
    DCNKIT_RETURN_IF_ERROR(argmax.empty() ? gather(std::false_type{}) : gather(std::true_type{}));
  }
  return Status::Ok();
}

}  // namespace

template <typename T>
Status multi_level_roi_align_forward_cpu(const MultiLevelRoIAlignParams& p, const T* const* features,
                                         const T* rois, T* output, const CpuContext& ctx) {
  const char* op = "multi_level_roi_align";
  DCNKIT_RETURN_IF_ERROR(check_roi_batch_indices(op, rois, p.num_rois, p.batch));
  if (roi_cuda_schedule_path() || roi_cuda_schedule_deterministic_path()) {
    return multi_level_forward_cuda_schedule(p, features, rois, output);
  }
  const MultiLevelRoIAlignAttrs& a = p.attrs;
  const int64_t C = p.channels, oh = a.pooled_h, ow = a.pooled_w;
  const bool max_mode = a.mode == PoolMode::kMax;
  const CpuContext serial;  // one RoI per call of RoIAlign's driver, the RoIs in parallel here
  parallel_for(ctx, p.num_rois, [&](int64_t kb, int64_t ke) {
    for (int64_t k = kb; k < ke; ++k) {
      T box[5];
      const int64_t l = multi_level_roi_box<T>(a, rois + k * 5, box);
      const auto box_of = [&](const T* roi) { return multi_level_roi_align_box<T>(p, roi, l); };
      const auto origin_of = [](int64_t, const RoIAlignBox<T>& b, int64_t ph, int64_t pw, T* y0, T* x0) {
        roi_bin_origin<T, T>(b, ph, pw, nullptr, nullptr, T(0), y0, x0);
      };
      roi_pool_forward_cpu(serial, 1, p.batch, C, p.heights[l], p.widths[l], oh, ow, max_mode, features[l], box,
                           output + k * C * oh * ow, box_of, origin_of);
    }
  });
  return Status::Ok();
}

template <typename T>
Status multi_level_roi_align_backward_cpu(const MultiLevelRoIAlignParams& p, const T* grad_output,
                                          const T* const* features, const T* rois, T* const* grad_features,
                                          const CpuContext& ctx) {
  const char* op = "_multi_level_roi_align_backward";
  DCNKIT_RETURN_IF_ERROR(check_roi_batch_indices(op, rois, p.num_rois, p.batch));
  if (roi_cuda_schedule_deterministic_path()) {
    return multi_level_backward_gather(p, grad_output, features, rois, grad_features);
  }
  if (roi_cuda_schedule_path()) return multi_level_backward_cuda_schedule(p, grad_output, features, rois, grad_features);
  const MultiLevelRoIAlignAttrs& a = p.attrs;
  const bool max_mode = a.mode == PoolMode::kMax;
  const auto origin_of = [](int64_t, const RoIAlignBox<T>& b, int64_t ph, int64_t pw, T* y0, T* x0) {
    roi_bin_origin<T, T>(b, ph, pw, nullptr, nullptr, T(0), y0, x0);
  };
  // RoIAlign's backward driver once per level (it writes the whole level gradient): a RoI of another level
  // has an empty grid there, so each RoI scatters into its own level only, in RoI order.
  for (int64_t l = 0; l < a.num_levels; ++l) {
    const auto box_of = [&](const T* roi) {
      T box[5];
      if (multi_level_roi_box<T>(a, roi, box) != l) return RoIAlignBox<T>{};  // gh = gw = 0
      return multi_level_roi_align_box<T>(p, box, l);
    };
    roi_pool_backward_cpu(ctx, p.num_rois, p.batch, p.channels, p.heights[l], p.widths[l], a.pooled_h, a.pooled_w,
                          max_mode, grad_output, features[l], rois, grad_features[l], box_of, origin_of);
  }
  return Status::Ok();
}

template Status multi_level_roi_align_forward_cpu<float>(const MultiLevelRoIAlignParams&, const float* const*,
                                                         const float*, float*, const CpuContext&);
template Status multi_level_roi_align_forward_cpu<double>(const MultiLevelRoIAlignParams&, const double* const*,
                                                          const double*, double*, const CpuContext&);
template Status multi_level_roi_align_backward_cpu<float>(const MultiLevelRoIAlignParams&, const float*,
                                                          const float* const*, const float*, float* const*,
                                                          const CpuContext&);
template Status multi_level_roi_align_backward_cpu<double>(const MultiLevelRoIAlignParams&, const double*,
                                                           const double* const*, const double*, double* const*,
                                                           const CpuContext&);

}  // namespace dcnkit
