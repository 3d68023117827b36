// DeformPSRoIPool's deterministic backward: grad_input by the tile gather (roi_gather.h), grad_trans by one thread per
// trans entry summing its outputs in a fixed order (psroi_trans_grad_entry). The geometry is the forward's
// (psroi_kernels.h: psroi_box, psroi_bin_of_box, the sample axis PSRoIAxis and the rule psroi_axis_taps); the weights
// are the atomic backward's: g / count (the forward's count) times each sample's bilinear weights, summed per pixel.
#pragma once

#include "dcnkit/fast_divmod.h"
#include "dcnkit/psroi_kernels.h"
#include "dcnkit/roi_gather.h"

namespace dcnkit {

// The output bins [*first, *last] (along one axis of P) that read group cell g of G (div: division by G):
// floor(i * G / P) == g (32-bit: G * (P + 1) < 2^31, checked on the host by psroi_gather_supported).
DCNKIT_HD void psroi_group_bins(uint32_t g, const FastDivmod& div, uint32_t P, int64_t* first, int64_t* last) {
  const uint32_t G = div.d;
  *first = div.div(g * P + G - 1);
  const uint32_t end = div.div((g + 1) * P + G - 1);
  *last = int64_t(end < P ? end : P) - 1;
}
DCNKIT_HD void psroi_group_bins(uint32_t g, uint32_t G, uint32_t P, int64_t* first, int64_t* last) {
  *first = (g * P + G - 1) / G;
  const uint32_t end = ((g + 1) * P + G - 1) / G;
  *last = int64_t(end < P ? end : P) - 1;
}

// The 32-bit index arithmetic of the gather: channels, group_size * output_size below 2^31.
inline bool psroi_gather_supported(const DeformPSRoIPoolParams& p) {
  const int64_t lim = int64_t(1) << 31;
  const int64_t classes = p.num_classes > 0 ? p.num_classes : 1, P = p.attrs.output_size;
  return p.channels < lim && p.attrs.group_size * (P + 1) < lim && p.attrs.part_size * (P + 1) < lim &&
         P < lim / (P > 0 ? P : 1) / classes;  // add(): a class's bin (cell + ph * P + pw) in 32 bits
}

// grad_input (N, output_dim * G^2, H, W): input channel c is read by outputs (k, c / G^2, ph, pw) whose bin is in
// group cell ((c / G) % G, c % G). Tables per RoI: for every class with its own trans (one without trans, or one
// class) and bin, its rows factor on every pixel row, then its columns factor on every pixel column. scale: the
// per-output g / count (psroi_gather_scale).
template <typename AccT, typename T>
struct PSRoIGather {
  using Acc = AccT;
  DeformPSRoIPoolParams p;
  const T* rois;
  const T* trans;  // null: none
  const Acc* scale;
  int64_t k0;
  const Acc* tables;
  FastDivmod div_g, div_gg, div_class;  // by group_size, group_size^2, output channels per class (no division in add)

  // Host: the gather of params p (psroi_gather_supported).
  static PSRoIGather make(const DeformPSRoIPoolParams& p, const T* rois, const T* trans, const Acc* scale) {
    const uint32_t G = static_cast<uint32_t>(p.attrs.group_size);
    return PSRoIGather{p, rois, trans, scale, 0, nullptr, FastDivmod(G), FastDivmod(G * G),
                       FastDivmod(static_cast<uint32_t>(p.attrs.output_dim / p.num_classes))};
  }

  DCNKIT_HD int64_t classes() const { return trans != nullptr ? p.num_classes : 1; }
  // The union over the RoI's bins (every class's) of their samples' spans.
  DCNKIT_HD RoIFootprint footprint(int64_t k) const {
    const T* roi = rois + k * 5;
    int64_t b = 0;
    if (!roi_batch_index<Acc>(roi, p.batch, &b)) return roi_no_footprint();
    const PSRoIBox<Acc> box = psroi_box<Acc, T>(p, roi);
    const int64_t P = p.attrs.output_size, per_class = p.attrs.output_dim / p.num_classes;
    const Acc last = index_to_acc<Acc>(p.attrs.sample_per_part - 1);
    RoIFootprint f{static_cast<int32_t>(b), 0, -1, 0, -1};
    for (int64_t cls = 0; cls < classes(); ++cls) {
      for (int64_t ph = 0; ph < P; ++ph) {
        for (int64_t pw = 0; pw < P; ++pw) {
          const PSRoIBin<Acc> r = psroi_bin_of_box<Acc, T>(p, box, trans, k, cls * per_class, ph, pw);
          const Acc he = r.h0 + last * r.sub_h, we = r.w0 + last * r.sub_w;
          int32_t a0, a1, c0, c1;
          if (roi_footprint_axis(r.h0 < he ? r.h0 : he, r.h0 < he ? he : r.h0, p.height, &a0, &a1) &&
              roi_footprint_axis(r.w0 < we ? r.w0 : we, r.w0 < we ? we : r.w0, p.width, &c0, &c1)) {
            roi_footprint_join(a0, a1, &f.y0, &f.y1);
            roi_footprint_join(c0, c1, &f.x0, &f.x1);
          }
        }
      }
    }
    return f.y0 > f.y1 ? roi_no_footprint() : f;
  }
  DCNKIT_HD int64_t table_entries() const {
    return classes() * p.attrs.output_size * p.attrs.output_size * (p.height + p.width);
  }
  DCNKIT_HD Acc table(int64_t k, int64_t e) const {
    const T* roi = rois + k * 5;
    int64_t b = 0;
    if (!roi_batch_index<Acc>(roi, p.batch, &b)) return Acc(0);
    const int64_t P = p.attrs.output_size, H = p.height, W = p.width, cells = classes() * P * P;
    const bool row = e < cells * H;
    const int64_t q = row ? e / H : (e - cells * H) / W, at = row ? e % H : (e - cells * H) % W;
    const int64_t cls = q / (P * P), bin = q % (P * P), per_class = p.attrs.output_dim / p.num_classes;
    const PSRoIBin<Acc> r =
        psroi_bin_of_box<Acc, T>(p, psroi_box<Acc, T>(p, roi), trans, k, cls * per_class, bin / P, bin % P);
    const int64_t spp = p.attrs.sample_per_part;
    if (row) {
      return roi_axis_weight<Acc>(PSRoIAxis<Acc>{r.h0, r.sub_h}, spp, !(r.sub_h < Acc(0)), at, H, PSRoIAxisTapsOf());
    }
    return roi_axis_weight<Acc>(PSRoIAxis<Acc>{r.w0, r.sub_w}, spp, !(r.sub_w < Acc(0)), at, W, PSRoIAxisTapsOf());
  }
  DCNKIT_HD void add(int64_t k, int64_t c0, int nc, int32_t y, int32_t x, Acc* acc, RoIScratch) const {
    const uint32_t P = static_cast<uint32_t>(p.attrs.output_size), G = div_g.d;
    const int64_t H = p.height, W = p.width, D = p.attrs.output_dim, PP = int64_t(P) * P;
    const Acc* rows = tables + (k - k0) * table_entries();
    const Acc* cols = rows + classes() * PP * H;
    DCNKIT_PRAGMA_UNROLL
    for (int c = 0; c < roi_gather_channels<Acc>(); ++c) {
      if (c >= nc) break;
      const uint32_t cin = static_cast<uint32_t>(c0 + c), ctop = div_gg.div(cin), rest = cin - ctop * G * G;
      const uint32_t gi = div_g.div(rest), gj = rest - gi * G;
      // 32-bit bins (classes x P^2 < 2^31: psroi_gather_supported); offsets of rows and columns in 64 bits.
      const uint32_t cell = (trans != nullptr ? div_class.div(ctop) : 0u) * P * P;
      const Acc* sc = scale + (k * D + ctop) * PP;
      int64_t h0, h1, w0, w1;
      psroi_group_bins(gi, div_g, P, &h0, &h1);
      psroi_group_bins(gj, div_g, P, &w0, &w1);
      for (int32_t ph = static_cast<int32_t>(h0); ph <= static_cast<int32_t>(h1); ++ph) {  // h1 may be h0 - 1
        for (int32_t pw = static_cast<int32_t>(w0); pw <= static_cast<int32_t>(w1); ++pw) {
          const uint32_t bin = static_cast<uint32_t>(ph) * P + static_cast<uint32_t>(pw);
          const Acc s = sc[bin];
          if (s == Acc(0)) continue;
          const Acc ay = rows[static_cast<int64_t>(cell + bin) * H + y];
          if (ay == Acc(0)) continue;
          acc[c] += s * (ay * cols[static_cast<int64_t>(cell + bin) * W + x]);
        }
      }
    }
  }
};

// The per-output factor of grad_input: g / count (the forward's count; 0 where either is 0).
template <typename Acc, typename T>
DCNKIT_HD Acc psroi_gather_scale(const T* grad_output, const T* count, int64_t o) {
  const Acc g = to_acc<Acc>(grad_output[o]), n = to_acc<Acc>(count[o]);
  return g != Acc(0) && n > Acc(0) ? g / n : Acc(0);
}

// grad_trans, deterministic: thread i of K * num_classes * part_size^2 writes the two entries (x and y) of RoI k,
// class cls, part (part_h, part_w): the sum, in (output channel, ph, pw) order, of psroi_bin_trans_grad over the
// class's output channels and the bins of that part. A RoI outside the batch writes zeros.
template <typename Acc, typename T>
DCNKIT_HD void psroi_trans_grad_entry(const DeformPSRoIPoolParams& p, const T* grad_output, const T* input,
                                      const T* rois, const T* trans, const T* count, int64_t i, T* grad_trans) {
  const int64_t ps = p.attrs.part_size, nc = p.num_classes, P = p.attrs.output_size, D = p.attrs.output_dim;
  const int64_t part_w = i % ps, part_h = (i / ps) % ps, cls = (i / (ps * ps)) % nc, k = i / (ps * ps * nc);
  const int64_t tx = ((k * 2 * nc + 2 * cls) * ps + part_h) * ps + part_w, ty = tx + ps * ps;
  const T* roi = rois + k * 5;
  int64_t b = 0;
  Acc sx = Acc(0), sy = Acc(0);
  if (roi_batch_index<Acc>(roi, p.batch, &b)) {
    const PSRoIBox<Acc> box = psroi_box<Acc, T>(p, roi);
    const int64_t H = p.height, W = p.width, per_class = D / nc;
    int64_t h0, h1, w0, w1;  // the bins of this part: floor(ph * ps / P) == part_h
    psroi_group_bins(static_cast<uint32_t>(part_h), static_cast<uint32_t>(ps), static_cast<uint32_t>(P), &h0, &h1);
    psroi_group_bins(static_cast<uint32_t>(part_w), static_cast<uint32_t>(ps), static_cast<uint32_t>(P), &w0, &w1);
    for (int64_t ctop = cls * per_class; ctop < (cls + 1) * per_class; ++ctop) {
      for (int64_t ph = h0; ph <= h1; ++ph) {
        for (int64_t pw = w0; pw <= w1; ++pw) {
          const int64_t o = ((k * D + ctop) * P + ph) * P + pw;
          const Acc g = to_acc<Acc>(grad_output[o]);
          if (g == Acc(0)) continue;
          const PSRoIBin<Acc> r = psroi_bin_of_box<Acc, T>(p, box, trans, k, ctop, ph, pw);
          Acc gtx, gty;
          psroi_bin_trans_grad<Acc>(input + (b * p.channels + r.channel) * H * W, H, W, r, p.attrs.sample_per_part,
                                    static_cast<Acc>(p.attrs.trans_std), to_acc<Acc>(count[o]), g, &gtx, &gty);
          sx += gtx;
          sy += gty;
        }
      }
    }
  }
  grad_trans[tx] = from_acc<T>(sx);
  grad_trans[ty] = from_acc<T>(sy);
}

}  // namespace dcnkit
