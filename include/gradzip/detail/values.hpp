// Loading payload values of any wire element type and accumulating them into any tensor type,
// identically on host and device.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gradzip/core/element_type.hpp"

namespace gradzip::detail {

/// IEEE binary16 bits to float, exactly (subnormals, inf and NaN included).
GRADZIP_HOST_DEVICE inline float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1Fu;
  const std::uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0) {  // zero or subnormal: mantissa x 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return bit_cast<float>(bit_cast<std::uint32_t>(magnitude) | sign);
  }
  const std::uint32_t bits = exponent == 0x1F ? (sign | 0x7F800000u | (mantissa << 13))
                                              : (sign | ((exponent + 112) << 23) | (mantissa << 13));
  return bit_cast<float>(bits);
}

GRADZIP_HOST_DEVICE inline float bf16_bits_to_float(std::uint16_t b) {
  return bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

/// Element j of a values section of wire type `type`, widened to double.
GRADZIP_HOST_DEVICE inline double load_value(const std::uint8_t* values, element_type type,
                                             std::uint64_t j) {
  switch (type) {
    case element_type::f32: {
      float v;
      std::memcpy(&v, values + j * 4, 4);
      return v;
    }
    case element_type::f64: {
      double v;
      std::memcpy(&v, values + j * 8, 8);
      return v;
    }
    case element_type::f16: {
      std::uint16_t v;
      std::memcpy(&v, values + j * 2, 2);
      return half_bits_to_float(v);
    }
    case element_type::bf16: {
      std::uint16_t v;
      std::memcpy(&v, values + j * 2, 2);
      return bf16_bits_to_float(v);
    }
  }
  return 0.0;
}

/// Calls f(std::integral_constant<element_type, type>{}), so that loops inside f see the element
/// type as a constant and switch on it once, not per element.
template <class F>
decltype(auto) with_element_type(element_type type, F&& f) {
  switch (type) {
    case element_type::f64: return f(std::integral_constant<element_type, element_type::f64>{});
    case element_type::f16: return f(std::integral_constant<element_type, element_type::f16>{});
    case element_type::bf16: return f(std::integral_constant<element_type, element_type::bf16>{});
    case element_type::f32: break;
  }
  return f(std::integral_constant<element_type, element_type::f32>{});
}

/**
 * y <- y + alpha * v with one rounding per step that both executors share: plain addition when
 * alpha is 1, else a fused multiply-add (fma), in double when y is double, in float otherwise,
 * then rounded to y's type.
 */
template <class T>
GRADZIP_HOST_DEVICE inline void accumulate(T& y, double v, float alpha) {
  if constexpr (std::is_same_v<T, double>) {
    y = alpha == 1.0f ? y + v : fma(static_cast<double>(alpha), v, y);
  } else {
    const float yf = to_float(y);
    const float vf = static_cast<float>(v);
    y = from_double<T>(alpha == 1.0f ? yf + vf : fmaf(alpha, vf, yf));
  }
}

}  // namespace gradzip::detail
