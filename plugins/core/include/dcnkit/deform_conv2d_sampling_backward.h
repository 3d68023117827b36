// DeformConv2d on CUDA: the per-thread body of the fused sampling backward (deform_conv2d_sampling_backward_kernel
// in deform_conv2d.cu), DCNKIT_HD so that the CPU runs it over the same launch grid
// (DCNKIT_DCN_CPU_PATH=cuda-schedule) and the counting harness (tests/cpp/kernel_counts.cpp) counts it.
//
// One thread owns one sampling point of a slice of channels (the backward grid of deform_conv2d_gather.h: slice
// fastest). It computes the point once -- its offset and mask loads, floor and fractions in the accumulation
// type on 32-bit integer coordinates, and a 2x2 window of pixels inside the map that holds every in-map neighbour
// of the cell (the cell itself, shifted by one row / column at the border), with the bilinear weights (times the
// mask) and derivative signs of the neighbours moved to their window positions (0 where a window pixel is no
// neighbour) -- and then visits its channels with per-plane pointers (64-bit only there; nothing 64-bit is
// converted to or from floating point): per channel one column-gradient load, the window's 4 loads (for the
// offset gradient), 4 atomics into grad_input (no branch: a window pixel of weight 0 adds 0), and the window's
// sums of gcol * value in registers. The slices of a point are reduced in a fixed order (dcn_slice_tree) and
// written once. A point outside the map issues no atomic and no load.
//
// Boundary contract (docs/operators.md, S_dcn): a neighbour outside the map is never read nor written; a window
// pixel that is no neighbour (the in-map pixel beside a border point's in-map neighbours) is read but left out of
// the offset/mask gradients, and receives + 0. A point outside (-1, H) x (-1, W) reads and adds nothing.
#pragma once

#include <cmath>

#include "dcnkit/deform_conv2d_gather.h"

namespace dcnkit {

// What one backward thread leaves for its point's reduction: the sums over its channels of gcol * dS/dy,
// gcol * dS/dx and gcol * S (unmasked), and the mask.
template <typename Acc>
struct DcnPointGrad {
  Acc gy, gx, gm, m;
};

// One axis of a point's window: the point's coordinate floor f0 and fraction l on an axis of n pixels. The
// window's first pixel b = f0 clamped into [0, max(n - 2, 0)]; its pixel b + a (a = 0, 1) is neighbour
// e = b + a - f0 of the cell when e is 0 or 1 and f0 + e is in [0, n): then wv[a] is that neighbour's weight
// (1 - l, l), ds[a] its derivative in the coordinate (-1, 1) and on[a] true; otherwise 0, 0, false.
template <typename Acc>
DCNKIT_HD void dcn_window_axis(int32_t f0, Acc l, int32_t n, bool inside, int32_t* b, Acc* wv, Acc* ds, bool* on) {
  const int32_t hi = n >= 2 ? n - 2 : 0;
  *b = f0 < 0 ? 0 : (f0 > hi ? hi : f0);
  for (int a = 0; a < 2; ++a) {
    const int32_t e = *b + a - f0;
    on[a] = inside && (e == 0 || e == 1) && f0 + e >= 0 && f0 + e < n;
    wv[a] = on[a] ? (e == 0 ? Acc(Acc(1) - l) : l) : Acc(0);
    ds[a] = on[a] ? (e == 0 ? Acc(-1) : Acc(1)) : Acc(0);
  }
}

// The sampling point of a backward thread: its window's first pixel `base` (in-plane offset) and the window
// pixels q = 2 ay + ax at base + {0, dx, dy, dy + dx}[q] (dx = 1 and dy = W, or 0 on an axis of one pixel);
// w[q] the masked weight of window pixel q, on[q] whether it is a neighbour; per axis the weights and derivative
// signs (wy, sy; wx, sx) for the offset/mask gradients.
template <typename Acc, typename IndexT>
struct DcnBackwardPoint {
  Acc m;
  Acc wy[2], sy[2], wx[2], sx[2];
  Acc w[4];
  bool on[4];
  bool inside;  // in (-1, H) x (-1, W)
  IndexT base;
};

// Offsets and mask of the point of backward thread w, loaded once; the window on 32-bit coordinates (the launchers
// keep H + 2 pad and W + 2 pad below 2^31: make_dcn_tile).
template <typename Acc, typename T, typename IndexT, int KH, int KW, bool kMask>
DCNKIT_HD DcnBackwardPoint<Acc, IndexT> dcn_backward_point(const DeformConv2dParams& p, const DcnTile& t,
                                                           const T* offset, const T* mask, const DcnThread& w) {
  using std::floor;
  const IndexT K = IndexT(dcn_kernel_size<KH, KW>(p));
  const IndexT P = IndexT(p.out_h) * IndexT(p.out_w), Gd = IndexT(p.attrs.deformable_groups);
  const int64_t n = t.n0 + w.b;
  const IndexT pos = IndexT(t.p0) + IndexT(w.pl);
  uint32_t ho, wo, i, j;
  t.out_w_div.divmod(static_cast<uint32_t>(pos), ho, wo);
  if (KW > 0) {
    i = w.k / uint32_t(KW > 0 ? KW : 1);
    j = w.k - i * uint32_t(KW > 0 ? KW : 1);
  } else {
    t.kernel_w_div.divmod(w.k, i, j);
  }
  const IndexT row = IndexT(w.g) * K + IndexT(w.k);  // the point's mask row; its offset rows are 2 row, 2 row + 1
  const T* off = offset + n * static_cast<int64_t>(IndexT(2) * Gd * K * P) + IndexT(2) * row * P + pos;
  const Acc oy = to_acc<Acc>(off[0]);
  const Acc ox = to_acc<Acc>(off[P]);
  DcnBackwardPoint<Acc, IndexT> r;
  r.m = kMask ? to_acc<Acc>(mask[n * static_cast<int64_t>(Gd * K * P) + row * P + pos]) : Acc(1);
  const DeformConv2dAttrs& a = p.attrs;
  const int32_t H = static_cast<int32_t>(p.height), W = static_cast<int32_t>(p.width);
  const int32_t y = int32_t(ho) * int32_t(a.stride_h) - int32_t(a.pad_h) + int32_t(i) * int32_t(a.dilation_h);
  const int32_t x = int32_t(wo) * int32_t(a.stride_w) - int32_t(a.pad_w) + int32_t(j) * int32_t(a.dilation_w);
  const Acc py = Acc(y) + oy, px = Acc(x) + ox;
  // A point outside (-1, H) x (-1, W) (NaN included) has no neighbour in the map.
  r.inside = py > Acc(-1) && py < Acc(H) && px > Acc(-1) && px < Acc(W);
  const Acc fy = r.inside ? Acc(floor(py)) : Acc(0), fx = r.inside ? Acc(floor(px)) : Acc(0);
  int32_t by, bx;
  bool ony[2], onx[2];
  dcn_window_axis<Acc>(static_cast<int32_t>(fy), Acc(py - fy), H, r.inside, &by, r.wy, r.sy, ony);
  dcn_window_axis<Acc>(static_cast<int32_t>(fx), Acc(px - fx), W, r.inside, &bx, r.wx, r.sx, onx);
  for (int q = 0; q < 4; ++q) {
    r.on[q] = ony[q >> 1] && onx[q & 1];
    r.w[q] = Acc(r.wy[q >> 1] * r.wx[q & 1]) * r.m;
  }
  r.base = IndexT(by) * IndexT(W) + IndexT(bx);
  return r;
}

// The channel loop of one thread: nc channels, their planes of x (input) and gi (grad_input, when kScatter)
// plane_step apart, each pointer at the window's first pixel (pixel q at {0, dx, dy, dy + dx}[q]; kFixed: dx is 1);
// the column gradient gcol[c * col_step], taken as 0 for a point outside the map. d[q] += gcol * x at window pixel
// q; gi there += w[q] * gcol (0 at a window pixel that is no neighbour of the cell: an in-map pixel next to the
// point's in-map neighbours).
template <bool kScatter, bool kFixed, typename Acc, typename T, typename G, typename IndexT, typename Add>
DCNKIT_HD void dcn_backward_channels(const T* x, G* gi, const T* gcol, IndexT plane_step, IndexT dx, IndexT dy,
                                     IndexT col_step, int32_t nc, bool inside, const Acc* w, Acc* d, Add add) {
  const IndexT ox = kFixed ? IndexT(1) : dx;
#if defined(__CUDA_ARCH__)
#pragma unroll 1
#endif
  for (int32_t c = 0; c < nc; ++c) {
    const Acc g = to_acc<Acc>(*gcol);
    const Acc v = inside ? g : Acc(0);
    const T* x2 = x + dy;
    d[0] += v * to_acc<Acc>(x[0]);
    d[1] += v * to_acc<Acc>(x[ox]);
    d[2] += v * to_acc<Acc>(x2[0]);
    d[3] += v * to_acc<Acc>(x2[ox]);
    if (kScatter) {
      G* g2 = gi + dy;
      add(gi, Acc(w[0] * v));
      add(gi + ox, Acc(w[1] * v));
      add(g2, Acc(w[2] * v));
      add(g2 + ox, Acc(w[3] * v));
      gi += plane_step;
    }
    x += plane_step;
    gcol += col_step;
  }
}

// The fused sampling backward: thread idx of the tile's backward grid reads the column gradient of its slice's
// channels once, scatters m * w_q * gcol into grad_input (type G: the storage type, or float32 for 16-bit types
// on CUDA) through add(G*, Acc) when grad_input is given (then the map is at least 2 x 2: the window's pixels are
// base + {0, 1, W, W + 1}), and returns its partial offset/mask gradient sums from
// the same loads (computed whether or not want_point_grad: the loads are shared). The caller reduces the partials
// of the slices of a point in a fixed order (dcn_slice_tree) and stores them once (deform_conv2d_point_grad_store).
template <typename Acc, typename T, typename IndexT, int KH, int KW, bool kMask, typename G, typename Add>
DCNKIT_HD DcnPointGrad<Acc> deform_conv2d_sampling_backward(const DeformConv2dParams& p, const DcnTile& t,
                                                            const T* input, const T* offset, const T* mask,
                                                            const T* grad_columns, const DcnThread& w,
                                                            G* grad_input, Add add) {
  const DcnBackwardPoint<Acc, IndexT> r = dcn_backward_point<Acc, T, IndexT, KH, KW, kMask>(p, t, offset, mask, w);
  const IndexT K = IndexT(dcn_kernel_size<KH, KW>(p)), W = IndexT(p.width);
  const IndexT HW = IndexT(p.height) * W, Cin = IndexT(p.in_channels), pt = IndexT(t.pt);
  // The slice's channels [c0, c0 + nc) of group g (the last slices of a group may hold fewer, or none).
  const IndexT cpg = IndexT(t.group_channels), s0 = IndexT(w.s) * IndexT(t.slice_len);
  const IndexT c0 = IndexT(w.g) * cpg + (s0 < cpg ? s0 : cpg);
  const IndexT s1 = s0 + IndexT(t.slice_len);
  const int32_t nc = static_cast<int32_t>((s1 < cpg ? s1 : cpg) - (s0 < cpg ? s0 : cpg));
  // Per-plane pointers: the slice's first channel plane of image n, at the window's first pixel.
  const int64_t plane = (t.n0 + w.b) * static_cast<int64_t>(Cin * HW) + static_cast<int64_t>(c0) * HW +
                        static_cast<int64_t>(r.base);
  const T* x = input + plane;
  const T* gcol = grad_columns + static_cast<int64_t>(((IndexT(w.b) * Cin + c0) * K + IndexT(w.k)) * pt + IndexT(w.pl));
  const IndexT dx = IndexT(p.width >= 2 ? 1 : 0), dy = p.height >= 2 ? W : IndexT(0), cs = K * pt;
  Acc d[4] = {Acc(0), Acc(0), Acc(0), Acc(0)};
  // A point outside the map reads and adds nothing: its gradients are 0 (no atomic -- formerly four adds of 0 on the
  // window clamped to pixel (0, 0), a hot spot under large offsets or padding -- and no load).
  if (!r.inside) {
  } else if (grad_input == nullptr) {
    dcn_backward_channels<false, false, Acc, T, G, IndexT>(x, grad_input, gcol, HW, dx, dy, cs, nc, r.inside, r.w, d,
                                                           add);
  } else {  // the schedule scatters only into maps of at least 2 x 2 (smaller ones take the sorted path)
    dcn_backward_channels<true, true, Acc, T, G, IndexT>(x, grad_input + plane, gcol, HW, dx, dy, cs, nc, r.inside,
                                                         r.w, d, add);
  }
  // Window pixels that are no neighbour are left out (selected, not multiplied: their values may be anything).
  for (int q = 0; q < 4; ++q) d[q] = r.on[q] ? d[q] : Acc(0);
  DcnPointGrad<Acc> g;
  const Acc e0 = r.wx[0] * d[0] + r.wx[1] * d[1], e1 = r.wx[0] * d[2] + r.wx[1] * d[3];  // rows, x-weighted
  g.gy = r.sy[0] * e0 + r.sy[1] * e1;
  g.gx = r.sx[0] * (r.wy[0] * d[0] + r.wy[1] * d[2]) + r.sx[1] * (r.wy[0] * d[1] + r.wy[1] * d[3]);
  g.gm = r.wy[0] * e0 + r.wy[1] * e1;
  g.m = r.m;
  return g;
}

// The same for thread idx of the tile's backward grid (want_point_grad: the partials are computed either way).
template <typename Acc, typename T, typename IndexT, int KH, int KW, bool kMask, typename G, typename Add>
DCNKIT_HD DcnPointGrad<Acc> deform_conv2d_sampling_backward(const DeformConv2dParams& p, const DcnTile& t,
                                                            const T* input, const T* offset, const T* mask,
                                                            const T* grad_columns, uint32_t idx,
                                                            bool want_point_grad, G* grad_input, Add add) {
  (void)want_point_grad;
  return deform_conv2d_sampling_backward<Acc, T, IndexT, KH, KW, kMask, G, Add>(
      p, t, input, offset, mask, grad_columns, dcn_backward_thread(t, idx), grad_input, add);
}

// Sums the partials v[0..S) of one point (S a power of two) in the order of a shuffle-down tree
// (v[l] += v[l + o] for o = S/2, ..., 1): the order the CUDA kernel's __shfl_down_sync reduction uses.
template <typename Acc>
DCNKIT_HD DcnPointGrad<Acc> dcn_slice_tree(DcnPointGrad<Acc>* v, int S) {
  for (int o = S / 2; o > 0; o >>= 1) {
    for (int l = 0; l < o; ++l) {
      v[l].gy += v[l + o].gy;
      v[l].gx += v[l + o].gx;
      v[l].gm += v[l + o].gm;
    }
  }
  return v[0];
}

// Stores the reduced offset/mask gradients of the point of backward thread idx (slice 0 stores): written
// once, no atomics. Either pointer may be null. In-image offsets in the index type (a 64-bit image base).
template <typename Acc, typename T, typename IndexT, int KH, int KW>
DCNKIT_HD void deform_conv2d_point_grad_store(const DeformConv2dParams& p, const DcnTile& t, const DcnThread& w,
                                              const DcnPointGrad<Acc>& g, T* grad_offset, T* grad_mask) {
  const IndexT K = IndexT(dcn_kernel_size<KH, KW>(p));
  const IndexT P = IndexT(p.out_h) * IndexT(p.out_w), Gd = IndexT(p.attrs.deformable_groups);
  const int64_t n = t.n0 + w.b;
  const IndexT row = IndexT(w.g) * K + IndexT(w.k), pos = IndexT(t.p0) + IndexT(w.pl);
  if (grad_offset) {
    T* go = grad_offset + n * static_cast<int64_t>(IndexT(2) * Gd * K * P) + static_cast<int64_t>(IndexT(2) * row * P + pos);
    go[0] = from_acc<T>(Acc(g.gy * g.m));
    go[P] = from_acc<T>(Acc(g.gx * g.m));
  }
  if (grad_mask)
    grad_mask[n * static_cast<int64_t>(Gd * K * P) + static_cast<int64_t>(row * P + pos)] = from_acc<T>(g.gm);
}

template <typename Acc, typename T, typename IndexT, int KH, int KW>
DCNKIT_HD void deform_conv2d_point_grad_store(const DeformConv2dParams& p, const DcnTile& t, uint32_t idx,
                                              const DcnPointGrad<Acc>& g, T* grad_offset, T* grad_mask) {
  deform_conv2d_point_grad_store<Acc, T, IndexT, KH, KW>(p, t, dcn_backward_thread(t, idx), g, grad_offset, grad_mask);
}

}  // namespace dcnkit
