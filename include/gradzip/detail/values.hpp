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
/// Branch-free (selects only), so decode loops vectorize; subnormals are normalized by one
/// exact float subtraction.
GRADZIP_HOST_DEVICE inline float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t o = static_cast<std::uint32_t>(h & 0x7FFFu) << 13;  // exponent and mantissa
  const std::uint32_t exponent = o & 0x0F800000u;
  const std::uint32_t normal = o + (112u << 23);       // rebias 15 -> 127
  const std::uint32_t special = o + (224u << 23);      // inf and NaN: exponent all ones
  // zero or subnormal: 2^-14 (1 + m / 2^10) - 2^-14 = m x 2^-24, exact
  const std::uint32_t subnormal = bit_cast<std::uint32_t>(bit_cast<float>(o + (113u << 23)) -
                                                          bit_cast<float>(113u << 23));
  std::uint32_t bits = select_bits(exponent == 0, subnormal, normal);
  bits = select_bits(exponent == 0x0F800000u, special, bits);
  return bit_cast<float>(sign | bits);
}

GRADZIP_HOST_DEVICE inline float bf16_bits_to_float(std::uint16_t b) {
  return bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

/// Element j of a values section of wire type U, bit for bit: a typed load on the device, where
/// payloads are 16-byte aligned and sections too (wire::alignment), so that NVPTX does not split
/// it into byte loads; memcpy on the host, where a payload may sit at any address.
template <class U>
GRADZIP_HOST_DEVICE inline U load_word(const std::uint8_t* values, std::uint64_t j) {
  if (GRADZIP_DEVICE_CODE()) return reinterpret_cast<const U*>(values)[j];
  U v;
  std::memcpy(&v, values + j * sizeof(U), sizeof(U));
  return v;
}

/// Element j of a values section of wire type `type`, widened to double.
GRADZIP_HOST_DEVICE inline double load_value(const std::uint8_t* values, element_type type,
                                             std::uint64_t j) {
  switch (type) {
    case element_type::f32:
      return load_word<float>(values, j);
    case element_type::f64:
      return load_word<double>(values, j);
    case element_type::f16:
      return half_bits_to_float(load_word<std::uint16_t>(values, j));
    case element_type::bf16:
      return bf16_bits_to_float(load_word<std::uint16_t>(values, j));
  }
  return 0.0;
}

/// Calls f(std::integral_constant<element_type, type>{}), so that loops inside f see the element
/// type as a constant and switch on it once, not per element. f may be host-only (the host
/// decoder's lambdas): the check is off, or nvcc warns for every such instantiation.
GRADZIP_EXEC_CHECK_DISABLE
template <class F>
GRADZIP_HOST_DEVICE decltype(auto) with_element_type(element_type type, F&& f) {
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
 * then rounded to y's type. The plain addition is add_rn: v is often a product (a decoded code
 * times a scale), which nvcc would otherwise fuse into it.
 */
template <class T>
GRADZIP_HOST_DEVICE inline void accumulate(T& y, double v, float alpha) {
  if constexpr (std::is_same_v<T, double>) {
    y = alpha == 1.0f ? add_rn(y, v) : fma(static_cast<double>(alpha), v, y);
  } else {
    const float yf = to_float(y);
    const float vf = static_cast<float>(v);
    y = from_double<T>(alpha == 1.0f ? add_rn(yf, vf) : fmaf(alpha, vf, yf));
  }
}

}  // namespace gradzip::detail
