// CUDA helpers for the core launchers (included by .cu files only).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "dcnkit/bilinear.h"
#include "dcnkit/common.h"
#include "dcnkit/context.h"
#include "dcnkit/grad_adders.h"
#include "dcnkit/launch_limits.h"

namespace dcnkit {

// Grid-stride loop over [0, n).
#define DCNKIT_CUDA_KERNEL_LOOP(i, n)                                                      \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

constexpr int kCudaThreads = 256;

// Blocks of 256 threads per SM the sampling and RoI kernels are built for (their __launch_bounds__): ptxas then keeps
// them within 48 registers (65536 / (5 x 256) = 51, allocated in steps of 8), the SASS rules' budget
// (docs/performance.md).
#ifndef DCNKIT_ROI_MIN_BLOCKS
#define DCNKIT_ROI_MIN_BLOCKS 5
#endif
constexpr int kRoIMinBlocks = DCNKIT_ROI_MIN_BLOCKS;

// The element of this thread in a one-thread-per-element launch (element_launch); the kernel returns past n.
#define DCNKIT_CUDA_ELEMENT(i, n)                                                        \
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; \
  if (i >= (n)) return

// Blocks for n elements, capped (the loop strides over the rest): stride_blocks (launch_limits.h).
inline unsigned int cuda_blocks(int64_t n) { return static_cast<unsigned int>(stride_blocks(n, kCudaThreads)); }

// The grid and block of a LaunchDims (launch_limits.h; the CPU schedule drivers check the same LaunchDims).
inline dim3 launch_grid(const LaunchDims& d) {
  return dim3(static_cast<unsigned int>(d.grid[0]), static_cast<unsigned int>(d.grid[1]),
              static_cast<unsigned int>(d.grid[2]));
}

inline Status cuda_status(cudaError_t e, const char* where) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::DeviceError(std::string(where) + ": " + cudaGetErrorString(e));
}

// The errors of a kernel fault, which lose the context (every later call returns them): a kernel that already ran
// faulted. A launch never causes one itself (a launch fails with a bad configuration, no kernel image, too many
// resources: errors cudaGetLastError clears), and this op's kernels have not run when it launches, so such an error
// is reported as what it is, an earlier one, not under this op's name as if its launch had failed.
inline bool cuda_context_lost(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress: case cudaErrorLaunchTimeout: case cudaErrorAssert: case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction: case cudaErrorMisalignedAddress: case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc: case cudaErrorLaunchFailure:
      return true;
    default:
      return false;
  }
}
inline Status cuda_earlier_error(const char* where, cudaError_t e) {
  return Status::DeviceError(std::string(where) + ": the CUDA context failed before this op ran (an earlier "
                             "kernel's fault, not this op's): " + cudaGetErrorString(e));
}

// Every CUDA launcher calls this first, before its first launch, so that the status of its launches
// (cuda_launch_status) is its own: an error left pending by another layer (a launch nobody checked) is cleared here,
// not reported under this op's name; a lost context is reported as an earlier error. No synchronisation: it only
// reads the runtime's error state.
inline Status cuda_clear_stale_error(const char* where) {
  const cudaError_t e = cudaGetLastError();
  return cuda_context_lost(e) ? cuda_earlier_error(where, e) : Status::Ok();
}

// Status of the kernel launch just made (the launcher cleared any earlier error: cuda_clear_stale_error), and
// cleared, so that it is not reported again under another op's name; a lost context is an earlier error.
inline Status cuda_launch_status(const char* where) {
  const cudaError_t e = cudaGetLastError();
  return cuda_context_lost(e) ? cuda_earlier_error(where, e) : cuda_status(e, where);
}

// Storage type <-> accumulation type on the device.
template <>
__host__ __device__ __forceinline__ float to_acc<float, __half>(const __half& v) {
  return __half2float(v);
}
template <>
__host__ __device__ __forceinline__ float to_acc<float, __nv_bfloat16>(const __nv_bfloat16& v) {
  return __bfloat162float(v);
}

// Accumulated value -> storage type: the generic from_acc (bilinear.h) is a plain conversion, so float
// stays float and double stays double; half and bfloat16 round from float here.
template <>
__host__ __device__ __forceinline__ __half from_acc<__half, float>(float v) {
  return __float2half(v);
}
template <>
__host__ __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16, float>(float v) {
  return __float2bfloat16(v);
}

// Accumulation type of a storage type: float for half and bfloat16, the type itself otherwise.
template <typename T> struct AccType { using type = T; };
template <> struct AccType<__half> { using type = float; };
template <> struct AccType<__nv_bfloat16> { using type = float; };

// Calls f(T{}) with the storage type T of `dtype` (float, double, __half, __nv_bfloat16): every launcher's
// dispatch, forward and backward.
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

// ---------------------------------------------------------------------------------------------
// Gradient accumulation of the backward launchers. Scatters add many contributions into one element:
// float and double gradients accumulate in place (atomicAdd in the storage type); float16 and bfloat16
// gradients accumulate in a float32 buffer carved from the launcher's workspace and are rounded once at
// the end (float32 accumulation, and no 16-bit atomics, which sm_75 lacks for bfloat16).

inline bool is_16bit(DType dtype) { return dtype == DType::kFloat16 || dtype == DType::kBFloat16; }

// Workspace bytes of the float32 accumulation buffer of `count` gradient elements (0 for float, double).
inline size_t grad_acc_bytes(DType dtype, int64_t count) {
  return is_16bit(dtype) && count > 0 ? align_up(sizeof(float) * static_cast<size_t>(count)) : 0;
}

template <typename T>
struct GradAcc {
  using Acc = typename AccType<T>::type;
  T* out = nullptr;    // the gradient (null: not wanted)
  Acc* acc = nullptr;  // where kernels add: `out` itself for float and double, workspace for 16-bit types
  int64_t count = 0;
};

// The accumulation target of gradient `out` (`count` elements): in place for float and double; for 16-bit
// types the next grad_acc_bytes of *workspace (advanced whether or not `out` is wanted, so the workspace
// layout does not depend on which gradients are).
template <typename T>
GradAcc<T> grad_acc(T* out, int64_t count, char** workspace) {
  using Acc = typename AccType<T>::type;
  GradAcc<T> g;
  g.out = out;
  g.count = count;
  if constexpr (std::is_same<Acc, T>::value) {
    g.acc = out;
  } else {
    if (out != nullptr && count > 0) g.acc = reinterpret_cast<Acc*>(*workspace);
    *workspace += align_up(sizeof(Acc) * static_cast<size_t>(count > 0 ? count : 0));
  }
  return g;
}

// Zeroes the accumulation target (stream order).
template <typename T>
Status grad_acc_zero(const GradAcc<T>& g, cudaStream_t stream, const char* where) {
  if (g.acc == nullptr || g.count <= 0) return Status::Ok();
  return cuda_status(cudaMemsetAsync(g.acc, 0, sizeof(*g.acc) * static_cast<size_t>(g.count), stream), where);
}

template <typename T, typename Acc>
__global__ void store_acc_kernel(const Acc* __restrict__ acc, int64_t n, T* __restrict__ out) {
  DCNKIT_CUDA_KERNEL_LOOP(i, n) { store_acc<T, Acc>(acc, i, out); }
}

// Rounds the float32 accumulation into the 16-bit gradient (nothing to do for float and double).
template <typename T>
Status grad_acc_store(const GradAcc<T>& g, cudaStream_t stream, const char* where) {
  using Acc = typename AccType<T>::type;
  if constexpr (std::is_same<Acc, T>::value) {
    return Status::Ok();
  } else {
    if (g.acc == nullptr || g.count <= 0) return Status::Ok();
    store_acc_kernel<T, Acc><<<cuda_blocks(g.count), kCudaThreads, 0, stream>>>(g.acc, g.count, g.out);
    return cuda_launch_status(where);
  }
}

}  // namespace dcnkit
