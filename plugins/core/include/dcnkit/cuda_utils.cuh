// CUDA helpers for the core launchers (included by .cu files only).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "dcnkit/bilinear.h"
#include "dcnkit/common.h"

namespace dcnkit {

// Grid-stride loop over [0, n).
#define DCNKIT_CUDA_KERNEL_LOOP(i, n)                                                      \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

constexpr int kCudaThreads = 256;

// Blocks for n elements, capped (the loop strides over the rest).
inline unsigned int cuda_blocks(int64_t n) {
  const int64_t b = (n + kCudaThreads - 1) / kCudaThreads;
  return static_cast<unsigned int>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

inline Status cuda_status(cudaError_t e, const char* where) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::DeviceError(std::string(where) + ": " + cudaGetErrorString(e));
}

// Status of the last kernel launch.
inline Status cuda_launch_status(const char* where) { return cuda_status(cudaGetLastError(), where); }

// Storage type <-> accumulation type on the device.
template <>
__host__ __device__ __forceinline__ float to_acc<float, __half>(const __half& v) {
  return __half2float(v);
}
template <>
__host__ __device__ __forceinline__ float to_acc<float, __nv_bfloat16>(const __nv_bfloat16& v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_acc(float v) {
  return static_cast<T>(v);
}
template <>
__device__ __forceinline__ __half from_acc<__half>(float v) {
  return __float2half(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}

// Accumulation type of a storage type.
template <typename T> struct AccType { using type = T; };
template <> struct AccType<__half> { using type = float; };
template <> struct AccType<__nv_bfloat16> { using type = float; };

// Calls f(T{}) with the storage type T of `dtype` (float, double, __half, __nv_bfloat16): the forward
// launchers' dispatch.
template <typename F>
Status dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(float{});
    case DType::kFloat64: return f(double{});
    case DType::kFloat16: return f(__half{});
    case DType::kBFloat16: return f(__nv_bfloat16{});
  }
  return Status::Internal("unknown dtype " + std::to_string(static_cast<int>(dtype)));
}

// The same for float32 and float64 only (the backward launchers: atomicAdd in the storage type);
// another dtype is an Invalid status naming `op`.
template <typename F>
Status dispatch_backward_dtype(const char* op, DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(float{});
    case DType::kFloat64: return f(double{});
    default: break;
  }
  return arg_error(op, "input", "dtype float32 or float64 (CUDA backward)", dtype_name(dtype));
}

// Data-dependent checks on the device (e.g. RoI batch indices): kernels set a flag in the workspace;
// the launcher reads it back after the kernel and turns it into an Invalid status.
struct DeviceErrorFlag {
  int* flag;  // in device memory, zeroed before the kernel
};

// Zeroes the flag (asynchronously, on `stream`).
Status error_flag_reset(DeviceErrorFlag f, cudaStream_t stream);
// Waits for `stream` and returns Invalid(message) when a kernel set the flag.
Status error_flag_check(DeviceErrorFlag f, cudaStream_t stream, const std::string& message);

}  // namespace dcnkit
