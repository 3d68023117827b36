// DeformConv2d: the CPU test paths of the CUDA code (selected with DCNKIT_DCN_CPU_PATH; see below), used by
// the forward and backward drivers. Internal to plugins/core/src.
#pragma once

#include <cstring>
#include <utility>

#include "deform_conv2d_cpu_common.h"
#include "dcnkit/deform_conv2d_schedule.h"

namespace dcnkit {
namespace {

// ---- element-wise path ---------------------------------------------------------------------------
// The per-element functions (deform_conv2d_column, deform_conv2d_scatter_input,
// deform_conv2d_offset_mask_grad) run serially on the CPU: selected with DCNKIT_DCN_CPU_PATH=elementwise
// (read once per process). Slow; for tests only.
// DCNKIT_DCN_CPU_PATH=cuda-schedule runs the CUDA launchers themselves on the CPU: their schedule
// (deform_conv2d_schedule.h: column tiles, every GEMM's arguments, zeroing) and their per-thread bodies
// (deform_conv2d_gather.h) over the CUDA launch grid, serially, with the context's GEMM, the int32
// instantiation; DCNKIT_DCN_CPU_PATH=cuda-schedule-int64 runs the int64 one, and
// DCNKIT_DCN_CPU_PATH=cuda-schedule-deterministic the deterministic mode (deform_conv2d_sorted.h).
enum class CpuPath { kFast, kElementwise, kCudaSchedule, kCudaScheduleInt64, kCudaScheduleDeterministic };
inline CpuPath cpu_path() {
  static const CpuPath path = [] {
    const char* e = std::getenv("DCNKIT_DCN_CPU_PATH");
    if (e != nullptr && std::strcmp(e, "elementwise") == 0) return CpuPath::kElementwise;
    if (e != nullptr && std::strcmp(e, "cuda-schedule") == 0) return CpuPath::kCudaSchedule;
    if (e != nullptr && std::strcmp(e, "cuda-schedule-int64") == 0) return CpuPath::kCudaScheduleInt64;
    if (e != nullptr && std::strcmp(e, "cuda-schedule-deterministic") == 0) return CpuPath::kCudaScheduleDeterministic;
    return CpuPath::kFast;
  }();
  return path;
}
inline bool elementwise_path() { return cpu_path() == CpuPath::kElementwise; }
inline bool cuda_schedule_path() {
  return cpu_path() == CpuPath::kCudaSchedule || cpu_path() == CpuPath::kCudaScheduleInt64 ||
         cpu_path() == CpuPath::kCudaScheduleDeterministic;
}

// The tiling of the CUDA-schedule path: the launchers' rules at test sizes, so that small problems still
// take several tiles of both kinds -- two whole images per tile from 3 images on, else slices of
// ceil(P/3) positions -- and up to 4 channel slices per group (empty and ragged slices included).
inline DcnTiling cuda_schedule_tiling(const DeformConv2dParams& p) {
  const int64_t row = std::max<int64_t>(1, p.in_channels * p.kernel_size());
  const int64_t P = std::max<int64_t>(1, p.out_spatial());
  DcnTiling t = p.batch >= 3 ? deform_conv2d_tiling(p, 1, 2 * row * P)
                              : deform_conv2d_tiling(p, 1, row * ((P + 2) / 3));
  const int64_t cpg = p.in_channels / std::max<int64_t>(1, p.attrs.deformable_groups);
  int64_t s = 1;
  while (2 * s <= std::min<int64_t>(4, cpg)) s *= 2;
  t.fwd_slices = s;
  t.bwd_slices = s > 1 ? s / 2 : 1;  // a different grid from the forward's
  return t;
}

// The executor of the CUDA schedule on the CPU: each "kernel" is a serial loop over its per-thread body in
// the order of the CUDA grid; the scatter is a plain += (one thread); the backward's per-point reduction
// over slices runs the same fixed tree as the kernel's warp shuffles (dcn_slice_tree). Every launch it emulates is
// checked against CUDA's limits (check_launch, with the CUDA executor's launch shapes); the drivers also check the
// launcher's own tiling first (check_deform_conv2d_cuda_launches).
template <typename T>
struct CpuScheduleExec {
  const DeformConv2dParams& p;
  const CpuContext& ctx;
  const T *input, *offset, *mask, *bias, *grad_output;
  T *output, *grad_input, *grad_offset, *grad_bias, *grad_mask;
  bool index32 = cpu_path() != CpuPath::kCudaScheduleInt64;
  bool deterministic = cpu_path() == CpuPath::kCudaScheduleDeterministic;

  Status gather(const DcnTile& t, T* columns) {
    DCNKIT_RETURN_IF_ERROR(check_launch(stride_launch("deform_conv2d_gather_kernel", t.threads)));
    return dispatch_dcn_variant(p, index32, mask != nullptr, [&](auto it, auto kt, auto mt) {
      using I = typename decltype(it)::type;
      for (uint32_t i = 0; i < t.threads; ++i)
        deform_conv2d_gather<T, T, I, decltype(kt)::KH, decltype(kt)::KW, decltype(mt)::value>(
            p, t, input, offset, mask, i, columns);
      return Status::Ok();
    });
  }
  Status bias_fill(const DcnTile& t) {
    DCNKIT_RETURN_IF_ERROR(check_launch(dcn_bias_launch(p, t)));
    for (int64_t b = 0; b < t.nb; ++b)
      for (int64_t co = 0; co < p.out_channels; ++co)
        for (int64_t pl = 0; pl < t.pt; ++pl) deform_conv2d_bias_fill(p, t, bias, b, co, pl, output);
    return Status::Ok();
  }
  Status sampling_backward(const DcnTile& t, const T* grad_columns, bool scatter) {
    T* gi = scatter ? grad_input : nullptr;
    const bool want = grad_offset != nullptr || grad_mask != nullptr;
    DCNKIT_RETURN_IF_ERROR(check_launch(stride_launch("deform_conv2d_sampling_backward_kernel", t.threads)));
    return dispatch_dcn_variant(p, index32, mask != nullptr, [&](auto it, auto kt, auto mt) {
      using I = typename decltype(it)::type;
      constexpr int KH = decltype(kt)::KH, KW = decltype(kt)::KW;
      const uint32_t S = static_cast<uint32_t>(t.slices);
      std::vector<DcnPointGrad<T>> part(S);
      for (uint32_t i0 = 0; i0 < t.threads; i0 += S) {
        for (uint32_t s = 0; s < S; ++s)
          part[s] = deform_conv2d_sampling_backward<T, T, I, KH, KW, decltype(mt)::value>(
              p, t, input, offset, mask, grad_columns, i0 + s, want, gi, [](T* dst, T v) { *dst += v; });
        if (want)
          deform_conv2d_point_grad_store<T, T, I, KH, KW>(p, t, i0, dcn_slice_tree(part.data(), static_cast<int>(S)),
                                                       grad_offset, grad_mask);
      }
      return Status::Ok();
    });
  }
  // Plan, stable sort of (key, slot) -- the order of the CUDA radix sort -- and the pixel gather.
  Status input_grad_sorted(const DcnTile& plan, const DcnPixelGrid& pg, const T* grad_columns) {
    DCNKIT_RETURN_IF_ERROR(check_launch(stride_launch("deform_conv2d_plan_kernel", plan.threads)));
    DCNKIT_RETURN_IF_ERROR(check_launch(stride_launch("deform_conv2d_pixel_gather_kernel", pg.threads)));
    std::vector<uint32_t> keys(pg.entries), slots(pg.entries);
    std::vector<T> weights(pg.entries);
    DCNKIT_RETURN_IF_ERROR(dispatch_dcn_variant(p, index32, mask != nullptr, [&](auto it, auto kt, auto mt) {
      using I = typename decltype(it)::type;
      for (uint32_t i = 0; i < plan.threads; ++i)
        deform_conv2d_plan<T, T, I, decltype(kt)::KH, decltype(kt)::KW, decltype(mt)::value>(
            p, plan, offset, mask, i, keys.data(), slots.data(), weights.data());
      return Status::Ok();
    }));
    std::vector<std::pair<uint32_t, uint32_t>> kv(pg.entries);
    for (uint32_t e = 0; e < pg.entries; ++e) kv[e] = {keys[e], slots[e]};
    std::sort(kv.begin(), kv.end());
    for (uint32_t e = 0; e < pg.entries; ++e) {
      keys[e] = kv[e].first;
      slots[e] = kv[e].second;
    }
    for (uint32_t i = 0; i < pg.threads; ++i)
      deform_conv2d_pixel_gather<T, T, T>(p, plan, pg, keys.data(), slots.data(), weights.data(), grad_columns, i,
                                          grad_input);
    return Status::Ok();
  }
  Status bias_grad() {
    DCNKIT_RETURN_IF_ERROR(check_launch(dcn_bias_grad_launch(p)));
    std::vector<T> part(kDcnBiasGradThreads);
    for (int64_t co = 0; co < p.out_channels; ++co) {
      for (int lane = 0; lane < kDcnBiasGradThreads; ++lane)
        part[lane] = deform_conv2d_bias_grad_partial<T, T>(p, grad_output, co, lane, kDcnBiasGradThreads);
      for (int w = kDcnBiasGradThreads / 2; w > 0; w >>= 1)
        for (int lane = 0; lane < kDcnBiasGradThreads; ++lane) deform_conv2d_bias_grad_tree<T>(part.data(), lane, w);
      grad_bias[co] = part[0];
    }
    return Status::Ok();
  }
  Status zero(T* dst, int64_t count) {
    std::fill(dst, dst + count, T(0));
    return Status::Ok();
  }
  // The CUDA executor's GEMMs: batches of at most 65535 (gemm_in_batches), each checked.
  Status gemm(const GemmArgs& ga) {
    return gemm_in_batches(ga, [&](const GemmArgs& g) {
      DCNKIT_RETURN_IF_ERROR(check_gemm_batch("deform_conv2d GEMM", g.batch));
      return ctx.run_gemm(g);
    });
  }
  // The int32 run adds in place (the float and double route on CUDA); the int64 run takes the route of the
  // 16-bit types: the image's product into a temporary, then the per-element sum into grad_weight.
  Status weight_gemm(const GemmArgs& ga) {
    if (index32) return gemm(ga);
    const int64_t n = p.out_channels * p.in_per_group() * p.kernel_size();
    DCNKIT_RETURN_IF_ERROR(check_launch(stride_launch("accumulate_kernel", n)));
    std::vector<T> tmp(static_cast<size_t>(n));
    DCNKIT_RETURN_IF_ERROR(gemm(weight_gemm_to(ga, tmp.data())));
    for (int64_t i = 0; i < n; ++i) deform_conv2d_weight_accumulate<T, T>(tmp.data(), i, static_cast<T*>(ga.c));
    return Status::Ok();
  }
};

// Scratch of the CUDA-schedule path (a test path: it allocates, unlike the launchers).
template <typename T>
std::vector<T> cuda_schedule_columns(const DeformConv2dParams& p) {
  return std::vector<T>(deform_conv2d_tile_bytes(p, cuda_schedule_tiling(p), sizeof(T)) / sizeof(T) + 1);
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
