// DeformConv2d on CUDA: the per-thread bodies of the column-tile kernels (deform_conv2d.cu), DCNKIT_HD so
// that the CPU runs them over the same launch grid (DCNKIT_DCN_CPU_PATH=cuda-schedule) and the counting
// harness (tests/cpp/kernel_counts.cpp) counts their loads, stores and sampling points.
//
// A column tile holds `nb` whole images, or `pt` < P consecutive output positions [p0, p0 + pt) of one
// image: columns[b][c*K + k][pl] (b < nb, pl < pt; row stride pt). One thread owns one sampling point of a
// run of channels: (image b, deformable group g, channel slice s, kernel point k, position pl). It decodes
// its index with host-built divisors (FastDivmod, no division), loads the point's two offsets and its mask
// once, computes the cell once (floor, fractions, which neighbours are in the map) and then visits the
// slice's channels with 4 loads and 1 store each (forward), or 1 column-gradient load, 4 loads and up to
// 4 atomics each (backward).
//
// Boundary contract (docs/operators.md, S_dcn): a neighbour outside the map is never read (predicated
// loads); a neighbour inside the map is read even when its weight is 0, as torchvision does.
//
// IndexT is the in-image index type: int32_t when every per-image extent and the tile fit (the launchers
// check), int64_t otherwise. Image bases (n * Cin*H*W) are 64-bit. KH, KW > 0 fix the kernel size at
// compile time (3x3, 1x1); 0 reads it from the params. kMask says whether a mask is given.
#pragma once

#include <cmath>

#include "dcnkit/bilinear.h"
#include "dcnkit/common.h"
#include "dcnkit/deform_conv2d.h"
#include "dcnkit/fast_divmod.h"

namespace dcnkit {

// One column tile and its launch grid, built on the host (deform_conv2d_schedule.h).
struct DcnTile {
  int64_t n0 = 0, nb = 1;  // images [n0, n0 + nb)
  int64_t p0 = 0, pt = 1;  // positions [p0, p0 + pt) of each image
  int64_t slices = 1;      // channel slices per deformable group
  int64_t slice_len = 1;   // channels per slice (the last slices of a group may hold fewer, or none)
  int64_t group_channels = 1;  // input channels per deformable group
  uint32_t threads = 0;    // nb * Gd * slices * K * pt
  // Forward grid: pos fastest, then kernel point, slice, deformable group, image.
  // Backward grid: slice fastest (the slices of one point are adjacent lanes), then pos, point, group, image.
  FastDivmod pos_div, k_div, slice_div, group_div;
  FastDivmod out_w_div, kernel_w_div;  // position -> (ho, wo), kernel point -> (i, j)
};

// Where a thread works: its image, group, slice, kernel point and tile position.
struct DcnThread {
  uint32_t b, g, s, k, pl;
};

DCNKIT_HD DcnThread dcn_forward_thread(const DcnTile& t, uint32_t idx) {
  DcnThread w;
  uint32_t r;
  t.pos_div.divmod(idx, r, w.pl);
  t.k_div.divmod(r, r, w.k);
  t.slice_div.divmod(r, r, w.s);
  t.group_div.divmod(r, w.b, w.g);
  return w;
}

DCNKIT_HD DcnThread dcn_backward_thread(const DcnTile& t, uint32_t idx) {
  DcnThread w;
  uint32_t r;
  t.slice_div.divmod(idx, r, w.s);
  t.pos_div.divmod(r, r, w.pl);
  t.k_div.divmod(r, r, w.k);
  t.group_div.divmod(r, w.b, w.g);
  return w;
}

// The cell of one sampling point: neighbour q of (y0, x0) is at base + {0, 1, W, W + 1}[q], in the map iff
// ok[q]; ly, lx are the fractional parts. A point outside (-1, H) x (-1, W) (NaN included) has no neighbour.
template <typename Acc, typename IndexT>
struct DcnCell {
  IndexT base;
  bool ok[4];
  Acc ly, lx;
};

template <typename Acc, typename IndexT>
DCNKIT_HD DcnCell<Acc, IndexT> dcn_cell(Acc py, Acc px, IndexT H, IndexT W) {
  using std::floor;
  DcnCell<Acc, IndexT> c;
  c.base = IndexT(0);
  c.ly = Acc(0);
  c.lx = Acc(0);
  for (int q = 0; q < 4; ++q) c.ok[q] = false;
  if (!(py > Acc(-1) && py < Acc(H) && px > Acc(-1) && px < Acc(W))) return c;
  const Acc fy = floor(py), fx = floor(px);
  const IndexT y0 = static_cast<IndexT>(fy), x0 = static_cast<IndexT>(fx);
  c.ly = py - fy;
  c.lx = px - fx;
  const bool y0ok = y0 >= IndexT(0), x0ok = x0 >= IndexT(0);
  const bool y1ok = y0 + IndexT(1) <= H - IndexT(1), x1ok = x0 + IndexT(1) <= W - IndexT(1);
  c.ok[0] = y0ok && x0ok;
  c.ok[1] = y0ok && x1ok;
  c.ok[2] = y1ok && x0ok;
  c.ok[3] = y1ok && x1ok;
  c.base = y0 * W + x0;
  return c;
}

// A thread's sampling point: the cell, the mask, its channels [c0, c1) and where its data lives.
template <typename Acc, typename IndexT>
struct DcnPointWork {
  DcnCell<Acc, IndexT> cell;
  Acc m;
  IndexT c0, c1;     // input channels of the slice
  int64_t n;         // image
  IndexT off_row;    // offset_n[off_row * P + pos] is d offset_y (then + P: d offset_x)
  IndexT mask_row;   // mask_n[mask_row * P + pos]
  IndexT pos;        // output position in the image
};

template <int KH, int KW>
DCNKIT_HD int dcn_kernel_size(const DeformConv2dParams& p) {
  return KH > 0 ? KH * KW : static_cast<int>(p.kernel_h * p.kernel_w);
}

// Loads the thread's offsets and mask once and computes its cell.
template <typename Acc, typename T, typename IndexT, int KH, int KW, bool kMask>
DCNKIT_HD DcnPointWork<Acc, IndexT> dcn_point_work(const DeformConv2dParams& p, const DcnTile& t,
                                                   const T* offset, const T* mask, const DcnThread& w) {
  const IndexT K = IndexT(dcn_kernel_size<KH, KW>(p));
  const IndexT P = IndexT(p.out_h) * IndexT(p.out_w), Gd = IndexT(p.attrs.deformable_groups);
  DcnPointWork<Acc, IndexT> r;
  r.n = t.n0 + w.b;
  r.pos = IndexT(t.p0) + IndexT(w.pl);
  uint32_t ho, wo, i, j;
  t.out_w_div.divmod(static_cast<uint32_t>(r.pos), ho, wo);
  if (KW > 0) {
    i = w.k / uint32_t(KW > 0 ? KW : 1);
    j = w.k - i * uint32_t(KW > 0 ? KW : 1);
  } else {
    t.kernel_w_div.divmod(w.k, i, j);
  }
  const IndexT g = IndexT(w.g), k = IndexT(w.k);
  r.off_row = g * IndexT(2) * K + IndexT(2) * k;
  r.mask_row = g * K + k;
  const T* off = offset + r.n * static_cast<int64_t>(2 * Gd * K * P);
  const Acc oy = to_acc<Acc>(off[r.off_row * P + r.pos]);
  const Acc ox = to_acc<Acc>(off[(r.off_row + IndexT(1)) * P + r.pos]);
  const DeformConv2dAttrs& a = p.attrs;
  const IndexT y = IndexT(ho) * IndexT(a.stride_h) - IndexT(a.pad_h) + IndexT(i) * IndexT(a.dilation_h);
  const IndexT x = IndexT(wo) * IndexT(a.stride_w) - IndexT(a.pad_w) + IndexT(j) * IndexT(a.dilation_w);
  const Acc py = Acc(y) + oy, px = Acc(x) + ox;
  r.m = kMask ? to_acc<Acc>(mask[r.n * static_cast<int64_t>(Gd * K * P) + r.mask_row * P + r.pos]) : Acc(1);
  r.cell = dcn_cell<Acc, IndexT>(py, px, IndexT(p.height), IndexT(p.width));
  const IndexT cpg = IndexT(t.group_channels);
  const IndexT s0 = IndexT(w.s) * IndexT(t.slice_len);
  r.c0 = g * cpg + (s0 < cpg ? s0 : cpg);
  const IndexT end = s0 + IndexT(t.slice_len);
  r.c1 = g * cpg + (end < cpg ? end : cpg);
  return r;
}

// Value of neighbour q of channel image x: read only when it is in the map.
template <typename Acc, typename T, typename IndexT>
DCNKIT_HD Acc dcn_tap(const T* x, const DcnCell<Acc, IndexT>& c, IndexT W, int q) {
  const IndexT d = (q & 1 ? IndexT(1) : IndexT(0)) + (q & 2 ? W : IndexT(0));
  return c.ok[q] ? to_acc<Acc>(x[c.base + d]) : Acc(0);
}

// The forward gather: thread idx of the tile's forward grid writes columns[b][c*K + k][pl] = m * S(c) for
// the channels c of its slice.
template <typename Acc, typename T, typename IndexT, int KH, int KW, bool kMask>
DCNKIT_HD void deform_conv2d_gather(const DeformConv2dParams& p, const DcnTile& t, const T* input,
                                    const T* offset, const T* mask, uint32_t idx, T* columns) {
  const DcnThread w = dcn_forward_thread(t, idx);
  const DcnPointWork<Acc, IndexT> r = dcn_point_work<Acc, T, IndexT, KH, KW, kMask>(p, t, offset, mask, w);
  const IndexT K = IndexT(dcn_kernel_size<KH, KW>(p)), W = IndexT(p.width);
  const IndexT HW = IndexT(p.height) * W, Cin = IndexT(p.in_channels), pt = IndexT(t.pt);
  const Acc hy = Acc(1) - r.cell.ly, hx = Acc(1) - r.cell.lx;
  const Acc w0 = hy * hx * r.m, w1 = hy * r.cell.lx * r.m, w2 = r.cell.ly * hx * r.m,
            w3 = r.cell.ly * r.cell.lx * r.m;
  const T* x = input + r.n * static_cast<int64_t>(Cin * HW) + static_cast<int64_t>(r.c0 * HW);
  T* out = columns + static_cast<int64_t>(((IndexT(w.b) * Cin + r.c0) * K + IndexT(w.k)) * pt + IndexT(w.pl));
  const IndexT col_step = K * pt;
#if defined(__CUDA_ARCH__)
#pragma unroll 4
#endif
  for (IndexT c = r.c0; c < r.c1; ++c) {
    const Acc v = w0 * dcn_tap<Acc, T, IndexT>(x, r.cell, W, 0) + w1 * dcn_tap<Acc, T, IndexT>(x, r.cell, W, 1) +
                  w2 * dcn_tap<Acc, T, IndexT>(x, r.cell, W, 2) + w3 * dcn_tap<Acc, T, IndexT>(x, r.cell, W, 3);
    *out = from_acc<T>(v);
    x += HW;
    out += col_step;
  }
}

// The tile's bias: output[n0 + b][co][p0 + pl] = bias[co] (a 2-D grid on CUDA: no index division).
template <typename T>
DCNKIT_HD void deform_conv2d_bias_fill(const DeformConv2dParams& p, const DcnTile& t, const T* bias, int64_t b,
                                       int64_t co, int64_t pl, T* output) {
  output[((t.n0 + b) * p.out_channels + co) * (p.out_h * p.out_w) + t.p0 + pl] = bias[co];
}

// ---- the launchers' other per-thread bodies --------------------------------------------------------

// grad_bias[co]: thread `lane` of the `lanes` threads of channel co's block sums grad_output[n][co][q] over every
// image n and the positions q = lane, lane + lanes, ... (no index division); the block then adds the lanes'
// partials in a fixed tree order (deform_conv2d_bias_grad_tree).
template <typename Acc, typename T>
DCNKIT_HD Acc deform_conv2d_bias_grad_partial(const DeformConv2dParams& p, const T* grad_output, int64_t co,
                                              int64_t lane, int64_t lanes) {
  const int64_t P = p.out_h * p.out_w;
  Acc s = Acc(0);
  for (int64_t n = 0; n < p.batch; ++n) {
    const T* g = grad_output + (n * p.out_channels + co) * P;
    for (int64_t q = lane; q < P; q += lanes) s += to_acc<Acc>(g[q]);
  }
  return s;
}

// One step of the block's tree over its lanes' partials: v[lane] += v[lane + width] for lane < width, width =
// lanes/2, ..., 1 (the CUDA block synchronises between steps; the CPU runs the same steps in order).
template <typename Acc>
DCNKIT_HD void deform_conv2d_bias_grad_tree(Acc* v, int64_t lane, int64_t width) {
  if (lane < width) v[lane] += v[lane + width];
}

// The float32 sum over images of 16-bit grad_weight: acc[i] += tmp[i] (tmp: one image's GEMM result).
template <typename Acc, typename T>
DCNKIT_HD void deform_conv2d_weight_accumulate(const T* tmp, int64_t i, Acc* acc) {
  acc[i] += to_acc<Acc>(tmp[i]);
}

}  // namespace dcnkit
