// The tile gather (roi_gather.h) of RoIAlign, MultiLevelRoIAlign and DeformRoIPool: their footprints, tables and
// per-pixel contributions, and max mode's arg-max (the forward's winning sample of each (RoI, channel, bin), kept as
// its coordinates). The geometry is the forward's: the RoI head of roi_plan.h (roi_plan_head, multi_level_plan_head,
// deform_roi_plan_head), the bin corners of roi_bin_origin / deform_roi_pool_origin, the sample axis RoIAxis and the
// clamped rule roi_axis_taps -- the atomic backward's samples, summed per pixel in a fixed order.
#pragma once

#include <limits>

#include "dcnkit/roi_gather.h"
#include "dcnkit/roi_plan.h"

namespace dcnkit {

// RoIAlign's head of RoI k (roi_plan_head), and the map a head pools (image h.b, channel 0; channels H * W apart).
template <typename Acc, typename T>
struct RoIAlignHeadOf {
  RoIAlignParams p;
  const T* rois;
  DCNKIT_HD RoIPlanHead<Acc> operator()(int64_t k) const { return roi_plan_head<Acc>(p, rois, k); }
};
template <typename T>
struct RoIImageMap {
  const T* input;
  int64_t channels;
  template <typename Acc>
  DCNKIT_HD const T* operator()(const RoIPlanHead<Acc>& h) const {
    return input + h.b * channels * h.H * h.W;
  }
};

// The rows (or columns) of an axis of n pixels that `pooled` bins from `start`, `bin` apart, can reach.
template <typename Acc>
DCNKIT_HD bool roi_box_footprint_axis(Acc start, Acc bin, int64_t pooled, int64_t n, int32_t* a, int32_t* b) {
  const Acc end = start + index_to_acc<Acc>(pooled) * bin;
  return roi_footprint_axis(start < end ? start : end, start < end ? end : start, n, a, b);
}

// A bin's weight on pixel row (or column) y: its samples' weights along that axis (the factor of avg mode).
template <typename Acc>
DCNKIT_HD Acc roi_bin_axis_weight(Acc origin, Acc bin, int64_t g, int64_t y, int64_t n) {
  return roi_axis_weight<Acc>(roi_axis(origin, bin, g), g, !(bin < Acc(0)), y, n, RoIAxisTapsOf());
}

// Bin `bin` of RoI k onto pixel (y, x) of channels c0 .. c0 + nc (grad_output (K, C, bins)). avg: acc[c] += g * s
// (s: the bin's two factors, 1 / n folded in).
template <typename Acc, typename T>
DCNKIT_HD void roi_gather_bin_avg(int64_t k, int64_t C, int64_t bins, int64_t bin, int64_t c0, int nc,
                                  const T* grad_output, Acc s, Acc* acc) {
  const T* go = grad_output + (k * C + c0) * bins + bin;
  DCNKIT_PRAGMA_UNROLL
  for (int c = 0; c < roi_gather_channels<Acc>(); ++c) {
    if (c < nc) acc[c] += to_acc<Acc>(go[c * bins]) * s;
  }
}
// max: the taps of the bin's arg-max sample (coordinates at argmax[((k * C + c) * bins + bin) * 2], NaN: none) on a
// map of H x W that fall on the pixel, times g: roi_taps of the winning sample in 32-bit indices (check_roi_gather_grid),
// its four taps' weights (1 - ly or ly) x (1 - lx or lx) added where the tap is the pixel.
template <typename Acc, typename T>
DCNKIT_HD void roi_gather_bin_max(int64_t k, int64_t C, int64_t bins, int64_t bin, int64_t c0, int nc,
                                  const T* grad_output, const Acc* argmax, int32_t y, int32_t x, int32_t H, int32_t W,
                                  Acc* acc) {
  const T* go = grad_output + (k * C + c0) * bins + bin;
  DCNKIT_PRAGMA_UNROLL
  for (int c = 0; c < roi_gather_channels<Acc>(); ++c) {
    if (c >= nc) break;
    const Acc g = to_acc<Acc>(go[c * bins]);
    if (g == Acc(0)) continue;
    const Acc* a = argmax + ((k * C + c0 + c) * bins + bin) * 2;
    const RoIAxisTaps<Acc, int32_t> ty = roi_axis_taps(a[0], H), tx = roi_axis_taps(a[1], W);
    if (!(ty.inside && tx.inside)) continue;
    for (int q = 0; q < 4; ++q) {
      const bool hy = q >= 2, hx = (q & 1) != 0;
      if ((hy ? ty.hi : ty.lo) == y && (hx ? tx.hi : tx.lo) == x) {
        acc[c] += g * ((hy ? ty.l : Acc(1) - ty.l) * (hx ? tx.l : Acc(1) - tx.l));
      }
    }
  }
}

// RoIAlign and MultiLevelRoIAlign: head_of(k) is the forward's head (roi_plan_head / multi_level_plan_head); a
// launch writes the H x W map of one level (RoIAlign: level 0). Tables per RoI: the rows factor of every (bin row
// ph, pixel row y) -- 1 / n folded in, in avg mode -- then the columns factor of every (bin column pw, pixel column x);
// max mode (kMax: a separate instantiation, so that each kernel holds one path's registers) uses them only to skip the
// bins that cannot reach the pixel.
template <typename AccT, typename T, typename HeadOf, bool kMax>
struct RoIAlignGather {
  using Acc = AccT;
  HeadOf head_of;
  int64_t channels, pooled_h, pooled_w;
  int32_t level;
  int64_t H, W;
  const T* grad_output;
  const Acc* argmax;  // max mode (kMax): the arg-max coordinates
  int64_t k0;         // the chunk's first RoI and its tables
  const Acc* tables;

  DCNKIT_HD RoIFootprint footprint(int64_t k) const {
    const RoIPlanHead<Acc> h = head_of(k);
    RoIFootprint f = roi_no_footprint();
    if (h.b < 0 || !(h.n > Acc(0)) || h.level != level) return f;
    if (!roi_box_footprint_axis(h.box.y_start, h.box.bin_h, pooled_h, H, &f.y0, &f.y1) ||
        !roi_box_footprint_axis(h.box.x_start, h.box.bin_w, pooled_w, W, &f.x0, &f.x1)) {
      return roi_no_footprint();
    }
    f.b = static_cast<int32_t>(h.b);
    return f;
  }
  DCNKIT_HD int64_t table_entries() const { return pooled_h * H + pooled_w * W; }
  DCNKIT_HD Acc table(int64_t k, int64_t e) const {
    const RoIPlanHead<Acc> h = head_of(k);
    if (h.b < 0 || !(h.n > Acc(0)) || h.level != level) return Acc(0);
    Acc y0, x0;
    if (e < pooled_h * H) {
      roi_bin_origin<Acc, Acc>(h.box, e / H, int64_t(0), nullptr, nullptr, Acc(0), &y0, &x0);
      const Acc w = roi_bin_axis_weight(y0, h.box.bin_h, h.box.gh, e % H, H);
      return kMax ? w : div_count(w, h.n);
    }
    e -= pooled_h * H;
    roi_bin_origin<Acc, Acc>(h.box, int64_t(0), e / W, nullptr, nullptr, Acc(0), &y0, &x0);
    return roi_bin_axis_weight(x0, h.box.bin_w, h.box.gw, e % W, W);
  }
  DCNKIT_HD void add(int64_t k, int64_t c0, int nc, int32_t y, int32_t x, Acc* acc, RoIScratch) const {
    const Acc* rows = tables + (k - k0) * table_entries();
    const Acc* cols = rows + pooled_h * H;
    const int64_t bins = pooled_h * pooled_w;
    DCNKIT_PRAGMA_UNROLL_1
    for (int64_t ph = 0; ph < pooled_h; ++ph) {
      const Acc ay = rows[ph * H + y];
      if (ay == Acc(0)) continue;
      DCNKIT_PRAGMA_UNROLL_1
      for (int64_t pw = 0; pw < pooled_w; ++pw) {
        const Acc ax = cols[pw * W + x];
        if (ax == Acc(0)) continue;
        if constexpr (kMax) {
          roi_gather_bin_max<Acc, T>(k, channels, bins, ph * pooled_w + pw, c0, nc, grad_output, argmax, y, x,
                                     static_cast<int32_t>(H), static_cast<int32_t>(W), acc);
        } else {
          roi_gather_bin_avg<Acc, T>(k, channels, bins, ph * pooled_w + pw, c0, nc, grad_output, ay * ax, acc);
        }
      }
    }
  }
};

// DeformRoIPool (avg): every bin has its own corner (the RoI's offsets): the footprint is the union of its bins', the
// tables hold every (bin, row) then every (bin, column).
template <typename AccT, typename T>
struct DeformRoIGather {
  using Acc = AccT;
  DeformRoIPoolParams p;
  const T* rois;
  const T* offset;  // null: none
  const T* grad_output;
  int64_t k0;
  const Acc* tables;

  DCNKIT_HD RoIFootprint footprint(int64_t k) const {
    RoIFootprint f = roi_no_footprint();
    RoIThreadSlot<RoIAlignBox<Acc>> box;  // the loop's box (RoIThreadSlot)
    {
      const RoIPlanHead<Acc> h = deform_roi_plan_head<Acc>(p, rois, k);
      if (h.b < 0 || !(h.n > Acc(0))) return f;
      f = RoIFootprint{static_cast<int32_t>(h.b), 0, -1, 0, -1};
      roi_box_store(box.p, h.box);
    }
    for (int64_t ph = 0; ph < p.attrs.pooled_h; ++ph) {
      for (int64_t pw = 0; pw < p.attrs.pooled_w; ++pw) {
        Acc y0, x0;
        deform_roi_pool_origin<Acc, T>(p, *box.p, offset, k, ph, pw, &y0, &x0);
        int32_t a, b, c, d;
        if (roi_box_footprint_axis(y0, box.p->bin_h, 1, p.height, &a, &b) &&
            roi_box_footprint_axis(x0, box.p->bin_w, 1, p.width, &c, &d)) {
          roi_footprint_join(a, b, &f.y0, &f.y1);
          roi_footprint_join(c, d, &f.x0, &f.x1);
        }
      }
    }
    return f.y0 > f.y1 ? roi_no_footprint() : f;
  }
  DCNKIT_HD int64_t table_entries() const { return p.attrs.pooled_h * p.attrs.pooled_w * (p.height + p.width); }
  DCNKIT_HD Acc table(int64_t k, int64_t e) const {
    const RoIPlanHead<Acc> h = deform_roi_plan_head<Acc>(p, rois, k);
    if (h.b < 0 || !(h.n > Acc(0))) return Acc(0);
    const int64_t ow = p.attrs.pooled_w, bins = p.attrs.pooled_h * ow, H = p.height, W = p.width;
    const bool row = e < bins * H;
    const int64_t bin = row ? e / H : (e - bins * H) / W, at = row ? e % H : (e - bins * H) % W;
    Acc y0, x0;
    deform_roi_pool_origin<Acc, T>(p, h.box, offset, k, bin / ow, bin % ow, &y0, &x0);
    if (row) return div_count(roi_bin_axis_weight(y0, h.box.bin_h, h.box.gh, at, H), h.n);
    return roi_bin_axis_weight(x0, h.box.bin_w, h.box.gw, at, W);
  }
  DCNKIT_HD void add(int64_t k, int64_t c0, int nc, int32_t y, int32_t x, Acc* acc, RoIScratch) const {
    const int64_t bins = p.attrs.pooled_h * p.attrs.pooled_w, H = p.height, W = p.width;
    const Acc* rows = tables + (k - k0) * table_entries();
    const Acc* cols = rows + bins * H;
    for (int64_t bin = 0; bin < bins; ++bin) {
      const Acc ay = rows[bin * H + y];
      if (ay == Acc(0)) continue;
      const Acc ax = cols[bin * W + x];
      if (ax == Acc(0)) continue;
      roi_gather_bin_avg<Acc, T>(k, p.channels, bins, bin, c0, nc, grad_output, ay * ax, acc);
    }
  }
};

// Max mode: the arg-max sample of a bin with corner (y0, x0) of channel map `img` -- roi_bin_scatter's choice (the
// first largest in the full loop's order, a run of samples outside the map a candidate 0) -- as its coordinates in
// out[0], out[1]; NaN when the winner is outside the map or the grid is empty (no gradient). frame: the visit's.
template <typename Acc, typename T, typename F>
DCNKIT_HD void roi_gather_argmax(const RoIPlanHead<Acc>& h, const T* img, Acc y0, Acc x0, Acc* out, F frame) {
  const Acc nan = std::numeric_limits<Acc>::quiet_NaN();
  out[0] = out[1] = nan;
  if (h.b < 0 || !(h.n > Acc(0))) return;
  RoIBinMax<Acc, T> v{img, false, false, Acc(0), {0, 0}};
  roi_bin_visit_at(h.box, y0, x0, h.H, h.W, v, frame);
  if (v.any && v.inside) {  // the winner's coordinates, from the axes the visit kept in its frame
    out[0] = roi_sample_coord<Acc>(frame->y0, frame->bin_h, frame->gh, v.id.iy);
    out[1] = roi_sample_coord<Acc>(frame->x0, frame->bin_w, frame->gw, v.id.ix);
  }
}

// Element i of the (K, C, bins) arg-max of RoIAlign / MultiLevelRoIAlign: map_of(h) is the head's map of image
// h.b, channel 0 (its level's); maps of a channel are H * W apart. frame: the visit's (RoIVisitFrame).
template <typename Acc, typename HeadOf, typename MapOf, typename F>
DCNKIT_HD void roi_gather_argmax_at(const HeadOf& head_of, const MapOf& map_of, int64_t C, int64_t pooled_w,
                                    int64_t bins, int64_t i, Acc* argmax, F frame) {
  const int64_t bin = i % bins, c = (i / bins) % C, k = i / bins / C;
  const RoIPlanHead<Acc> h = head_of(k);
  Acc y0, x0;
  roi_bin_origin<Acc, Acc>(h.box, bin / pooled_w, bin % pooled_w, nullptr, nullptr, Acc(0), &y0, &x0);
  roi_gather_argmax<Acc>(h, h.b < 0 ? nullptr : map_of(h) + c * h.H * h.W, y0, x0, argmax + 2 * i, frame);
}

}  // namespace dcnkit
