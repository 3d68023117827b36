// The CPU GEMM of the torch ops: a float32 weight packed per call for oneDNN's matmul (packed_gemm.h) where oneDNN
// 3.x loads, else straight through the BLAS that libtorch_cpu exports (Fortran sgemm_ / dgemm_), ATen's GEMM where
// those symbols are absent (torch_common.h: fast_cpu_context, pack_cpu_operands).
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "dcnkit/packed_gemm.h"
#include "torch_common.h"

namespace dcnkit::torch_binding {

namespace {

// ---- CPU GEMM straight through the BLAS that libtorch_cpu exports (Fortran sgemm_/dgemm_) --------
// The tiled forward issues one small GEMM per tile; wrapping pointers in tensors for every call costs
// more than the GEMM itself on small tiles. When the symbols are absent, ATen's GEMM is used.
using FortranSgemm = void (*)(const char*, const char*, const int*, const int*, const int*,
                              const float*, const float*, const int*, const float*, const int*,
                              const float*, float*, const int*);
using FortranDgemm = void (*)(const char*, const char*, const int*, const int*, const int*,
                              const double*, const double*, const int*, const double*, const int*,
                              const double*, double*, const int*);

using SetLocalThreads = int (*)(int);

struct Blas {
  FortranSgemm sgemm = nullptr;
  FortranDgemm dgemm = nullptr;
  // MKL's thread-local thread count: GEMMs from inside parallel tasks must not start nested threads.
  SetLocalThreads set_local_threads = nullptr;
};

const Blas& blas() {
  static const Blas b = [] {
    Blas r;
    if (std::getenv("DCNKIT_NO_DIRECT_BLAS") != nullptr) return r;
    void* h = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD);
    if (h == nullptr) return r;
    r.sgemm = reinterpret_cast<FortranSgemm>(dlsym(h, "sgemm_"));
    r.dgemm = reinterpret_cast<FortranDgemm>(dlsym(h, "dgemm_"));
    r.set_local_threads = reinterpret_cast<SetLocalThreads>(dlsym(h, "MKL_Set_Num_Threads_Local"));
    return r;
  }();
  return b;
}

bool fits_int(int64_t v) { return v >= 0 && v <= 0x7fffffff; }

Status blas_gemm(void* aten_self, const GemmArgs& g) {
  bool done = false;
  DCNKIT_RETURN_IF_ERROR(packed_gemm_run(g, &done));
  if (done) return Status::Ok();
  const Blas& b = blas();
  const bool f32 = g.dtype == DType::kFloat32 && b.sgemm;
  const bool f64 = g.dtype == DType::kFloat64 && b.dgemm;
  const bool ints = fits_int(g.m) && fits_int(g.n) && fits_int(g.k) && fits_int(g.lda) &&
                    fits_int(g.ldb) && fits_int(g.ldc);
  if (!(f32 || f64) || !ints || g.m == 0 || g.n == 0 || g.k == 0) return aten_gemm(aten_self, g);
  // Row-major C = op(A) op(B)  <=>  column-major C^T = op(B)^T op(A)^T.
  const char ta = g.trans_b ? 'T' : 'N', tb = g.trans_a ? 'T' : 'N';
  const int m = static_cast<int>(g.n), n = static_cast<int>(g.m), k = static_cast<int>(g.k);
  const int lda = static_cast<int>(std::max<int64_t>(1, g.ldb));
  const int ldb = static_cast<int>(std::max<int64_t>(1, g.lda));
  const int ldc = static_cast<int>(std::max<int64_t>(1, g.ldc));
  // The core calls this GEMM from inside parallel tasks (CpuContext: "single-threaded GEMM").
  const int previous = b.set_local_threads ? b.set_local_threads(1) : 0;
  for (int64_t i = 0; i < g.batch; ++i) {
    if (f32) {
      const float alpha = g.alpha, beta = g.beta;
      b.sgemm(&ta, &tb, &m, &n, &k, &alpha, static_cast<const float*>(g.b) + i * g.stride_b, &lda,
              static_cast<const float*>(g.a) + i * g.stride_a, &ldb, &beta,
              static_cast<float*>(g.c) + i * g.stride_c, &ldc);
    } else {
      const double alpha = g.alpha, beta = g.beta;
      b.dgemm(&ta, &tb, &m, &n, &k, &alpha, static_cast<const double*>(g.b) + i * g.stride_b, &lda,
              static_cast<const double*>(g.a) + i * g.stride_a, &ldb, &beta,
              static_cast<double*>(g.c) + i * g.stride_c, &ldc);
    }
  }
  if (b.set_local_threads) b.set_local_threads(previous);
  return Status::Ok();
}

}  // namespace

CpuContext fast_cpu_context(bool packed) {
  CpuContext ctx = cpu_context();  // gemm_self stays ATen's options, for the fallback
  ctx.gemm = &blas_gemm;
  if (packed) ctx.gemm_min_n = kPackedGemmMinN;
  return ctx;
}

namespace {

bool packing_off() {
  static const bool off = std::getenv("DCNKIT_NO_PACKED_GEMM") != nullptr;
  return off;
}

}  // namespace

std::string cpu_gemm_in_use() {
  if (packing_off()) return "libtorch BLAS (DCNKIT_NO_PACKED_GEMM is set)";
  if (packed_gemm_available()) return "oneDNN " + packed_gemm_version();
  return "libtorch BLAS (" + packed_gemm_unavailable() + ")";
}

// Packing a weight costs about as much as a GEMM over ~150 of its columns (the weight copied twice, on the calling
// thread): a call with fewer GEMM columns (output positions) per weight row keeps libtorch's BLAS. Measured
// (docs/performance.md, issue 46 item 6), forward packed / MKL sgemm: slower at 49-128 positions (C512 7x7: 5.3 /
// 2.8 ms; C1024 8x8 N2: 29.8 / 19.1 ms), even at 100 (C512 10x10), faster from 196 (C512 14x14: 8.0 / 11.0 ms;
// C2048 14x14: 140 / 197 ms) but for C1024 16x16 (41.5 / 38.1 ms), where MKL's tiles suit the map.
int64_t pack_min_columns() {
  static const int64_t n = [] {
    const char* v = std::getenv("DCNKIT_PACK_MIN_COLUMNS");
    return v != nullptr ? std::atoll(v) : int64_t(192);
  }();
  return n;
}

std::atomic<int64_t> packed_calls{0};

bool pack_cpu_operands(const OpEntry& e, const OpCall& c, DType dtype, OpBuffers* b, CpuPacks* packs) {
  if (packing_off() || e.pack == nullptr || e.gemm_operand == nullptr || e.outputs == nullptr ||
      dtype != DType::kFloat32 || !packed_gemm_available()) {
    return false;
  }
  Shape out[kMaxOutputs];
  if (!e.outputs(c, out).ok() || out[0].empty()) return false;
  int64_t out_elems = 1;
  for (int64_t d : out[0]) out_elems *= d;
  bool any = false;
  for (size_t i = 0; i < kMaxInputs; ++i) {
    const int in = static_cast<int>(i);
    GemmOperand a;
    if (b->in[i] == nullptr || !e.gemm_operand(c, in, b->in[i], &a) || a.rows * a.batch <= 0 ||
        out_elems / (a.rows * a.batch) < pack_min_columns()) {
      continue;  // not a GEMM operand (the dims alone are read), or too few columns to repay the packing
    }
    const size_t bytes = e.pack(c, in, b->in[i], dtype, nullptr);
    if (bytes == 0) continue;
    // The launcher's layout in a buffer this thread keeps from call to call (see packed_gemm_pack's per_call).
    thread_local std::vector<char> layout[kMaxInputs];
    if (layout[i].size() < bytes) layout[i].resize(bytes);
    e.pack(c, in, b->in[i], dtype, layout[i].data());
    if (!e.gemm_operand(c, in, layout[i].data(), &a)) continue;
    packs->gemm[i] = packed_gemm_pack(a, true);
    if (packs->gemm[i] == nullptr) continue;
    b->packed[i] = layout[i].data();
    b->gemm_packed[i] = packs->gemm[i].get();
    any = true;
  }
  if (any) packed_calls.fetch_add(1, std::memory_order_relaxed);
  return any;
}

}  // namespace dcnkit::torch_binding

TORCH_LIBRARY_FRAGMENT(dcnkit, m) {
  m.def("_cpu_gemm() -> str", [] { return dcnkit::torch_binding::cpu_gemm_in_use(); });
  // How many CPU calls so far ran on a weight packed for them (tests).
  m.def("_cpu_gemm_packed_calls() -> int", [] { return dcnkit::torch_binding::packed_calls.load(); });
}
