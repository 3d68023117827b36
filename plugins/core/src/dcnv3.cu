// DCNv3 / DCNv4 CUDA launchers: grid-stride kernels with one thread per (n, ho, wo, group, run of kChunk channels)
// over the per-thread functions of dcnv3_kernels.h, which compute each kernel point's location, weight and taps
// once per run (the input is channels-last: neighbouring threads read neighbouring channels of the same pixels).
// float32, float64, float16, bfloat16; the accumulation type follows the data. Backward scatters with atomicAdd
// (16-bit gradients into float32 workspace buffers, rounded once at the end). No synchronisation, no allocation.
// Not yet run on a GPU.
#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/dcnv3_kernels.h"

namespace dcnkit {
namespace {

template <typename T, typename Acc>
__global__ void dcnv3_forward_kernel(Dcnv3Params p, const T* input, const T* offset, const T* mask, T* output) {
  const int64_t total = dcnv3_thread_count<kDcnv3ForwardChunk>(p);
  DCNKIT_CUDA_KERNEL_LOOP(i, total) { dcnv3_forward_thread<Acc, T>(p, input, offset, mask, output, i); }
}

template <typename T, typename Acc>
__global__ void dcnv3_backward_kernel(Dcnv3Params p, const T* grad_output, const T* input, const T* offset,
                                      const T* mask, Acc* grad_input, Acc* grad_offset, Acc* grad_mask) {
  const int64_t total = dcnv3_thread_count<kDcnv3BackwardChunk>(p);
  DCNKIT_CUDA_KERNEL_LOOP(i, total) {
    dcnv3_backward_thread<Acc, T>(p, grad_output, input, offset, mask, grad_input, grad_offset, grad_mask, i,
                                  AtomicAdd{});
  }
}

int64_t input_elements(const Dcnv3Params& p) { return p.batch * p.height * p.width * p.channels(); }
int64_t offset_elements(const Dcnv3Params& p) { return p.batch * p.out_h * p.out_w * p.offset_row; }
int64_t mask_elements(const Dcnv3Params& p) { return p.fused ? 0 : p.batch * p.out_h * p.out_w * p.mask_row; }

}  // namespace

size_t dcnv3_backward_workspace_cuda(const Dcnv3Params& p, DType dtype) {
  return grad_acc_bytes(dtype, input_elements(p)) + grad_acc_bytes(dtype, offset_elements(p)) +
         grad_acc_bytes(dtype, mask_elements(p));
}

Status dcnv3_forward_cuda(const Dcnv3Params& p, DType dtype, const void* input, const void* offset, const void* mask,
                          void* output, const CudaContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("dcnv3_forward_cuda"));
  const int64_t n = dcnv3_thread_count<kDcnv3ForwardChunk>(p);
  if (n == 0) return Status::Ok();
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    dcnv3_forward_kernel<T, typename AccType<T>::type><<<cuda_blocks(n), kCudaThreads, 0, s>>>(
        p, static_cast<const T*>(input), static_cast<const T*>(offset), static_cast<const T*>(mask),
        static_cast<T*>(output));
    return cuda_launch_status("dcnv3_forward_cuda");
  });
}

Status dcnv3_backward_cuda(const Dcnv3Params& p, DType dtype, const void* grad_output, const void* input,
                           const void* offset, const void* mask, void* grad_input, void* grad_offset, void* grad_mask,
                           void* workspace, const CudaContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("dcnv3_backward_cuda"));
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using Acc = typename AccType<T>::type;
    const char* where = "dcnv3_backward_cuda";
    char* ws = static_cast<char*>(workspace);
    const GradAcc<T> gi = grad_acc(static_cast<T*>(grad_input), input_elements(p), &ws);
    const GradAcc<T> go = grad_acc(static_cast<T*>(grad_offset), offset_elements(p), &ws);
    DCNKIT_RETURN_IF_ERROR(grad_acc_zero(gi, s, where));
    DCNKIT_RETURN_IF_ERROR(grad_acc_zero(go, s, where));
    GradAcc<T> gm = go;  // DCNv4: the weights' gradient is in the offset_mask gradient
    if (!p.fused) {
      gm = grad_acc(static_cast<T*>(grad_mask), mask_elements(p), &ws);
      DCNKIT_RETURN_IF_ERROR(grad_acc_zero(gm, s, where));
    }
    const int64_t n = dcnv3_thread_count<kDcnv3BackwardChunk>(p);
    if (n > 0) {
      dcnv3_backward_kernel<T, Acc><<<cuda_blocks(n), kCudaThreads, 0, s>>>(
          p, static_cast<const T*>(grad_output), static_cast<const T*>(input), static_cast<const T*>(offset),
          static_cast<const T*>(mask), gi.acc, go.acc, gm.acc);
      DCNKIT_RETURN_IF_ERROR(cuda_launch_status(where));
    }
    DCNKIT_RETURN_IF_ERROR(grad_acc_store(gi, s, where));
    if (!p.fused) DCNKIT_RETURN_IF_ERROR(grad_acc_store(gm, s, where));
    return grad_acc_store(go, s, where);
  });
}

}  // namespace dcnkit
