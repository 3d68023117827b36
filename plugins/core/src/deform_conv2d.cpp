// DeformConv2d: parameter validation and the CPU launchers (float32, float64).
//
// Forward: tiles of output positions per task. For a tile, the column tile (Cin*K x tile) is built in
// the task's workspace slot (taps computed once per deformable group, kernel point and position, reused
// for every channel of the group), then multiplied into the output by one strided-batched GEMM over the
// convolution groups (ldc = Ho*Wo), the bias written first.
// Backward: per image and chunk of positions, race-free parallel steps (each writes disjoint memory),
// hence deterministic for a given number of threads.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "dcnkit/deform_conv2d.h"
#include "dcnkit/deform_conv2d_kernels.h"

namespace dcnkit {

namespace {

std::string pair_str(int64_t a, int64_t b) { return "(" + std::to_string(a) + ", " + std::to_string(b) + ")"; }

// floor(a / b) for b > 0.
int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

}  // namespace

Status make_deform_conv2d_params(const char* op, const Shape& input, const Shape& offset,
                                 const Shape& weight, const Shape* bias, const Shape* mask,
                                 const DeformConv2dAttrs& a, DeformConv2dParams* p) {
  DCNKIT_RETURN_IF_ERROR(check_rank(op, "input", input, 4, "(N, Cin, H, W)"));
  DCNKIT_RETURN_IF_ERROR(check_rank(op, "offset", offset, 4, "(N, 2*deformable_groups*kh*kw, Ho, Wo)"));
  DCNKIT_RETURN_IF_ERROR(check_rank(op, "weight", weight, 4, "(Cout, Cin/groups, kh, kw)"));
  if (mask) DCNKIT_RETURN_IF_ERROR(check_rank(op, "mask", *mask, 4, "(N, deformable_groups*kh*kw, Ho, Wo)"));
  if (bias) DCNKIT_RETURN_IF_ERROR(check_rank(op, "bias", *bias, 1, "(Cout)"));

  if (a.stride_h < 1 || a.stride_w < 1)
    return arg_error(op, "stride", "values >= 1", pair_str(a.stride_h, a.stride_w));
  if (a.pad_h < 0 || a.pad_w < 0)
    return arg_error(op, "padding", "values >= 0", pair_str(a.pad_h, a.pad_w));
  if (a.dilation_h < 1 || a.dilation_w < 1)
    return arg_error(op, "dilation", "values >= 1", pair_str(a.dilation_h, a.dilation_w));
  if (a.groups < 1) return arg_error(op, "groups", ">= 1", std::to_string(a.groups));
  if (a.deformable_groups < 1)
    return arg_error(op, "deformable_groups", ">= 1", std::to_string(a.deformable_groups));

  const int64_t N = input[0], Cin = input[1], H = input[2], W = input[3];
  const int64_t Cout = weight[0], kh = weight[2], kw = weight[3];
  if (Cin < 1) return arg_error(op, "input", "at least 1 channel (dim 1)", shape_str(input));
  if (H < 1 || W < 1)
    return arg_error(op, "input", "height and width >= 1", "shape " + shape_str(input));
  if (kh < 1 || kw < 1)
    return arg_error(op, "weight", "kernel size (dims 2, 3) >= 1", "shape " + shape_str(weight));
  if (Cin % a.groups != 0)
    return arg_error(op, "input", "channels divisible by groups = " + std::to_string(a.groups),
                     std::to_string(Cin) + " channels");
  if (Cin % a.deformable_groups != 0)
    return arg_error(op, "input",
                     "channels divisible by deformable_groups = " + std::to_string(a.deformable_groups),
                     std::to_string(Cin) + " channels");
  if (Cout % a.groups != 0)
    return arg_error(op, "weight",
                     "output channels (dim 0) divisible by groups = " + std::to_string(a.groups),
                     std::to_string(Cout) + " (shape " + shape_str(weight) + ")");
  DCNKIT_RETURN_IF_ERROR(check_dim(op, "weight", weight, 1, Cin / a.groups, "Cin/groups"));

  const int64_t num_h = H + 2 * a.pad_h - (a.dilation_h * (kh - 1) + 1);
  const int64_t num_w = W + 2 * a.pad_w - (a.dilation_w * (kw - 1) + 1);
  const int64_t Ho = floor_div(num_h, a.stride_h) + 1, Wo = floor_div(num_w, a.stride_w) + 1;
  if (Ho < 1 || Wo < 1)
    return arg_error(op, "input",
                     "padded size (H + 2*pad, W + 2*pad) at least the dilated kernel size " +
                         pair_str(a.dilation_h * (kh - 1) + 1, a.dilation_w * (kw - 1) + 1),
                     pair_str(H + 2 * a.pad_h, W + 2 * a.pad_w) + " (output size would be " +
                         pair_str(Ho, Wo) + ")");

  const int64_t K = kh * kw;
  const int64_t Gd = a.deformable_groups;
  DCNKIT_RETURN_IF_ERROR(check_dim(op, "offset", offset, 0, N, "N of input"));
  DCNKIT_RETURN_IF_ERROR(check_dim(op, "offset", offset, 1, 2 * Gd * K, "2*deformable_groups*kh*kw"));
  DCNKIT_RETURN_IF_ERROR(check_dim(op, "offset", offset, 2, Ho, "output height"));
  DCNKIT_RETURN_IF_ERROR(check_dim(op, "offset", offset, 3, Wo, "output width"));
  if (mask) {
    DCNKIT_RETURN_IF_ERROR(check_dim(op, "mask", *mask, 0, N, "N of input"));
    DCNKIT_RETURN_IF_ERROR(check_dim(op, "mask", *mask, 1, Gd * K, "deformable_groups*kh*kw"));
    DCNKIT_RETURN_IF_ERROR(check_dim(op, "mask", *mask, 2, Ho, "output height"));
    DCNKIT_RETURN_IF_ERROR(check_dim(op, "mask", *mask, 3, Wo, "output width"));
  }
  if (bias) DCNKIT_RETURN_IF_ERROR(check_dim(op, "bias", *bias, 0, Cout, "Cout of weight"));

  p->attrs = a;
  p->batch = N;
  p->in_channels = Cin;
  p->height = H;
  p->width = W;
  p->out_channels = Cout;
  p->kernel_h = kh;
  p->kernel_w = kw;
  p->out_h = Ho;
  p->out_w = Wo;
  p->has_bias = bias != nullptr;
  p->has_mask = mask != nullptr;
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// CPU

namespace {

// Bytes of a forward column tile (Cin*K x tile): about what stays in a core's L2 with the taps.
constexpr size_t kForwardTileBytes = size_t(256) << 10;
// Bytes of a backward column chunk (Cin*K x chunk), for the columns and for their gradient.
constexpr size_t kBackwardChunkBytes = size_t(2) << 20;

int64_t tile_bytes_override(const char* name, int64_t dflt) {
  const char* e = std::getenv(name);
  if (e == nullptr) return dflt;
  const long long v = std::atoll(e);
  return v > 0 ? static_cast<int64_t>(v) : dflt;
}

// Output positions per forward tile.
int64_t forward_tile(const DeformConv2dParams& p, size_t elem) {
  static const int64_t bytes = tile_bytes_override("DCNKIT_DCN_TILE_BYTES", kForwardTileBytes);
  const int64_t P = p.out_spatial();
  const int64_t row = std::max<int64_t>(1, p.in_channels * p.kernel_size()) * static_cast<int64_t>(elem);
  int64_t t = bytes / row;
  t = t >= 64 ? t / 16 * 16 : 64;
  return std::max<int64_t>(1, std::min(t, P));
}

// Output positions per backward chunk.
int64_t backward_chunk(const DeformConv2dParams& p, size_t elem) {
  static const int64_t bytes = tile_bytes_override("DCNKIT_DCN_BWD_CHUNK_BYTES", kBackwardChunkBytes);
  const int64_t P = p.out_spatial();
  const int64_t row = std::max<int64_t>(1, p.in_channels * p.kernel_size()) * static_cast<int64_t>(elem);
  int64_t t = bytes / row;
  t = t >= 64 ? t / 16 * 16 : 64;
  return std::max<int64_t>(1, std::min(t, P));
}

size_t taps_bytes(DType dtype) { return dtype == DType::kFloat64 ? sizeof(SampleTaps<double>) : sizeof(SampleTaps<float>); }

size_t forward_slot_bytes(const DeformConv2dParams& p, DType dtype) {
  const size_t e = dtype_size(dtype);
  const int64_t T = forward_tile(p, e);
  return align_up(static_cast<size_t>(p.in_channels * p.kernel_size() * T) * e) +
         align_up(static_cast<size_t>(T) * taps_bytes(dtype));
}

template <typename T>
DType dtype_of_t();
template <>
DType dtype_of_t<float>() { return DType::kFloat32; }
template <>
DType dtype_of_t<double>() { return DType::kFloat64; }

template <typename T>
struct PlainAdd {
  void operator()(T* dst, T v) const { *dst += v; }
};

// Splits [0, n) into `parts` near-equal contiguous ranges; range of part t.
inline void split_range(int64_t n, int64_t parts, int64_t t, int64_t* b, int64_t* e) {
  const int64_t q = n / parts, r = n % parts;
  *b = t * q + std::min(t, r);
  *e = *b + q + (t < r ? 1 : 0);
}

}  // namespace

size_t deform_conv2d_forward_workspace_cpu(const DeformConv2dParams& p, DType dtype, int num_threads) {
  return static_cast<size_t>(std::max(1, num_threads)) * forward_slot_bytes(p, dtype);
}

size_t deform_conv2d_backward_workspace_cpu(const DeformConv2dParams& p, DType dtype, int /*num_threads*/) {
  const size_t e = dtype_size(dtype);
  const int64_t C = backward_chunk(p, e);
  const size_t rows = static_cast<size_t>(p.in_channels * p.kernel_size());
  return align_up(static_cast<size_t>(p.attrs.deformable_groups * p.kernel_size() * C) * taps_bytes(dtype)) +
         2 * align_up(rows * static_cast<size_t>(C) * e);
}

template <typename T>
Status deform_conv2d_forward_cpu(const DeformConv2dParams& p, const T* input, const T* offset,
                                 const T* weight, const T* bias, const T* mask, T* output,
                                 void* workspace, const CpuContext& ctx) {
  const int64_t N = p.batch, P = p.out_spatial();
  if (N == 0 || p.out_channels == 0 || P == 0) return Status::Ok();
  const DType dt = dtype_of_t<T>();
  const int64_t K = p.kernel_size(), HW = p.height * p.width;
  const int64_t Cin = p.in_channels, Gd = p.attrs.deformable_groups, cpg = p.in_per_deformable_group();
  const int64_t G = p.attrs.groups, Cout = p.out_channels, Cin_g = p.in_per_group(), Cout_g = p.out_per_group();
  const int64_t tile = forward_tile(p, sizeof(T));
  const int64_t ntiles = (P + tile - 1) / tile;
  const int64_t items = N * ntiles;
  const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(ctx.num_threads, items));
  const size_t slot = forward_slot_bytes(p, dt);
  const size_t col_bytes = align_up(static_cast<size_t>(Cin * K * tile) * sizeof(T));
  const int64_t off_n_stride = 2 * Gd * K * P, mask_n_stride = Gd * K * P;

  std::vector<Status> statuses(static_cast<size_t>(tasks));
  parallel_tasks(ctx, tasks, [&](int64_t task) {
    char* base = static_cast<char*>(workspace) + static_cast<size_t>(task) * slot;
    T* col = reinterpret_cast<T*>(base);
    SampleTaps<T>* taps = reinterpret_cast<SampleTaps<T>*>(base + col_bytes);
    int64_t ib, ie;
    split_range(items, tasks, task, &ib, &ie);
    for (int64_t item = ib; item < ie; ++item) {
      const int64_t n = item / ntiles, p0 = (item % ntiles) * tile;
      const int64_t tn = std::min(tile, P - p0);
      const T* x_n = input + n * Cin * HW;
      const T* off_n = offset + n * off_n_stride;
      const T* mask_n = mask ? mask + n * mask_n_stride : nullptr;
      for (int64_t g = 0; g < Gd; ++g) {
        for (int64_t k = 0; k < K; ++k) {
          for (int64_t t = 0; t < tn; ++t)
            taps[t] = deform_conv2d_sample_taps<T, T>(p, off_n, mask_n, g, k, p0 + t);
          for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) {
            const T* img = x_n + c * HW;
            T* row = col + (c * K + k) * tn;
            for (int64_t t = 0; t < tn; ++t) row[t] = sample_value<T, T>(img, taps[t]);
          }
        }
      }
      T* out = output + n * Cout * P + p0;
      if (bias) {
        for (int64_t co = 0; co < Cout; ++co) std::fill(out + co * P, out + co * P + tn, bias[co]);
      }
      GemmArgs ga;
      ga.dtype = dt;
      ga.m = Cout_g;
      ga.n = tn;
      ga.k = Cin_g * K;
      ga.alpha = 1.f;
      ga.beta = bias ? 1.f : 0.f;
      ga.a = weight;
      ga.lda = Cin_g * K;
      ga.stride_a = Cout_g * Cin_g * K;
      ga.b = col;
      ga.ldb = tn;
      ga.stride_b = Cin_g * K * tn;
      ga.c = out;
      ga.ldc = P;
      ga.stride_c = Cout_g * P;
      ga.batch = G;
      Status s = ctx.run_gemm(ga);
      if (!s.ok()) {
        statuses[static_cast<size_t>(task)] = s;
        return;
      }
    }
  });
  for (const Status& s : statuses) DCNKIT_RETURN_IF_ERROR(s);
  return Status::Ok();
}

template <typename T>
Status deform_conv2d_backward_cpu(const DeformConv2dParams& p, const T* grad_output, const T* input,
                                  const T* offset, const T* weight, const T* mask, T* grad_input,
                                  T* grad_offset, T* grad_weight, T* grad_bias, T* grad_mask,
                                  void* workspace, const CpuContext& ctx) {
  const DType dt = dtype_of_t<T>();
  const int64_t N = p.batch, P = p.out_spatial();
  const int64_t K = p.kernel_size(), HW = p.height * p.width;
  const int64_t Cin = p.in_channels, Gd = p.attrs.deformable_groups, cpg = p.in_per_deformable_group();
  const int64_t G = p.attrs.groups, Cout = p.out_channels, Cin_g = p.in_per_group(), Cout_g = p.out_per_group();
  const int64_t nt = std::max(1, ctx.num_threads);
  if (!mask) grad_mask = nullptr;

  // Gradients are written, not accumulated: clear what no step below overwrites completely.
  if (grad_input) {
    parallel_for(ctx, N * Cin, [&](int64_t b, int64_t e) {
      std::fill(grad_input + b * HW, grad_input + e * HW, T(0));
    });
  }
  if (grad_weight && (N == 0 || P == 0)) std::fill(grad_weight, grad_weight + Cout * Cin_g * K, T(0));
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
  if (N == 0 || P == 0 || (!need_gcol && !grad_weight)) return Status::Ok();

  const int64_t chunk = backward_chunk(p, sizeof(T));
  char* ws = static_cast<char*>(workspace);
  SampleTaps<T>* taps = reinterpret_cast<SampleTaps<T>*>(ws);
  ws += align_up(static_cast<size_t>(Gd * K * chunk) * sizeof(SampleTaps<T>));
  T* col = reinterpret_cast<T*>(ws);
  ws += align_up(static_cast<size_t>(Cin * K * chunk) * sizeof(T));
  T* gcol = reinterpret_cast<T*>(ws);

  std::vector<Status> statuses(static_cast<size_t>(nt));
  auto first_error = [&]() -> Status {
    for (const Status& s : statuses)
      if (!s.ok()) return s;
    return Status::Ok();
  };

  bool first_weight_step = true;
  for (int64_t n = 0; n < N; ++n) {
    const T* x_n = input + n * Cin * HW;
    const T* off_n = offset + n * 2 * Gd * K * P;
    const T* mask_n = mask ? mask + n * Gd * K * P : nullptr;
    const T* gout_n = grad_output + n * Cout * P;
    T* gin_n = grad_input ? grad_input + n * Cin * HW : nullptr;
    for (int64_t p0 = 0; p0 < P; p0 += chunk) {
      const int64_t pc = std::min(chunk, P - p0);
      // 1. taps of every (g, k, position) of the chunk.
      if (grad_weight || grad_input) {
        parallel_for(ctx, Gd * K * pc, [&](int64_t b, int64_t e) {
          for (int64_t it = b; it < e; ++it) {
            const int64_t gk = it / pc, t = it - gk * pc;
            taps[it] = deform_conv2d_sample_taps<T, T>(p, off_n, mask_n, gk / K, gk % K, p0 + t);
          }
        });
      }
      // 2. grad_weight += grad_out x columns^T (columns recomputed), rows of Cout split over tasks.
      if (grad_weight) {
        parallel_for(ctx, Cin * K, [&](int64_t b, int64_t e) {
          for (int64_t r = b; r < e; ++r) {
            const int64_t c = r / K, k = r - c * K, g = c / cpg;
            const T* img = x_n + c * HW;
            const SampleTaps<T>* tp = taps + (g * K + k) * pc;
            T* row = col + r * pc;
            for (int64_t t = 0; t < pc; ++t) row[t] = sample_value<T, T>(img, tp[t]);
          }
        });
        const float beta = first_weight_step ? 0.f : 1.f;
        const int64_t parts = std::min<int64_t>(nt, Cout);
        parallel_tasks(ctx, parts, [&](int64_t task) {
          int64_t rb, re;
          split_range(Cout, parts, task, &rb, &re);
          for (int64_t g = 0; g < G && rb < re; ++g) {
            const int64_t lo = std::max(rb, g * Cout_g), hi = std::min(re, (g + 1) * Cout_g);
            if (lo >= hi) continue;
            GemmArgs ga;
            ga.dtype = dt;
            ga.trans_b = true;
            ga.m = hi - lo;
            ga.n = Cin_g * K;
            ga.k = pc;
            ga.beta = beta;
            ga.a = gout_n + lo * P + p0;
            ga.lda = P;
            ga.b = col + g * Cin_g * K * pc;
            ga.ldb = pc;
            ga.c = grad_weight + lo * Cin_g * K;
            ga.ldc = Cin_g * K;
            Status s = ctx.run_gemm(ga);
            if (!s.ok()) {
              statuses[static_cast<size_t>(task)] = s;
              return;
            }
          }
        });
        DCNKIT_RETURN_IF_ERROR(first_error());
        first_weight_step = false;
      }
      if (!need_gcol) continue;
      // 3. grad_col = W^T x grad_out, rows of Cin*K split over tasks.
      {
        const int64_t rows = Cin * K;
        const int64_t parts = std::min<int64_t>(nt, rows);
        parallel_tasks(ctx, parts, [&](int64_t task) {
          int64_t rb, re;
          split_range(rows, parts, task, &rb, &re);
          for (int64_t g = 0; g < G && rb < re; ++g) {
            const int64_t lo = std::max(rb, g * Cin_g * K), hi = std::min(re, (g + 1) * Cin_g * K);
            if (lo >= hi) continue;
            GemmArgs ga;
            ga.dtype = dt;
            ga.trans_a = true;
            ga.m = hi - lo;
            ga.n = pc;
            ga.k = Cout_g;
            ga.beta = 0.f;
            ga.a = weight + g * Cout_g * Cin_g * K + (lo - g * Cin_g * K);
            ga.lda = Cin_g * K;
            ga.b = gout_n + g * Cout_g * P + p0;
            ga.ldb = P;
            ga.c = gcol + lo * pc;
            ga.ldc = pc;
            Status s = ctx.run_gemm(ga);
            if (!s.ok()) {
              statuses[static_cast<size_t>(task)] = s;
              return;
            }
          }
        });
        DCNKIT_RETURN_IF_ERROR(first_error());
      }
      // 4. grad_input: a task owns whole input channels (race-free, deterministic).
      if (gin_n) {
        parallel_for(ctx, Cin, [&](int64_t b, int64_t e) {
          for (int64_t c = b; c < e; ++c) {
            const int64_t g = c / cpg;
            T* gimg = gin_n + c * HW;
            for (int64_t k = 0; k < K; ++k) {
              const SampleTaps<T>* tp = taps + (g * K + k) * pc;
              const T* grow = gcol + (c * K + k) * pc;
              for (int64_t t = 0; t < pc; ++t) sample_scatter<T, T>(gimg, tp[t], grow[t], PlainAdd<T>());
            }
          }
        });
      }
      // 5. grad_offset / grad_mask per (g, k, position), summed over the group's channels.
      if (grad_offset || grad_mask) {
        T* goff_n = grad_offset ? grad_offset + n * 2 * Gd * K * P : nullptr;
        T* gmask_n = grad_mask ? grad_mask + n * Gd * K * P : nullptr;
        parallel_for(ctx, Gd * K * pc, [&](int64_t b, int64_t e) {
          for (int64_t it = b; it < e; ++it) {
            const int64_t gk = it / pc, t = it - gk * pc;
            const int64_t g = gk / K, k = gk - g * K, pos = p0 + t;
            T gy, gx, gm;
            deform_conv2d_offset_mask_grad<T, T>(p, x_n, off_n, mask_n, gcol + t, pc, g, k, pos, &gy,
                                                 &gx, &gm);
            if (goff_n) {
              goff_n[(g * 2 * K + 2 * k) * P + pos] = gy;
              goff_n[(g * 2 * K + 2 * k + 1) * P + pos] = gx;
            }
            if (gmask_n) gmask_n[(g * K + k) * P + pos] = gm;
          }
        });
      }
    }
  }
  return Status::Ok();
}

#define DCNKIT_INSTANTIATE(T)                                                                       \
  template Status deform_conv2d_forward_cpu<T>(const DeformConv2dParams&, const T*, const T*,      \
                                               const T*, const T*, const T*, T*, void*,            \
                                               const CpuContext&);                                 \
  template Status deform_conv2d_backward_cpu<T>(const DeformConv2dParams&, const T*, const T*,     \
                                                const T*, const T*, const T*, T*, T*, T*, T*, T*,  \
                                                void*, const CpuContext&);
DCNKIT_INSTANTIATE(float)
DCNKIT_INSTANTIATE(double)
#undef DCNKIT_INSTANTIATE

}  // namespace dcnkit
