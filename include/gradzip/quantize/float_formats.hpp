/**
 * @file float_formats.hpp
 * @brief Exact float <-> fp16 / bf16 / fp8 bit conversions, identical in host and device code.
 *
 * gradzip does its own conversions (instead of `__float2half_rn` on one side and a library on
 * the other) so that the host and CUDA executors write the same bytes. Rounding is IEEE
 * round-to-nearest-even; checked against CUDA's conversions in tests/host/test_cast.cpp.
 *
 * | to   | overflow                     | NaN                                  | subnormals |
 * |------|------------------------------|--------------------------------------|------------|
 * | fp16 | >= 65520 in magnitude -> inf | quiet NaN `0x7E00` with the sign     | kept       |
 * | bf16 | rounds to inf (IEEE)         | quiet NaN: top 16 bits, quiet bit set | kept       |
 * | fp8 e4m3 | saturates to ±448; ±inf -> NaN (e4m3 has no inf) | `0x7F` with the sign | kept |
 * | fp8 e5m2 | saturates to ±57344; ±inf stays ±inf | `0x7F` with the sign         | kept       |
 *
 * fp8 follows the OCP 8-bit floating point specification (v1.0, 2023): e4m3 has bias 7, no
 * infinities and one NaN pattern per sign (S.1111.111); e5m2 has bias 15 and IEEE inf and NaN.
 * Finite values saturate (CUDA's `__NV_SATFINITE`, PTX `cvt.rn.satfinite`) because a gradient
 * that overflows fp8 should arrive as the largest finite value, not as NaN; a value that was
 * already infinite stays visible (inf in e5m2, NaN in e4m3).
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

namespace gradzip::detail {
/// float -> an 8-bit float with `ExponentBits` exponent bits (bias 2^(E-1) - 1), the rest
/// mantissa, round to nearest even, finite values saturating to `max_finite`.
template <int ExponentBits, std::uint32_t MaxFinite, std::uint32_t InfBits>
GRADZIP_HOST_DEVICE inline std::uint8_t float_to_fp8_bits(float f) {
  constexpr int mantissa_bits = 7 - ExponentBits;
  constexpr std::uint32_t bias = (1u << (ExponentBits - 1)) - 1;
  constexpr std::uint32_t drop = 23 - mantissa_bits;   // float mantissa bits rounded away
  constexpr std::uint32_t min_normal = (127 - bias + 1) << 23;  // float bits of 2^(1 - bias)
  const std::uint32_t x = gradzip::detail::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 24) & 0x80u;
  const std::uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint8_t>(sign | 0x7Fu);       // NaN
  if (a == 0x7F800000u) return static_cast<std::uint8_t>(sign | InfBits);    // inf
  std::uint32_t h;
  if (a >= min_normal) {  // normal: rebias the exponent, round the mantissa
    h = (a - ((127 - bias) << 23)) >> drop;
    const std::uint32_t rest = a & ((1u << drop) - 1u);
    const std::uint32_t halfway = 1u << (drop - 1);
    if (rest > halfway || (rest == halfway && (h & 1u))) ++h;
  } else {  // subnormal target: value / 2^(1 - bias - M), shifted by (127 - bias - e) + drop
    const std::uint32_t e = a >> 23;
    const std::uint32_t shift = (127 - bias) - e + drop + 1 - (e == 0 ? 1 : 0);
    if (shift > 31) return static_cast<std::uint8_t>(sign);  // far below half the smallest step
    const std::uint32_t m = e == 0 ? (a & 0x7FFFFFu) : ((a & 0x7FFFFFu) | 0x800000u);
    h = m >> shift;
    const std::uint32_t rest = m & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (h & 1u))) ++h;
  }
  if (h > MaxFinite) h = MaxFinite;  // saturate finite values
  return static_cast<std::uint8_t>(sign | h);
}

/// An 8-bit float's bits -> float, exactly.
template <int ExponentBits, bool HasInf>
GRADZIP_HOST_DEVICE inline float fp8_bits_to_float(std::uint8_t b) {
  constexpr int mantissa_bits = 7 - ExponentBits;
  constexpr std::uint32_t bias = (1u << (ExponentBits - 1)) - 1;
  constexpr std::uint32_t exponent_mask = (1u << ExponentBits) - 1;
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  const std::uint32_t exponent = (b >> mantissa_bits) & exponent_mask;
  const std::uint32_t mantissa = b & ((1u << mantissa_bits) - 1u);
  std::uint32_t bits;
  if (exponent == exponent_mask && (HasInf || mantissa == (1u << mantissa_bits) - 1u)) {
    bits = sign | 0x7F800000u | (HasInf && mantissa == 0 ? 0u : 0x400000u);  // inf or NaN
  } else if (exponent == 0) {  // zero or subnormal: mantissa x 2^(1 - bias - M), exact in float
    const float magnitude = static_cast<float>(mantissa) *
                            gradzip::detail::bit_cast<float>((127 + 1 - bias - mantissa_bits) << 23);
    bits = gradzip::detail::bit_cast<std::uint32_t>(magnitude) | sign;
  } else {
    bits = sign | ((exponent + 127 - bias) << 23) | (mantissa << (23 - mantissa_bits));
  }
  return gradzip::detail::bit_cast<float>(bits);
}
}  // namespace gradzip::detail

namespace gradzip::quantize {

/// float -> fp8 e4m3 (OCP), round to nearest even, saturating to ±448; inf -> NaN.
GRADZIP_HOST_DEVICE inline std::uint8_t float_to_e4m3_bits(float f) {
  return detail::float_to_fp8_bits<4, 0x7Eu, 0x7Fu>(f);
}
/// float -> fp8 e5m2 (OCP), round to nearest even, saturating to ±57344; inf stays inf.
GRADZIP_HOST_DEVICE inline std::uint8_t float_to_e5m2_bits(float f) {
  return detail::float_to_fp8_bits<5, 0x7Bu, 0x7Cu>(f);
}
GRADZIP_HOST_DEVICE inline float e4m3_bits_to_float(std::uint8_t b) { return detail::fp8_bits_to_float<4, false>(b); }
GRADZIP_HOST_DEVICE inline float e5m2_bits_to_float(std::uint8_t b) { return detail::fp8_bits_to_float<5, true>(b); }

}  // namespace gradzip::quantize
