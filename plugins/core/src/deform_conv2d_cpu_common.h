// DeformConv2d CPU launchers (float32, float64): what the forward driver (deform_conv2d_cpu_forward.cpp) and
// the backward driver (deform_conv2d_cpu_backward.cpp) share: tile and workspace layouts, the channels-last
// image, the column builder, weight reordering. Internal to plugins/core/src.
//
// The CPU launchers work channels-last: each image is copied to (H, W, Cin) in the workspace and
// column tiles are position-major, [t][conv group][k][channel of the group], so that every sampling
// point's taps (computed once per deformable group, kernel point and position) are applied to a
// contiguous run of channels (vectorised loops), and the weight is used as (Cout, K, Cin/groups).
// Forward: per image, tiles of output positions per task (as many tiles as a multiple of the tasks); a
// tile's columns (~512 KB, wider when the GEMM asks: gemm_min_n) are built in the task's workspace slot and
// multiplied into the output (ldc = Ho*Wo) by one strided-batched GEMM over the convolution groups, the bias
// written first. A map of one tile per task is built whole by all tasks, then its GEMM is split by output
// rows. The whole column matrix of a larger map never exists.
// Backward: per image and chunk of positions, each task takes a contiguous range of the chunk's
// positions: its column-gradient rows (GEMM), then one pass over their sampling points (columns for
// grad_weight, grad_offset/grad_mask, and the scatter into the task's own channels-last grad_input
// buffer, the buffers summed in task order per image); then the grad_weight GEMM, rows split over tasks.
// Every step writes disjoint memory, hence deterministic for a given number of threads.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "dcnkit/deform_conv2d.h"
#include "dcnkit/deform_conv2d_kernels.h"

namespace dcnkit {

namespace {

// Bytes of a forward column tile (tile x Cin*K). Measured on a 2-core Xeon (2 MB L2 per core): 512 KB
// beat 128/256 KB (tiles of >= 48 positions keep the GEMM efficient when Cin*K is large) and 1 MB.
// Developer knobs for tuning on other machines: DCNKIT_DCN_TILE_BYTES, DCNKIT_DCN_BWD_CHUNK_BYTES
// (read once per process, so workspace sizes and launchers agree).
constexpr int64_t kForwardTileBytes = int64_t(512) << 10;
// Bytes of a backward column chunk (chunk x Cin*K), for the columns and for their gradient (1-8 MB
// measured equal within noise).
constexpr int64_t kBackwardChunkBytes = int64_t(2) << 20;

inline int64_t bytes_override(const char* name, int64_t dflt) {
  const char* e = std::getenv(name);
  if (e == nullptr) return dflt;
  const long long v = std::atoll(e);
  return v > 0 ? static_cast<int64_t>(v) : dflt;
}

// Output positions per tile of `bytes` bytes of columns.
inline int64_t positions_per(const DeformConv2dParams& p, size_t elem, int64_t bytes) {
  const int64_t P = p.out_spatial();
  const int64_t row = std::max<int64_t>(1, p.in_channels * p.kernel_size()) * static_cast<int64_t>(elem);
  int64_t t = bytes / row;
  t = t >= 32 ? t / 16 * 16 : 32;
  return std::max<int64_t>(1, std::min(t, P));
}

// Forward tile width: ~kForwardTileBytes of columns, but no narrower than the GEMM's efficient width
// as long as a tile stays under kMaxForwardTileBytes (the workspace holds one tile per task); then the map is cut
// into as many equal tiles as a multiple of the tasks (a detector's 20x20 or 10x10 map was one tile at OpenBLAS's
// preferred width, which left all but one thread idle), which the tasks take dynamically.
inline int64_t forward_tile(const DeformConv2dParams& p, size_t elem, const CpuContext& ctx) {
  constexpr int64_t kMaxForwardTileBytes = int64_t(8) << 20;
  static const int64_t bytes = bytes_override("DCNKIT_DCN_TILE_BYTES", kForwardTileBytes);
  const int64_t P = p.out_spatial();
  const int64_t t = positions_per(p, elem, bytes);
  const int64_t widest = positions_per(p, elem, kMaxForwardTileBytes);
  const int64_t tile = std::max(t, std::min({ctx.gemm_min_n, P, widest}));
  const int64_t tasks = std::max(1, ctx.num_threads);
  const int64_t ntiles = (P + tile - 1) / tile;
  // As many tiles as a multiple of the tasks, of equal widths: a narrow last tile re-reads the whole weight for little
  // work, and tiles that do not divide among the tasks leave one idle at the end (C256 20x20 in tiles of 64: 7 tiles).
  const int64_t even = (ntiles + tasks - 1) / tasks * tasks;
  constexpr int64_t kNarrowest = 16;  // narrower GEMMs re-read the whole weight for too little work
  return std::max<int64_t>(std::min(kNarrowest, P), (P + even - 1) / even);
}

inline int64_t backward_chunk(const DeformConv2dParams& p, size_t elem) {
  static const int64_t bytes = bytes_override("DCNKIT_DCN_BWD_CHUNK_BYTES", kBackwardChunkBytes);
  return positions_per(p, elem, bytes);
}

inline size_t bytes_of(int64_t count, size_t elem) { return align_up(static_cast<size_t>(count) * elem); }

// The float launchers' channels-last copy of one image (and of its input gradient), padded with zeros
// (deform_conv2d_cpu_sampling.h): (H + 3) x (W + 2) pixels of C channels, pixel (y, x) of the map at row y + 1,
// column x + 1.
struct PaddedMap {
  int64_t H = 0, W = 0, C = 0;
  int64_t cols() const { return W + 2; }
  int64_t elements() const { return (H + 3) * cols() * C; }
  // Element offset of pixel (y, x), -1 <= y <= H + 1, -1 <= x <= W.
  int64_t at(int64_t y, int64_t x) const { return ((y + 1) * cols() + x + 1) * C; }
};

inline PaddedMap padded_map(const DeformConv2dParams& p) {
  PaddedMap m;
  m.H = p.height;
  m.W = p.width;
  m.C = p.in_channels;
  return m;
}

struct ForwardLayout {
  size_t x_hwc, weight_t, slot, col;
};

inline ForwardLayout forward_layout(const DeformConv2dParams& p, DType dtype, const CpuContext& ctx) {
  const size_t e = dtype_size(dtype);
  const int64_t T = forward_tile(p, e, ctx);
  ForwardLayout l;
  l.x_hwc = bytes_of(padded_map(p).elements(), e);  // one image: independent of the batch
  l.weight_t = bytes_of(p.out_channels * p.in_per_group() * p.kernel_size(), e);
  l.col = bytes_of(p.in_channels * p.kernel_size() * T, e);
  l.slot = l.col;
  return l;
}

// Backward position tasks: each owns a channels-last grad_input buffer (summed in task order at the end
// of the image), so the count is capped to bound the workspace.
constexpr int64_t kMaxBackwardTasks = 16;

inline int64_t backward_tasks(const CpuContext& ctx) {
  return std::min<int64_t>(std::max(1, ctx.num_threads), kMaxBackwardTasks);
}

struct BackwardLayout {
  size_t x_hwc, gin_hwc /* one per backward task */, weight_t, gweight_t, col, gcol;
  size_t total() const { return x_hwc + gin_hwc + weight_t + gweight_t + col + gcol; }
};

inline BackwardLayout backward_layout(const DeformConv2dParams& p, DType dtype, const CpuContext& ctx) {
  const size_t e = dtype_size(dtype);
  const int64_t C = backward_chunk(p, e);
  const int64_t wsz = p.out_channels * p.in_per_group() * p.kernel_size();
  BackwardLayout l;
  l.x_hwc = bytes_of(padded_map(p).elements(), e);
  l.gin_hwc = static_cast<size_t>(backward_tasks(ctx)) * l.x_hwc;
  l.weight_t = bytes_of(wsz, e);
  l.gweight_t = l.weight_t;
  l.col = bytes_of(p.in_channels * p.kernel_size() * C, e);
  l.gcol = l.col;
  return l;
}

template <typename T>
inline DType dtype_of_t();
template <>
inline DType dtype_of_t<float>() { return DType::kFloat32; }
template <>
inline DType dtype_of_t<double>() { return DType::kFloat64; }

// Splits [0, n) into `parts` near-equal contiguous ranges; range of part t.
inline void split_range(int64_t n, int64_t parts, int64_t t, int64_t* b, int64_t* e) {
  const int64_t q = n / parts, r = n % parts;
  *b = t * q + std::min(t, r);
  *e = *b + q + (t < r ? 1 : 0);
}

// (C, HW) -> (HW, C) for pixels [pb, pe).
template <typename T>
void to_channels_last(const T* __restrict src, T* __restrict dst, int64_t C, int64_t HW, int64_t pb,
                      int64_t pe) {
  constexpr int64_t kBlock = 64;
  for (int64_t b = pb; b < pe; b += kBlock) {
    const int64_t e = std::min(pe, b + kBlock);
    for (int64_t c = 0; c < C; ++c) {
      const T* s = src + c * HW;
      for (int64_t q = b; q < e; ++q) dst[q * C + c] = s[q];
    }
  }
}

// Everything the CPU loops need about one image. X: the element of the channels-last map (T, or uint8_t for
// the quantized forward, deform_conv2d_cpu_quant.cpp), T: of the offsets and mask.
template <typename T, typename X = T>
struct CpuImage {
  const DeformConv2dParams* p;
  const X* x_hwc;   // (H*W, Cin)
  const T* offset;  // (2*Gd*K, P)
  const T* mask;    // (Gd*K, P) or null
};

// Hot loops are compiled for several ISAs and picked at load time (GCC/Clang function multi-versioning
// on x86-64); elsewhere they are plain functions.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(DCNKIT_NO_FMV)
#define DCNKIT_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DCNKIT_CPU_CLONES
#endif

// dst[c] = sum_q w_q * src_q[c] for c < n.
template <typename T>
__attribute__((always_inline)) inline void blend4(T* __restrict dst, const T* __restrict s0, const T* __restrict s1,
                   const T* __restrict s2, const T* __restrict s3, T w0, T w1, T w2, T w3, int64_t n) {
  for (int64_t c = 0; c < n; ++c) dst[c] = w0 * s0[c] + w1 * s1[c] + w2 * s2[c] + w3 * s3[c];
}

// The rows of a sampling point's four neighbours in a channels-last map: x + idx_q * ld.
template <typename T, typename TapsT>
__attribute__((always_inline)) inline void tap_rows(const T* x, int64_t ld, const TapsT& taps, const T* rows[4]) {
  for (int q = 0; q < 4; ++q) rows[q] = x + taps.idx[q] * ld;
}

// Columns of positions [p0, p0 + tn) into col (tn x Cin*K, position-major, see the file comment): the sampling
// plan of every column builder (float and quantized), one copy. `blend(dst, rows, taps, n)` writes one sampling
// point's n channels from the rows of its four neighbours (rows of X, columns of C).
template <typename T, typename X, typename C, typename Blend>
__attribute__((always_inline)) inline void build_columns_with(const CpuImage<T, X>& im, int64_t p0, int64_t tn,
                                                              C* __restrict col, const Blend& blend) {
  const DeformConv2dParams& p = *im.p;
  const int64_t K = p.kernel_size(), Cin = p.in_channels, CK = Cin * K;
  const int64_t Gd = p.attrs.deformable_groups, cpg = p.in_per_deformable_group(), cin_g = p.in_per_group();
  int64_t ho = p0 / p.out_w, wo = p0 - ho * p.out_w;
  for (int64_t t = 0; t < tn; ++t) {
    const int64_t pos = p0 + t;
    C* crow = col + t * CK;
    for (int64_t i = 0, k = 0; i < p.kernel_h; ++i) {
      for (int64_t j = 0; j < p.kernel_w; ++j, ++k) {
        for (int64_t g = 0; g < Gd; ++g) {
          T py, px, m;
          deform_conv2d_point_at<T, T>(p, im.offset, im.mask, g, k, i, j, ho, wo, pos, &py, &px, &m);
          const SampleTaps<T> s = masked_taps<T>(py, px, m, p.height, p.width);
          // The group's channels, cut at conv-group borders.
          for (int64_t cb = g * cpg, cend = (g + 1) * cpg; cb < cend;) {
            const int64_t gc = cb / cin_g;
            const int64_t ce = std::min(cend, (gc + 1) * cin_g);
            const X* rows[4];
            tap_rows(im.x_hwc + cb, Cin, s, rows);
            blend(crow + gc * K * cin_g + k * cin_g + (cb - gc * cin_g), rows, s, ce - cb);
            cb = ce;
          }
        }
      }
    }
    if (++wo == p.out_w) {
      wo = 0;
      ++ho;
    }
  }
}

// weight (Cout, Cin_g, K) -> (Cout, K, Cin_g), output channels [cb, ce).
template <typename T>
void weight_to_kc(int64_t cin_g, int64_t K, const T* w, T* wt, int64_t cb, int64_t ce) {
  // Written in order, read with a stride of K: writing with a stride of cin_g instead sends the K streams of a wide
  // weight to addresses 4 KB apart (1024 channels), one cache set, and ran at 2.5 ns per element.
  for (int64_t co = cb; co < ce; ++co)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t c = 0; c < cin_g; ++c) wt[(co * K + k) * cin_g + c] = w[(co * cin_g + c) * K + k];
}

template <typename T>
void weight_to_kc(const DeformConv2dParams& p, const T* w, T* wt) {
  weight_to_kc(p.in_per_group(), p.kernel_size(), w, wt, 0, p.out_channels);
}

template <typename T>
void weight_from_kc(const DeformConv2dParams& p, const T* wt, T* w) {
  const int64_t K = p.kernel_size(), cin_g = p.in_per_group();
  for (int64_t co = 0; co < p.out_channels; ++co)  // read in order (see weight_to_kc)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t c = 0; c < cin_g; ++c) w[(co * cin_g + c) * K + k] = wt[(co * K + k) * cin_g + c];
}

inline Status first_error(const std::vector<Status>& v) {
  for (const Status& s : v)
    if (!s.ok()) return s;
  return Status::Ok();
}

}  // namespace
}  // namespace dcnkit
