// The torch ops' report of a bad RoI batch index on CUDA: a device-side assert raised by a small kernel over the RoIs
// (the launchers give zeros for such a RoI and never synchronise; torch reports a bad index the same way).
#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/roi_batch_assert.h"
#include "dcnkit/roi_kernels.h"

namespace dcnkit {
namespace {

// One thread per RoI (element_launch): the assert's call is in no loop.
template <typename R>
__global__ void roi_batch_assert_kernel(const R* rois, int64_t num_rois, int64_t stride, int64_t batch) {
  using Acc = typename AccType<R>::type;
  DCNKIT_CUDA_ELEMENT(k, num_rois);
  int64_t b = 0;
  if (!roi_batch_index<Acc>(rois + k * stride, batch, &b)) roi_batch_index_assert_fail();
}

}  // namespace

Status roi_assert_batch_indices_cuda(const char* op, const void* rois, DType rois_dtype, int64_t num_rois,
                                     int64_t stride, int64_t batch, const CudaContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("roi_assert_batch_indices_cuda"));
  if (num_rois <= 0) return Status::Ok();
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_dtype(rois_dtype, [&](auto r) -> Status {
    using R = decltype(r);
    const LaunchDims d = element_launch("roi_batch_assert_kernel", num_rois);
    DCNKIT_RETURN_IF_ERROR(check_launch(d));
    roi_batch_assert_kernel<R><<<launch_grid(d), d.block, 0, stream>>>(static_cast<const R*>(rois), num_rois, stride,
                                                                       batch);
    return cuda_launch_status(op);
  });
}

}  // namespace dcnkit
