// packed_gemm.h over onednn_packed_gemm.h.
#include "dcnkit/packed_gemm.h"

#include "onednn_packed_gemm.h"

namespace dcnkit {

std::shared_ptr<const void> packed_gemm_pack(const GemmOperand& a, bool per_call) {
  if (!packed_gemm_available()) return nullptr;
  return onednn_pack(a, per_call);
}

std::shared_ptr<const void> packed_gemm_pack_bf16(const GemmOperand& a) {
  if (!packed_gemm_available()) return nullptr;
  return onednn_pack_bf16(a);
}

Status packed_gemm_run(const GemmArgs& g, bool* done) {
  *done = false;
  if (g.a_packed == nullptr) return Status::Ok();
  auto& p = *const_cast<OneDnnPackedA*>(static_cast<const OneDnnPackedA*>(g.a_packed));
  if (!onednn_packed_fits(p, g)) return Status::Ok();
  return onednn_packed_gemm(p, g, done);
}

bool packed_gemm_available() { return onednn_packed_unavailable().empty(); }

std::string packed_gemm_unavailable() {
  std::string why = onednn_packed_unavailable();
  for (char& ch : why) ch = ch == '\n' ? ' ' : ch;
  return why;
}

std::string packed_gemm_version() { return onednn_packed_version(); }

}  // namespace dcnkit
