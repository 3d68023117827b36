// The torch ops' report of a bad RoI batch index on CUDA (roi_batch_assert.cu).
#pragma once

#include <cstdint>

#include "dcnkit/common.h"
#include "dcnkit/context.h"

namespace dcnkit {

// A device-side assert when a RoI's batch index (rois[k * stride]) is outside [0, batch) or NaN: how the torch ops
// report it on CUDA (the kernels give zeros for such a RoI). One small kernel, no synchronisation.
Status roi_assert_batch_indices_cuda(const char* op, const void* rois, DType rois_dtype, int64_t num_rois,
                                     int64_t stride, int64_t batch, const CudaContext& ctx);

}  // namespace dcnkit
