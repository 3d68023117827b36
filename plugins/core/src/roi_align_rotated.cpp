// RoIAlignRotated: params, checks and CPU launchers. The forward runs the CUDA kernel's items (roi_align_rotated.h);
// the backward one task per image and channel slice, each summing its RoIs' samples in order. For the tests,
// DCNKIT_ROI_CPU_PATH=cuda-schedule runs the CUDA atomic kernel's items serially (plain adds) and
// cuda-schedule-deterministic the deterministic mode's tile gather (roi_gather_serial), so the CPU tests check the
// GPU's math and indexing.
#include <algorithm>
#include <vector>

#include "dcnkit/roi_align_rotated.h"
#include "dcnkit/roi_plan_serial.h"

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
struct PlainAddAt {
  T* base;
  void operator()(int64_t i, T v) const { base[i] += v; }
};

// The CPU backward of image n, channels c0 .. c0 + nc - 1 (slice s of rotated_channels<T>()): every RoI of that image
// in order, each bin in order, each sample in order (roi_align_rotated_backward_bin), added with plain += into grad
// (zeroed before). One task per (image, slice): no two writers, the same order on every run.
template <typename T>
void backward_owner(const RoIAlignRotatedParams& p, const T* grad_output, const T* rois, int64_t owner, T* grad) {
  constexpr int kC = rotated_channels<T>();
  const int64_t slices = (p.channels + kC - 1) / kC;
  const int64_t n = owner / slices, c0 = (owner % slices) * kC;
  const int nc = static_cast<int>(p.channels - c0 < kC ? p.channels - c0 : kC);
  for (int64_t k = 0; k < p.num_rois; ++k) {
    const RotatedHead<T> h = roi_align_rotated_head<T>(p, rois, k);
    if (h.b != n) continue;
    RotatedFrame<T> frame;
    for (int32_t ph = 0; ph < p.attrs.pooled_h; ++ph) {
      for (int32_t pw = 0; pw < p.attrs.pooled_w; ++pw) {
        roi_align_rotated_backward_bin<T, kC>(p, h, grad_output, k, c0, nc, ph, pw, PlainAddAt<T>{grad}, &frame);
      }
    }
  }
}


// The CUDA block schedule run serially (DCNKIT_ROI_CPU_PATH=cuda-schedule): the launches roi_block_launch makes,
// checked against CUDA's limits; per (RoI, channel group) the RoI's head and plan head; a planned RoI's plan filled by
// every thread, then planned(head, plan_head, plan, k, g, tid) for each thread; the others visit(head, k, g, tid).
template <typename T, typename Planned, typename Visit>
Status rotated_schedule_serial(const RoIAlignRotatedParams& p, const T* rois, const Planned& planned,
                               const Visit& visit) {
  DCNKIT_RETURN_IF_ERROR(check_rotated_cuda("roi_align_rotated (cuda-schedule)", p));
  const int64_t bins = p.attrs.pooled_h * p.attrs.pooled_w, groups = roi_align_rotated_groups(p.channels);
  DCNKIT_RETURN_IF_ERROR(check_roi_block_bins("roi_align_rotated (cuda-schedule)", bins));
  int64_t entries = 0;
  const RoIPlanLaunch how = roi_plan_launch<T>(p.attrs.sampling_ratio, bins, p.height * p.width, &entries);
  if (how != RoIPlanLaunch::kVisitOnly) {
    DCNKIT_RETURN_IF_ERROR(check_launch(roi_block_dims("roi_align_rotated plan kernel", p.num_rois, p.channels,
                                                       entries * static_cast<int64_t>(sizeof(RoIPlanEntry<T>)))));
  }
  if (how != RoIPlanLaunch::kPlanOnly) {
    DCNKIT_RETURN_IF_ERROR(check_launch(roi_block_dims("roi_align_rotated visit kernel", p.num_rois, p.channels, 0)));
  }
  std::vector<RoIPlanEntry<T>> plan(static_cast<size_t>(roi_plan_capacity<T>()));
  for (int64_t k = 0; k < p.num_rois; ++k) {
    const RotatedHead<T> h = roi_align_rotated_head<T>(p, rois, k);
    const RoIPlanHead<T> ph = roi_visit_head(rotated_plan_head<T>(p, h), how == RoIPlanLaunch::kVisitOnly);
    for (int64_t g = 0; g < groups; ++g) {
      if (ph.stride != 0) {
        for (int tid = 0; tid < kCudaScheduleThreads; ++tid) {
          rotated_plan_fill<T>(p, h, ph.stride, tid, kCudaScheduleThreads, plan.data());
        }
        for (int tid = 0; tid < kCudaScheduleThreads; ++tid) planned(h, ph, plan.data(), k, g, tid);
      } else {
        for (int tid = 0; tid < kCudaScheduleThreads; ++tid) visit(h, k, g, tid);
      }
    }
  }
  return Status::Ok();
}

}  // namespace

// The forward runs the bodies of the CUDA visit kernels' items, several channels per item: per (RoI, channel group),
// the head once, then every (slice, bin); DCNKIT_ROI_CPU_PATH=cuda-schedule runs the CUDA schedule itself (plan and
// visit kernels: the same bits).
template <typename T>
Status roi_align_rotated_forward_cpu(const RoIAlignRotatedParams& p, const T* input, const T* rois, T* output,
                                     const CpuContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(check_roi_batch_indices("roi_align_rotated", rois, p.num_rois, p.batch, 6));
  if (p.channels == 0) return Status::Ok();
  const int64_t groups = roi_align_rotated_groups(p.channels);
  if (roi_cuda_schedule_path() || roi_cuda_schedule_deterministic_path()) {
    if (p.attrs.pooled_h * p.attrs.pooled_w == 0) return Status::Ok();
    return rotated_schedule_serial(
        p, rois,
        [&](const RotatedHead<T>&, const RoIPlanHead<T>& ph, const RoIPlanEntry<T>* plan, int64_t k, int64_t g, int tid) {
          roi_plan_forward_items<T, T>(p, ph, plan, input, k, g * kRotatedBlockChannels, roi_group_channels(p.channels, g),
                                       tid, kCudaScheduleThreads, output, false);
        },
        [&](const RotatedHead<T>& h, int64_t k, int64_t g, int tid) {
          RotatedFrame<T> frame;
          roi_align_rotated_block_items<1>(p, g, tid, kCudaScheduleThreads, [&](int64_t c0, int nc, int32_t ph, int32_t pw) {
            roi_align_rotated_forward_bin<T, 1>(p, h, input, k, c0, nc, ph, pw, output, &frame);
          });
        });
  }
  parallel_for(ctx, p.num_rois * groups, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t k = i / groups;
      const RotatedHead<T> h = roi_align_rotated_head<T>(p, rois, k);
      RotatedFrame<T> frame;
      roi_align_rotated_block_items<rotated_channels<T>()>(p, i % groups, 0, 1, [&](int64_t c0, int nc, int32_t ph,
                                                                                   int32_t pw) {
        roi_align_rotated_forward_bin<T, rotated_channels<T>()>(p, h, input, k, c0, nc, ph, pw, output, &frame);
      });
    }
  });
  return Status::Ok();
}

template <typename T>
Status roi_align_rotated_backward_cpu(const RoIAlignRotatedParams& p, const T* grad_output, const T* rois,
                                      T* grad_input, const CpuContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(check_roi_batch_indices("roi_align_rotated", rois, p.num_rois, p.batch, 6));
  constexpr int kC = rotated_channels<T>();
  const int64_t slices = (p.channels + kC - 1) / kC, HW = p.height * p.width;
  std::fill(grad_input, grad_input + p.batch * p.channels * HW, T(0));
  if (p.channels == 0 || HW == 0) return Status::Ok();
  if (roi_cuda_schedule_deterministic_path()) {
    const RotatedGather<T, T, T> g{p, rois, grad_output, 0, nullptr};
    return roi_gather_serial(g, p.num_rois, roi_gather_grid<T>(p.batch, p.channels, p.height, p.width), grad_input);
  }
  if (roi_cuda_schedule_path()) {  // the atomic kernels' blocks, thread by thread (plain adds)
    if (p.num_rois * p.attrs.pooled_h * p.attrs.pooled_w == 0) return Status::Ok();
    return rotated_schedule_serial(
        p, rois,
        [&](const RotatedHead<T>&, const RoIPlanHead<T>& ph, const RoIPlanEntry<T>* plan, int64_t k, int64_t g, int tid) {
          if (ph.b < 0) return;
          roi_plan_backward_items<T, T>(p, ph, plan, grad_output, static_cast<const T*>(nullptr), k,
                                        g * kRotatedBlockChannels, roi_group_channels(p.channels, g), tid,
                                        kCudaScheduleThreads, [&](int64_t at) { return PlainAddAt<T>{grad_input + at}; },
                                        false);
        },
        [&](const RotatedHead<T>& h, int64_t k, int64_t g, int tid) {
          RotatedFrame<T> frame;
          roi_align_rotated_block_items<1>(p, g, tid, kCudaScheduleThreads, [&](int64_t c0, int nc, int32_t ph, int32_t pw) {
            roi_align_rotated_backward_bin<T, 1>(p, h, grad_output, k, c0, nc, ph, pw, PlainAddAt<T>{grad_input},
                                                 &frame);
          });
        });
  }
  parallel_for(ctx, p.batch * slices, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) backward_owner<T>(p, grad_output, rois, o, grad_input);
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
