// RoIAlign on CUDA, deterministic mode (torch.use_deterministic_algorithms): grad_input without atomics.
// A channel-independent plan of fixed slots: RoI k's E plan entries (roi_plan.h: entry bin * stride + s is sample s
// of bin `bin`; E = roi_align_sorted_entries, padding past bins * stride) times 4 taps, slot (k * E + e) * 4 + q, with
// key = the tap's (batch index, pixel) in grad_input's maps (kRoINoKey, sorting last, when the tap is outside the
// map, its weight is 0, the RoI's batch index is out of range or its grid empty), its weight (divided by the bin's
// sample count in avg mode) and its item = bin * kRoIPlanSamples + s. A stable sort of (key, slot) pairs (CUB radix
// sort on CUDA, std::stable_sort on the CPU: the same order), then, in max mode, the arg-max sample of every (RoI,
// channel, bin) into an int32 buffer (roi_plan_argmax: the forward's order and tie rule), then one thread per
// (image, channel, pixel) finds its key's run by binary search and sums weight * grad_output[k, c, bin] over it in
// slot order (max: only the slots of the arg-max sample), writing grad_input once. Bit-identical from run to run.
// Only planned RoIs have slots: an explicit grid too large for a plan, maps or slot counts past 32-bit keys, are
// refused on the host (roi_align_sorted_supported: the torch op then raises torch's non-determinism error), and an
// adaptive grid that turns out too large for a plan (over 16 samples per bin: a large box) raises on the device
// (CUDA: a device-side assert; the CPU schedule: an error).
#pragma once

#include "dcnkit/roi_plan.h"

namespace dcnkit {

// Key of a slot that contributes nothing: sorts last.
constexpr uint32_t kRoINoKey = 0xffffffffu;

// Plan entries per RoI of the deterministic backward (0: no deterministic path; roi_plan_launch's choice).
template <typename Acc>
inline int64_t roi_align_sorted_entries(const RoIAlignParams& p) {
  int64_t entries = 0;
  if (roi_plan_launch<Acc>(p.attrs.sampling_ratio, p.attrs.pooled_h * p.attrs.pooled_w, p.height * p.width,
                           &entries) == RoIPlanLaunch::kVisitOnly) {
    return 0;
  }
  return entries;
}

// Whether the deterministic backward has a path for these params: RoIs planned (or adaptive), fewer than 2^31 slots
// (CUB's item count; 4 per plan entry of every RoI), every (image, pixel) key below kRoINoKey and the gather's and
// arg-max's grids below 2^32 threads.
template <typename Acc>
inline bool roi_align_sorted_supported(const RoIAlignParams& p) {
  const int64_t e = roi_align_sorted_entries<Acc>(p), u32 = int64_t(0xffffffff);
  const int64_t hw = p.height * p.width, bins = p.attrs.pooled_h * p.attrs.pooled_w;
  return e > 0 && p.num_rois <= (int64_t(0x7fffffff) / 4) / e && p.batch * hw < int64_t(kRoINoKey) &&
         (p.channels == 0 || (p.batch * hw <= u32 / p.channels && p.num_rois * bins <= u32 / p.channels));
}

// Entry e (of E per RoI) of RoI k: its four slots. Returns false when the RoI needs the bounded visit (an adaptive
// grid too large for a plan, with a valid batch index): the deterministic mode has no path for it.
template <typename Acc, typename T>
DCNKIT_HD bool roi_align_sorted_plan(const RoIAlignParams& p, const T* rois, uint32_t E, uint32_t k, uint32_t e,
                                     uint32_t* keys, uint32_t* slots, Acc* weights, uint32_t* items) {
  const RoIPlanHead<Acc> h = roi_plan_head<Acc>(p, rois, k);
  const uint32_t bins = static_cast<uint32_t>(p.attrs.pooled_h * p.attrs.pooled_w), S = static_cast<uint32_t>(h.stride);
  const bool live = h.b >= 0 && h.n > Acc(0);
  RoIPlanEntry<Acc> en;
  for (int q = 0; q < 4; ++q) en.idx[q] = -1;
  uint32_t item = 0;
  if (live && S != 0 && e < bins * S) {
    const uint32_t bin = e / S, s = e % S;
    roi_plan_entry<Acc>(h, static_cast<uint32_t>(p.attrs.pooled_w), static_cast<uint32_t>(h.box.gw), bin, s,
                        RoIBoxOrigin(), &en);
    item = bin * static_cast<uint32_t>(kRoIPlanSamples) + s;
  }
  const bool avg = p.attrs.mode != PoolMode::kMax;
  const uint32_t image = static_cast<uint32_t>(live ? h.b : 0) * static_cast<uint32_t>(p.height * p.width);
  for (uint32_t q = 0; q < 4; ++q) {
    const uint32_t slot = (k * E + e) * 4 + q;
    const Acc w = en.idx[0] >= 0 ? (avg ? en.w[q] / h.n : en.w[q]) : Acc(0);
    keys[slot] = w != Acc(0) ? image + static_cast<uint32_t>(en.idx[q]) : kRoINoKey;
    slots[slot] = slot;
    weights[slot] = w;
    items[slot] = item;
  }
  return !(live && S == 0);
}

// Max mode: argmax[(k * C + c) * bins + bin] = the arg-max sample of RoI k's bin in channel c (roi_plan_argmax;
// -1: none inside). Thread i of K * C * bins.
template <typename Acc, typename T>
DCNKIT_HD void roi_align_sorted_argmax(const RoIAlignParams& p, const T* input, const T* rois, uint32_t i,
                                       int32_t* argmax) {
  const uint32_t bins = static_cast<uint32_t>(p.attrs.pooled_h * p.attrs.pooled_w);
  const uint32_t C = static_cast<uint32_t>(p.channels);
  const uint32_t bin = i % bins, c = (i / bins) % C, k = i / bins / C;
  const RoIPlanHead<Acc> h = roi_plan_head<Acc>(p, rois, k);
  int32_t best = -1;
  if (h.b >= 0 && h.n > Acc(0) && h.stride != 0) {
    const T* img = input + (h.b * p.channels + c) * h.H * h.W;
    const uint32_t ow = static_cast<uint32_t>(p.attrs.pooled_w), gw = static_cast<uint32_t>(h.box.gw);
    best = roi_plan_argmax<Acc>(img, h.stride, [&](int32_t s) {
      RoIPlanEntry<Acc> en;
      roi_plan_entry<Acc>(h, ow, gw, bin, static_cast<uint32_t>(s), RoIBoxOrigin(), &en);
      return en;
    });
  }
  argmax[i] = best;
}

// First position in keys[0, n) (ascending) whose key is >= key.
DCNKIT_HD uint32_t roi_lower_bound(const uint32_t* keys, uint32_t n, uint32_t key) {
  uint32_t lo = 0, hi = n;
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (keys[mid] < key) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// Thread i of N * C * H*W (pixel fastest, then channel, then image): grad_input[i] = the sum over its key's sorted
// slots of weight * grad_output[k, c, bin] (max: the slots of the arg-max sample only; argmax null in avg mode).
template <typename Acc, typename T>
DCNKIT_HD Acc roi_align_sorted_gather(const RoIAlignParams& p, uint32_t E, uint32_t n, const uint32_t* keys,
                                      const uint32_t* slots, const Acc* weights, const uint32_t* items,
                                      const int32_t* argmax, const T* grad_output, uint32_t i) {
  const uint32_t HW = static_cast<uint32_t>(p.height * p.width), C = static_cast<uint32_t>(p.channels);
  const uint32_t pixel = i % HW, c = (i / HW) % C, b = i / HW / C;
  const uint32_t key = b * HW + pixel;
  const uint32_t lo = roi_lower_bound(keys, n, key), hi = roi_lower_bound(keys, n, key + 1);
  const uint32_t bins = static_cast<uint32_t>(p.attrs.pooled_h * p.attrs.pooled_w);
  const uint32_t ns = static_cast<uint32_t>(kRoIPlanSamples);
  Acc sum = Acc(0);
  for (uint32_t j = lo; j < hi; ++j) {
    const uint32_t slot = slots[j], item = items[slot];
    const uint32_t k = slot / 4 / E, bin = item / ns;
    const int64_t o = (static_cast<int64_t>(k) * C + c) * bins + bin;
    if (argmax != nullptr && argmax[o] != static_cast<int32_t>(item % ns)) continue;
    sum += weights[slot] * to_acc<Acc>(grad_output[o]);
  }
  return sum;
}

}  // namespace dcnkit
