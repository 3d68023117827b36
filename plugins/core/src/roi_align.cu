// RoIAlign CUDA launchers: block kernels over the plan / visit functions of roi_plan.h.
// float32, float64, float16, bfloat16, forward and backward (the accumulation type follows the data; 16-bit
// gradients accumulate in a float32 workspace buffer). A RoI whose batch index is outside [0, N) gives zeros.
#include <cub/device/device_radix_sort.cuh>

#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/roi_align_sorted.h"
#include "dcnkit/roi_plan_cuda.cuh"

namespace dcnkit {
namespace {

// One block per (RoI, group of kRoIPlanChannels channels) = (blockIdx.x, blockIdx.y): thread 0 computes the
// RoI's head into shared memory (and raises the batch-index assert where the params ask), then the block plans
// (plan kernels) or samples on the fly (visit kernels) and loops over its (channel, bin) pairs. The head's
// stride selects the RoIs a kernel serves: with an adaptive grid both kernels run, and each leaves the other's
// RoIs alone (roi_plan.h).
template <typename T, typename Acc, bool kMax>
__global__ void __launch_bounds__(kCudaThreads)
    roi_align_plan_forward_kernel(RoIAlignParams p, const T* input, const T* rois, T* output) {
  __shared__ RoIPlanHead<Acc> head;
  roi_block_head<Acc>([&](int64_t k) { return roi_plan_head<Acc>(p, rois, k); }, rois + blockIdx.x * 5, p.batch,
                      p.assert_batch_index, &head);
  if (head.stride == 0) return;  // the visit kernel's RoI
  RoIPlanEntry<Acc>* plan = roi_plan_smem<Acc>();
  roi_plan_fill<Acc>(p, head, threadIdx.x, blockDim.x, plan);
  __syncthreads();
  const int64_t g = blockIdx.y;
  roi_plan_forward_items<Acc, T>(p, head, plan, input, blockIdx.x, g * kRoIPlanChannels,
                                 roi_group_channels(p.channels, g), threadIdx.x, blockDim.x, output, kMax);
}

// The double instantiation may take all the registers a 256-thread block leaves (minimum 1 block per SM): with
// ptxas's default budget its bounded visit spilled its loop-invariant box to the stack; the others keep the default.
template <typename T, typename Acc>
__global__ void __launch_bounds__(kCudaThreads, sizeof(Acc) == 8 ? 1 : 0)
    roi_align_visit_forward_kernel(RoIAlignParams p, const T* input, const T* rois, T* output) {
  __shared__ RoIPlanHead<Acc> head;
  roi_block_head<Acc>([&](int64_t k) { return roi_plan_head<Acc>(p, rois, k); }, rois + blockIdx.x * 5, p.batch,
                      p.assert_batch_index, &head);
  if (head.stride != 0) return;  // the plan kernel's RoI
  const int64_t g = blockIdx.y;
  roi_visit_forward_items<Acc, T>(p, head, p.height, p.width, input, blockIdx.x, g * kRoIPlanChannels,
                                  roi_group_channels(p.channels, g), threadIdx.x, blockDim.x, output);
}

// Backward: the same blocks, scattering with atomicAdd into grad_input's accumulation buffer (type Acc).
template <typename Acc>
struct RoIAtomicAt {
  Acc* base;
  __device__ __forceinline__ RoIAtomicAdd<Acc> operator()(int64_t offset) const { return {base + offset}; }
};

template <typename T, typename Acc, bool kMax>
__global__ void __launch_bounds__(kCudaThreads)
    roi_align_plan_backward_kernel(RoIAlignParams p, const T* grad_output, const T* input, const T* rois,
                                   Acc* grad_input) {
  __shared__ RoIPlanHead<Acc> head;
  roi_block_head<Acc>([&](int64_t k) { return roi_plan_head<Acc>(p, rois, k); }, rois + blockIdx.x * 5, p.batch,
                      p.assert_batch_index, &head);
  if (head.stride == 0) return;
  RoIPlanEntry<Acc>* plan = roi_plan_smem<Acc>();
  roi_plan_fill<Acc>(p, head, threadIdx.x, blockDim.x, plan);
  __syncthreads();
  const int64_t g = blockIdx.y;
  roi_plan_backward_items<Acc, T>(p, head, plan, grad_output, input, blockIdx.x, g * kRoIPlanChannels,
                                  roi_group_channels(p.channels, g), threadIdx.x, blockDim.x,
                                  RoIAtomicAt<Acc>{grad_input}, kMax);
}

template <typename T, typename Acc>
__global__ void __launch_bounds__(kCudaThreads)
    roi_align_visit_backward_kernel(RoIAlignParams p, const T* grad_output, const T* input, const T* rois,
                                    Acc* grad_input) {
  __shared__ RoIPlanHead<Acc> head;
  roi_block_head<Acc>([&](int64_t k) { return roi_plan_head<Acc>(p, rois, k); }, rois + blockIdx.x * 5, p.batch,
                      p.assert_batch_index, &head);
  if (head.stride != 0) return;
  const int64_t g = blockIdx.y;
  roi_visit_backward_items<Acc, T>(p, head, p.height, p.width, grad_output, input, blockIdx.x, g * kRoIPlanChannels,
                                   roi_group_channels(p.channels, g), threadIdx.x, blockDim.x,
                                   RoIAtomicAt<Acc>{grad_input});
}

// Deterministic mode (roi_align_sorted.h): the plan (thread i: entry i % E of RoI i / E), the arg-max (max mode),
// then (after the sort) the pixel gather, writing each grad_input element once.
__device__ __noinline__ void roi_align_unplanned_assert_fail() {
  __assert_fail("roi_align deterministic backward: an adaptive sampling grid too large for a plan has no "
                "deterministic path (use an explicit sampling_ratio)", __FILE__, __LINE__, "roi_align_sorted_plan");
}

template <typename T>
__global__ void __launch_bounds__(kCudaThreads)
    roi_align_sorted_plan_kernel(RoIAlignParams p, const T* __restrict__ rois, uint32_t E, uint32_t entries,
                                 uint32_t* __restrict__ keys, uint32_t* __restrict__ slots,
                                 typename AccType<T>::type* __restrict__ weights, uint32_t* __restrict__ items) {
  using Acc = typename AccType<T>::type;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < entries; i += blockDim.x * gridDim.x) {
    const uint32_t k = i / E, e = i - k * E;
    if (!roi_align_sorted_plan<Acc, T>(p, rois, E, k, e, keys, slots, weights, items) && e == 0)
      roi_align_unplanned_assert_fail();
  }
}

template <typename T>
__global__ void __launch_bounds__(kCudaThreads)
    roi_align_sorted_argmax_kernel(RoIAlignParams p, const T* __restrict__ input, const T* __restrict__ rois,
                                   uint32_t n, int32_t* __restrict__ argmax) {
  using Acc = typename AccType<T>::type;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
    roi_align_sorted_argmax<Acc, T>(p, input, rois, i, argmax);
}

template <typename T>
__global__ void __launch_bounds__(kCudaThreads)
    roi_align_sorted_gather_kernel(RoIAlignParams p, uint32_t E, uint32_t n, const uint32_t* __restrict__ keys,
                                   const uint32_t* __restrict__ slots,
                                   const typename AccType<T>::type* __restrict__ weights,
                                   const uint32_t* __restrict__ items, const int32_t* __restrict__ argmax,
                                   const T* __restrict__ grad_output, uint32_t total,
                                   typename AccType<T>::type* __restrict__ grad_input) {
  using Acc = typename AccType<T>::type;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += blockDim.x * gridDim.x)
    grad_input[i] = roi_align_sorted_gather<Acc, T>(p, E, n, keys, slots, weights, items, argmax, grad_output, i);
}

// The deterministic mode's buffers, carved from the workspace after grad_input's accumulator (base null: sizes
// only): keys and slots (two each, CUB's double buffers), items, weights (the accumulation type), the arg-max
// (max mode), CUB's scratch. Returns the bytes.
struct RoISortedBuffers {
  uint32_t *keys0, *keys1, *slots0, *slots1, *items;
  void* weights;
  int32_t* argmax;
  void* scratch;
  size_t scratch_bytes;
  uint32_t entries_per_roi, slots_count;
};

size_t roi_sorted_buffers(const RoIAlignParams& p, DType dtype, char* base, RoISortedBuffers* b) {
  const bool wide = dtype == DType::kFloat64;
  const int64_t E = wide ? roi_align_sorted_entries<double>(p) : roi_align_sorted_entries<float>(p);
  const int64_t n = 4 * E * p.num_rois;
  b->entries_per_roi = static_cast<uint32_t>(E);
  b->slots_count = static_cast<uint32_t>(n);
  size_t at = 0;
  auto take = [&](size_t bytes) {
    char* ptr = base == nullptr ? nullptr : base + at;
    at += align_up(bytes);
    return ptr;
  };
  const size_t u = sizeof(uint32_t) * static_cast<size_t>(n);
  b->keys0 = reinterpret_cast<uint32_t*>(take(u));
  b->keys1 = reinterpret_cast<uint32_t*>(take(u));
  b->slots0 = reinterpret_cast<uint32_t*>(take(u));
  b->slots1 = reinterpret_cast<uint32_t*>(take(u));
  b->items = reinterpret_cast<uint32_t*>(take(u));
  b->weights = take((wide ? 8 : 4) * static_cast<size_t>(n));
  const int64_t am = p.attrs.mode == PoolMode::kMax ? p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w : 0;
  b->argmax = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * static_cast<size_t>(am)));
  b->scratch_bytes = 0;
  cub::DoubleBuffer<uint32_t> keys(nullptr, nullptr), slots(nullptr, nullptr);
  cub::DeviceRadixSort::SortPairs(nullptr, b->scratch_bytes, keys, slots, static_cast<int>(n), 0, 32);
  b->scratch = take(b->scratch_bytes);
  return at;
}

int64_t output_elements(const RoIAlignParams& p) {
  return p.num_rois * p.channels * p.attrs.pooled_h * p.attrs.pooled_w;
}

int64_t input_elements(const RoIAlignParams& p) { return p.batch * p.channels * p.height * p.width; }

}  // namespace

size_t roi_align_workspace_cuda(const RoIAlignParams&) { return 0; }

size_t roi_align_backward_workspace_cuda(const RoIAlignParams& p, DType dtype, bool deterministic) {
  size_t sorted = 0;
  if (deterministic && roi_align_deterministic_supported(p, dtype)) {
    RoISortedBuffers b;
    sorted = roi_sorted_buffers(p, dtype, nullptr, &b);
  }
  return grad_acc_bytes(dtype, input_elements(p)) + sorted;
}

Status roi_align_forward_cuda(const RoIAlignParams& p, DType dtype, const void* input,
                              const void* rois, void* output, void* /*workspace*/,
                              const CudaContext& ctx) {
  if (output_elements(p) == 0) return Status::Ok();
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using Acc = typename AccType<T>::type;
    const T *x = static_cast<const T*>(input), *r = static_cast<const T*>(rois);
    T* y = static_cast<T*>(output);
    const dim3 grid = roi_block_grid(p.num_rois, p.channels);
    return roi_block_launch<Acc>(
        "roi_align_forward_cuda", p.num_rois, p.channels, p.attrs.sampling_ratio, p.attrs.pooled_h * p.attrs.pooled_w,
        p.height * p.width, p.attrs.mode == PoolMode::kMax,
        [&](auto max_mode, size_t smem) {
          roi_align_plan_forward_kernel<T, Acc, decltype(max_mode)::value><<<grid, kCudaThreads, smem, s>>>(p, x, r, y);
        },
        [&] { roi_align_visit_forward_kernel<T, Acc><<<grid, kCudaThreads, 0, s>>>(p, x, r, y); });
  });
}

Status roi_align_backward_cuda(const RoIAlignParams& p, DType dtype, const void* grad_output,
                               const void* input, const void* rois, void* grad_input,
                               void* workspace, const CudaContext& ctx) {
  const int64_t n = output_elements(p);
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using Acc = typename AccType<T>::type;
    char* ws = static_cast<char*>(workspace);
    const GradAcc<T> gin = grad_acc(static_cast<T*>(grad_input), input_elements(p), &ws);
    DCNKIT_RETURN_IF_ERROR(grad_acc_zero(gin, s, "roi_align_backward_cuda: memset"));
    // Sizes without a deterministic path take the atomic one (the torch op has raised torch's error, or warned).
    if (ctx.deterministic && n > 0 && roi_align_deterministic_supported(p, dtype)) {
      RoISortedBuffers b;
      roi_sorted_buffers(p, dtype, ws, &b);
      const T *go = static_cast<const T*>(grad_output), *x = static_cast<const T*>(input);
      const T* r = static_cast<const T*>(rois);
      Acc* w = static_cast<Acc*>(b.weights);
      const uint32_t entries = b.entries_per_roi * static_cast<uint32_t>(p.num_rois);
      roi_align_sorted_plan_kernel<T><<<cuda_blocks(entries), kCudaThreads, 0, s>>>(
          p, r, b.entries_per_roi, entries, b.keys0, b.slots0, w, b.items);
      DCNKIT_RETURN_IF_ERROR(cuda_launch_status("roi_align_backward_cuda: deterministic plan"));
      const bool max_mode = p.attrs.mode == PoolMode::kMax;
      if (max_mode) {
        roi_align_sorted_argmax_kernel<T><<<cuda_blocks(n), kCudaThreads, 0, s>>>(p, x, r, static_cast<uint32_t>(n),
                                                                                 b.argmax);
        DCNKIT_RETURN_IF_ERROR(cuda_launch_status("roi_align_backward_cuda: deterministic arg-max"));
      }
      cub::DoubleBuffer<uint32_t> keys(b.keys0, b.keys1), slots(b.slots0, b.slots1);
      size_t bytes = b.scratch_bytes;
      DCNKIT_RETURN_IF_ERROR(cuda_status(cub::DeviceRadixSort::SortPairs(b.scratch, bytes, keys, slots,
                                                                         static_cast<int>(b.slots_count), 0, 32, s),
                                         "roi_align_backward_cuda: deterministic sort"));
      const int64_t total = input_elements(p);
      roi_align_sorted_gather_kernel<T><<<cuda_blocks(total), kCudaThreads, 0, s>>>(
          p, b.entries_per_roi, b.slots_count, keys.Current(), slots.Current(), w, b.items,
          max_mode ? b.argmax : nullptr, go, static_cast<uint32_t>(total), gin.acc);
      DCNKIT_RETURN_IF_ERROR(cuda_launch_status("roi_align_backward_cuda: deterministic gather"));
    } else if (n > 0) {
      const T *go = static_cast<const T*>(grad_output), *x = static_cast<const T*>(input);
      const T* r = static_cast<const T*>(rois);
      const dim3 grid = roi_block_grid(p.num_rois, p.channels);
      DCNKIT_RETURN_IF_ERROR(roi_block_launch<Acc>(
          "roi_align_backward_cuda", p.num_rois, p.channels, p.attrs.sampling_ratio,
          p.attrs.pooled_h * p.attrs.pooled_w, p.height * p.width, p.attrs.mode == PoolMode::kMax,
          [&](auto max_mode, size_t smem) {
            roi_align_plan_backward_kernel<T, Acc, decltype(max_mode)::value>
                <<<grid, kCudaThreads, smem, s>>>(p, go, x, r, gin.acc);
          },
          [&] { roi_align_visit_backward_kernel<T, Acc><<<grid, kCudaThreads, 0, s>>>(p, go, x, r, gin.acc); }));
    }
    return grad_acc_store(gin, s, "roi_align_backward_cuda: store");
  });
}

}  // namespace dcnkit
