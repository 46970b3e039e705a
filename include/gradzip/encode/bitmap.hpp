/**
 * @file bitmap.hpp
 * @brief `encode::bitmap`: one bit per tensor element, set where the element is sent.
 *
 * The indices section is ceil(n / 64) little-endian 64-bit words; element i is bit i % 64 of
 * word i / 64. The values follow in index order, so the j-th set bit owns value j. Bits at or past
 * n must be clear and the number of set bits must equal the payload's count; the decoder checks
 * both before it writes anything. Indices are increasing by construction.
 *
 * Bytes per selected element: n / (8 k) for the bitmap (0.125 / density), plus the values. It
 * beats 4-byte COO indices above a density of 1/32.
 *
 * @code
 * gradzip::codec<gradzip::sparsify::threshold, gradzip::quantize::none, gradzip::encode::bitmap>
 *     c{gradzip::sparsify::threshold{1e-3f}};
 * @endcode
 */
#pragma once

#include <cstdint>

#include "gradzip/core/config.hpp"
#include "gradzip/wire/format.hpp"

namespace gradzip::encode {

struct bitmap {
  static constexpr std::uint8_t id = 2;
  /// Bytes of this stage in the params section: 8 reserved zero bytes.
  static constexpr std::uint64_t param_bytes = 8;
  /// Compress collects the selected indices in scratch, then encodes them (see codec.hpp).
  static constexpr bool staged = true;

  GRADZIP_HOST_DEVICE static void write_params(std::uint8_t*, std::uint64_t) {}

  GRADZIP_HOST_DEVICE static wire::status check_params(const std::uint8_t* p, std::uint64_t,
                                                       std::uint64_t at) {
    for (int i = 0; i < 8; ++i) {
      if (p[i] != 0) return wire::fail(wire::format_errc::nonzero_reserved, at + i);
    }
    return {};
  }

  GRADZIP_HOST_DEVICE static constexpr std::uint64_t words(std::uint64_t n) { return n / 64 + (n % 64 != 0); }

  /// The section's size: fixed by n, whatever the count.
  GRADZIP_HOST_DEVICE static constexpr std::uint64_t section_bytes(std::uint64_t, std::uint64_t n) {
    return words(n) * 8;
  }

  /// Word w of the bitmap of the sorted indices idx[0..k): consumes the indices below 64 (w + 1)
  /// starting at idx[j], and advances j past them.
  GRADZIP_HOST_DEVICE static std::uint64_t build_word(const std::uint64_t* idx, std::uint64_t k,
                                                      std::uint64_t& j, std::uint64_t w) {
    std::uint64_t word = 0;
    const std::uint64_t end = (w + 1) * 64;
    for (; j < k && idx[j] < end; ++j) word |= std::uint64_t{1} << (idx[j] & 63);
    return word;
  }

  GRADZIP_HOST_DEVICE static std::uint64_t load_word(const std::uint8_t* section, std::uint64_t w) {
    if (GRADZIP_DEVICE_CODE()) return reinterpret_cast<const std::uint64_t*>(section)[w];  // 16-byte aligned
    return wire::detail::load_le(section + w * 8, 8);
  }

  /// Set bits in words [w0, w1); fails if the last word of the bitmap sets a bit at or past n.
  GRADZIP_HOST_DEVICE static wire::status count_bits(const std::uint8_t* section, std::uint64_t n,
                                                     std::uint64_t w0, std::uint64_t w1,
                                                     std::uint64_t& bits) {
    bits = 0;
    for (std::uint64_t w = w0; w < w1; ++w) bits += static_cast<std::uint64_t>(detail::popcount64(load_word(section, w)));
    if (w1 == words(n) && w1 > w0 && n % 64 != 0) {
      const std::uint64_t past = load_word(section, w1 - 1) >> (n % 64);
      if (past != 0) {
        return wire::fail(wire::format_errc::bitmap_bit_past_end,
                          (w1 - 1) * 64 + n % 64 + static_cast<std::uint64_t>(detail::lowest_bit64(past)), n);
      }
    }
    return {};
  }

  /// f(j, index) for every set bit of words [w0, w1) in order, j counting up from `first`.
  GRADZIP_EXEC_CHECK_DISABLE
  template <class F>
  GRADZIP_HOST_DEVICE static void for_each_index(const std::uint8_t* section, std::uint64_t w0,
                                                 std::uint64_t w1, std::uint64_t first, F&& f) {
    std::uint64_t j = first;
    for (std::uint64_t w = w0; w < w1; ++w) {
      for (std::uint64_t word = load_word(section, w); word != 0; word &= word - 1) {
        f(j++, w * 64 + static_cast<std::uint64_t>(detail::lowest_bit64(word)));
      }
    }
  }
};

}  // namespace gradzip::encode
