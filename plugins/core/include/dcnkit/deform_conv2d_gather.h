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
// check), int64_t otherwise. Image bases (n * Cin*H*W) are 64-bit. The forward gather uses IndexT only for its
// base offsets: its sampling point and its channel loop are 32-bit (make_dcn_tile bounds a plane, the padded
// extents and a column row below 2^31), so both variants run the same loop. KH, KW > 0 fix the kernel size at
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

// A thread's sampling point: the cell (32-bit, as the gather's: make_dcn_tile keeps H*W, H + 2 pad_h and
// W + 2 pad_w below 2^31), the mask, its channels [c0, c1) and where its data lives.
template <typename Acc, typename IndexT>
struct DcnPointWork {
  DcnCell<Acc, int32_t> cell;
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
  // The point's coordinates in 32-bit integers and the accumulation type: no 64-bit integer is converted to or
  // from floating point, in either index instantiation.
  const int32_t y = int32_t(ho) * int32_t(a.stride_h) - int32_t(a.pad_h) + int32_t(i) * int32_t(a.dilation_h);
  const int32_t x = int32_t(wo) * int32_t(a.stride_w) - int32_t(a.pad_w) + int32_t(j) * int32_t(a.dilation_w);
  const Acc py = Acc(y) + oy, px = Acc(x) + ox;
  r.m = kMask ? to_acc<Acc>(mask[r.n * static_cast<int64_t>(Gd * K * P) + r.mask_row * P + r.pos]) : Acc(1);
  r.cell = dcn_cell<Acc, int32_t>(py, px, static_cast<int32_t>(p.height), static_cast<int32_t>(p.width));
  const IndexT cpg = IndexT(t.group_channels);
  const IndexT s0 = IndexT(w.s) * IndexT(t.slice_len);
  r.c0 = g * cpg + (s0 < cpg ? s0 : cpg);
  const IndexT end = s0 + IndexT(t.slice_len);
  r.c1 = g * cpg + (end < cpg ? end : cpg);
  return r;
}

// The forward gather's sampling point, computed once for the thread's slice of channels: neighbour q of the
// cell is at in-plane offset at + {0, 1, W, W + 1}[q] and is read only when ok[q]; w[q] is its bilinear weight
// with the mask folded in. The coordinate is 32-bit integer plus float arithmetic (floor and fractions from
// the float coordinate; y0, x0 and the in-plane offset `at` as 32-bit integers: make_dcn_tile checks that H*W,
// H + 2 pad_h and W + 2 pad_w fit), so no instantiation converts a 64-bit integer to or from float.
template <typename Acc>
struct DcnGatherPoint {
  int32_t at;
  Acc w[4];
  bool ok[4];
};

template <typename Acc, typename T, typename IndexT, int KH, int KW, bool kMask>
DCNKIT_HD DcnGatherPoint<Acc> dcn_gather_point(const DeformConv2dParams& p, const DcnTile& t, const T* offset,
                                               const T* mask, const DcnThread& w, int64_t n, uint32_t pos) {
  using std::floor;
  const DeformConv2dAttrs& a = p.attrs;
  const uint32_t K = static_cast<uint32_t>(dcn_kernel_size<KH, KW>(p));
  const uint32_t P = static_cast<uint32_t>(p.out_h * p.out_w), Gd = static_cast<uint32_t>(a.deformable_groups);
  uint32_t ho, wo, i, j;
  t.out_w_div.divmod(pos, ho, wo);
  if (KW > 0) {
    i = w.k / uint32_t(KW > 0 ? KW : 1);
    j = w.k - i * uint32_t(KW > 0 ? KW : 1);
  } else {
    t.kernel_w_div.divmod(w.k, i, j);
  }
  // offset[n][g][k][2][pos] and mask[n][g][k][pos]: 2 Gd K P and Gd K P < 2^31 (deform_conv2d_index32 for the
  // int32 variant, make_dcn_tile's P and K bounds and the offset's size for both).
  const uint32_t row = w.g * K + w.k;
  const T* off = offset + n * (int64_t(2) * Gd * K * P) + IndexT(2) * IndexT(row) * IndexT(P) + IndexT(pos);
  const Acc oy = to_acc<Acc>(off[0]), ox = to_acc<Acc>(off[P]);
  const Acc m =
      kMask ? to_acc<Acc>(mask[n * (int64_t(Gd) * K * P) + IndexT(row) * IndexT(P) + IndexT(pos)]) : Acc(1);
  const int32_t H = static_cast<int32_t>(p.height), W = static_cast<int32_t>(p.width);
  const int32_t y = int32_t(ho) * int32_t(a.stride_h) - int32_t(a.pad_h) + int32_t(i) * int32_t(a.dilation_h);
  const int32_t x = int32_t(wo) * int32_t(a.stride_w) - int32_t(a.pad_w) + int32_t(j) * int32_t(a.dilation_w);
  const Acc py = Acc(y) + oy, px = Acc(x) + ox;
  DcnGatherPoint<Acc> r;
  r.at = 0;
  for (int q = 0; q < 4; ++q) {
    r.w[q] = Acc(0);
    r.ok[q] = false;
  }
  // Written so that NaN fails the test and samples as outside (no neighbour).
  if (!(py > Acc(-1) && py < Acc(H) && px > Acc(-1) && px < Acc(W))) return r;
  const Acc fy = floor(py), fx = floor(px);
  const int32_t y0 = static_cast<int32_t>(fy), x0 = static_cast<int32_t>(fx);
  const Acc ly = py - fy, lx = px - fx, hy = Acc(1) - ly, hx = Acc(1) - lx;
  const bool y0ok = y0 >= 0, x0ok = x0 >= 0, y1ok = y0 < H - 1, x1ok = x0 < W - 1;
  r.ok[0] = y0ok && x0ok;
  r.ok[1] = y0ok && x1ok;
  r.ok[2] = y1ok && x0ok;
  r.ok[3] = y1ok && x1ok;
  const Acc my = hy * m, ny = ly * m;
  r.w[0] = my * hx;
  r.w[1] = my * lx;
  r.w[2] = ny * hx;
  r.w[3] = ny * lx;
  r.at = y0 * W + x0;
  return r;
}

// One column element: sum of w[q] * (neighbour q) over the neighbours in the map (ya, yb: the channel plane's
// rows y0 and y0 + 1 at column x0). The ok tests are the same for every channel of the slice: on CUDA they
// are predicates of the loads and multiply-adds, not branches.
template <typename Acc, typename T>
DCNKIT_HD Acc dcn_gather_value(const T* ya, const T* yb, const DcnGatherPoint<Acc>& r) {
  Acc v = Acc(0);
  if (r.ok[0]) v = r.w[0] * to_acc<Acc>(ya[0]);
  if (r.ok[1]) v += r.w[1] * to_acc<Acc>(ya[1]);
  if (r.ok[2]) v += r.w[2] * to_acc<Acc>(yb[0]);
  if (r.ok[3]) v += r.w[3] * to_acc<Acc>(yb[1]);
  return v;
}

// The forward gather: thread idx of the tile's forward grid writes columns[b][c*K + k][pl] = m * S(c) for
// the channels c of its slice. The sampling point is computed once; the channel loop then steps three
// pointers by 32-bit strides (the two rows of the cell by the plane H*W, the column by its row stride K*pt:
// make_dcn_tile checks that both fit) and is unrolled by 4 with a one-channel tail, so its body is 4 loads, up
// to 4 multiply-adds, 1 store and 3 pointer steps per channel, the same in the 32- and 64-bit-index
// variants: IndexT only sizes the base pointers' arithmetic before the loop.
template <typename Acc, typename T, typename IndexT, int KH, int KW, bool kMask>
DCNKIT_HD void deform_conv2d_gather(const DeformConv2dParams& p, const DcnTile& t, const T* input,
                                    const T* offset, const T* mask, uint32_t idx, T* columns) {
  const DcnThread w = dcn_forward_thread(t, idx);
  const int64_t n = t.n0 + w.b;
  const uint32_t pos = static_cast<uint32_t>(t.p0) + w.pl;
  const DcnGatherPoint<Acc> r = dcn_gather_point<Acc, T, IndexT, KH, KW, kMask>(p, t, offset, mask, w, n, pos);
  const IndexT K = IndexT(dcn_kernel_size<KH, KW>(p)), Cin = IndexT(p.in_channels), pt = IndexT(t.pt);
  const int32_t W = static_cast<int32_t>(p.width), HW = static_cast<int32_t>(p.height) * W;
  const int32_t col_step = static_cast<int32_t>(K * pt);
  const IndexT cpg = IndexT(t.group_channels), s0 = IndexT(w.s) * IndexT(t.slice_len);
  const IndexT lo = s0 < cpg ? s0 : cpg, end = s0 + IndexT(t.slice_len);
  const int32_t len = static_cast<int32_t>((end < cpg ? end : cpg) - lo);
  const IndexT c0 = IndexT(w.g) * cpg + lo;
  const T* ya = input + n * static_cast<int64_t>(Cin * IndexT(HW)) +
                static_cast<int64_t>(c0 * IndexT(HW) + IndexT(r.at));
  const T* yb = ya + W;
  T* out = columns + static_cast<int64_t>(((IndexT(w.b) * Cin + c0) * K + IndexT(w.k)) * pt + IndexT(w.pl));
  // Unrolled by hand: a `#pragma unroll` loop over v[4] gave nvcc 13.0 a 104-instruction body for the 64-bit-index
  // float variant (sm_90) against 83 for this one.
  for (int32_t groups = len >> 2; groups > 0; --groups) {
    const Acc v0 = dcn_gather_value<Acc, T>(ya, yb, r);
    ya += HW;
    yb += HW;
    const Acc v1 = dcn_gather_value<Acc, T>(ya, yb, r);
    ya += HW;
    yb += HW;
    const Acc v2 = dcn_gather_value<Acc, T>(ya, yb, r);
    ya += HW;
    yb += HW;
    const Acc v3 = dcn_gather_value<Acc, T>(ya, yb, r);
    ya += HW;
    yb += HW;
    *out = from_acc<T>(v0);
    out += col_step;
    *out = from_acc<T>(v1);
    out += col_step;
    *out = from_acc<T>(v2);
    out += col_step;
    *out = from_acc<T>(v3);
    out += col_step;
  }
#if defined(__CUDA_ARCH__)
#pragma unroll 1
#endif
  for (int32_t c = len & 3; c > 0; --c) {
    *out = from_acc<T>(dcn_gather_value<Acc, T>(ya, yb, r));
    ya += HW;
    yb += HW;
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
