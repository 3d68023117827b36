// MultiScaleDeformableAttention's level tables from int32 to int64 (see msda.h): one grid-stride kernel over
// the 3L entries of both tables (widened_level_entry, msda_kernels.h), writing them one after the other into the
// caller's workspace.
#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/msda.h"
#include "dcnkit/msda_kernels.h"

// glibc's assert handler, which CUDA implements on the device (declared here: <assert.h> does not under NDEBUG).
extern "C" __host__ __device__ void __assert_fail(const char*, const char*, unsigned int, const char*) noexcept;

namespace dcnkit {
namespace {

__global__ void widen_levels_kernel(int64_t num_levels, const int32_t* spatial_shapes,
                                    const int32_t* level_start_index, int64_t* out) {
  DCNKIT_CUDA_KERNEL_LOOP(i, 3 * num_levels) { out[i] = widened_level_entry(i, num_levels, spatial_shapes, level_start_index); }
}

__device__ __noinline__ void msda_levels_assert_fail() {
  __assert_fail("multi_scale_deformable_attn: spatial_shapes / level_start_index: expected every H, W >= 0, "
                "0 <= start, start + H*W <= S and sum of H*W equal to S (value's dim 1), got a table that breaks one "
                "of these", __FILE__, __LINE__, "msda_assert_levels");
}

// One thread: the rules of msda_levels_valid on the tables as the kernels read them.
__global__ void assert_levels_kernel(int64_t num_levels, int64_t num_values, const int64_t* spatial_shapes,
                                     const int64_t* level_start_index) {
  if (blockIdx.x == 0 && threadIdx.x == 0 &&
      !msda_levels_valid(spatial_shapes, level_start_index, num_levels, num_values)) {
    msda_levels_assert_fail();
  }
}

}  // namespace

Status msda_assert_levels_cuda(const MsdaParams& p, const int64_t* spatial_shapes, const int64_t* level_start_index,
                               const CudaContext& ctx) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("msda_assert_levels_cuda"));
  if (p.num_levels <= 0) return Status::Ok();
  assert_levels_kernel<<<1, 32, 0, static_cast<cudaStream_t>(ctx.stream)>>>(p.num_levels, p.num_values,
                                                                           spatial_shapes, level_start_index);
  return cuda_launch_status("msda_assert_levels_cuda");
}

size_t msda_int32_levels_workspace_cuda(const MsdaParams& p) {
  return p.num_levels > 0 ? static_cast<size_t>(3 * p.num_levels) * sizeof(int64_t) : 0;
}

Status msda_levels_to_int64_cuda(const MsdaParams& p, const int32_t* spatial_shapes, const int32_t* level_start_index,
                                 void* workspace, const CudaContext& ctx, const int64_t** spatial_shapes64,
                                 const int64_t** level_start_index64) {
  DCNKIT_RETURN_IF_ERROR(cuda_clear_stale_error("msda_levels_to_int64_cuda"));
  const char* where = "msda_levels_to_int64_cuda";
  if (p.num_levels <= 0) return Status::Invalid(std::string(where) + ": no levels");
  if (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % alignof(int64_t) != 0) {
    return Status::Invalid(std::string(where) + ": workspace: expected " +
                           std::to_string(msda_int32_levels_workspace_cuda(p)) + " bytes, 8-byte aligned");
  }
  auto* out = static_cast<int64_t*>(workspace);
  const int64_t n = 3 * p.num_levels;
  widen_levels_kernel<<<cuda_blocks(n), kCudaThreads, 0, static_cast<cudaStream_t>(ctx.stream)>>>(
      p.num_levels, spatial_shapes, level_start_index, out);
  DCNKIT_RETURN_IF_ERROR(cuda_launch_status(where));
  *spatial_shapes64 = out;
  *level_start_index64 = out + 2 * p.num_levels;
  return Status::Ok();
}

}  // namespace dcnkit
