// cpu_gemm.h's packed operands on oneDNN 3.x (onednn_packed_gemm.cpp): internal to plugins/core/src/cpu_gemm.
#pragma once

#include <memory>
#include <string>

#include "dcnkit/common.h"

namespace dcnkit {

struct OneDnnPackedA;  // a GemmOperand's row blocks in oneDNN matmul's weights layout, and its primitives

// Why nothing is packed (empty: oneDNN 3.x is loaded and usable), and the version in use ("3.2.0 (<path>)").
std::string onednn_packed_unavailable();
std::string onednn_packed_version();

// `a` packed (float32 only); null where oneDNN is unusable or makes no matmul for it. With `reuse`, into the
// calling thread's buffer of its previous `reuse` packing where no packed operand holds it any more (a weight packed
// on every call), which the thread then keeps.
std::shared_ptr<OneDnnPackedA> onednn_pack(const GemmOperand& a, bool reuse = false);

// `a` (float32) packed as bfloat16 for oneDNN's bf16 matmul (B converted to bf16 per GEMM, float32 accumulation and
// C); null where oneDNN is unusable or has no bf16 matmul but its reference one on this CPU.
std::shared_ptr<OneDnnPackedA> onednn_pack_bf16(const GemmOperand& a);

// Whether the GEMM `g` (with g.a_packed == &p) fits what was packed (GemmArgs::a_packed's rules).
bool onednn_packed_fits(const OneDnnPackedA& p, const GemmArgs& g);

// Runs `g` on p; *done false (and Ok) where oneDNN makes no matmul for g's shape (the caller runs it unpacked).
Status onednn_packed_gemm(OneDnnPackedA& p, const GemmArgs& g, bool* done);

}  // namespace dcnkit
