/**
 * @file fixed_point.hpp
 * @brief `detail::fixed_point`: exact, order-free sums of floats, each rounded once to a
 * multiple of a unit set by the largest magnitude and rounded once back to fp32 (the Count
 * Sketch's cells, sketch/count_sketch.hpp).
 *
 * For floats v_0 .. v_{n-1} whose largest finite magnitude M lies in [2^E, 2^(E+1)), the unit
 * is 2^(E - p) with p = min(30, 61 - bit_width(n)) bits of precision below M:
 * - each value becomes q = round_half_even(v / unit), an integer with |q| <= 2^(p+1), and
 *   below 2^31 at p = 30 (v / unit is then an integer from 2^23 up: nothing rounds up to 2^31);
 * - any signed sum of up to n of them is below n 2^(p+1) < 2^62 in magnitude, so 64-bit
 *   integer sums are exact, and equal in whatever order (threads, GPU atomics) they are taken;
 * - a sum s becomes the fp32 nearest to s x unit (ties to even, subnormals and overflow to
 *   infinity included), by integer operations only, so every executor gives the same bits.
 * v / unit is exact in double (a float times a power of two in [2^-127, 2^179]), and every
 * executor rounds it with the hardware's round-to-nearest-even conversion.
 */
#pragma once

#include <cmath>
#include <cstdint>

#include "gradzip/core/config.hpp"
#include "gradzip/core/element_type.hpp"

namespace gradzip::detail {

struct fixed_point {
  /// Bits of precision below the largest magnitude, when n allows (see the file comment).
  static constexpr int max_precision = 30;
  /// The largest n the unit is defined for (p >= 0): 2^61 - 1.
  static constexpr std::uint64_t max_count = (std::uint64_t{1} << 61) - 1;
  /// |v| bits at or above this are infinities and NaNs: they have no fixed point.
  static constexpr std::uint32_t non_finite_bits = 0x7F800000u;

  /// log2 of the unit.
  int unit_exponent = 0;

  GRADZIP_HOST_DEVICE static int bit_width(std::uint64_t v) {
    int w = 0;
    for (; v != 0; v >>= 1) ++w;
    return w;
  }
  /// p = min(30, 61 - bit_width(n)) for n <= max_count.
  GRADZIP_HOST_DEVICE static int precision(std::uint64_t n) {
    const int room = 61 - bit_width(n);
    return room < max_precision ? room : max_precision;
  }
  /// |v|'s bits if v is finite, else 0: the magnitude pass takes the max of these.
  GRADZIP_HOST_DEVICE static std::uint32_t finite_magnitude(float v) {
    const std::uint32_t a = bit_cast<std::uint32_t>(v) & 0x7FFFFFFFu;
    return a < non_finite_bits ? a : 0u;
  }

  /// The unit for n values whose largest finite magnitude has the bits `max_bits` (all zero:
  /// unit 1, and every value's fixed point is 0).
  GRADZIP_HOST_DEVICE static fixed_point for_values(std::uint32_t max_bits, std::uint64_t n) {
    if (max_bits == 0) return fixed_point{0};
    const int biased = static_cast<int>(max_bits >> 23);
    // E = floor(log2 M); a subnormal M's leading bit sits below the implicit one.
    const int e = biased != 0 ? biased - 127 : bit_width(max_bits) - 1 - 149;
    return fixed_point{e - precision(n)};
  }

  /// 1 / unit, exactly.
  GRADZIP_HOST_DEVICE double inverse_unit() const {
    return bit_cast<double>(static_cast<std::uint64_t>(1023 - unit_exponent) << 52);
  }
  /// round_half_even(v / unit) for a finite v no larger in magnitude than the values' maximum.
  GRADZIP_HOST_DEVICE std::int32_t to_fixed(float v) const {
    const double scaled = static_cast<double>(v) * inverse_unit();
#if defined(__CUDA_ARCH__)
    return __double2int_rn(scaled);
#else
    return static_cast<std::int32_t>(std::nearbyint(scaled));
#endif
  }

  /// The fp32 nearest to s x unit, ties to even.
  GRADZIP_HOST_DEVICE float to_float(std::int64_t s) const {
    if (s == 0) return 0.0f;
    const std::uint32_t sign = s < 0 ? 0x80000000u : 0u;
    const std::uint64_t m = s < 0 ? std::uint64_t{0} - static_cast<std::uint64_t>(s) : static_cast<std::uint64_t>(s);
    // m 2^unit lies in [2^e, 2^(e+1)); fp32 keeps it in steps of 2^ulp there (2^-149 below
    // the normal range).
    const int e = bit_width(m) - 1 + unit_exponent;
    const int ulp = e - 23 > -149 ? e - 23 : -149;
    const int shift = ulp - unit_exponent;
    const std::uint64_t steps = shift <= 0 ? m << -shift : shift >= 64 ? 0 : round_shift(m, shift);
    // steps in [2^23, 2^24] for a normal result (2^24: rounding carried into the next binade),
    // below 2^23 for a subnormal one; adding them to the exponent field places both.
    const std::uint64_t bits = (static_cast<std::uint64_t>(ulp + 149) << 23) + steps;
    return bit_cast<float>(sign | (bits < non_finite_bits ? static_cast<std::uint32_t>(bits) : non_finite_bits));
  }

 private:
  /// round_half_even(m / 2^shift) for 0 < shift < 64 (m <= 2^63, so shift 64 and above give 0).
  GRADZIP_HOST_DEVICE static std::uint64_t round_shift(std::uint64_t m, int shift) {
    const std::uint64_t kept = m >> shift, rest = m & ((std::uint64_t{1} << shift) - 1);
    const std::uint64_t half = std::uint64_t{1} << (shift - 1);
    return kept + ((rest > half || (rest == half && (kept & 1) != 0)) ? 1 : 0);
  }
};

}  // namespace gradzip::detail
