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

/// float -> IEEE binary16 bits, round to nearest even. Branch-free (selects only), so loops
/// over it vectorize: normals round by integer arithmetic on the bits; half subnormals come
/// from one float addition of 0.5, whose ulp (2^-24) is the half subnormal step, so the FPU's
/// own round-to-nearest-even does the rounding (the construction of F. Giesen's
/// float_to_half_fast3).
GRADZIP_HOST_DEVICE inline std::uint16_t float_to_half_bits(float f) {
  const std::uint32_t x = detail::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t a = x & 0x7FFFFFFFu;
  // Normal half: rebias the exponent (127 -> 15), add just under half an ulp plus the odd bit.
  const std::uint32_t normal = (a - 0x38000000u + 0x0FFFu + ((a >> 13) & 1u)) >> 13;
  const std::uint32_t subnormal =
      detail::bit_cast<std::uint32_t>(detail::bit_cast<float>(a) + 0.5f) - 0x3F000000u;
  std::uint32_t h = detail::select_bits(a < 0x38800000u, subnormal, normal);
  h = detail::select_bits(a >= 0x477FF000u, 0x7C00u, h);  // >= 65520 (and inf): inf
  h = detail::select_bits(a > 0x7F800000u, 0x7E00u, h);   // NaN: quiet NaN
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
  constexpr std::uint32_t drop = 23 - mantissa_bits;            // float mantissa bits rounded away
  constexpr std::uint32_t min_normal = (127 - bias + 1) << 23;  // float bits of 2^(1 - bias)
  // A float whose ulp is the target's subnormal step 2^(1 - bias - M): adding it rounds there.
  constexpr std::uint32_t magic = (127 + 1 - bias - mantissa_bits + 23) << 23;
  const std::uint32_t x = bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 24) & 0x80u;
  const std::uint32_t a = x & 0x7FFFFFFFu;
  const std::uint32_t normal =
      (a - ((127 - bias) << 23) + ((1u << (drop - 1)) - 1u) + ((a >> drop) & 1u)) >> drop;
  const std::uint32_t subnormal = bit_cast<std::uint32_t>(bit_cast<float>(a) + bit_cast<float>(magic)) - magic;
  std::uint32_t h = select_bits(a < min_normal, subnormal, normal);
  h = select_bits(h > MaxFinite, MaxFinite, h);  // saturate finite values
  h = select_bits(a == 0x7F800000u, InfBits, h);
  h = select_bits(a > 0x7F800000u, 0x7Fu, h);  // NaN
  return static_cast<std::uint8_t>(sign | h);
}

/// An 8-bit float's bits -> float, exactly.
template <int ExponentBits, bool HasInf>
GRADZIP_HOST_DEVICE inline float fp8_bits_to_float(std::uint8_t b) {
  constexpr int mantissa_bits = 7 - ExponentBits;
  constexpr std::uint32_t bias = (1u << (ExponentBits - 1)) - 1;
  constexpr std::uint32_t magic = (127 - bias + 1) << 23;  // 2^(1 - bias), the smallest normal
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  const std::uint32_t o = static_cast<std::uint32_t>(b & 0x7Fu) << (23 - mantissa_bits);
  const std::uint32_t normal = o + ((127 - bias) << 23);
  // Subnormal: 2^(1-bias) (1 + m / 2^M) - 2^(1-bias) = m 2^(1-bias-M), exact.
  const std::uint32_t subnormal = bit_cast<std::uint32_t>(bit_cast<float>(o + magic) - bit_cast<float>(magic));
  constexpr std::uint32_t all_ones = 0x7Fu << (23 - mantissa_bits);  // exponent and mantissa set
  constexpr std::uint32_t exponent_ones = ((1u << ExponentBits) - 1u) << 23;
  std::uint32_t bits = select_bits(o < (1u << 23), subnormal, normal);
  if constexpr (HasInf) {  // e5m2: exponent all ones is inf (mantissa 0) or NaN
    bits = select_bits(o >= exponent_ones, select_bits(o == exponent_ones, 0x7F800000u, 0x7FC00000u), bits);
  } else {  // e4m3: only S.1111.111 is NaN
    bits = select_bits(o == all_ones, 0x7FC00000u, bits);
  }
  return bit_cast<float>(sign | bits);
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
