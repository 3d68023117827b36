// Host checks of the device algorithms of dcnkit/device_math.h against the host's own arithmetic:
//   div_rn_with (the device's division) with an emulated hardware reciprocal off by up to 2^-20 (MUFU's is closer):
//     bit-equal to a / b over random operands across the exponent range, the ends of the range, integral divisors
//     (sample counts, grid sizes), zeros, infinities and NaN; quotients in the subnormal range are counted apart
//     (documented: the last bit may differ there);
//   index_to_acc_split / acc_to_index_split: equal to the 64-bit conversions they replace, over 32-bit and 64-bit
//     values (float: the split rounds twice beyond 2^53; checked to stay monotone there);
//   the rotated RoIAlign's deterministic gather reads grad_output at a 64-bit offset (rotated_bin_offset) also past
//     2^31 bins: its offsets over a logical (K, C, oh, ow) shape of 2^34 bins per map, computed without allocating it.
// Prints one line per check and exits 1 when one fails. Built and run by tests/test_kernel_counts.py.
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>

#include "dcnkit/device_math.h"
#include "dcnkit/roi_align_rotated.h"

namespace {

int g_failed = 0;

void report(const char* what, long bad, long total) {
  std::printf("%-72s %ld / %ld mismatches %s\n", what, bad, total, bad == 0 ? "ok" : "FAIL");
  if (bad != 0) g_failed = 1;
}

// An approximate reciprocal: the correctly rounded one moved by a relative error of up to 2^-20 (deterministic per
// operand, both signs).
struct EmulatedRcp {
  template <typename Acc>
  Acc operator()(Acc b) const {
    const double r = 1.0 / static_cast<double>(b);
    uint64_t bits;
    const double bd = static_cast<double>(b);
    std::memcpy(&bits, &bd, sizeof(bits));
    const double err = (static_cast<double>((bits * 0x9e3779b97f4a7c15ull) >> 11) / 9007199254740992.0 - 0.5) *
                       std::ldexp(1.0, -19);
    return static_cast<Acc>(r * (1.0 + err));
  }
};

template <typename Acc>
bool same(Acc x, Acc y) {
  if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
  return x == y && std::signbit(x) == std::signbit(y);
}

template <typename Acc>
Acc random_value(std::mt19937_64& rng, int emin, int emax) {
  std::uniform_real_distribution<double> m(1.0, 2.0);
  std::uniform_int_distribution<int> e(emin, emax);
  const Acc v = static_cast<Acc>(std::ldexp(m(rng), e(rng)));
  return (rng() & 1) ? -v : v;
}

template <typename Acc>
void check_division(const char* name, int emin, int emax) {
  std::mt19937_64 rng(12345);
  const EmulatedRcp rcp;
  long bad = 0, total = 0, subnormal = 0, subnormal_bad = 0;
  auto one = [&](Acc a, Acc b) {
    const Acc want = a / b, got = dcnkit::div_rn_with(a, b, rcp);
    const bool tiny = want != Acc(0) && std::fabs(want) < std::numeric_limits<Acc>::min();
    if (tiny) {
      ++subnormal;
      subnormal_bad += !same(got, want);
      return;
    }
    ++total;
    if (!same(got, want)) {
      if (bad < 5) std::printf("  %s: %a / %a = %a, got %a\n", name, double(a), double(b), double(want), double(got));
      ++bad;
    }
  };
  for (int i = 0; i < 2000000; ++i) one(random_value<Acc>(rng, emin, emax), random_value<Acc>(rng, emin, emax));
  for (int i = 0; i < 1000000; ++i) one(random_value<Acc>(rng, -8, 40), random_value<Acc>(rng, -4, 12));
  // integral divisors (sample counts, grid sizes), sums of samples, coordinates times a bin
  std::uniform_int_distribution<int64_t> n(1, int64_t(1) << 40);
  for (int i = 0; i < 1000000; ++i) one(random_value<Acc>(rng, -30, 30), static_cast<Acc>(n(rng) >> (rng() % 40)));
  const Acc specials[] = {Acc(0), -Acc(0), Acc(1), Acc(3), std::numeric_limits<Acc>::min(),
                          std::numeric_limits<Acc>::denorm_min(), std::numeric_limits<Acc>::max(),
                          std::numeric_limits<Acc>::infinity(), -std::numeric_limits<Acc>::infinity(),
                          std::numeric_limits<Acc>::quiet_NaN(), Acc(0x1p60), Acc(0x1p-60), Acc(1e-30), Acc(7e29)};
  for (Acc a : specials) {
    for (Acc b : specials) one(a, b);
  }
  // divisors whose significand is all ones or nearly (Newton's step can keep a reciprocal one ulp off there)
  const Acc ulp1 = std::numeric_limits<Acc>::epsilon() / Acc(2);
  for (int k = 0; k < 64; ++k) {
    for (int t = 0; t < 2000; ++t) {
      const Acc b = std::ldexp(Acc(1) - Acc(k % 8 + 1) * ulp1, k - 32);
      one(random_value<Acc>(rng, -40, 40), b);
      one(std::ldexp(Acc(1), t % 80 - 40), b);
    }
  }
  char what[128];
  std::snprintf(what, sizeof(what), "div_rn_with<%s> (device division) == a / b", name);
  report(what, bad, total);
  // div_count_with: divisors >= 1 (up to 2^120), any numerator
  bad = total = 0;
  std::uniform_int_distribution<int> e(0, 120);
  auto count = [&](Acc a, Acc nv) {
    const Acc want = a / nv, got = dcnkit::div_count_with(a, nv, rcp);
    if (want != Acc(0) && std::fabs(want) < std::numeric_limits<Acc>::min()) return;
    ++total;
    if (!same(got, want)) {
      if (bad < 5) std::printf("  %s: %a / %a = %a, got %a\n", name, double(a), double(nv), double(want), double(got));
      ++bad;
    }
  };
  for (int i = 0; i < 2000000; ++i) {
    const Acc nv = std::floor(static_cast<Acc>(std::ldexp(double(rng() >> 11) / 9007199254740992.0, e(rng)))) + Acc(1);
    count(random_value<Acc>(rng, emin, emax), nv);
  }
  for (Acc a : specials) count(a, Acc(3));
  count(std::numeric_limits<Acc>::max(), Acc(1));
  count(Acc(3.14159265), Acc(3.141592653589793));
  std::snprintf(what, sizeof(what), "div_count_with<%s> (divisors >= 1) == a / n", name);
  report(what, bad, total);
  std::printf("  (%ld subnormal quotients apart, %ld of them off in the last bit)\n", subnormal, subnormal_bad);
}

template <typename Acc>
void check_index_conversions(const char* name) {
  std::mt19937_64 rng(7);
  long bad = 0, total = 0;
  Acc prev = Acc(0);
  for (int s = 0; s < 63; ++s) {
    for (int i = 0; i < 20000; ++i) {
      const int64_t v = static_cast<int64_t>(rng() >> (1 + s)) - (s > 40 ? int64_t(rng() % 1000) : 0);
      const Acc got = dcnkit::index_to_acc_split<Acc>(v), want = static_cast<Acc>(v);
      ++total;
      // float beyond 2^53: one extra rounding (through double); equal below
      if (!(got == want) && !(sizeof(Acc) == 4 && std::fabs(double(v)) >= 0x1p53)) ++bad;
    }
  }
  // monotone over consecutive indices at the 2^31 / 2^32 / 2^53 boundaries
  const int64_t edges[] = {(int64_t(1) << 31) - 2, (int64_t(1) << 32) - 2, (int64_t(1) << 53) - 2, -(int64_t(1) << 31) - 2};
  for (int64_t e : edges) {
    prev = dcnkit::index_to_acc_split<Acc>(e);
    for (int64_t v = e + 1; v < e + 5; ++v) {
      const Acc x = dcnkit::index_to_acc_split<Acc>(v);
      ++total;
      bad += x < prev;
      prev = x;
    }
  }
  char what[128];
  std::snprintf(what, sizeof(what), "index_to_acc_split<%s> == static_cast, monotone", name);
  report(what, bad, total);
  bad = total = 0;
  for (int s = 2; s < 62; ++s) {
    for (int i = 0; i < 20000; ++i) {
      const Acc v = std::floor(static_cast<Acc>(std::ldexp(double(rng() >> 11) / 9007199254740992.0, s)));
      ++total;
      bad += dcnkit::acc_to_index_split(v) != static_cast<int64_t>(v);
    }
  }
  std::snprintf(what, sizeof(what), "acc_to_index_split<%s> == static_cast<int64_t>", name);
  report(what, bad, total);
}

// Issue 47: the deterministic gather of roi_align_rotated read grad_output at (k * C + c0) * bins + ph * ow + pw with
// ph * ow in int32: wrong past 2^31 bins. rotated_bin_offset is the offset it reads now; checked against the offset in
// exact (unsigned 128-bit) arithmetic over a logical shape of 2^17 x 2^17 bins per map, never allocated.
void check_rotated_offsets() {
  const int64_t K = 3, C = 5, oh = int64_t(1) << 17, ow = (int64_t(1) << 17) - 1, bins = oh * ow;
  long bad = 0, total = 0;
  std::mt19937_64 rng(11);
  for (int i = 0; i < 100000; ++i) {
    const int64_t k = rng() % K, c0 = rng() % C;
    const int32_t ph = static_cast<int32_t>(rng() % oh), pw = static_cast<int32_t>(rng() % ow);
    const unsigned __int128 want = (static_cast<unsigned __int128>(k) * C + c0) * bins +
                                   static_cast<unsigned __int128>(ph) * ow + pw;
    ++total;
    bad += static_cast<unsigned __int128>(dcnkit::rotated_bin_offset(k, C, c0, bins, ph, ow, pw)) != want;
  }
  report("rotated gather's grad_output offset past 2^31 bins (2^34 per map)", bad, total);
}

}  // namespace

int main() {
  check_division<float>("float", -140, 127);
  check_division<double>("double", -1060, 1023);
  check_index_conversions<float>("float");
  check_index_conversions<double>("double");
  check_rotated_offsets();
  std::printf(g_failed ? "FAILED\n" : "all checks passed\n");
  return g_failed;
}
