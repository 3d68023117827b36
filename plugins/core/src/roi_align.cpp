// RoIAlign: params, checks and CPU launchers. The math is in roi_kernels.h.
#include <algorithm>
#include <cmath>
#include <vector>

#include "dcnkit/roi_align.h"
#include "dcnkit/roi_align_sorted.h"
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

bool roi_align_deterministic_supported(const RoIAlignParams& p, DType dtype) {
  return dtype == DType::kFloat64 ? roi_align_sorted_supported<double>(p) : roi_align_sorted_supported<float>(p);
}

static Status roi_align_unplanned_error(const char* op) {
  return Status::Invalid(std::string(op) +
                         ": deterministic backward: a RoI's adaptive sampling grid is too large for a plan (more "
                         "than " + std::to_string(kRoIPlanSamples) +
                         " samples per bin, or too many per RoI); it has no deterministic path (use an explicit "
                         "sampling_ratio, or leave torch.use_deterministic_algorithms off)");
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
constexpr int kCudaScheduleThreads = 256;

template <typename T, typename Block>
void roi_cuda_schedule(const RoIAlignParams& p, const T* rois, const Block& block) {
  roi_block_schedule_serial<T>(p, [&](int64_t k) { return roi_plan_head<T>(p, rois, k); }, kCudaScheduleThreads,
                               block);
}

template <typename T>
void roi_align_forward_cuda_schedule(const RoIAlignParams& p, const T* input, const T* rois, T* output) {
  const bool max_mode = p.attrs.mode == PoolMode::kMax;
  roi_cuda_schedule<T>(p, rois, [&](const RoIPlanHead<T>& h, int64_t k, int64_t c0, int64_t nc,
                                    const RoIPlanEntry<T>* plan, int tid) {
    if (plan != nullptr) {
      roi_plan_forward_items<T, T>(p, h, plan, input, k, c0, nc, tid, kCudaScheduleThreads, output, max_mode);
    } else {
      roi_visit_forward_items<T, T>(p, h, p.height, p.width, input, k, c0, nc, tid, kCudaScheduleThreads, output);
    }
  });
}

template <typename T>
void roi_align_backward_cuda_schedule(const RoIAlignParams& p, const T* grad_output, const T* input, const T* rois,
                                      T* grad_input) {
  const bool max_mode = p.attrs.mode == PoolMode::kMax;
  std::fill(grad_input, grad_input + p.batch * p.channels * p.height * p.width, T(0));
  const auto add_at = [grad_input](int64_t offset) { return CpuAddTo<T>{grad_input + offset}; };
  roi_cuda_schedule<T>(p, rois, [&](const RoIPlanHead<T>& h, int64_t k, int64_t c0, int64_t nc,
                                    const RoIPlanEntry<T>* plan, int tid) {
    if (plan != nullptr) {
      roi_plan_backward_items<T, T>(p, h, plan, grad_output, input, k, c0, nc, tid, kCudaScheduleThreads, add_at,
                                    max_mode);
    } else {
      roi_visit_backward_items<T, T>(p, h, p.height, p.width, grad_output, input, k, c0, nc, tid, kCudaScheduleThreads,
                                     add_at);
    }
  });
}

// DCNKIT_ROI_CPU_PATH=cuda-schedule-deterministic: the deterministic mode's grids of roi_align_sorted.h run serially
// in grid order (the plan, a stable sort of the (key, slot) pairs, the arg-max in max mode, the pixel gather).
template <typename T>
Status roi_align_backward_sorted(const RoIAlignParams& p, const T* grad_output, const T* input, const T* rois,
                                 T* grad_input) {
  if (!roi_align_sorted_supported<T>(p)) {
    return Status::Invalid("roi_align: deterministic backward: no deterministic path for these sizes (an explicit "
                           "grid too large for a plan, or more than 2^31 slots)");
  }
  const uint32_t E = static_cast<uint32_t>(roi_align_sorted_entries<T>(p));
  const size_t n = static_cast<size_t>(4 * E * p.num_rois);
  std::vector<uint32_t> keys(n), slots(n), items(n), sorted_keys(n), sorted_slots(n);
  std::vector<T> weights(n);
  for (uint32_t k = 0; k < static_cast<uint32_t>(p.num_rois); ++k) {
    for (uint32_t e = 0; e < E; ++e) {
      if (!roi_align_sorted_plan<T>(p, rois, E, k, e, keys.data(), slots.data(), weights.data(), items.data())) {
        return roi_align_unplanned_error("roi_align");
      }
    }
  }
  std::vector<uint32_t> order(slots);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return keys[a] < keys[b]; });
  for (size_t j = 0; j < n; ++j) {
    sorted_keys[j] = keys[order[j]];
    sorted_slots[j] = slots[order[j]];
  }
  std::vector<int32_t> argmax;
  if (p.attrs.mode == PoolMode::kMax) {
    argmax.resize(static_cast<size_t>(p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w));
    for (size_t i = 0; i < argmax.size(); ++i) {
      roi_align_sorted_argmax<T>(p, input, rois, static_cast<uint32_t>(i), argmax.data());
    }
  }
  const int64_t total = p.batch * p.channels * p.height * p.width;
  for (int64_t i = 0; i < total; ++i) {
    grad_input[i] = roi_align_sorted_gather<T>(p, E, static_cast<uint32_t>(n), sorted_keys.data(),
                                               sorted_slots.data(), weights.data(), items.data(),
                                               argmax.empty() ? nullptr : argmax.data(), grad_output,
                                               static_cast<uint32_t>(i));
  }
  return Status::Ok();
}

}  // namespace

template <typename T>
Status roi_align_forward_cpu(const RoIAlignParams& p, const T* input, const T* rois, T* output,
                             const CpuContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(check_roi_batch_indices("roi_align", rois, p.num_rois, p.batch));
  if (roi_cuda_schedule_path() || roi_cuda_schedule_deterministic_path()) {
    roi_align_forward_cuda_schedule(p, input, rois, output);
    return Status::Ok();
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
  if (roi_cuda_schedule_deterministic_path()) return roi_align_backward_sorted(p, grad_output, input, rois, grad_input);
  if (roi_cuda_schedule_path()) {
    roi_align_backward_cuda_schedule(p, grad_output, input, rois, grad_input);
    return Status::Ok();
  }
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
