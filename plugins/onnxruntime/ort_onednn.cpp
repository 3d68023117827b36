// oneDNN's u8 x s8 -> s32 GEMM (ort_onednn.h), from the process's oneDNN (dcnkit/onednn_lib.h).
#include "ort_onednn.h"

#include <string>
#include <type_traits>

#include "dcnkit/onednn_lib.h"

#if defined(DCNKIT_WITH_ONEDNN_HEADERS)
#include <oneapi/dnnl/dnnl.h>
#endif

namespace dcnkit::ort {

namespace {

// dnnl.h: dnnl_status_t dnnl_gemm_u8s8s32(char transa, char transb, char offsetc, dnnl_dim_t M, dnnl_dim_t N,
// dnnl_dim_t K, float alpha, const uint8_t *A, dnnl_dim_t lda, uint8_t ao, const int8_t *B, dnnl_dim_t ldb,
// int8_t bo, float beta, int32_t *C, dnnl_dim_t ldc, const int32_t *co);  row-major,
// C = alpha * (op(A) - ao) * (op(B) - bo) + beta * C + co. dnnl_dim_t is int64_t, dnnl_status_t an int enum
// (0: success).
using GemmU8S8S32 = int (*)(char, char, char, int64_t, int64_t, int64_t, float, const uint8_t*, int64_t, uint8_t,
                            const int8_t*, int64_t, int8_t, float, int32_t*, int64_t, const int32_t*);
#if defined(DCNKIT_WITH_ONEDNN_HEADERS)
static_assert(std::is_same<dnnl_dim_t, int64_t>::value && sizeof(dnnl_status_t) == sizeof(int),
              "dnnl.h's types differ from the prototype above");
#endif

struct Loaded {
  GemmU8S8S32 gemm = nullptr;
  std::string error;
};

Loaded load() {
  Loaded l;
  const OneDnnLib& lib = onednn_lib();
  if (lib.handle == nullptr) {
    l.error = "oneDNN (libdnnl) is needed for the quantized operators and was not found; tried:" + lib.tried +
              "\n  install it (pip install onednn-cpu-gomp; Debian/Ubuntu: apt install libdnnl2) or set "
              "DCNKIT_ONEDNN_LIB to a libdnnl.so path";
    return l;
  }
  l.gemm = reinterpret_cast<GemmU8S8S32>(lib.symbol("dnnl_gemm_u8s8s32"));
  if (l.gemm == nullptr) l.error = "the oneDNN library found has no dnnl_gemm_u8s8s32 (oneDNN >= 2.0 needed)";
  return l;
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

Status gemm(void*, const QGemmArgs& g) {
  if (g.m <= 0 || g.n <= 0) return Status::Ok();
  const Loaded& l = loaded();
  // Called from ONNX Runtime's pool threads: each call runs on its calling thread (no OpenMP team).
  OneDnnOnThisThread single;
  const int32_t co = 0;
  const int rc = l.gemm('N', 'T', 'F', g.m, g.n, g.k, 1.f, g.a, g.lda, g.a_zero, g.b, g.ldb, 0, 0.f, g.c, g.ldc, &co);
  if (rc != 0) return Status::Internal("dnnl_gemm_u8s8s32 failed with status " + std::to_string(rc));
  return Status::Ok();
}

}  // namespace

Status onednn_gemm_u8s8s32(QGemmFn* fn) {
  const Loaded& l = loaded();
  if (l.gemm == nullptr) return Status::Invalid(l.error);
  *fn = &gemm;
  return Status::Ok();
}

}  // namespace dcnkit::ort
