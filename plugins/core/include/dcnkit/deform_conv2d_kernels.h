// Per-element math of DeformConv2d / ModulatedDeformConv2d (OPS.md), shared by the CPU and CUDA
// launchers. Everything here is DCNKIT_HD: the CPU loops over these functions, the CUDA kernels are
// grid-stride loops over the same functions. Bilinear sampling comes from bilinear.h (dcn_taps).
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
};

// Sampling point (py, px) and mask m of (deformable group g, kernel point k, output position pos).
template <typename Acc, typename T>
DCNKIT_HD void deform_conv2d_point(const DeformConv2dParams& p, const T* offset_n, const T* mask_n,
                                   int64_t g, int64_t k, int64_t pos, Acc* py, Acc* px, Acc* m) {
  const int64_t K = p.kernel_h * p.kernel_w;
  const int64_t P = p.out_h * p.out_w;
  const int64_t ho = pos / p.out_w, wo = pos - ho * p.out_w;
  const int64_t i = k / p.kernel_w, j = k - i * p.kernel_w;
  const T* off = offset_n + (g * 2 * K + 2 * k) * P + pos;
  *py = Acc(ho * p.attrs.stride_h - p.attrs.pad_h + i * p.attrs.dilation_h) + to_acc<Acc>(off[0]);
  *px = Acc(wo * p.attrs.stride_w - p.attrs.pad_w + j * p.attrs.dilation_w) + to_acc<Acc>(off[P]);
  *m = mask_n ? to_acc<Acc>(mask_n[(g * K + k) * P + pos]) : Acc(1);
}

// Taps of (g, k, pos) with the mask folded in.
template <typename Acc, typename T>
DCNKIT_HD SampleTaps<Acc> deform_conv2d_sample_taps(const DeformConv2dParams& p, const T* offset_n,
                                                    const T* mask_n, int64_t g, int64_t k,
                                                    int64_t pos) {
  Acc py, px, m;
  deform_conv2d_point<Acc, T>(p, offset_n, mask_n, g, k, pos, &py, &px, &m);
  const Taps<Acc> t = dcn_taps<Acc>(py, px, p.height, p.width);
  SampleTaps<Acc> s;
  for (int q = 0; q < 4; ++q) {
    s.idx[q] = t.idx[q];
    // A point outside the map contributes 0 whatever its mask.
    s.w[q] = t.inside ? t.w[q] * m : Acc(0);
  }
  return s;
}

// m * S_dcn(img, py, px) from precomputed taps (img: one H x W channel).
template <typename Acc, typename T>
DCNKIT_HD Acc sample_value(const T* img, const SampleTaps<Acc>& s) {
  return s.w[0] * to_acc<Acc>(img[s.idx[0]]) + s.w[1] * to_acc<Acc>(img[s.idx[1]]) +
         s.w[2] * to_acc<Acc>(img[s.idx[2]]) + s.w[3] * to_acc<Acc>(img[s.idx[3]]);
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
// `add(T* dst, Acc value)` is a plain += on the CPU and atomicAdd on CUDA. Taps of weight 0 are skipped
// (their index is 0 and they contribute nothing).
template <typename Acc, typename T, typename Add>
DCNKIT_HD void sample_scatter(T* grad_img, const SampleTaps<Acc>& s, Acc v, Add add) {
  for (int q = 0; q < 4; ++q) {
    if (s.w[q] != Acc(0)) add(grad_img + s.idx[q], s.w[q] * v);
  }
}

// Input-gradient scatter of one column-gradient element (row c*K + k, position pos).
template <typename Acc, typename T, typename Add>
DCNKIT_HD void deform_conv2d_scatter_input(const DeformConv2dParams& p, const T* offset_n,
                                           const T* mask_n, Acc grad_col_value, int64_t c,
                                           int64_t k, int64_t pos, T* grad_input_n, Add add) {
  const int64_t g = c / (p.in_channels / p.attrs.deformable_groups);
  const SampleTaps<Acc> s = deform_conv2d_sample_taps<Acc, T>(p, offset_n, mask_n, g, k, pos);
  sample_scatter<Acc, T, Add>(grad_input_n + c * p.height * p.width, s, grad_col_value, add);
}

// Offset and mask gradients of one (deformable group g, kernel point k, position pos), summed over the
// channels of the group: with gcol = d loss / d column[c*K + k, pos],
//   d/d offset_y = sum_c gcol * m * dS/dy,  d/d offset_x = sum_c gcol * m * dS/dx,
//   d/d mask     = sum_c gcol * S.
// grad_col_at points at the column-gradient element of row 0 for this position; row r is at
// grad_col_at[r * ld_col] (the launcher may hold the column gradient of a chunk of positions only).
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
    for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) {
      const T* img = input_n + c * HW;
      const Acc gc = to_acc<Acc>(grad_col_at[(c * K + k) * ld_col]);
      Acc vy = Acc(0), vx = Acc(0), v = Acc(0);
      for (int q = 0; q < 4; ++q) {
        const Acc x = to_acc<Acc>(img[t.idx[q]]);
        vy += t.dwy[q] * x;
        vx += t.dwx[q] * x;
        v += t.w[q] * x;
      }
      gy += gc * vy;
      gx += gc * vx;
      gm += gc * v;
    }
  }
  *grad_y = gy * m;
  *grad_x = gx * m;
  *grad_m = gm;
}

}  // namespace dcnkit
