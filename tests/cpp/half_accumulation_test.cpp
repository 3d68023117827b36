// The 16-bit path of the DCNv3 and multi-scale deformable attention CUDA kernels, run on the host: their
// per-thread bodies (dcnv3_/msda_forward_thread, _backward_thread with the scatter functors), instantiated the way
// the .cu files instantiate them for bfloat16 (storage T = 16 bits, accumulation Acc = float32), over the CUDA
// launch grid, and the final rounding of the float32 gradient buffers (store_acc, store_acc_kernel's body).
// HostBf16 stands in for __nv_bfloat16: the same bits, the same round-to-nearest-even conversion from float.
// Checked against the float32 instantiation on the same (bfloat16-representable) data, in the same order:
//   forward: the 16-bit output is the float32 output rounded once (so every sum was accumulated in float32);
//   backward: the float32 accumulation buffers are bit-identical, and the stored gradient is each rounded once.
// Also the body of the int32 level tables' widening kernel (widened_level_entry) over its grid.
// Prints one line per failure and "N passed, M failed"; exits 1 on any failure. Built by tests/test_half_accumulation.py.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "dcnkit/dcnv3_kernels.h"
#include "dcnkit/msda_kernels.h"

struct HostBf16 {
  uint16_t bits;
};

namespace dcnkit {
template <>
inline float to_acc<float, HostBf16>(const HostBf16& v) {
  const uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
template <>
inline HostBf16 from_acc<HostBf16, float>(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return HostBf16{0x7fc0};
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return HostBf16{static_cast<uint16_t>(u >> 16)};
}
}  // namespace dcnkit

using dcnkit::from_acc;
using dcnkit::to_acc;

namespace {

int passed = 0, failed = 0;

void check(bool ok, const char* what, int64_t i) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    std::printf("FAIL %s at %lld\n", what, static_cast<long long>(i));
  }
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// n values in [lo, hi), bfloat16-representable: (16-bit copy, float32 copy).
struct Data {
  std::vector<HostBf16> h;
  std::vector<float> f;
};
Data make(int64_t n, float lo, float hi, uint32_t seed) {
  Data d;
  uint32_t s = seed * 2654435761u + 1;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    const float v = lo + (hi - lo) * static_cast<float>(s >> 8) / 16777216.0f;
    d.h.push_back(from_acc<HostBf16>(v));
    d.f.push_back(to_acc<float>(d.h.back()));
  }
  return d;
}

// out16 == round(out32), element by element.
void check_rounded(const std::vector<HostBf16>& out16, const std::vector<float>& out32, const char* what) {
  for (size_t i = 0; i < out32.size(); ++i) check(out16[i].bits == from_acc<HostBf16>(out32[i]).bits, what, i);
}

// The float32 buffers equal, and their stored 16-bit gradients each rounded once (store_acc).
void check_grad(const std::vector<float>& acc16, const std::vector<float>& acc32, const char* what) {
  std::vector<HostBf16> stored(acc16.size());
  for (size_t i = 0; i < acc16.size(); ++i) {
    check(bits_of(acc16[i]) == bits_of(acc32[i]), what, i);
    dcnkit::store_acc<HostBf16, float>(acc16.data(), static_cast<int64_t>(i), stored.data());
  }
  check_rounded(stored, acc32, what);
}

void msda() {
  using namespace dcnkit;
  MsdaParams p;
  p.batch = 2, p.heads = 2, p.channels = 6, p.num_queries = 5, p.num_levels = 2, p.num_points = 3;
  const int64_t shapes[4] = {3, 4, 2, 2}, starts[2] = {0, 12};
  p.num_values = 16;
  const int64_t nv = p.batch * p.num_values * p.heads * p.channels;
  const int64_t nw = p.batch * p.num_queries * p.heads * p.num_levels * p.num_points;
  const int64_t no = p.batch * p.num_queries * p.heads * p.channels;
  const Data value = make(nv, -2, 2, 1), loc = make(2 * nw, -0.2f, 1.2f, 2), attn = make(nw, 0, 1, 3),
             go = make(no, -1, 1, 4);
  std::vector<HostBf16> out16(no);
  std::vector<float> out32(no);
  for (int64_t i = 0; i < msda_thread_count<kMsdaForwardChunk>(p); ++i) {
    msda_forward_thread<float, HostBf16>(p, value.h.data(), shapes, starts, loc.h.data(), attn.h.data(), out16.data(),
                                         i);
    msda_forward_thread<float, float>(p, value.f.data(), shapes, starts, loc.f.data(), attn.f.data(), out32.data(), i);
  }
  check_rounded(out16, out32, "msda forward");
  std::vector<float> gv16(nv), gl16(2 * nw), gw16(nw), gv32(nv), gl32(2 * nw), gw32(nw);
  for (int64_t i = 0; i < msda_thread_count<kMsdaBackwardChunk>(p); ++i) {
    msda_backward_thread<float, HostBf16>(p, go.h.data(), value.h.data(), shapes, starts, loc.h.data(), attn.h.data(),
                                          gv16.data(), gl16.data(), gw16.data(), i, PlainAdd{});
    msda_backward_thread<float, float>(p, go.f.data(), value.f.data(), shapes, starts, loc.f.data(), attn.f.data(),
                                       gv32.data(), gl32.data(), gw32.data(), i, PlainAdd{});
  }
  check_grad(gv16, gv32, "msda grad_value");
  check_grad(gl16, gl32, "msda grad_sampling_locations");
  check_grad(gw16, gw32, "msda grad_attention_weights");
}

// int32 level tables widened entry by entry (widened_level_entry, the body of msda_levels_to_int64_cuda's kernel, over
// its grid of 3L threads) give the int64 tables, negative entries included, and the same output.
void msda_int32_tables() {
  using namespace dcnkit;
  const int32_t shapes32[6] = {3, 4, 2, 2, -1, 5}, starts32[3] = {0, 12, -7};
  const int64_t shapes64[6] = {3, 4, 2, 2, -1, 5}, starts64[3] = {0, 12, -7};
  int64_t wide[9];
  for (int64_t i = 0; i < 9; ++i) wide[i] = widened_level_entry(i, 3, shapes32, starts32);
  for (int64_t i = 0; i < 6; ++i) check(wide[i] == shapes64[i], "widened spatial_shapes", i);
  for (int64_t i = 0; i < 3; ++i) check(wide[6 + i] == starts64[i], "widened level_start_index", i);
  // A valid table (the first two levels) through the forward, from the widened copy and from the original.
  MsdaParams p;
  p.batch = 1, p.heads = 1, p.channels = 3, p.num_queries = 4, p.num_levels = 2, p.num_points = 2, p.num_values = 16;
  const int32_t valid32[4] = {3, 4, 2, 2}, valid_starts32[2] = {0, 12};
  int64_t valid_wide[6];
  for (int64_t i = 0; i < 6; ++i) valid_wide[i] = widened_level_entry(i, 2, valid32, valid_starts32);
  const int64_t valid64[4] = {3, 4, 2, 2}, valid_starts64[2] = {0, 12};
  const int64_t nw = p.num_queries * p.num_levels * p.num_points;
  const Data value = make(16 * 3, -1, 1, 9), loc = make(2 * nw, 0, 1, 10), attn = make(nw, 0, 1, 11);
  std::vector<float> a(12), b(12);
  for (int64_t i = 0; i < msda_thread_count<kMsdaForwardChunk>(p); ++i) {
    msda_forward_thread<float, float>(p, value.f.data(), valid_wide, valid_wide + 4, loc.f.data(), attn.f.data(),
                                      a.data(), i);
    msda_forward_thread<float, float>(p, value.f.data(), valid64, valid_starts64, loc.f.data(), attn.f.data(),
                                      b.data(), i);
  }
  for (int64_t i = 0; i < 12; ++i) check(bits_of(a[i]) == bits_of(b[i]) && a[i] != 0.0f, "msda from widened", i);
}

void dcnv3(bool softmax) {
  using namespace dcnkit;
  Dcnv3Params p;
  p.batch = 2, p.height = 5, p.width = 4, p.groups = 2, p.group_channels = 6;
  p.kernel_h = p.kernel_w = 3, p.pad_h = p.pad_w = 1, p.offset_scale = 1.0;
  p.out_h = 5, p.out_w = 4, p.points = 9;
  const int64_t G = p.groups, K = p.points, sites = p.batch * p.out_h * p.out_w;
  p.offset_row = G * K * 2, p.offset_group = 2 * K, p.mask_row = G * K, p.mask_group = K, p.mask_base = 0;
  p.softmax = softmax;
  const int64_t ni = p.batch * p.height * p.width * p.channels(), no = sites * p.channels();
  const Data x = make(ni, -2, 2, 5), off = make(sites * p.offset_row, -2.5f, 2.5f, 6),
             mask = make(sites * p.mask_row, -1, 1, 7), go = make(no, -1, 1, 8);
  std::vector<HostBf16> out16(no);
  std::vector<float> out32(no);
  for (int64_t i = 0; i < dcnv3_thread_count<kDcnv3ForwardChunk>(p); ++i) {
    dcnv3_forward_thread<float, HostBf16>(p, x.h.data(), off.h.data(), mask.h.data(), out16.data(), i);
    dcnv3_forward_thread<float, float>(p, x.f.data(), off.f.data(), mask.f.data(), out32.data(), i);
  }
  check_rounded(out16, out32, softmax ? "dcnv3 softmax forward" : "dcnv3 forward");
  std::vector<float> gi16(ni), go16(off.f.size()), gm16(mask.f.size()), gi32(ni), go32(off.f.size()),
      gm32(mask.f.size());
  for (int64_t i = 0; i < dcnv3_thread_count<kDcnv3BackwardChunk>(p); ++i) {
    dcnv3_backward_thread<float, HostBf16>(p, go.h.data(), x.h.data(), off.h.data(), mask.h.data(), gi16.data(),
                                           go16.data(), gm16.data(), i, PlainAdd{});
    dcnv3_backward_thread<float, float>(p, go.f.data(), x.f.data(), off.f.data(), mask.f.data(), gi32.data(),
                                        go32.data(), gm32.data(), i, PlainAdd{});
  }
  check_grad(gi16, gi32, "dcnv3 grad_input");
  check_grad(go16, go32, "dcnv3 grad_offset");
  check_grad(gm16, gm32, "dcnv3 grad_mask");
}

}  // namespace

int main() {
  msda();
  msda_int32_tables();
  dcnv3(false);
  dcnv3(true);
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
