// GEMM through OpenBLAS (pip scipy-openblas32) for the runtimes whose CPU kernels run in the runtime's own thread
// pool (ONNX Runtime, OpenVINO): the core's GemmFn (row-major, strided-batched, see common.h), single-threaded
// (called from inside the runtime's parallel loops). Built into those libraries only (plugins/core/src/openblas/),
// never into the core: the torch path uses ATen's GEMM.
#pragma once

#include <cstdint>

#include "dcnkit/common.h"

namespace dcnkit {

// GemmFn over OpenBLAS: float32 and float64; `self` is unused. Makes OpenBLAS single-threaded on first use.
Status openblas_gemm(void* self, const GemmArgs& g);

// The narrowest right-hand side (columns of C) at which OpenBLAS sgemm runs at full speed, for
// CpuContext::gemm_min_n (DCNKIT_OPENBLAS_MIN_N overrides it, a developer knob for tuning).
int64_t openblas_min_n();

}  // namespace dcnkit
