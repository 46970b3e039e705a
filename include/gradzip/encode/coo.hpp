/**
 * @file coo.hpp
 * @brief `encode::coo`: indices as a plain little-endian array, u32 when n < 2^32, else u64.
 *
 * The width is recorded in the payload's parameters (one byte, 4 or 8) and the decoder insists
 * on the width this rule gives for the payload's n. Indices are strictly increasing and < n; the
 * decoder checks both before it touches the output.
 *
 * Bytes per selected element: 4 (or 8) for the index, plus the values stage's bytes.
 *
 * @code
 * gradzip::codec<gradzip::sparsify::topk, gradzip::quantize::none, gradzip::encode::coo> c;
 * @endcode
 */
#pragma once

#include <cstdint>

#include <cstring>

#include "gradzip/core/config.hpp"
#include "gradzip/wire/format.hpp"

namespace gradzip::encode {

struct coo {
  static constexpr std::uint8_t id = 1;
  /// Bytes of this stage in the params section: the index width, then 7 reserved zero bytes.
  static constexpr std::uint64_t param_bytes = 8;
  /// Compress writes each index straight into the payload (no staging in scratch).
  static constexpr bool staged = false;

  GRADZIP_HOST_DEVICE static void write_params(std::uint8_t* p, std::uint64_t n) {
    p[0] = static_cast<std::uint8_t>(index_width(n));
  }

  /// The width byte must be the rule's for n, the reserved bytes zero; `at` is the parameters'
  /// offset in the payload, for the error message.
  GRADZIP_HOST_DEVICE static wire::status check_params(const std::uint8_t* p, std::uint64_t n,
                                                       std::uint64_t at) {
    if (p[0] != index_width(n)) return wire::fail(wire::format_errc::bad_params, at, p[0], index_width(n));
    for (int i = 1; i < 8; ++i) {
      if (p[i] != 0) return wire::fail(wire::format_errc::nonzero_reserved, at + i);
    }
    return {};
  }

  /// Index width in bytes for a tensor of n elements.
  GRADZIP_HOST_DEVICE static constexpr int index_width(std::uint64_t n) {
    return n < (std::uint64_t{1} << 32) ? 4 : 8;
  }

  GRADZIP_HOST_DEVICE static constexpr std::uint64_t section_bytes(std::uint64_t count,
                                                                   std::uint64_t n) {
    return count * static_cast<std::uint64_t>(index_width(n));
  }

  /// Stores index `index` at position `pos` of an index section of width `width`.
  GRADZIP_HOST_DEVICE static void store(std::uint8_t* section, int width, std::uint64_t pos,
                                        std::uint64_t index) {
    if (GRADZIP_DEVICE_CODE()) {  // device payloads are 16-byte aligned: typed stores
      if (width == 4) {
        reinterpret_cast<std::uint32_t*>(section)[pos] = static_cast<std::uint32_t>(index);
      } else {
        reinterpret_cast<std::uint64_t*>(section)[pos] = index;
      }
    } else if (width == 4) {  // host buffers may sit at any address
      const auto v = static_cast<std::uint32_t>(index);
      std::memcpy(section + pos * 4, &v, 4);
    } else {
      std::memcpy(section + pos * 8, &index, 8);
    }
  }

  GRADZIP_HOST_DEVICE static std::uint64_t load(const std::uint8_t* section, int width,
                                                std::uint64_t pos) {
    if (GRADZIP_DEVICE_CODE()) {
      if (width == 4) return reinterpret_cast<const std::uint32_t*>(section)[pos];
      return reinterpret_cast<const std::uint64_t*>(section)[pos];
    }
    if (width == 4) {
      std::uint32_t v;
      std::memcpy(&v, section + pos * 4, 4);
      return v;
    }
    std::uint64_t v;
    std::memcpy(&v, section + pos * 8, 8);
    return v;
  }
};

}  // namespace gradzip::encode
