// Per-element math of DeformConv2d / ModulatedDeformConv2d (docs/operators.md): the CPU launchers' sampling
// points and the element-wise reference path (DCNKIT_DCN_CPU_PATH=elementwise). Bilinear sampling comes from
// bilinear.h (dcn_taps). The CUDA kernels' per-thread bodies are in deform_conv2d_gather.h, their schedule in
// deform_conv2d_schedule.h.
//
// Layouts (one image n; P = Ho*Wo, K = kh*kw, position pos = ho*Wo + wo):
//   input_n  (Cin, H, W)        offset_n (Gd*2*K, P)      mask_n (Gd*K, P) or null
//   column row r = c*K + k  (c: input channel, k = i*kw + j), i.e. the im2col layout of ATen/mmcv.
// Only fields of DeformConv2dParams are read here (its member functions are host-only).
#pragma once

#include "dcnkit/bilinear.h"
#include "dcnkit/common.h"
#include "dcnkit/deform_conv2d.h"

namespace dcnkit {

// The four neighbours of one sampling point with the mask folded into the weights: what the
// forward pass and the input-gradient scatter need. Computed once per (deformable group, kernel
// point, position) and reused for every channel of the group.
template <typename Acc>
struct SampleTaps {
  int64_t idx[4];
  Acc w[4];
  bool ok[4];  // as Taps::ok: a neighbour outside the map is never read
};

// Sampling point (py, px) and mask m of (deformable group g, kernel point k = i*kw + j, output position
// pos = ho*Wo + wo); the caller passes i, j, ho, wo (loops know them without dividing).
template <typename Acc, typename T>
DCNKIT_HD void deform_conv2d_point_at(const DeformConv2dParams& p, const T* offset_n, const T* mask_n,
                                      int64_t g, int64_t k, int64_t i, int64_t j, int64_t ho,
                                      int64_t wo, int64_t pos, Acc* py, Acc* px, Acc* m) {
  const int64_t K = p.kernel_h * p.kernel_w;
  const int64_t P = p.out_h * p.out_w;
  const T* off = offset_n + (g * 2 * K + 2 * k) * P + pos;
  *py = Acc(ho * p.attrs.stride_h - p.attrs.pad_h + i * p.attrs.dilation_h) + to_acc<Acc>(off[0]);
  *px = Acc(wo * p.attrs.stride_w - p.attrs.pad_w + j * p.attrs.dilation_w) + to_acc<Acc>(off[P]);
  *m = mask_n ? to_acc<Acc>(mask_n[(g * K + k) * P + pos]) : Acc(1);
}

// The same from (g, k, pos) alone.
template <typename Acc, typename T>
DCNKIT_HD void deform_conv2d_point(const DeformConv2dParams& p, const T* offset_n, const T* mask_n,
                                   int64_t g, int64_t k, int64_t pos, Acc* py, Acc* px, Acc* m) {
  const int64_t ho = pos / p.out_w, wo = pos - ho * p.out_w;
  const int64_t i = k / p.kernel_w, j = k - i * p.kernel_w;
  deform_conv2d_point_at<Acc, T>(p, offset_n, mask_n, g, k, i, j, ho, wo, pos, py, px, m);
}

// Taps of a sampling point with the mask folded in.
template <typename Acc>
DCNKIT_HD SampleTaps<Acc> masked_taps(Acc py, Acc px, Acc m, int64_t H, int64_t W) {
  const Taps<Acc> t = dcn_taps<Acc>(py, px, H, W);
  SampleTaps<Acc> s;
  for (int q = 0; q < 4; ++q) {
    s.idx[q] = t.idx[q];
    s.ok[q] = t.ok[q];
    // A point outside the map contributes 0 whatever its mask.
    s.w[q] = t.inside ? t.w[q] * m : Acc(0);
  }
  return s;
}

// S_dcn of one sampling point (the rule of dcn_taps) for loops that run over many points at once (the CPU
// launchers' blocks of positions): no branch, so that such a loop vectorises. The cell's corner (y0, x0) and, per
// neighbour q in dcn_taps's order, w = m * weight, u = weight and its derivatives dwy, dwx in the point's
// coordinates: all 0 for a neighbour outside the map and for a point outside (-1, H) x (-1, W) (NaN included),
// whose corner is (H, -1). The reader keeps a copy of the map with a border of zeros (one pixel left, right and
// above, two rows below), which holds all four neighbours of every corner so defined: none is outside that copy,
// a neighbour outside the map reads a zero of the border, never the map, and no read depends on a branch.
// floor is the truncation corrected downwards (exact on (-1, H) and (-1, W), which fit int32).
template <typename Acc>
struct DcnPointTaps {
  int32_t y0, x0;
  Acc w[4], u[4], dwy[4], dwx[4];
};

template <typename Acc>
DCNKIT_HD DcnPointTaps<Acc> dcn_point_taps(Acc py, Acc px, Acc m, int32_t H, int32_t W) {
  // & (not &&) and selects: no branch.
  const bool inside = (py > Acc(-1)) & (py < Acc(H)) & (px > Acc(-1)) & (px < Acc(W));
  const Acc sy = inside ? py : Acc(0), sx = inside ? px : Acc(0);
  int32_t y0 = static_cast<int32_t>(sy), x0 = static_cast<int32_t>(sx);
  y0 -= Acc(y0) > sy ? 1 : 0;
  x0 -= Acc(x0) > sx ? 1 : 0;
  const Acc ly = sy - Acc(y0), lx = sx - Acc(x0), hy = Acc(1) - ly, hx = Acc(1) - lx;
  const bool y0ok = inside & (y0 >= 0), y1ok = inside & (y0 < H - 1), x0ok = x0 >= 0, x1ok = x0 < W - 1;
  // Per axis, the weights of its two neighbours (0 outside the map) and their derivative signs.
  const Acc ay0 = y0ok ? hy : Acc(0), ay1 = y1ok ? ly : Acc(0), ax0 = x0ok ? hx : Acc(0), ax1 = x1ok ? lx : Acc(0);
  const Acc my0 = y0ok ? hy * m : Acc(0), my1 = y1ok ? ly * m : Acc(0);
  // Derivative signs as converted flags: GCC 12 vectorises these, not the equivalent selects.
  const Acc sy0 = -Acc(int32_t(y0ok)), sy1 = Acc(int32_t(y1ok)), sx0 = -Acc(int32_t(x0ok)), sx1 = Acc(int32_t(x1ok));
  DcnPointTaps<Acc> t;
  t.y0 = inside ? y0 : H;
  t.x0 = inside ? x0 : -1;
  // A neighbour outside the map weighs exactly 0, whatever the mask (an infinite mask times its 0 would be NaN): it is
  // not part of the sum, as in masked_taps, where it is not read.
  t.w[0] = (y0ok & x0ok) ? my0 * ax0 : Acc(0);
  t.w[1] = (y0ok & x1ok) ? my0 * ax1 : Acc(0);
  t.w[2] = (y1ok & x0ok) ? my1 * ax0 : Acc(0);
  t.w[3] = (y1ok & x1ok) ? my1 * ax1 : Acc(0);
  t.u[0] = ay0 * ax0;
  t.u[1] = ay0 * ax1;
  t.u[2] = ay1 * ax0;
  t.u[3] = ay1 * ax1;
  t.dwy[0] = sy0 * ax0;
  t.dwy[1] = sy0 * ax1;
  t.dwy[2] = sy1 * ax0;
  t.dwy[3] = sy1 * ax1;
  t.dwx[0] = ay0 * sx0;
  t.dwx[1] = ay0 * sx1;
  t.dwx[2] = ay1 * sx0;
  t.dwx[3] = ay1 * sx1;
  return t;
}

// Taps of (g, k, pos) with the mask folded in.
template <typename Acc, typename T>
DCNKIT_HD SampleTaps<Acc> deform_conv2d_sample_taps(const DeformConv2dParams& p, const T* offset_n,
                                                    const T* mask_n, int64_t g, int64_t k,
                                                    int64_t pos) {
  Acc py, px, m;
  deform_conv2d_point<Acc, T>(p, offset_n, mask_n, g, k, pos, &py, &px, &m);
  return masked_taps<Acc>(py, px, m, p.height, p.width);
}

// m * S_dcn(img, py, px) from precomputed taps. Pixel idx of the channel is img[idx * pixel_stride]
// (1 for NCHW maps; Cin for a channels-last copy, where img points at the channel). Neighbours outside
// the map are not read.
template <typename Acc, typename T>
DCNKIT_HD Acc sample_value(const T* img, const SampleTaps<Acc>& s, int64_t pixel_stride = 1) {
  Acc v = Acc(0);
  for (int q = 0; q < 4; ++q) {
    if (s.ok[q]) v += s.w[q] * to_acc<Acc>(img[s.idx[q] * pixel_stride]);
  }
  return v;
}

// One column element: row r = c*K + k, position pos (the sampled value times the mask).
template <typename Acc, typename T>
DCNKIT_HD Acc deform_conv2d_column(const DeformConv2dParams& p, const T* input_n, const T* offset_n,
                                   const T* mask_n, int64_t c, int64_t k, int64_t pos) {
  const int64_t g = c / (p.in_channels / p.attrs.deformable_groups);
  const SampleTaps<Acc> s = deform_conv2d_sample_taps<Acc, T>(p, offset_n, mask_n, g, k, pos);
  return sample_value<Acc, T>(input_n + c * p.height * p.width, s);
}

// Input-gradient scatter of one column-gradient value v at precomputed taps: grad_img[idx] += w * v.
// `add(G* dst, Acc value)` is a plain += on the CPU and atomicAdd on CUDA; G is the type of the gradient
// buffer the scatter adds into (the storage type, or float32 for 16-bit types on CUDA). Taps of weight 0 are
// skipped (they add nothing; every neighbour outside the map has weight 0).
template <typename Acc, typename G, typename Add>
DCNKIT_HD void sample_scatter(G* grad_img, const SampleTaps<Acc>& s, Acc v, Add add,
                              int64_t pixel_stride = 1) {
  for (int q = 0; q < 4; ++q) {
    if (s.ok[q] && s.w[q] != Acc(0)) add(grad_img + s.idx[q] * pixel_stride, s.w[q] * v);
  }
}

// Input-gradient scatter of one column-gradient element (row c*K + k, position pos) into a gradient
// buffer of type G (see sample_scatter).
template <typename Acc, typename T, typename Add, typename G>
DCNKIT_HD void deform_conv2d_scatter_input(const DeformConv2dParams& p, const T* offset_n,
                                           const T* mask_n, Acc grad_col_value, int64_t c,
                                           int64_t k, int64_t pos, G* grad_input_n, Add add) {
  const int64_t g = c / (p.in_channels / p.attrs.deformable_groups);
  const SampleTaps<Acc> s = deform_conv2d_sample_taps<Acc, T>(p, offset_n, mask_n, g, k, pos);
  sample_scatter<Acc, G, Add>(grad_input_n + c * p.height * p.width, s, grad_col_value, add);
}

// Partial sums over the channels c in [0, nc) of gcol(c) * (dS/dy, dS/dx, S) at the (unmasked) taps t,
// with the value of channel c at pixel idx = x[c * x_cs + idx * x_ps] and gcol(c) = gcol[c * g_cs].
// Neighbours outside the map are not read.
template <typename Acc, typename T>
DCNKIT_HD void taps_channel_dots(const Taps<Acc>& t, const T* x, int64_t x_cs, int64_t x_ps,
                                 const T* gcol, int64_t g_cs, int64_t nc, Acc* sy, Acc* sx, Acc* sv) {
  Acc d[4] = {Acc(0), Acc(0), Acc(0), Acc(0)};
  for (int64_t c = 0; c < nc; ++c) {
    const Acc gc = to_acc<Acc>(gcol[c * g_cs]);
    const T* xc = x + c * x_cs;
    for (int q = 0; q < 4; ++q) {
      if (t.ok[q]) d[q] += gc * to_acc<Acc>(xc[t.idx[q] * x_ps]);
    }
  }
  Acc gy = Acc(0), gx = Acc(0), gv = Acc(0);
  for (int q = 0; q < 4; ++q) {
    if (!t.ok[q]) continue;
    gy += t.dwy[q] * d[q];
    gx += t.dwx[q] * d[q];
    gv += t.w[q] * d[q];
  }
  *sy = gy;
  *sx = gx;
  *sv = gv;
}

// Offset and mask gradients of one (deformable group g, kernel point k, position pos), summed over the
// channels of the group: with gcol = d loss / d column[c*K + k, pos],
//   d/d offset_y = m * sum_c gcol * dS/dy,  d/d offset_x = m * sum_c gcol * dS/dx,
//   d/d mask     = sum_c gcol * S.
// input_n is NCHW; grad_col_at points at the column-gradient element of row 0 for this position, row r
// is at grad_col_at[r * ld_col].
template <typename Acc, typename T>
DCNKIT_HD void deform_conv2d_offset_mask_grad(const DeformConv2dParams& p, const T* input_n,
                                              const T* offset_n, const T* mask_n,
                                              const T* grad_col_at, int64_t ld_col, int64_t g,
                                              int64_t k, int64_t pos, Acc* grad_y, Acc* grad_x,
                                              Acc* grad_m) {
  Acc py, px, m;
  deform_conv2d_point<Acc, T>(p, offset_n, mask_n, g, k, pos, &py, &px, &m);
  const Taps<Acc> t = dcn_taps<Acc>(py, px, p.height, p.width);
  Acc gy = Acc(0), gx = Acc(0), gm = Acc(0);
  if (t.inside) {
    const int64_t K = p.kernel_h * p.kernel_w;
    const int64_t HW = p.height * p.width;
    const int64_t cpg = p.in_channels / p.attrs.deformable_groups;
    taps_channel_dots<Acc, T>(t, input_n + g * cpg * HW, HW, 1, grad_col_at + (g * cpg * K + k) * ld_col,
                              K * ld_col, cpg, &gy, &gx, &gm);
  }
  *grad_y = gy * m;
  *grad_x = gx * m;
  *grad_m = gm;
}

}  // namespace dcnkit
