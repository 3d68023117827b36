// RoIAlign: params, checks and CPU launchers. The math is in roi_kernels.h.
#include <cmath>

#include "dcnkit/roi_align.h"
#include "dcnkit/roi_kernels.h"

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
  DCNKIT_RETURN_IF_ERROR(check_rank(op, "input", input, 4, "(N, C, H, W)"));
  DCNKIT_RETURN_IF_ERROR(check_rank(op, "rois", rois, 2, "(K, 5)"));
  DCNKIT_RETURN_IF_ERROR(check_dim(op, "rois", rois, 1, 5, "[batch_index, x1, y1, x2, y2]"));
  if (attrs.pooled_h < 1 || attrs.pooled_w < 1) {
    return arg_error(op, "output_size", "(oh, ow) >= 1",
                     "(" + std::to_string(attrs.pooled_h) + ", " + std::to_string(attrs.pooled_w) + ")");
  }
  if (!(std::isfinite(attrs.spatial_scale) && attrs.spatial_scale > 0)) {
    return arg_error(op, "spatial_scale", "a finite value > 0", to_str(attrs.spatial_scale));
  }
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

template <typename T>
struct CpuAdd {
  T* base;
  void operator()(int64_t i, T v) const { base[i] += v; }
};

}  // namespace

template <typename T>
Status roi_align_forward_cpu(const RoIAlignParams& p, const T* input, const T* rois, T* output,
                             const CpuContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(check_roi_batch_indices("roi_align", rois, p.num_rois, p.batch));
  const int64_t C = p.channels, H = p.height, W = p.width;
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  const bool max_mode = p.attrs.mode == PoolMode::kMax;
  const T scale = static_cast<T>(p.attrs.spatial_scale);
  // One task per (RoI, channel): all bins of that map.
  parallel_for(ctx, p.num_rois * C, [&](int64_t begin, int64_t end) {
    for (int64_t kc = begin; kc < end; ++kc) {
      const int64_t k = kc / C, c = kc % C;
      const T* roi = rois + k * 5;
      int64_t b = 0;
      roi_batch_index<T>(roi, p.batch, &b);
      const RoIAlignBox<T> box =
          roi_align_box<T>(roi, scale, p.attrs.aligned, oh, ow, p.attrs.sampling_ratio);
      const T* img = input + (b * C + c) * H * W;
      T* out = output + kc * oh * ow;
      for (int64_t ph = 0; ph < oh; ++ph) {
        for (int64_t pw = 0; pw < ow; ++pw) {
          T y0, x0;
          roi_bin_origin<T, T>(box, ph, pw, nullptr, nullptr, T(0), &y0, &x0);
          out[ph * ow + pw] = roi_align_bin_forward(img, H, W, box, y0, x0, max_mode);
        }
      }
    }
  });
  return Status::Ok();
}

template <typename T>
Status roi_align_backward_cpu(const RoIAlignParams& p, const T* grad_output, const T* input,
                              const T* rois, T* grad_input, const CpuContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(check_roi_batch_indices("roi_align", rois, p.num_rois, p.batch));
  const int64_t N = p.batch, C = p.channels, H = p.height, W = p.width;
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  const bool max_mode = p.attrs.mode == PoolMode::kMax;
  const T scale = static_cast<T>(p.attrs.spatial_scale);
  // One task per channel c: it owns grad_input[:, c] for every RoI (race-free, deterministic).
  parallel_for(ctx, C, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      for (int64_t n = 0; n < N; ++n) {
        T* g = grad_input + (n * C + c) * H * W;
        for (int64_t i = 0; i < H * W; ++i) g[i] = T(0);
      }
      for (int64_t k = 0; k < p.num_rois; ++k) {
        const T* roi = rois + k * 5;
        int64_t b = 0;
        roi_batch_index<T>(roi, N, &b);
        const RoIAlignBox<T> box =
            roi_align_box<T>(roi, scale, p.attrs.aligned, oh, ow, p.attrs.sampling_ratio);
        const T* img = max_mode ? input + (b * C + c) * H * W : nullptr;
        CpuAdd<T> add{grad_input + (b * C + c) * H * W};
        const T* go = grad_output + (k * C + c) * oh * ow;
        for (int64_t ph = 0; ph < oh; ++ph) {
          for (int64_t pw = 0; pw < ow; ++pw) {
            const T gv = go[ph * ow + pw];
            if (gv == T(0)) continue;
            T y0, x0;
            roi_bin_origin<T, T>(box, ph, pw, nullptr, nullptr, T(0), &y0, &x0);
            roi_align_bin_backward(img, H, W, box, y0, x0, max_mode, gv, add);
          }
        }
      }
    }
  });
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
