// DeformPSRoIPool: params, checks and CPU launchers. The math is in psroi_kernels.h.
#include <algorithm>
#include <cmath>
#include <vector>

#include "dcnkit/deform_psroi_pool.h"
#include "dcnkit/psroi_kernels.h"
#include "dcnkit/psroi_gather.h"
#include "dcnkit/psroi_plan.h"
#include "dcnkit/roi_plan_serial.h"

namespace dcnkit {

Status make_deform_psroi_pool_params(const char* op, const Shape& input, const Shape& rois,
                                     const Shape* trans, const DeformPSRoIPoolAttrs& attrs,
                                     DeformPSRoIPoolParams* p) {
  DCNKIT_RETURN_IF_ERROR(check_rank(op, "input", input, 4, "(N, C, H, W)"));
  DCNKIT_RETURN_IF_ERROR(check_rank(op, "rois", rois, 2, "(K, 5)"));
  DCNKIT_RETURN_IF_ERROR(check_dim(op, "rois", rois, 1, 5, "[batch_index, x1, y1, x2, y2]"));
  if (!(std::isfinite(attrs.spatial_scale) && attrs.spatial_scale > 0)) {
    return arg_error(op, "spatial_scale", "a finite value > 0", to_str(attrs.spatial_scale));
  }
  if (attrs.output_size < 1) {
    return arg_error(op, "output_size", "a value >= 1", std::to_string(attrs.output_size));
  }
  if (attrs.output_dim < 1) {
    return arg_error(op, "output_dim", "a value >= 1", std::to_string(attrs.output_dim));
  }
  if (attrs.group_size < 1) {
    return arg_error(op, "group_size", "a value >= 1", std::to_string(attrs.group_size));
  }
  DCNKIT_RETURN_IF_ERROR(check_sampling_ratio(op, "sample_per_part", attrs.sample_per_part, 1));
  const int64_t G = attrs.group_size;
  DCNKIT_RETURN_IF_ERROR(check_dim(op, "input", input, 1, attrs.output_dim * G * G,
                                   "output_dim * group_size^2 = " + std::to_string(attrs.output_dim) +
                                       " * " + std::to_string(G) + "^2"));
  const int64_t part_size = attrs.part_size > 0 ? attrs.part_size : attrs.output_size;
  const bool no_trans = attrs.no_trans || trans == nullptr;
  if (attrs.no_trans && trans != nullptr) {
    return arg_error(op, "trans", "no tensor when no_trans is set",
                     "a tensor of shape " + shape_str(*trans));
  }
  int64_t num_classes = 1;
  if (!no_trans) {
    if (!std::isfinite(attrs.trans_std)) {
      return arg_error(op, "trans_std", "a finite value", to_str(attrs.trans_std));
    }
    const Shape& t = *trans;
    DCNKIT_RETURN_IF_ERROR(check_rank(op, "trans", t, 4, "(K, 2*num_classes, part_size, part_size)"));
    DCNKIT_RETURN_IF_ERROR(check_dim(op, "trans", t, 0, rois[0], "K, the number of rois"));
    if (t[1] < 2 || t[1] % 2 != 0) {
      return arg_error(op, "trans", "an even size >= 2 at dim 1 (2*num_classes)",
                       std::to_string(t[1]) + " (shape " + shape_str(t) + ")");
    }
    DCNKIT_RETURN_IF_ERROR(check_dim(op, "trans", t, 2, part_size, "part_size"));
    DCNKIT_RETURN_IF_ERROR(check_dim(op, "trans", t, 3, part_size, "part_size"));
    num_classes = t[1] / 2;
    if (attrs.output_dim % num_classes != 0) {
      return arg_error(op, "output_dim", "a multiple of num_classes = trans.size(1) / 2 = " +
                                             std::to_string(num_classes),
                       std::to_string(attrs.output_dim));
    }
  }
  p->attrs = attrs;
  p->attrs.part_size = part_size;
  p->attrs.no_trans = no_trans;
  p->batch = input[0];
  p->channels = input[1];
  p->height = input[2];
  p->width = input[3];
  p->num_rois = rois[0];
  p->num_classes = num_classes;
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
Status deform_psroi_pool_forward_cpu(const DeformPSRoIPoolParams& p, const T* input, const T* rois,
                                     const T* trans, T* output, T* count, const CpuContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(check_roi_batch_indices("deform_psroi_pool", rois, p.num_rois, p.batch));
  const int64_t C = p.channels, H = p.height, W = p.width, D = p.attrs.output_dim;
  const int64_t P = p.attrs.output_size, spp = p.attrs.sample_per_part;
  if (p.attrs.no_trans) trans = nullptr;
  const bool schedule = roi_cuda_schedule_path() || roi_cuda_schedule_deterministic_path();
  if (schedule && psroi_plan_fits<T>(p)) {  // the CUDA launcher's planned blocks, run serially
    return psroi_schedule_serial<T>(p, rois, trans, 256, [&](const PSRoIPlanHead<T>& h, int64_t k, int64_t c0,
                                                             int64_t nc, const RoIPlanEntry<T>* plan, int tid) {
      psroi_plan_forward_items<T, T>(p, h, plan, input, k, c0, nc, tid, 256, output, count);
    });
  }
  parallel_for(ctx, p.num_rois * D, [&](int64_t begin, int64_t end) {
    for (int64_t kd = begin; kd < end; ++kd) {
      const int64_t k = kd / D, ctop = kd % D;
      const T* roi = rois + k * 5;
      int64_t b = 0;
      roi_batch_index<T>(roi, p.batch, &b);
      for (int64_t ph = 0; ph < P; ++ph) {
        for (int64_t pw = 0; pw < P; ++pw) {
          const PSRoIBin<T> r = psroi_bin<T>(p, roi, trans, k, ctop, ph, pw);
          T cnt;
          const int64_t o = (kd * P + ph) * P + pw;
          output[o] = psroi_bin_forward(input + (b * C + r.channel) * H * W, H, W, r, spp, &cnt);
          if (count != nullptr) count[o] = cnt;
        }
      }
    }
  });
  return Status::Ok();
}

template <typename T>
Status deform_psroi_pool_backward_cpu(const DeformPSRoIPoolParams& p, const T* grad_output,
                                      const T* input, const T* rois, const T* trans,
                                      const T* count, T* grad_input, T* grad_trans,
                                      const CpuContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(check_roi_batch_indices("deform_psroi_pool", rois, p.num_rois, p.batch));
  const int64_t N = p.batch, C = p.channels, H = p.height, W = p.width, D = p.attrs.output_dim;
  const int64_t P = p.attrs.output_size, spp = p.attrs.sample_per_part, G = p.attrs.group_size;
  if (p.attrs.no_trans) trans = nullptr;
  // grad_input: one task per input channel c (owns grad_input[:, c]); c is read by the outputs
  // (k, ctop, ph, pw) with ctop = c / G^2 whose (gh, gw) match c.
  if (roi_cuda_schedule_deterministic_path()) {  // the deterministic mode's grids (psroi_gather.h), serially
    if (grad_input != nullptr) {
      if (!psroi_gather_supported(p)) {
        return arg_error("deform_psroi_pool", "output_size", "output_size and group_size within 32-bit indices",
                         std::to_string(p.attrs.output_size));
      }
      const int64_t outputs = p.num_rois * D * P * P;
      DCNKIT_RETURN_IF_ERROR(check_launch(element_launch("deform_psroi_pool_scale_kernel", outputs)));
      std::vector<T> scale(static_cast<size_t>(outputs));
      for (int64_t o = 0; o < outputs; ++o) scale[static_cast<size_t>(o)] = psroi_gather_scale<T>(grad_output, count, o);
      const PSRoIGather<T, T> g = PSRoIGather<T, T>::make(p, rois, trans, scale.data());
      DCNKIT_RETURN_IF_ERROR(roi_gather_serial(g, p.num_rois, roi_gather_grid<T>(N, C, H, W), grad_input));
    }
    const int64_t m = p.num_rois * p.num_classes * p.attrs.part_size * p.attrs.part_size;
    if (grad_trans != nullptr && trans != nullptr) {
      DCNKIT_RETURN_IF_ERROR(check_launch(element_launch("deform_psroi_pool_trans_grad_kernel", m)));
      for (int64_t i = 0; i < m; ++i) {
        psroi_trans_grad_entry<T, T>(p, grad_output, input, rois, trans, count, i, grad_trans);
      }
    } else if (grad_trans != nullptr) {
      std::fill(grad_trans, grad_trans + 2 * m, T(0));
    }
    return Status::Ok();
  }
  if (grad_input != nullptr && roi_cuda_schedule_path() && psroi_plan_fits<T>(p)) {  // the CUDA launcher's blocks
    std::fill(grad_input, grad_input + N * C * H * W, T(0));
    const auto add_at = [grad_input](int64_t at) { return CpuAdd<T>{grad_input + at}; };
    DCNKIT_RETURN_IF_ERROR(psroi_schedule_serial<T>(
        p, rois, trans, 256, [&](const PSRoIPlanHead<T>& h, int64_t k, int64_t c0, int64_t nc,
                                 const RoIPlanEntry<T>* plan, int tid) {
          psroi_plan_backward_items<T, T>(p, h, plan, grad_output, count, k, c0, nc, tid, 256, add_at);
        }));
  } else if (grad_input != nullptr) {
    parallel_for(ctx, C, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        for (int64_t n = 0; n < N; ++n) {
          T* g = grad_input + (n * C + c) * H * W;
          for (int64_t i = 0; i < H * W; ++i) g[i] = T(0);
        }
        const int64_t ctop = c / (G * G), cgh = (c / G) % G, cgw = c % G;
        auto group_of = [&](int64_t i) {
          const int64_t g = i * G / P;
          return g < 0 ? 0 : (g > G - 1 ? G - 1 : g);
        };
        for (int64_t k = 0; k < p.num_rois; ++k) {
          const T* roi = rois + k * 5;
          int64_t b = 0;
          roi_batch_index<T>(roi, N, &b);
          CpuAdd<T> add{grad_input + (b * C + c) * H * W};
          for (int64_t ph = 0; ph < P; ++ph) {
            if (group_of(ph) != cgh) continue;
            for (int64_t pw = 0; pw < P; ++pw) {
              if (group_of(pw) != cgw) continue;  // bins that read another channel
              const int64_t o = ((k * D + ctop) * P + ph) * P + pw;
              const T gv = grad_output[o];
              if (gv == T(0)) continue;
              const PSRoIBin<T> r = psroi_bin<T>(p, roi, trans, k, ctop, ph, pw);
              if (r.channel != c) continue;
              psroi_bin_backward(H, W, r, spp, count[o], gv, add);
            }
          }
        }
      }
    });
  }
  if (grad_trans != nullptr && trans != nullptr) {
    const int64_t per_roi = 2 * p.num_classes * p.attrs.part_size * p.attrs.part_size;
    const T trans_std = static_cast<T>(p.attrs.trans_std);
    // One task per RoI, summing over its outputs.
    parallel_for(ctx, p.num_rois, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        T* gt = grad_trans + k * per_roi;
        for (int64_t i = 0; i < per_roi; ++i) gt[i] = T(0);
        const T* roi = rois + k * 5;
        int64_t b = 0;
        roi_batch_index<T>(roi, N, &b);
        for (int64_t ctop = 0; ctop < D; ++ctop) {
          for (int64_t ph = 0; ph < P; ++ph) {
            for (int64_t pw = 0; pw < P; ++pw) {
              const int64_t o = ((k * D + ctop) * P + ph) * P + pw;
              const T gv = grad_output[o];
              if (gv == T(0)) continue;
              const PSRoIBin<T> r = psroi_bin<T>(p, roi, trans, k, ctop, ph, pw);
              T gtx, gty;
              psroi_bin_trans_grad(input + (b * C + r.channel) * H * W, H, W, r, spp, trans_std,
                                   count[o], gv, &gtx, &gty);
              grad_trans[r.trans_x] += gtx;
              grad_trans[r.trans_y] += gty;
            }
          }
        }
      }
    });
  } else if (grad_trans != nullptr) {
    const int64_t n = p.num_rois * 2 * p.num_classes * p.attrs.part_size * p.attrs.part_size;
    for (int64_t i = 0; i < n; ++i) grad_trans[i] = T(0);
  }
  return Status::Ok();
}

template Status deform_psroi_pool_forward_cpu<float>(const DeformPSRoIPoolParams&, const float*,
                                                     const float*, const float*, float*, float*,
                                                     const CpuContext&);
template Status deform_psroi_pool_forward_cpu<double>(const DeformPSRoIPoolParams&, const double*,
                                                      const double*, const double*, double*,
                                                      double*, const CpuContext&);
template Status deform_psroi_pool_backward_cpu<float>(const DeformPSRoIPoolParams&, const float*,
                                                      const float*, const float*, const float*,
                                                      const float*, float*, float*,
                                                      const CpuContext&);
template Status deform_psroi_pool_backward_cpu<double>(const DeformPSRoIPoolParams&, const double*,
                                                       const double*, const double*, const double*,
                                                       const double*, double*, double*,
                                                       const CpuContext&);

}  // namespace dcnkit
