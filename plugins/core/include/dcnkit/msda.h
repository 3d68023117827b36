// MultiScaleDeformableAttention (MSDA: Deformable DETR's multi-scale deformable attention sampling, mmcv's
// MultiScaleDeformableAttnFunction). See docs/operators.md.
//   value (N, S, M, D), spatial_shapes (L, 2) int64 rows (H_l, W_l), level_start_index (L) int64,
//   sampling_locations (N, Lq, M, L, P, 2) as (x, y) in [0, 1], attention_weights (N, Lq, M, L, P)
//   ->  output (N, Lq, M*D):
//   out[n, q, m*D + d] = sum_{l,p} a[n,q,m,l,p] * S_zero(value_l[n, :, m, d], y*H_l - 0.5, x*W_l - 0.5)
// where value_l is rows [level_start_index[l], level_start_index[l] + H_l*W_l) of value seen as an
// H_l x W_l map and S_zero is bilinear sampling with zeros outside (grid_sample, align_corners=False).
#pragma once

#include "dcnkit/common.h"
#include "dcnkit/context.h"

namespace dcnkit {

struct MsdaParams {
  int64_t batch = 0;        // N
  int64_t num_values = 0;   // S, the rows of every level one after the other
  int64_t heads = 0;        // M
  int64_t channels = 0;     // D, channels per head
  int64_t num_queries = 0;  // Lq
  int64_t num_levels = 0;   // L
  int64_t num_points = 0;   // P, sampling points per level and head
  Shape output_shape() const { return {batch, num_queries, heads * channels}; }
  // The same output split per head (TensorRT's MultiscaleDeformableAttnPlugin_TRT).
  Shape per_head_output_shape() const { return {batch, num_queries, heads, channels}; }
  Shape value_shape() const { return {batch, num_values, heads, channels}; }
  Shape locations_shape() const { return {batch, num_queries, heads, num_levels, num_points, 2}; }
  Shape weights_shape() const { return {batch, num_queries, heads, num_levels, num_points}; }
};

// Checks the five shapes once: value 4-D, spatial_shapes (L, 2) with L >= 1, level_start_index (L),
// sampling_locations (N, Lq, M, L, P, 2) and attention_weights (N, Lq, M, L, P) agreeing with value and
// with each other. The values of spatial_shapes and level_start_index are not read here (they may live on
// a device): see check_msda_levels.
Status make_msda_params(const char* op, const Shape& value, const Shape& spatial_shapes,
                        const Shape& level_start_index, const Shape& sampling_locations,
                        const Shape& attention_weights, MsdaParams* p);

// Host check of the level tables (where they are on the host: the CPU launchers call it): every H_l, W_l
// >= 0, level_start_index[l] >= 0 and level_start_index[l] + H_l*W_l <= S, and sum of H_l*W_l == S.
// The CUDA kernels never copy the tables to the host: a table that breaks these rules gives zeros there
// (msda_levels_valid in msda_kernels.h), never an out-of-bounds read.
Status check_msda_levels(const char* op, const MsdaParams& p, const int64_t* spatial_shapes,
                         const int64_t* level_start_index);

// CPU (float32, float64). Invalid level tables are an Invalid status (check_msda_levels).
template <typename T>
Status msda_forward_cpu(const MsdaParams& p, const T* value, const int64_t* spatial_shapes,
                        const int64_t* level_start_index, const T* sampling_locations, const T* attention_weights,
                        T* output, const CpuContext& ctx);
// Writes all three gradients (each shaped like its input; none may be null). One task per (n, m): the result does
// not depend on the thread count.
template <typename T>
Status msda_backward_cpu(const MsdaParams& p, const T* grad_output, const T* value, const int64_t* spatial_shapes,
                         const int64_t* level_start_index, const T* sampling_locations, const T* attention_weights,
                         T* grad_value, T* grad_sampling_locations, T* grad_attention_weights,
                         const CpuContext& ctx);

// CUDA (float32, float64, float16, bfloat16; 16-bit data accumulates in float32). spatial_shapes and
// level_start_index are device pointers, read by the kernels. No synchronisation, no allocation. The
// forward needs no workspace; the backward, for 16-bit types, float32 accumulation buffers of its three
// gradients (msda_backward_workspace_cuda bytes). The backward writes all three gradients (none may be null).
size_t msda_backward_workspace_cuda(const MsdaParams& p, DType dtype);
Status msda_forward_cuda(const MsdaParams& p, DType dtype, const void* value, const int64_t* spatial_shapes,
                         const int64_t* level_start_index, const void* sampling_locations,
                         const void* attention_weights, void* output, const CudaContext& ctx);
Status msda_backward_cuda(const MsdaParams& p, DType dtype, const void* grad_output, const void* value,
                          const int64_t* spatial_shapes, const int64_t* level_start_index,
                          const void* sampling_locations, const void* attention_weights, void* grad_value,
                          void* grad_sampling_locations, void* grad_attention_weights, void* workspace,
                          const CudaContext& ctx);

// Level tables in int32 (TensorRT's MultiscaleDeformableAttnPlugin_TRT and mmdeploy's TensorRT plugin take them so):
// the kernels read int64 tables, so a front end widens them into its workspace first (msda_index.cu). The workspace
// holds spatial_shapes (2L int64) then level_start_index (L int64): msda_int32_levels_workspace_cuda(p) bytes,
// growing with p.num_levels only. The widening is one kernel on ctx's stream (values copied as they are: an entry
// out of range still gives zeros); no synchronisation. On success *spatial_shapes64 and *level_start_index64
// point into `workspace` (8-byte aligned).
size_t msda_int32_levels_workspace_cuda(const MsdaParams& p);
Status msda_levels_to_int64_cuda(const MsdaParams& p, const int32_t* spatial_shapes, const int32_t* level_start_index,
                                 void* workspace, const CudaContext& ctx, const int64_t** spatial_shapes64,
                                 const int64_t** level_start_index64);

// A device-side assert when the level tables break msda_levels_valid's rules (the torch op reports a bad table as
// torch reports a bad index; the kernels give zeros for it). Never synchronises.
Status msda_assert_levels_cuda(const MsdaParams& p, const int64_t* spatial_shapes, const int64_t* level_start_index,
                               const CudaContext& ctx);

}  // namespace dcnkit
