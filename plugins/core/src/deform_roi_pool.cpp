// DeformRoIPool: params, checks and CPU launchers. The math is in roi_kernels.h.
#include <cmath>

#include "dcnkit/deform_roi_pool.h"
#include "dcnkit/roi_kernels.h"

namespace dcnkit {

Status make_deform_roi_pool_params(const char* op, const Shape& input, const Shape& rois,
                                   const Shape* offset, const DeformRoIPoolAttrs& attrs,
                                   DeformRoIPoolParams* p) {
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

template <typename T>
struct CpuAdd {
  T* base;
  void operator()(int64_t i, T v) const { base[i] += v; }
};

template <typename T>
RoIAlignBox<T> deform_box(const DeformRoIPoolParams& p, const T* roi) {
  return roi_align_box<T>(roi, static_cast<T>(p.attrs.spatial_scale), true, p.attrs.pooled_h,
                          p.attrs.pooled_w, p.attrs.sampling_ratio);
}

// Corner of bin (ph, pw) of RoI k.
template <typename T>
void deform_origin(const DeformRoIPoolParams& p, const RoIAlignBox<T>& box, const T* offset,
                   int64_t k, int64_t ph, int64_t pw, T* y0, T* x0) {
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  const T* ox = offset ? offset + (k * 2 * oh + ph) * ow + pw : nullptr;
  const T* oy = offset ? ox + oh * ow : nullptr;
  roi_bin_origin<T, T>(box, ph, pw, ox, oy, static_cast<T>(p.attrs.gamma), y0, x0);
}

}  // namespace

template <typename T>
Status deform_roi_pool_forward_cpu(const DeformRoIPoolParams& p, const T* input, const T* rois,
                                   const T* offset, T* output, const CpuContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(check_roi_batch_indices("deform_roi_pool", rois, p.num_rois, p.batch));
  const int64_t C = p.channels, H = p.height, W = p.width;
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  if (!p.has_offset) offset = nullptr;
  parallel_for(ctx, p.num_rois * C, [&](int64_t begin, int64_t end) {
    for (int64_t kc = begin; kc < end; ++kc) {
      const int64_t k = kc / C, c = kc % C;
      const T* roi = rois + k * 5;
      int64_t b = 0;
      roi_batch_index<T>(roi, p.batch, &b);
      const RoIAlignBox<T> box = deform_box(p, roi);
      const T* img = input + (b * C + c) * H * W;
      T* out = output + kc * oh * ow;
      for (int64_t ph = 0; ph < oh; ++ph) {
        for (int64_t pw = 0; pw < ow; ++pw) {
          T y0, x0;
          deform_origin(p, box, offset, k, ph, pw, &y0, &x0);
          out[ph * ow + pw] = roi_align_bin_forward(img, H, W, box, y0, x0, false);
        }
      }
    }
  });
  return Status::Ok();
}

template <typename T>
Status deform_roi_pool_backward_cpu(const DeformRoIPoolParams& p, const T* grad_output,
                                    const T* input, const T* rois, const T* offset, T* grad_input,
                                    T* grad_offset, const CpuContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(check_roi_batch_indices("deform_roi_pool", rois, p.num_rois, p.batch));
  const int64_t N = p.batch, C = p.channels, H = p.height, W = p.width;
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  if (!p.has_offset) offset = nullptr;
  // grad_input: one task per channel (owns grad_input[:, c]).
  if (grad_input != nullptr) {
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
          const RoIAlignBox<T> box = deform_box(p, roi);
          CpuAdd<T> add{grad_input + (b * C + c) * H * W};
          const T* go = grad_output + (k * C + c) * oh * ow;
          for (int64_t ph = 0; ph < oh; ++ph) {
            for (int64_t pw = 0; pw < ow; ++pw) {
              const T gv = go[ph * ow + pw];
              if (gv == T(0)) continue;
              T y0, x0;
              deform_origin(p, box, offset, k, ph, pw, &y0, &x0);
              roi_align_bin_backward<T, T>(nullptr, H, W, box, y0, x0, false, gv, add);
            }
          }
        }
      }
    });
  }
  // grad_offset: one task per RoI, summing over channels.
  if (grad_offset != nullptr && offset != nullptr) {
    const T gamma = static_cast<T>(p.attrs.gamma);
    parallel_for(ctx, p.num_rois, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        const T* roi = rois + k * 5;
        int64_t b = 0;
        roi_batch_index<T>(roi, N, &b);
        const RoIAlignBox<T> box = deform_box(p, roi);
        T* gox = grad_offset + k * 2 * oh * ow;
        T* goy = gox + oh * ow;
        for (int64_t ph = 0; ph < oh; ++ph) {
          for (int64_t pw = 0; pw < ow; ++pw) {
            T y0, x0;
            deform_origin(p, box, offset, k, ph, pw, &y0, &x0);
            T sx = T(0), sy = T(0);
            for (int64_t c = 0; c < C; ++c) {
              const T gv = grad_output[((k * C + c) * oh + ph) * ow + pw];
              if (gv == T(0)) continue;
              T gy, gx;
              roi_align_bin_coord_grad(input + (b * C + c) * H * W, H, W, box, y0, x0, &gy, &gx);
              sx += gv * gx;
              sy += gv * gy;
            }
            gox[ph * ow + pw] = gamma * box.roi_w * sx;
            goy[ph * ow + pw] = gamma * box.roi_h * sy;
          }
        }
      }
    });
  } else if (grad_offset != nullptr) {
    for (int64_t i = 0; i < p.num_rois * 2 * oh * ow; ++i) grad_offset[i] = T(0);
  }
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
