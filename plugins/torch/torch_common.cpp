#include "torch_common.h"

#include <ATen/record_function.h>

#ifdef DCNKIT_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dcnkit::torch_binding {

namespace {

at::ScalarType scalar_type_of(DType t) {
  switch (t) {
    case DType::kFloat32: return at::kFloat;
    case DType::kFloat64: return at::kDouble;
    case DType::kFloat16: return at::kHalf;
    case DType::kBFloat16: return at::kBFloat16;
  }
  return at::kFloat;
}

// A (batch, rows, cols) view of a row-major matrix with leading dimension ld.
at::Tensor matrix_view(const void* p, int64_t batch, int64_t rows, int64_t cols, int64_t ld,
                       int64_t stride, bool trans, const at::TensorOptions& opt) {
  at::Tensor t = at::from_blob(const_cast<void*>(p), {batch, rows, cols}, {stride, ld, 1}, opt);
  return trans ? t.transpose(1, 2) : t;
}

void cpu_parallel_for(void*, int64_t n, void (*body)(void*, int64_t, int64_t), void* ctx) {
  at::parallel_for(0, n, 1, [&](int64_t b, int64_t e) { body(ctx, b, e); });
}

}  // namespace

Status aten_gemm(void* device_options, const GemmArgs& g) {
  const auto& base = *static_cast<const at::TensorOptions*>(device_options);
  const auto opt = base.dtype(scalar_type_of(g.dtype));
  if (g.m == 0 || g.n == 0) return Status::Ok();
  // A profiler scope, so that a test can check that nothing is allocated inside
  // (tests/test_deform_conv2d_cuda_schedule.py).
  RECORD_FUNCTION("dcnkit::aten_gemm", std::vector<c10::IValue>());
  // op(A) is m x k: stored k x m when transposed.
  at::Tensor a = g.trans_a ? matrix_view(g.a, g.batch, g.k, g.m, g.lda, g.stride_a, true, opt)
                           : matrix_view(g.a, g.batch, g.m, g.k, g.lda, g.stride_a, false, opt);
  at::Tensor b = g.trans_b ? matrix_view(g.b, g.batch, g.n, g.k, g.ldb, g.stride_b, true, opt)
                           : matrix_view(g.b, g.batch, g.k, g.n, g.ldb, g.stride_b, false, opt);
  at::Tensor c = matrix_view(g.c, g.batch, g.m, g.n, g.ldc, g.stride_c, false, opt);
  if (g.k == 0) {
    if (g.beta == 0.f) c.zero_(); else c.mul_(g.beta);
    return Status::Ok();
  }
  // Straight into C, whatever beta: with beta 0, baddbmm_ ignores C's contents (NaN included), so no
  // C-sized temporary and no copy (at::bmm + copy_ allocated a column-sized buffer in the backward).
  c.baddbmm_(a, b, g.beta, g.alpha);
  return Status::Ok();
}

CpuContext cpu_context() {
  static at::TensorOptions cpu_options = at::TensorOptions().device(at::kCPU);
  CpuContext ctx;
  ctx.num_threads = at::get_num_threads();
  ctx.parallel_for = &cpu_parallel_for;
  ctx.gemm = &aten_gemm;
  ctx.gemm_self = &cpu_options;
  return ctx;
}

#ifdef DCNKIT_WITH_CUDA
CudaContext cuda_context(const at::Tensor& like) {
  thread_local at::TensorOptions options;
  options = at::TensorOptions().device(like.device());
  CudaContext ctx;
  ctx.stream = c10::cuda::getCurrentCUDAStream(like.device().index()).stream();
  ctx.deterministic = at::globalContext().deterministicAlgorithms();
  ctx.gemm = &aten_gemm;
  ctx.gemm_self = &options;
  return ctx;
}
#endif

}  // namespace dcnkit::torch_binding
