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

// The CPU backward of image n, channels c0 .. c0 + nc - 1 (slice s): every RoI of that image in order, each bin in
// order, each sample in order, added with plain += into grad (that image's slice, zeroed before). One task per
// (image, slice): no two writers, the same order on every run.
template <typename Acc, typename T, typename R>
void backward_owner(const RoIAlignRotatedParams& p, const T* grad_output, const R* rois,
                                                int64_t owner, Acc* grad) {
  const int64_t slices = roi_align_rotated_slices(p.channels);
  const int64_t n = owner / slices, c0 = (owner % slices) * kRotatedChannels;
  const int64_t nc = p.channels - c0 < kRotatedChannels ? p.channels - c0 : kRotatedChannels;
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w, bins = oh * ow, HW = p.height * p.width;
  Acc* gi = grad + (n * p.channels + c0) * HW;
  for (int64_t k = 0; k < p.num_rois; ++k) {
    const R* roi = rois + k * 6;
    int64_t b = 0;
    if (!roi_batch_index<Acc>(roi, p.batch, &b) || b != n) continue;
    const RotatedBox<Acc> box = roi_align_rotated_box<Acc>(roi, p.attrs);
    for (int64_t bin = 0; bin < bins; ++bin) {
      Acc g[kRotatedChannels];
      const T* go = grad_output + (k * p.channels + c0) * bins + bin;
      for (int64_t c = 0; c < kRotatedChannels; ++c) g[c] = c < nc ? to_acc<Acc>(go[c * bins]) / box.count : Acc(0);
      auto visit = [&](const Taps<Acc>& t, Acc m) {
        for (int j = 0; j < 4; ++j) {
          if (!t.ok[j]) continue;
          const Acc w = m * t.w[j];
          for (int64_t c = 0; c < kRotatedChannels; ++c) {
            if (c < nc) gi[c * HW + t.idx[j]] += g[c] * w;
          }
        }
      };
      roi_align_rotated_visit<Acc>(box, bin / ow, bin % ow, p.height, p.width, visit);
    }
  }
}

}  // namespace

template <typename T>
Status roi_align_rotated_forward_cpu(const RoIAlignRotatedParams& p, const T* input, const T* rois, T* output,
                                     const CpuContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(check_roi_batch_indices("roi_align_rotated", rois, p.num_rois, p.batch, 6));
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
  DCNKIT_RETURN_IF_ERROR(check_roi_batch_indices("roi_align_rotated", rois, p.num_rois, p.batch, 6));
  const int64_t slices = roi_align_rotated_slices(p.channels), HW = p.height * p.width;
  std::fill(grad_input, grad_input + p.batch * p.channels * HW, T(0));
  if (p.channels == 0 || HW == 0) return Status::Ok();
  if (roi_cuda_schedule_deterministic_path()) {
    const RotatedGather<T, T, T> g{p, rois, grad_output, 0, nullptr};
    return roi_gather_serial(g, p.num_rois, roi_gather_grid(p.batch, p.channels, p.height, p.width), grad_input);
  }
  if (roi_cuda_schedule_path()) {
    const int64_t items = p.num_rois * slices * p.attrs.pooled_h * p.attrs.pooled_w;
    for (int64_t i = 0; i < items; ++i) {
      roi_align_rotated_backward_item<T>(p, grad_output, rois, i, PlainAddAt<T>{grad_input});
    }
    return Status::Ok();
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
