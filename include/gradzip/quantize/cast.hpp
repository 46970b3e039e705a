/**
 * @file cast.hpp
 * @brief `quantize::cast<Target>`: values sent as fp16 or bf16, rounded to nearest even.
 *
 * Each value v becomes round_to_nearest_even(v) in the target format (double inputs are first
 * rounded to float). Decoding widens it back exactly. Bytes per value: 2. Deterministic (no
 * randomness) and summable: the sum of cast payloads, decoded, is the decoded sum up to one
 * rounding, so casts may be allreduced (issue 6's collective helpers rely on it).
 *
 * | target      | relative error       | range                       | overflow / NaN |
 * |-------------|----------------------|-----------------------------|----------------|
 * | `cast<f16>` | <= 2^-11 (normals)   | 6.1e-5 .. 65504, subnormals to 6e-8 | >= 65520 -> inf; NaN -> 0x7E00 |
 * | `cast<bf16>`| <= 2^-8              | float's range               | IEEE; NaN stays NaN |
 *
 * Bit-exact conversions live in `float_formats.hpp` and run identically on host and device.
 *
 * @code
 * gradzip::codec<gradzip::sparsify::none, gradzip::quantize::cast<gradzip::element_type::bf16>,
 *                gradzip::encode::none> dense_bf16;
 * gradzip::codec<gradzip::sparsify::topk, gradzip::quantize::cast<gradzip::element_type::f16>>
 *     topk_fp16_values{gradzip::sparsify::topk::ratio(0.01)};
 * @endcode
 */
#pragma once

#include <cstdint>
#include <cstring>

#include "gradzip/detail/values.hpp"
#include "gradzip/quantize/float_formats.hpp"
#include "gradzip/wire/format.hpp"

namespace gradzip::quantize {

template <element_type Target>
struct cast {
  static_assert(Target == element_type::f16 || Target == element_type::bf16,
                "quantize::cast: the target must be element_type::f16 or element_type::bf16");
  static constexpr std::uint8_t id = 1;
  static constexpr bool summable = true;
  /// Params: the target's element-type code, then 7 zero bytes.
  static constexpr std::uint64_t param_bytes = 8;

  GRADZIP_HOST_DEVICE static void write_params(std::uint8_t* p) {
    p[0] = static_cast<std::uint8_t>(Target);
  }

  /// `at`: the parameters' offset in the payload, for the error message.
  GRADZIP_HOST_DEVICE static wire::status check_params(const std::uint8_t* p, std::uint64_t at) {
    if (p[0] != static_cast<std::uint8_t>(Target)) return wire::fail(wire::format_errc::bad_params, at, p[0]);
    for (int i = 1; i < 8; ++i) {
      if (p[i] != 0) return wire::fail(wire::format_errc::nonzero_reserved, at + i);
    }
    return {};
  }

  GRADZIP_HOST_DEVICE static std::uint64_t value_size(element_type) { return 2; }

  template <class T>
  GRADZIP_HOST_DEVICE static void store(std::uint8_t* section, std::uint64_t pos, T value) {
    const float f = static_cast<float>(to_float(value));
    const std::uint16_t bits =
        Target == element_type::f16 ? float_to_half_bits(f) : float_to_bf16_bits(f);
#if defined(__CUDA_ARCH__)
    reinterpret_cast<std::uint16_t*>(section)[pos] = bits;
#else
    std::memcpy(section + pos * 2, &bits, 2);
#endif
  }

  GRADZIP_HOST_DEVICE static double load(const std::uint8_t* section, element_type,
                                         std::uint64_t pos) {
    return detail::load_value(section, Target, pos);
  }
};

using cast_fp16 = cast<element_type::f16>;
using cast_bf16 = cast<element_type::bf16>;

}  // namespace gradzip::quantize
