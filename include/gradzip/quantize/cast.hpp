/**
 * @file cast.hpp
 * @brief `quantize::cast<Format>`: values sent as fp16, bf16, fp8 e4m3 or fp8 e5m2, rounded to
 * nearest even.
 *
 * Each value v becomes round_to_nearest_even(v) in the target format (double inputs are first
 * rounded to float). Decoding widens it back exactly. Deterministic (no randomness) and
 * summable: the sum of cast payloads, decoded, is the decoded sum up to one rounding, so casts
 * may be allreduced (issue 6's collective helpers rely on it).
 *
 * | format              | bytes | relative error     | largest finite | overflow / inf / NaN |
 * |---------------------|-------|--------------------|----------------|----------------------|
 * | `cast_fp16`         | 2     | <= 2^-11 (normals) | 65504          | >= 65520 -> inf; NaN -> 0x7E00 |
 * | `cast_bf16`         | 2     | <= 2^-8            | 3.39e38        | >= 3.3962e38 -> inf (IEEE); NaN stays NaN |
 * | `cast_fp8_e4m3`     | 1     | <= 2^-4 (normals, >= 2^-6) | 448    | saturates to ±448; inf -> NaN; NaN -> 0x7F |
 * | `cast_fp8_e5m2`     | 1     | <= 2^-3 (normals, >= 2^-14) | 57344 | saturates to ±57344; inf stays inf; NaN -> 0x7F |
 *
 * fp8 has little range: scale gradients into it first (e4m3 keeps 3 mantissa bits between
 * 2^-6 and 448, e5m2 2 bits between 2^-14 and 57344; smaller values lose precision as
 * subnormals, down to 2^-9 and 2^-16). Bit-exact conversions live in `float_formats.hpp` and
 * run identically on host and device.
 *
 * @code
 * gradzip::codec<gradzip::sparsify::none, gradzip::quantize::cast_bf16, gradzip::encode::none> dense_bf16;
 * gradzip::codec<gradzip::sparsify::topk, gradzip::quantize::cast_fp8_e4m3>
 *     topk_fp8_values{gradzip::sparsify::topk::ratio(0.01)};
 * @endcode
 */
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>

#include "gradzip/detail/values.hpp"
#include "gradzip/quantize/float_formats.hpp"
#include "gradzip/wire/format.hpp"

namespace gradzip::quantize {

/// The formats a cast can send. The codes are the wire's parameter byte (fp16 and bf16 equal
/// their element_type codes).
enum class cast_format : std::uint8_t { f16 = 3, bf16 = 4, fp8_e4m3 = 5, fp8_e5m2 = 6 };

template <cast_format Format>
struct cast {
  static constexpr std::uint8_t id = 1;
  static constexpr bool summable = true;
  static constexpr bool is_fp8 = Format == cast_format::fp8_e4m3 || Format == cast_format::fp8_e5m2;
  /// Params: the format's code, then 7 zero bytes.
  static constexpr std::uint64_t param_bytes = 8;

  GRADZIP_HOST_DEVICE static void write_params(std::uint8_t* p) {
    p[0] = static_cast<std::uint8_t>(Format);
  }

  /// `at`: the parameters' offset in the payload, for the error message.
  GRADZIP_HOST_DEVICE static wire::status check_params(const std::uint8_t* p, std::uint64_t at) {
    if (p[0] != static_cast<std::uint8_t>(Format)) {
      return wire::fail(wire::format_errc::bad_params, at, p[0], static_cast<std::uint8_t>(Format));
    }
    for (int i = 1; i < 8; ++i) {
      if (p[i] != 0) return wire::fail(wire::format_errc::nonzero_reserved, at + i);
    }
    return {};
  }

  GRADZIP_HOST_DEVICE static constexpr std::uint64_t value_size(element_type) { return is_fp8 ? 1 : 2; }

  /// fp16 and bf16 values sections are arrays a communicator can sum; fp8 ones are not (they
  /// are summed through the gather path).
  static constexpr std::optional<element_type> summed_as(element_type) {
    if constexpr (is_fp8) {
      return std::nullopt;
    } else {
      return static_cast<element_type>(Format);
    }
  }

  /// A value's code on the wire: its fp8 byte, or its fp16 / bf16 bits.
  using code_type = std::conditional_t<is_fp8, std::uint8_t, std::uint16_t>;

  template <class T>
  GRADZIP_HOST_DEVICE static code_type code(T value) {
    const float f = static_cast<float>(to_float(value));
    if constexpr (Format == cast_format::fp8_e4m3) {
      return float_to_e4m3_bits(f);
    } else if constexpr (Format == cast_format::fp8_e5m2) {
      return float_to_e5m2_bits(f);
    } else if constexpr (Format == cast_format::f16) {
      return float_to_half_bits(f);
    } else {
      return float_to_bf16_bits(f);
    }
  }

  template <class T>
  GRADZIP_HOST_DEVICE static void store(std::uint8_t* section, std::uint64_t pos, T value) {
    const code_type bits = code(value);
    if (GRADZIP_DEVICE_CODE()) {  // device payloads are 16-byte aligned: typed stores
      reinterpret_cast<code_type*>(section)[pos] = bits;
    } else {
      std::memcpy(section + pos * sizeof(code_type), &bits, sizeof(code_type));
    }
  }

  GRADZIP_HOST_DEVICE static double load(const std::uint8_t* section, element_type,
                                         std::uint64_t pos) {
    if constexpr (Format == cast_format::fp8_e4m3) {
      return e4m3_bits_to_float(section[pos]);
    } else if constexpr (Format == cast_format::fp8_e5m2) {
      return e5m2_bits_to_float(section[pos]);
    } else {
      return detail::load_value(section, static_cast<element_type>(Format), pos);
    }
  }
};

using cast_fp16 = cast<cast_format::f16>;
using cast_bf16 = cast<cast_format::bf16>;
using cast_fp8_e4m3 = cast<cast_format::fp8_e4m3>;
using cast_fp8_e5m2 = cast<cast_format::fp8_e5m2>;

}  // namespace gradzip::quantize
