// The runtime adapters' CPU GEMM (cpu_gemm.h): packed operands on oneDNN, the rest on OpenBLAS.
#include "dcnkit/cpu_gemm.h"

#include <cstdio>
#include <mutex>

#include "dcnkit/openblas_gemm.h"
#include "dcnkit/packed_gemm.h"

namespace dcnkit {

namespace {

void say_unpacked_once(const std::string& why) {
  static std::once_flag once;
  std::call_once(once, [&] {
    std::fprintf(stderr,
                 "dcnkit: CPU DeformConv2d GEMM on OpenBLAS, weights not packed (pip install onednn-cpu-gomp, or set "
                 "DCNKIT_ONEDNN_LIB to a oneDNN 3.x libdnnl.so): %s\n",
                 why.c_str());
  });
}

}  // namespace

std::shared_ptr<const void> cpu_gemm_pack(const GemmOperand& a) {
  if (!packed_gemm_available()) {
    say_unpacked_once(packed_gemm_unavailable());
    return nullptr;
  }
  return packed_gemm_pack(a);
}

std::shared_ptr<const void> cpu_gemm_pack_bf16(const GemmOperand& a) {
  if (packed_gemm_available()) {
    if (auto p = packed_gemm_pack_bf16(a)) return p;
    static std::once_flag once;
    std::call_once(once, [] {
      std::fprintf(stderr, "dcnkit: oneDNN %s has no bfloat16 matmul on this CPU: the DCN GEMM runs in float32\n",
                   packed_gemm_version().c_str());
    });
  }
  return cpu_gemm_pack(a);
}

Status cpu_gemm(void* self, const GemmArgs& g) {
  bool done = false;
  DCNKIT_RETURN_IF_ERROR(packed_gemm_run(g, &done));
  return done ? Status::Ok() : openblas_gemm(self, g);
}

int64_t cpu_gemm_min_n(bool packed) { return packed ? kPackedGemmMinN : openblas_min_n(); }

std::string cpu_gemm_describe() {
  return packed_gemm_available() ? "oneDNN " + packed_gemm_version() : "OpenBLAS (" + packed_gemm_unavailable() + ")";
}

}  // namespace dcnkit
