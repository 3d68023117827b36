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
// after our kernels), which orders it the same way without ONNX Runtime's arena.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "ort_common.h"

namespace dcnkit::ort {

class StreamScratch {
 public:
  StreamScratch() = default;
  ~StreamScratch() {
    if (async_) {
      if (data_ != nullptr) cudaFreeAsync(data_, stream_);
      return;
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
#if ORT_API_VERSION >= 18
    if (api_version() >= 18) {
      // The allocator that frees it, obtained first so that a buffer is never left without one.
      DCNKIT_RETURN_IF_ERROR(
          from_ort(api().KernelContext_GetAllocator(ctx, mem_info, &allocator_), "KernelContext_GetAllocator"));
      DCNKIT_RETURN_IF_ERROR(from_ort(api().KernelContext_GetScratchBuffer(ctx, mem_info, bytes, &data_),
                                      "scratch buffer of " + std::to_string(bytes) + " bytes"));
      if (data_ == nullptr) {
        return Status::DeviceError("scratch buffer of " + std::to_string(bytes) + " bytes: allocation failed");
      }
      return Status::Ok();
    }
#endif
    (void)mem_info;  // C API < 18: CUDA's stream-ordered allocator on the compute stream (above)
    void* stream = nullptr;
    DCNKIT_RETURN_IF_ERROR(
        from_ort(api().KernelContext_GetGPUComputeStream(ctx, &stream), "KernelContext_GetGPUComputeStream"));
    stream_ = static_cast<cudaStream_t>(stream);
    async_ = true;
    if (cudaMallocAsync(&data_, bytes, stream_) != cudaSuccess || data_ == nullptr) {
      cudaGetLastError();
      data_ = nullptr;
      return Status::DeviceError("scratch buffer of " + std::to_string(bytes) + " bytes: cudaMallocAsync failed");
    }
    return Status::Ok();
  }
  void* data() const { return data_; }

 private:
  OrtAllocator* allocator_ = nullptr;
  void* data_ = nullptr;
  bool async_ = false;  // from cudaMallocAsync on stream_
  cudaStream_t stream_ = nullptr;
};

}  // namespace dcnkit::ort
