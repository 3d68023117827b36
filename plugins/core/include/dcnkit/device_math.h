// Arithmetic that the SASS rules (docs/performance.md) allow inside a kernel's loops, with the host's results:
// no CALL (the slow paths of division and of 64-bit integer division) and no 64-bit integer <-> floating-point
// conversion (I2F.S64, F2I.S64 and their unsigned and double forms). scripts/kernel_report.py checks the SASS.
//
//   div_rn(a, b)          a / b, correctly rounded: the host's division; on the device the FMA refinement of the
//                         hardware reciprocal that CUDA's own division runs on its fast path (the same instructions),
//                         with the operands scaled into its range instead of its slow-path call.
//   div_count(a, n)       the same for a finite divisor n >= 1 (counts, sizes): less code, fewer registers.
//   index_to_acc<Acc>(i)  Acc(i) of a 64-bit index: one 32-bit conversion when i fits 32 bits, else its halves.
//   acc_to_index(v)       int64_t(v) of an integral v in [0, 2^62): one 32-bit conversion below 2^31, else halves.
//   product_fits_int64    a * b without overflow, tested without a 64-bit division.
//
// Each device algorithm is also a host function (div_rn_with, index_to_acc_split, acc_to_index_split), so that a host
// test runs it against the host's arithmetic (tests/cpp/device_math_checks.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "dcnkit/common.h"

namespace dcnkit {

// The neighbour of a nonzero finite q one ulp toward +infinity (up) or -infinity.
template <typename Acc>
DCNKIT_HD Acc ulp_step(Acc q, bool up) {
  using Bits = typename std::conditional<sizeof(Acc) == 8, int64_t, int32_t>::type;
  Bits bits;
  std::memcpy(&bits, &q, sizeof(q));
  bits += (q > Acc(0)) == up ? Bits(1) : Bits(-1);
  std::memcpy(&q, &bits, sizeof(q));
  return q;
}

// a / b from an approximation r0 of 1 / b (relative error below 2^-20): the reciprocal refined by Newton steps (float:
// two; double: a third-order step, then one, as CUDA's division), the quotient a * r corrected by its exact residual
// a - b q (an FMA), which leaves it within an ulp of a / b and the nearest unless the correction rounded a tie the
// wrong way (a reciprocal one ulp off: Newton's step keeps 1 for b = 1 - 2^-24). So the quotient's neighbour toward
// a / b is taken where its residual is the smaller (a quotient of two floats is never a midpoint: no tie). Correctly
// rounded while a, b and a / b are normal numbers well inside the exponent range (div_scaled keeps them there).
template <typename Acc>
DCNKIT_HD Acc div_refine(Acc a, Acc b, Acc r0) {
  Acc e = std::fma(-b, r0, Acc(1));
  if constexpr (sizeof(Acc) == 8) e = std::fma(e, e, e);
  Acc r = std::fma(r0, e, r0);
  e = std::fma(-b, r, Acc(1));
  r = std::fma(r, e, r);
  Acc q = a * r;
  q = std::fma(r, std::fma(-b, q, a), q);
  const Acc e1 = std::fma(-b, q, a);
  const Acc q2 = ulp_step(q, (e1 > Acc(0)) == (b > Acc(0)));
  return std::fabs(std::fma(-b, q2, a)) < std::fabs(e1) ? q2 : q;
}

// The powers of two that keep div_refine's operands in its range: |a| in [2^-lo, 2^lo] and |b| in [2^-64, 2^64] give a
// normal quotient with a margin (float lo = 60, double 500); an |a| outside is scaled by 2^-s or 2^s into it (float s =
// 90, double 600), exactly, and the quotient back.
template <typename Acc>
struct DivScale {
  static constexpr Acc lo = sizeof(Acc) == 8 ? Acc(0x1p-500) : Acc(0x1p-60);
  static constexpr Acc hi = sizeof(Acc) == 8 ? Acc(0x1p500) : Acc(0x1p60);
  static constexpr Acc up = sizeof(Acc) == 8 ? Acc(0x1p600) : Acc(0x1p90);
  static constexpr Acc down = sizeof(Acc) == 8 ? Acc(0x1p-600) : Acc(0x1p-90);
};

// a / b for a finite b with |b| in [2^-64, 2^64] and a finite, nonzero a: div_refine of a scaled into range, the
// quotient scaled back (exact unless the quotient is subnormal, where its last bit may differ from the correctly
// rounded one). One div_refine on every path, the scales chosen by selects: little code, few registers.
template <typename Acc, typename Rcp>
DCNKIT_HD Acc div_scaled(Acc a, Acc b, const Rcp& rcp) {
  using S = DivScale<Acc>;
  const Acc m = std::fabs(a);
  const Acc sa = m > S::hi ? S::down : (m < S::lo ? S::up : Acc(1));
  const Acc sq = m > S::hi ? S::up : (m < S::lo ? S::down : Acc(1));
  return div_refine(a * sa, b, rcp(b)) * sq;
}

// a / b by div_refine, with rcp(x) an approximate reciprocal: a zero, infinite or NaN operand gives IEEE's signed zero,
// infinity or NaN; otherwise b = mb 2^eb (frexp, mb in [1/2, 1)), a scaled as in div_scaled, and the quotient scaled
// back once (ldexp: exact unless the quotient is subnormal, where its last bit may differ; an overflow is infinite).
template <typename Acc, typename Rcp>
DCNKIT_HD Acc div_rn_with(Acc a, Acc b, const Rcp& rcp) {
  if (a == Acc(0) || b == Acc(0) || !std::isfinite(a) || !std::isfinite(b)) {
    if (std::isnan(a) || std::isnan(b)) return a + b;
    const bool zero = a == Acc(0) || std::isinf(b), inf = std::isinf(a) || b == Acc(0);
    if (zero && inf) return std::numeric_limits<Acc>::quiet_NaN();  // 0 / 0, inf / inf
    return std::copysign(zero ? Acc(0) : std::numeric_limits<Acc>::infinity(),
                         std::signbit(a) != std::signbit(b) ? Acc(-1) : Acc(1));
  }
  using S = DivScale<Acc>;
  int eb = 0;
  const Acc mb = std::frexp(b, &eb), m = std::fabs(a);
  const int s = sizeof(Acc) == 8 ? 600 : 90;
  const Acc sa = m > S::hi ? S::down : (m < S::lo ? S::up : Acc(1));
  const int k = m > S::hi ? s : (m < S::lo ? -s : 0);
  return std::ldexp(div_refine(a * sa, mb, rcp(mb)), k - eb);
}

// a / n for a finite divisor n >= 1 (a sample count, a grid or output size, pi): fewer cases than div_rn_with. A zero,
// infinite or NaN a gives a itself (the quotient's value and sign).
template <typename Acc, typename Rcp>
DCNKIT_HD Acc div_count_with(Acc a, Acc n, const Rcp& rcp) {
  if (!(std::fabs(a) > Acc(0)) || std::isinf(a)) return a;
  const Acc sn = n > Acc(0x1p64) ? Acc(0x1p-64) : Acc(1);
  return div_scaled(a, n * sn, rcp) * sn;
}

#if defined(__CUDA_ARCH__)
// The hardware's approximate reciprocals (MUFU.RCP, MUFU.RCP64H), as CUDA's division starts from them.
struct HardwareRcp {
  __device__ __forceinline__ float operator()(float b) const {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
    return r;
  }
  __device__ __forceinline__ double operator()(double b) const {
    double r;
    asm("rcp.approx.ftz.f64 %0, %1;" : "=d"(r) : "d"(b));
    return r;
  }
};
#endif

// a / b, correctly rounded (on the device, a subnormal quotient may differ in its last bit: div_scaled).
template <typename Acc>
DCNKIT_HD Acc div_rn(Acc a, Acc b) {
#if defined(__CUDA_ARCH__)
  return div_rn_with(a, b, HardwareRcp{});
#else
  return a / b;
#endif
}

// a / n, correctly rounded, for a finite n >= 1 (div_count_with).
template <typename Acc>
DCNKIT_HD Acc div_count(Acc a, Acc n) {
#if defined(DCNKIT_EXP_MUL)
  return a * n;
#elif defined(DCNKIT_EXP_FAST_ONLY) && defined(__CUDA_ARCH__)
  return div_refine(a, n, HardwareRcp{}(n));
#elif defined(__CUDA_ARCH__)
  return div_count_with(a, n, HardwareRcp{});
#else
  return a / n;
#endif
}

// Acc(i) from the two 32-bit halves of i: the high half times 2^32 plus the low one, exact in double below 2^53 (one
// rounding of the exact value, as the 64-bit conversion; float then rounds that double once more, which matters only
// beyond 2^53 and keeps the result monotone in i).
template <typename Acc>
DCNKIT_HD Acc index_to_acc_split(int64_t i) {
  if (i == static_cast<int64_t>(static_cast<int32_t>(i))) return static_cast<Acc>(static_cast<int32_t>(i));
  const int32_t hi = static_cast<int32_t>(i >> 32);
  const uint32_t lo = static_cast<uint32_t>(static_cast<uint64_t>(i));
  return static_cast<Acc>(static_cast<double>(hi) * 4294967296.0 + static_cast<double>(lo));
}
template <typename Acc>
DCNKIT_HD Acc index_to_acc(int64_t i) {
#if defined(__CUDA_ARCH__)
  return index_to_acc_split<Acc>(i);
#else
  return static_cast<Acc>(i);
#endif
}
// 32-bit indices convert directly.
template <typename Acc>
DCNKIT_HD Acc index_to_acc(int32_t i) {
  return static_cast<Acc>(i);
}
template <typename Acc>
DCNKIT_HD Acc index_to_acc(uint32_t i) {
  return static_cast<Acc>(i);
}

// int64_t(v) for an integral v in [0, 2^62) from 32-bit conversions: v / 2^32 and its remainder are exact.
template <typename Acc>
DCNKIT_HD int64_t acc_to_index_split(Acc v) {
  if (v < Acc(2147483648.0)) return static_cast<int32_t>(v);
  const Acc hi = std::floor(v * Acc(0x1p-32));
  const Acc lo = v - hi * Acc(4294967296.0);
  return static_cast<int64_t>((static_cast<uint64_t>(static_cast<uint32_t>(hi)) << 32) | static_cast<uint32_t>(lo));
}
template <typename Acc>
DCNKIT_HD int64_t acc_to_index(Acc v) {
#if defined(__CUDA_ARCH__)
  return acc_to_index_split(v);
#else
  return static_cast<int64_t>(v);
#endif
}

// Whether a * b (a, b > 0) fits int64_t, without the 64-bit division of INT64_MAX / b on the device.
DCNKIT_HD bool product_fits_int64(int64_t a, int64_t b) {
#if defined(__CUDA_ARCH__)
  const uint64_t ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
  return __umul64hi(ua, ub) == 0 && ((ua * ub) >> 63) == 0;
#else
  return a <= INT64_MAX / b;
#endif
}

// floor(v) as an int32_t within [lo, hi] (NaN: lo): the comparisons first, so that only an int32 conversion remains.
template <typename Acc>
DCNKIT_HD int32_t floor_within(Acc v, int32_t lo, int32_t hi) {
  if (!(v > static_cast<Acc>(lo))) return lo;
  if (!(v < static_cast<Acc>(hi))) return hi;
  return static_cast<int32_t>(std::floor(v));
}

}  // namespace dcnkit
