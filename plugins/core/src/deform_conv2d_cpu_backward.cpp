// DeformConv2d CPU backward launcher (float32, float64); the layout is described in deform_conv2d_cpu_common.h.
#include <atomic>

#include "deform_conv2d_cpu_common.h"
#include "deform_conv2d_cpu_sampling.h"
#include "deform_conv2d_cpu_test_paths.h"

namespace dcnkit {
namespace {

// One sampling point's channels c < n, its four neighbours' rows x[q] in the padded copy: with kCol, its
// column crow[c] = sum_q w[q] x[q][c]; with kGin, gin[q][c] += w[q] * g[c] (the input gradient's rows, in the task's
// padded buffer; a neighbour outside the map adds to the border, never read back); with kDots, d[q] += sum_c
// g[c] * x[q][c], in a fixed order (kLanes<T> partial sums per neighbour, summed pairwise, then the tail).
template <bool kCol, bool kGin, bool kDots, typename T>
__attribute__((always_inline)) inline void point_channels(const T* const x[4], T* const gin[4],
                                                          const T* __restrict g, T* __restrict crow,
                                                          const T w[4], int64_t n, T d[4]) {
  constexpr int L = kLanes<T>;
  const T* __restrict x0 = x[0];
  const T* __restrict x1 = x[1];
  const T* __restrict x2 = x[2];
  const T* __restrict x3 = x[3];
  T* __restrict g0 = gin[0];
  T* __restrict g1 = gin[1];
  T* __restrict g2 = gin[2];
  T* __restrict g3 = gin[3];
  Vec<T> a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t c = 0;
  for (; c + L <= n; c += L) {
    const Vec<T> v0 = vload(x0 + c), v1 = vload(x1 + c), v2 = vload(x2 + c), v3 = vload(x3 + c);
    if constexpr (kCol) vstore(crow + c, w[0] * v0 + w[1] * v1 + w[2] * v2 + w[3] * v3);
    if constexpr (kGin || kDots) {
      const Vec<T> gv = vload(g + c);
      if constexpr (kDots) {
        a0 += gv * v0;
        a1 += gv * v1;
        a2 += gv * v2;
        a3 += gv * v3;
      }
      if constexpr (kGin) {
        vstore(g0 + c, vload(g0 + c) + w[0] * gv);
        vstore(g1 + c, vload(g1 + c) + w[1] * gv);
        vstore(g2 + c, vload(g2 + c) + w[2] * gv);
        vstore(g3 + c, vload(g3 + c) + w[3] * gv);
      }
    }
  }
  T s0 = T(0), s1 = T(0), s2 = T(0), s3 = T(0);
  if constexpr (kDots) {
    if (n >= L) {
      s0 = pairwise_sum<T>(a0);
      s1 = pairwise_sum<T>(a1);
      s2 = pairwise_sum<T>(a2);
      s3 = pairwise_sum<T>(a3);
    }
  }
  for (; c < n; ++c) {
    if constexpr (kCol) crow[c] = w[0] * x0[c] + w[1] * x1[c] + w[2] * x2[c] + w[3] * x3[c];
    if constexpr (kDots) {
      s0 += g[c] * x0[c];
      s1 += g[c] * x1[c];
      s2 += g[c] * x2[c];
      s3 += g[c] * x3[c];
    }
    if constexpr (kGin) {
      g0[c] += w[0] * g[c];
      g1[c] += w[1] * g[c];
      g2[c] += w[2] * g[c];
      g3[c] += w[3] * g[c];
    }
  }
  if constexpr (kDots) {
    d[0] += s0;
    d[1] += s1;
    d[2] += s2;
    d[3] += s3;
  }
}

// One pass over the positions p0+b .. p0+e of a backward chunk, block by block (for_blocks: each sampling point
// computed once, the positions in order) and each point's four rows read once for:
//   kCol: the chunk's columns (rows b..e), as build_columns writes them;
//   kGin: this task's padded grad_input += the scatter of the column gradient;
//   kDots: grad_offset / grad_mask from the group's channel sums d (as deform_conv2d_offset_mask_grad).
template <bool kCol, bool kGin, bool kDots, typename T>
__attribute__((always_inline)) inline void backward_pass_with(const PaddedImage<T>& im, const T* gcol, int64_t p0,
                                                              int64_t b, int64_t e, T* col, T* gin, T* goff_n,
                                                              T* gmask_n) {
  const DeformConv2dParams& p = *im.p;
  const int64_t K = p.kernel_size(), Cin = p.in_channels, CK = Cin * K, P = p.out_spatial();
  const int64_t Gd = p.attrs.deformable_groups, cin_g = p.in_per_group(), row = im.map.cols() * Cin;
  BlockPoints<T> bp;
  T d[4][kBlockPoints];
  for_blocks<kDots>(im, p0, b, e, bp, [&](int64_t b0, int64_t n, int64_t kg0, int64_t kg1) __attribute__((always_inline)) {
    if constexpr (kDots) {
      for (int q = 0; q < 4; ++q) std::fill(d[q], d[q] + (kg1 - kg0) * n, T(0));
    }
    for (int64_t t = 0; t < n; ++t) {
      const T* grow = gcol + (b0 + t) * CK;
      T* crow = kCol ? col + (b0 + t) * CK : nullptr;
      for_points(Gd, kg0, kg1, [&](int64_t kg, int64_t k, int64_t g) __attribute__((always_inline)) {
        const int64_t pe = (kg - kg0) * n + t;
        const T* x0 = im.x + bp.at[pe];
        T* gi0 = kGin ? gin + bp.at[pe] : nullptr;
        const T w[4] = {bp.w[0][pe], bp.w[1][pe], bp.w[2][pe], bp.w[3][pe]};
        for_channel_runs(p, g, [&](int64_t cb, int64_t dst, int64_t len) __attribute__((always_inline)) {
          const int64_t at = dst + k * cin_g;
          const T* x[4] = {x0 + cb, x0 + cb + Cin, x0 + cb + row, x0 + cb + row + Cin};
          T* const gi[4] = {kGin ? gi0 + cb : nullptr, kGin ? gi0 + cb + Cin : nullptr,
                            kGin ? gi0 + cb + row : nullptr, kGin ? gi0 + cb + row + Cin : nullptr};
          T dt[4] = {T(0), T(0), T(0), T(0)};
          point_channels<kCol, kGin, kDots, T>(x, gi, grow + at, kCol ? crow + at : nullptr, w, len, dt);
          if constexpr (kDots) {
            for (int q = 0; q < 4; ++q) d[q][pe] += dt[q];
          }
        });
      });
    }
    if constexpr (kDots) {
      // As deform_conv2d_offset_mask_grad: the four channel sums combined with the taps' derivatives and weights
      // (0 for a neighbour outside the map), per point, the block's positions contiguous.
      for_points(Gd, kg0, kg1, [&](int64_t kg, int64_t k, int64_t g) __attribute__((always_inline)) {
        const int64_t e0 = (kg - kg0) * n;
        T* gy = goff_n ? goff_n + (g * 2 * K + 2 * k) * P + p0 + b0 : nullptr;
        T* gm = gmask_n ? gmask_n + (g * K + k) * P + p0 + b0 : nullptr;
        for (int64_t t = 0; t < n; ++t) {
          T sy = T(0), sx = T(0), sm = T(0);
          for (int q = 0; q < 4; ++q) {
            sy += bp.dwy[q][e0 + t] * d[q][e0 + t];
            sx += bp.dwx[q][e0 + t] * d[q][e0 + t];
            sm += bp.u[q][e0 + t] * d[q][e0 + t];
          }
          if (gy) {
            gy[t] = sy * bp.m[e0 + t];
            gy[P + t] = sx * bp.m[e0 + t];
          }
          if (gm) gm[t] = sm;
        }
      });
    }
  });
}

// The pass's variant for the gradients asked for (col: grad_weight's columns; gin: grad_input; goff/gmask).
template <typename T>
__attribute__((always_inline)) inline void backward_pass_impl(const PaddedImage<T>& im, const T* gcol, int64_t p0,
                                                              int64_t b, int64_t e, T* col, T* gin, T* goff,
                                                              T* gmask) {
  const bool dots = goff != nullptr || gmask != nullptr;
  const int v = (col ? 4 : 0) + (gin ? 2 : 0) + (dots ? 1 : 0);
  switch (v) {
    case 7: return backward_pass_with<true, true, true>(im, gcol, p0, b, e, col, gin, goff, gmask);
    case 6: return backward_pass_with<true, true, false>(im, gcol, p0, b, e, col, gin, goff, gmask);
    case 5: return backward_pass_with<true, false, true>(im, gcol, p0, b, e, col, gin, goff, gmask);
    case 4: return backward_pass_with<true, false, false>(im, gcol, p0, b, e, col, gin, goff, gmask);
    case 3: return backward_pass_with<false, true, true>(im, gcol, p0, b, e, col, gin, goff, gmask);
    case 2: return backward_pass_with<false, true, false>(im, gcol, p0, b, e, col, gin, goff, gmask);
    case 1: return backward_pass_with<false, false, true>(im, gcol, p0, b, e, col, gin, goff, gmask);
    default: return;
  }
}

DCNKIT_CPU_CLONES void backward_pass_f32(const PaddedImage<float>& im, const float* gcol, int64_t p0, int64_t b,
                                         int64_t e, float* col, float* gin, float* goff, float* gmask) {
  backward_pass_impl<float>(im, gcol, p0, b, e, col, gin, goff, gmask);
}
DCNKIT_CPU_CLONES void backward_pass_f64(const PaddedImage<double>& im, const double* gcol, int64_t p0, int64_t b,
                                         int64_t e, double* col, double* gin, double* goff, double* gmask) {
  backward_pass_impl<double>(im, gcol, p0, b, e, col, gin, goff, gmask);
}
inline void backward_pass(const PaddedImage<float>& im, const float* gcol, int64_t p0, int64_t b, int64_t e,
                          float* col, float* gin, float* goff, float* gmask) {
  backward_pass_f32(im, gcol, p0, b, e, col, gin, goff, gmask);
}
inline void backward_pass(const PaddedImage<double>& im, const double* gcol, int64_t p0, int64_t b, int64_t e,
                          double* col, double* gin, double* goff, double* gmask) {
  backward_pass_f64(im, gcol, p0, b, e, col, gin, goff, gmask);
}

}  // namespace

size_t deform_conv2d_backward_workspace_cpu(const DeformConv2dParams& p, DType dtype, const CpuContext& ctx) {
  return backward_layout(p, dtype, ctx).total();
}

template <typename T>
Status deform_conv2d_backward_cpu(const DeformConv2dParams& p, const T* grad_output, const T* input,
                                  const T* offset, const T* weight, const T* mask, T* grad_input,
                                  T* grad_offset, T* grad_weight, T* grad_bias, T* grad_mask,
                                  void* workspace, const CpuContext& ctx) {
  const DType dt = dtype_of_t<T>();
  const int64_t N = p.batch, P = p.out_spatial();
  const int64_t K = p.kernel_size(), HW = p.height * p.width, Cin = p.in_channels, CK = Cin * K;
  const int64_t Gd = p.attrs.deformable_groups;
  const int64_t G = p.attrs.groups, Cout = p.out_channels, cin_g = p.in_per_group(), cout_g = p.out_per_group();
  const int64_t KC = K * cin_g;  // columns of one conv group
  const int64_t nt = std::max(1, ctx.num_threads);
  if (!mask) grad_mask = nullptr;
  if (cuda_schedule_path()) {
    DCNKIT_RETURN_IF_ERROR(check_deform_conv2d_cuda_launches<T>(
        p, dt, false, mask != nullptr, true, cpu_path() == CpuPath::kCudaScheduleDeterministic, grad_input,
        grad_offset, grad_weight, grad_bias, grad_mask));
    std::vector<T> columns = cuda_schedule_columns<T>(p);
    CpuScheduleExec<T> ex{p, ctx, input, offset, mask, nullptr, grad_output,
                          nullptr, grad_input, grad_offset, grad_bias, grad_mask};
    return deform_conv2d_backward_schedule<T>(p, dt, cuda_schedule_tiling(p), grad_output, weight, mask != nullptr,
                                              grad_input, grad_offset, grad_weight, grad_bias, grad_mask,
                                              columns.data(), ex);
  }

  if (grad_bias) {
    parallel_for(ctx, Cout, [&](int64_t b, int64_t e) {
      for (int64_t co = b; co < e; ++co) {
        T s = T(0);
        for (int64_t n = 0; n < N; ++n) {
          const T* g = grad_output + (n * Cout + co) * P;
          for (int64_t q = 0; q < P; ++q) s += g[q];
        }
        grad_bias[co] = s;
      }
    });
  }
  const bool need_gcol = grad_input || grad_offset || grad_mask;
  if (N == 0 || P == 0 || (!need_gcol && !grad_weight)) {
    if (grad_weight) std::fill(grad_weight, grad_weight + Cout * cin_g * K, T(0));
    if (grad_input) std::fill(grad_input, grad_input + N * Cin * HW, T(0));
    return Status::Ok();
  }

  const BackwardLayout l = backward_layout(p, dt, ctx);
  char* ws = static_cast<char*>(workspace);
  T* x_hwc = reinterpret_cast<T*>(ws);
  ws += l.x_hwc;
  T* gin_hwc = reinterpret_cast<T*>(ws);
  ws += l.gin_hwc;
  T* wt = reinterpret_cast<T*>(ws);
  ws += l.weight_t;
  T* gwt = reinterpret_cast<T*>(ws);
  ws += l.gweight_t;
  T* col = reinterpret_cast<T*>(ws);
  ws += l.col;
  T* gcol = reinterpret_cast<T*>(ws);

  if (elementwise_path()) {
    backward_elementwise(p, grad_output, input, offset, weight, mask, grad_input, grad_offset, grad_weight,
                         grad_mask, gcol);
    return Status::Ok();
  }
  DCNKIT_RETURN_IF_ERROR(check_cpu_sampling_extents("deform_conv2d (backward)", p));
  weight_to_kc(p, weight, wt);
  const PaddedMap map = padded_map(p);
  zero_border(map, x_hwc);  // the images' copies fill the interior only
  const int64_t chunk = backward_chunk(p, sizeof(T));
  const int64_t nbt = backward_tasks(ctx);
  const int64_t gin_stride = static_cast<int64_t>(l.x_hwc / sizeof(T));  // between the tasks' buffers
  std::vector<Status> statuses(static_cast<size_t>(std::max(nt, nbt)));
  bool first_weight_step = true;

  for (int64_t n = 0; n < N; ++n) {
    const T* off_n = offset + n * 2 * Gd * K * P;
    const T* mask_n = mask ? mask + n * Gd * K * P : nullptr;
    const T* gout_n = grad_output + n * Cout * P;
    T* goff_n = grad_offset ? grad_offset + n * 2 * Gd * K * P : nullptr;
    T* gmask_n = grad_mask ? grad_mask + n * Gd * K * P : nullptr;
    parallel_for(ctx, p.height + 3, [&](int64_t b, int64_t e) {
      to_padded_channels_last(input + n * Cin * HW, map, x_hwc, std::min(b, p.height), std::min(e, p.height));
      if (grad_input) {  // the tasks' padded buffers, border included, rows [b, e)
        const int64_t row = map.cols() * Cin;
        for (int64_t task = 0; task < nbt; ++task)
          std::fill(gin_hwc + task * gin_stride + b * row, gin_hwc + task * gin_stride + e * row, T(0));
      }
    });
    const PaddedImage<T> im{&p, map, x_hwc, off_n, mask_n};

    for (int64_t p0 = 0; p0 < P; p0 += chunk) {
      const int64_t pc = std::min(chunk, P - p0);
      if (need_gcol) {
        // 1. Per task, a contiguous range of the chunk's positions: grad_col (rows x Cin*K) = grad_out^T x
        // weight, then one pass over the range's sampling points (backward_pass): the columns (for
        // step 2), the task's grad_input scatter, grad_offset / grad_mask.
        const int64_t parts = std::min<int64_t>(nbt, pc);
        parallel_tasks(ctx, parts, [&](int64_t task) {
          int64_t tb, te;
          split_range(pc, parts, task, &tb, &te);
          if (tb >= te) return;
          GemmArgs ga;
          ga.dtype = dt;
          ga.trans_a = true;
          ga.m = te - tb;
          ga.n = KC;
          ga.k = cout_g;
          ga.beta = 0.f;
          ga.a = gout_n + p0 + tb;
          ga.lda = P;
          ga.stride_a = cout_g * P;
          ga.b = wt;
          ga.ldb = KC;
          ga.stride_b = cout_g * KC;
          ga.c = gcol + tb * CK;
          ga.ldc = CK;
          ga.stride_c = KC;
          ga.batch = G;
          Status s = ctx.run_gemm(ga);
          if (!s.ok()) {
            statuses[static_cast<size_t>(task)] = s;
            return;
          }
          backward_pass(im, gcol, p0, tb, te, grad_weight ? col : nullptr,
                        grad_input ? gin_hwc + task * gin_stride : nullptr, goff_n, gmask_n);
        });
        DCNKIT_RETURN_IF_ERROR(first_error(statuses));
      } else {
        parallel_for(ctx, pc, [&](int64_t b, int64_t e) { build_columns(im, p0 + b, e - b, col + b * CK); });
      }
      // 2. grad_weight (as (Cout, K, Cin_g)) += grad_out x columns, rows of Cout split over tasks.
      if (grad_weight) {
        const float beta = first_weight_step ? 0.f : 1.f;
        const int64_t parts = std::min<int64_t>(nt, Cout);
        parallel_tasks(ctx, parts, [&](int64_t task) {
          int64_t rb, re;
          split_range(Cout, parts, task, &rb, &re);
          for (int64_t gc = 0; gc < G && rb < re; ++gc) {
            const int64_t lo = std::max(rb, gc * cout_g), hi = std::min(re, (gc + 1) * cout_g);
            if (lo >= hi) continue;
            GemmArgs ga;
            ga.dtype = dt;
            ga.m = hi - lo;
            ga.n = KC;
            ga.k = pc;
            ga.beta = beta;
            ga.a = gout_n + lo * P + p0;
            ga.lda = P;
            ga.b = col + gc * KC;
            ga.ldb = CK;
            ga.c = gwt + lo * KC;
            ga.ldc = KC;
            Status s = ctx.run_gemm(ga);
            if (!s.ok()) {
              statuses[static_cast<size_t>(task)] = s;
              return;
            }
          }
        });
        DCNKIT_RETURN_IF_ERROR(first_error(statuses));
        first_weight_step = false;
      }
    }
    if (grad_input) {
      // The tasks' buffers summed in task order, to channels-first.
      T* gin_n = grad_input + n * Cin * HW;
      parallel_for(ctx, Cin, [&](int64_t b, int64_t e) {
        from_padded_channels_last<false>(gin_hwc, map, gin_n, b, e);
        for (int64_t task = 1; task < nbt; ++task) {
          from_padded_channels_last<true>(gin_hwc + task * gin_stride, map, gin_n, b, e);
        }
      });
    }
  }
  if (grad_weight) weight_from_kc(p, gwt, grad_weight);
  return Status::Ok();
}

template Status deform_conv2d_backward_cpu<float>(const DeformConv2dParams&, const float*, const float*,
                                                  const float*, const float*, const float*, float*, float*,
                                                  float*, float*, float*, void*, const CpuContext&);
template Status deform_conv2d_backward_cpu<double>(const DeformConv2dParams&, const double*, const double*,
                                                   const double*, const double*, const double*, double*, double*,
                                                   double*, double*, double*, void*, const CpuContext&);

}  // namespace dcnkit
