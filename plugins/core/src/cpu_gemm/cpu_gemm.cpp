// The runtime adapters' CPU GEMM (cpu_gemm.h): packed operands on oneDNN, the rest on OpenBLAS.
#include "dcnkit/cpu_gemm.h"

#include <cstdio>
#include <mutex>

#include "dcnkit/openblas_gemm.h"
#include "onednn_packed_gemm.h"

namespace dcnkit {

namespace {

// Measured (docs/performance.md, single thread, K 2304-9216): oneDNN's matmul on packed weights runs at 103-115
// GFLOP/s from ~48 columns up (80-93 at 32), while each tile reads the whole weight once more: tiles of at least 64.
constexpr int64_t kPackedMinN = 64;

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
  const std::string why = onednn_packed_unavailable();
  if (!why.empty()) {
    std::string line = why;
    for (char& ch : line) ch = ch == '\n' ? ' ' : ch;  // one line
    say_unpacked_once(line);
    return nullptr;
  }
  return onednn_pack(a);
}

std::shared_ptr<const void> cpu_gemm_pack_bf16(const GemmOperand& a) {
  if (onednn_packed_unavailable().empty()) {
    if (auto p = onednn_pack_bf16(a)) return p;
    static std::once_flag once;
    std::call_once(once, [] {
      std::fprintf(stderr, "dcnkit: oneDNN %s has no bfloat16 matmul on this CPU: the DCN GEMM runs in float32\n",
                   onednn_packed_version().c_str());
    });
  }
  return cpu_gemm_pack(a);
}

Status cpu_gemm(void* self, const GemmArgs& g) {
  if (g.a_packed != nullptr) {
    auto& p = *const_cast<OneDnnPackedA*>(static_cast<const OneDnnPackedA*>(g.a_packed));
    if (onednn_packed_fits(p, g)) {
      bool done = false;
      DCNKIT_RETURN_IF_ERROR(onednn_packed_gemm(p, g, &done));
      if (done) return Status::Ok();
    }
  }
  return openblas_gemm(self, g);
}

int64_t cpu_gemm_min_n(bool packed) { return packed ? kPackedMinN : openblas_min_n(); }

std::string cpu_gemm_describe() {
  const std::string why = onednn_packed_unavailable();
  return why.empty() ? "oneDNN " + onednn_packed_version() : "OpenBLAS (" + why + ")";
}

}  // namespace dcnkit
