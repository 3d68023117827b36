// DeformConv2d CPU forward launcher (float32, float64); the layout is described in deform_conv2d_cpu_common.h.
#include <atomic>

#include "deform_conv2d_cpu_common.h"
#include "deform_conv2d_cpu_sampling.h"
#include "deform_conv2d_cpu_test_paths.h"

namespace dcnkit {

size_t deform_conv2d_forward_workspace_cpu(const DeformConv2dParams& p, DType dtype, const CpuContext& ctx) {
  const ForwardLayout l = forward_layout(p, dtype, ctx);
  return l.x_hwc + l.weight_t + static_cast<size_t>(std::max(1, ctx.num_threads)) * l.slot;
}

template <typename T>
Status deform_conv2d_forward_cpu(const DeformConv2dParams& p, const T* input, const T* offset,
                                 const T* weight, const T* bias, const T* mask, T* output,
                                 void* workspace, const CpuContext& ctx, const T* weight_kc,
                                 const void* weight_packed) {
  const int64_t N = p.batch, P = p.out_spatial();
  if (N == 0 || p.out_channels == 0 || P == 0) return Status::Ok();
  if (elementwise_path()) {
    forward_elementwise(p, input, offset, weight, bias, mask, output);
    return Status::Ok();
  }
  if (cuda_schedule_path()) {
    DCNKIT_RETURN_IF_ERROR(check_deform_conv2d_cuda_launches<T>(p, dtype_of_t<T>(), bias != nullptr, mask != nullptr,
                                                                false, false));
    std::vector<T> columns = cuda_schedule_columns<T>(p);
    CpuScheduleExec<T> ex{p, ctx, input, offset, mask, bias, nullptr, output, nullptr, nullptr, nullptr, nullptr};
    return deform_conv2d_forward_schedule<T>(p, dtype_of_t<T>(), cuda_schedule_tiling(p), weight, bias != nullptr,
                                             output, columns.data(), ex);
  }
  DCNKIT_RETURN_IF_ERROR(check_cpu_sampling_extents("deform_conv2d", p));
  const DType dt = dtype_of_t<T>();
  const int64_t K = p.kernel_size(), HW = p.height * p.width, Cin = p.in_channels, CK = Cin * K;
  const int64_t Gd = p.attrs.deformable_groups;
  const int64_t G = p.attrs.groups, Cout = p.out_channels, cin_g = p.in_per_group(), cout_g = p.out_per_group();
  const ForwardLayout l = forward_layout(p, dt, ctx);
  char* ws = static_cast<char*>(workspace);
  T* x_hwc = reinterpret_cast<T*>(ws);
  T* wt_own = reinterpret_cast<T*>(ws + l.x_hwc);
  char* slots = ws + l.x_hwc + l.weight_t;

  // (Cout, K, Cin_g) weight; per image, its channels-last copy, then its tiles (the workspace holds one image,
  // so it does not grow with the batch).
  if (weight_kc == nullptr) {
    parallel_for(ctx, Cout, [&](int64_t b, int64_t e) { weight_to_kc(cin_g, K, weight, wt_own, b, e); });
  }
  const T* wt = weight_kc != nullptr ? weight_kc : wt_own;
  const void* packed = weight_kc != nullptr ? weight_packed : nullptr;
  const PaddedMap map = padded_map(p);
  zero_border(map, x_hwc);  // the images' copies fill the interior only
  const int64_t tile = forward_tile(p, sizeof(T), ctx);
  const int64_t ntiles = (P + tile - 1) / tile;
  const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(ctx.num_threads, ntiles));
  std::vector<Status> statuses(static_cast<size_t>(tasks));
  // A map of one tile per task (a detector's 7x7-20x20 stage 4-5 maps): its columns are built by all tasks,
  // then the GEMM is split by output rows instead of positions, halving (2 tasks) the weight each task reads (and,
  // unpacked, packs) for its GEMM; measured 15-20 % faster for 512 channels on 7x7 and 10x10 maps with OpenBLAS,
  // 7-11 % with the packed weight (docs/performance.md). A packed weight is split at its row blocks.
  constexpr int64_t kMinRowsPerTask = 32;
  const int64_t row_unit = packed != nullptr ? kPackedRowBlock : 1;
  const int64_t row_units = (cout_g + row_unit - 1) / row_unit;
  const bool split_rows = ntiles == tasks && tasks > 1 && cout_g >= kMinRowsPerTask * tasks && row_units >= tasks;
  for (int64_t n = 0; n < N; ++n) {
    parallel_for(ctx, p.height, [&](int64_t b, int64_t e) {
      to_padded_channels_last(input + n * Cin * HW, map, x_hwc, b, e);
    });
    const PaddedImage<T> im{&p, map, x_hwc, offset + n * 2 * Gd * K * P, mask ? mask + n * Gd * K * P : nullptr};
    T* out_n = output + n * Cout * P;
    // Output rows [r0, r1) of every conv group at positions [p0, p0 + tn) from their columns `col`
    // (position-major, row stride CK), the bias written first.
    auto multiply = [&](int64_t r0, int64_t r1, int64_t p0, int64_t tn, const T* col) {
      T* out = out_n + p0;
      if (bias) {
        for (int64_t g = 0; g < G; ++g)
          for (int64_t co = g * cout_g + r0; co < g * cout_g + r1; ++co)
            std::fill(out + co * P, out + co * P + tn, bias[co]);
      }
      GemmArgs ga;
      ga.dtype = dt;
      ga.trans_b = true;
      ga.m = r1 - r0;
      ga.n = tn;
      ga.k = K * cin_g;
      ga.beta = bias ? 1.f : 0.f;
      ga.a = wt + r0 * K * cin_g;
      ga.lda = K * cin_g;
      ga.stride_a = cout_g * K * cin_g;
      ga.b = col;
      ga.ldb = CK;
      ga.stride_b = K * cin_g;
      ga.c = out + r0 * P;
      ga.ldc = P;
      ga.stride_c = cout_g * P;
      ga.batch = G;
      ga.a_packed = packed;
      ga.a_row0 = r0;
      return ctx.run_gemm(ga);
    };
    if (split_rows) {
      // One tile per task: the image's columns (contiguous in the slots), then the GEMM's output rows split
      // over the tasks, so that each reads its share of the weight once for all positions.
      T* col_all = reinterpret_cast<T*>(slots);
      parallel_tasks(ctx, tasks, [&](int64_t task) {
        const int64_t p0 = task * tile;
        if (p0 < P) build_columns(im, p0, std::min(tile, P - p0), col_all + p0 * CK);
      });
      parallel_tasks(ctx, tasks, [&](int64_t task) {
        int64_t u0, u1;
        split_range(row_units, tasks, task, &u0, &u1);
        const int64_t r0 = u0 * row_unit, r1 = std::min(cout_g, u1 * row_unit);
        if (r1 > r0) statuses[static_cast<size_t>(task)] = multiply(r0, r1, 0, P, col_all);
      });
      DCNKIT_RETURN_IF_ERROR(first_error(statuses));
      continue;
    }
    std::atomic<int64_t> next_tile{0};
    parallel_tasks(ctx, tasks, [&](int64_t task) {
      T* col = reinterpret_cast<T*>(slots + static_cast<size_t>(task) * l.slot);
      // Tiles are handed out dynamically (a busy core takes fewer); each result does not depend on
      // which task computes it.
      for (int64_t it = next_tile.fetch_add(1); it < ntiles; it = next_tile.fetch_add(1)) {
        const int64_t p0 = it * tile;
        const int64_t tn = std::min(tile, P - p0);
        build_columns(im, p0, tn, col);
        Status s = multiply(0, cout_g, p0, tn, col);
        if (!s.ok()) {
          statuses[static_cast<size_t>(task)] = s;
          return;
        }
      }
    });
    DCNKIT_RETURN_IF_ERROR(first_error(statuses));
  }
  return first_error(statuses);
}

template <typename T>
void deform_conv2d_weight_kc_cpu(int64_t out_channels, int64_t in_per_group, int64_t kernel_size, const T* weight,
                                 T* weight_kc) {
  weight_to_kc(in_per_group, kernel_size, weight, weight_kc, 0, out_channels);
}

template Status deform_conv2d_forward_cpu<float>(const DeformConv2dParams&, const float*, const float*, const float*,
                                                 const float*, const float*, float*, void*, const CpuContext&,
                                                 const float*, const void*);
template Status deform_conv2d_forward_cpu<double>(const DeformConv2dParams&, const double*, const double*,
                                                  const double*, const double*, const double*, double*, void*,
                                                  const CpuContext&, const double*, const void*);
template void deform_conv2d_weight_kc_cpu<float>(int64_t, int64_t, int64_t, const float*, float*);
template void deform_conv2d_weight_kc_cpu<double>(int64_t, int64_t, int64_t, const double*, double*);

}  // namespace dcnkit
