// A GEMM operand packed once into oneDNN 3.x matmul's own layout (plugins/core/src/cpu_gemm/), without a fallback: the
// part of cpu_gemm.h that the PyTorch library uses beside libtorch's BLAS (which packs its operands on every call).
#pragma once

#include <memory>
#include <string>

#include "dcnkit/common.h"

namespace dcnkit {

// Measured (docs/performance.md, single thread, K 2304-9216): oneDNN's matmul on packed weights runs at 103-115
// GFLOP/s from ~48 columns up (80-93 at 32), while each tile reads the whole weight once more: tiles of at least 64
// (CpuContext::gemm_min_n of a call with a packed operand).
constexpr int64_t kPackedGemmMinN = 64;

// `a` (float32) packed for packed_gemm_run (GemmArgs::a_packed); null where oneDNN 3.x is not loaded or cannot take it.
// `a.data` is read during the call only. per_call: an operand packed for one call (a training weight), into memory
// the calling thread reuses from one such packing to the next.
std::shared_ptr<const void> packed_gemm_pack(const GemmOperand& a, bool per_call = false);

// `a` (float32) packed as bfloat16 for packed_gemm_run, which then runs oneDNN's bf16 matmul (each call's B rounded to
// bf16 by a oneDNN reorder, float32 accumulation and C); null where oneDNN 3.x is not loaded or has no bf16 matmul
// on this CPU but its reference one.
std::shared_ptr<const void> packed_gemm_pack_bf16(const GemmOperand& a);

// Runs `g` on g.a_packed (made by packed_gemm_pack) where it is set and the call fits it; *done false (and Ok)
// otherwise, and the caller runs `g` on its own GEMM.
Status packed_gemm_run(const GemmArgs& g, bool* done);

// Whether packed_gemm_pack can pack (oneDNN 3.x loaded and usable); if not, why (one line); the oneDNN in use,
// "<major>.<minor>.<patch> (<library>)".
bool packed_gemm_available();
std::string packed_gemm_unavailable();
std::string packed_gemm_version();

}  // namespace dcnkit
