// GEMM through cuBLAS for the runtimes that own a cuBLAS handle (ONNX Runtime CUDA EP, TensorRT): the
// core's GemmFn (row-major, strided-batched, see common.h) enqueued on a stream. Built into those
// libraries only (plugins/core/src/cublas/), never into the core: the torch path uses ATen's GEMM.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "dcnkit/common.h"

namespace dcnkit {

// The `self` of cublas_gemm: a handle and the stream to enqueue on (set per call by the owner).
struct CublasGemm {
  cublasHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
};

Status cublas_status(cublasStatus_t st, const char* where);

// GemmFn over a CublasGemm: float32, float64, and float16 / bfloat16 with float32 accumulation.
Status cublas_gemm(void* self, const GemmArgs& g);

}  // namespace dcnkit
