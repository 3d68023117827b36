// MultiScaleDeformableAttention: the per-thread math, written once for the CPU launchers (msda.cpp) and
// the CUDA kernels (msda.cu). One call covers a run of channels [d0, d0 + count) of one (n, q, m): each
// (level, point) sample's level entry, coordinates and bilinear taps are computed once and reused for
// every channel of the run.
//
// Sampling is S_zero, bilinear with zeros outside and pixel centres at integers (grid_sample with
// align_corners=False): pixel = loc * size - 0.5. That is the corner rule of bilinear.h (dcn_taps): a
// point strictly inside (-1, H) x (-1, W) interpolates its four neighbours, those outside the map counting
// 0 and never read (as grid_sample's zero padding); NaN and infinite coordinates sample as 0.
#pragma once

#include "dcnkit/bilinear.h"
#include "dcnkit/channel_runs.h"
#include "dcnkit/grad_adders.h"
#include "dcnkit/msda.h"

namespace dcnkit {

// Channels per CUDA thread (msda.cu), also run by the CPU over the same grid (DCNKIT_DCN_CPU_PATH=cuda-schedule):
// the taps of a sample are shared by this many channels. Not measured on a GPU yet; ptxas -v (sm_75, sm_80, sm_90,
// by type): forward 64-96 registers, backward 107-128 (128 everywhere with 8 channels), no local memory. Capping
// them with __launch_bounds__(256, 4) spills 100-450 bytes in the backward: not done.
constexpr int kMsdaForwardChunk = 8;
constexpr int kMsdaBackwardChunk = 4;

// The whole level table follows check_msda_levels' rules (msda.h): every H_l, W_l >= 0, 0 <= start_l and
// start_l + H_l*W_l <= S, and the sum of H_l*W_l is S. The CUDA kernels read the tables on the device and
// evaluate this per thread (L cached entries): a table that breaks it gives zeros (output 0, no gradient), the
// rule of a bad RoI batch index (docs/operators.md); the torch CUDA op also raises a device-side assert.
DCNKIT_HD bool msda_levels_valid(const int64_t* spatial_shapes, const int64_t* level_start_index, int64_t L,
                                 int64_t S) {
  int64_t total = 0;
  for (int64_t l = 0; l < L; ++l) {
    const int64_t H = spatial_shapes[2 * l], W = spatial_shapes[2 * l + 1], start = level_start_index[l];
    if (H < 0 || W < 0 || start < 0 || start > S) return false;
    if (W > 0 && H > (S - start) / W) return false;  // H * W > S - start, without overflow
    total += H * W;                                    // each term <= S: no overflow
    if (total > S) return false;
  }
  return total == S;
}

// Entry i of the level tables widened from int32 (msda_levels_to_int64_cuda, one thread per entry): the 2L entries
// of spatial_shapes, then the L of level_start_index, values as they are (sign-extended).
DCNKIT_HD int64_t widened_level_entry(int64_t i, int64_t num_levels, const int32_t* spatial_shapes,
                                      const int32_t* level_start_index) {
  return i < 2 * num_levels ? static_cast<int64_t>(spatial_shapes[i])
                            : static_cast<int64_t>(level_start_index[i - 2 * num_levels]);
}

// Level l as the kernels see it: its map size and first row in [0, S). A level whose table entries are
// not a region of [0, S) (a negative size or start, start + H*W > S) is empty (H = W = 0): it samples as
// zeros, whatever the tables hold.
struct MsdaLevel {
  int64_t H = 0, W = 0, start = 0;
};

DCNKIT_HD MsdaLevel msda_level(const int64_t* spatial_shapes, const int64_t* level_start_index, int64_t l,
                               int64_t S) {
  MsdaLevel lv;
  const int64_t H = spatial_shapes[2 * l], W = spatial_shapes[2 * l + 1], start = level_start_index[l];
  if (H <= 0 || W <= 0 || start < 0 || start > S) return lv;
  if (H > (S - start) / W) return lv;  // H * W > S - start, without overflow
  lv.H = H;
  lv.W = W;
  lv.start = start;
  return lv;
}

// The taps of location (x, y) in [0, 1] on a level (pixel = loc * size - 0.5).
template <typename Acc>
DCNKIT_HD Taps<Acc> msda_taps(Acc x, Acc y, const MsdaLevel& lv) {
  return dcn_taps<Acc>(y * Acc(lv.H) - Acc(0.5), x * Acc(lv.W) - Acc(0.5), lv.H, lv.W);
}

// Offsets (in elements) of one (n, q, m) in the tensors.
struct MsdaSite {
  int64_t point0;  // (n, q, m, 0, 0) in attention_weights; sampling_locations at 2 * point0
  int64_t out0;    // (n, q, m*D) in output / grad_output
  int64_t value0;  // (n, 0, m, 0) in value / grad_value; a row of value is M*D elements further
};

DCNKIT_HD MsdaSite msda_site(const MsdaParams& p, int64_t n, int64_t q, int64_t m) {
  MsdaSite s;
  const int64_t nqm = (n * p.num_queries + q) * p.heads + m;
  s.point0 = nqm * p.num_levels * p.num_points;
  s.out0 = nqm * p.channels;
  s.value0 = (n * p.num_values * p.heads + m) * p.channels;
  return s;
}

// The launch grid of the CUDA kernels, which the CPU forward runs too: thread i covers the site (n, q, m) and one
// run of kChunk of the head's channels (dcnkit/channel_runs.h).
struct MsdaThread {
  int64_t n, q, m;
  ChannelRun run;
};

template <int kChunk>
DCNKIT_HD int64_t msda_thread_count(const MsdaParams& p) {
  return p.batch * p.num_queries * p.heads * channel_run_count<kChunk>(p.channels);
}

template <int kChunk>
DCNKIT_HD MsdaThread msda_thread(const MsdaParams& p, int64_t i) {
  MsdaThread t;
  t.run = channel_run<kChunk>(i, channel_run_count<kChunk>(p.channels), p.channels);
  t.m = t.run.site % p.heads;
  t.q = (t.run.site / p.heads) % p.num_queries;
  t.n = t.run.site / (p.heads * p.num_queries);
  return t;
}

// f(i, taps, level, first) for every sample (l, p) of (n, q, m) that lands on its level's map: i indexes
// attention_weights (the location at 2*i), `first` is the offset in value of (n, start_l, m, d0), a tap's row
// `row` elements further per map index. None when the level table is bad (msda_levels_valid): zeros.
template <typename Acc, typename T, typename F>
DCNKIT_HD void msda_for_each_sample(const MsdaParams& p, const int64_t* spatial_shapes,
                                    const int64_t* level_start_index, const T* sampling_locations, const MsdaSite& s,
                                    int64_t d0, F&& f) {
  const int64_t row = p.heads * p.channels, P = p.num_points;
  if (!msda_levels_valid(spatial_shapes, level_start_index, p.num_levels, p.num_values)) return;
  for (int64_t l = 0; l < p.num_levels; ++l) {
    const MsdaLevel lv = msda_level(spatial_shapes, level_start_index, l, p.num_values);
    if (lv.H == 0) continue;
    const int64_t first = s.value0 + lv.start * row + d0;
    for (int64_t pt = 0; pt < P; ++pt) {
      const int64_t i = s.point0 + l * P + pt;
      const Taps<Acc> t = msda_taps<Acc>(to_acc<Acc>(sampling_locations[2 * i]),
                                         to_acc<Acc>(sampling_locations[2 * i + 1]), lv);
      if (t.inside) f(i, t, lv, first);
    }
  }
}

// Forward: output channels [d0, d0 + count) of (n, q, m), count <= kChunk; zeros when the level table is bad.
template <int kChunk, typename Acc, typename T>
DCNKIT_HD void msda_forward_channels(const MsdaParams& p, const T* value, const int64_t* spatial_shapes,
                                     const int64_t* level_start_index, const T* sampling_locations,
                                     const T* attention_weights, int64_t n, int64_t q, int64_t m, int64_t d0,
                                     int count, T* output) {
  Acc acc[kChunk];
  for (int c = 0; c < kChunk; ++c) acc[c] = Acc(0);
  const MsdaSite s = msda_site(p, n, q, m);
  const int64_t row = p.heads * p.channels;
  msda_for_each_sample<Acc>(p, spatial_shapes, level_start_index, sampling_locations, s, d0,
                            [&](int64_t i, const Taps<Acc>& t, const MsdaLevel&, int64_t first) {
    const Acc a = to_acc<Acc>(attention_weights[i]);
    const T* base = value + first;
    if (t.ok[0] && t.ok[1] && t.ok[2] && t.ok[3]) {
      const Acc w[4] = {a * t.w[0], a * t.w[1], a * t.w[2], a * t.w[3]};
      const T* v[4] = {base + t.idx[0] * row, base + t.idx[1] * row, base + t.idx[2] * row, base + t.idx[3] * row};
      for_channels<kChunk>(count, [&](int c) {
        acc[c] += w[0] * to_acc<Acc>(v[0][c]) + w[1] * to_acc<Acc>(v[1][c]) + w[2] * to_acc<Acc>(v[2][c]) +
                  w[3] * to_acc<Acc>(v[3][c]);
      });
      return;
    }
    // On the border: only the neighbours inside the map are read.
    for (int k = 0; k < 4; ++k) {
      if (!t.ok[k]) continue;
      const Acc w = a * t.w[k];
      const T* v = base + t.idx[k] * row;
      for_channels<kChunk>(count, [&](int c) { acc[c] += w * to_acc<Acc>(v[c]); });
    }
  });
  T* out = output + s.out0 + d0;
  for_channels<kChunk>(count, [&](int c) { out[c] = from_acc<T>(acc[c]); });
}

// The work of one CUDA thread i of the forward kernel (kMsdaForwardChunk channels).
template <typename Acc, typename T>
DCNKIT_HD void msda_forward_thread(const MsdaParams& p, const T* value, const int64_t* spatial_shapes,
                                   const int64_t* level_start_index, const T* sampling_locations,
                                   const T* attention_weights, T* output, int64_t i) {
  const MsdaThread t = msda_thread<kMsdaForwardChunk>(p, i);
  msda_forward_channels<kMsdaForwardChunk, Acc, T>(p, value, spatial_shapes, level_start_index, sampling_locations,
                                                   attention_weights, t.n, t.q, t.m, t.run.c0, t.run.count, output);
}

// Backward of channels [d0, d0 + count) of (n, q, m), count <= kChunk. Scatters the value gradient with
// add_value(offset from grad_value's start, v), and reports each sample's share of this channel run with
// add_point(i, d attention_weights[i], d x_i, d y_i) (i as in attention_weights; the location's x at 2*i):
// the callers add the runs of a sample up (CPU: +=, CUDA: atomicAdd). Nothing when the level table is bad.
template <int kChunk, typename Acc, typename T, typename AddValue, typename AddPoint>
DCNKIT_HD void msda_backward_channels(const MsdaParams& p, const T* grad_output, const T* value,
                                      const int64_t* spatial_shapes, const int64_t* level_start_index,
                                      const T* sampling_locations, const T* attention_weights, int64_t n,
                                      int64_t q, int64_t m, int64_t d0, int count, AddValue& add_value,
                                      AddPoint& add_point) {
  const MsdaSite s = msda_site(p, n, q, m);
  Acc go[kChunk];
  for (int c = 0; c < kChunk; ++c) go[c] = c < count ? to_acc<Acc>(grad_output[s.out0 + d0 + c]) : Acc(0);
  const int64_t row = p.heads * p.channels;
  msda_for_each_sample<Acc>(p, spatial_shapes, level_start_index, sampling_locations, s, d0,
                            [&](int64_t i, const Taps<Acc>& t, const MsdaLevel& lv, int64_t first) {
    const Acc a = to_acc<Acc>(attention_weights[i]);
    const int64_t at[4] = {first + t.idx[0] * row, first + t.idx[1] * row, first + t.idx[2] * row,
                           first + t.idx[3] * row};
    Acc dot[4] = {Acc(0), Acc(0), Acc(0), Acc(0)};  // grad_output . value at each tap inside the map
    for_channels<kChunk>(count, [&](int c) {
      for (int k = 0; k < 4; ++k) {
        if (t.ok[k]) dot[k] += go[c] * to_acc<Acc>(value[at[k] + c]);
      }
    });
    Acc ga = Acc(0), gy = Acc(0), gx = Acc(0);
    for (int k = 0; k < 4; ++k) {
      if (!t.ok[k]) continue;  // outside the map: never read, no gradient
      ga += t.w[k] * dot[k];
      gy += t.dwy[k] * dot[k];
      gx += t.dwx[k] * dot[k];
      if (t.w[k] == Acc(0)) continue;  // adds nothing
      const Acc w = a * t.w[k];
      for_channels<kChunk>(count, [&](int c) { add_value(at[k] + c, w * go[c]); });
    }
    // pixel = loc * size - 0.5: d pixel / d loc = size.
    add_point(i, ga, a * gx * Acc(lv.W), a * gy * Acc(lv.H));
  });
}

// add_point of msda_backward_channels through `Add` (AtomicAdd on CUDA, PlainAdd on the CPU).
template <typename Acc, typename Add>
struct MsdaPointAdd {
  Acc* grad_locations;
  Acc* grad_weights;
  Add add;
  DCNKIT_HD void operator()(int64_t i, Acc ga, Acc gx, Acc gy) const {
    add(grad_weights + i, ga);
    add(grad_locations + 2 * i, gx);
    add(grad_locations + 2 * i + 1, gy);
  }
};

// The work of one CUDA thread i of the backward kernel (kMsdaBackwardChunk channels), scattering through `Add`
// into the zeroed accumulation-type gradients.
template <typename Acc, typename T, typename Add>
DCNKIT_HD void msda_backward_thread(const MsdaParams& p, const T* grad_output, const T* value,
                                    const int64_t* spatial_shapes, const int64_t* level_start_index,
                                    const T* sampling_locations, const T* attention_weights, Acc* grad_value,
                                    Acc* grad_locations, Acc* grad_weights, int64_t i, Add add) {
  IndexAdd<Acc, Add> add_value{grad_value, add};
  MsdaPointAdd<Acc, Add> add_point{grad_locations, grad_weights, add};
  const MsdaThread t = msda_thread<kMsdaBackwardChunk>(p, i);
  msda_backward_channels<kMsdaBackwardChunk, Acc, T>(p, grad_output, value, spatial_shapes, level_start_index,
                                                     sampling_locations, attention_weights, t.n, t.q, t.m, t.run.c0,
                                                     t.run.count, add_value, add_point);
}

}  // namespace dcnkit
