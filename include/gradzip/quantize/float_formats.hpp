/**
 * @file float_formats.hpp
 * @brief Exact float <-> fp16 / bf16 bit conversions, identical in host and device code.
 *
 * gradzip does its own conversions (instead of `__float2half_rn` on one side and a library on
 * the other) so that the host and CUDA executors write the same bytes. Rounding is IEEE
 * round-to-nearest-even; checked against CUDA's conversions in tests/host/test_cast.cpp.
 *
 * | to   | overflow                     | NaN                                  | subnormals |
 * |------|------------------------------|--------------------------------------|------------|
 * | fp16 | >= 65520 in magnitude -> inf | quiet NaN `0x7E00` with the sign     | kept       |
 * | bf16 | rounds to inf (IEEE)         | quiet NaN: top 16 bits, quiet bit set | kept       |
 */
#pragma once

#include <cstdint>

#include "gradzip/core/element_type.hpp"

namespace gradzip::quantize {

/// float -> IEEE binary16 bits, round to nearest even.
GRADZIP_HOST_DEVICE inline std::uint16_t float_to_half_bits(float f) {
  const std::uint32_t x = detail::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u);  // NaN
  if (a >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 65520: inf
  if (a >= 0x38800000u) {  // normal in half: rebias the exponent (127 -> 15), round 13 bits
    std::uint32_t h = (a - 0x38000000u) >> 13;
    const std::uint32_t rest = a & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  if (a <= 0x33000000u) return static_cast<std::uint16_t>(sign);  // <= 2^-25: rounds to zero
  // Subnormal half: value / 2^-24 = mantissa * 2^(e - 126), shifted right by 126 - e in [14, 24].
  const std::uint32_t e = a >> 23;
  const std::uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const std::uint32_t shift = 126u - e;
  std::uint32_t h = m >> shift;
  const std::uint32_t rest = m & ((1u << shift) - 1u);
  const std::uint32_t halfway = 1u << (shift - 1u);
  if (rest > halfway || (rest == halfway && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

/// float -> bfloat16 bits, round to nearest even.
GRADZIP_HOST_DEVICE inline std::uint16_t float_to_bf16_bits(float f) {
  const std::uint32_t x = detail::bit_cast<std::uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  const std::uint32_t rounded = x + 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

}  // namespace gradzip::quantize
