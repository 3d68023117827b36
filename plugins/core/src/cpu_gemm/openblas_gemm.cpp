#include "dcnkit/openblas_gemm.h"

#include <cblas.h>  // scipy-openblas32: scipy_-prefixed symbols

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <mutex>

namespace dcnkit {

Status openblas_gemm(void*, const GemmArgs& g) {
  // The kernels run inside the runtime's pool: OpenBLAS itself stays single-threaded.
  static std::once_flag once;
  std::call_once(once, [] { scipy_openblas_set_num_threads(1); });
  if (g.m <= 0 || g.n <= 0) return Status::Ok();
  const int64_t limit = INT_MAX;
  if (g.m > limit || g.n > limit || g.k > limit || g.lda > limit || g.ldb > limit || g.ldc > limit) {
    return Status::Invalid("gemm: matrix too large for 32-bit BLAS indices");
  }
  const bool f64 = g.dtype == DType::kFloat64;
  if (!f64 && g.dtype != DType::kFloat32) {
    return Status::Internal(std::string("gemm: unsupported dtype ") + dtype_name(g.dtype));
  }
  const size_t es = f64 ? 8 : 4;
  for (int64_t b = 0; b < g.batch; ++b) {
    char* c = static_cast<char*>(g.c) + b * g.stride_c * es;
    if (g.k <= 0) {  // C = beta * C (no product)
      for (int64_t i = 0; i < g.m; ++i) {
        for (int64_t j = 0; j < g.n; ++j) {
          if (f64) {
            double* p = reinterpret_cast<double*>(c) + i * g.ldc + j;
            *p = g.beta == 0.f ? 0.0 : *p * g.beta;
          } else {
            float* p = reinterpret_cast<float*>(c) + i * g.ldc + j;
            *p = g.beta == 0.f ? 0.f : *p * g.beta;
          }
        }
      }
      continue;
    }
    const char* a = static_cast<const char*>(g.a) + b * g.stride_a * es;
    const char* bb = static_cast<const char*>(g.b) + b * g.stride_b * es;
    const auto ta = g.trans_a ? CblasTrans : CblasNoTrans;
    const auto tb = g.trans_b ? CblasTrans : CblasNoTrans;
    const blasint m = static_cast<blasint>(g.m), n = static_cast<blasint>(g.n),
                  k = static_cast<blasint>(g.k);
    // Row-major leading dimensions must cover the stored rows.
    const int64_t need_a = g.trans_a ? g.m : g.k, need_b = g.trans_b ? g.k : g.n;
    if (g.lda < need_a || g.ldb < need_b || g.ldc < g.n) {
      return Status::Internal("gemm: leading dimension smaller than the matrix width");
    }
    if (f64) {
      scipy_cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, g.alpha, reinterpret_cast<const double*>(a),
                        static_cast<blasint>(g.lda), reinterpret_cast<const double*>(bb),
                        static_cast<blasint>(g.ldb), g.beta, reinterpret_cast<double*>(c),
                        static_cast<blasint>(g.ldc));
    } else {
      scipy_cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, g.alpha, reinterpret_cast<const float*>(a),
                        static_cast<blasint>(g.lda), reinterpret_cast<const float*>(bb),
                        static_cast<blasint>(g.ldb), g.beta, reinterpret_cast<float*>(c),
                        static_cast<blasint>(g.ldc));
    }
  }
  return Status::Ok();
}

int64_t openblas_min_n() {
  static const int64_t n = [] {
    const char* e = std::getenv("DCNKIT_OPENBLAS_MIN_N");  // developer knob for tuning
    return e ? std::max<int64_t>(0, std::atoll(e)) : int64_t(1024);
  }();
  return n;
}

}  // namespace dcnkit
