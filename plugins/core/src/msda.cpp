// MultiScaleDeformableAttention: params, checks and CPU launchers over the per-thread math of
// msda_kernels.h.
#include <string>

#include <algorithm>

#include "cuda_schedule_cpu.h"
#include "dcnkit/launch_limits.h"
#include "dcnkit/msda.h"
#include "dcnkit/msda_kernels.h"

namespace dcnkit {

namespace {

// Channels per call of the per-thread functions on the CPU (a head has 32 in Deformable DETR).
constexpr int kCpuChannelChunk = 32;

std::string level_str(const int64_t* spatial_shapes, const int64_t* level_start_index, int64_t l) {
  return "(H, W) = (" + std::to_string(spatial_shapes[2 * l]) + ", " + std::to_string(spatial_shapes[2 * l + 1]) +
         "), start " + std::to_string(level_start_index[l]);
}

}  // namespace

Status make_msda_params(const char* op, const Shape& value, const Shape& spatial_shapes,
                        const Shape& level_start_index, const Shape& sampling_locations,
                        const Shape& attention_weights, MsdaParams* p) {
  DCNKIT_RETURN_IF_ERROR(check_rank(op, "value", value, 4, "(N, S, M, D)"));
  DCNKIT_RETURN_IF_ERROR(check_rank(op, "spatial_shapes", spatial_shapes, 2, "(L, 2)"));
  DCNKIT_RETURN_IF_ERROR(check_dim(op, "spatial_shapes", spatial_shapes, 1, 2, "rows (H, W)"));
  const int64_t L = spatial_shapes[0];
  if (L < 1) {
    return arg_error(op, "spatial_shapes", "at least one level (L >= 1)", shape_str(spatial_shapes));
  }
  DCNKIT_RETURN_IF_ERROR(check_rank(op, "level_start_index", level_start_index, 1, "(L)"));
  DCNKIT_RETURN_IF_ERROR(check_dim(op, "level_start_index", level_start_index, 0, L, "L, the rows of spatial_shapes"));
  DCNKIT_RETURN_IF_ERROR(check_rank(op, "sampling_locations", sampling_locations, 6, "(N, Lq, M, L, P, 2)"));
  const Shape& sl = sampling_locations;
  DCNKIT_RETURN_IF_ERROR(check_dim(op, "sampling_locations", sl, 0, value[0], "N, the batch of value"));
  DCNKIT_RETURN_IF_ERROR(check_dim(op, "sampling_locations", sl, 2, value[2], "M, the heads of value"));
  DCNKIT_RETURN_IF_ERROR(check_dim(op, "sampling_locations", sl, 3, L, "L, the rows of spatial_shapes"));
  DCNKIT_RETURN_IF_ERROR(check_dim(op, "sampling_locations", sl, 5, 2, "(x, y)"));
  DCNKIT_RETURN_IF_ERROR(check_rank(op, "attention_weights", attention_weights, 5, "(N, Lq, M, L, P)"));
  for (size_t d = 0; d < 5; ++d) {
    if (attention_weights[d] != sl[d]) {  // the message only on a mismatch: no formatting on the success path
      DCNKIT_RETURN_IF_ERROR(check_dim(op, "attention_weights", attention_weights, d, sl[d],
                                       "that of sampling_locations " + shape_str(sl)));
    }
  }
  p->batch = value[0];
  p->num_values = value[1];
  p->heads = value[2];
  p->channels = value[3];
  p->num_queries = sl[1];
  p->num_levels = L;
  p->num_points = sl[4];
  return Status::Ok();
}

Status check_msda_levels(const char* op, const MsdaParams& p, const int64_t* spatial_shapes,
                         const int64_t* level_start_index) {
  const int64_t S = p.num_values;
  int64_t total = 0;
  for (int64_t l = 0; l < p.num_levels; ++l) {
    const int64_t H = spatial_shapes[2 * l], W = spatial_shapes[2 * l + 1], start = level_start_index[l];
    const std::string arg = "spatial_shapes[" + std::to_string(l) + "]";
    if (H < 0 || W < 0) {
      return arg_error(op, arg, "sizes (H, W) >= 0", level_str(spatial_shapes, level_start_index, l));
    }
    if (start < 0 || start > S || (W > 0 && H > (S - start) / W)) {
      return arg_error(op, "level_start_index[" + std::to_string(l) + "]",
                       "a start with start + H*W <= S = " + std::to_string(S) + " (value's dim 1)",
                       level_str(spatial_shapes, level_start_index, l));
    }
    total += H * W;  // each term <= S: no overflow
    if (total > S) break;
  }
  if (total != S) {
    std::string sizes;
    for (int64_t l = 0; l < p.num_levels; ++l) {
      sizes += (l ? ", " : "") + std::to_string(spatial_shapes[2 * l]) + "x" + std::to_string(spatial_shapes[2 * l + 1]);
    }
    return arg_error(op, "spatial_shapes", "sum of H*W equal to S = " + std::to_string(S) + " (value's dim 1)",
                     (total > S ? "more than " + std::to_string(S) : std::to_string(total)) + " (levels " + sizes +
                         ")");
  }
  return Status::Ok();
}

template <typename T>
Status msda_forward_cpu(const MsdaParams& p, const T* value, const int64_t* spatial_shapes,
                        const int64_t* level_start_index, const T* sampling_locations, const T* attention_weights,
                        T* output, const CpuContext& ctx) {
  if (cuda_schedule_on_cpu()) {  // msda_forward_cuda's grid, serially; no host check of the tables
    // CUDA's limits
    DCNKIT_RETURN_IF_ERROR(check_launch(stride_launch("msda_forward_kernel", msda_thread_count<kMsdaForwardChunk>(p))));
    for (int64_t i = 0; i < msda_thread_count<kMsdaForwardChunk>(p); ++i) {
      msda_forward_thread<T, T>(p, value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
                                output, i);
    }
    return Status::Ok();
  }
  DCNKIT_RETURN_IF_ERROR(check_msda_levels("multi_scale_deformable_attn", p, spatial_shapes, level_start_index));
  // The CUDA kernels' launch grid (msda_thread), with runs of kCpuChannelChunk channels.
  parallel_for(ctx, msda_thread_count<kCpuChannelChunk>(p), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const MsdaThread t = msda_thread<kCpuChannelChunk>(p, i);
      msda_forward_channels<kCpuChannelChunk, T, T>(p, value, spatial_shapes, level_start_index, sampling_locations,
                                                    attention_weights, t.n, t.q, t.m, t.run.c0, t.run.count, output);
    }
  });
  return Status::Ok();
}

template <typename T>
Status msda_backward_cpu(const MsdaParams& p, const T* grad_output, const T* value, const int64_t* spatial_shapes,
                         const int64_t* level_start_index, const T* sampling_locations, const T* attention_weights,
                         T* grad_value, T* grad_sampling_locations, T* grad_attention_weights,
                         const CpuContext& ctx) {
  if (cuda_schedule_on_cpu()) {  // msda_backward_cuda's zeroing and grid, serially; no host check of the tables
    // CUDA's limits
    DCNKIT_RETURN_IF_ERROR(check_launch(stride_launch("msda_backward_kernel", msda_thread_count<kMsdaBackwardChunk>(p))));
    const int64_t nv = p.batch * p.num_values * p.heads * p.channels;
    const int64_t nw = p.batch * p.num_queries * p.heads * p.num_levels * p.num_points;
    std::fill(grad_value, grad_value + nv, T(0));
    std::fill(grad_sampling_locations, grad_sampling_locations + 2 * nw, T(0));
    std::fill(grad_attention_weights, grad_attention_weights + nw, T(0));
    for (int64_t i = 0; i < msda_thread_count<kMsdaBackwardChunk>(p); ++i) {
      msda_backward_thread<T, T>(p, grad_output, value, spatial_shapes, level_start_index, sampling_locations,
                                 attention_weights, grad_value, grad_sampling_locations, grad_attention_weights, i,
                                 PlainAdd{});
    }
    return Status::Ok();
  }
  DCNKIT_RETURN_IF_ERROR(
      check_msda_levels("_multi_scale_deformable_attn_backward", p, spatial_shapes, level_start_index));
  const int64_t N = p.batch, M = p.heads, Lq = p.num_queries, D = p.channels;
  const int64_t S = p.num_values, LP = p.num_levels * p.num_points;
  // One task per (n, m): it alone writes grad_value[n, :, m, :] and the point gradients of its queries, so
  // the result does not depend on the thread count.
  parallel_for(ctx, N * M, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t n = t / M, m = t % M;
      for (int64_t s = 0; s < S; ++s) {
        T* g = grad_value + ((n * S + s) * M + m) * D;
        for (int64_t d = 0; d < D; ++d) g[d] = T(0);
      }
      for (int64_t q = 0; q < Lq; ++q) {
        const int64_t i0 = ((n * Lq + q) * M + m) * LP;
        for (int64_t j = 0; j < LP; ++j) {
          grad_attention_weights[i0 + j] = T(0);
          grad_sampling_locations[2 * (i0 + j)] = T(0);
          grad_sampling_locations[2 * (i0 + j) + 1] = T(0);
        }
      }
      auto add_value = [&](int64_t at, T v) { grad_value[at] += v; };
      auto add_point = [&](int64_t i, T ga, T gx, T gy) {
        grad_attention_weights[i] += ga;
        grad_sampling_locations[2 * i] += gx;
        grad_sampling_locations[2 * i + 1] += gy;
      };
      for (int64_t q = 0; q < Lq; ++q) {
        for (int64_t d0 = 0; d0 < D; d0 += kCpuChannelChunk) {
          const int count = static_cast<int>(D - d0 < kCpuChannelChunk ? D - d0 : kCpuChannelChunk);
          msda_backward_channels<kCpuChannelChunk, T, T>(p, grad_output, value, spatial_shapes, level_start_index,
                                                         sampling_locations, attention_weights, n, q, m, d0, count,
                                                         add_value, add_point);
        }
      }
    }
  });
  return Status::Ok();
}

#define DCNKIT_MSDA_CPU(T)                                                                                     \
  template Status msda_forward_cpu<T>(const MsdaParams&, const T*, const int64_t*, const int64_t*, const T*,   \
                                      const T*, T*, const CpuContext&);                                        \
  template Status msda_backward_cpu<T>(const MsdaParams&, const T*, const T*, const int64_t*, const int64_t*, \
                                       const T*, const T*, T*, T*, T*, const CpuContext&);
DCNKIT_MSDA_CPU(float)
DCNKIT_MSDA_CPU(double)
#undef DCNKIT_MSDA_CPU

}  // namespace dcnkit
