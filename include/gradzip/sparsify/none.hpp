/**
 * @file none.hpp
 * @brief `sparsify::none`: the dense structure stage, every element in index order.
 *
 * Sends all n values (through the values stage) and no indices, so its indices stage is
 * `encode::none`. Summable: the payload of a sum is the sum of the payloads (exactly for
 * `quantize::none` up to the addition's rounding; for casts up to one rounding).
 *
 * @code
 * gradzip::codec<gradzip::sparsify::none, gradzip::quantize::cast_bf16, gradzip::encode::none> c;
 * @endcode
 */
#pragma once

#include <cstdint>

namespace gradzip::sparsify {

struct none {
  static constexpr std::uint8_t id = 0;
  static constexpr bool explicit_indices = false;
  static constexpr bool summable = true;

  std::uint64_t selected_count(std::uint64_t n) const { return n; }
};

}  // namespace gradzip::sparsify
