// DeformConv2d: parameter validation and the CPU launchers (float32, float64).
//
// The CPU launchers work channels-last: each image is copied to (H, W, Cin) in the workspace and
// column tiles are position-major, [t][conv group][k][channel of the group], so that every sampling
// point's taps (computed once per deformable group, kernel point and position) are applied to a
// contiguous run of channels (vectorised loops), and the weight is used as (Cout, K, Cin/groups).
// Forward: per image, tiles of output positions per task; a tile's columns (~512 KB) are built in the task's
// workspace slot and multiplied into the output (ldc = Ho*Wo) by one strided-batched GEMM over the
// convolution groups, the bias written first. The whole column matrix never exists.
// Backward: per image and chunk of positions, each task takes a contiguous range of the chunk's
// positions: its column-gradient rows (GEMM), then one pass over their sampling points (columns for
// grad_weight, grad_offset/grad_mask, and the scatter into the task's own channels-last grad_input
// buffer, the buffers summed in task order per image); then the grad_weight GEMM, rows split over tasks.
// Every step writes disjoint memory, hence deterministic for a given number of threads.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "dcnkit/deform_conv2d.h"
#include "dcnkit/deform_conv2d_kernels.h"

namespace dcnkit {

namespace {

std::string pair_str(int64_t a, int64_t b) { return "(" + std::to_string(a) + ", " + std::to_string(b) + ")"; }

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

  const int64_t Ho = deform_conv2d_out_size(H, kh, a.stride_h, a.pad_h, a.dilation_h);
  const int64_t Wo = deform_conv2d_out_size(W, kw, a.stride_w, a.pad_w, a.dilation_w);
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

// Bytes of a forward column tile (tile x Cin*K). Measured on a 2-core Xeon (2 MB L2 per core): 512 KB
// beat 128/256 KB (tiles of >= 48 positions keep the GEMM efficient when Cin*K is large) and 1 MB.
// Developer knobs for tuning on other machines: DCNKIT_DCN_TILE_BYTES, DCNKIT_DCN_BWD_CHUNK_BYTES
// (read once per process, so workspace sizes and launchers agree).
constexpr int64_t kForwardTileBytes = int64_t(512) << 10;
// Bytes of a backward column chunk (chunk x Cin*K), for the columns and for their gradient (1-8 MB
// measured equal within noise).
constexpr int64_t kBackwardChunkBytes = int64_t(2) << 20;

int64_t bytes_override(const char* name, int64_t dflt) {
  const char* e = std::getenv(name);
  if (e == nullptr) return dflt;
  const long long v = std::atoll(e);
  return v > 0 ? static_cast<int64_t>(v) : dflt;
}

// Output positions per tile of `bytes` bytes of columns.
int64_t positions_per(const DeformConv2dParams& p, size_t elem, int64_t bytes) {
  const int64_t P = p.out_spatial();
  const int64_t row = std::max<int64_t>(1, p.in_channels * p.kernel_size()) * static_cast<int64_t>(elem);
  int64_t t = bytes / row;
  t = t >= 32 ? t / 16 * 16 : 32;
  return std::max<int64_t>(1, std::min(t, P));
}

// Forward tile width: ~kForwardTileBytes of columns, but no narrower than the GEMM's efficient width
// as long as a tile stays under kMaxForwardTileBytes (the workspace holds one tile per task).
int64_t forward_tile(const DeformConv2dParams& p, size_t elem, const CpuContext& ctx) {
  constexpr int64_t kMaxForwardTileBytes = int64_t(8) << 20;
  static const int64_t bytes = bytes_override("DCNKIT_DCN_TILE_BYTES", kForwardTileBytes);
  const int64_t t = positions_per(p, elem, bytes);
  const int64_t widest = positions_per(p, elem, kMaxForwardTileBytes);
  return std::max(t, std::min({ctx.gemm_min_n, p.out_spatial(), widest}));
}

int64_t backward_chunk(const DeformConv2dParams& p, size_t elem) {
  static const int64_t bytes = bytes_override("DCNKIT_DCN_BWD_CHUNK_BYTES", kBackwardChunkBytes);
  return positions_per(p, elem, bytes);
}

size_t bytes_of(int64_t count, size_t elem) { return align_up(static_cast<size_t>(count) * elem); }

struct ForwardLayout {
  size_t x_hwc, weight_t, slot, col;
};

ForwardLayout forward_layout(const DeformConv2dParams& p, DType dtype, const CpuContext& ctx) {
  const size_t e = dtype_size(dtype);
  const int64_t T = forward_tile(p, e, ctx);
  ForwardLayout l;
  l.x_hwc = bytes_of(p.in_channels * p.height * p.width, e);  // one image: independent of the batch
  l.weight_t = bytes_of(p.out_channels * p.in_per_group() * p.kernel_size(), e);
  l.col = bytes_of(p.in_channels * p.kernel_size() * T, e);
  l.slot = l.col;
  return l;
}

// Backward position tasks: each owns a channels-last grad_input buffer (summed in task order at the end
// of the image), so the count is capped to bound the workspace.
constexpr int64_t kMaxBackwardTasks = 16;

int64_t backward_tasks(const CpuContext& ctx) {
  return std::min<int64_t>(std::max(1, ctx.num_threads), kMaxBackwardTasks);
}

struct BackwardLayout {
  size_t x_hwc, gin_hwc /* one per backward task */, weight_t, gweight_t, col, gcol;
  size_t total() const { return x_hwc + gin_hwc + weight_t + gweight_t + col + gcol; }
};

BackwardLayout backward_layout(const DeformConv2dParams& p, DType dtype, const CpuContext& ctx) {
  const size_t e = dtype_size(dtype);
  const int64_t C = backward_chunk(p, e);
  const int64_t wsz = p.out_channels * p.in_per_group() * p.kernel_size();
  BackwardLayout l;
  l.x_hwc = bytes_of(p.in_channels * p.height * p.width, e);
  l.gin_hwc = static_cast<size_t>(backward_tasks(ctx)) * l.x_hwc;
  l.weight_t = bytes_of(wsz, e);
  l.gweight_t = l.weight_t;
  l.col = bytes_of(p.in_channels * p.kernel_size() * C, e);
  l.gcol = l.col;
  return l;
}

template <typename T>
DType dtype_of_t();
template <>
DType dtype_of_t<float>() { return DType::kFloat32; }
template <>
DType dtype_of_t<double>() { return DType::kFloat64; }

// Splits [0, n) into `parts` near-equal contiguous ranges; range of part t.
inline void split_range(int64_t n, int64_t parts, int64_t t, int64_t* b, int64_t* e) {
  const int64_t q = n / parts, r = n % parts;
  *b = t * q + std::min(t, r);
  *e = *b + q + (t < r ? 1 : 0);
}

// (C, HW) -> (HW, C) for pixels [pb, pe).
template <typename T>
void to_channels_last(const T* __restrict src, T* __restrict dst, int64_t C, int64_t HW, int64_t pb,
                      int64_t pe) {
  constexpr int64_t kBlock = 64;
  for (int64_t b = pb; b < pe; b += kBlock) {
    const int64_t e = std::min(pe, b + kBlock);
    for (int64_t c = 0; c < C; ++c) {
      const T* s = src + c * HW;
      for (int64_t q = b; q < e; ++q) dst[q * C + c] = s[q];
    }
  }
}

// dst (C, HW) = src (HW, C) (kAdd: dst += src) for channels [cb, ce).
template <bool kAdd, typename T>
void to_channels_first(const T* __restrict src, T* __restrict dst, int64_t C, int64_t HW, int64_t cb,
                       int64_t ce) {
  constexpr int64_t kBlock = 64;
  for (int64_t b = 0; b < HW; b += kBlock) {
    const int64_t e = std::min(HW, b + kBlock);
    for (int64_t c = cb; c < ce; ++c) {
      T* d = dst + c * HW;
      for (int64_t q = b; q < e; ++q) {
        if constexpr (kAdd) {
          d[q] += src[q * C + c];
        } else {
          d[q] = src[q * C + c];
        }
      }
    }
  }
}

// Everything the CPU loops need about one image.
template <typename T>
struct CpuImage {
  const DeformConv2dParams* p;
  const T* x_hwc;   // (H*W, Cin)
  const T* offset;  // (2*Gd*K, P)
  const T* mask;    // (Gd*K, P) or null
};

// Hot loops are compiled for several ISAs and picked at load time (GCC/Clang function multi-versioning
// on x86-64); elsewhere they are plain functions.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(DCNKIT_NO_FMV)
#define DCNKIT_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DCNKIT_CPU_CLONES
#endif

// dst[c] = sum_q w_q * src_q[c] for c < n.
template <typename T>
__attribute__((always_inline)) inline void blend4(T* __restrict dst, const T* __restrict s0, const T* __restrict s1,
                   const T* __restrict s2, const T* __restrict s3, T w0, T w1, T w2, T w3, int64_t n) {
  for (int64_t c = 0; c < n; ++c) dst[c] = w0 * s0[c] + w1 * s1[c] + w2 * s2[c] + w3 * s3[c];
}

// Columns of positions [p0, p0 + tn) into col (tn x Cin*K, position-major, see the file comment).
template <typename T>
__attribute__((always_inline)) inline void build_columns_impl(const CpuImage<T>& im, int64_t p0, int64_t tn, T* __restrict col) {
  const DeformConv2dParams& p = *im.p;
  const int64_t K = p.kernel_size(), Cin = p.in_channels, CK = Cin * K;
  const int64_t Gd = p.attrs.deformable_groups, cpg = p.in_per_deformable_group(), cin_g = p.in_per_group();
  int64_t ho = p0 / p.out_w, wo = p0 - ho * p.out_w;
  for (int64_t t = 0; t < tn; ++t) {
    const int64_t pos = p0 + t;
    T* crow = col + t * CK;
    for (int64_t i = 0, k = 0; i < p.kernel_h; ++i) {
      for (int64_t j = 0; j < p.kernel_w; ++j, ++k) {
        for (int64_t g = 0; g < Gd; ++g) {
          T py, px, m;
          deform_conv2d_point_at<T, T>(p, im.offset, im.mask, g, k, i, j, ho, wo, pos, &py, &px, &m);
          const SampleTaps<T> s = masked_taps<T>(py, px, m, p.height, p.width);
          // The group's channels, cut at conv-group borders.
          for (int64_t cb = g * cpg, cend = (g + 1) * cpg; cb < cend;) {
            const int64_t gc = cb / cin_g;
            const int64_t ce = std::min(cend, (gc + 1) * cin_g);
            const T* src = im.x_hwc + cb;
            blend4<T>(crow + gc * K * cin_g + k * cin_g + (cb - gc * cin_g), src + s.idx[0] * Cin,
                      src + s.idx[1] * Cin, src + s.idx[2] * Cin, src + s.idx[3] * Cin, s.w[0], s.w[1],
                      s.w[2], s.w[3], ce - cb);
            cb = ce;
          }
        }
      }
    }
    if (++wo == p.out_w) {
      wo = 0;
      ++ho;
    }
  }
}

DCNKIT_CPU_CLONES void build_columns_f32(const CpuImage<float>& im, int64_t p0, int64_t tn, float* col) {
  build_columns_impl<float>(im, p0, tn, col);
}
DCNKIT_CPU_CLONES void build_columns_f64(const CpuImage<double>& im, int64_t p0, int64_t tn, double* col) {
  build_columns_impl<double>(im, p0, tn, col);
}
inline void build_columns(const CpuImage<float>& im, int64_t p0, int64_t tn, float* col) {
  build_columns_f32(im, p0, tn, col);
}
inline void build_columns(const CpuImage<double>& im, int64_t p0, int64_t tn, double* col) {
  build_columns_f64(im, p0, tn, col);
}

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
            const T* x = im.x_hwc + cb;
            const T *x0 = x + tp.idx[0] * Cin, *x1 = x + tp.idx[1] * Cin, *x2 = x + tp.idx[2] * Cin,
                    *x3 = x + tp.idx[3] * Cin;
            if (crow) blend4<T>(crow + at, x0, x1, x2, x3, w[0], w[1], w[2], w[3], len);
            if (tp.inside) {
              if (dots) dots4<T>(grow + at, x0, x1, x2, x3, len, d);
              if (gin) {
                const T* __restrict src = grow + at;
                for (int q = 0; q < 4; ++q) {
                  const T wq = w[q];
                  if (wq == T(0)) continue;
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

// weight (Cout, Cin_g, K) -> (Cout, K, Cin_g).
template <typename T>
void weight_to_kc(const DeformConv2dParams& p, const T* w, T* wt) {
  const int64_t K = p.kernel_size(), cin_g = p.in_per_group();
  for (int64_t co = 0; co < p.out_channels; ++co)
    for (int64_t c = 0; c < cin_g; ++c)
      for (int64_t k = 0; k < K; ++k) wt[(co * K + k) * cin_g + c] = w[(co * cin_g + c) * K + k];
}

template <typename T>
void weight_from_kc(const DeformConv2dParams& p, const T* wt, T* w) {
  const int64_t K = p.kernel_size(), cin_g = p.in_per_group();
  for (int64_t co = 0; co < p.out_channels; ++co)
    for (int64_t c = 0; c < cin_g; ++c)
      for (int64_t k = 0; k < K; ++k) w[(co * cin_g + c) * K + k] = wt[(co * K + k) * cin_g + c];
}

Status first_error(const std::vector<Status>& v) {
  for (const Status& s : v)
    if (!s.ok()) return s;
  return Status::Ok();
}

// ---- element-wise path ---------------------------------------------------------------------------
// The CUDA kernels' per-element functions (deform_conv2d_column, deform_conv2d_scatter_input,
// deform_conv2d_offset_mask_grad) run serially on the CPU, so that CPU tests check the GPU math too:
// selected with DCNKIT_DCN_CPU_PATH=elementwise (read once per process). Slow; for tests only.
// DCNKIT_DCN_CPU_PATH=cuda-schedule runs the CUDA launchers themselves on the CPU: their schedule
// (chunks of images, every GEMM's arguments, zeroing) and their per-thread element functions
// (deform_conv2d_kernels.h), serially, with the context's GEMM and chunks of ceil(N/2) images.
enum class CpuPath { kFast, kElementwise, kCudaSchedule };
CpuPath cpu_path() {
  static const CpuPath path = [] {
    const char* e = std::getenv("DCNKIT_DCN_CPU_PATH");
    if (e != nullptr && std::strcmp(e, "elementwise") == 0) return CpuPath::kElementwise;
    if (e != nullptr && std::strcmp(e, "cuda-schedule") == 0) return CpuPath::kCudaSchedule;
    return CpuPath::kFast;
  }();
  return path;
}
bool elementwise_path() { return cpu_path() == CpuPath::kElementwise; }
bool cuda_schedule_path() { return cpu_path() == CpuPath::kCudaSchedule; }

// The executor of the CUDA schedule on the CPU: each "kernel" is a serial loop over its element
// function, in the order a CUDA grid would cover it; the scatter is a plain += (one thread).
template <typename T>
struct CpuScheduleExec {
  const DeformConv2dParams& p;
  const CpuContext& ctx;
  const T *input, *offset, *mask, *bias, *grad_output;
  T *output, *grad_input, *grad_offset, *grad_bias, *grad_mask;

  int64_t column_elements(int64_t nb) const {
    return nb * p.in_channels * p.kernel_size() * p.out_spatial();
  }
  Status im2col(int64_t n0, int64_t nb, T* columns) {
    for (int64_t i = 0; i < column_elements(nb); ++i)
      columns[i] = deform_conv2d_im2col_element<T, T>(p, input, offset, mask, n0, i);
    return Status::Ok();
  }
  Status bias_fill(int64_t n0, int64_t nb) {
    for (int64_t i = 0; i < nb * p.out_channels * p.out_spatial(); ++i)
      deform_conv2d_bias_element(p, bias, n0, i, output);
    return Status::Ok();
  }
  Status col2im(int64_t n0, int64_t nb, const T* grad_columns) {
    for (int64_t i = 0; i < column_elements(nb); ++i)
      deform_conv2d_col2im_element<T, T>(p, offset, mask, grad_columns, n0, i, grad_input,
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

int64_t cuda_schedule_chunk(const DeformConv2dParams& p) { return std::max<int64_t>(1, (p.batch + 1) / 2); }

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

size_t deform_conv2d_forward_workspace_cpu(const DeformConv2dParams& p, DType dtype, const CpuContext& ctx) {
  const ForwardLayout l = forward_layout(p, dtype, ctx);
  return l.x_hwc + l.weight_t + static_cast<size_t>(std::max(1, ctx.num_threads)) * l.slot;
}

size_t deform_conv2d_backward_workspace_cpu(const DeformConv2dParams& p, DType dtype, const CpuContext& ctx) {
  return backward_layout(p, dtype, ctx).total();
}

template <typename T>
Status deform_conv2d_forward_cpu(const DeformConv2dParams& p, const T* input, const T* offset,
                                 const T* weight, const T* bias, const T* mask, T* output,
                                 void* workspace, const CpuContext& ctx) {
  const int64_t N = p.batch, P = p.out_spatial();
  if (N == 0 || p.out_channels == 0 || P == 0) return Status::Ok();
  if (elementwise_path()) {
    forward_elementwise(p, input, offset, weight, bias, mask, output);
    return Status::Ok();
  }
  if (cuda_schedule_path()) {
    std::vector<T> columns = cuda_schedule_columns<T>(p);
    CpuScheduleExec<T> ex{p, ctx, input, offset, mask, bias, nullptr, output, nullptr, nullptr, nullptr, nullptr};
    return deform_conv2d_forward_schedule<T>(p, dtype_of_t<T>(), cuda_schedule_chunk(p), weight, bias != nullptr,
                                             output, columns.data(), ex);
  }
  const DType dt = dtype_of_t<T>();
  const int64_t K = p.kernel_size(), HW = p.height * p.width, Cin = p.in_channels, CK = Cin * K;
  const int64_t Gd = p.attrs.deformable_groups;
  const int64_t G = p.attrs.groups, Cout = p.out_channels, cin_g = p.in_per_group(), cout_g = p.out_per_group();
  const ForwardLayout l = forward_layout(p, dt, ctx);
  char* ws = static_cast<char*>(workspace);
  T* x_hwc = reinterpret_cast<T*>(ws);
  T* wt = reinterpret_cast<T*>(ws + l.x_hwc);
  char* slots = ws + l.x_hwc + l.weight_t;

  // (Cout, K, Cin_g) weight; per image, its channels-last copy, then its tiles (the workspace holds one image,
  // so it does not grow with the batch).
  weight_to_kc(p, weight, wt);
  constexpr int64_t kPixBlock = 256;
  const int64_t pblocks = (HW + kPixBlock - 1) / kPixBlock;
  const int64_t tile = forward_tile(p, sizeof(T), ctx);
  const int64_t ntiles = (P + tile - 1) / tile;
  const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(ctx.num_threads, ntiles));
  std::vector<Status> statuses(static_cast<size_t>(tasks));
  for (int64_t n = 0; n < N; ++n) {
    parallel_for(ctx, pblocks, [&](int64_t b, int64_t e) {
      for (int64_t it = b; it < e; ++it) {
        const int64_t pb = it * kPixBlock;
        to_channels_last(input + n * Cin * HW, x_hwc, Cin, HW, pb, std::min(HW, pb + kPixBlock));
      }
    });
    const CpuImage<T> im{&p, x_hwc, offset + n * 2 * Gd * K * P, mask ? mask + n * Gd * K * P : nullptr};
    std::atomic<int64_t> next_tile{0};
    parallel_tasks(ctx, tasks, [&](int64_t task) {
      T* col = reinterpret_cast<T*>(slots + static_cast<size_t>(task) * l.slot);
      // Tiles are handed out dynamically (a busy core takes fewer); each result does not depend on
      // which task computes it.
      for (int64_t it = next_tile.fetch_add(1); it < ntiles; it = next_tile.fetch_add(1)) {
        const int64_t p0 = it * tile;
        const int64_t tn = std::min(tile, P - p0);
        build_columns(im, p0, tn, col);
        T* out = output + n * Cout * P + p0;
        if (bias) {
          for (int64_t co = 0; co < Cout; ++co) std::fill(out + co * P, out + co * P + tn, bias[co]);
        }
        GemmArgs ga;
        ga.dtype = dt;
        ga.trans_b = true;
        ga.m = cout_g;
        ga.n = tn;
        ga.k = K * cin_g;
        ga.beta = bias ? 1.f : 0.f;
        ga.a = wt;
        ga.lda = K * cin_g;
        ga.stride_a = cout_g * K * cin_g;
        ga.b = col;
        ga.ldb = CK;
        ga.stride_b = K * cin_g;
        ga.c = out;
        ga.ldc = P;
        ga.stride_c = cout_g * P;
        ga.batch = G;
        Status s = ctx.run_gemm(ga);
        if (!s.ok()) {
          statuses[static_cast<size_t>(task)] = s;
          return;
        }
      }
    });
    DCNKIT_RETURN_IF_ERROR(first_error(statuses));
  }
  return first_error(statuses);
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
    std::vector<T> columns = cuda_schedule_columns<T>(p);
    CpuScheduleExec<T> ex{p, ctx, input, offset, mask, nullptr, grad_output,
                          nullptr, grad_input, grad_offset, grad_bias, grad_mask};
    return deform_conv2d_backward_schedule<T>(p, dt, cuda_schedule_chunk(p), grad_output, weight, mask != nullptr,
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
