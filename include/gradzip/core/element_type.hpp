/**
 * @file element_type.hpp
 * @brief The gradient element types gradzip understands, and their wire codes.
 *
 * | type             | `element_type` | wire code | available                         |
 * |------------------|----------------|-----------|-----------------------------------|
 * | `float`          | `f32`          | 1         | always                            |
 * | `double`         | `f64`          | 2         | always                            |
 * | `__half`         | `f16`          | 3         | when `<cuda_fp16.h>` is reachable |
 * | `__nv_bfloat16`  | `bf16`         | 4         | when `<cuda_bf16.h>` is reachable |
 *
 * A `.cpp` compiled by g++/clang++ gets the last two by having the CUDA toolkit's include
 * directory on its path (`GRADZIP_HAS_HALF` is then 1).
 *
 * `magnitude_key(x)` maps |x| to an unsigned integer whose order is the order of |x|, with every
 * NaN mapped to the largest key (NaN ranks above +inf): top-k selection works on these keys.
 */
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gradzip/core/config.hpp"

#if defined(__has_include)
#if __has_include(<cuda_fp16.h>) && __has_include(<cuda_bf16.h>)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define GRADZIP_HAS_HALF 1
#endif
#endif
#ifndef GRADZIP_HAS_HALF
#define GRADZIP_HAS_HALF 0
#endif

namespace gradzip {

enum class element_type : std::uint8_t { f32 = 1, f64 = 2, f16 = 3, bf16 = 4 };

/// Bytes per element of a wire element type; 0 for a code that names no type.
GRADZIP_HOST_DEVICE constexpr std::size_t element_size(element_type t) noexcept {
  switch (t) {
    case element_type::f32: return 4;
    case element_type::f64: return 8;
    case element_type::f16: return 2;
    case element_type::bf16: return 2;
  }
  return 0;
}

GRADZIP_HOST_DEVICE constexpr bool is_known_element_type(std::uint8_t code) noexcept {
  return code >= 1 && code <= 4;
}

inline const char* element_type_name(element_type t) noexcept {
  switch (t) {
    case element_type::f32: return "f32";
    case element_type::f64: return "f64";
    case element_type::f16: return "f16";
    case element_type::bf16: return "bf16";
  }
  return "unknown";
}

/// element_traits<T>: the wire code of T and the unsigned key type used to rank |x|.
template <class T>
struct element_traits;

template <>
struct element_traits<float> {
  static constexpr element_type type = element_type::f32;
  using key_type = std::uint32_t;
};

template <>
struct element_traits<double> {
  static constexpr element_type type = element_type::f64;
  using key_type = std::uint64_t;
};

#if GRADZIP_HAS_HALF
template <>
struct element_traits<__half> {
  static constexpr element_type type = element_type::f16;
  using key_type = std::uint32_t;  // ranked through its exact float value
};

template <>
struct element_traits<__nv_bfloat16> {
  static constexpr element_type type = element_type::bf16;
  using key_type = std::uint32_t;
};
#endif

template <class T, class = void>
struct is_element : std::false_type {};
template <class T>
struct is_element<T, std::void_t<decltype(element_traits<T>::type)>> : std::true_type {};
template <class T>
inline constexpr bool is_element_v = is_element<T>::value;

template <class T>
using key_type_t = typename element_traits<T>::key_type;

namespace detail {

/// `pick ? a : b` through a bit mask. Conversion loops select with it: compilers turn `?:` into
/// branches there, and a loop with branches does not vectorize.
GRADZIP_HOST_DEVICE constexpr std::uint32_t select_bits(bool pick, std::uint32_t a, std::uint32_t b) noexcept {
  const std::uint32_t mask = 0u - static_cast<std::uint32_t>(pick);
  return (a & mask) | (b & ~mask);
}

/// Bit copy of a trivially copyable value (a portable, device-safe bit_cast).
template <class To, class From>
GRADZIP_HOST_DEVICE inline To bit_cast(const From& from) noexcept {
  static_assert(sizeof(To) == sizeof(From), "bit_cast needs equal sizes");
  To to;
  std::memcpy(static_cast<void*>(&to), static_cast<const void*>(&from), sizeof(To));
  return to;
}

}  // namespace detail

/// Whether a float is finite (neither inf nor NaN), by its bits: the same test on every executor.
GRADZIP_HOST_DEVICE inline bool is_finite(float x) noexcept {
  return (detail::bit_cast<std::uint32_t>(x) & 0x7F800000u) != 0x7F800000u;
}

/// The value of x widened to float (double stays double).
GRADZIP_HOST_DEVICE inline float to_float(float x) noexcept { return x; }
GRADZIP_HOST_DEVICE inline double to_float(double x) noexcept { return x; }
#if GRADZIP_HAS_HALF
GRADZIP_HOST_DEVICE inline float to_float(__half x) noexcept { return __half2float(x); }
/// bf16 is the top half of a float, so the host widens it by a shift: CUDA's host-side
/// __bfloat162float is a call per element that keeps loops over bf16 tensors scalar.
GRADZIP_HOST_DEVICE inline float to_float(__nv_bfloat16 x) noexcept {
#if defined(__CUDA_ARCH__)
  return __bfloat162float(x);
#else
  return detail::bit_cast<float>(static_cast<std::uint32_t>(detail::bit_cast<std::uint16_t>(x)) << 16);
#endif
}
#endif

/// Converts a float or double to T with round-to-nearest-even.
template <class T>
GRADZIP_HOST_DEVICE inline T from_double(double x) noexcept {
  if constexpr (std::is_same_v<T, double>) {
    return x;
  } else if constexpr (std::is_same_v<T, float>) {
    return static_cast<float>(x);
#if GRADZIP_HAS_HALF
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(static_cast<float>(x));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(x));
#endif
  } else {
    static_assert(is_element_v<T>, "from_double: not a gradzip element type");
  }
}

/**
 * The rank key of |x|: larger |x| gives a larger key, +0 and -0 give the same key, and every NaN
 * gives the largest key of all (above +inf). Used by top-k; ties on the key break by index.
 */
GRADZIP_HOST_DEVICE inline std::uint32_t magnitude_key(float x) noexcept {
  // Signed arithmetic on purpose: with the sign bit cleared the order is the same, and SSE2
  // vectorizes signed compares (it has no unsigned 32-bit compare).
  const std::int32_t bits = detail::bit_cast<std::int32_t>(x) & 0x7FFFFFFF;
  return static_cast<std::uint32_t>(bits > 0x7F800000 ? 0x7FFFFFFF : bits);
}

GRADZIP_HOST_DEVICE inline std::uint64_t magnitude_key(double x) noexcept {
  const std::uint64_t bits = detail::bit_cast<std::uint64_t>(x) & 0x7FFFFFFFFFFFFFFFull;
  return bits > 0x7FF0000000000000ull ? 0x7FFFFFFFFFFFFFFFull : bits;
}

#if GRADZIP_HAS_HALF
GRADZIP_HOST_DEVICE inline std::uint32_t magnitude_key(__half x) noexcept {
  return magnitude_key(__half2float(x));
}
GRADZIP_HOST_DEVICE inline std::uint32_t magnitude_key(__nv_bfloat16 x) noexcept {
  return magnitude_key(__bfloat162float(x));
}
#endif

/// Significant bits of a magnitude key (the sign bit is always clear).
template <class Key>
inline constexpr int magnitude_key_bits = static_cast<int>(sizeof(Key) * 8 - 1);

}  // namespace gradzip
