// DeformConv2d CUDA launchers: the kernels over the per-thread bodies of deform_conv2d_gather.h, driven by the
// schedule of deform_conv2d_schedule.h (column tiles of at most kDcnTileBytes, GEMMs through the context on
// its stream). Both headers are what the CPU runs too (DCNKIT_DCN_CPU_PATH=cuda-schedule); this file only
// launches. float32, float64, float16 and bfloat16, forward and backward; the accumulation type follows the
// data (float for float and the 16-bit types, double for double). Backward of the 16-bit types: the
// input-gradient scatter and the grad_weight sum over images accumulate in float32 buffers of the workspace
// (rounded once at the end); their GEMMs run in the storage type with float32 compute (the context's GEMM).
// float and double scatter with atomicAdd in place.
//
// Kernels: deform_conv2d_gather_kernel (one thread per (image, deformable group, channel slice, kernel point,
// position), pos fastest), deform_conv2d_bias_kernel (2-D: channel x position), and
// deform_conv2d_sampling_backward_kernel (the same points, slice fastest: input-gradient scatter plus the
// offset/mask gradients, the slices of a point reduced by a fixed warp-shuffle tree and written once;
// deform_conv2d_point_grad_kernel: the same without the scatter).
// Each is instantiated for int32/int64 indices, 3x3/1x1/runtime kernel size, with/without mask.
#include <algorithm>

#include <cub/device/device_radix_sort.cuh>

#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/deform_conv2d.h"
#include "dcnkit/deform_conv2d_schedule.h"

namespace dcnkit {

namespace {

size_t column_bytes(const DeformConv2dParams& p, DType dtype) {
  return deform_conv2d_tile_bytes(p, deform_conv2d_cuda_tiling(p, dtype), dtype_size(dtype));
}

// Atomic on the device, plain += when the same code is compiled for the host. The destination is the
// accumulation type (float or double), so nothing is converted.
struct AtomicAdd {
  template <typename Acc>
  __host__ __device__ __forceinline__ void operator()(Acc* dst, Acc v) const {
#if defined(__CUDA_ARCH__)
    atomicAdd(dst, v);
#else
    *dst += v;
#endif
  }
};

// Elements of grad_weight (Cout, Cin/groups, kh, kw).
int64_t weight_elements(const DeformConv2dParams& p) {
  return p.out_channels * p.in_per_group() * p.kernel_size();
}

template <typename T> DType dtype_enum();
template <> DType dtype_enum<float>() { return DType::kFloat32; }
template <> DType dtype_enum<double>() { return DType::kFloat64; }
template <> DType dtype_enum<__half>() { return DType::kFloat16; }
template <> DType dtype_enum<__nv_bfloat16>() { return DType::kBFloat16; }

template <typename T, typename IndexT, int KH, int KW, bool kMask>
__device__ __forceinline__ void gather_grid(const DeformConv2dParams& p, const DcnTile& t, const T* __restrict__ input,
                                            const T* __restrict__ offset, const T* __restrict__ mask,
                                            T* __restrict__ columns) {
  using Acc = typename AccType<T>::type;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < t.threads; i += blockDim.x * gridDim.x)
    deform_conv2d_gather<Acc, T, IndexT, KH, KW, kMask>(p, t, input, offset, mask, i, columns);
}

// float accumulation: at least 5 blocks of 256 per SM, so <= 48 registers (without it the 64-bit-index 1x1
// variants took 59-64). double: the plain 256-thread bound; with int64 indices deform_conv2d_gather_kernel_wide
// asks for 4 blocks per SM (<= 64 registers, no spill).
template <typename T, typename IndexT, int KH, int KW, bool kMask>
__global__ void __launch_bounds__(kCudaThreads, sizeof(typename AccType<T>::type) == 4 ? 5 : 1)
    deform_conv2d_gather_kernel(DeformConv2dParams p, DcnTile t, const T* __restrict__ input,
                                const T* __restrict__ offset, const T* __restrict__ mask, T* __restrict__ columns) {
  gather_grid<T, IndexT, KH, KW, kMask>(p, t, input, offset, mask, columns);
}

template <typename T, typename IndexT, int KH, int KW, bool kMask>
__global__ void __launch_bounds__(kCudaThreads, 4)
    deform_conv2d_gather_kernel_wide(DeformConv2dParams p, DcnTile t, const T* __restrict__ input,
                                     const T* __restrict__ offset, const T* __restrict__ mask,
                                     T* __restrict__ columns) {
  gather_grid<T, IndexT, KH, KW, kMask>(p, t, input, offset, mask, columns);
}

// blockIdx.y: output channel (strided), blockIdx.z: image of the tile, x: positions.
template <typename T>
__global__ void deform_conv2d_bias_kernel(DeformConv2dParams p, DcnTile t, const T* __restrict__ bias,
                                          T* __restrict__ output) {
  for (int64_t co = blockIdx.y; co < p.out_channels; co += gridDim.y)
    for (int64_t pl = blockIdx.x * blockDim.x + threadIdx.x; pl < t.pt; pl += int64_t(blockDim.x) * gridDim.x)
      deform_conv2d_bias_fill(p, t, bias, blockIdx.z, co, pl, output);
}

// The slices of a point are t.slices adjacent lanes (a power of two <= 32 dividing the block); every lane of
// a block runs the same iterations (inactive ones contribute zeros), so the shuffles see whole warps.
// grad_input null: the offset/mask gradients only (deform_conv2d_point_grad_kernel).
template <typename T, typename IndexT, int KH, int KW, bool kMask, typename G>
__device__ __forceinline__ void sampling_backward_grid(const DeformConv2dParams& p, const DcnTile& t,
                                                       const T* __restrict__ input, const T* __restrict__ offset,
                                                       const T* __restrict__ mask,
                                                       const T* __restrict__ grad_columns, G* __restrict__ grad_input,
                                                       T* __restrict__ grad_offset, T* __restrict__ grad_mask) {
  using Acc = typename AccType<T>::type;
  const bool want = grad_offset != nullptr || grad_mask != nullptr;
  const int S = static_cast<int>(t.slices);
  for (uint32_t base = blockIdx.x * blockDim.x; base < t.threads; base += blockDim.x * gridDim.x) {
    const uint32_t i = base + threadIdx.x;
    const DcnThread w = dcn_backward_thread(t, i);  // decoded once: the body and the store share it
    DcnPointGrad<Acc> g{Acc(0), Acc(0), Acc(0), Acc(0)};
    if (i < t.threads)
      g = deform_conv2d_sampling_backward<Acc, T, IndexT, KH, KW, kMask>(p, t, input, offset, mask, grad_columns, w,
                                                                         grad_input, AtomicAdd());
    if (!want) continue;
    for (int o = S / 2; o > 0; o >>= 1) {  // the order of dcn_slice_tree
      g.gy += __shfl_down_sync(0xffffffffu, g.gy, o, S);
      g.gx += __shfl_down_sync(0xffffffffu, g.gx, o, S);
      g.gm += __shfl_down_sync(0xffffffffu, g.gm, o, S);
    }
    if (i < t.threads && (threadIdx.x & (S - 1)) == 0)
      deform_conv2d_point_grad_store<Acc, T, IndexT, KH, KW>(p, t, w, g, grad_offset, grad_mask);
  }
}

// float accumulation: at least 5 blocks of 256 per SM, so <= 48 registers (62.5 % occupancy); double: 1.
// grad_input is never null here.
template <typename T, typename IndexT, int KH, int KW, bool kMask, typename G>
__global__ void __launch_bounds__(kCudaThreads, sizeof(typename AccType<T>::type) == 4 ? 5 : 1)
    deform_conv2d_sampling_backward_kernel(DeformConv2dParams p, DcnTile t, const T* __restrict__ input,
                                           const T* __restrict__ offset, const T* __restrict__ mask,
                                           const T* __restrict__ grad_columns, G* __restrict__ grad_input,
                                           T* __restrict__ grad_offset, T* __restrict__ grad_mask) {
  __builtin_assume(grad_input != nullptr);
  sampling_backward_grid<T, IndexT, KH, KW, kMask, G>(p, t, input, offset, mask, grad_columns, grad_input,
                                                      grad_offset, grad_mask);
}

// The same without the scatter (deterministic mode, maps of one row or column, or no grad_input wanted).
template <typename T, typename IndexT, int KH, int KW, bool kMask, typename G>
__global__ void __launch_bounds__(kCudaThreads, sizeof(typename AccType<T>::type) == 4 ? 5 : 1)
    deform_conv2d_point_grad_kernel(DeformConv2dParams p, DcnTile t, const T* __restrict__ input,
                                    const T* __restrict__ offset, const T* __restrict__ mask,
                                    const T* __restrict__ grad_columns, T* __restrict__ grad_offset,
                                    T* __restrict__ grad_mask) {
  sampling_backward_grid<T, IndexT, KH, KW, kMask, G>(p, t, input, offset, mask, grad_columns, static_cast<G*>(nullptr),
                                                      grad_offset, grad_mask);
}

// Deterministic mode (deform_conv2d_sorted.h): the plan over the points of a one-slice tile, then (after the sort)
// the pixel gather.
template <typename T, typename IndexT, int KH, int KW, bool kMask>
__global__ void __launch_bounds__(kCudaThreads)
    deform_conv2d_plan_kernel(DeformConv2dParams p, DcnTile t, const T* __restrict__ offset,
                              const T* __restrict__ mask, uint32_t* __restrict__ keys, uint32_t* __restrict__ slots,
                              typename AccType<T>::type* __restrict__ weights) {
  using Acc = typename AccType<T>::type;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < t.threads; i += blockDim.x * gridDim.x)
    deform_conv2d_plan<Acc, T, IndexT, KH, KW, kMask>(p, t, offset, mask, i, keys, slots, weights);
}

template <typename T, typename G>
__global__ void __maxnreg__(64)  // the 256-thread bound left the bfloat16 variant at 32 registers, spilling (sm_80)
    deform_conv2d_pixel_gather_kernel(DeformConv2dParams p, DcnTile t, DcnPixelGrid pg,
                                      const uint32_t* __restrict__ keys, const uint32_t* __restrict__ slots,
                                      const typename AccType<T>::type* __restrict__ weights,
                                      const T* __restrict__ grad_columns, G* __restrict__ grad_input) {
  using Acc = typename AccType<T>::type;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < pg.threads; i += blockDim.x * gridDim.x)
    deform_conv2d_pixel_gather<Acc, T, G>(p, t, pg, keys, slots, weights, grad_columns, i, grad_input);
}

// CUB's scratch for sorting `entries` (key, slot) pairs with double buffers (a host-side size query).
size_t sort_scratch_bytes(int64_t entries) {
  size_t bytes = 0;
  cub::DoubleBuffer<uint32_t> keys(nullptr, nullptr), slots(nullptr, nullptr);
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, slots, static_cast<int>(entries), 0, 32);
  return align_up(bytes);
}

// acc[i] += v[i] (the float32 sum over images of 16-bit grad_weight GEMM results).
template <typename T, typename Acc>
__global__ void accumulate_kernel(const T* __restrict__ v, int64_t n, Acc* __restrict__ acc) {
  DCNKIT_CUDA_KERNEL_LOOP(i, n) { deform_conv2d_weight_accumulate<Acc, T>(v, i, acc); }
}

// grad_bias[co] = sum over n, pos of grad_output[n][co][pos]: one block of kDcnBiasGradThreads per channel, the
// lanes' partials added in a fixed tree order, in the accumulation type.
template <typename T>
__global__ void __launch_bounds__(kDcnBiasGradThreads)
    bias_grad_kernel(DeformConv2dParams p, const T* __restrict__ grad_output, T* __restrict__ grad_bias) {
  using Acc = typename AccType<T>::type;
  __shared__ Acc partial[kDcnBiasGradThreads];
  for (int64_t co = blockIdx.x; co < p.out_channels; co += gridDim.x) {
    partial[threadIdx.x] = deform_conv2d_bias_grad_partial<Acc, T>(p, grad_output, co, threadIdx.x, blockDim.x);
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
      deform_conv2d_bias_grad_tree<Acc>(partial, threadIdx.x, w);
      __syncthreads();
    }
    if (threadIdx.x == 0) grad_bias[co] = from_acc<T>(partial[0]);
    __syncthreads();
  }
}

// The executor of the schedule (deform_conv2d_kernels.h): kernels and GEMMs on the context's stream.
// grad_input and grad_weight go through their accumulation targets (GradAcc: in place for float and
// double, float32 workspace for 16-bit types); weight_tmp holds one image's grad_weight GEMM result for
// 16-bit types (null otherwise).
template <typename T>
struct CudaExec {
  using Acc = typename AccType<T>::type;
  const DeformConv2dParams& p;
  const CudaContext& ctx;
  cudaStream_t stream;
  const T *input, *offset, *mask, *bias, *grad_output;
  T *output, *grad_offset, *grad_bias, *grad_mask;
  GradAcc<T> grad_input, grad_weight;
  T* weight_tmp;

  bool index32;
  bool deterministic;
  // Deterministic mode: keys and slots (two buffers each), weights, CUB's scratch (null otherwise).
  uint32_t *keys0, *keys1, *slots0, *slots1;
  Acc* weights;
  void* sort_scratch;
  size_t sort_bytes;

  Status gather(const DcnTile& t, T* columns) {
    return dispatch_dcn_variant(p, index32, mask != nullptr, [&](auto it, auto kt, auto mt) {
      using I = typename decltype(it)::type;
      constexpr int KH = decltype(kt)::KH, KW = decltype(kt)::KW;
      constexpr bool M = decltype(mt)::value;
      if constexpr (sizeof(Acc) == 8 && sizeof(I) == 8)
        deform_conv2d_gather_kernel_wide<T, I, KH, KW, M>
            <<<cuda_blocks(t.threads), kCudaThreads, 0, stream>>>(p, t, input, offset, mask, columns);
      else
        deform_conv2d_gather_kernel<T, I, KH, KW, M>
            <<<cuda_blocks(t.threads), kCudaThreads, 0, stream>>>(p, t, input, offset, mask, columns);
      return cuda_launch_status("deform_conv2d_cuda: gather");
    });
  }
  Status bias_fill(const DcnTile& t) {
    const LaunchDims d = dcn_bias_launch(p, t);
    deform_conv2d_bias_kernel<T><<<launch_grid(d), d.block, 0, stream>>>(p, t, bias, output);
    return cuda_launch_status("deform_conv2d_cuda: bias");
  }
  Status sampling_backward(const DcnTile& t, const T* grad_columns, bool scatter) {
    Acc* gi = scatter ? grad_input.acc : nullptr;
    return dispatch_dcn_variant(p, index32, mask != nullptr, [&](auto it, auto kt, auto mt) {
      using I = typename decltype(it)::type;
      constexpr int KH = decltype(kt)::KH, KW = decltype(kt)::KW;
      constexpr bool M = decltype(mt)::value;
      if (gi != nullptr)
        deform_conv2d_sampling_backward_kernel<T, I, KH, KW, M, Acc><<<cuda_blocks(t.threads), kCudaThreads, 0, stream>>>(
            p, t, input, offset, mask, grad_columns, gi, grad_offset, grad_mask);
      else
        deform_conv2d_point_grad_kernel<T, I, KH, KW, M, Acc><<<cuda_blocks(t.threads), kCudaThreads, 0, stream>>>(
            p, t, input, offset, mask, grad_columns, grad_offset, grad_mask);
      return cuda_launch_status("deform_conv2d_cuda: sampling backward");
    });
  }
  Status input_grad_sorted(const DcnTile& plan, const DcnPixelGrid& pg, const T* grad_columns) {
    DCNKIT_RETURN_IF_ERROR(dispatch_dcn_variant(p, index32, mask != nullptr, [&](auto it, auto kt, auto mt) {
      using I = typename decltype(it)::type;
      deform_conv2d_plan_kernel<T, I, decltype(kt)::KH, decltype(kt)::KW, decltype(mt)::value>
          <<<cuda_blocks(plan.threads), kCudaThreads, 0, stream>>>(p, plan, offset, mask, keys0, slots0, weights);
      return cuda_launch_status("deform_conv2d_cuda: deterministic plan");
    }));
    cub::DoubleBuffer<uint32_t> keys(keys0, keys1), slots(slots0, slots1);
    size_t bytes = sort_bytes;
    DCNKIT_RETURN_IF_ERROR(cuda_status(cub::DeviceRadixSort::SortPairs(sort_scratch, bytes, keys, slots,
                                                                       static_cast<int>(pg.entries), 0, 32, stream),
                                       "deform_conv2d_cuda: deterministic sort"));
    deform_conv2d_pixel_gather_kernel<T, Acc><<<cuda_blocks(pg.threads), kCudaThreads, 0, stream>>>(
        p, plan, pg, keys.Current(), slots.Current(), weights, grad_columns, grad_input.acc);
    return cuda_launch_status("deform_conv2d_cuda: deterministic gather");
  }
  Status bias_grad() {
    const int64_t N = p.batch, P = p.out_spatial(), Cout = p.out_channels;
    if (Cout == 0) return Status::Ok();
    if (N * P == 0) return zero(grad_bias, Cout);
    const LaunchDims d = dcn_bias_grad_launch(p);
    bias_grad_kernel<T><<<launch_grid(d), d.block, 0, stream>>>(p, grad_output, grad_bias);
    return cuda_launch_status("deform_conv2d_cuda: bias grad");
  }
  Status zero(T* dst, int64_t count) {
    if (count <= 0) return Status::Ok();
    return cuda_status(cudaMemsetAsync(dst, 0, sizeof(T) * static_cast<size_t>(count), stream),
                       "deform_conv2d_cuda: memset");
  }
  // Batches of at most 65535 (gemm_in_batches: cuBLAS puts the batch on gridDim.z).
  Status gemm(const GemmArgs& ga) {
    return gemm_in_batches(ga, [&](const GemmArgs& g) { return ctx.run_gemm(g); });
  }
  // float, double: C += A x B^T in place. 16-bit types: the image's product into weight_tmp, added to the
  // float32 accumulator (a 16-bit running sum over images would round at every image).
  Status weight_gemm(const GemmArgs& ga) {
    if (weight_tmp == nullptr) return gemm(ga);
    DCNKIT_RETURN_IF_ERROR(gemm(weight_gemm_to(ga, weight_tmp)));
    const int64_t n = weight_elements(p);
    accumulate_kernel<T, Acc><<<cuda_blocks(n), kCudaThreads, 0, stream>>>(weight_tmp, n, grad_weight.acc);
    return cuda_launch_status("deform_conv2d_cuda: grad_weight sum");
  }
};

template <typename T>
Status forward_impl(const DeformConv2dParams& p, const T* input, const T* offset, const T* weight,
                    const T* bias, const T* mask, T* output, void* workspace, const CudaContext& ctx) {
  const DcnTiling tl = deform_conv2d_cuda_tiling(p, dtype_enum<T>());
  CudaExec<T> ex{p, ctx, static_cast<cudaStream_t>(ctx.stream), input, offset, mask, bias, nullptr,
                 output, nullptr, nullptr, nullptr, GradAcc<T>{}, GradAcc<T>{}, nullptr,
                 deform_conv2d_index32(p, tl), false, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0};
  return deform_conv2d_forward_schedule<T>(p, dtype_enum<T>(), tl, weight, bias != nullptr, output,
                                           static_cast<T*>(workspace), ex);
}

template <typename T>
Status backward_impl(const DeformConv2dParams& p, const T* grad_output, const T* input, const T* offset,
                     const T* weight, const T* mask, T* grad_input, T* grad_offset, T* grad_weight,
                     T* grad_bias, T* grad_mask, void* workspace, const CudaContext& ctx) {
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  using Acc = typename AccType<T>::type;
  // Workspace: columns, then (16-bit types) the float32 accumulators and weight_tmp, then the deterministic
  // mode's plan (keys, keys, slots, slots, weights) and CUB's scratch (deform_conv2d_cuda_workspace_bytes).
  char* extra = static_cast<char*>(workspace) + column_bytes(p, dtype_enum<T>());
  const GradAcc<T> gin = grad_acc(grad_input, p.batch * p.in_channels * p.height * p.width, &extra);
  const GradAcc<T> gw = grad_acc(grad_weight, weight_elements(p), &extra);
  constexpr bool in_place = std::is_same<Acc, T>::value;
  T* weight_tmp = (!in_place && grad_weight != nullptr) ? reinterpret_cast<T*>(extra) : nullptr;
  if (!in_place) extra += align_up(static_cast<size_t>(weight_elements(p)) * sizeof(T));
  const DcnTiling tl = deform_conv2d_cuda_tiling(p, dtype_enum<T>());
  // The sorted path's plan only where it runs (deform_conv2d_sorted_grad_input; deform_conv2d_cuda_workspace_bytes).
  const bool sorted = grad_input != nullptr && deform_conv2d_sorted_grad_input(p, ctx.deterministic);
  const size_t entries = sorted ? static_cast<size_t>(deform_conv2d_plan_entries(p, tl)) : 0;
  uint32_t* plan_u32[4] = {nullptr, nullptr, nullptr, nullptr};
  Acc* weights = nullptr;
  if (sorted) {
    for (auto& q : plan_u32) {
      q = reinterpret_cast<uint32_t*>(extra);
      extra += align_up(entries * sizeof(uint32_t));
    }
    weights = reinterpret_cast<Acc*>(extra);
    extra += align_up(entries * sizeof(Acc));
  }
  CudaExec<T> ex{p, ctx, stream, input, offset, mask, nullptr, grad_output, nullptr, grad_offset, grad_bias,
                 mask ? grad_mask : nullptr, gin, gw, weight_tmp, deform_conv2d_index32(p, tl), ctx.deterministic,
                 plan_u32[0], plan_u32[1], plan_u32[2], plan_u32[3], weights, sorted ? extra : nullptr,
                 sorted ? sort_scratch_bytes(static_cast<int64_t>(entries)) : 0};
  // In place (float, double) the schedule zeroes grad_input / grad_weight itself; the float32
  // accumulators of 16-bit types are zeroed here and rounded into the gradients after the schedule.
  if (!in_place) {
    DCNKIT_RETURN_IF_ERROR(grad_acc_zero(gin, stream, "deform_conv2d_cuda: memset"));
    DCNKIT_RETURN_IF_ERROR(grad_acc_zero(gw, stream, "deform_conv2d_cuda: memset"));
  }
  DCNKIT_RETURN_IF_ERROR(deform_conv2d_backward_schedule<T>(
      p, dtype_enum<T>(), tl, grad_output, weight, mask != nullptr, grad_input,
      grad_offset, grad_weight, grad_bias, grad_mask, static_cast<T*>(workspace), ex));
  DCNKIT_RETURN_IF_ERROR(grad_acc_store(gin, stream, "deform_conv2d_cuda: grad_input store"));
  return grad_acc_store(gw, stream, "deform_conv2d_cuda: grad_weight store");
}

}  // namespace

size_t deform_conv2d_forward_workspace_cuda(const DeformConv2dParams& p, DType dtype) {
  return deform_conv2d_cuda_workspace_bytes(p, dtype, false);
}

size_t deform_conv2d_backward_workspace_cuda(const DeformConv2dParams& p, DType dtype, bool deterministic) {
  const size_t sort = deform_conv2d_sorted_grad_input(p, deterministic)
                          ? sort_scratch_bytes(deform_conv2d_plan_entries(p, deform_conv2d_cuda_tiling(p, dtype)))
                          : 0;
  return deform_conv2d_cuda_workspace_bytes(p, dtype, true, deterministic) + sort;
}

size_t deform_conv2d_forward_workspace_cuda_bound(const DeformConv2dParams& max_params, DType dtype) {
  // A tile holds at most kDcnTileBytes of columns, or one row of positions' columns when a single position
  // is larger, and never more than the whole problem: monotone in every dim.
  const DeformConv2dParams& p = max_params;
  const int64_t row = std::max<int64_t>(1, p.in_channels * p.kernel_size()) * static_cast<int64_t>(dtype_size(dtype));
  const int64_t all = std::max<int64_t>(1, p.batch) * std::max<int64_t>(1, p.out_spatial()) * row;
  return align_up(static_cast<size_t>(std::min<int64_t>(all, std::max<int64_t>(row, kDcnTileBytes))));
}

Status deform_conv2d_forward_cuda(const DeformConv2dParams& p, DType dtype, const void* input,
                                  const void* offset, const void* weight, const void* bias,
                                  const void* mask, void* output, void* workspace,
                                  const CudaContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("deform_conv2d_forward_cuda"));
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    return forward_impl<T>(p, static_cast<const T*>(input), static_cast<const T*>(offset),
                           static_cast<const T*>(weight), static_cast<const T*>(bias),
                           static_cast<const T*>(mask), static_cast<T*>(output), workspace, ctx);
  });
}

Status deform_conv2d_backward_cuda(const DeformConv2dParams& p, DType dtype, const void* grad_output,
                                   const void* input, const void* offset, const void* weight,
                                   const void* mask, void* grad_input, void* grad_offset,
                                   void* grad_weight, void* grad_bias, void* grad_mask,
                                   void* workspace, const CudaContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("deform_conv2d_backward_cuda"));
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    return backward_impl<T>(p, static_cast<const T*>(grad_output), static_cast<const T*>(input),
                            static_cast<const T*>(offset), static_cast<const T*>(weight),
                            static_cast<const T*>(mask), static_cast<T*>(grad_input),
                            static_cast<T*>(grad_offset), static_cast<T*>(grad_weight),
                            static_cast<T*>(grad_bias), static_cast<T*>(grad_mask), workspace, ctx);
  });
}

}  // namespace dcnkit
