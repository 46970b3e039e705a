/**
 * @file none.hpp
 * @brief `quantize::none`: the values stage that sends values unchanged, in the input's type.
 *
 * Bytes per value: sizeof(T), where T is the tensor's element type (the header's element
 * type). Exact: decoding gives back the very bits that were selected. Summable when the
 * structure stage is (a dense payload of a sum is the sum of dense payloads, up to rounding).
 */
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>

#include "gradzip/detail/values.hpp"
#include "gradzip/wire/format.hpp"

namespace gradzip::quantize {

struct none {
  static constexpr std::uint8_t id = 0;
  static constexpr bool summable = true;
  static constexpr std::uint64_t param_bytes = 0;

  GRADZIP_HOST_DEVICE static void write_params(std::uint8_t*) {}
  GRADZIP_HOST_DEVICE static wire::status check_params(const std::uint8_t*, std::uint64_t) { return {}; }

  /// Summing payloads sums their values sections as arrays of the input's type.
  static constexpr std::optional<element_type> summed_as(element_type input) { return input; }

  /// Bytes of the values section for `count` values of a tensor of element type `type`.
  GRADZIP_HOST_DEVICE static std::uint64_t value_size(element_type type) { return element_size(type); }

  template <class T>
  GRADZIP_HOST_DEVICE static void store(std::uint8_t* section, std::uint64_t pos, T value) {
    if (GRADZIP_DEVICE_CODE()) {  // device payloads are 16-byte aligned: typed stores
      reinterpret_cast<T*>(section)[pos] = value;
    } else {
      std::memcpy(section + pos * sizeof(T), &value, sizeof(T));
    }
  }

  GRADZIP_HOST_DEVICE static double load(const std::uint8_t* section, element_type type,
                                         std::uint64_t pos) {
    return detail::load_value(section, type, pos);
  }
};

}  // namespace gradzip::quantize
