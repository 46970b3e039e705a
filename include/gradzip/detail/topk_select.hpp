// Radix-select helpers shared by the host and CUDA top-k: digit layout and the bin search.
#pragma once

#include <cstdint>

#include "gradzip/core/config.hpp"

namespace gradzip::detail {

/// Width of every radix digit of the host select; the first digit of the CUDA select.
inline constexpr int topk_digit_bits = 11;
inline constexpr int topk_digit_bins = 1 << topk_digit_bits;

/// Candidates a top-k keeps in a buffer for n elements: n / 8, at least `floor`, at most n. The
/// buffer is used when the candidates fit; otherwise the select reads its input again.
GRADZIP_HOST_DEVICE constexpr std::uint64_t topk_candidate_capacity(std::uint64_t n, std::uint64_t floor) {
  const std::uint64_t c = n / 8 > floor ? n / 8 : floor;
  return c < n ? c : n;
}

/**
 * Given a histogram of `bins` counts and the 1-based rank `rank` of the wanted element counted
 * from the largest, returns the bin that holds it and sets `above` to the number of elements in
 * higher bins. The caller guarantees 1 <= rank <= sum of counts.
 */
GRADZIP_HOST_DEVICE inline int find_rank_bin(const std::uint64_t* hist, int bins, std::uint64_t rank,
                                             std::uint64_t& above) {
  above = 0;
  for (int b = bins - 1; b > 0; --b) {
    if (above + hist[b] >= rank) return b;
    above += hist[b];
  }
  return 0;
}

}  // namespace gradzip::detail
