// DeformConv2d on CUDA, deterministic mode (torch.use_deterministic_algorithms): grad_input without atomics.
// Per column tile: a plan of fixed slots (4 per sampling point: the neighbour's pixel as key, the masked weight),
// a stable sort of (key, slot) pairs (CUB radix sort on CUDA, std::sort of the pairs on the CPU: the same order,
// as the slots are distinct), then one thread per (image, channel, pixel) that finds its pixel's entries by binary
// search, sums weight * column gradient over them in slot order and adds the sum to grad_input (the only writer of
// that element in the tile; tiles run in stream order). Bit-identical from run to run. The offset/mask
// gradients come from the fused sampling backward (deform_conv2d_gather.h), which is atomic-free already.
#pragma once

#include "dcnkit/deform_conv2d_gather.h"

namespace dcnkit {

// Key of a slot that contributes nothing (outside the map, or weight 0): sorts last.
constexpr uint32_t kDcnNoKey = 0xffffffffu;

// The pixel grid of a tile: thread i of nb * Cin * H*W, pixel fastest, then channel, then image.
struct DcnPixelGrid {
  uint32_t threads = 0;
  uint32_t entries = 0;  // 4 * sampling points of the tile
  FastDivmod pixel_div, channel_div, group_div;  // H*W, Cin, channels per deformable group
};

// Plan of sampling point idx of the tile's forward grid with one slice (t.slices == 1): slots 4 idx + q.
template <typename Acc, typename T, typename IndexT, int KH, int KW, bool kMask>
DCNKIT_HD void deform_conv2d_plan(const DeformConv2dParams& p, const DcnTile& t, const T* offset, const T* mask,
                                  uint32_t idx, uint32_t* keys, uint32_t* slots, Acc* weights) {
  const DcnThread w = dcn_forward_thread(t, idx);
  const DcnPointWork<Acc, IndexT> r = dcn_point_work<Acc, T, IndexT, KH, KW, kMask>(p, t, offset, mask, w);
  const uint32_t W = static_cast<uint32_t>(p.width), HW = static_cast<uint32_t>(p.height) * W;
  const uint32_t image = (w.b * static_cast<uint32_t>(p.attrs.deformable_groups) + w.g) * HW;
  const Acc ly = r.cell.ly, lx = r.cell.lx, hy = Acc(1) - ly, hx = Acc(1) - lx;
  const Acc wm[4] = {hy * hx * r.m, hy * lx * r.m, ly * hx * r.m, ly * lx * r.m};
  for (uint32_t q = 0; q < 4; ++q) {
    const uint32_t slot = 4 * idx + q;
    const bool used = r.cell.ok[q] && wm[q] != Acc(0);
    const uint32_t at = static_cast<uint32_t>(r.cell.base) + (q & 1 ? 1u : 0u) + (q & 2 ? W : 0u);
    keys[slot] = used ? image + at : kDcnNoKey;
    slots[slot] = slot;
    weights[slot] = wm[q];
  }
}

// First position in keys[0, n) (ascending) whose key is >= key: at most 33 steps.
DCNKIT_HD uint32_t dcn_lower_bound(const uint32_t* keys, uint32_t n, uint32_t key) {
  uint32_t lo = 0, hi = n;
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2;  // a shift
    if (keys[mid] < key) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// Thread i of the pixel grid: grad_input[n0 + b][c][pixel] += sum over its sorted entries of
// weight * grad_columns[b][c*K + k][pl] (k, pl of the entry's sampling point). keys/slots sorted by (key, slot).
template <typename Acc, typename T, typename G>
DCNKIT_HD void deform_conv2d_pixel_gather(const DeformConv2dParams& p, const DcnTile& t, const DcnPixelGrid& pg,
                                          const uint32_t* keys, const uint32_t* slots, const Acc* weights,
                                          const T* grad_columns, uint32_t i, G* grad_input) {
  uint32_t r, pixel, c, b;
  pg.pixel_div.divmod(i, r, pixel);
  pg.channel_div.divmod(r, b, c);
  const uint32_t g = pg.group_div.div(c);
  const uint32_t HW = pg.pixel_div.d;
  const uint32_t key = (b * static_cast<uint32_t>(p.attrs.deformable_groups) + g) * HW + pixel;
  const uint32_t lo = dcn_lower_bound(keys, pg.entries, key);
  const uint32_t hi = dcn_lower_bound(keys, pg.entries, key + 1);
  if (lo == hi) return;
  const int64_t K = p.kernel_h * p.kernel_w;
  const T* gcol = grad_columns + (static_cast<int64_t>(b) * p.in_channels + c) * K * t.pt;
  Acc s = Acc(0);
  for (uint32_t e = lo; e < hi; ++e) {
    const uint32_t slot = slots[e];
    uint32_t rest, pl, k;
    t.pos_div.divmod(slot >> 2, rest, pl);  // point = ((b * Gd + g) * K + k) * pt + pl (one slice)
    k = rest - t.k_div.div(rest) * t.k_div.d;
    s += weights[slot] * to_acc<Acc>(gcol[static_cast<int64_t>(k) * t.pt + pl]);
  }
  G* dst = grad_input + ((t.n0 + b) * p.in_channels + c) * p.height * p.width + pixel;
  *dst = *dst + s;
}

}  // namespace dcnkit
