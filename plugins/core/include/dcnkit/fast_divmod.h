// Division by a divisor fixed on the host, without a division instruction in the kernel: q = x / d as one
// 32-bit multiply-high, an add and a shift (the round-up "magic number" method for unsigned 32-bit x < 2^31,
// Granlund & Montgomery 1994). Used to decode CUDA thread indices; the host builds the divisors once per
// launch, so no kernel loop divides.
#pragma once

#include <cstdint>

#include "dcnkit/common.h"

namespace dcnkit {

DCNKIT_HD uint32_t mul_hi_u32(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

struct FastDivmod {
  uint32_t d = 1;      // the divisor, >= 1
  uint32_t mul = 1;    // ceil(2^(32+shift) / d) - 2^32 (fits 32 bits because 2^shift < 2d)
  uint32_t shift = 0;  // ceil(log2(d))

  FastDivmod() = default;
  // Host only; d in [1, 2^31].
  explicit FastDivmod(uint32_t divisor) : d(divisor < 1 ? 1 : divisor) {
    shift = 0;
    while ((uint64_t(1) << shift) < d) ++shift;
    mul = static_cast<uint32_t>(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1);
  }

  // x / d for x < 2^31 (x + mul_hi < 2^32, so the add cannot wrap).
  DCNKIT_HD uint32_t div(uint32_t x) const { return (mul_hi_u32(x, mul) + x) >> shift; }
  // q = x / d, r = x % d.
  DCNKIT_HD void divmod(uint32_t x, uint32_t& q, uint32_t& r) const {
    q = div(x);
    r = x - q * d;
  }
};

}  // namespace dcnkit
