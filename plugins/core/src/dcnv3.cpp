// DCNv3 / DCNv4: params, checks and CPU launchers over the per-thread math of dcnv3_kernels.h.
#include <algorithm>
#include <cmath>
#include <string>

#include "cuda_schedule_cpu.h"
#include "dcnkit/launch_limits.h"
#include "dcnkit/dcnv3.h"
#include "dcnkit/dcnv3_kernels.h"

namespace dcnkit {

namespace {

// Channels per call of the per-thread functions on the CPU (InternImage's groups have 16 or 32).
constexpr int kCpuChannelChunk = 32;

constexpr int64_t kMaxAttr = int64_t(1) << 24;

}  // namespace

Status check_dcnv3_attrs(const char* op, const Dcnv3Attrs& a) {
  const std::pair<const char*, int64_t> positive[] = {
      {"kernel_h", a.kernel_h},     {"kernel_w", a.kernel_w},     {"stride_h", a.stride_h},
      {"stride_w", a.stride_w},     {"dilation_h", a.dilation_h}, {"dilation_w", a.dilation_w},
      {"group", a.group},           {"group_channels", a.group_channels}};
  for (const auto& [name, v] : positive) {
    if (v < 1 || v > kMaxAttr) return arg_error(op, name, "an int in [1, 2^24]", std::to_string(v));
  }
  if (a.pad_h < 0 || a.pad_h > kMaxAttr) return arg_error(op, "pad_h", "an int in [0, 2^24]", std::to_string(a.pad_h));
  if (a.pad_w < 0 || a.pad_w > kMaxAttr) return arg_error(op, "pad_w", "an int in [0, 2^24]", std::to_string(a.pad_w));
  if (a.kernel_h * a.kernel_w > kMaxAttr) {
    return arg_error(op, "kernel_h, kernel_w", "at most 2^24 kernel points",
                     std::to_string(a.kernel_h) + "x" + std::to_string(a.kernel_w));
  }
  if (a.remove_center != 0 && a.remove_center != 1) {
    return arg_error(op, "remove_center", "0 or 1", std::to_string(a.remove_center));
  }
  if (a.remove_center && (a.kernel_h % 2 == 0 || a.kernel_w % 2 == 0)) {
    return arg_error(op, "remove_center", "odd kernel_h and kernel_w (a kernel with a centre point)",
                     "kernel " + std::to_string(a.kernel_h) + "x" + std::to_string(a.kernel_w));
  }
  if (a.remove_center && a.kernel_h * a.kernel_w == 1) {
    return arg_error(op, "remove_center", "a kernel with more than one point", "kernel 1x1");
  }
  if (!std::isfinite(a.offset_scale)) return arg_error(op, "offset_scale", "a finite number", to_str(a.offset_scale));
  return Status::Ok();
}

namespace {

// Attributes and the input's shape into p (no offset/weight layout yet).
Status fill(const char* op, const char* input_name, const Dcnv3Attrs& a, const Shape& input, Dcnv3Params* p) {
  DCNKIT_RETURN_IF_ERROR(check_dcnv3_attrs(op, a));
  DCNKIT_RETURN_IF_ERROR(check_rank(op, input_name, input, 4, "(N, H, W, C), channels last"));
  if (input[3] != a.group * a.group_channels) {
    return arg_error(op, input_name, "C = group * group_channels = " + std::to_string(a.group * a.group_channels) +
                                         " channels at dim 3",
                     std::to_string(input[3]) + " (shape " + shape_str(input) + ")");
  }
  p->batch = input[0];
  p->height = input[1];
  p->width = input[2];
  p->groups = a.group;
  p->group_channels = a.group_channels;
  p->kernel_h = a.kernel_h;
  p->kernel_w = a.kernel_w;
  p->stride_h = a.stride_h;
  p->stride_w = a.stride_w;
  p->pad_h = a.pad_h;
  p->pad_w = a.pad_w;
  p->dilation_h = a.dilation_h;
  p->dilation_w = a.dilation_w;
  p->offset_scale = a.offset_scale;
  p->remove_center = a.remove_center != 0;
  const int64_t eh = a.dilation_h * (a.kernel_h - 1) + 1, ew = a.dilation_w * (a.kernel_w - 1) + 1;
  if (p->height + 2 * a.pad_h < eh || p->width + 2 * a.pad_w < ew) {
    return arg_error(op, input_name,
                     "a padded map at least as large as the dilated kernel (" + std::to_string(eh) + "x" +
                         std::to_string(ew) + ")",
                     "shape " + shape_str(input) + " with pad (" + std::to_string(a.pad_h) + ", " +
                         std::to_string(a.pad_w) + ")");
  }
  p->out_h = (p->height + 2 * a.pad_h - eh) / a.stride_h + 1;
  p->out_w = (p->width + 2 * a.pad_w - ew) / a.stride_w + 1;
  p->points = a.kernel_h * a.kernel_w - (p->remove_center ? 1 : 0);
  return Status::Ok();
}

Status check_site_shape(const char* op, const char* arg, const Shape& s, const Dcnv3Params& p, int64_t last,
                        const std::string& what) {
  DCNKIT_RETURN_IF_ERROR(check_rank(op, arg, s, 4, "(N, Ho, Wo, channels), channels last"));
  DCNKIT_RETURN_IF_ERROR(check_dim(op, arg, s, 0, p.batch, "N, the batch of the input"));
  DCNKIT_RETURN_IF_ERROR(check_dim(op, arg, s, 1, p.out_h, "Ho of the kernel, stride, pad and dilation"));
  DCNKIT_RETURN_IF_ERROR(check_dim(op, arg, s, 2, p.out_w, "Wo of the kernel, stride, pad and dilation"));
  return check_dim(op, arg, s, 3, last, what);
}

int64_t sites(const Dcnv3Params& p) { return p.batch * p.out_h * p.out_w; }

}  // namespace

Status make_dcnv3_params(const char* op, const Dcnv3Attrs& a, const Shape& input, const Shape& offset,
                         const Shape& mask, Dcnv3Params* p) {
  DCNKIT_RETURN_IF_ERROR(fill(op, "input", a, input, p));
  const int64_t G = p->groups, K = p->points;
  DCNKIT_RETURN_IF_ERROR(check_site_shape(op, "offset", offset, *p, G * K * 2, "group * K * 2 (dx, dy) offsets"));
  DCNKIT_RETURN_IF_ERROR(check_site_shape(op, "mask", mask, *p, G * K, "group * K weights"));
  p->offset_row = G * K * 2;
  p->offset_group = 2 * K;
  p->mask_row = G * K;
  p->mask_group = K;
  p->mask_base = 0;
  p->fused = false;
  p->softmax = false;
  return Status::Ok();
}

Status make_dcnv4_params(const char* op, const Dcnv3Attrs& a, bool softmax, const Shape& value,
                         const Shape& offset_mask, Dcnv3Params* p) {
  DCNKIT_RETURN_IF_ERROR(fill(op, "value", a, value, p));
  const int64_t G = p->groups, K = p->points, Cp = dcnv4_offset_mask_channels(G, K);
  DCNKIT_RETURN_IF_ERROR(check_site_shape(op, "offset_mask", offset_mask, *p, Cp,
                                          "group * K * 3 = " + std::to_string(G * K * 3) +
                                              " rounded up to a multiple of 8"));
  p->offset_row = p->mask_row = Cp;
  p->offset_group = p->mask_group = 3 * K;
  p->mask_base = 2 * K;
  p->fused = true;
  p->softmax = softmax;
  return Status::Ok();
}

template <typename T>
Status dcnv3_forward_cpu(const Dcnv3Params& p, const T* input, const T* offset, const T* mask, T* output,
                         const CpuContext& ctx) {
  if (cuda_schedule_on_cpu()) {  // dcnv3_forward_cuda's grid, serially
    // CUDA's limits
    DCNKIT_RETURN_IF_ERROR(check_launch(stride_launch("dcnv3_forward_kernel", dcnv3_thread_count<kDcnv3ForwardChunk>(p))));
    for (int64_t i = 0; i < dcnv3_thread_count<kDcnv3ForwardChunk>(p); ++i) {
      dcnv3_forward_thread<T, T>(p, input, offset, mask, output, i);
    }
    return Status::Ok();
  }
  // The CUDA kernels' launch grid (dcnv3_thread), with runs of kCpuChannelChunk channels.
  parallel_for(ctx, dcnv3_thread_count<kCpuChannelChunk>(p), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const Dcnv3Thread t = dcnv3_thread<kCpuChannelChunk>(p, i);
      dcnv3_forward_channels<kCpuChannelChunk, T, T>(p, input, offset, mask, t.n, t.ho, t.wo, t.g, t.run.c0,
                                                     t.run.count, output);
    }
  });
  return Status::Ok();
}

template <typename T>
Status dcnv3_backward_cpu(const Dcnv3Params& p, const T* grad_output, const T* input, const T* offset, const T* mask,
                          T* grad_input, T* grad_offset, T* grad_mask, const CpuContext& ctx) {
  const int64_t G = p.groups, gc = p.group_channels, Ho = p.out_h, Wo = p.out_w;
  std::fill(grad_input, grad_input + p.batch * p.height * p.width * p.channels(), T(0));
  std::fill(grad_offset, grad_offset + sites(p) * p.offset_row, T(0));
  if (!p.fused) std::fill(grad_mask, grad_mask + sites(p) * p.mask_row, T(0));
  if (cuda_schedule_on_cpu()) {  // dcnv3_backward_cuda's grid, serially (DCNv4: weights' gradient in grad_offset)
    // CUDA's limits
    DCNKIT_RETURN_IF_ERROR(check_launch(stride_launch("dcnv3_backward_kernel", dcnv3_thread_count<kDcnv3BackwardChunk>(p))));
    T* gm = p.fused ? grad_offset : grad_mask;
    for (int64_t i = 0; i < dcnv3_thread_count<kDcnv3BackwardChunk>(p); ++i) {
      dcnv3_backward_thread<T, T>(p, grad_output, input, offset, mask, grad_input, grad_offset, gm, i, PlainAdd{});
    }
    return Status::Ok();
  }
  // One task per (n, g): it alone writes grad_input[n, :, :, group g] and the point gradients of group g at the
  // positions of image n, so the result does not depend on the thread count.
  parallel_for(ctx, p.batch * G, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t n = t / G, g = t % G;
      auto add_input = [&](int64_t at, T v) { grad_input[at] += v; };
      auto add_point = [&](int64_t o, int64_t mi, T gw, T gx, T gy) {
        grad_mask[mi] += gw;
        grad_offset[o] += gx;
        grad_offset[o + 1] += gy;
      };
      for (int64_t ho = 0; ho < Ho; ++ho) {
        for (int64_t wo = 0; wo < Wo; ++wo) {
          for (int64_t c0 = 0; c0 < gc; c0 += kCpuChannelChunk) {
            const int count = static_cast<int>(std::min<int64_t>(gc - c0, kCpuChannelChunk));
            dcnv3_backward_channels<kCpuChannelChunk, T, T>(p, grad_output, input, offset, mask, n, ho, wo, g, c0,
                                                            count, add_input, add_point);
          }
        }
      }
    }
  });
  return Status::Ok();
}

#define DCNKIT_DCNV3_CPU(T)                                                                                      \
  template Status dcnv3_forward_cpu<T>(const Dcnv3Params&, const T*, const T*, const T*, T*, const CpuContext&); \
  template Status dcnv3_backward_cpu<T>(const Dcnv3Params&, const T*, const T*, const T*, const T*, T*, T*, T*,  \
                                        const CpuContext&);
DCNKIT_DCNV3_CPU(float)
DCNKIT_DCNV3_CPU(double)
#undef DCNKIT_DCNV3_CPU

}  // namespace dcnkit
