// DeformConv2d on CUDA: the schedule of the launchers (deform_conv2d.cu), written once so that the CPU runs it
// too (DCNKIT_DCN_CPU_PATH=cuda-schedule) and the counting harness sizes its workspace: column tiles, their
// launch grids and GEMM arguments, and the dispatch over index type, kernel size and mask. Host code.
//
// Forward, per column tile (deform_conv2d_gather.h): the gather, the tile's bias broadcast into Y (when a
// bias is given), then one strided-batched GEMM per convolution group writing straight into Y's slice of
// the tile (ldc = P, beta 1 over the bias or 0). Backward, per tile: the gather and the grad_weight GEMMs
// (when grad_weight is wanted), the column-gradient GEMM into the tile, then ONE fused sampling-backward
// kernel (grad_input scatter and offset/mask gradients from the same loads).
//
// Bias: the broadcast writes Y's tile slice right before the GEMM that reads it with beta 1, so the slice
// is still in L2; it needs nothing from the GEMM (the front ends' GEMMs are ATen's and plain cuBLAS, which
// have no bias epilogue), and it has no division (a 2-D grid: channel x position).
#pragma once

#include <algorithm>

#include "dcnkit/deform_conv2d_sampling_backward.h"
#include "dcnkit/deform_conv2d_sorted.h"
#include "dcnkit/launch_limits.h"

namespace dcnkit {

// Column bytes per tile: small enough that a tile stays in L2 (H100: 50 MB) between the gather that
// writes it and the GEMM that reads it. Whole images when one fits, else a slice of one image's positions.
constexpr int64_t kDcnTileBytes = int64_t(16) << 20;
// Threads a tile's kernel should have (about one full wave of 256-thread blocks on 132 SMs x 4); more
// channel slices are cut only up to this count.
constexpr int64_t kDcnTargetThreads = int64_t(1) << 17;
// The fewest channels per slice (each slice pays the point setup once) and the most slices (the backward
// reduces a point's slices within a warp). The backward's setup (index decode, point, 2x2 window, the slices'
// shuffle reduction, the offset/mask store) is about twice the gather's, so its slices are twice as long.
constexpr int64_t kDcnMinSliceChannels = 16;
constexpr int64_t kDcnMinBackwardSliceChannels = 32;
constexpr int64_t kDcnMaxSlices = 32;
// Threads of the grad_bias block (one block per output channel; a power of two).
constexpr int kDcnBiasGradThreads = 256;

// Tiles: `images` whole images (positions == P), or `positions` < P positions of one image; slices per
// deformable group for the forward and the backward grid.
struct DcnTiling {
  int64_t images = 1, positions = 1;
  int64_t fwd_slices = 1, bwd_slices = 1;
};

// Slices for a tile of `points` sampling points (nb * Gd * K * pt): the smallest power of two that gives
// kDcnTargetThreads threads, at most kDcnMaxSlices and at most (channels per group) / min_channels.
inline int64_t deform_conv2d_slices(const DeformConv2dParams& p, int64_t points,
                                    int64_t min_channels = kDcnMinSliceChannels) {
  const int64_t cpg = p.in_channels / std::max<int64_t>(1, p.attrs.deformable_groups);
  const int64_t most = std::min<int64_t>(kDcnMaxSlices, std::max<int64_t>(1, cpg / min_channels));
  int64_t s = 1;
  while (2 * s <= most && points * s < kDcnTargetThreads) s *= 2;
  return s;
}

// Tiling of at most cap_bytes of columns (at least one position of one image).
inline DcnTiling deform_conv2d_tiling(const DeformConv2dParams& p, size_t elem, int64_t cap_bytes) {
  DcnTiling t;
  const int64_t P = std::max<int64_t>(1, p.out_spatial());
  const int64_t row = std::max<int64_t>(1, p.in_channels * p.kernel_size()) * static_cast<int64_t>(elem);
  if (row * P <= cap_bytes) {
    // At most 65535 images: the bias kernel's gridDim.z and the GEMMs' batch count.
    t.images = std::max<int64_t>(1, std::min<int64_t>({p.batch, cap_bytes / (row * P), kCudaMaxGridYZ}));
    t.positions = P;
  } else {
    int64_t pt = cap_bytes / row;
    if (pt >= 64) pt = pt / 32 * 32;  // whole warps of positions
    t.images = 1;
    t.positions = std::max<int64_t>(1, std::min(pt, P));
  }
  const int64_t points = t.images * p.attrs.deformable_groups * p.kernel_size() * t.positions;
  t.fwd_slices = deform_conv2d_slices(p, points);
  t.bwd_slices = deform_conv2d_slices(p, points, kDcnMinBackwardSliceChannels);
  return t;
}

// The launchers' tiling: kDcnTileBytes.
inline DcnTiling deform_conv2d_cuda_tiling(const DeformConv2dParams& p, DType dtype) {
  return deform_conv2d_tiling(p, dtype_size(dtype), kDcnTileBytes);
}

// Column bytes of one tile (the forward workspace; the backward adds its accumulators).
inline size_t deform_conv2d_tile_bytes(const DeformConv2dParams& p, const DcnTiling& t, size_t elem) {
  return align_up(static_cast<size_t>(t.images * t.positions * p.in_channels * p.kernel_size()) * elem);
}

// Plan entries of a tile in deterministic mode: 4 per sampling point.
inline int64_t deform_conv2d_plan_entries(const DeformConv2dParams& p, const DcnTiling& t) {
  return 4 * t.images * p.attrs.deformable_groups * p.kernel_size() * t.positions;
}

// Bytes of the deterministic backward's plan (keys and slots twice for the sort, the weights in the accumulation
// type), without the sort's own scratch (the CUDA launcher adds CUB's).
inline size_t deform_conv2d_plan_bytes(const DeformConv2dParams& p, const DcnTiling& t, DType dtype) {
  const size_t n = static_cast<size_t>(deform_conv2d_plan_entries(p, t));
  return 4 * align_up(n * sizeof(uint32_t)) + align_up(n * (dtype == DType::kFloat64 ? 8 : 4));
}

// Whether the backward's grad_input takes the sorted path (deform_conv2d_sorted.h): in deterministic mode, and on maps
// of one row or column (the fused kernel's scatter addresses a 2 x 2 window of pixels).
inline bool deform_conv2d_sorted_grad_input(const DeformConv2dParams& p, bool deterministic) {
  return deterministic || p.height < 2 || p.width < 2;
}

// Workspace of the launchers: one column tile; the backward adds, for 16-bit types, the float32 accumulators of
// grad_input and grad_weight plus one image's grad_weight GEMM result in the storage type, and the sorted path's plan
// only where it runs (deform_conv2d_sorted_grad_input: deterministic mode; the plan of a tile is about 40x its columns
// when deformable groups equal channels).
inline size_t deform_conv2d_cuda_workspace_bytes(const DeformConv2dParams& p, DType dtype, bool backward,
                                                 bool deterministic = false) {
  const DcnTiling tl = deform_conv2d_cuda_tiling(p, dtype);
  const size_t tile = deform_conv2d_tile_bytes(p, tl, dtype_size(dtype));
  if (!backward) return tile;
  const size_t plan = deform_conv2d_sorted_grad_input(p, deterministic) ? deform_conv2d_plan_bytes(p, tl, dtype) : 0;
  const bool is16 = dtype == DType::kFloat16 || dtype == DType::kBFloat16;
  if (!is16) return tile + plan;
  const int64_t gin = p.batch * p.in_channels * p.height * p.width;
  const int64_t gw = p.out_channels * p.in_per_group() * p.kernel_size();
  auto f32 = [](int64_t n) { return n > 0 ? align_up(sizeof(float) * static_cast<size_t>(n)) : size_t(0); };
  return tile + f32(gin) + f32(gw) + align_up(static_cast<size_t>(gw) * dtype_size(dtype)) + plan;
}

// The pixel grid of tile t (deterministic grad_input); `plan` is t with one slice.
inline Status make_dcn_pixel_grid(const DeformConv2dParams& p, const DcnTile& plan, DcnPixelGrid* g) {
  const int64_t HW = p.height * p.width, Gd = p.attrs.deformable_groups;
  const int64_t threads = plan.nb * p.in_channels * HW, entries = 4 * int64_t(plan.threads);
  const int64_t lim = int64_t(1) << 31;
  if (threads >= lim || entries >= lim || plan.nb * Gd * HW >= int64_t(kDcnNoKey)) {
    return arg_error("deform_conv2d_cuda (deterministic backward)", "input",
                     "a tile of fewer than 2^31 pixel threads and plan entries",
                     std::to_string(threads) + " pixel threads, " + std::to_string(entries) + " plan entries");
  }
  g->threads = static_cast<uint32_t>(threads);
  g->entries = static_cast<uint32_t>(entries);
  g->pixel_div = FastDivmod(static_cast<uint32_t>(std::max<int64_t>(1, HW)));
  g->channel_div = FastDivmod(static_cast<uint32_t>(std::max<int64_t>(1, p.in_channels)));
  g->group_div = FastDivmod(static_cast<uint32_t>(std::max<int64_t>(1, p.in_channels / Gd)));
  return Status::Ok();
}

// Whether the int32 instantiation may run: every per-image extent and the tile below 2^31.
inline bool deform_conv2d_index32(const DeformConv2dParams& p, const DcnTiling& t) {
  const int64_t lim = int64_t(1) << 31;
  const int64_t K = p.kernel_size(), P = p.out_spatial();
  return p.in_channels * p.height * p.width < lim && 2 * p.attrs.deformable_groups * K * P < lim &&
         t.images * p.in_channels * K * t.positions < lim;
}

// The tile of images [n0, n0 + nb) and positions [p0, p0 + pt) with `slices` slices per group.
inline Status make_dcn_tile(const DeformConv2dParams& p, int64_t n0, int64_t nb, int64_t p0, int64_t pt,
                            int64_t slices, DcnTile* t) {
  const int64_t K = p.kernel_size(), Gd = p.attrs.deformable_groups;
  const int64_t cpg = p.in_channels / Gd;
  const int64_t threads = nb * Gd * slices * K * pt;
  const int64_t lim = int64_t(1) << 31;
  if (threads >= lim || p.out_spatial() >= lim || K >= lim) {
    return arg_error("deform_conv2d_cuda", "input",
                     "a column tile of fewer than 2^31 threads and 2^31 output positions",
                     std::to_string(threads) + " threads, " + std::to_string(p.out_spatial()) + " positions");
  }
  // The kernels' 32-bit in-plane offsets and coordinates (dcn_gather_point, dcn_backward_point): one
  // channel plane, the padded extents (a coordinate lies in [-pad, H + pad)) and a column row step (K *
  // positions of the tile) below 2^31.
  const int64_t HW = p.height * p.width;
  if (HW >= lim || p.height + 2 * p.attrs.pad_h >= lim || p.width + 2 * p.attrs.pad_w >= lim || K * pt >= lim) {
    return arg_error("deform_conv2d_cuda", "input",
                     "an input plane H*W, H + 2*pad_h, W + 2*pad_w and a column row below 2^31 elements",
                     "H*W " + std::to_string(HW) + ", H + 2*pad_h " + std::to_string(p.height + 2 * p.attrs.pad_h) +
                         ", W + 2*pad_w " + std::to_string(p.width + 2 * p.attrs.pad_w) + ", row " +
                         std::to_string(K * pt));
  }
  t->n0 = n0;
  t->nb = nb;
  t->p0 = p0;
  t->pt = pt;
  t->slices = slices;
  t->slice_len = (cpg + slices - 1) / slices;
  t->group_channels = cpg;
  t->threads = static_cast<uint32_t>(threads);
  t->pos_div = FastDivmod(static_cast<uint32_t>(pt));
  t->k_div = FastDivmod(static_cast<uint32_t>(K));
  t->slice_div = FastDivmod(static_cast<uint32_t>(slices));
  t->group_div = FastDivmod(static_cast<uint32_t>(Gd));
  t->out_w_div = FastDivmod(static_cast<uint32_t>(std::max<int64_t>(1, p.out_w)));
  t->kernel_w_div = FastDivmod(static_cast<uint32_t>(std::max<int64_t>(1, p.kernel_w)));
  return Status::Ok();
}

// The grad_weight GEMM of one image into a temporary of grad_weight's layout (beta 0): for 16-bit types on CUDA,
// whose float32 sum over images then adds it (deform_conv2d_weight_accumulate); a 16-bit running sum would round
// at every image.
inline GemmArgs weight_gemm_to(const GemmArgs& ga, void* tmp) {
  GemmArgs g = ga;
  g.beta = 0.f;
  g.c = tmp;
  return g;
}

// The launches of the executors (the CUDA launcher's, and the CPU schedule's checks: launch_limits.h).
// Bias: x positions of the tile, y output channels (a loop past 65535), z the tile's images (at most 65535:
// deform_conv2d_tiling).
inline LaunchDims dcn_bias_launch(const DeformConv2dParams& p, const DcnTile& t) {
  LaunchDims d;
  d.kernel = "deform_conv2d_bias_kernel";
  d.grid[0] = (t.pt + 255) / 256;
  d.grid[1] = std::min<int64_t>(p.out_channels, kCudaMaxGridYZ);
  d.grid[2] = t.nb;
  return d;
}
// grad_bias: one block of kDcnBiasGradThreads per output channel (a loop past 65535).
inline LaunchDims dcn_bias_grad_launch(const DeformConv2dParams& p) {
  LaunchDims d;
  d.kernel = "bias_grad_kernel";
  d.grid[0] = std::min<int64_t>(std::max<int64_t>(1, p.out_channels), kCudaMaxGridYZ);
  d.block = kDcnBiasGradThreads;
  d.static_smem = 8 * kDcnBiasGradThreads;
  return d;
}

// Calls gemm(g) for batches of at most kCudaMaxGemmBatch of a strided-batched GEMM (the later ones' A, B and C moved
// by their strides): cuBLAS's batched kernels put the batch on gridDim.z.
template <typename F>
Status gemm_in_batches(const GemmArgs& ga, F&& gemm) {
  if (ga.batch <= kCudaMaxGemmBatch) return gemm(ga);
  const int64_t e = static_cast<int64_t>(dtype_size(ga.dtype));
  for (int64_t b0 = 0; b0 < ga.batch; b0 += kCudaMaxGemmBatch) {
    GemmArgs g = ga;
    g.batch = std::min<int64_t>(kCudaMaxGemmBatch, ga.batch - b0);
    g.a = static_cast<const char*>(ga.a) + b0 * ga.stride_a * e;
    g.b = static_cast<const char*>(ga.b) + b0 * ga.stride_b * e;
    g.c = static_cast<char*>(ga.c) + b0 * ga.stride_c * e;
    DCNKIT_RETURN_IF_ERROR(gemm(g));
  }
  return Status::Ok();
}

template <typename I> struct IndexTag { using type = I; };
template <int KH_, int KW_> struct KernelTag { static constexpr int KH = KH_, KW = KW_; };
template <bool M> struct MaskTag { static constexpr bool value = M; };

// Calls f(IndexTag<IndexT>{}, KernelTag<KH, KW>{}, MaskTag<has_mask>{}): int32 or int64 indices,
// 3x3, 1x1 or a runtime kernel size (KernelTag<0, 0>), with or without a mask.
template <typename F>
Status dispatch_dcn_variant(const DeformConv2dParams& p, bool index32, bool has_mask, F&& f) {
  auto with_index = [&](auto it) -> Status {
    auto with_kernel = [&](auto kt) -> Status {
      return has_mask ? f(it, kt, MaskTag<true>{}) : f(it, kt, MaskTag<false>{});
    };
    if (p.kernel_h == 3 && p.kernel_w == 3) return with_kernel(KernelTag<3, 3>{});
    if (p.kernel_h == 1 && p.kernel_w == 1) return with_kernel(KernelTag<1, 1>{});
    return with_kernel(KernelTag<0, 0>{});
  };
  return index32 ? with_index(IndexTag<int32_t>{}) : with_index(IndexTag<int64_t>{});
}

// The schedule. An executor `ex` provides, each returning a Status:
//   gather(const DcnTile&, T* columns)               -- deform_conv2d_gather over the tile's forward grid;
//   bias_fill(const DcnTile&)                        -- output[n][co][p0 .. p0 + pt) = bias[co] for the tile;
//   sampling_backward(const DcnTile&, const T* gcol, bool scatter) -- the fused backward over the tile's
//                                                    backward grid (grad_input scattered when `scatter`);
//   input_grad_sorted(const DcnTile& plan, const DcnPixelGrid&, const T* gcol) -- deterministic mode
//                                                    (ex.deterministic): plan, sort, pixel gather;
//   bias_grad()                                      -- grad_bias[co] = sum over n, pos of grad_output;
//   zero(T* dst, int64_t count), gemm(const GemmArgs&)  -- in stream order;
//   weight_gemm(const GemmArgs&)  -- the grad_weight GEMM (C += A x B^T, summed over images): gemm(), or
//                                    (CUDA, 16-bit types) accumulated in float32.
// `columns` holds one tile (deform_conv2d_tile_bytes). f(tile) is called per tile with `slices`.
template <typename F>
Status for_each_dcn_tile(const DeformConv2dParams& p, const DcnTiling& tl, int64_t slices, F&& f) {
  const int64_t N = p.batch, P = p.out_spatial();
  for (int64_t n0 = 0; n0 < N; n0 += tl.images) {
    const int64_t nb = std::min(tl.images, N - n0);
    for (int64_t p0 = 0; p0 < P; p0 += tl.positions) {
      DcnTile t;
      DCNKIT_RETURN_IF_ERROR(make_dcn_tile(p, n0, nb, p0, std::min(tl.positions, P - p0), slices, &t));
      DCNKIT_RETURN_IF_ERROR(f(t));
    }
  }
  return Status::Ok();
}

// The executor of the launch checks (the CPU schedule path runs the CUDA launcher's own schedule with it before it
// emulates one: check_deform_conv2d_cuda_launches): every kernel launch and GEMM the CUDA executor would make, checked
// against CUDA's limits; nothing computed.
struct DcnLaunchCheckExec {
  const DeformConv2dParams& p;
  bool deterministic;
  Status gather(const DcnTile& t, const void*) {
    return check_launch(stride_launch("deform_conv2d_gather_kernel", t.threads));
  }
  Status bias_fill(const DcnTile& t) { return check_launch(dcn_bias_launch(p, t)); }
  Status sampling_backward(const DcnTile& t, const void*, bool) {
    return check_launch(stride_launch("deform_conv2d_sampling_backward_kernel", t.threads));
  }
  Status input_grad_sorted(const DcnTile& plan, const DcnPixelGrid& pg, const void*) {
    DCNKIT_RETURN_IF_ERROR(check_launch(stride_launch("deform_conv2d_plan_kernel", plan.threads)));
    return check_launch(stride_launch("deform_conv2d_pixel_gather_kernel", pg.threads));
  }
  Status bias_grad() { return check_launch(dcn_bias_grad_launch(p)); }
  Status zero(const void*, int64_t) { return Status::Ok(); }
  Status gemm(const GemmArgs& ga) {
    return gemm_in_batches(ga, [](const GemmArgs& g) { return check_gemm_batch("deform_conv2d GEMM", g.batch); });
  }
  Status weight_gemm(const GemmArgs& ga) {
    DCNKIT_RETURN_IF_ERROR(gemm(ga));
    return check_launch(stride_launch("accumulate_kernel", p.out_channels * p.in_per_group() * p.kernel_size()));
  }
};

template <typename T, typename Exec>
Status deform_conv2d_forward_schedule(const DeformConv2dParams& p, DType dt, const DcnTiling& tl,
                                      const T* weight, bool has_bias, T* output, T* columns, Exec& ex) {
  const int64_t P = p.out_spatial();
  if (p.batch == 0 || P == 0 || p.out_channels == 0) return Status::Ok();
  const int64_t K = p.kernel_size(), Cin = p.in_channels, Cout = p.out_channels;
  const int64_t G = p.attrs.groups, cin_g = Cin / G, cout_g = Cout / G;
  return for_each_dcn_tile(p, tl, tl.fwd_slices, [&](const DcnTile& t) -> Status {
    DCNKIT_RETURN_IF_ERROR(ex.gather(t, columns));
    if (has_bias) DCNKIT_RETURN_IF_ERROR(ex.bias_fill(t));
    for (int64_t gc = 0; gc < G; ++gc) {
      // Y[n][gc][:, p0:p0+pt] (Cout_g x pt, ldc = P) (+)= W[gc] (Cout_g x Cin_g*K) x tile[b][gc] (Cin_g*K x pt).
      GemmArgs ga;
      ga.dtype = dt;
      ga.m = cout_g;
      ga.n = t.pt;
      ga.k = cin_g * K;
      ga.beta = has_bias ? 1.f : 0.f;
      ga.a = weight + gc * cout_g * cin_g * K;
      ga.lda = cin_g * K;
      ga.stride_a = 0;
      ga.b = columns + gc * cin_g * K * t.pt;
      ga.ldb = t.pt;
      ga.stride_b = Cin * K * t.pt;
      ga.c = output + t.n0 * Cout * P + gc * cout_g * P + t.p0;
      ga.ldc = P;
      ga.stride_c = Cout * P;
      ga.batch = t.nb;
      DCNKIT_RETURN_IF_ERROR(ex.gemm(ga));
    }
    return Status::Ok();
  });
}

// Gradients that are null are not computed; grad_mask is ignored without a mask. Written, not accumulated.
template <typename T, typename Exec>
Status deform_conv2d_backward_schedule(const DeformConv2dParams& p, DType dt, const DcnTiling& tl,
                                       const T* grad_output, const T* weight, bool has_mask, T* grad_input,
                                       T* grad_offset, T* grad_weight, T* grad_bias, T* grad_mask,
                                       T* columns, Exec& ex) {
  const int64_t N = p.batch, P = p.out_spatial();
  const int64_t K = p.kernel_size(), Cin = p.in_channels, Cout = p.out_channels;
  const int64_t G = p.attrs.groups, cin_g = Cin / G, cout_g = Cout / G;
  if (!has_mask) grad_mask = nullptr;
  if (grad_input) DCNKIT_RETURN_IF_ERROR(ex.zero(grad_input, N * Cin * p.height * p.width));
  if (grad_weight) DCNKIT_RETURN_IF_ERROR(ex.zero(grad_weight, Cout * cin_g * K));
  if (grad_bias) DCNKIT_RETURN_IF_ERROR(ex.bias_grad());
  const bool need_gcol = grad_input || grad_offset || grad_mask;
  if (N == 0 || P == 0 || (!need_gcol && !grad_weight)) return Status::Ok();
  return for_each_dcn_tile(p, tl, tl.bwd_slices, [&](const DcnTile& t) -> Status {
    if (grad_weight) {
      DcnTile ft = t;  // the gather's grid has its own slice count
      DCNKIT_RETURN_IF_ERROR(make_dcn_tile(p, t.n0, t.nb, t.p0, t.pt, tl.fwd_slices, &ft));
      DCNKIT_RETURN_IF_ERROR(ex.gather(ft, columns));
      for (int64_t b = 0; b < t.nb; ++b) {
        // grad_weight[gc] += grad_out[n][gc][:, p0:p0+pt] (Cout_g x pt) x tile[b][gc]^T, batched over gc.
        GemmArgs ga;
        ga.dtype = dt;
        ga.trans_b = true;
        ga.m = cout_g;
        ga.n = cin_g * K;
        ga.k = t.pt;
        ga.beta = 1.f;
        ga.a = grad_output + (t.n0 + b) * Cout * P + t.p0;
        ga.lda = P;
        ga.stride_a = cout_g * P;
        ga.b = columns + b * Cin * K * t.pt;
        ga.ldb = t.pt;
        ga.stride_b = cin_g * K * t.pt;
        ga.c = grad_weight;
        ga.ldc = cin_g * K;
        ga.stride_c = cout_g * cin_g * K;
        ga.batch = G;
        DCNKIT_RETURN_IF_ERROR(ex.weight_gemm(ga));
      }
    }
    if (!need_gcol) return Status::Ok();
    // The column gradient replaces the columns (stream order: after the grad_weight GEMMs).
    for (int64_t gc = 0; gc < G; ++gc) {
      // tile[b][gc] = W[gc]^T (Cin_g*K x Cout_g) x grad_out[n][gc][:, p0:p0+pt] (ldb = P), batched over b.
      GemmArgs ga;
      ga.dtype = dt;
      ga.trans_a = true;
      ga.m = cin_g * K;
      ga.n = t.pt;
      ga.k = cout_g;
      ga.beta = 0.f;
      ga.a = weight + gc * cout_g * cin_g * K;
      ga.lda = cin_g * K;
      ga.stride_a = 0;
      ga.b = grad_output + t.n0 * Cout * P + gc * cout_g * P + t.p0;
      ga.ldb = P;
      ga.stride_b = Cout * P;
      ga.c = columns + gc * cin_g * K * t.pt;
      ga.ldc = t.pt;
      ga.stride_c = Cin * K * t.pt;
      ga.batch = t.nb;
      DCNKIT_RETURN_IF_ERROR(ex.gemm(ga));
    }
    // grad_input without atomics in deterministic mode, and on maps of one row or column (the fused kernel's
    // scatter addresses a 2 x 2 window of pixels).
    const bool sorted = grad_input != nullptr && deform_conv2d_sorted_grad_input(p, ex.deterministic);
    if (grad_offset || grad_mask || (grad_input && !sorted))
      DCNKIT_RETURN_IF_ERROR(ex.sampling_backward(t, columns, grad_input != nullptr && !sorted));
    if (!sorted) return Status::Ok();
    DcnTile plan;
    DcnPixelGrid pg;
    DCNKIT_RETURN_IF_ERROR(make_dcn_tile(p, t.n0, t.nb, t.p0, t.pt, 1, &plan));
    DCNKIT_RETURN_IF_ERROR(make_dcn_pixel_grid(p, plan, &pg));
    return ex.input_grad_sorted(plan, pg, columns);
  });
}

// The launches the CUDA launcher would make for these params -- its own tiling (deform_conv2d_cuda_tiling), schedule
// and executor's launch shapes -- checked against CUDA's limits without computing anything (DcnLaunchCheckExec). The
// CPU schedule path (DCNKIT_DCN_CPU_PATH=cuda-schedule...) runs it first, since it emulates smaller tiles than the
// launcher's. The pointers only say which gradients are wanted; nothing is read or written.
template <typename T>
Status check_deform_conv2d_cuda_launches(const DeformConv2dParams& p, DType dt, bool has_bias, bool has_mask,
                                         bool backward, bool deterministic, T* grad_input = nullptr,
                                         T* grad_offset = nullptr, T* grad_weight = nullptr, T* grad_bias = nullptr,
                                         T* grad_mask = nullptr) {
  const DcnTiling tl = deform_conv2d_cuda_tiling(p, dt);
  DcnLaunchCheckExec ex{p, deterministic};
  if (!backward) return deform_conv2d_forward_schedule<T>(p, dt, tl, nullptr, has_bias, nullptr, nullptr, ex);
  return deform_conv2d_backward_schedule<T>(p, dt, tl, nullptr, nullptr, has_mask, grad_input, grad_offset,
                                            grad_weight, grad_bias, grad_mask, nullptr, ex);
}

}  // namespace dcnkit
