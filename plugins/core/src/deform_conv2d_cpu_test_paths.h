// DeformConv2d: the CPU test paths of the CUDA code (selected with DCNKIT_DCN_CPU_PATH; see below), used by
// the forward and backward drivers. Internal to plugins/core/src.
#pragma once

#include <cstring>

#include "deform_conv2d_cpu_common.h"

namespace dcnkit {
namespace {

// ---- element-wise path ---------------------------------------------------------------------------
// The CUDA kernels' per-element functions (deform_conv2d_column, deform_conv2d_scatter_input,
// deform_conv2d_offset_mask_grad) run serially on the CPU, so that CPU tests check the GPU math too:
// selected with DCNKIT_DCN_CPU_PATH=elementwise (read once per process). Slow; for tests only.
// DCNKIT_DCN_CPU_PATH=cuda-schedule runs the CUDA launchers themselves on the CPU: their schedule
// (chunks of images, every GEMM's arguments, zeroing) and their per-thread element functions
// (deform_conv2d_kernels.h), serially, with the context's GEMM and chunks of ceil(N/2) images.
enum class CpuPath { kFast, kElementwise, kCudaSchedule };
inline CpuPath cpu_path() {
  static const CpuPath path = [] {
    const char* e = std::getenv("DCNKIT_DCN_CPU_PATH");
    if (e != nullptr && std::strcmp(e, "elementwise") == 0) return CpuPath::kElementwise;
    if (e != nullptr && std::strcmp(e, "cuda-schedule") == 0) return CpuPath::kCudaSchedule;
    return CpuPath::kFast;
  }();
  return path;
}
inline bool elementwise_path() { return cpu_path() == CpuPath::kElementwise; }
inline bool cuda_schedule_path() { return cpu_path() == CpuPath::kCudaSchedule; }

// The executor of the CUDA schedule on the CPU: each "kernel" is a serial loop over its element
// function, in the order a CUDA grid would cover it; the scatter is a plain += (one thread).
template <typename T>
struct CpuScheduleExec {
  const DeformConv2dParams& p;
  const CpuContext& ctx;
  const T *input, *offset, *mask, *bias, *grad_output;
  T *output, *grad_input, *grad_offset, *grad_bias, *grad_mask;

  Status im2col(int64_t n0, int64_t nb, T* columns) {
    for (int64_t i = 0; i < nb * p.in_channels * p.out_spatial(); ++i)
      deform_conv2d_im2col_row<T, T>(p, input, offset, mask, n0, i, columns);
    return Status::Ok();
  }
  Status bias_fill(int64_t n0, int64_t nb) {
    for (int64_t i = 0; i < nb * p.out_channels * p.out_spatial(); ++i)
      deform_conv2d_bias_element(p, bias, n0, i, output);
    return Status::Ok();
  }
  Status col2im(int64_t n0, int64_t nb, const T* grad_columns) {
    for (int64_t i = 0; i < nb * p.in_channels * p.out_spatial(); ++i)
      deform_conv2d_col2im_row<T, T>(p, offset, mask, grad_columns, n0, i, grad_input,
                                     [](T* dst, T v) { *dst += v; });
    return Status::Ok();
  }
  Status offset_mask_grad(int64_t n0, int64_t nb, const T* grad_columns) {
    for (int64_t i = 0; i < nb * p.attrs.deformable_groups * p.kernel_size() * p.out_spatial(); ++i)
      deform_conv2d_offset_mask_grad_element(p, input, offset, mask, grad_columns, n0, i, grad_offset,
                                             grad_mask);
    return Status::Ok();
  }
  Status bias_grad() {
    const int64_t P = p.out_spatial();
    for (int64_t co = 0; co < p.out_channels; ++co) {
      T s = T(0);
      for (int64_t i = 0; i < p.batch * P; ++i) s += grad_output[(i / P * p.out_channels + co) * P + i % P];
      grad_bias[co] = s;
    }
    return Status::Ok();
  }
  Status zero(T* dst, int64_t count) {
    std::fill(dst, dst + count, T(0));
    return Status::Ok();
  }
  Status gemm(const GemmArgs& ga) { return ctx.run_gemm(ga); }
  Status weight_gemm(const GemmArgs& ga) { return ctx.run_gemm(ga); }
};

inline int64_t cuda_schedule_chunk(const DeformConv2dParams& p) { return std::max<int64_t>(1, (p.batch + 1) / 2); }

// Scratch of the CUDA-schedule path (a test path: it allocates, unlike the launchers).
template <typename T>
std::vector<T> cuda_schedule_columns(const DeformConv2dParams& p) {
  return std::vector<T>(static_cast<size_t>(cuda_schedule_chunk(p) * p.in_channels * p.kernel_size() *
                                            p.out_spatial()));
}

template <typename T>
void forward_elementwise(const DeformConv2dParams& p, const T* input, const T* offset, const T* weight,
                         const T* bias, const T* mask, T* output) {
  const int64_t N = p.batch, P = p.out_spatial(), K = p.kernel_size(), Cin = p.in_channels;
  const int64_t Gd = p.attrs.deformable_groups, HW = p.height * p.width;
  const int64_t cin_g = p.in_per_group(), cout_g = p.out_per_group(), Cout = p.out_channels;
  for (int64_t n = 0; n < N; ++n) {
    const T* x_n = input + n * Cin * HW;
    const T* off_n = offset + n * 2 * Gd * K * P;
    const T* mask_n = mask ? mask + n * Gd * K * P : nullptr;
    for (int64_t co = 0; co < Cout; ++co) {
      const int64_t gc = co / cout_g;
      for (int64_t pos = 0; pos < P; ++pos) {
        T acc = bias ? bias[co] : T(0);
        for (int64_t cl = 0; cl < cin_g; ++cl)
          for (int64_t k = 0; k < K; ++k)
            acc += weight[(co * cin_g + cl) * K + k] *
                   deform_conv2d_column<T, T>(p, x_n, off_n, mask_n, gc * cin_g + cl, k, pos);
        output[(n * Cout + co) * P + pos] = acc;
      }
    }
  }
}

template <typename T>
void backward_elementwise(const DeformConv2dParams& p, const T* grad_output, const T* input,
                          const T* offset, const T* weight, const T* mask, T* grad_input, T* grad_offset,
                          T* grad_weight, T* grad_mask, T* gcol /* Cin*K scratch */) {
  const int64_t N = p.batch, P = p.out_spatial(), K = p.kernel_size(), Cin = p.in_channels;
  const int64_t Gd = p.attrs.deformable_groups, HW = p.height * p.width;
  const int64_t cin_g = p.in_per_group(), cout_g = p.out_per_group(), Cout = p.out_channels;
  if (grad_input) std::fill(grad_input, grad_input + N * Cin * HW, T(0));
  if (grad_weight) std::fill(grad_weight, grad_weight + Cout * cin_g * K, T(0));
  for (int64_t n = 0; n < N; ++n) {
    const T* x_n = input + n * Cin * HW;
    const T* off_n = offset + n * 2 * Gd * K * P;
    const T* mask_n = mask ? mask + n * Gd * K * P : nullptr;
    const T* gout_n = grad_output + n * Cout * P;
    for (int64_t pos = 0; pos < P; ++pos) {
      // Column gradient of this position: rows c*K + k.
      for (int64_t c = 0; c < Cin; ++c) {
        const int64_t gc = c / cin_g, cl = c - gc * cin_g;
        for (int64_t k = 0; k < K; ++k) {
          T v = T(0);
          for (int64_t co = gc * cout_g; co < (gc + 1) * cout_g; ++co)
            v += weight[(co * cin_g + cl) * K + k] * gout_n[co * P + pos];
          gcol[c * K + k] = v;
          if (grad_input)
            deform_conv2d_scatter_input<T, T>(p, off_n, mask_n, v, c, k, pos, grad_input + n * Cin * HW,
                                              [](T* dst, T a) { *dst += a; });
          if (grad_weight) {
            const T col = deform_conv2d_column<T, T>(p, x_n, off_n, mask_n, c, k, pos);
            for (int64_t co = gc * cout_g; co < (gc + 1) * cout_g; ++co)
              grad_weight[(co * cin_g + cl) * K + k] += gout_n[co * P + pos] * col;
          }
        }
      }
      for (int64_t g = 0; g < Gd; ++g) {
        for (int64_t k = 0; k < K; ++k) {
          T gy, gx, gm;
          deform_conv2d_offset_mask_grad<T, T>(p, x_n, off_n, mask_n, gcol, 1, g, k, pos, &gy, &gx, &gm);
          if (grad_offset) {
            grad_offset[n * 2 * Gd * K * P + (g * 2 * K + 2 * k) * P + pos] = gy;
            grad_offset[n * 2 * Gd * K * P + (g * 2 * K + 2 * k + 1) * P + pos] = gx;
          }
          if (grad_mask) grad_mask[n * Gd * K * P + (g * K + k) * P + pos] = gm;
        }
      }
    }
  }
}

}  // namespace
}  // namespace dcnkit
