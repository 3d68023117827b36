// DeformConv2d CPU launchers (float32, float64): the sampling loops of the column builder (forward) and of the
// backward pass, over blocks of output positions, on a padded channels-last copy of the image. Internal to
// plugins/core/src.
//
// The padded copy (PaddedMap) holds the map with a border of zeros: one pixel left, right and above, two rows
// below, so that every neighbour of every sampling point lies in it (dcn_point_taps) and a neighbour outside the
// map reads a zero of the border, never the map (docs/operators.md's boundary contract). The loops then have no
// per-neighbour branch. Per block of kBlock positions and per (kernel point, deformable group), one loop over the
// block's positions computes their sampling points (dcn_point_taps; vectorised: no branch), then each point's
// channels are visited as runs of contiguous channels (one run per conv group the deformable group spans).
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>

#include "deform_conv2d_cpu_common.h"

// The vector helpers below pass 64-byte vectors between always-inline functions, also in the clones built without
// AVX-512: GCC's ABI note about such arguments does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace dcnkit {
namespace {

// ---- the padded channels-last copy ------------------------------------------------------------------------

// The sampling coordinates and the padded copy's extents are int32 in the loops (dcn_point_taps): a
// coordinate lies in [-pad, H + pad).
inline Status check_cpu_sampling_extents(const char* op, const DeformConv2dParams& p) {
  const int64_t lim = int64_t(1) << 31;
  const int64_t h = p.height + 2 * p.attrs.pad_h + 3, w = p.width + 2 * p.attrs.pad_w + 3;
  if (h >= lim || w >= lim) {
    return arg_error(op, "input", "height + 2*pad_h and width + 2*pad_w below 2^31 - 3",
                     std::to_string(p.height + 2 * p.attrs.pad_h) + " and " +
                         std::to_string(p.width + 2 * p.attrs.pad_w));
  }
  return Status::Ok();
}

// The border of `dst` (a padded copy) set to zero; the interior is left as it is.
template <typename T>
void zero_border(const PaddedMap& m, T* dst) {
  const int64_t row = m.cols() * m.C;
  std::fill(dst, dst + row, T(0));                                  // the row above
  std::fill(dst + (m.H + 1) * row, dst + (m.H + 3) * row, T(0));    // the two rows below
  for (int64_t y = 0; y < m.H; ++y) {
    std::fill(dst + m.at(y, -1), dst + m.at(y, 0), T(0));
    std::fill(dst + m.at(y, m.W), dst + m.at(y, m.W) + m.C, T(0));
  }
}

// Rows [yb, ye) of a (C, H, W) image into the padded copy's interior.
template <typename T>
void to_padded_channels_last(const T* src, const PaddedMap& m, T* dst, int64_t yb, int64_t ye) {
  for (int64_t y = yb; y < ye; ++y) to_channels_last(src + y * m.W, dst + m.at(y, 0), m.C, m.H * m.W, 0, m.W);
}

// dst (C, H, W) = (kAdd: +=) the padded copy's interior, channels [cb, ce).
template <bool kAdd, typename T>
void from_padded_channels_last(const T* __restrict src, const PaddedMap& m, T* __restrict dst, int64_t cb,
                               int64_t ce) {
  const int64_t C = m.C, HW = m.H * m.W;
  constexpr int64_t kBlock = 64;
  for (int64_t y = 0; y < m.H; ++y) {
    const T* s = src + m.at(y, 0);
    for (int64_t b = 0; b < m.W; b += kBlock) {
      const int64_t e = std::min(m.W, b + kBlock);
      for (int64_t c = cb; c < ce; ++c) {
        T* d = dst + c * HW + y * m.W;
        for (int64_t x = b; x < e; ++x) {
          if constexpr (kAdd) {
            d[x] += s[x * C + c];
          } else {
            d[x] = s[x * C + c];
          }
        }
      }
    }
  }
}

// What the sampling loops read of one image: its padded copy, offsets (2*Gd*K, P) and mask (Gd*K, P) or null.
template <typename T>
struct PaddedImage {
  const DeformConv2dParams* p;
  PaddedMap map;
  const T* x;
  const T* offset;
  const T* mask;
};

// ---- vectors of 64 bytes (GCC/Clang vector extensions; the clones pick the instructions) -----------------

template <typename T>
constexpr int kLanes = 64 / static_cast<int>(sizeof(T));

template <typename T, int N>
struct VecOf {
  typedef T type __attribute__((vector_size(N * sizeof(T))));
};
template <typename T, int N = kLanes<T>>
using Vec = typename VecOf<T, N>::type;

template <typename T>
__attribute__((always_inline)) inline Vec<T> vload(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <typename T>
__attribute__((always_inline)) inline void vstore(T* p, Vec<T> v) {
  std::memcpy(p, &v, sizeof(v));
}

// Sum of the lanes, pairwise: lane j + lane j + N/2, then the same on the N/2 sums, ... (a fixed order).
template <typename T, int N, size_t... I>
__attribute__((always_inline)) inline Vec<T, N / 2> half_sum(Vec<T, N> v, std::index_sequence<I...>) {
  return __builtin_shufflevector(v, v, I...) + __builtin_shufflevector(v, v, (I + N / 2)...);
}
template <typename T, int N = kLanes<T>>
__attribute__((always_inline)) inline T pairwise_sum(Vec<T, N> v) {
  if constexpr (N == 1) {
    return v[0];
  } else {
    return pairwise_sum<T, N / 2>(half_sum<T, N>(v, std::make_index_sequence<N / 2>()));
  }
}

// ---- blocks of positions ----------------------------------------------------------------------------------

// A block holds at most kBlock positions and kBlockPoints sampling points (positions x kernel points x deformable
// groups): 9 kernel points of 32 positions. Its points' taps (BlockPoints, ~25 KB) stay in the L1/L2 cache while
// the block's positions are visited in order, each position's kernel points in the column row's order, so that the
// column rows (and in the backward the column-gradient rows) are written and read front to back.
constexpr int64_t kBlock = 32;
constexpr int64_t kBlockPoints = 9 * kBlock;

// The block's positions [p0, p0 + n): their sampling coordinates before the kernel point and the offset,
// ho * stride_h - pad_h and wo * stride_w - pad_w.
struct BlockOrigins {
  int32_t y[kBlock], x[kBlock];
};

inline void block_origins(const DeformConv2dParams& p, int64_t p0, int64_t n, BlockOrigins* o) {
  const DeformConv2dAttrs& a = p.attrs;
  int64_t ho = p0 / p.out_w, wo = p0 - ho * p.out_w;
  for (int64_t t = 0; t < n; ++t) {
    o->y[t] = static_cast<int32_t>(ho * a.stride_h - a.pad_h);
    o->x[t] = static_cast<int32_t>(wo * a.stride_w - a.pad_w);
    if (++wo == p.out_w) {
      wo = 0;
      ++ho;
    }
  }
}

// A block's sampling points, entry (kg - kg0) * n + t for point kg = k * Gd + g (kernel point k, deformable group g)
// of block position t: element offset of neighbour 0 in the padded copy (`at`), the masked weights w and, for the
// backward (kGrad), the mask, the weights u and their derivatives.
template <typename T>
struct BlockPoints {
  int64_t at[kBlockPoints];
  int32_t y0[kBlockPoints], x0[kBlockPoints];
  T w[4][kBlockPoints];
  T m[kBlockPoints], u[4][kBlockPoints], dwy[4][kBlockPoints], dwx[4][kBlockPoints];
};

// Entries [e0, e0 + n) of `b`: kernel point (i, j) = k of deformable group g at the block's n positions from p0
// (one loop over the positions, vectorised).
template <bool kGrad, bool kMask, typename T>
__attribute__((always_inline)) inline void block_points_with(const PaddedImage<T>& im, const BlockOrigins& o,
                                                             int64_t p0, int64_t n, int64_t g, int64_t k, int64_t i,
                                                             int64_t j, BlockPoints<T>& b, int64_t e0) {
  const DeformConv2dParams& p = *im.p;
  const int64_t K = p.kernel_size(), P = p.out_spatial();
  const T* __restrict oy = im.offset + (g * 2 * K + 2 * k) * P + p0;
  const T* __restrict ox = oy + P;
  const T* __restrict mk = kMask ? im.mask + (g * K + k) * P + p0 : nullptr;
  const int32_t dy = static_cast<int32_t>(i * p.attrs.dilation_h), dx = static_cast<int32_t>(j * p.attrs.dilation_w);
  const int32_t H = static_cast<int32_t>(p.height), W = static_cast<int32_t>(p.width);
  int32_t* __restrict y0 = b.y0 + e0;
  int32_t* __restrict x0 = b.x0 + e0;
  T* __restrict w0 = b.w[0] + e0;
  T* __restrict w1 = b.w[1] + e0;
  T* __restrict w2 = b.w[2] + e0;
  T* __restrict w3 = b.w[3] + e0;
  for (int64_t t = 0; t < n; ++t) {
    const T m = kMask ? mk[t] : T(1);
    const DcnPointTaps<T> s = dcn_point_taps<T>(T(o.y[t] + dy) + oy[t], T(o.x[t] + dx) + ox[t], m, H, W);
    y0[t] = s.y0;
    x0[t] = s.x0;
    w0[t] = s.w[0];
    w1[t] = s.w[1];
    w2[t] = s.w[2];
    w3[t] = s.w[3];
    if constexpr (kGrad) {
      b.m[e0 + t] = m;
      for (int q = 0; q < 4; ++q) {
        b.u[q][e0 + t] = s.u[q];
        b.dwy[q][e0 + t] = s.dwy[q];
        b.dwx[q][e0 + t] = s.dwx[q];
      }
    }
  }
  for (int64_t t = 0; t < n; ++t) b.at[e0 + t] = im.map.at(y0[t], x0[t]);
}

// Kernel point k and deformable group g of the points kg in [kg0, kg1): f(kg, k, g), in that order.
template <typename F>
__attribute__((always_inline)) inline void for_points(int64_t Gd, int64_t kg0, int64_t kg1, F&& f) {
  int64_t k = kg0 / Gd, g = kg0 - k * Gd;
  for (int64_t kg = kg0; kg < kg1; ++kg) {
    f(kg, k, g);
    if (++g == Gd) {
      g = 0;
      ++k;
    }
  }
}

// The positions [b, e) of a tile or chunk starting at output position p0, block by block: per block (n positions
// from b0) and range [kg0, kg1) of its points (all K * Gd of them unless they exceed kBlockPoints for one position),
// `b` filled, then f(b0, n, kg0, kg1).
template <bool kGrad, typename T, typename F>
__attribute__((always_inline)) inline void for_blocks(const PaddedImage<T>& im, int64_t p0, int64_t b, int64_t e,
                                                      BlockPoints<T>& bp, F&& f) {
  const DeformConv2dParams& p = *im.p;
  const int64_t Gd = p.attrs.deformable_groups, KG = p.kernel_size() * Gd;
  const int64_t nb = std::max<int64_t>(1, std::min(kBlock, kBlockPoints / KG));
  const int64_t kgs = std::max<int64_t>(1, std::min(KG, kBlockPoints / nb));
  BlockOrigins o;
  for (int64_t b0 = b; b0 < e; b0 += nb) {
    const int64_t n = std::min(nb, e - b0);
    block_origins(p, p0 + b0, n, &o);
    for (int64_t kg0 = 0; kg0 < KG; kg0 += kgs) {
      const int64_t kg1 = std::min(KG, kg0 + kgs);
      for_points(Gd, kg0, kg1, [&](int64_t kg, int64_t k, int64_t g) __attribute__((always_inline)) {
        const int64_t i = k / p.kernel_w, j = k - i * p.kernel_w, e0 = (kg - kg0) * n;
        if (im.mask != nullptr) {
          block_points_with<kGrad, true>(im, o, p0 + b0, n, g, k, i, j, bp, e0);
        } else {
          block_points_with<kGrad, false>(im, o, p0 + b0, n, g, k, i, j, bp, e0);
        }
      });
      f(b0, n, kg0, kg1);
    }
  }
}

// f(cb, dst, len) for the runs of deformable group g's channels [cb, cb + len) that lie in one conv group: dst is
// where channel cb goes in a column row, less k * Cin/groups (layout: deform_conv2d_cpu_common.h).
template <typename F>
__attribute__((always_inline)) inline void for_channel_runs(const DeformConv2dParams& p, int64_t g, F&& f) {
  const int64_t K = p.kernel_size(), cpg = p.in_per_deformable_group(), cin_g = p.in_per_group();
  if (p.attrs.groups == 1) {
    f(g * cpg, g * cpg, cpg);
    return;
  }
  for (int64_t cb = g * cpg, cend = (g + 1) * cpg; cb < cend;) {
    const int64_t gc = cb / cin_g;
    const int64_t ce = std::min(cend, (gc + 1) * cin_g);
    f(cb, gc * K * cin_g + (cb - gc * cin_g), ce - cb);
    cb = ce;
  }
}

// Columns of positions [p0, p0 + tn) into col (tn x Cin*K, position-major; deform_conv2d_cpu_common.h).
template <typename T>
__attribute__((always_inline)) inline void build_columns_padded(const PaddedImage<T>& im, int64_t p0, int64_t tn,
                                                                T* __restrict col) {
  const DeformConv2dParams& p = *im.p;
  const int64_t Cin = p.in_channels, CK = Cin * p.kernel_size(), cin_g = p.in_per_group();
  const int64_t Gd = p.attrs.deformable_groups, row = im.map.cols() * Cin;
  BlockPoints<T> bp;
  for_blocks<false>(im, p0, 0, tn, bp, [&](int64_t b0, int64_t n, int64_t kg0, int64_t kg1) __attribute__((always_inline)) {
    for (int64_t t = 0; t < n; ++t) {
      T* crow = col + (b0 + t) * CK;
      for_points(Gd, kg0, kg1, [&](int64_t kg, int64_t k, int64_t g) __attribute__((always_inline)) {
        const int64_t e = (kg - kg0) * n + t;
        const T* x = im.x + bp.at[e];
        for_channel_runs(p, g, [&](int64_t cb, int64_t dst, int64_t len) __attribute__((always_inline)) {
          blend4<T>(crow + dst + k * cin_g, x + cb, x + cb + Cin, x + cb + row, x + cb + row + Cin, bp.w[0][e],
                    bp.w[1][e], bp.w[2][e], bp.w[3][e], len);
        });
      });
    }
  });
}

DCNKIT_CPU_CLONES void build_columns_f32(const PaddedImage<float>& im, int64_t p0, int64_t tn, float* col) {
  build_columns_padded<float>(im, p0, tn, col);
}
DCNKIT_CPU_CLONES void build_columns_f64(const PaddedImage<double>& im, int64_t p0, int64_t tn, double* col) {
  build_columns_padded<double>(im, p0, tn, col);
}
inline void build_columns(const PaddedImage<float>& im, int64_t p0, int64_t tn, float* col) {
  build_columns_f32(im, p0, tn, col);
}
inline void build_columns(const PaddedImage<double>& im, int64_t p0, int64_t tn, double* col) {
  build_columns_f64(im, p0, tn, col);
}

}  // namespace
}  // namespace dcnkit
