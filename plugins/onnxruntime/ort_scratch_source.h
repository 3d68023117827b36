// Where a CUDA-EP kernel's per-call scratch memory comes from (ort_scratch.h): the decision alone, without CUDA, so that
// a CPU test (tests/cpp/ort_scratch_source_test.cpp) checks it.
#pragma once

#include <cstring>

namespace dcnkit::ort {

enum class ScratchSource {
  kOrtScratchBuffer,  // KernelContext_GetScratchBuffer (C API 18): ONNX Runtime's arena, tagged with the stream
  kStreamOrderedPool,  // cudaMallocAsync / cudaFreeAsync on the compute stream: CUDA's memory pool
  kOrtAllocatorSynced,  // ONNX Runtime's allocator, freed only after the compute stream has finished
};

// The source for a running C API version `api_version`, headers that declare GetScratchBuffer or not, and a device
// that does or does not support stream-ordered memory pools (cudaDevAttrMemoryPoolsSupported: 0 on some vGPU, MIG
// and older Windows TCC setups, where cudaMallocAsync fails). `forced`: the DCNKIT_ORT_CUDA_SCRATCH setting
// ("scratch-buffer", "pool", "allocator"; tests), taken where the setup allows it, else ignored.
inline ScratchSource scratch_source(unsigned api_version, bool headers_have_scratch_buffer, bool pools_supported,
                                    const char* forced = nullptr) {
  const bool scratch_buffer = headers_have_scratch_buffer && api_version >= 18;
  if (forced != nullptr) {
    if (std::strcmp(forced, "scratch-buffer") == 0 && scratch_buffer) return ScratchSource::kOrtScratchBuffer;
    if (std::strcmp(forced, "pool") == 0 && pools_supported) return ScratchSource::kStreamOrderedPool;
    if (std::strcmp(forced, "allocator") == 0) return ScratchSource::kOrtAllocatorSynced;
  }
  if (scratch_buffer) return ScratchSource::kOrtScratchBuffer;
  return pools_supported ? ScratchSource::kStreamOrderedPool : ScratchSource::kOrtAllocatorSynced;
}

}  // namespace dcnkit::ort
