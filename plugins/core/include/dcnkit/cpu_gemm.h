// The CPU GEMM of the runtime adapters whose kernels run in the runtime's own threads (ONNX Runtime, OpenVINO): the
// core's GemmFn (row-major, strided-batched, see common.h), called from inside those threads' parallel loops and
// single-threaded there (no thread pool of its own).
//   - A packed once (GemmArgs::a_packed, made by cpu_gemm_pack from a constant GemmOperand: a model's weight):
//     oneDNN's matmul on the weight reordered once into its own blocked layout (brgemm kernels on AVX-512 / AMX), where
//     oneDNN 3.x loads (onednn_lib.h). Chosen by measurement (docs/performance.md): on the deformable convolutions'
//     GEMMs it ran 1.1-2.1x OpenBLAS's and MKL's speed, whose sgemm packs the weight on every call.
//   - Everything else, and everything where oneDNN 3.x is absent: OpenBLAS (openblas_gemm.h).
// Built into those libraries only (plugins/core/src/cpu_gemm/), never into the core; the PyTorch library takes the
// packed part alone (packed_gemm.h) beside libtorch's BLAS.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dcnkit/common.h"

namespace dcnkit {

// `a` (float32) packed for cpu_gemm (GemmArgs::a_packed, which must stay alive as long as the GEMMs that use it); null
// where oneDNN 3.x is not loaded (with one line on stderr, once per process, saying so) or cannot take it. `a.data` is
// read during the call only.
std::shared_ptr<const void> cpu_gemm_pack(const GemmOperand& a);

// `a` (float32) packed for a bfloat16 GEMM: oneDNN's bf16 matmul on A rounded to bf16 once, each call's B rounded to
// bf16 (to nearest even), float32 accumulation and C (the OpenVINO backend's bf16 mode). Where oneDNN has no bf16
// matmul on this CPU but its reference one, what cpu_gemm_pack(a) gives, with one line on stderr saying so.
std::shared_ptr<const void> cpu_gemm_pack_bf16(const GemmOperand& a);

// GemmFn: oneDNN on a_packed where it is set and the call fits it, else OpenBLAS. `self` is unused.
Status cpu_gemm(void* self, const GemmArgs& g);

// CpuContext::gemm_min_n for a call whose GEMMs have a packed operand (packed) or not.
int64_t cpu_gemm_min_n(bool packed);

// Which GEMM packed operands get: "oneDNN <version> (<path>)", or why it is OpenBLAS.
std::string cpu_gemm_describe();

}  // namespace dcnkit
