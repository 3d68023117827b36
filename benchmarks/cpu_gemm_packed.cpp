// The packed-weight candidates of benchmarks/bench_cpu_gemm.py (which compiles and runs this): C = A B^T, row-major,
// A (M x K) packed once, then timed on one thread:
//   oneDNN  3.x matmul, A reordered once into the layout it asks for per block of 64 rows (dcnkit/cpu_gemm.h's GEMM),
//           dst (N x 64) per block transposed into C;
//   oneDNN-bf16  the same with A packed as bfloat16 and B converted to bfloat16 in every call (timed with it), f32
//           accumulation and dst (the kit's bf16 GEMM, issue 46 item 5);
//   oneDNN-fpmath-bf16  the float32 matmul with the fpmath_mode bf16 attribute (oneDNN may down-convert inside);
//   MKL     cblas_sgemm_pack (A) + cblas_sgemm_compute, sequential threading layer.
// Each library is loaded with dlopen from the paths given; one that does not load is reported and skipped.
//   cpu_gemm_packed REPEAT LIBDNNL LIBMKL_RT M,N,K ...   ->  one line per shape and library:
//   "<lib> M N K <fastest ms> <max |C - A B^T| / max |A B^T|>"  (or "<lib> skipped <why>")
#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

double fastest(int repeat, const auto& f) {
  f();
  double best = 1e30;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

double rel_err(const std::vector<float>& c, const std::vector<double>& want) {
  double e = 0, s = 1e-30;
  for (size_t i = 0; i < c.size(); ++i) {
    e = std::max(e, std::fabs(c[i] - want[i]));
    s = std::max(s, std::fabs(want[i]));
  }
  return e / s;
}

#define SYM(h, f) reinterpret_cast<decltype(&::f)>(dlsym(h, #f))

// float32 -> bfloat16, rounded to nearest even (finite values).
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

enum class Mode { kF32, kBf16, kFpmathBf16 };

void onednn(void* h, Mode mode, int repeat, int M, int N, int K, const std::vector<float>& A,
            const std::vector<float>& B, const std::vector<double>& want) {
  auto omp_set = reinterpret_cast<void (*)(int)>(dlsym(h, "omp_set_num_threads"));
  if (omp_set) omp_set(1);
  auto md_tag = SYM(h, dnnl_memory_desc_create_with_tag);
  auto md_strides = SYM(h, dnnl_memory_desc_create_with_strides);
  auto mm_pd = SYM(h, dnnl_matmul_primitive_desc_create);
  auto re_pd = SYM(h, dnnl_reorder_primitive_desc_create);
  auto query_md = SYM(h, dnnl_primitive_desc_query_md);
  auto prim_create = SYM(h, dnnl_primitive_create);
  auto exec = SYM(h, dnnl_primitive_execute);
  auto mem_create = SYM(h, dnnl_memory_create);
  auto set_handle = SYM(h, dnnl_memory_set_data_handle);
  auto md_size = SYM(h, dnnl_memory_desc_get_size);
  auto engine_create = SYM(h, dnnl_engine_create);
  auto stream_create = SYM(h, dnnl_stream_create);
  dnnl_engine_t eng;
  dnnl_stream_t st;
  engine_create(&eng, dnnl_cpu, 0);
  stream_create(&st, eng, dnnl_stream_default_flags);
  constexpr int R = 64;
  const int blocks = (M + R - 1) / R;
  const dnnl_dims_t sd = {N, K}, wd = {K, R}, dd = {N, R}, ud = {K, R}, us = {1, K};
  const dnnl_data_type_t in_type = mode == Mode::kBf16 ? dnnl_bf16 : dnnl_f32;
  const char* name = mode == Mode::kF32 ? "oneDNN" : mode == Mode::kBf16 ? "oneDNN-bf16" : "oneDNN-fpmath-bf16";
  dnnl_memory_desc_t src, w_any, dst, user;
  md_tag(&src, 2, sd, in_type, dnnl_ab);
  md_tag(&w_any, 2, wd, in_type, dnnl_format_tag_any);
  md_tag(&dst, 2, dd, dnnl_f32, dnnl_ab);
  md_strides(&user, 2, ud, dnnl_f32, us);
  dnnl_primitive_attr_t attr = nullptr;
  if (mode == Mode::kFpmathBf16) {
    SYM(h, dnnl_primitive_attr_create)(&attr);
    SYM(h, dnnl_primitive_attr_set_fpmath_mode)(attr, dnnl_fpmath_mode_bf16);
  }
  dnnl_primitive_desc_t pd, rpd;
  if (mm_pd(&pd, eng, src, w_any, nullptr, dst, attr) != dnnl_success) {
    std::printf("%s skipped oneDNN makes no such matmul here\n", name);
    return;
  }
  const char* impl = nullptr;
  SYM(h, dnnl_primitive_desc_query)(pd, dnnl_query_impl_info_str, 0, &impl);
  std::fprintf(stderr, "%s %dx%dx%d: %s\n", name, M, N, K, impl ? impl : "?");
  const_dnnl_memory_desc_t wmd = query_md(pd, dnnl_query_weights_md, 0);
  const size_t wbytes = md_size(wmd);
  std::vector<float> packed(wbytes / 4 * blocks + 16), rows(static_cast<size_t>(R) * K), d(static_cast<size_t>(N) * R);
  std::vector<float> C(static_cast<size_t>(M) * N);
  re_pd(&rpd, user, eng, wmd, eng, nullptr);
  dnnl_primitive_t mm, re;
  prim_create(&mm, pd);
  prim_create(&re, rpd);
  dnnl_memory_t from, to, s, w, o;
  mem_create(&from, user, eng, rows.data());
  mem_create(&to, wmd, eng, packed.data());
  for (int b = 0; b < blocks; ++b) {
    std::fill(rows.begin(), rows.end(), 0.f);
    for (int r = 0; r < R && b * R + r < M; ++r) std::copy_n(&A[static_cast<size_t>(b * R + r) * K], K, &rows[r * K]);
    set_handle(to, packed.data() + wbytes / 4 * b);
    const dnnl_exec_arg_t args[] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    exec(re, st, 2, args);
  }
  std::vector<uint16_t> b16(mode == Mode::kBf16 ? B.size() : 0);
  mem_create(&s, src, eng, mode == Mode::kBf16 ? static_cast<void*>(b16.data()) : const_cast<float*>(B.data()));
  mem_create(&w, wmd, eng, packed.data());
  mem_create(&o, dst, eng, d.data());
  const double ms = fastest(repeat, [&] {
    for (size_t i = 0; i < b16.size(); ++i) b16[i] = to_bf16(B[i]);
    for (int b = 0; b < blocks; ++b) {
      set_handle(w, packed.data() + wbytes / 4 * b);
      const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, s}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, o}};
      exec(mm, st, 3, args);
      for (int r = 0; r < R && b * R + r < M; ++r)
        for (int n = 0; n < N; ++n) C[static_cast<size_t>(b * R + r) * N + n] = d[static_cast<size_t>(n) * R + r];
    }
  });
  std::printf("%s %d %d %d %.4f %.2e\n", name, M, N, K, ms, rel_err(C, want));
}

void mkl(void* h, int repeat, int M, int N, int K, const std::vector<float>& A, const std::vector<float>& B,
         const std::vector<double>& want) {
  using SetLayer = int (*)(int);
  using PackSize = size_t (*)(int, int, int, int);
  using Pack = void (*)(int, int, int, int, int, int, float, const float*, int, float*);
  using Compute = void (*)(int, int, int, int, int, int, const float*, int, const float*, int, float, float*, int);
  auto set_layer = reinterpret_cast<SetLayer>(dlsym(h, "MKL_Set_Threading_Layer"));
  auto size = reinterpret_cast<PackSize>(dlsym(h, "cblas_sgemm_pack_get_size"));
  auto pack = reinterpret_cast<Pack>(dlsym(h, "cblas_sgemm_pack"));
  auto compute = reinterpret_cast<Compute>(dlsym(h, "cblas_sgemm_compute"));
  if (!set_layer || !size || !pack || !compute) {
    std::printf("MKL skipped no cblas_sgemm_pack API\n");
    return;
  }
  set_layer(1);  // MKL_THREADING_SEQUENTIAL
  constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kAMatrix = 161;
  std::vector<float> packed(size(kAMatrix, M, N, K) / 4 + 16), C(static_cast<size_t>(M) * N);
  pack(kRowMajor, kAMatrix, kNoTrans, M, N, K, 1.f, A.data(), K, packed.data());
  const double ms = fastest(repeat, [&] {
    compute(kRowMajor, kPacked, kTrans, M, N, K, packed.data(), K, B.data(), K, 0.f, C.data(), N);
  });
  std::printf("MKL %d %d %d %.4f %.2e\n", M, N, K, ms, rel_err(C, want));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s REPEAT LIBDNNL LIBMKL_RT M,N,K ...\n", argv[0]);
    return 2;
  }
  const int repeat = std::atoi(argv[1]);
  void* dnnl = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (!dnnl) std::printf("oneDNN skipped %s\n", dlerror());
  void* mkl_rt = dlopen(argv[3], RTLD_NOW | RTLD_LOCAL);
  if (!mkl_rt) std::printf("MKL skipped %s\n", dlerror());
  for (int i = 4; i < argc; ++i) {
    int M, N, K;
    if (std::sscanf(argv[i], "%d,%d,%d", &M, &N, &K) != 3) return 2;
    std::vector<float> A(static_cast<size_t>(M) * K), B(static_cast<size_t>(N) * K);
    unsigned seed = 1;
    for (float& v : A) v = static_cast<float>((seed = seed * 1103515245u + 12345u) >> 9) / 8388608.f - 1.f;
    for (float& v : B) v = static_cast<float>((seed = seed * 1103515245u + 12345u) >> 9) / 8388608.f - 1.f;
    std::vector<double> want(static_cast<size_t>(M) * N);
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        double acc = 0;
        for (int k = 0; k < K; ++k) acc += double(A[static_cast<size_t>(m) * K + k]) * B[static_cast<size_t>(n) * K + k];
        want[static_cast<size_t>(m) * N + n] = acc;
      }
    if (dnnl) {
      for (Mode mode : {Mode::kF32, Mode::kBf16, Mode::kFpmathBf16}) onednn(dnnl, mode, repeat, M, N, K, A, B, want);
    }
    if (mkl_rt) mkl(mkl_rt, repeat, M, N, K, A, B, want);
    std::fflush(stdout);
  }
  return 0;
}
