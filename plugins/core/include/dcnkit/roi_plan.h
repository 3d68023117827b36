// The RoI block schedule of RoIAlign, MultiLevelRoIAlign and DeformRoIPool (their CUDA launchers, and the CPU test
// path DCNKIT_ROI_CPU_PATH=cuda-schedule): one block per (RoI, group of kRoIPlanChannels channels). The block computes
// the RoI's box once (roi_plan_head; MultiLevelRoIAlign: multi_level_plan_head, on the RoI's level; DeformRoIPool:
// deform_roi_plan_head, its bins moved by their offsets through DeformRoIOrigin), then its sampling plan
// (roi_plan_fill: every sample of every bin as int32 taps and weights, in shared memory),
// then loops over (channel, bin) pairs, bin fastest, applying the plan with the bin functions of roi_kernels.h
// (roi_plan_forward_items / roi_plan_backward_items): the samples the CPU drivers visit, in the same order, so the
// same sums. Grids too large for a plan (more than kRoIPlanSamples samples per bin or roi_plan_capacity() per RoI,
// an adaptive grid of a huge box, maps of 2^31 pixels or more) go through the bounded visit instead
// (roi_visit_*_items), per (channel, bin), in a block of the same shape.
// Every function here is DCNKIT_HD: `tid` / `step` are the thread's index in its block and the block size. The grid
// run serially on the host (the CPU test paths): roi_plan_serial.h.
#pragma once

#include <cstdint>

#include "dcnkit/launch_limits.h"
#include "dcnkit/roi_kernels.h"

namespace dcnkit {

constexpr int64_t kRoIPlanSamples = 16;     // most samples per bin of a planned grid
constexpr int64_t kRoIPlanBytes = 32768;    // most shared memory of a plan's entries
constexpr int64_t kRoIPlanChannels = 32;    // channels per block

// One sample of the plan: its four taps (int32 offsets in the channel map; idx[0] < 0: a sample outside the map)
// and weights, 16-byte aligned so that a float entry is two 16-byte shared-memory loads.
template <typename Acc>
struct alignas(16) RoIPlanEntry {
  int32_t idx[4];
  Acc w[4];
};

// What a block knows about its RoI.
template <typename Acc>
struct RoIPlanHead {
  RoIAlignBox<Acc> box;
  Acc n;            // samples per bin: the divisor of avg (0: empty grid)
  int64_t b;        // batch index; -1 when outside [0, N) or NaN (the block writes zeros)
  int64_t H, W;     // the map the RoI pools (MultiLevelRoIAlign: its level's)
  int32_t level;    // MultiLevelRoIAlign: the RoI's level (RoIAlign: 0)
  int32_t stride;   // plan entries per bin (gh * gw); 0: not planned (bounded visit)
};

// Most plan entries per RoI (1024 for float, 682 for double).
template <typename Acc>
DCNKIT_HD constexpr int64_t roi_plan_capacity() {
  return kRoIPlanBytes / static_cast<int64_t>(sizeof(RoIPlanEntry<Acc>));
}

// Whether a grid of gh x gw samples per bin, `bins` bins, on a map of hw pixels is planned.
template <typename Acc>
DCNKIT_HD bool roi_plan_fits(int64_t gh, int64_t gw, int64_t bins, int64_t hw) {
  return gh >= 1 && gw >= 1 && gh <= kRoIPlanSamples && gw <= kRoIPlanSamples && gh * gw <= kRoIPlanSamples &&
         bins <= roi_plan_capacity<Acc>() / (gh * gw) && hw <= int64_t(0x7fffffff);
}

// The launcher's choice, known on the host: kPlanOnly (an explicit grid that fits), kVisitOnly (an explicit grid
// that does not), or kBoth (adaptive: each RoI's grid decides; both kernels run and each skips the other's RoIs).
// The plan's entries then fill capacity() (kBoth) or bins * ratio^2 (kPlanOnly).
enum class RoIPlanLaunch { kPlanOnly, kVisitOnly, kBoth };
// max_hw: the largest map's pixels.
template <typename Acc>
inline RoIPlanLaunch roi_plan_launch(int64_t r, int64_t bins, int64_t max_hw, int64_t* plan_entries) {
  *plan_entries = 0;
  if (r <= 0) {
    if (!roi_plan_fits<Acc>(1, 1, bins, max_hw)) return RoIPlanLaunch::kVisitOnly;
    *plan_entries = roi_plan_capacity<Acc>();
    return RoIPlanLaunch::kBoth;
  }
  if (!roi_plan_fits<Acc>(r, r, bins, max_hw)) return RoIPlanLaunch::kVisitOnly;
  *plan_entries = bins * r * r;
  return RoIPlanLaunch::kPlanOnly;
}

// The block kernels walk a RoI's bins with 32-bit counters: fewer than 2^31 bins (checked once per launch).
inline Status check_roi_block_bins(const char* where, int64_t bins) {
  if (bins >= (int64_t(1) << 31)) {
    return arg_error(where, "output_size", "fewer than 2^31 bins on CUDA", std::to_string(bins));
  }
  return Status::Ok();
}

// The launch of the block kernels: x = RoI, y = channel group of kRoIPlanChannels, 256 threads, `smem` bytes of plan.
inline LaunchDims roi_block_dims(const char* kernel, int64_t num_rois, int64_t channels, int64_t smem) {
  LaunchDims d;
  d.kernel = kernel;
  d.grid[0] = num_rois;
  d.grid[1] = (channels + kRoIPlanChannels - 1) / kRoIPlanChannels;
  d.smem = smem;
  d.static_smem = 256;  // the block's head (RoIPlanHead: at most 104 bytes), rounded up
  return d;
}

// The divisor and the plan's stride of a head whose box and map are set.
template <typename Acc>
DCNKIT_HD void roi_plan_finish(RoIPlanHead<Acc>& h, int64_t bins) {
  h.n = roi_bin_count(h.box);
  h.stride = roi_plan_fits<Acc>(h.box.gh, h.box.gw, bins, h.H * h.W) ? int32_t(h.box.gh * h.box.gw) : 0;
}

// The head as a visit kernel takes it: not planned (stride 0) when no plan kernel runs (`all`: roi_plan_launch chose
// kVisitOnly), so that the visit kernel serves every RoI -- also one whose own map would be planned (MultiLevelRoIAlign:
// a small level's RoI when the largest level is too large to plan).
template <typename Acc>
DCNKIT_HD RoIPlanHead<Acc> roi_visit_head(RoIPlanHead<Acc> h, bool all) {
  if (all) h.stride = 0;
  return h;
}

// The head of RoI k of RoIAlign (one thread per block).
template <typename Acc, typename T>
DCNKIT_HD RoIPlanHead<Acc> roi_plan_head(const RoIAlignParams& p, const T* rois, int64_t k) {
  const T* roi = rois + k * 5;
  RoIPlanHead<Acc> h;
  if (!roi_batch_index<Acc>(roi, p.batch, &h.b)) h.b = -1;
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  h.box = roi_align_box<Acc>(roi, static_cast<Acc>(p.attrs.spatial_scale), p.attrs.aligned, oh, ow,
                             p.attrs.sampling_ratio);
  h.H = p.height;
  h.W = p.width;
  h.level = 0;
  roi_plan_finish(h, oh * ow);
  return h;
}

// The corner (y0, x0) of bin (ph, pw) of a head's box, as the bin functions see it: RoIAlign's (no offsets) ...
struct RoIBoxOrigin {
  template <typename Head, typename I, typename Acc>
  DCNKIT_HD void operator()(const Head& h, I ph, I pw, Acc* y0, Acc* x0) const {
    roi_bin_origin<Acc, Acc>(h.box, ph, pw, nullptr, nullptr, Acc(0), y0, x0);
  }
};

// ... and DeformRoIPool's: shifted by RoI k's offsets of that bin (offset null: none). The plan of a DeformRoIPool
// RoI is then per (RoI, bin) with the offsets applied, computed once per block like RoIAlign's.
template <typename T>
struct DeformRoIOrigin {
  const DeformRoIPoolParams& p;
  const T* offset;
  int64_t k;
  template <typename Head, typename I, typename Acc>
  DCNKIT_HD void operator()(const Head& h, I ph, I pw, Acc* y0, Acc* x0) const {
    deform_roi_pool_origin<Acc, T>(p, h.box, offset, k, ph, pw, y0, x0);
  }
};

// Whether the op pools the maximum (DeformRoIPool: always the mean).
template <typename P>
DCNKIT_HD bool roi_pool_max_mode(const P& p) {
  return p.attrs.mode == PoolMode::kMax;
}
DCNKIT_HD bool roi_pool_max_mode(const DeformRoIPoolParams&) { return false; }

// The head of RoI k of DeformRoIPool (one thread per block): aligned RoIAlign's box; the offsets move each bin
// (DeformRoIOrigin).
template <typename Acc, typename T>
DCNKIT_HD RoIPlanHead<Acc> deform_roi_plan_head(const DeformRoIPoolParams& p, const T* rois, int64_t k) {
  const T* roi = rois + k * 5;
  RoIPlanHead<Acc> h;
  if (!roi_batch_index<Acc>(roi, p.batch, &h.b)) h.b = -1;
  h.box = deform_roi_pool_box<Acc>(p, roi);
  h.H = p.height;
  h.W = p.width;
  h.level = 0;
  roi_plan_finish(h, p.attrs.pooled_h * p.attrs.pooled_w);
  return h;
}

// A sample's plan entry from its two axes' taps (roi_axis_taps: the taps and weights of roi_taps) on a map of width W,
// each tap stored as it is computed (fewer live registers); idx[0] = -1 for a sample outside the map.
template <typename Acc>
DCNKIT_HD void roi_plan_store(const RoIAxisTaps<Acc, int32_t>& ty, const RoIAxisTaps<Acc, int32_t>& tx, int32_t W,
                              RoIPlanEntry<Acc>* entry) {
  const bool inside = ty.inside && tx.inside;
  const Acc hy = Acc(1) - ty.l, hx = Acc(1) - tx.l;
  entry->idx[0] = inside ? ty.lo * W + tx.lo : -1;
  entry->w[0] = inside ? hy * hx : Acc(0);
  entry->idx[1] = inside ? ty.lo * W + tx.hi : -1;
  entry->w[1] = inside ? hy * tx.l : Acc(0);
  entry->idx[2] = inside ? ty.hi * W + tx.lo : -1;
  entry->w[2] = inside ? ty.l * hx : Acc(0);
  entry->idx[3] = inside ? ty.hi * W + tx.hi : -1;
  entry->w[3] = inside ? ty.l * tx.l : Acc(0);
}

// Entry (bin, s) of a planned head's plan (sample (s / gw, s % gw) of bin `bin`, ow bins per row): the plan's one
// source of the sampling geometry (roi_plan_fill). Head: RoIPlanHead<Acc>, volatile where the kernels read it from
// shared memory at each use (roi_plan_fill).
template <typename Acc, typename Head, typename Origin>
DCNKIT_HD void roi_plan_entry(const Head& h, uint32_t ow, uint32_t gw, uint32_t bin, uint32_t s, const Origin& origin,
                              RoIPlanEntry<Acc>* entry) {
  Acc y0, x0;
  origin(h, bin / ow, bin % ow, &y0, &x0);
  // roi_taps in 32-bit indices (a planned map has fewer than 2^31 pixels): the same taps and weights, and no 64-bit
  // integer converted to or from floating point in the plan's loop.
  const int32_t W = static_cast<int32_t>(h.W);
  const RoIAxisTaps<Acc, int32_t> ty =
      roi_axis_taps(roi_sample_coord<Acc>(y0, h.box.bin_h, static_cast<Acc>(h.box.gh), s / gw), static_cast<int32_t>(h.H));
  const RoIAxisTaps<Acc, int32_t> tx =
      roi_axis_taps(roi_sample_coord<Acc>(x0, h.box.bin_w, static_cast<Acc>(h.box.gw), s % gw), W);
  roi_plan_store(ty, tx, W, entry);
}

// The plan of a planned head: entry e = bin * stride + iy * gw + ix is sample (iy, ix) of bin `bin`, every
// sample of the grid in the full loop's order (a sample outside the map is an entry with idx[0] = -1). The bin
// functions then see what roi_bin_visit gives them: the samples inside, in order (avg), and a 0 candidate where
// samples outside begin (max: the same maximum and arg-max, the first on ties). On the device the head is read from
// shared memory at each use (volatile): loop invariants held in registers would take the kernel past 48.
template <typename Acc, typename P, typename Origin = RoIBoxOrigin>
DCNKIT_HD void roi_plan_fill(const P& p, const RoIPlanHead<Acc>& head, int tid, int step, RoIPlanEntry<Acc>* plan,
                             const Origin& origin = Origin()) {
#if defined(__CUDA_ARCH__)
  const volatile RoIPlanHead<Acc>& h = head;
#else
  const RoIPlanHead<Acc>& h = head;
#endif
  // unsigned: the index decode is three unsigned 32-bit divisions
  const uint32_t ow = static_cast<uint32_t>(p.attrs.pooled_w), S = static_cast<uint32_t>(h.stride),
                 gw = static_cast<uint32_t>(h.box.gw);
  const uint32_t total = static_cast<uint32_t>(p.attrs.pooled_h) * ow * S;
  for (uint32_t e = static_cast<uint32_t>(tid); e < total; e += static_cast<uint32_t>(step)) {
    roi_plan_entry<Acc>(h, ow, gw, e / S, e % S, origin, &plan[e]);
  }
}

// An entry as the taps of the bin functions (no derivatives).
template <typename Acc>
DCNKIT_HD Taps<Acc> roi_plan_taps(const RoIPlanEntry<Acc>& e) {
  Taps<Acc> t;
  t.inside = e.idx[0] >= 0;
  for (int j = 0; j < 4; ++j) {
    t.idx[j] = t.inside ? e.idx[j] : 0;
    t.w[j] = e.w[j];
    t.ok[j] = t.inside;  // RoI taps are clamped into the map: all four are read when the sample is inside
  }
  return t;
}

// A bin's plan entries as a sample source of the bin functions (roi_bin_reduce, roi_bin_scatter).
template <typename Acc>
struct RoIPlanSamples {
  const RoIPlanEntry<Acc>* e;
  int32_t n;
  template <typename Visit>
  DCNKIT_HD void visit(Visit& v) const {
    for (int32_t i = 0; i < n; ++i) {
      const Taps<Acc> t = roi_plan_taps(e[i]);
      if (!v(RoITapsSample<Acc>{t, t.inside ? Acc(1) : Acc(0), RoISampleId{i, 0}})) return;
    }
  }
  DCNKIT_HD Taps<Acc> taps_at(RoISampleId id) const { return roi_plan_taps(e[id.iy]); }
};

// The arg-max of a planned bin's n entries (entry_of(i) gives entry i): the first largest sample, a sample outside
// the map a candidate 0; -1 when there is none or it is outside (no gradient).
template <typename Acc, typename T, typename EntryOf>
DCNKIT_HD int32_t roi_plan_argmax(const T* img, int32_t n, const EntryOf& entry_of) {
  int32_t best_i = -1;
  bool best_inside = false;
  Acc best = Acc(0);
  for (int32_t i = 0; i < n; ++i) {
    const Taps<Acc> t = roi_plan_taps(entry_of(i));
    const Acc v = t.inside ? taps_value(img, t) : Acc(0);
    if (best_i < 0 || v > best) {
      best_i = i;
      best = v;
      best_inside = t.inside;
    }
  }
  return best_inside ? best_i : -1;
}

// Max-mode backward of a planned bin: roi_bin_scatter's choice (the first largest sample, outside samples 0)
// keeping the arg-max's entry index rather than its taps (fewer registers).
template <typename Acc, typename T, typename Add>
DCNKIT_HD void roi_plan_max_scatter(const T* img, const RoIPlanEntry<Acc>* e, int32_t n, Acc g, Add& add) {
  const int32_t best_i = roi_plan_argmax<Acc>(img, n, [e](int32_t i) -> const RoIPlanEntry<Acc>& { return e[i]; });
  if (best_i < 0) return;
  for (int j = 0; j < 4; ++j) add(e[best_i].idx[j], g * e[best_i].w[j]);
}

// The (channel, bin) pairs of a block's nc channels, bin fastest, this thread's share: f(c, bin) (c in [0, nc))
// for item tid, tid + step, ... (no division inside the loop). I: the index type (int32_t for a plan).
template <typename I, typename F>
DCNKIT_HD void roi_block_items(I nc, I bins, int tid, int step, const F& f) {
  const I total = nc * bins;
  const I dc = static_cast<I>(step) / bins, db = static_cast<I>(step) % bins;
  I c = static_cast<I>(tid) / bins, bin = static_cast<I>(tid) % bins;
  for (I item = tid; item < total; item += step) {
    f(c, bin);
    c += dc;
    bin += db;
    if (bin >= bins) {
      bin -= bins;
      ++c;
    }
  }
}

// roi_block_items over (channel, bin) pairs of an oh x ow grid, with the bin's (ph, pw) = (bin / ow, bin % ow)
// carried from item to item: f(c, ph, pw), and no 64-bit division inside the loop (the bounded visit's walk).
template <typename I, typename F>
DCNKIT_HD void roi_block_bins(I nc, I oh, I ow, int tid, int step, const F& f) {
  const I bins = oh * ow;
  const I dc = static_cast<I>(step) / bins, db = static_cast<I>(step) % bins, dph = db / ow, dpw = db % ow;
  I c = static_cast<I>(tid) / bins, ph = (static_cast<I>(tid) % bins) / ow, pw = (static_cast<I>(tid) % bins) % ow;
  while (c < nc) {  // item c * bins + ph * ow + pw, tid, tid + step, ... while below nc * bins
    f(c, ph, pw);
    c += dc;
    ph += dph;
    pw += dpw;
    if (pw >= ow) {
      pw -= ow;
      ++ph;
    }
    if (ph >= oh) {
      ph -= oh;
      ++c;
    }
  }
}

// Channels of block group g: [g * kRoIPlanChannels, ...) clipped to C (the first, c0, is g * kRoIPlanChannels).
DCNKIT_HD int64_t roi_group_channels(int64_t C, int64_t g) {
  const int64_t c0 = g * kRoIPlanChannels;
  return C - c0 < kRoIPlanChannels ? C - c0 : kRoIPlanChannels;
}

// One planned sample of the channel map `img`: taps_value's sum (the same order, so the same bits) from the
// entry's int32 in-map offsets. The entry must be inside (idx[0] >= 0).
template <typename Acc, typename T>
DCNKIT_HD Acc roi_plan_value(const T* img, const RoIPlanEntry<Acc>& e) {
  Acc v = Acc(0);
  for (int j = 0; j < 4; ++j) v += e.w[j] * to_acc<Acc>(img[e.idx[j]]);
  return v;
}

// Forward of one planned bin of `img` from its n entries: roi_bin_reduce over RoIPlanSamples (avg: the sum of
// the samples inside over `count`; max: the first largest, a sample outside a candidate 0), without the Taps
// detour: the entry is read once (two 16-byte loads for float) and its offsets stay 32-bit. n == 0 gives 0
// (count > 0). One sample per iteration (not unrolled): the loop issues what the samples need, no remainder.
template <typename Acc, typename T>
DCNKIT_HD Acc roi_plan_bin_forward(const T* img, const RoIPlanEntry<Acc>* e, int32_t n, Acc count, bool max_mode) {
  if (max_mode) {
    Acc best = Acc(0);
#if defined(__CUDA_ARCH__)
#pragma unroll 1
#endif
    for (int32_t i = 0; i < n; ++i) {
      const RoIPlanEntry<Acc> s = e[i];
      const Acc v = s.idx[0] >= 0 ? roi_plan_value(img, s) : Acc(0);
      if (i == 0 || v > best) best = v;
    }
    return best;
  }
  Acc sum = Acc(0);
#if defined(__CUDA_ARCH__)
#pragma unroll 1
#endif
  for (int32_t i = 0; i < n; ++i) {
    const RoIPlanEntry<Acc> s = e[i];
    if (s.idx[0] >= 0) sum += roi_plan_value(img, s);
  }
  return div_count(sum, count);
}

// A thread's walk over its (channel, bin) items in roi_block_items' order with the channel map's and the bin's
// entries' pointers carried from item to item (not recomputed from indices), so that a tap's address is that
// pointer plus its 32-bit offset: each step moves dc channels (dimg: dc maps of `map` elements) and db bins.
template <typename Acc, typename T>
struct RoIPlanWalk {
  const T* img;
  const RoIPlanEntry<Acc>* e;
  int32_t bin;
  DCNKIT_HD void next(int64_t dimg, int64_t map, int32_t db, int32_t S, int32_t bins) {
    img += dimg;
    e += db * S;
    bin += db;
    if (bin >= bins) {
      bin -= bins;
      e -= bins * S;
      img += map;
    }
  }
};

// Forward of a planned block: output (K, C, oh, ow) of RoI k, channels [c0, c0 + nc). max_mode is
// p.attrs.mode == kMax (the kernels pass it as a compile-time constant). A planned head has h.n >= 1; a RoI
// outside the batch reads no entry (n = 0), which gives its zeros on the same path.
template <typename Acc, typename T, typename P>
DCNKIT_HD void roi_plan_forward_items(const P& p, const RoIPlanHead<Acc>& h,
                                      const RoIPlanEntry<Acc>* plan, const T* input, int64_t k, int64_t c0,
                                      int64_t nc, int tid, int step, T* output, bool max_mode) {
  const int64_t C = p.channels, HW = h.H * h.W;
  const int32_t bins = static_cast<int32_t>(p.attrs.pooled_h * p.attrs.pooled_w), S = h.stride;
  const uint32_t ub = static_cast<uint32_t>(bins), ut = static_cast<uint32_t>(tid), us = static_cast<uint32_t>(step);
  const int32_t total = static_cast<int32_t>(nc) * bins, dc = static_cast<int32_t>(us / ub),
                db = static_cast<int32_t>(us % ub);
  const int32_t bin = static_cast<int32_t>(ut % ub);
  RoIPlanWalk<Acc, T> w{input + ((h.b < 0 ? 0 : h.b) * C + c0 + static_cast<int32_t>(ut / ub)) * HW, plan + bin * S,
                        bin};
  T* out = output + (k * C + c0) * bins + tid;  // the output's pointer is carried too
  const int64_t dimg = dc * HW;
  const int32_t n = h.b >= 0 ? S : 0;
  const Acc count = h.n;
  for (int32_t item = tid; item < total; item += step) {
    *out = from_acc<T>(roi_plan_bin_forward<Acc>(w.img, w.e, n, count, max_mode));
    out += step;
    w.next(dimg, HW, db, S, bins);
  }
}

// Backward of a planned block: scatters grad_output of RoI k, channels [c0, c0 + nc), through add(index, value)
// into grad_input's (N, C, H, W) accumulation buffer. Max mode reads `input` for the arg-max.
template <typename Acc, typename T, typename P, typename AddAt>
DCNKIT_HD void roi_plan_backward_items(const P& p, const RoIPlanHead<Acc>& h,
                                       const RoIPlanEntry<Acc>* plan, const T* grad_output, const T* input,
                                       int64_t k, int64_t c0, int64_t nc, int tid, int step, const AddAt& add_at,
                                       bool max_mode) {
  if (h.b < 0 || !(h.n > Acc(0))) return;
  const int64_t C = p.channels, HW = h.H * h.W;
  const int32_t bins = static_cast<int32_t>(p.attrs.pooled_h * p.attrs.pooled_w);
  const T* go = grad_output + (k * C + c0) * bins;
  const int64_t base = (h.b * C + c0) * HW;
  roi_block_items<int32_t>(static_cast<int32_t>(nc), bins, tid, step, [&](int32_t c, int32_t bin) {
    const Acc g = to_acc<Acc>(go[c * bins + bin]);
    if (g == Acc(0)) return;
    auto add = add_at(base + c * HW);
    if (max_mode) {
      roi_plan_max_scatter<Acc>(input + base + c * HW, plan + bin * h.stride, h.stride, g, add);
    } else {
      roi_bin_scatter<Acc>(static_cast<const T*>(nullptr), h.n, RoIPlanSamples<Acc>{plan + bin * h.stride, h.stride},
                           false, g, add);
    }
  });
}

// The same two for a block whose RoI is not planned: each (channel, bin) samples on the fly (bounded visit).
// H, W: the head's map (RoIAlign passes its params' sizes, which stay in the kernel's parameters). frame: the visit's
// (RoIVisitFrame: the kernels' per-thread slot in shared memory). max_mode: roi_pool_max_mode(p), a compile-time
// constant in the kernels (one instantiation per mode: each holds one visitor's registers). The (channel, bin) walk is
// 32-bit (check_roi_block_bins).
template <typename Acc, typename T, typename P, typename F, typename Origin = RoIBoxOrigin>
DCNKIT_HD void roi_visit_forward_items(const P& p, const RoIPlanHead<Acc>& h, int64_t H, int64_t W, const T* input,
                                       int64_t k, int64_t c0, int64_t nc, int tid, int step, T* output, F frame,
                                       bool max_mode, const Origin& origin = Origin()) {
  const int64_t C = p.channels;
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w, bins = oh * ow;
  T* out = output + (k * C + c0) * bins;
  const DeviceVolatile<RoIPlanHead<Acc>>& hv = h;  // the block's head, read from shared memory at each use
  using Box = const DeviceVolatile<RoIAlignBox<Acc>>;
  roi_block_bins(static_cast<int32_t>(nc), static_cast<int32_t>(oh), static_cast<int32_t>(ow), tid, step,
                 [&](int32_t c, int32_t ph, int32_t pw) {
                   Acc v = Acc(0);
                   const int64_t b = hv.b;
                   if (b >= 0) {
                     Acc y0, x0;
                     origin(hv, ph, pw, &y0, &x0);
                     v = roi_bin_reduce<Acc>(input + (b * C + c0 + c) * H * W, static_cast<Acc>(hv.n),
                                             RoIBinTaps<Acc, F, Box>{&hv.box, y0, x0, H, W, frame}, max_mode);
                   }
                   out[c * bins + int64_t(ph) * ow + pw] = from_acc<T>(v);
                 });
}

template <typename Acc, typename T, typename P, typename AddAt, typename F, typename Origin = RoIBoxOrigin>
DCNKIT_HD void roi_visit_backward_items(const P& p, const RoIPlanHead<Acc>& h, int64_t H, int64_t W,
                                        const T* grad_output, const T* input, int64_t k, int64_t c0, int64_t nc,
                                        int tid, int step, const AddAt& add_at, F frame, bool max_mode,
                                        const Origin& origin = Origin()) {
  if (h.b < 0 || !(h.n > Acc(0))) return;
  const int64_t C = p.channels;
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w, bins = oh * ow;
  const T* go = grad_output + (k * C + c0) * bins;
  const DeviceVolatile<RoIPlanHead<Acc>>& hv = h;  // the block's head, read from shared memory at each use
  using Box = const DeviceVolatile<RoIAlignBox<Acc>>;
  roi_block_bins(static_cast<int32_t>(nc), static_cast<int32_t>(oh), static_cast<int32_t>(ow), tid, step,
                 [&](int32_t c, int32_t ph, int32_t pw) {
                   const Acc g = to_acc<Acc>(go[c * bins + int64_t(ph) * ow + pw]);
                   if (g == Acc(0)) return;
                   Acc y0, x0;
                   origin(hv, ph, pw, &y0, &x0);
                   const int64_t map = (hv.b * C + c0 + c) * H * W;
                   auto add = add_at(map);
                   roi_bin_scatter<Acc>(max_mode ? input + map : nullptr, static_cast<Acc>(hv.n),
                                        RoIBinTaps<Acc, F, Box>{&hv.box, y0, x0, H, W, frame}, max_mode, g, add);
                 });
}

}  // namespace dcnkit
