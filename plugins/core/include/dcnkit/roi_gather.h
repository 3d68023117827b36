// The deterministic backward of the RoI operators (torch.use_deterministic_algorithms): grad_input without atomics,
// for any valid input, in memory the host sizes from the shapes alone. RoIAlign, MultiLevelRoIAlign (per level),
// DeformRoIPool and DeformPSRoIPool use it (roi_gather_ops.h, psroi_gather.h); any RoIAlign-like op (one
// whose samples lie on a per-bin grid) plugs in the same way.
//
// Bilinear sampling is separable: a sample's weight on pixel (y, x) is (its weight on row y) x (its weight on column
// x), and whether it is inside the map is (inside along y) and (inside along x). So in avg mode a bin's gradient onto
// the map is an outer product: the sum over its gh x gw samples of their weights on (y, x) is (the sum over its gh
// sample rows of their weights on row y) x (the same over its gw columns on x). roi_axis_weight computes one such
// factor, visiting only the samples that can reach that row (found by bisection: 2 or 3 for an adaptive grid, at most
// the explicit ratio otherwise, runs of equal coordinates once each): bounded for any box. Max mode has one winning
// sample per (RoI, channel, bin), found once by the forward's rule and kept as its coordinates (roi_gather_ops.h).
//
// The passes, for a chunk of RoIs at a time (roi_gather_chunk: the tables of a chunk take at most
// kRoIGatherTableBytes; one chunk in all but extreme cases):
//   1. footprints (once, all RoIs): the rows and columns of the map each RoI's samples can reach (RoIFootprint);
//   2. tables (per chunk): each RoI's factors, every (bin, row) and (bin, column) of the map -- the op's table();
//   3. gather (per chunk): one block per (image, 16 x 16 pixel tile, group of roi_gather_channels channels), one
//      thread per pixel holding one accumulator per channel. The block walks the chunk's RoIs in index order, 256 at
//      a time: each thread tests one RoI's footprint against the tile and the image, the block lists the RoIs that
//      meet it in order (shared memory), and every thread adds each listed RoI's contribution to its pixel (the op's
//      add(): table lookups and multiply-adds, no division, no bisection). The pixel's sum is thus taken in a fixed
//      order -- RoI index, then the op's bin order; chunk after chunk -- whatever the thread layout or the hardware:
//      bit-identical from run to run, and written once per chunk (no zeroing; 16-bit gradients are written directly
//      from a one-chunk gather, else through a float32 buffer).
// Memory: the footprints, the tables of one chunk, max mode's coordinates (2 per output element), that float32
// buffer when needed: shapes only. Work: the culling (one footprint test per RoI and block) plus each pixel's
// tables' lookups for the RoIs that reach it.
//
// An op G provides (DCNKIT_HD, const), with members k0 (the chunk's first RoI) and tables (its tables) set per chunk:
//   using Acc;
//   RoIFootprint footprint(int64_t k);     RoI k on the map this launch writes (b = -1: nothing there)
//   int64_t table_entries();               table entries per RoI
//   Acc table(int64_t k, int64_t e);       entry e of RoI k's tables
//   void add(int64_t k, int64_t c0, int nc, int32_t y, int32_t x, Acc* acc, RoIScratch scratch);
//                                          acc[c] += RoI k's contribution to pixel (y, x) of channel c0 + c,
//                                          c < nc <= roi_gather_channels<Acc>(); scratch: kRoIGatherScratch values
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "dcnkit/launch_limits.h"
#include "dcnkit/roi_kernels.h"

// `#pragma unroll` for nvcc only (host compilers warn about it).
#if defined(__CUDACC__)
#define DCNKIT_PRAGMA_UNROLL _Pragma("unroll")
#define DCNKIT_PRAGMA_UNROLL_1 _Pragma("unroll 1")
#else
#define DCNKIT_PRAGMA_UNROLL
#define DCNKIT_PRAGMA_UNROLL_1
#endif

namespace dcnkit {

constexpr int64_t kRoIGatherTile = 16;        // tile side (pixels)
constexpr int kRoIGatherThreads = 256;        // one per pixel of a tile; also the RoIs tested per step
// Channels per thread (its accumulators): 8, or 2 for double (two registers each: the kernel stays within 48).
template <typename Acc>
DCNKIT_HD constexpr int roi_gather_channels() {
  return sizeof(Acc) == 8 ? 2 : 8;
}
constexpr int64_t kRoIGatherTableBytes = int64_t(64) << 20;  // most bytes of a chunk's tables

// The rows [y0, y1] and columns [x0, x1] of the map a RoI's samples can reach, on image b (b = -1: none); 32-bit
// (check_roi_gather_grid: fewer than 2^31 images, rows and columns).
struct RoIFootprint {
  int32_t b, y0, y1, x0, x1;
};

DCNKIT_HD RoIFootprint roi_no_footprint() { return RoIFootprint{-1, 0, -1, 0, -1}; }

// Pixels [*a, *b] of an axis of n pixels that samples with coordinates in [lo, hi] can reach (either bilinear rule:
// a coordinate in [-1, n] reaches the pixels of its floor and the next, clamped), widened by 2 for rounding; an axis
// of 2^22 pixels or more is taken whole (a float's spacing there nears a pixel). False when none (NaN included).
template <typename Acc>
DCNKIT_HD bool roi_footprint_axis(Acc lo, Acc hi, int64_t n, int32_t* a, int32_t* b) {
  if (!(hi >= Acc(-1) && lo <= index_to_acc<Acc>(n)) || n <= 0) return false;
  const int32_t n32 = static_cast<int32_t>(n);
  if (n >= (int64_t(1) << 22)) {
    *a = 0;
    *b = n32 - 1;
    return true;
  }
  *a = lo <= Acc(2) ? 0 : floor_within(lo, 0, n32) - 2;
  *b = hi >= static_cast<Acc>(n32 - 3) ? n32 - 1 : floor_within(hi, -1, n32) + 3;
  return true;
}

// The union of an extent [a, b] with [*a1, *b1] (a1 > b1: empty).
DCNKIT_HD void roi_footprint_join(int32_t a, int32_t b, int32_t* a1, int32_t* b1) {
  if (*a1 > *b1) {
    *a1 = a;
    *b1 = b;
  } else {
    *a1 = a < *a1 ? a : *a1;
    *b1 = b > *b1 ? b : *b1;
  }
}

// The sum over the samples i in [0, g) of an axis (coord(i) monotone: increasing when `increasing`) of their
// weights on pixel y of an axis of n pixels (taps_of: roi_axis_taps or psroi_axis_taps). Only the samples whose
// coordinate can reach y are visited -- those in [y - 1, y + 1], from -1 at the first pixel (clamped samples) and to
// n at the last, a superset for both rules -- found by bisection; where more than kRoIGatherRunCap of them lie there
// (a fine explicit grid, or float rounding at huge coordinates), each run of equal coordinates is visited once, times
// its length.
constexpr int64_t kRoIGatherRunCap = 64;
template <typename Acc, typename Coord, typename TapsOf>
DCNKIT_HD Acc roi_axis_weight(const Coord& coord, int32_t g, bool increasing, int64_t y, int64_t n,
                              const TapsOf& taps_of) {
  const Acc lo = index_to_acc<Acc>(y - 1), hi = index_to_acc<Acc>(y + 1);  // -1 and n at the borders
  const SampleRange s = sample_range(g, increasing, lo, hi, coord);
  const bool runs = s.hi - s.lo > kRoIGatherRunCap;
  Acc w = Acc(0);
  for (int32_t i = s.lo; i < s.hi;) {
    const Acc v = coord(i);
    const int32_t e = runs ? sample_run_end(i, s.hi, v, coord) : i + 1;
    const auto t = taps_of(v, n);
    if (t.inside) w += static_cast<Acc>(e - i) * ((t.lo == y ? Acc(1) - t.l : Acc(0)) + (t.hi == y ? t.l : Acc(0)));
    i = e;
  }
  return w;
}

struct RoIAxisTapsOf {
  template <typename Acc>
  DCNKIT_HD RoIAxisTaps<Acc, AxisIndex> operator()(Acc v, int64_t n) const {
    return roi_axis_taps(v, static_cast<AxisIndex>(n));
  }
};
struct PSRoIAxisTapsOf {
  template <typename Acc>
  DCNKIT_HD RoIAxisTaps<Acc, AxisIndex> operator()(Acc v, int64_t n) const {
    return psroi_axis_taps(v, static_cast<AxisIndex>(n));
  }
};

// ---------------------------------------------------------------------------------------------
// The gather's grid: blocks (image, tile) flattened on x (a grid-stride loop over them), channel groups on y (a loop
// past 65535 groups); 256 threads; static shared memory: the listed RoIs' indices and footprints.

struct RoIGatherGrid {
  int64_t batch, channels, height, width;
  int64_t tiles_x, tiles_y, blocks, groups;
};

template <typename Acc>
RoIGatherGrid roi_gather_grid(int64_t N, int64_t C, int64_t H, int64_t W) {
  RoIGatherGrid g{N, C, H, W, 0, 0, 0, 0};
  g.tiles_x = (W + kRoIGatherTile - 1) / kRoIGatherTile;
  g.tiles_y = (H + kRoIGatherTile - 1) / kRoIGatherTile;
  g.blocks = N * g.tiles_x * g.tiles_y;
  g.groups = (C + roi_gather_channels<Acc>() - 1) / roi_gather_channels<Acc>();
  return g;
}

// The kernel decodes its block index and the taps in 32 bits: fewer than 2^31 (image, tile) blocks, rows, columns and
// channels (every gradient that fits a GPU's memory).
inline Status check_roi_gather_grid(const char* op, const RoIGatherGrid& g) {
  const int64_t lim = int64_t(1) << 31;
  if (g.blocks >= lim || g.height >= lim || g.width >= lim || g.channels >= lim) {
    return arg_error(op, "input", "fewer than 2^31 rows, columns and 16 x 16 tiles of the gradient (deterministic "
                     "backward)", std::to_string(g.height) + " x " + std::to_string(g.width) + ", " +
                     std::to_string(g.blocks) + " tiles");
  }
  return Status::Ok();
}

// A gather thread's loop state that its innermost loop does not change (roi_gather_kernel keeps it in shared memory).
struct RoIGatherFrame {
  int64_t s0;                                // the first RoI of the current step
  int32_t b, y, x, ty0, tx0, c0, nc, inside;  // RoIGatherPixel's, the channels [c0, c0 + nc)
  int32_t total, j;                          // the step's listed RoIs, the one being added
};

// An op's per-thread scratch in shared memory (its add()'s values that its loops do not change): kRoIGatherScratch
// doubles' bytes, which an op views as its own struct S through roi_scratch<S> (volatile on the device).
constexpr int kRoIGatherScratch = 11;
#if defined(__CUDA_ARCH__)
using RoIScratch = volatile double*;
template <typename S>
DCNKIT_HD volatile S* roi_scratch(RoIScratch p) {
  static_assert(sizeof(S) <= kRoIGatherScratch * sizeof(double), "scratch size");
  return reinterpret_cast<volatile S*>(p);
}
#else
using RoIScratch = double*;
template <typename S>
DCNKIT_HD S* roi_scratch(RoIScratch p) {
  static_assert(sizeof(S) <= kRoIGatherScratch * sizeof(double), "scratch size");
  return reinterpret_cast<S*>(p);
}
#endif

constexpr int64_t kRoIGatherStaticSmem =
    kRoIGatherThreads * static_cast<int64_t>(sizeof(int) + sizeof(RoIFootprint) + sizeof(RoIGatherFrame) +
                                             kRoIGatherScratch * sizeof(double)) +
    static_cast<int64_t>(sizeof(int)) * (kRoIGatherThreads / 32);

inline LaunchDims roi_gather_launch(const RoIGatherGrid& g) {
  LaunchDims d;
  d.kernel = "roi_gather_kernel";
  d.grid[0] = g.blocks < 1 ? 1 : (g.blocks > kCudaMaxStrideBlocks ? kCudaMaxStrideBlocks : g.blocks);
  d.grid[1] = g.groups < 1 ? 1 : (g.groups > kCudaMaxGridYZ ? kCudaMaxGridYZ : g.groups);
  d.block = kRoIGatherThreads;
  d.static_smem = kRoIGatherStaticSmem;
  return d;
}

// Thread `tid`'s pixel of block `blk` (image, tile row, tile column; tile column fastest), in 32-bit arithmetic.
struct RoIGatherPixel {
  int32_t b, y, x, ty0, tx0;  // image, pixel, the tile's first row and column (check_roi_gather_grid)
  bool inside;                // the pixel is on the map (the last tiles of a row or column are partial)
};
DCNKIT_HD RoIGatherPixel roi_gather_pixel(const RoIGatherGrid& g, int64_t blk, int tid) {
  RoIGatherPixel p;
  const uint32_t tiles = static_cast<uint32_t>(g.tiles_x * g.tiles_y), u = static_cast<uint32_t>(blk);
  const uint32_t b = u / tiles, t = u - b * tiles, ty = t / static_cast<uint32_t>(g.tiles_x);
  const uint32_t tx = t - ty * static_cast<uint32_t>(g.tiles_x);
  p.b = static_cast<int32_t>(b);
  p.ty0 = static_cast<int32_t>(ty * kRoIGatherTile);
  p.tx0 = static_cast<int32_t>(tx * kRoIGatherTile);
  p.inside = int64_t(p.ty0) + tid / kRoIGatherTile < g.height && int64_t(p.tx0) + tid % kRoIGatherTile < g.width;
  p.y = p.inside ? p.ty0 + tid / kRoIGatherTile : p.ty0;
  p.x = p.inside ? p.tx0 + tid % kRoIGatherTile : p.tx0;
  return p;
}

// Whether a RoI's footprint meets the block's tile (on its image), and whether it holds the pixel.
DCNKIT_HD bool roi_gather_meets(const RoIFootprint& f, const RoIGatherPixel& p) {
  return f.b == p.b && f.y0 - (kRoIGatherTile - 1) <= p.ty0 && f.y1 >= p.ty0 && f.x0 - (kRoIGatherTile - 1) <= p.tx0 &&
         f.x1 >= p.tx0;
}
DCNKIT_HD bool roi_gather_holds(const RoIFootprint& f, const RoIGatherPixel& p) {
  return f.y0 <= p.y && p.y <= f.y1 && f.x0 <= p.x && p.x <= f.x1;
}

// The end of a pixel's sum over one chunk: the running sum kept in `partial` (the gradient itself for float and
// double, a float32 buffer for 16-bit types; null for a single chunk) until the last chunk writes the gradient.
template <typename T, typename Acc>
DCNKIT_HD void roi_gather_store(Acc v, int64_t i, bool first, bool last, Acc* partial, T* out) {
  if (!first) v += partial[i];
  if (last) {
    out[i] = from_acc<T>(v);
  } else {
    partial[i] = v;
  }
}

// ---------------------------------------------------------------------------------------------
// Workspace: the footprints, max mode's coordinates, one chunk's tables, the float32 running sums (16-bit gradients
// over several chunks), an op's per-output scale (DeformPSRoIPool's g / count). Carved in that order; base null:
// sizes only.

// RoIs per chunk: as many as keep the tables within kRoIGatherTableBytes (at least one).
inline int64_t roi_gather_chunk(int64_t num_rois, int64_t table_entries, size_t acc_bytes) {
  const int64_t per_roi = (table_entries > 0 ? table_entries : 1) * static_cast<int64_t>(acc_bytes);
  const int64_t cap = kRoIGatherTableBytes / per_roi;
  const int64_t c = cap < num_rois ? cap : num_rois;
  return c < 1 ? 1 : c;
}

struct RoIGatherSizes {
  int64_t num_rois = 0, table_entries = 0, argmax = 0, partial = 0, scale = 0;  // counts (partial: 16-bit only)
  size_t acc_bytes = 4;
};
struct RoIGatherBuffers {
  RoIFootprint* foot = nullptr;
  void *argmax = nullptr, *tables = nullptr, *partial = nullptr, *scale = nullptr;
  int64_t chunk = 1;
};

inline size_t roi_gather_carve(const RoIGatherSizes& s, char* base, RoIGatherBuffers* b) {
  size_t at = 0;
  auto take = [&](size_t bytes) -> void* {
    void* ptr = base == nullptr ? nullptr : base + at;
    at += align_up(bytes);
    return ptr;
  };
  const auto n = [](int64_t v) { return static_cast<size_t>(v > 0 ? v : 0); };
  b->chunk = roi_gather_chunk(s.num_rois, s.table_entries, s.acc_bytes);
  b->foot = static_cast<RoIFootprint*>(take(sizeof(RoIFootprint) * n(s.num_rois)));
  b->argmax = take(2 * s.acc_bytes * n(s.argmax));
  b->tables = take(s.acc_bytes * n(b->chunk < s.num_rois ? b->chunk : s.num_rois) * n(s.table_entries));
  const bool chunks = b->chunk < s.num_rois;
  b->partial = take(chunks ? sizeof(float) * n(s.partial) : 0);
  b->scale = take(s.acc_bytes * n(s.scale));
  return at;
}

#if !defined(__CUDACC__)
// The CUDA grids of the footprint, table and gather kernels run serially on the host (the CPU test path
// DCNKIT_ROI_CPU_PATH=cuda-schedule-deterministic): the launches of the CUDA launcher's chunking checked against
// CUDA's limits, then chunk by chunk the tables and the gather, block by block, channel group by group, the RoIs in
// steps of 256 culled and listed as the kernel lists them, each thread's pixel summed in list order. The chunks here
// are a third of the RoIs (at least one), so that test sizes take the several-chunk path (the running sums kept in
// the gradient between chunks, as CUDA keeps them for float and double). `g` is copied per chunk (k0 and tables set
// here). out: the (N, C, H, W) gradient, written.
template <typename G, typename T>
Status roi_gather_serial(G g, int64_t num_rois, const RoIGatherGrid& grid, T* out) {
  using Acc = typename G::Acc;
  static_assert(std::is_same<Acc, T>::value, "the CPU runs float and double in their own type");
  DCNKIT_RETURN_IF_ERROR(check_roi_gather_grid("roi_gather_serial", grid));
  const int64_t entries = g.table_entries(), chunk = (num_rois + 2) / 3 > 0 ? (num_rois + 2) / 3 : 1;
  if (num_rois > 0) DCNKIT_RETURN_IF_ERROR(check_launch(element_launch("roi_gather_footprint_kernel", num_rois)));
  DCNKIT_RETURN_IF_ERROR(check_launch(
      element_launch("roi_gather_table_kernel", roi_gather_chunk(num_rois, entries, sizeof(Acc)) * entries)));
  DCNKIT_RETURN_IF_ERROR(check_launch(roi_gather_launch(grid)));
  std::vector<RoIFootprint> foot(static_cast<size_t>(num_rois > 0 ? num_rois : 0));
  for (int64_t k = 0; k < num_rois; ++k) foot[static_cast<size_t>(k)] = g.footprint(k);
  std::vector<Acc> tables(static_cast<size_t>(chunk * entries));
  const int64_t C = grid.channels, HW = grid.height * grid.width;
  Acc* partial = out;
  std::vector<int64_t> listed;
  double scratch[kRoIGatherScratch];
  for (int64_t k0 = 0; k0 < num_rois || k0 == 0; k0 += chunk) {
    const int64_t k1 = k0 + chunk < num_rois ? k0 + chunk : num_rois;
    g.k0 = k0;
    for (int64_t i = 0; i < (k1 - k0) * entries; ++i) tables[static_cast<size_t>(i)] = g.table(k0 + i / entries, i % entries);
    g.tables = tables.data();
    for (int64_t blk = 0; blk < grid.blocks; ++blk) {
      constexpr int kC = roi_gather_channels<Acc>();
      for (int64_t c0 = 0; c0 < C; c0 += kC) {
        const int nc = static_cast<int>(C - c0 < kC ? C - c0 : kC);
        Acc acc[kRoIGatherThreads][kC] = {};
        const RoIGatherPixel first = roi_gather_pixel(grid, blk, 0);
        for (int64_t s0 = k0; s0 < k1; s0 += kRoIGatherThreads) {
          listed.clear();
          for (int64_t k = s0; k < k1 && k < s0 + kRoIGatherThreads; ++k) {
            if (roi_gather_meets(foot[static_cast<size_t>(k)], first)) listed.push_back(k);
          }
          for (int tid = 0; tid < kRoIGatherThreads; ++tid) {
            const RoIGatherPixel px = roi_gather_pixel(grid, blk, tid);
            if (!px.inside) continue;
            for (int64_t k : listed) {
              if (roi_gather_holds(foot[static_cast<size_t>(k)], px)) {
                g.add(k, c0, nc, px.y, px.x, acc[tid], scratch);
              }
            }
          }
        }
        for (int tid = 0; tid < kRoIGatherThreads; ++tid) {
          const RoIGatherPixel px = roi_gather_pixel(grid, blk, tid);
          if (!px.inside) continue;
          for (int c = 0; c < nc; ++c) {
            roi_gather_store(acc[tid][c], (px.b * C + c0 + c) * HW + px.y * grid.width + px.x, k0 == 0,
                             k1 >= num_rois, partial, out);
          }
        }
      }
    }
    if (k1 >= num_rois) break;
  }
  return Status::Ok();
}
#endif

}  // namespace dcnkit
