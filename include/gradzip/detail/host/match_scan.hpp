// Visiting the elements of a range that pass a test, in index order, when few of them do: the
// scan behind top-k's gather and emit, threshold's emit, and the sampled and hashed top-k passes.
#pragma once

#include <cstdint>

#include "gradzip/core/config.hpp"
#include "gradzip/detail/host/quantize.hpp"

namespace gradzip::detail {

/**
 * Calls f(i) for each i in [begin, end) with pred(x[i]), in increasing i. Sixty-four elements
 * at a time: the test into bytes (a loop without branches, which vectorizes), the bytes into a
 * 64-bit mask (`pack_32`'s movemask), then only the set bits are visited. A block where
 * nothing passes costs no branch per element, and one where a few pass costs no scalar re-scan.
 */
template <class T, class Pred, class F>
void for_each_match(const T* x, std::uint64_t begin, std::uint64_t end, const Pred& pred, F&& f) {
  std::uint64_t i = begin;
  for (; i + 64 <= end; i += 64) {
    unsigned any = 0;
    for (int l = 0; l < 64; ++l) any |= static_cast<unsigned>(pred(x[i + l]));
    if (any == 0) continue;
    std::uint8_t flag[64];
    for (int l = 0; l < 64; ++l) flag[l] = pred(x[i + l]) ? 1 : 0;
    std::uint32_t low = 0, high = 0;
    pack_32(flag, 1, &low);
    pack_32(flag + 32, 1, &high);
    for (std::uint64_t mask = low | (static_cast<std::uint64_t>(high) << 32); mask != 0; mask &= mask - 1) {
      f(i + static_cast<std::uint64_t>(lowest_bit64(mask)));
    }
  }
  for (; i < end; ++i) {
    if (pred(x[i])) f(i);
  }
}

}  // namespace gradzip::detail
