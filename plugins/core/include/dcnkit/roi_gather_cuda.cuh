// CUDA side of the tile gather (roi_gather.h): the footprint kernel (one thread per RoI; it also raises the
// batch-index assert where the params ask), the table kernel (one thread per table entry of a chunk), the gather
// kernel (one block per (image, tile, channel group), the chunk's RoIs culled and listed in index order in shared
// memory), their launch (roi_gather_cuda), and max mode's arg-max kernel. Everything is sized from the shapes and
// launched asynchronously: nothing is read back, so the launches are capturable in a CUDA graph.
#pragma once

#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/roi_gather_ops.h"

namespace dcnkit {

// One thread per RoI (element_launch: no loop holds a RoI's head).
template <typename G, typename T>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    roi_gather_footprint_kernel(G g, int64_t num_rois, const T* __restrict__ rois, int64_t batch, bool assert_batch,
                                RoIFootprint* __restrict__ foot) {
  using Acc = typename G::Acc;
  DCNKIT_CUDA_ELEMENT(k, num_rois);
  int64_t b = 0;
  if (assert_batch && !roi_batch_index<Acc>(rois + k * 5, batch, &b)) roi_batch_index_assert_fail();
  foot[k] = g.footprint(k);
}

// Entry i of the tables of RoIs [k0, ...): entry i % E of RoI k0 + i / E (E = g.table_entries()), one thread each.
template <typename G>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    roi_gather_table_kernel(G g, int64_t k0, int64_t n, typename G::Acc* __restrict__ tables) {
  DCNKIT_CUDA_ELEMENT(i, n);
  const int64_t E = g.table_entries();
  tables[i] = g.table(k0 + i / E, i % E);
}

// One block per (image, tile) (a loop past the grid's blocks) and channel group; the RoIs that meet the tile listed in
// RoI order in shared memory (their offset in the step of 256 and their footprint), 32-bit pixels and footprints. What
// the innermost loop (the op's add) does not change -- the thread's pixel, channels and step -- is kept in a per-thread
// frame in shared memory (RoIGatherFrame, read at each use through volatile): with the add inlined the kernel stays
// within 48 registers.
template <typename T, typename G>
__global__ void __launch_bounds__(kRoIGatherThreads, kRoIMinBlocks)
    roi_gather_kernel(G g, RoIGatherGrid grid, int64_t k1, const RoIFootprint* __restrict__ foot, bool first,
                      bool last, typename G::Acc* partial, T* out) {
  using Acc = typename G::Acc;
  constexpr int kC = roi_gather_channels<Acc>();
  __shared__ int listed[kRoIGatherThreads];
  __shared__ RoIFootprint feet[kRoIGatherThreads];
  __shared__ int warp_hits[kRoIGatherThreads / 32];
  __shared__ RoIGatherFrame frames[kRoIGatherThreads];
  __shared__ double scratch_store[kRoIGatherThreads * kRoIGatherScratch];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  volatile RoIGatherFrame* fr = frames + tid;
  const RoIScratch scratch = scratch_store + tid * kRoIGatherScratch;
  const int32_t C = static_cast<int32_t>(grid.channels);
  for (int32_t blk = blockIdx.x; blk < grid.blocks; blk += gridDim.x) {
    const RoIGatherPixel px = roi_gather_pixel(grid, blk, tid);
    fr->b = px.b;
    fr->y = px.y;
    fr->x = px.x;
    fr->ty0 = px.ty0;
    fr->tx0 = px.tx0;
    fr->inside = px.inside;
    for (int32_t c0 = int32_t(blockIdx.y) * kC; c0 < C; c0 += int32_t(gridDim.y) * kC) {
      fr->c0 = c0;
      fr->nc = C - c0 < kC ? C - c0 : kC;
      Acc acc[kC];
      DCNKIT_PRAGMA_UNROLL
      for (int c = 0; c < kC; ++c) acc[c] = Acc(0);
      for (int64_t s0 = g.k0; s0 < k1; s0 += kRoIGatherThreads) {
        fr->s0 = s0;
        // Cull: each thread tests one RoI; the hits are listed in RoI order (rank = the hits before it).
        const bool mine = s0 + tid < k1;
        const RoIFootprint f = mine ? foot[s0 + tid] : roi_no_footprint();
        const bool hit = mine && f.b == fr->b && f.y0 - (kRoIGatherTile - 1) <= fr->ty0 && f.y1 >= fr->ty0 &&
                         f.x0 - (kRoIGatherTile - 1) <= fr->tx0 && f.x1 >= fr->tx0;
        const unsigned m = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) warp_hits[warp] = __popc(m);
        __syncthreads();
        int rank = __popc(m & ((1u << lane) - 1u)), total = 0;
        for (int w = 0; w < kRoIGatherThreads / 32; ++w) {
          rank += w < warp ? warp_hits[w] : 0;
          total += warp_hits[w];
        }
        if (hit) {
          listed[rank] = tid;
          feet[rank] = f;
        }
        fr->total = total;
        __syncthreads();
        if (fr->inside) {
          for (fr->j = 0; fr->j < fr->total; fr->j = fr->j + 1) {
            const int j = fr->j;
            const int32_t y = fr->y, x = fr->x;
            if (feet[j].y0 <= y && y <= feet[j].y1 && feet[j].x0 <= x && x <= feet[j].x1) {
              g.add(fr->s0 + listed[j], fr->c0, fr->nc, y, x, acc, scratch);
            }
          }
        }
        __syncthreads();
      }
      if (fr->inside) {  // channel by channel, the element's offset moved by one map each (no 8 addresses at once)
        const int64_t HW = grid.height * grid.width;
        int64_t i = (int64_t(fr->b) * C + fr->c0) * HW + int64_t(fr->y) * grid.width + fr->x;
        DCNKIT_PRAGMA_UNROLL
        for (int c = 0; c < kC; ++c, i += HW) {
          if (c < fr->nc) roi_gather_store<T, Acc>(acc[c], i, first, last, partial, out);
        }
      }
    }
  }
}

// The gather of one map: the footprints of all RoIs, then per chunk of RoIs its tables and the gather, writing the
// whole (N, C, H, W) gradient `out`. `b`: the workspace's buffers (roi_gather_carve). rois: the (K, 5) rows, read for
// the batch-index assert when assert_batch.
template <typename T, typename G>
Status roi_gather_cuda(const char* where, G g, int64_t num_rois, const RoIGatherGrid& grid, const T* rois,
                       int64_t batch, bool assert_batch, const RoIGatherBuffers& b, T* out, cudaStream_t s) {
  using Acc = typename G::Acc;
  if (grid.blocks == 0 || grid.channels == 0) return Status::Ok();
  DCNKIT_RETURN_IF_ERROR(check_roi_gather_grid(where, grid));
  static_assert(kRoIGatherStaticSmem <= kCudaDefaultSmemBytes, "gather shared memory");
  if (num_rois > 0) {
    const LaunchDims d = element_launch("roi_gather_footprint_kernel", num_rois);
    DCNKIT_RETURN_IF_ERROR(check_launch(d));
    roi_gather_footprint_kernel<G, T><<<launch_grid(d), d.block, 0, s>>>(g, num_rois, rois, batch, assert_batch,
                                                                         b.foot);
    DCNKIT_RETURN_IF_ERROR(cuda_launch_status(where));
  }
  const int64_t E = g.table_entries();
  Acc* tables = static_cast<Acc*>(b.tables);
  // The running sums across chunks: the gradient itself for float and double, the float32 buffer for 16-bit types.
  Acc* partial = std::is_same<T, Acc>::value ? reinterpret_cast<Acc*>(out) : static_cast<Acc*>(b.partial);
  for (int64_t k0 = 0; k0 < num_rois || k0 == 0; k0 += b.chunk) {
    const int64_t k1 = k0 + b.chunk < num_rois ? k0 + b.chunk : num_rois;
    g.k0 = k0;
    g.tables = tables;
    if (k1 > k0 && E > 0) {
      const LaunchDims d = element_launch("roi_gather_table_kernel", (k1 - k0) * E);
      DCNKIT_RETURN_IF_ERROR(check_launch(d));
      roi_gather_table_kernel<G><<<launch_grid(d), d.block, 0, s>>>(g, k0, (k1 - k0) * E, tables);
      DCNKIT_RETURN_IF_ERROR(cuda_launch_status(where));
    }
    const LaunchDims d = roi_gather_launch(grid);
    roi_gather_kernel<T, G><<<launch_grid(d), d.block, 0, s>>>(g, grid, k1, b.foot, k0 == 0, k1 >= num_rois, partial,
                                                             out);
    DCNKIT_RETURN_IF_ERROR(cuda_launch_status(where));
    if (k1 >= num_rois) break;
  }
  return Status::Ok();
}

// Max mode: argmax[2 i], argmax[2 i + 1] = the coordinates of element i's winning sample (roi_gather_argmax_at), one
// thread per element (element_launch).
template <typename Acc, typename HeadOf, typename MapOf>
__global__ void __launch_bounds__(kCudaThreads, kRoIMinBlocks)
    roi_gather_argmax_kernel(HeadOf head_of, MapOf map_of, int64_t C, int64_t pooled_w, int64_t bins, int64_t n,
                             Acc* __restrict__ argmax) {
  DCNKIT_CUDA_ELEMENT(i, n);
  roi_gather_argmax_at<Acc>(head_of, map_of, C, pooled_w, bins, i, argmax, roi_thread_frame<Acc>());
}

}  // namespace dcnkit
