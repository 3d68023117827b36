// CPU drivers of RoIAlign, DeformRoIPool and MultiLevelRoIAlign (host only): loops over RoIs, bins and
// channels around the bin functions of roi_kernels.h.
#pragma once

#include "dcnkit/context.h"
#include "dcnkit/roi_kernels.h"

namespace dcnkit {

// CPU drivers of RoIAlign and DeformRoIPool (host only). Per RoI, the samples of a chunk of bins are
// collected once and reused for every channel; a bin with more samples inside than the buffer holds
// is sampled on the fly. The arithmetic is the bin functions of roi_kernels.h.
//   box_of(roi) -> RoIAlignBox<T>;  origin_of(k, box, ph, pw, &y0, &x0): corner of bin (ph, pw).

constexpr int64_t kRoITapsBuffer = 256;

template <typename T>
struct RoISampleCollect {
  RoISample<T>* buf;
  int64_t cap, n;
  bool full;
  template <typename S>
  bool operator()(const S& s) {
    if (n >= cap) {
      full = true;
      return false;
    }
    buf[n++] = RoISample<T>{s.taps(), s.m};
    return true;
  }
};

// Collects the samples of bins bin0, bin0 + 1, ... of RoI k into buf (kRoITapsBuffer entries) while they
// fit; bin bin0 + j's are buf[start[j] .. start[j + 1]). Returns the number of bins collected (0: bin0
// alone does not fit).
template <typename T, typename OriginOf>
inline int64_t roi_collect_bins(const RoIAlignBox<T>& box, int64_t k, int64_t bin0, int64_t bins,
                                int64_t ow, int64_t H, int64_t W, const OriginOf& origin_of,
                                RoISample<T>* buf, int64_t* start) {
  int64_t nb = 0;
  start[0] = 0;
  while (bin0 + nb < bins && nb < kRoITapsBuffer) {
    T y0, x0;
    origin_of(k, box, (bin0 + nb) / ow, (bin0 + nb) % ow, &y0, &x0);
    RoISampleCollect<T> c{buf + start[nb], kRoITapsBuffer - start[nb], 0, false};
    roi_bin_visit_at(box, y0, x0, H, W, c);
    if (c.full) break;
    start[nb + 1] = start[nb] + c.n;
    ++nb;
  }
  return nb;
}

// Calls chunk(bin0, nb, buf, start) for runs of bins whose samples fit the buffer, and
// single(bin, y0, x0) for a bin that alone does not fit, in bin order.
template <typename T, typename OriginOf, typename Chunk, typename Single>
inline void roi_for_each_chunk(const RoIAlignBox<T>& box, int64_t k, int64_t bins, int64_t ow,
                               int64_t H, int64_t W, const OriginOf& origin_of, RoISample<T>* buf,
                               int64_t* start, const Chunk& chunk, const Single& single) {
  for (int64_t bin0 = 0; bin0 < bins;) {
    const int64_t nb = roi_collect_bins(box, k, bin0, bins, ow, H, W, origin_of, buf, start);
    if (nb == 0) {
      T y0, x0;
      origin_of(k, box, bin0 / ow, bin0 % ow, &y0, &x0);
      single(bin0, y0, x0);
      ++bin0;
    } else {
      chunk(bin0, nb);
      bin0 += nb;
    }
  }
}

// output (K, C, oh, ow); parallel over RoIs. Batch indices must have been checked.
template <typename T, typename BoxOf, typename OriginOf>
void roi_pool_forward_cpu(const CpuContext& ctx, int64_t K, int64_t N, int64_t C, int64_t H,
                          int64_t W, int64_t oh, int64_t ow, bool max_mode, const T* input,
                          const T* rois, T* output, const BoxOf& box_of, const OriginOf& origin_of) {
  const int64_t bins = oh * ow;
  parallel_for(ctx, K, [&](int64_t kb, int64_t ke) {
    RoISample<T> buf[kRoITapsBuffer];
    int64_t start[kRoITapsBuffer + 1];
    for (int64_t k = kb; k < ke; ++k) {
      const T* roi = rois + k * 5;
      int64_t b = 0;
      roi_batch_index<T>(roi, N, &b);
      const RoIAlignBox<T> box = box_of(roi);
      const T n = roi_bin_count(box);
      const T* img_b = input + b * C * H * W;
      T* out_k = output + k * C * bins;
      roi_for_each_chunk(
          box, k, bins, ow, H, W, origin_of, buf, start,
          [&](int64_t bin0, int64_t nb) {
            for (int64_t c = 0; c < C; ++c) {
              const T* img = img_b + c * H * W;
              T* out = out_k + c * bins + bin0;
              for (int64_t j = 0; j < nb; ++j) {
                out[j] = roi_bin_reduce<T>(img, n, TapsArray<T>{buf + start[j], start[j + 1] - start[j]},
                                           max_mode);
              }
            }
          },
          [&](int64_t bin, T y0, T x0) {
            for (int64_t c = 0; c < C; ++c) {
              out_k[c * bins + bin] = roi_align_bin_forward(img_b + c * H * W, H, W, box, y0, x0, max_mode);
            }
          });
    }
  });
}

template <typename T>
struct CpuAddTo {
  T* base;
  void operator()(int64_t i, T v) const { base[i] += v; }
};

// grad_input (N, C, H, W), written; parallel over channels: a task owns grad_input[:, c] for all
// RoIs (race-free, deterministic). `input` is read in max mode only.
template <typename T, typename BoxOf, typename OriginOf>
void roi_pool_backward_cpu(const CpuContext& ctx, int64_t K, int64_t N, int64_t C, int64_t H,
                           int64_t W, int64_t oh, int64_t ow, bool max_mode, const T* grad_output,
                           const T* input, const T* rois, T* grad_input, const BoxOf& box_of,
                           const OriginOf& origin_of) {
  const int64_t bins = oh * ow;
  parallel_for(ctx, C, [&](int64_t cb, int64_t ce) {
    RoISample<T> buf[kRoITapsBuffer];
    int64_t start[kRoITapsBuffer + 1];
    for (int64_t n = 0; n < N; ++n) {
      T* g = grad_input + (n * C + cb) * H * W;
      for (int64_t i = 0; i < (ce - cb) * H * W; ++i) g[i] = T(0);
    }
    for (int64_t k = 0; k < K; ++k) {
      const T* roi = rois + k * 5;
      int64_t b = 0;
      roi_batch_index<T>(roi, N, &b);
      const RoIAlignBox<T> box = box_of(roi);
      const T n = roi_bin_count(box);
      if (!(n > T(0))) continue;
      roi_for_each_chunk(
          box, k, bins, ow, H, W, origin_of, buf, start,
          [&](int64_t bin0, int64_t nb) {
            for (int64_t c = cb; c < ce; ++c) {
              const T* img = max_mode ? input + (b * C + c) * H * W : nullptr;
              CpuAddTo<T> add{grad_input + (b * C + c) * H * W};
              const T* go = grad_output + (k * C + c) * bins + bin0;
              for (int64_t j = 0; j < nb; ++j) {
                if (go[j] == T(0)) continue;
                roi_bin_scatter<T>(img, n, TapsArray<T>{buf + start[j], start[j + 1] - start[j]}, max_mode,
                                   go[j], add);
              }
            }
          },
          [&](int64_t bin, T y0, T x0) {
            for (int64_t c = cb; c < ce; ++c) {
              const T g = grad_output[(k * C + c) * bins + bin];
              if (g == T(0)) continue;
              const T* img = max_mode ? input + (b * C + c) * H * W : nullptr;
              CpuAddTo<T> add{grad_input + (b * C + c) * H * W};
              roi_align_bin_backward(img, H, W, box, y0, x0, max_mode, g, add);
            }
          });
    }
  });
}

}  // namespace dcnkit
