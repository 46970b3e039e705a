/**
 * @file topk.hpp
 * @brief `sparsify::topk`: keep the k entries of largest magnitude (exact).
 *
 * Given x of n elements, selects the k indices with the largest |x_i|, ordered by the total order
 * "larger |x| first, then the lower index", and emits them in ascending index order with their
 * values unchanged. NaN ranks above +inf (a NaN gradient is always sent, never hidden), all NaNs
 * rank equal, and +0 ranks equal to -0.
 *
 * k is a count (`topk::count(k)`, which must not exceed n) or a ratio of n
 * (`topk::ratio(r)`, r in (0, 1], k = min(n, ceil(r n)), at least 1 for n > 0).
 *
 * Both executors select by radix select on a magnitude key (`magnitude_key`): no sort, O(n).
 * The host reads the input three times (histogram, candidate gather, compaction); the CUDA
 * executor reads it three times for 32-bit keys (float, half, bf16): two histogram passes and a
 * single-pass scan compaction. See docs/sparsification.md.
 *
 * @code
 * gradzip::codec<gradzip::sparsify::topk> c{gradzip::sparsify::topk::ratio(0.01)};
 * @endcode
 */
#pragma once

#include <cmath>
#include <cstdint>

#include "gradzip/core/error.hpp"
#include "gradzip/sparsify/kept_count.hpp"

namespace gradzip::sparsify {

class topk {
 public:
  static constexpr std::uint8_t id = 1;
  /// The payload lists the chosen indices explicitly (an index stage encodes them).
  static constexpr bool explicit_indices = true;
  /// Workers select different indices, so payloads cannot be summed: gather and decode instead.
  static constexpr bool summable = false;

  /// Defaults to the classic 1 % (Aji & Heafield 2017; DGC uses 0.1 %).
  constexpr topk() = default;

  /// Keeps exactly k elements; compressing a tensor of fewer than k elements is an error.
  static topk count(std::uint64_t k) { return topk(k, 0.0); }

  /// Keeps k = min(n, ceil(r n)) elements, r in (0, 1].
  static topk ratio(double r) { return topk(0, detail::checked_ratio(r, "topk")); }

  bool is_ratio() const noexcept { return ratio_ > 0.0; }
  double ratio_value() const noexcept { return ratio_; }
  std::uint64_t count_value() const noexcept { return count_; }

  /// The number of elements kept from a tensor of n elements.
  std::uint64_t selected_count(std::uint64_t n) const {
    return detail::kept_count(count_, is_ratio() ? ratio_ : 0.0, n, "topk");
  }

 private:
  constexpr topk(std::uint64_t k, double r) : count_(k), ratio_(r) {}
  std::uint64_t count_ = 0;
  double ratio_ = 0.01;
};

}  // namespace gradzip::sparsify
