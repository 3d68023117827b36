// Per-call scratch memory of the CUDA execution-provider kernels, ordered on the kernel's compute stream.
//
// Why not KernelContext_GetAllocator + AllocatorAlloc (the CPU kernels' Workspace): such an allocation
// carries no stream. It is freed when Compute returns, while the kernels that use it are still queued on
// the compute stream, and ONNX Runtime's arena may hand the same memory at once to another Run() on
// another stream: nothing orders the two, so one run's im2col / GEMM can overwrite another's columns.
//
// KernelContext_GetScratchBuffer (C API 18, present in our API 21 headers) allocates from the same
// allocator with the kernel's compute stream attached: the arena tags the chunk with that stream, and once
// the chunk is freed it is reused only by allocations on the same stream (which stream order places
// after our kernels) or on a stream that has waited on ours since. The C API leaves the release to the
// caller "from the corresponding allocator": KernelContext_GetAllocator for the same OrtMemoryInfo is that
// allocator (both take the kernel context's allocator for mem_info's device), and AllocatorFree on it at
// the end of Compute is safe for the reason above; ONNX Runtime's own CUDA kernels release their
// GetScratchBuffer memory the same way, when Compute returns. Nothing here synchronises.
//
// ONNX Runtime 1.16 and 1.17 (C API < 18) have no GetScratchBuffer: there the memory comes from CUDA's own
// stream-ordered allocator on the compute stream (cudaMallocAsync, released by cudaFreeAsync on the same stream
// after our kernels), which orders it the same way without ONNX Runtime's arena, where the device supports memory
// pools (cudaDevAttrMemoryPoolsSupported); where it does not (or cudaMallocAsync fails), from ONNX Runtime's allocator
// (KernelContext_GetAllocator, C API 15), freed only after cudaStreamSynchronize on the compute stream: slower (one
// synchronisation per call), and safe for the reason above. ort_scratch_source.h holds the decision.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "ort_common.h"
#include "ort_scratch_source.h"

namespace dcnkit::ort {

constexpr int kMaxScratchDevices = 64;

// Whether `device` supports stream-ordered memory pools (cudaMallocAsync), asked once per device.
inline bool memory_pools_supported(int device) {
  static std::atomic<int> known[kMaxScratchDevices];  // 0: not asked yet, 1: no, 2: yes
  if (device < 0 || device >= kMaxScratchDevices) return false;
  int v = known[device].load(std::memory_order_relaxed);
  if (v == 0) {
    int supported = 0;
    if (cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device) != cudaSuccess) {
      cudaGetLastError();
      supported = 0;
    }
    v = supported ? 2 : 1;
    known[device].store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

class StreamScratch {
 public:
  StreamScratch() = default;
  ~StreamScratch() {
    if (source_ == ScratchSource::kStreamOrderedPool) {
      if (data_ != nullptr) cudaFreeAsync(data_, stream_);
      return;
    }
    if (source_ == ScratchSource::kOrtAllocatorSynced && data_ != nullptr) {
      cudaStreamSynchronize(stream_);  // our kernels are done with it before the arena hands it to anyone
    }
    if (data_ != nullptr && allocator_ != nullptr) {
      OrtStatus* st = api().AllocatorFree(allocator_, data_);
      if (st != nullptr) api().ReleaseStatus(st);
    }
    if (allocator_ != nullptr) api().ReleaseAllocator(allocator_);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;

  // `bytes` of device memory of `mem_info`'s device on the compute stream of `ctx` (none when 0).
  Status allocate(const OrtKernelContext* ctx, const OrtMemoryInfo* mem_info, size_t bytes) {
    if (bytes == 0) return Status::Ok();
    int device = 0;
    DCNKIT_RETURN_IF_ERROR(from_ort(api().MemoryInfoGetId(mem_info, &device), "MemoryInfoGetId"));
    source_ = scratch_source(api_version(), ORT_API_VERSION >= 18, memory_pools_supported(device),
                             std::getenv("DCNKIT_ORT_CUDA_SCRATCH"));
    const std::string what = "scratch buffer of " + std::to_string(bytes) + " bytes";
    // The allocator that frees it, obtained first so that a buffer is never left without one.
    if (source_ != ScratchSource::kStreamOrderedPool) {
      DCNKIT_RETURN_IF_ERROR(
          from_ort(api().KernelContext_GetAllocator(ctx, mem_info, &allocator_), "KernelContext_GetAllocator"));
    }
#if ORT_API_VERSION >= 18
    if (source_ == ScratchSource::kOrtScratchBuffer) {
      DCNKIT_RETURN_IF_ERROR(from_ort(api().KernelContext_GetScratchBuffer(ctx, mem_info, bytes, &data_), what));
      return data_ != nullptr ? Status::Ok() : Status::DeviceError(what + ": allocation failed");
    }
#endif
    void* stream = nullptr;
    DCNKIT_RETURN_IF_ERROR(
        from_ort(api().KernelContext_GetGPUComputeStream(ctx, &stream), "KernelContext_GetGPUComputeStream"));
    stream_ = static_cast<cudaStream_t>(stream);
    if (source_ == ScratchSource::kStreamOrderedPool) {
      if (cudaMallocAsync(&data_, bytes, stream_) == cudaSuccess && data_ != nullptr) return Status::Ok();
      cudaGetLastError();  // a pool that fails: ONNX Runtime's allocator, synchronised, instead
      data_ = nullptr;
      source_ = ScratchSource::kOrtAllocatorSynced;
      DCNKIT_RETURN_IF_ERROR(
          from_ort(api().KernelContext_GetAllocator(ctx, mem_info, &allocator_), "KernelContext_GetAllocator"));
    }
    DCNKIT_RETURN_IF_ERROR(from_ort(api().AllocatorAlloc(allocator_, bytes, &data_), what));
    return data_ != nullptr ? Status::Ok() : Status::DeviceError(what + ": allocation failed");
  }
  void* data() const { return data_; }
  ScratchSource source() const { return source_; }

 private:
  OrtAllocator* allocator_ = nullptr;
  void* data_ = nullptr;
  ScratchSource source_ = ScratchSource::kOrtScratchBuffer;
  cudaStream_t stream_ = nullptr;
};

}  // namespace dcnkit::ort
