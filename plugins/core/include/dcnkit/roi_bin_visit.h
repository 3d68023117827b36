// Bounded sampling grids: the samples of a RoIAlign bin that can contribute, and the bin functions over them (forward
// mean or max, backward scatter, the corner's derivatives). Included by roi_kernels.h, after the boxes.
//
// An adaptive grid has ceil(roi / pooled) samples per bin and axis: unbounded for a huge box (a box of 1e9 pixels on
// an 8 x 8 map asks for ~1e17 samples). Only the samples whose coordinate falls in the sampling region of the map can
// contribute, about twice the map size per axis at most, and the functions below visit only those. Per axis, the
// index range of the samples inside is found by bisection on the sampling expression itself (the coordinate is
// monotone in the index in floating point too), so exactly the samples a full loop finds inside are visited, in the
// loop's order, and the divisor stays the full sample count: results are those of the full loop. Samples outside add
// 0 to a sum; for a max, each run of consecutive outside samples is one candidate 0 at the place of its first sample
// in the loop, which keeps the full loop's maximum and arg-max (ties: the first).
// In exact arithmetic at most 2 * extent + 3 samples of an adaptive axis land on the map (they are more than 0.5
// apart). Rounding can put more there where box coordinates are huge: in float32 beyond ~2^22 feature pixels,
// consecutive samples round to the same point. An axis with more samples inside than roi_axis_cap visits each run of
// equal samples once, weighted by its length (the sum then differs from the sequential one in the last bits), which
// keeps the work bounded; below the cap every sample inside is visited one by one. Sample indices are 32-bit
// (kMaxGridSamples).
//
// Registers (the SASS rules: 48 per thread): the visit keeps the values that do not change within its loops
// (the two axes, the index ranges, the map's size) in a frame that a kernel puts in shared memory, one per thread,
// read at each use through a volatile pointer; a visitor sees each sample as its two axes' taps (RoIBinSample) and
// keeps an arg-max as the sample's indices, whose taps are recomputed after the visit.
#pragma once

namespace dcnkit {

// First i in [lo, hi) with pred(i), for a predicate that is false then true on [lo, hi); hi if none.
template <typename Pred>
DCNKIT_HD int32_t first_true(int32_t lo, int32_t hi, const Pred& pred) {
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (pred(mid)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// Samples [lo, hi) of one axis (empty when lo >= hi).
struct SampleRange {
  int32_t lo, hi;
};

// The samples i in [0, n) whose coordinate coord(i) lies in [a, b], for a coordinate non-decreasing in
// i (`increasing`) or non-increasing. NaN is outside.
template <typename Acc, typename Coord>
DCNKIT_HD SampleRange sample_range(int32_t n, bool increasing, Acc a, Acc b, const Coord& coord) {
  SampleRange r;
  if (increasing) {
    r.lo = first_true(0, n, [&](int32_t i) { return coord(i) >= a; });
    r.hi = first_true(r.lo, n, [&](int32_t i) { return !(coord(i) <= b); });
  } else {
    r.lo = first_true(0, n, [&](int32_t i) { return coord(i) <= b; });
    r.hi = first_true(r.lo, n, [&](int32_t i) { return !(coord(i) >= a); });
  }
  return r;
}

// End (exclusive) of the run of samples from i on that equal sample i, within [i, hi): same(j) says whether j does.
template <typename Same>
DCNKIT_HD int32_t run_end(int32_t i, int32_t hi, const Same& same) {
  if (i + 1 >= hi || !same(i + 1)) return i + 1;
  return first_true(i + 2, hi, [&](int32_t j) { return !same(j); });
}
// The same for one coordinate: the samples whose coordinate equals c = coord(i).
template <typename Acc, typename Coord>
DCNKIT_HD int32_t sample_run_end(int32_t i, int32_t hi, Acc c, const Coord& coord) {
  return run_end(i, hi, [&](int32_t j) { return coord(j) == c; });
}

// Coordinate of sample i along one axis of a RoIAlign bin: origin + (i + 0.5) * bin / g, g the axis's samples.
template <typename Acc>
DCNKIT_HD Acc roi_sample_coord(Acc origin, Acc bin, Acc g, int32_t i) {
  return origin + div_count((static_cast<Acc>(i) + Acc(0.5)) * bin, g);
}
template <typename Acc>
struct RoIAxis {
  Acc origin, bin, g;
  DCNKIT_HD Acc operator()(int32_t i) const { return roi_sample_coord(origin, bin, g, i); }
};
template <typename Acc>
DCNKIT_HD RoIAxis<Acc> roi_axis(Acc origin, Acc bin, int32_t g) {
  return RoIAxis<Acc>{origin, bin, static_cast<Acc>(g)};
}

// Sample (iy, ix) of a bin whose top-left corner is (y0, x0). Box: a RoIAlignBox<Acc>, possibly volatile.
template <typename Acc, typename Box>
DCNKIT_HD Taps<Acc> roi_bin_sample(const Box& b, Acc y0, Acc x0, int32_t iy, int32_t ix, int64_t H, int64_t W) {
  return roi_taps(roi_sample_coord<Acc>(y0, b.bin_h, static_cast<Acc>(b.gh), iy),
                  roi_sample_coord<Acc>(x0, b.bin_w, static_cast<Acc>(b.gw), ix), H, W);
}

// Number of samples of a bin (0: empty grid).
template <typename Acc>
DCNKIT_HD int64_t roi_bin_samples(const RoIAlignBox<Acc>& b) {
  if (b.gh <= 0 || b.gw <= 0) return 0;
  return int64_t(b.gh) * b.gw;
}

// The divisor of an avg bin: its number of samples gh * gw (0: empty grid).
template <typename Acc>
DCNKIT_HD Acc roi_bin_count(const RoIAlignBox<Acc>& b) {
  return index_to_acc<Acc>(roi_bin_samples(b));
}

// Most samples inside visited one by one along an axis of the map's `extent` (see above).
DCNKIT_HD int64_t roi_axis_cap(int64_t extent) {
  const int64_t c = 4 * (extent + 2);
  return c > kMaxSamplingRatio ? c : kMaxSamplingRatio;
}

// ---------------------------------------------------------------------------------------------
// Samples as visitors see them

// Where a sample sits in its source: the grid's indices (a bounded visit), or a position in iy (an array, a plan).
struct RoISampleId {
  int32_t iy, ix;
};

// A sample of a bounded visit (or a run of equal samples): its two axes' taps (roi_axis_taps; inside when both are),
// the samples it stands for (m: 1, a run's length; a run outside the map: not inside), the map's width and its
// place. value() and taps() are taps_value and roi_taps of the sample, the same bits.
template <typename Acc>
struct RoIBinSample {
  RoIAxisTaps<Acc, AxisIndex> y, x;
  Acc m;
  AxisIndex W;
  RoISampleId id;
  DCNKIT_HD bool inside() const { return y.inside && x.inside; }
  template <typename T>
  DCNKIT_HD Acc value(const T* img) const {
    const Acc hy = Acc(1) - y.l, hx = Acc(1) - x.l;
    const T* r0 = img + static_cast<int64_t>(y.lo) * W;
    const T* r1 = img + static_cast<int64_t>(y.hi) * W;
    Acc v = Acc(0);
    v += hy * hx * to_acc<Acc>(r0[x.lo]);
    v += hy * x.l * to_acc<Acc>(r0[x.hi]);
    v += y.l * hx * to_acc<Acc>(r1[x.lo]);
    v += y.l * x.l * to_acc<Acc>(r1[x.hi]);
    return v;
  }
  // taps_coord_grad of the sample (the same sums, in its order): d value / dy and d value / dx.
  template <typename T>
  DCNKIT_HD void coord_grad(const T* img, Acc* gy, Acc* gx) const {
    const Acc hy = Acc(1) - y.l, hx = Acc(1) - x.l;
    const T* r0 = img + static_cast<int64_t>(y.lo) * W;
    const T* r1 = img + static_cast<int64_t>(y.hi) * W;
    Acc v = to_acc<Acc>(r0[x.lo]);
    Acc dy = Acc(0) + (-hx) * v, dx = Acc(0) + (-hy) * v;
    v = to_acc<Acc>(r0[x.hi]);
    dy += (-x.l) * v;
    dx += hy * v;
    v = to_acc<Acc>(r1[x.lo]);
    dy += hx * v;
    dx += (-y.l) * v;
    v = to_acc<Acc>(r1[x.hi]);
    dy += x.l * v;
    dx += y.l * v;
    *gy = dy;
    *gx = dx;
  }
  DCNKIT_HD Taps<Acc> taps() const {
    Taps<Acc> t;
    if (!inside()) {
      taps_clear(t);
      return t;
    }
    const bool ok[4] = {true, true, true, true};
    taps_fill(t, W, y.lo, x.lo, y.hi, x.hi, y.l, x.l, ok);
    return t;
  }
};

// A sample already in taps (a collected array's, a plan's).
template <typename Acc>
struct RoITapsSample {
  Taps<Acc> t;
  Acc m;
  RoISampleId id;
  DCNKIT_HD bool inside() const { return t.inside; }
  template <typename T>
  DCNKIT_HD Acc value(const T* img) const {
    return taps_value(img, t);
  }
  template <typename T>
  DCNKIT_HD void coord_grad(const T* img, Acc* gy, Acc* gx) const {
    taps_coord_grad(img, t, *gy, *gx);
  }
  DCNKIT_HD Taps<Acc> taps() const { return t; }
};

// ---------------------------------------------------------------------------------------------
// The bounded visit of one bin

// What the visit's loops read but do not change: the two axes (roi_sample_coord's origin, bin and samples), the
// rows' end and the columns' range, the map's size. Device kernels keep one per thread in shared memory and pass it
// as a volatile pointer (RoIFrameOf); elsewhere a local.
template <typename Acc>
struct RoIVisitFrame {
  Acc y0, bin_h, gh, x0, bin_w, gw;
  int32_t yhi, xlo, xhi;
  AxisIndex H, W;
};
template <typename Acc>
using RoIFrameRef = DeviceVolatile<RoIVisitFrame<Acc>>*;

template <typename F>
struct RoIFrameAxisY {
  F f;
  DCNKIT_HD auto operator()(int32_t i) const { return roi_sample_coord(f->y0, f->bin_h, f->gh, i); }
};
template <typename F>
struct RoIFrameAxisX {
  F f;
  DCNKIT_HD auto operator()(int32_t i) const { return roi_sample_coord(f->x0, f->bin_w, f->gw, i); }
};

// Visits the samples of one RoIAlign bin with corner (y0, x0) that can contribute, in the order of the full loop (iy
// outer, ix inner): visit(s) (RoIBinSample) for each sample inside the map (m = 1), or each run of m equal samples
// beyond roi_axis_cap, and for an outside sample where a run of samples outside the map begins. Stops early when
// visit returns false. f: the frame the loops read (see RoIVisitFrame). Box: a RoIAlignBox<Acc>, possibly volatile.
template <typename Acc, typename Box, typename Visit, typename F>
DCNKIT_HD void roi_bin_visit_at(const Box& b, Acc y0, Acc x0, int64_t H, int64_t W, Visit& visit, F f) {
  const int32_t gh = b.gh, gw = b.gw;
  if (gh <= 0 || gw <= 0) return;
  const Acc bin_h = b.bin_h, bin_w = b.bin_w;
  f->y0 = y0;
  f->bin_h = bin_h;
  f->gh = static_cast<Acc>(gh);
  f->x0 = x0;
  f->bin_w = bin_w;
  f->gw = static_cast<Acc>(gw);
  f->H = static_cast<AxisIndex>(H);
  f->W = static_cast<AxisIndex>(W);
  const RoIFrameAxisY<F> ay{f};
  const RoIFrameAxisX<F> ax{f};
  SampleRange ry{0, 0}, rx{0, 0};
  if (f->H > 0 && f->W > 0) {  // roi_taps: inside when -1 <= y <= H and -1 <= x <= W
    // (the map's size tested and converted from the frame: a test or conversion of the kernel's parameter would be
    // hoisted out of the caller's loops into registers)
    ry = sample_range(gh, !(bin_h < Acc(0)), Acc(-1), index_to_acc<Acc>(static_cast<AxisIndex>(f->H)), ay);
    if (ry.lo < ry.hi) rx = sample_range(gw, !(bin_w < Acc(0)), Acc(-1), index_to_acc<Acc>(static_cast<AxisIndex>(f->W)), ax);
  }
  RoIBinSample<Acc> out;
  out.y.inside = out.x.inside = false;
  out.m = Acc(0);
  if (ry.lo >= ry.hi || rx.lo >= rx.hi) {
    visit(out);
    return;
  }
  const bool y_runs = ry.hi - ry.lo > roi_axis_cap(H), x_runs = rx.hi - rx.lo > roi_axis_cap(W);
  const bool x_before = rx.lo > 0, x_after = rx.hi < gw, y_after = ry.hi < gh;
  f->yhi = ry.hi;
  f->xlo = rx.lo;
  f->xhi = rx.hi;
  if (ry.lo > 0 && !visit(out)) return;
  for (int32_t iy = ry.lo; iy < f->yhi;) {
    const Acc y = ay(iy);
    const int32_t ey = y_runs ? sample_run_end(iy, f->yhi, y, ay) : iy + 1;
    if (x_before && !visit(out)) return;
    RoIBinSample<Acc> s;
    s.y = roi_axis_taps(y, f->H);
    s.id.iy = iy;
    for (int32_t ix = f->xlo; ix < f->xhi;) {
      const Acc x = ax(ix);
      const int32_t ex = x_runs ? sample_run_end(ix, f->xhi, x, ax) : ix + 1;
      s.x = roi_axis_taps(x, f->W);
      s.m = static_cast<Acc>(ey - iy) * static_cast<Acc>(ex - ix);
      s.W = f->W;
      s.id.ix = ix;
      if (!visit(s)) return;
      ix = ex;
    }
    if (x_after && !visit(out)) return;
    iy = ey;
  }
  if (y_after) visit(out);
}
template <typename Acc, typename Visit>
DCNKIT_HD void roi_bin_visit_at(const RoIAlignBox<Acc>& b, Acc y0, Acc x0, int64_t H, int64_t W, Visit& visit) {
  RoIVisitFrame<Acc> frame;
  roi_bin_visit_at<Acc>(b, y0, x0, H, W, visit, &frame);
}

// ---------------------------------------------------------------------------------------------
// Sample sources of the bin functions, visited in the same order: a bin's samples found on the fly (RoIBinTaps: the
// bounded visit; CUDA), or collected once per RoI and bin and reused for every channel (TapsArray; CPU). taps_at(id)
// gives the taps of the sample with that place.
template <typename Acc>
struct RoISample {
  Taps<Acc> t;
  Acc m;  // number of equal samples (0 for an outside run)
};
template <typename Acc, typename F, typename Box = RoIAlignBox<Acc>>
struct RoIBinTaps {
  const Box* box;  // possibly volatile (a block's head in shared memory)
  Acc y0, x0;
  int64_t H, W;
  F frame;  // the visit's (RoIVisitFrame)
  template <typename Visit>
  DCNKIT_HD void visit(Visit& v) const {
    roi_bin_visit_at<Acc>(*box, y0, x0, H, W, v, frame);
  }
  DCNKIT_HD Taps<Acc> taps_at(RoISampleId id) const { return roi_bin_sample<Acc>(*box, y0, x0, id.iy, id.ix, H, W); }
};
template <typename Acc>
struct TapsArray {
  const RoISample<Acc>* s;
  int64_t n;
  template <typename Visit>
  DCNKIT_HD void visit(Visit& v) const {
    for (int32_t i = 0; i < n; ++i)
      if (!v(RoITapsSample<Acc>{s[i].t, s[i].m, RoISampleId{i, 0}})) return;
  }
  DCNKIT_HD Taps<Acc> taps_at(RoISampleId id) const { return s[id.iy].t; }
};

// Visitors of the bin functions (any sample type above).
template <typename Acc, typename T>
struct RoIBinSum {  // sum of the samples inside
  const T* img;
  Acc sum;
  template <typename S>
  DCNKIT_HD bool operator()(const S& s) {
    if (s.inside()) sum += s.value(img) * s.m;
    return true;
  }
};
template <typename Acc, typename T>
struct RoIBinMax {  // largest sample (outside: 0), the first on ties; where it is, and whether it is inside
  const T* img;
  bool any, inside;
  Acc best;
  RoISampleId id;
  template <typename S>
  DCNKIT_HD bool operator()(const S& s) {
    const Acc v = s.inside() ? s.value(img) : Acc(0);
    if (!any || v > best) {
      any = true;
      best = v;
      inside = s.inside();
      id = s.id;
    }
    return true;
  }
};
template <typename Acc, typename Add>
struct RoIBinSpread {  // g to every sample inside, times its weights
  Acc g;
  Add* add;
  template <typename S>
  DCNKIT_HD bool operator()(const S& s) {
    if (!s.inside()) return true;
    const Acc gm = g * s.m;
    const Taps<Acc> t = s.taps();
    for (int i = 0; i < 4; ++i) (*add)(t.idx[i], gm * t.w[i]);
    return true;
  }
};
template <typename Acc, typename T>
struct RoIBinCoordSum {  // sums of dS/dy and dS/dx over the samples inside
  const T* img;
  Acc sy, sx;
  template <typename S>
  DCNKIT_HD bool operator()(const S& s) {
    if (!s.inside()) return true;
    Acc dy, dx;
    s.coord_grad(img, &dy, &dx);
    sy += dy * s.m;
    sx += dx * s.m;
    return true;
  }
};

// Forward of one bin of one channel map `img` from its samples (`n` of them, roi_bin_count): the mean
// (avg) or the largest (max); 0 when n == 0.
template <typename Acc, typename T, typename Src>
DCNKIT_HD Acc roi_bin_reduce(const T* img, Acc n, const Src& src, bool max_mode) {
  if (!(n > Acc(0))) return Acc(0);
  if (max_mode) {
    RoIBinMax<Acc, T> v{img, false, false, Acc(0), {0, 0}};
    src.visit(v);
    return v.best;
  }
  RoIBinSum<Acc, T> v{img, Acc(0)};
  src.visit(v);
  return div_count(v.sum, n);
}

// Backward of one bin: scatters the bin's output gradient g into the channel's input gradient through
// add(index, value) (CPU: +=, CUDA: atomicAdd). avg: g / n to every sample; max: g to the arg-max
// sample, recomputed from `img` (avg does not read `img`).
template <typename Acc, typename T, typename Src, typename Add>
DCNKIT_HD void roi_bin_scatter(const T* img, Acc n, const Src& src, bool max_mode, Acc g, Add& add) {
  if (!(n > Acc(0))) return;
  if (max_mode) {
    RoIBinMax<Acc, T> v{img, false, false, Acc(0), {0, 0}};
    src.visit(v);
    if (!v.any || !v.inside) return;
    const Taps<Acc> t = src.taps_at(v.id);
    for (int i = 0; i < 4; ++i) add(t.idx[i], g * t.w[i]);
    return;
  }
  RoIBinSpread<Acc, Add> v{div_count(g, n), &add};
  src.visit(v);
}

// Derivatives of one avg bin's value with respect to its corner (y0, x0) (every sample moves with
// it): the mean over samples of dS/dy and dS/dx. DeformRoIPool's offset gradient is
// gamma * roi_w * (sum over channels of g * gx) in x and gamma * roi_h * (... gy) in y.
template <typename Acc, typename T, typename Src>
DCNKIT_HD void roi_bin_coord_grad(const T* img, Acc n, const Src& src, Acc* gy, Acc* gx) {
  *gy = Acc(0);
  *gx = Acc(0);
  if (!(n > Acc(0))) return;
  RoIBinCoordSum<Acc, T> v{img, Acc(0), Acc(0)};
  src.visit(v);
  *gy = div_count(v.sy, n);
  *gx = div_count(v.sx, n);
}

// The same three, sampling on the fly (one bin with corner (y0, x0)); frame: the visit's (RoIVisitFrame).
template <typename Acc, typename T, typename F>
DCNKIT_HD Acc roi_align_bin_forward(const T* img, int64_t H, int64_t W, const RoIAlignBox<Acc>& b,
                                    Acc y0, Acc x0, bool max_mode, F frame) {
  return roi_bin_reduce<Acc>(img, roi_bin_count(b), RoIBinTaps<Acc, F>{&b, y0, x0, H, W, frame}, max_mode);
}
template <typename Acc, typename T, typename Add, typename F>
DCNKIT_HD void roi_align_bin_backward(const T* img, int64_t H, int64_t W, const RoIAlignBox<Acc>& b,
                                      Acc y0, Acc x0, bool max_mode, Acc g, Add& add, F frame) {
  roi_bin_scatter<Acc>(img, roi_bin_count(b), RoIBinTaps<Acc, F>{&b, y0, x0, H, W, frame}, max_mode, g, add);
}
template <typename Acc, typename T, typename F>
DCNKIT_HD void roi_align_bin_coord_grad(const T* img, int64_t H, int64_t W, const RoIAlignBox<Acc>& b,
                                        Acc y0, Acc x0, Acc* gy, Acc* gx, F frame) {
  roi_bin_coord_grad<Acc>(img, roi_bin_count(b), RoIBinTaps<Acc, F>{&b, y0, x0, H, W, frame}, gy, gx);
}
// The same with a local frame (the CPU drivers).
template <typename Acc, typename T>
DCNKIT_HD Acc roi_align_bin_forward(const T* img, int64_t H, int64_t W, const RoIAlignBox<Acc>& b, Acc y0, Acc x0,
                                    bool max_mode) {
  RoIVisitFrame<Acc> frame;
  return roi_align_bin_forward<Acc>(img, H, W, b, y0, x0, max_mode, &frame);
}
template <typename Acc, typename T, typename Add>
DCNKIT_HD void roi_align_bin_backward(const T* img, int64_t H, int64_t W, const RoIAlignBox<Acc>& b, Acc y0, Acc x0,
                                      bool max_mode, Acc g, Add& add) {
  RoIVisitFrame<Acc> frame;
  roi_align_bin_backward<Acc, T>(img, H, W, b, y0, x0, max_mode, g, add, &frame);
}
template <typename Acc, typename T>
DCNKIT_HD void roi_align_bin_coord_grad(const T* img, int64_t H, int64_t W, const RoIAlignBox<Acc>& b, Acc y0, Acc x0,
                                        Acc* gy, Acc* gx) {
  RoIVisitFrame<Acc> frame;
  roi_align_bin_coord_grad<Acc>(img, H, W, b, y0, x0, gy, gx, &frame);
}

}  // namespace dcnkit
