// CUDA's launch limits, on the host (this header compiles without the CUDA toolkit). A launcher describes each
// launch as a LaunchDims built by one host function that the CUDA launcher and the CPU schedule drivers share
// (the DCN schedule's, the RoI block schedule's, the deterministic RoI gather's); the CUDA launcher launches what it
// says, and the CPU drivers (DCNKIT_DCN_CPU_PATH / DCNKIT_ROI_CPU_PATH = cuda-schedule...) check every launch they
// emulate with check_launch, so a CPU test fails where a GPU would refuse the launch.
#pragma once

#include <string>

#include "dcnkit/common.h"

namespace dcnkit {

constexpr int64_t kCudaMaxGridX = 0x7fffffff;      // gridDim.x
constexpr int64_t kCudaMaxGridYZ = 65535;          // gridDim.y and gridDim.z
constexpr int64_t kCudaMaxBlockThreads = 1024;     // threads per block
constexpr int64_t kCudaDefaultSmemBytes = 48 * 1024;  // dynamic + static shared memory without an opt-in
// With cudaFuncAttributeMaxDynamicSharedMemorySize: sm_75's most (sm_80 163 KiB, sm_90 227 KiB), the smallest
// of the architectures the kit builds for.
constexpr int64_t kCudaOptInSmemBytes = 64 * 1024;
// Batch count of a strided-batched GEMM: cuBLAS's batched kernels put the batch on gridDim.z, so the schedules keep it
// to 65535 (deform_conv2d_schedule.h splits longer batches).
constexpr int64_t kCudaMaxGemmBatch = 65535;
// Blocks of a 1-D grid-stride launch: one per 256 elements, at most this many (the loop strides over the rest).
constexpr int64_t kCudaMaxStrideBlocks = 65535 * 8;

struct LaunchDims {
  const char* kernel = "";
  int64_t grid[3] = {1, 1, 1};
  int64_t block = 256;
  int64_t smem = 0;          // dynamic shared memory bytes
  int64_t static_smem = 0;   // the kernel's static shared memory bytes (as the host knows them)
  bool smem_opt_in = false;  // the launcher raises the kernel's dynamic shared memory limit first
};

// Blocks of 256 threads for n elements of a grid-stride loop (at least 1, at most kCudaMaxStrideBlocks).
inline int64_t stride_blocks(int64_t n, int64_t threads = 256) {
  const int64_t b = (n + threads - 1) / threads;
  return b < 1 ? 1 : (b > kCudaMaxStrideBlocks ? kCudaMaxStrideBlocks : b);
}

// A 1-D grid-stride launch over n elements.
inline LaunchDims stride_launch(const char* kernel, int64_t n, int64_t threads = 256) {
  LaunchDims d;
  d.kernel = kernel;
  d.grid[0] = stride_blocks(n, threads);
  d.block = threads;
  return d;
}

// A 1-D launch of one thread per element of [0, n): ceil(n / threads) blocks and no stride loop, so that an element's
// work (a RoI's head: divisions, conversions) is in no loop of the kernel (the SASS rules, docs/performance.md).
// check_launch refuses more than 2^31 - 1 blocks (n beyond about 5.5e11 elements of 256 threads).
inline LaunchDims element_launch(const char* kernel, int64_t n, int64_t threads = 256) {
  LaunchDims d;
  d.kernel = kernel;
  const int64_t b = n / threads + (n % threads != 0 ? 1 : 0);
  d.grid[0] = b < 1 ? 1 : b;
  d.block = threads;
  return d;
}

// The RoI kernels index one axis of a map in 32 bits (AxisIndex, bilinear.h): fewer than 2^31 rows and columns.
inline Status check_cuda_map_axes(const char* op, const std::string& arg, int64_t height, int64_t width) {
  const int64_t lim = int64_t(1) << 31;
  if (height >= lim || width >= lim) {
    return arg_error(op, arg, "fewer than 2^31 rows and columns on CUDA",
                     std::to_string(height) + " x " + std::to_string(width));
  }
  return Status::Ok();
}

// Whether CUDA accepts the launch: an error naming the kernel, the limit and the value otherwise.
inline Status check_launch(const LaunchDims& d) {
  const std::string k = std::string("CUDA launch of ") + d.kernel;
  const int64_t lim[3] = {kCudaMaxGridX, kCudaMaxGridYZ, kCudaMaxGridYZ};
  const char* axis[3] = {"gridDim.x", "gridDim.y", "gridDim.z"};
  for (int i = 0; i < 3; ++i) {
    if (d.grid[i] < 1 || d.grid[i] > lim[i]) {
      return Status::Internal(k + ": " + axis[i] + ": expected a value in [1, " + std::to_string(lim[i]) + "], got " +
                              std::to_string(d.grid[i]));
    }
  }
  if (d.block < 1 || d.block > kCudaMaxBlockThreads) {
    return Status::Internal(k + ": blockDim: expected 1 to " + std::to_string(kCudaMaxBlockThreads) +
                            " threads, got " + std::to_string(d.block));
  }
  const int64_t smem_lim = d.smem_opt_in ? kCudaOptInSmemBytes : kCudaDefaultSmemBytes;
  if (d.smem < 0 || d.static_smem < 0 || d.smem + d.static_smem > smem_lim) {
    return Status::Internal(k + ": shared memory: expected at most " + std::to_string(smem_lim) + " bytes" +
                            (d.smem_opt_in ? " (opted in)" : " (no opt-in)") + ", got " +
                            std::to_string(d.smem) + " dynamic + " + std::to_string(d.static_smem) + " static");
  }
  return Status::Ok();
}

// The batch count of a strided-batched GEMM.
inline Status check_gemm_batch(const char* where, int64_t batch) {
  if (batch < 0 || batch > kCudaMaxGemmBatch) {
    return Status::Internal(std::string(where) + ": GEMM batch count: expected at most " +
                            std::to_string(kCudaMaxGemmBatch) + ", got " + std::to_string(batch));
  }
  return Status::Ok();
}

}  // namespace dcnkit
