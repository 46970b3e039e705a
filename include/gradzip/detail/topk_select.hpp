// Radix-select helpers shared by the host and CUDA top-k: digit layout and the bin search.
#pragma once

#include <algorithm>
#include <cmath>
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

/// Elements of the strided sample behind the one-read selects' bound (position j * n / m), on
/// both executors: n / 64, at most topk_sample_max.
inline constexpr std::uint64_t topk_sample_max = 16384;
static_assert(topk_sample_max <= (std::uint64_t{1} << 16), "topk_sample_position: j r < m^2 in 32 bits");
/// The smallest sample a one-read select starts from (topk_one_read_fits): smaller inputs sit in
/// the caches, where the radix path is cheap.
inline constexpr std::uint64_t topk_sample_least = 1024;
inline std::uint64_t topk_sample_size(std::uint64_t n) { return std::min<std::uint64_t>(n / 64, topk_sample_max); }

/// Position j n / m of sample j (j < m <= 16,384), as j q + j r / m with q and r n's quotient and
/// remainder by m: exact, with the division in 32 bits (j r < m^2 <= 2^28). On a GPU a 64-bit
/// division is a subroutine of some 70 instructions.
GRADZIP_HOST_DEVICE inline std::uint64_t topk_sample_position(std::uint64_t j, std::uint64_t q, std::uint32_t r,
                                                              std::uint32_t m) {
  return j * q + static_cast<std::uint32_t>(j) * r / m;
}

/// Samples of m whose key must lie at or above the bound: k's share of the sample, four
/// standard deviations of a binomial count, and 8 more.
inline std::uint64_t topk_sample_rank(std::uint64_t n, std::uint64_t k, std::uint64_t m) {
  const double mean = static_cast<double>(k) * static_cast<double>(m) / static_cast<double>(n);
  return std::min<std::uint64_t>(m, static_cast<std::uint64_t>(mean + 4 * std::sqrt(mean) + 8) + 1);
}

/// Whether the one-read select from the strided sample may pay, on either executor: a sample of
/// at least topk_sample_least keys and an expected list (`rank` samples of m stand for rank n / m
/// keys) within half the `room` it is gathered into (a chunk's share of the list on the host, the
/// whole list on the GPU).
inline bool topk_one_read_fits(std::uint64_t n, std::uint64_t m, std::uint64_t rank, std::uint64_t room) {
  return m >= topk_sample_least && rank * (n / m) <= room / 2;
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
