// MultiScaleDeformableAttention CUDA launchers: grid-stride kernels with one thread per (n, q, m, run of
// kMsdaForwardChunk / kMsdaBackwardChunk channels) over the per-thread functions of msda_kernels.h, which compute
// each sample's taps once per run. The level tables (spatial_shapes, level_start_index) are read on the device: a
// bad table (msda_levels_valid) gives zeros. float32, float64, float16, bfloat16; the
// accumulation type follows the data. Backward scatters with atomicAdd (16-bit gradients into float32
// workspace buffers, rounded once at the end). No synchronisation, no allocation.
#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/msda_kernels.h"

namespace dcnkit {
namespace {

template <typename T, typename Acc>
__global__ void msda_forward_kernel(MsdaParams p, const T* value, const int64_t* spatial_shapes,
                                    const int64_t* level_start_index, const T* sampling_locations,
                                    const T* attention_weights, T* output) {
  const int64_t total = msda_thread_count<kMsdaForwardChunk>(p);
  DCNKIT_CUDA_KERNEL_LOOP(i, total) {
    msda_forward_thread<Acc, T>(p, value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
                                output, i);
  }
}

template <typename T, typename Acc>
__global__ void msda_backward_kernel(MsdaParams p, const T* grad_output, const T* value,
                                     const int64_t* spatial_shapes, const int64_t* level_start_index,
                                     const T* sampling_locations, const T* attention_weights, Acc* grad_value,
                                     Acc* grad_locations, Acc* grad_weights) {
  const int64_t total = msda_thread_count<kMsdaBackwardChunk>(p);
  DCNKIT_CUDA_KERNEL_LOOP(i, total) {
    msda_backward_thread<Acc, T>(p, grad_output, value, spatial_shapes, level_start_index, sampling_locations,
                                 attention_weights, grad_value, grad_locations, grad_weights, i, AtomicAdd{});
  }
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

}  // namespace

size_t msda_backward_workspace_cuda(const MsdaParams& p, DType dtype) {
  return grad_acc_bytes(dtype, numel(p.value_shape())) + grad_acc_bytes(dtype, numel(p.locations_shape())) +
         grad_acc_bytes(dtype, numel(p.weights_shape()));
}

Status msda_forward_cuda(const MsdaParams& p, DType dtype, const void* value, const int64_t* spatial_shapes,
                         const int64_t* level_start_index, const void* sampling_locations,
                         const void* attention_weights, void* output, const CudaContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("msda_forward_cuda"));
  const int64_t n = msda_thread_count<kMsdaForwardChunk>(p);
  if (n == 0) return Status::Ok();
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    msda_forward_kernel<T, typename AccType<T>::type><<<cuda_blocks(n), kCudaThreads, 0, s>>>(
        p, static_cast<const T*>(value), spatial_shapes, level_start_index, static_cast<const T*>(sampling_locations),
        static_cast<const T*>(attention_weights), static_cast<T*>(output));
    return cuda_launch_status("msda_forward_cuda");
  });
}

Status msda_backward_cuda(const MsdaParams& p, DType dtype, const void* grad_output, const void* value,
                          const int64_t* spatial_shapes, const int64_t* level_start_index,
                          const void* sampling_locations, const void* attention_weights, void* grad_value,
                          void* grad_sampling_locations, void* grad_attention_weights, void* workspace,
                          const CudaContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("msda_backward_cuda"));
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using Acc = typename AccType<T>::type;
    const char* where = "msda_backward_cuda";
    char* ws = static_cast<char*>(workspace);
    const GradAcc<T> gv = grad_acc(static_cast<T*>(grad_value), numel(p.value_shape()), &ws);
    const GradAcc<T> gl = grad_acc(static_cast<T*>(grad_sampling_locations), numel(p.locations_shape()), &ws);
    const GradAcc<T> gw = grad_acc(static_cast<T*>(grad_attention_weights), numel(p.weights_shape()), &ws);
    DCNKIT_RETURN_IF_ERROR(grad_acc_zero(gv, s, where));
    DCNKIT_RETURN_IF_ERROR(grad_acc_zero(gl, s, where));
    DCNKIT_RETURN_IF_ERROR(grad_acc_zero(gw, s, where));
    const int64_t n = msda_thread_count<kMsdaBackwardChunk>(p);
    if (n > 0) {
      msda_backward_kernel<T, Acc><<<cuda_blocks(n), kCudaThreads, 0, s>>>(
          p, static_cast<const T*>(grad_output), static_cast<const T*>(value), spatial_shapes, level_start_index,
          static_cast<const T*>(sampling_locations), static_cast<const T*>(attention_weights), gv.acc, gl.acc,
          gw.acc);
      DCNKIT_RETURN_IF_ERROR(cuda_launch_status(where));
    }
    DCNKIT_RETURN_IF_ERROR(grad_acc_store(gv, s, where));
    DCNKIT_RETURN_IF_ERROR(grad_acc_store(gl, s, where));
    return grad_acc_store(gw, s, where);
  });
}

}  // namespace dcnkit
