// Per-RoI math of MultiLevelRoIAlign, written once (DCNKIT_HD) for the CPU and CUDA launchers: the level of
// a RoI and its rescaled box. Everything per bin is RoIAlign's (roi_kernels.h: roi_align_box,
// roi_bin_origin, roi_align_bin_forward / backward), called on the chosen level's map.
#pragma once

#include <cmath>

#include "dcnkit/multi_level_roi_align.h"
#include "dcnkit/roi_plan.h"

namespace dcnkit {

// a[l] for a level l known at run time, by a loop of constant length: on CUDA an array in the kernel's parameters
// then stays there (indexing it at run time would copy it to local memory, a stack frame).
template <typename V, int N>
DCNKIT_HD V level_pick(const V (&a)[N], int64_t l) {
  V v = a[0];
  for (int i = 1; i < N; ++i) {
    if (i == l) v = a[i];
  }
  return v;
}

// clamp(floor(log2(sqrt((x2 - x1) * (y2 - y1)) / finest_scale + 1e-6)), 0, L - 1); a NaN value (a box of
// negative area, non-finite coordinates) gives level 0, +infinity level L - 1.
template <typename Acc>
DCNKIT_HD int64_t multi_level_roi_level(Acc x1, Acc y1, Acc x2, Acc y2, int64_t finest_scale,
                                        int64_t num_levels) {
  const Acc scale = std::sqrt((x2 - x1) * (y2 - y1));
  const Acc v = std::floor(std::log2(scale / static_cast<Acc>(finest_scale) + Acc(1e-6)));
  if (!(v > Acc(0))) return 0;
  if (v >= static_cast<Acc>(num_levels - 1)) return num_levels - 1;
  return static_cast<int64_t>(v);
}

// The level of RoI row `roi` and, in `box` ([batch_index, x1, y1, x2, y2] in Acc), the box RoIAlign pools
// on that level: rescaled about its centre to half sizes (w + 1) * f / 2 - 0.5 when f = roi_scale_factor
// is > 0 and != 1 (f = 1 is the identity, and is skipped so that the box stays bit-exact).
template <typename Acc, typename T>
DCNKIT_HD int64_t multi_level_roi_box(const MultiLevelRoIAlignAttrs& a, const T* roi, Acc box[5]) {
  for (int i = 0; i < 5; ++i) box[i] = to_acc<Acc>(roi[i]);
  const int64_t level = multi_level_roi_level<Acc>(box[1], box[2], box[3], box[4], a.finest_scale, a.num_levels);
  const Acc f = static_cast<Acc>(a.roi_scale_factor);
  if (f > Acc(0) && f != Acc(1)) {
    const Acc cx = (box[1] + box[3]) * Acc(0.5), cy = (box[2] + box[4]) * Acc(0.5);
    const Acc hw = (box[3] - box[1] + Acc(1)) * f * Acc(0.5) - Acc(0.5);
    const Acc hh = (box[4] - box[2] + Acc(1)) * f * Acc(0.5) - Acc(0.5);
    box[1] = cx - hw;
    box[2] = cy - hh;
    box[3] = cx + hw;
    box[4] = cy + hh;
  }
  return level;
}

// RoIAlign's box geometry of a (rescaled) RoI on level `level`.
template <typename Acc>
DCNKIT_HD RoIAlignBox<Acc> multi_level_roi_align_box(const MultiLevelRoIAlignParams& p, const Acc box[5],
                                                     int64_t level) {
  const MultiLevelRoIAlignAttrs& a = p.attrs;
  return roi_align_box<Acc>(box, static_cast<Acc>(level_pick(p.spatial_scales, level)), a.aligned, a.pooled_h,
                            a.pooled_w,
                            a.sampling_ratio);
}

// The RoI block schedule's head of RoI k (roi_plan.h): its level's map, box, batch index and plan stride.
template <typename Acc, typename T>
DCNKIT_HD RoIPlanHead<Acc> multi_level_plan_head(const MultiLevelRoIAlignParams& p, const T* rois, int64_t k) {
  const T* roi = rois + k * 5;
  RoIPlanHead<Acc> h;
  if (!roi_batch_index<Acc>(roi, p.batch, &h.b)) h.b = -1;
  Acc box[5];
  const int64_t l = multi_level_roi_box<Acc>(p.attrs, roi, box);
  h.level = static_cast<int32_t>(l);
  h.H = level_pick(p.heights, l);
  h.W = level_pick(p.widths, l);
  h.box = multi_level_roi_align_box<Acc>(p, box, l);
  roi_plan_finish(h, p.attrs.pooled_h * p.attrs.pooled_w);
  return h;
}

// multi_level_plan_head as a functor (the deterministic backward's head_of; roi_gather_ops.h).
template <typename Acc, typename T>
struct MultiLevelHeadOf {
  MultiLevelRoIAlignParams p;
  const T* rois;
  DCNKIT_HD RoIPlanHead<Acc> operator()(int64_t k) const { return multi_level_plan_head<Acc>(p, rois, k); }
};

// The L maps (or their gradients' accumulation buffers), by value.
template <typename P>
struct LevelPointers {
  P ptr[kMaxFeatureLevels];
};

// The map a head pools: its level's, image h.b, channel 0 (the deterministic backward's map_of).
template <typename T>
struct LevelMapOf {
  LevelPointers<const T*> levels;
  int64_t channels;
  template <typename Acc>
  DCNKIT_HD const T* operator()(const RoIPlanHead<Acc>& h) const {
    return level_pick(levels.ptr, h.level) + h.b * channels * h.H * h.W;
  }
};

// The CUDA kernels index a map's rows and columns in 32 bits (AxisIndex): every level's, checked once per launch.
inline Status check_multi_level_cuda(const char* op, const MultiLevelRoIAlignParams& p) {
  for (int64_t l = 0; l < p.attrs.num_levels; ++l) {
    DCNKIT_RETURN_IF_ERROR(check_cuda_map_axes(op, "features[" + std::to_string(l) + "]", p.heights[l], p.widths[l]));
  }
  return Status::Ok();
}

// The largest level's pixels (the launch decision of roi_plan_launch).
inline int64_t multi_level_max_pixels(const MultiLevelRoIAlignParams& p) {
  int64_t m = 0;
  for (int64_t l = 0; l < p.attrs.num_levels; ++l) m = p.heights[l] * p.widths[l] > m ? p.heights[l] * p.widths[l] : m;
  return m;
}

}  // namespace dcnkit
