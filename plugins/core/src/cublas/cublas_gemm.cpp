#include "dcnkit/cublas_gemm.h"

#include <climits>
#include <string>

namespace dcnkit {

Status cublas_status(cublasStatus_t st, const char* where) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Status::DeviceError(std::string(where) + ": cuBLAS status " + std::to_string(static_cast<int>(st)));
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
Status cublas_gemm(void* self, const GemmArgs& g) {
  auto* s = static_cast<CublasGemm*>(self);
  if (g.m <= 0 || g.n <= 0 || g.batch <= 0) return Status::Ok();
  const int64_t lim = INT_MAX;
  if (g.m > lim || g.n > lim || g.k > lim || g.lda > lim || g.ldb > lim || g.ldc > lim || g.batch > lim) {
    return Status::Invalid("gemm: matrix too large for cuBLAS 32-bit sizes");
  }
  DCNKIT_RETURN_IF_ERROR(cublas_status(cublasSetStream(s->handle, s->stream), "cublasSetStream"));
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
  const int lda = static_cast<int>(g.lda > 0 ? g.lda : 1), ldb = static_cast<int>(g.ldb > 0 ? g.ldb : 1),
            ldc = static_cast<int>(g.ldc > 0 ? g.ldc : 1), batch = static_cast<int>(g.batch);
  const float alpha = g.alpha, beta = g.beta;
  switch (g.dtype) {
    case DType::kFloat32:
      return cublas_status(
          cublasSgemmStridedBatched(s->handle, tb, ta, n, m, k, &alpha, static_cast<const float*>(g.b), ldb,
                                    g.stride_b, static_cast<const float*>(g.a), lda, g.stride_a, &beta,
                                    static_cast<float*>(g.c), ldc, g.stride_c, batch),
          "cublasSgemmStridedBatched");
    case DType::kFloat16:
    case DType::kBFloat16: {
      const cudaDataType_t t = g.dtype == DType::kFloat16 ? CUDA_R_16F : CUDA_R_16BF;
      return cublas_status(
          cublasGemmStridedBatchedEx(s->handle, tb, ta, n, m, k, &alpha, g.b, t, ldb, g.stride_b, g.a, t, lda,
                                     g.stride_a, &beta, g.c, t, ldc, g.stride_c, batch, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT),
          "cublasGemmStridedBatchedEx(16-bit)");
    }
    case DType::kFloat64: {
      const double a64 = g.alpha, b64 = g.beta;
      return cublas_status(
          cublasDgemmStridedBatched(s->handle, tb, ta, n, m, k, &a64, static_cast<const double*>(g.b), ldb,
                                    g.stride_b, static_cast<const double*>(g.a), lda, g.stride_a, &b64,
                                    static_cast<double*>(g.c), ldc, g.stride_c, batch),
          "cublasDgemmStridedBatched");
    }
  }
  return Status::Internal(std::string("gemm: unsupported dtype ") + dtype_name(g.dtype));
}

}  // namespace dcnkit
