// One CUDA thread per (site, run of kChunk channels): the thread index split into the site (an op's output
// position, decoded by the op) and the run [c0, c0 + count) of its `width` channels. Shared by the DCNv3/DCNv4
// and multi-scale deformable attention kernels, whose per-thread functions take such a run.
#pragma once

#include "dcnkit/common.h"

namespace dcnkit {

// Runs of kChunk channels that cover `width` channels (the last one may be shorter).
template <int kChunk>
DCNKIT_HD int64_t channel_run_count(int64_t width) {
  return (width + kChunk - 1) / kChunk;
}

struct ChannelRun {
  int64_t site;  // thread index / runs
  int64_t c0;    // first channel of the run
  int count;     // channels in the run, 1..kChunk
};

// Thread index i of sites * runs threads, runs = channel_run_count<kChunk>(width).
template <int kChunk>
DCNKIT_HD ChannelRun channel_run(int64_t i, int64_t runs, int64_t width) {
  ChannelRun r;
  r.site = i / runs;
  r.c0 = (i % runs) * kChunk;
  const int64_t left = width - r.c0;
  r.count = static_cast<int>(left < kChunk ? left : kChunk);
  return r;
}

// f(c) for c in [0, count), count <= kChunk: loops of constant length kChunk, the full run separate from the
// tail (unrolled, vectorised; on CUDA the per-channel arrays stay in registers, never indexed at run time).
template <int kChunk, typename F>
DCNKIT_HD void for_channels(int count, F&& f) {
  if (count == kChunk) {
    for (int c = 0; c < kChunk; ++c) f(c);
  } else {
    for (int c = 0; c < kChunk; ++c) {
      if (c < count) f(c);
    }
  }
}

}  // namespace dcnkit
