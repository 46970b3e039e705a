/**
 * @file automatic.hpp
 * @brief `encode::automatic`: each payload's indices in the smallest of COO, bitmap and
 * delta-varint, and the helpers the codec uses to handle any of the three.
 *
 * Compress knows the selected indices, so it compares the exact section sizes: COO is 4k (or
 * 8k) bytes, the bitmap n/8, delta-varint is measured (only when its smallest possible size,
 * about 1.27 k bytes, could beat the other two). Ties go to COO, then the bitmap. The choice is
 * the first byte of this stage's parameters; the chosen encoding's own parameters follow at
 * byte 8, so a payload says how to read it. In practice: COO below a density of ~0.01 % (gaps
 * too wide for 3-byte varints), delta-varint up to ~10 %, the bitmap above.
 *
 * @code
 * gradzip::codec<gradzip::sparsify::topk, gradzip::quantize::none, gradzip::encode::automatic>
 *     c{gradzip::sparsify::topk::ratio(0.01)};
 * @endcode
 */
#pragma once

#include <cstdint>

#include "gradzip/core/config.hpp"
#include "gradzip/encode/bitmap.hpp"
#include "gradzip/encode/coo.hpp"
#include "gradzip/encode/delta_varint.hpp"
#include "gradzip/wire/format.hpp"

namespace gradzip::encode {

struct automatic {
  static constexpr std::uint8_t id = 4;
  /// The chosen encoding's id, 7 zero bytes, then the chosen encoding's 8 parameter bytes.
  static constexpr std::uint64_t param_bytes = 16;
  static constexpr bool staged = true;

  GRADZIP_HOST_DEVICE static void write_params(std::uint8_t* p, std::uint64_t n, std::uint8_t choice) {
    p[0] = choice;
    if (choice == coo::id) coo::write_params(p + 8, n);
    if (choice == bitmap::id) bitmap::write_params(p + 8, n);
    if (choice == delta_varint::id) delta_varint::write_params(p + 8, n);
  }

  GRADZIP_HOST_DEVICE static wire::status check_params(const std::uint8_t* p, std::uint64_t n,
                                                       std::uint64_t at) {
    for (int i = 1; i < 8; ++i) {
      if (p[i] != 0) return wire::fail(wire::format_errc::nonzero_reserved, at + i);
    }
    switch (p[0]) {
      case coo::id: return coo::check_params(p + 8, n, at + 8);
      case bitmap::id: return bitmap::check_params(p + 8, n, at + 8);
      case delta_varint::id: return delta_varint::check_params(p + 8, n, at + 8);
      default: return wire::fail(wire::format_errc::bad_params, at, p[0], wire::no_expected_value);  // 1, 2 or 3
    }
  }

  /// The largest section `compress` can write: the smaller of COO and the bitmap (delta-varint
  /// is chosen only when it is smaller still).
  GRADZIP_HOST_DEVICE static constexpr std::uint64_t max_section_bytes(std::uint64_t k, std::uint64_t n) {
    const std::uint64_t listed = coo::section_bytes(k, n);
    const std::uint64_t bits = bitmap::section_bytes(k, n);
    return listed < bits ? listed : bits;
  }

  /// Whether delta-varint could beat COO and the bitmap, so that it is worth measuring.
  GRADZIP_HOST_DEVICE static constexpr bool delta_may_win(std::uint64_t k, std::uint64_t n) {
    return delta_varint::min_section_bytes(k) < max_section_bytes(k, n);
  }

  /// The encoding to use given delta-varint's measured size (ignored unless delta_may_win).
  GRADZIP_HOST_DEVICE static constexpr std::uint8_t choose(std::uint64_t k, std::uint64_t n,
                                                          std::uint64_t delta_bytes) {
    const std::uint64_t listed = coo::section_bytes(k, n);
    const std::uint64_t bits = bitmap::section_bytes(k, n);
    const std::uint64_t best = listed <= bits ? listed : bits;
    if (delta_may_win(k, n) && delta_bytes < best) return delta_varint::id;
    return listed <= bits ? coo::id : bitmap::id;
  }
};

/// automatic's section: its encoding and size, given delta-varint's measured size (`delta`,
/// read only when delta_may_win).
inline std::uint64_t automatic_section(std::uint64_t k, std::uint64_t n, std::uint64_t delta, std::uint8_t& encoding) {
  encoding = automatic::choose(k, n, delta);
  return encoding == delta_varint::id ? delta : automatic::max_section_bytes(k, n);
}

/// Picks the concrete encoding compress writes (`Indices`' own, or automatic's choice) and
/// returns its section size; `measure_delta()` gives delta-varint's size, and is called only
/// when delta-varint may be written.
template <class Indices, class MeasureDelta>
std::uint64_t plan_section(std::uint64_t k, std::uint64_t n, MeasureDelta measure_delta, std::uint8_t& encoding) {
  if constexpr (Indices::id == automatic::id) {
    return automatic_section(k, n, automatic::delta_may_win(k, n) ? measure_delta() : 0, encoding);
  } else if constexpr (Indices::id == delta_varint::id) {
    encoding = Indices::id;
    return measure_delta();
  } else {
    encoding = Indices::id;
    return Indices::section_bytes(k, n);
  }
}

/// The concrete encoding (coo, bitmap or delta_varint's id) of a validated indices stage's
/// parameters, and where that encoding's own parameters are.
template <class Indices>
GRADZIP_HOST_DEVICE std::uint8_t encoding_of(const std::uint8_t* params) {
  if constexpr (Indices::id == automatic::id) {
    return params[0];
  } else {
    return Indices::id;
  }
}

/// Largest indices section of k of n elements an indices stage writes.
template <class Indices>
GRADZIP_HOST_DEVICE constexpr std::uint64_t max_section_bytes(std::uint64_t k, std::uint64_t n) {
  if constexpr (Indices::id == delta_varint::id || Indices::id == automatic::id) {
    return Indices::max_section_bytes(k, n);
  } else {
    return Indices::section_bytes(k, n);
  }
}

/// The width an encoding reads indices at: COO's index width, delta-varint's gap width, 0 for
/// the bitmap.
GRADZIP_HOST_DEVICE inline int width_of(std::uint8_t encoding, std::uint64_t n) {
  if (encoding == coo::id) return coo::index_width(n);
  if (encoding == delta_varint::id) return delta_varint::gap_width(n);
  return 0;
}

/// Checks an indices section's size against its encoding and count (section `at` in the header).
GRADZIP_HOST_DEVICE inline wire::status check_section_size(std::uint8_t encoding, std::uint64_t k,
                                                           std::uint64_t n, std::uint64_t size,
                                                           std::uint32_t at) {
  using wire::format_errc;
  std::uint64_t expected = 0;
  if (encoding == coo::id) {
    if (!wire::detail::checked_mul(k, static_cast<std::uint64_t>(coo::index_width(n)), expected)) {
      // k indices of index_width bytes overflow 64 bits: name the largest count that does not.
      return wire::fail(format_errc::count_overflow, k, ~std::uint64_t{0} / static_cast<std::uint64_t>(coo::index_width(n)));
    }
  } else if (encoding == bitmap::id) {
    expected = bitmap::section_bytes(k, n);
  } else {  // delta-varint: every gap takes 1 to gap_width bytes; decoding checks the rest
    // The bound the size breaks: the least (every gap one byte), or the most (every gap at full
    // width). k > size first: min_section_bytes(k) (about 1.26 k) overflows for k near 2^64.
    if (k > size) {
      const std::uint64_t least = k > (std::uint64_t{1} << 62) ? ~std::uint64_t{0} : delta_varint::min_section_bytes(k);
      return wire::fail(format_errc::bad_section_size, at, size, least);
    }
    if (size < delta_varint::min_section_bytes(k)) {
      return wire::fail(format_errc::bad_section_size, at, size, delta_varint::min_section_bytes(k));
    }
    if (size > delta_varint::max_section_bytes(k, n)) {
      return wire::fail(format_errc::bad_section_size, at, size, delta_varint::max_section_bytes(k, n));
    }
    return {};
  }
  if (size != expected) return wire::fail(format_errc::bad_section_size, at, size, expected);
  return {};
}

}  // namespace gradzip::encode
