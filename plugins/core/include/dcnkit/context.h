// Execution contexts handed to launchers by the front ends. A launcher never allocates and never
// picks a thread pool, stream or BLAS of its own: it uses what the context gives it.
#pragma once

#include <type_traits>

#include "dcnkit/common.h"

namespace dcnkit {

// ---------------------------------------------------------------------------------------------
// CPU

struct CpuContext {
  // Number of tasks that may run at once; launchers size per-task scratch space with it.
  int num_threads = 1;
  // Runs body(body_ctx, begin, end) over chunks covering [0, n); may run chunks concurrently.
  // nullptr runs everything on the calling thread.
  void (*parallel_for)(void* self, int64_t n, void (*body)(void*, int64_t, int64_t),
                       void* body_ctx) = nullptr;
  void* parallel_self = nullptr;
  // Single-threaded GEMM callable from inside parallel_for bodies (row-major, see GemmArgs).
  GemmFn gemm = nullptr;
  void* gemm_self = nullptr;
  // Narrowest GEMM width (columns of C) this BLAS runs at full speed; launchers that tile a GEMM keep
  // their tiles at least this wide (0: no preference). Measured: MKL is efficient from ~48 columns,
  // OpenBLAS needs a few hundred.
  int64_t gemm_min_n = 0;

  Status run_gemm(const GemmArgs& args) const {
    if (gemm == nullptr) return Status::Internal("CpuContext has no GEMM");
    return gemm(gemm_self, args);
  }
};

// Calls f(begin, end) over chunks of [0, n) through the context's thread pool.
template <typename F>
void parallel_for(const CpuContext& ctx, int64_t n, F&& f) {
  if (n <= 0) return;
  if (ctx.parallel_for == nullptr || n == 1) {
    f(int64_t(0), n);
    return;
  }
  using Fn = typename std::remove_reference<F>::type;
  ctx.parallel_for(
      ctx.parallel_self, n,
      [](void* c, int64_t b, int64_t e) { (*static_cast<Fn*>(c))(b, e); },
      const_cast<void*>(static_cast<const void*>(&f)));
}

// Runs exactly `tasks` tasks (task ids 0..tasks-1), each with its own slot of per-task scratch space.
// f(task_id) must not depend on which thread runs it.
template <typename F>
void parallel_tasks(const CpuContext& ctx, int64_t tasks, F&& f) {
  parallel_for(ctx, tasks, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) f(t);
  });
}

// ---------------------------------------------------------------------------------------------
// CUDA (types only: this header compiles without the CUDA toolkit)

struct CudaContext {
  void* stream = nullptr;  // cudaStream_t
  // Deterministic mode (torch.use_deterministic_algorithms): launchers that have an atomic-free path take it
  // (DeformConv2d's backward); the others are unaffected (the front end raises for them).
  bool deterministic = false;
  // GEMM enqueued on `stream` (cuBLAS in ONNX Runtime and TensorRT, ATen in PyTorch).
  GemmFn gemm = nullptr;
  void* gemm_self = nullptr;

  Status run_gemm(const GemmArgs& args) const {
    if (gemm == nullptr) return Status::Internal("CudaContext has no GEMM");
    return gemm(gemm_self, args);
  }
};

// Rounds `bytes` up so that consecutive workspace slices stay 256-byte aligned.
inline size_t align_up(size_t bytes) { return (bytes + 255) & ~size_t(255); }

}  // namespace dcnkit
