// DeformConv2d CPU backward launcher (float32, float64); the layout is described in deform_conv2d_cpu_common.h.
#include <atomic>

#include "deform_conv2d_cpu_common.h"
#include "deform_conv2d_cpu_test_paths.h"

namespace dcnkit {
namespace {

// d[q] = sum_c g[c] * x_q[c] for c < n, in a fixed order (blocks of kLanes independent partial sums,
// which vectorise without reassociation, summed pairwise, then the tail).
template <typename T>
__attribute__((always_inline)) inline void dots4(const T* __restrict g, const T* __restrict x0,
                                                 const T* __restrict x1, const T* __restrict x2,
                                                 const T* __restrict x3, int64_t n, T d[4]) {
  constexpr int kLanes = 16;
  T a0[kLanes] = {}, a1[kLanes] = {}, a2[kLanes] = {}, a3[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const T gj = g[c + j];
      a0[j] += gj * x0[c + j];
      a1[j] += gj * x1[c + j];
      a2[j] += gj * x2[c + j];
      a3[j] += gj * x3[c + j];
    }
  }
  // Lanes summed pairwise (halving steps vectorise; the order is fixed).
  for (int h = kLanes / 2; h >= 1; h /= 2) {
    for (int j = 0; j < h; ++j) {
      a0[j] += a0[j + h];
      a1[j] += a1[j + h];
      a2[j] += a2[j + h];
      a3[j] += a3[j + h];
    }
  }
  T s0 = a0[0], s1 = a1[0], s2 = a2[0], s3 = a3[0];
  for (; c < n; ++c) {
    s0 += g[c] * x0[c];
    s1 += g[c] * x1[c];
    s2 += g[c] * x2[c];
    s3 += g[c] * x3[c];
  }
  d[0] += s0;
  d[1] += s1;
  d[2] += s2;
  d[3] += s3;
}

// dots4 over the neighbours inside the map (ok) only: d[q] += sum_c g[c] * x_q[c]; a neighbour outside the
// map is not read (its d[q] stays as it is).
template <typename T>
__attribute__((always_inline)) inline void dots_taps(const T* __restrict g, const T* const x[4], const bool ok[4],
                                                     int64_t n, T d[4]) {
  if (ok[0] && ok[1] && ok[2] && ok[3]) {
    dots4<T>(g, x[0], x[1], x[2], x[3], n, d);
    return;
  }
  for (int q = 0; q < 4; ++q) {
    if (!ok[q]) continue;
    const T* __restrict xq = x[q];
    T s = T(0);
    for (int64_t c = 0; c < n; ++c) s += g[c] * xq[c];
    d[q] += s;
  }
}

// One pass over the positions p0+b .. p0+e of a backward chunk (every k, g), each sampling point's
// taps computed once and its four input rows read once for:
//   col (if not null): the chunk's columns (rows b..e), as build_columns writes them;
//   gin (if not null): this task's channels-last grad_input += the scatter of the column gradient;
//   goff_n / gmask_n (if not null): grad_offset / grad_mask, the group's channel sums (dots4).
template <typename T>
__attribute__((always_inline)) inline void backward_pass_impl(const CpuImage<T>& im, const T* gcol, int64_t p0,
                                                              int64_t b, int64_t e, T* col, T* gin, T* goff_n,
                                                              T* gmask_n) {
  const DeformConv2dParams& p = *im.p;
  const int64_t K = p.kernel_size(), Cin = p.in_channels, CK = Cin * K, P = p.out_spatial();
  const int64_t Gd = p.attrs.deformable_groups, cpg = p.in_per_deformable_group(), cin_g = p.in_per_group();
  const int64_t KC = K * cin_g;
  const bool dots = goff_n != nullptr || gmask_n != nullptr;
  int64_t ho = (p0 + b) / p.out_w, wo = (p0 + b) - ho * p.out_w;
  for (int64_t t = b; t < e; ++t) {
    const int64_t pos = p0 + t;
    const T* grow = gcol + t * CK;
    T* crow = col ? col + t * CK : nullptr;
    for (int64_t i = 0, k = 0; i < p.kernel_h; ++i) {
      for (int64_t j = 0; j < p.kernel_w; ++j, ++k) {
        for (int64_t g = 0; g < Gd; ++g) {
          T py, px, m;
          deform_conv2d_point_at<T, T>(p, im.offset, im.mask, g, k, i, j, ho, wo, pos, &py, &px, &m);
          const Taps<T> tp = dcn_taps<T>(py, px, p.height, p.width);
          // As masked_taps.
          T w[4];
          for (int q = 0; q < 4; ++q) w[q] = tp.inside ? tp.w[q] * m : T(0);
          T d[4] = {T(0), T(0), T(0), T(0)};
          // The group's channels, cut at conv-group borders.
          for (int64_t cb = g * cpg, cend = (g + 1) * cpg; cb < cend;) {
            const int64_t gc = cb / cin_g;
            const int64_t ce = std::min(cend, (gc + 1) * cin_g);
            const int64_t at = gc * KC + k * cin_g + (cb - gc * cin_g), len = ce - cb;
            const T* x[4];
            tap_rows(im.x_hwc + cb, Cin, tp, x);
            if (crow) blend_taps<T>(crow + at, x, w, tp.ok, len);
            if (tp.inside) {
              if (dots) dots_taps<T>(grow + at, x, tp.ok, len, d);
              if (gin) {
                const T* __restrict src = grow + at;
                for (int q = 0; q < 4; ++q) {
                  const T wq = w[q];
                  if (!tp.ok[q] || wq == T(0)) continue;
                  T* __restrict dst = gin + tp.idx[q] * Cin + cb;
                  for (int64_t c = 0; c < len; ++c) dst[c] += wq * src[c];
                }
              }
            }
            cb = ce;
          }
          if (!dots) continue;
          T gy = T(0), gx = T(0), gm = T(0);
          if (tp.inside) {
            // As taps_channel_dots: combine the four channel sums with the tap weights / derivatives.
            for (int q = 0; q < 4; ++q) {
              if (!tp.ok[q]) continue;  // d[q] = 0: not read
              gy += tp.dwy[q] * d[q];
              gx += tp.dwx[q] * d[q];
              gm += tp.w[q] * d[q];
            }
          }
          if (goff_n) {
            goff_n[(g * 2 * K + 2 * k) * P + pos] = gy * m;
            goff_n[(g * 2 * K + 2 * k + 1) * P + pos] = gx * m;
          }
          if (gmask_n) gmask_n[(g * K + k) * P + pos] = gm;
        }
      }
    }
    if (++wo == p.out_w) {
      wo = 0;
      ++ho;
    }
  }
}

DCNKIT_CPU_CLONES void backward_pass_f32(const CpuImage<float>& im, const float* gcol, int64_t p0, int64_t b,
                                         int64_t e, float* col, float* gin, float* goff, float* gmask) {
  backward_pass_impl<float>(im, gcol, p0, b, e, col, gin, goff, gmask);
}
DCNKIT_CPU_CLONES void backward_pass_f64(const CpuImage<double>& im, const double* gcol, int64_t p0, int64_t b,
                                         int64_t e, double* col, double* gin, double* goff, double* gmask) {
  backward_pass_impl<double>(im, gcol, p0, b, e, col, gin, goff, gmask);
}
inline void backward_pass(const CpuImage<float>& im, const float* gcol, int64_t p0, int64_t b, int64_t e,
                          float* col, float* gin, float* goff, float* gmask) {
  backward_pass_f32(im, gcol, p0, b, e, col, gin, goff, gmask);
}
inline void backward_pass(const CpuImage<double>& im, const double* gcol, int64_t p0, int64_t b, int64_t e,
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
  weight_to_kc(p, weight, wt);
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
    parallel_for(ctx, HW, [&](int64_t b, int64_t e) {
      to_channels_last(input + n * Cin * HW, x_hwc, Cin, HW, b, e);
      if (grad_input) {
        for (int64_t task = 0; task < nbt; ++task)
          std::fill(gin_hwc + task * gin_stride + b * Cin, gin_hwc + task * gin_stride + e * Cin, T(0));
      }
    });
    const CpuImage<T> im{&p, x_hwc, off_n, mask_n};

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
        to_channels_first<false>(gin_hwc, gin_n, Cin, HW, b, e);
        for (int64_t task = 1; task < nbt; ++task) {
          to_channels_first<true>(gin_hwc + task * gin_stride, gin_n, Cin, HW, b, e);
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
