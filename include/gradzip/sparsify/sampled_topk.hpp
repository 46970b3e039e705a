/**
 * @file sampled_topk.hpp
 * @brief `sparsify::sampled_topk`: DGC's top-k, a threshold estimated from a sample and refined
 * until the kept count lands in [k, 1.2 k], then |x| >= threshold kept in index order.
 *
 * Deep Gradient Compression (Lin et al., ICLR 2018, section 3 and appendix) samples 0.1-1 % of
 * the gradient, takes the top-k threshold of the sample, and re-selects with a scaled threshold
 * while the count is too far from k; GRACE's DGC does up to 10 full passes, each followed by a
 * host sync. Here:
 *
 * 1. Sample: s = ceil(rate * n) elements, one per stratum [j n / s, (j + 1) n / s), at an offset
 *    hashed from (seed, j): the same positions on every executor.
 * 2. The sample's magnitudes at ranks m / 2 and 2m (m = ceil(k s / n), the rank expected to hold
 *    the k-th largest) bracket the threshold.
 * 3. One pass histograms |x| inside the bracket into 2048 bins of its float bit patterns (an
 *    order-preserving key) and counts those above. The bin where the running count from the top
 *    reaches k gives the threshold if the count there is <= 1.2 k; otherwise the search narrows
 *    to that bin (or moves outside a bracket the sample got wrong) and repeats. 2048 bins per
 *    round reach a single bit pattern in at most 4 rounds; one round is the rule.
 * 4. Every element with |x| >= threshold is kept, in index order (the `threshold` stage's pass).
 *
 * The kept count is data-dependent: `max_compressed_bytes` is sized for floor(1.2 k) and
 * `compress` returns the size. Two cases keep fewer than k: more than 0.2 k elements sharing
 * the k-th largest magnitude (those above it are kept), which includes fewer than k nonzero
 * elements (the nonzeros are kept). NaN and +-inf are always kept, as by `threshold`, on both
 * executors: a diverging gradient stays visible. When more of them than floor(1.2 k) pass, the
 * payload cannot hold them: `compress` throws format_error `count_over_bound` and writes
 * nothing, and `compress_async` records that failure for `exec.check()`, writes nothing and
 * leaves a size of 0.
 *
 * @code
 * gradzip::codec<gradzip::sparsify::sampled_topk> c{gradzip::sparsify::sampled_topk::ratio(0.001)};
 * @endcode
 */
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "gradzip/core/config.hpp"
#include "gradzip/core/error.hpp"
#include "gradzip/random/hash.hpp"
#include "gradzip/sparsify/kept_count.hpp"
#include "gradzip/sparsify/threshold.hpp"

namespace gradzip::sparsify {

class sampled_topk {
 public:
  static constexpr std::uint8_t id = 5;
  static constexpr bool explicit_indices = true;
  static constexpr bool summable = false;
  static constexpr bool data_dependent_count = true;
  /// The largest sample rate: scratch is sized for it.
  static constexpr double max_sample_rate = 0.05;
  static constexpr double default_sample_rate = 0.01;  // DGC samples 0.1 % to 1 %

  /// Keeps about 1 % of every tensor (as topk{} and randomk{}), sampling 1 % of it.
  constexpr sampled_topk() = default;

  /// Keeps about k elements of every tensor (k <= n).
  static sampled_topk count(std::uint64_t k, double sample_rate = default_sample_rate,
                            std::uint64_t seed = 0x5eed) {
    return sampled_topk(k, 0.0, checked_rate(sample_rate), seed);
  }
  /// Keeps about ceil(r n) elements, r in (0, 1].
  static sampled_topk ratio(double r, double sample_rate = default_sample_rate, std::uint64_t seed = 0x5eed) {
    return sampled_topk(0, detail::checked_ratio(r, "sampled_topk"), checked_rate(sample_rate), seed);
  }

  /// k: the count the refinement aims at (at least k, at most 1.2 k).
  std::uint64_t target_count(std::uint64_t n) const { return detail::kept_count(count_, ratio_, n, "sampled_topk"); }
  /// The bound the payload is sized for: floor(1.2 k), at most n.
  std::uint64_t selected_count(std::uint64_t n) const { return upper_count(target_count(n), n); }
  static constexpr std::uint64_t upper_count(std::uint64_t k, std::uint64_t n) {
    const std::uint64_t upper = k + k / 5;
    return upper < n ? upper : n;
  }

  double sample_rate() const noexcept { return rate_; }
  std::uint64_t seed() const noexcept { return seed_; }

  /// Sampled elements: ceil(rate n), at least 1 for n > 0.
  std::uint64_t sample_size(std::uint64_t n) const { return sample_size(n, rate_); }
  static std::uint64_t sample_size(std::uint64_t n, double rate) {
    if (n == 0) return 0;
    const auto s = static_cast<std::uint64_t>(std::ceil(rate * static_cast<double>(n)));
    return s < 1 ? 1 : (s > n ? n : s);
  }

  /// Position of sample j of s: in the stratum [j n / s, (j + 1) n / s), offset hashed from the seed.
  GRADZIP_HOST_DEVICE static std::uint64_t sample_position(std::uint64_t seed, std::uint64_t n,
                                                           std::uint64_t s, std::uint64_t j) {
    const std::uint64_t begin = stratum_start(n, s, j), end = stratum_start(n, s, j + 1);
    return begin + gradzip::hash_to_range(gradzip::hash64(seed, j), end - begin);
  }

  /// f(j, sample_position(seed, n, s, j)) for j in [first, last), in order, stepping from stratum
  /// to stratum without sample_position's two 64-bit divisions per sample (a tenth of the host's
  /// sampled top-k at 2^24): with j n = begin s + rem and n = step s + extra, stratum j + 1 starts at
  /// begin + step, one more where rem + extra >= s.
  template <class F>
  static void for_each_sample_position(std::uint64_t seed, std::uint64_t n, std::uint64_t s, std::uint64_t first,
                                       std::uint64_t last, F&& f) {
    const std::uint64_t step = n / s, extra = n % s;
    std::uint64_t begin = stratum_start(n, s, first);
    std::uint64_t rem = static_cast<std::uint64_t>(static_cast<gradzip::detail::uint128>(first) * n % s);
    for (std::uint64_t j = first; j < last; ++j) {
      std::uint64_t end = begin + step;
      rem += extra;  // < 2 s
      if (rem >= s) {
        rem -= s;
        ++end;
      }
      f(j, begin + gradzip::hash_to_range(gradzip::hash64(seed, j), end - begin));
      begin = end;
    }
  }

  /// floor(j n / s), j <= s <= n: 64-bit arithmetic when j n fits (the common case; a 128-bit
  /// division costs several times more).
  GRADZIP_HOST_DEVICE static std::uint64_t stratum_start(std::uint64_t n, std::uint64_t s, std::uint64_t j) {
    if (n < (std::uint64_t{1} << 32) && j < (std::uint64_t{1} << 32)) return j * n / s;
    return static_cast<std::uint64_t>(static_cast<gradzip::detail::uint128>(j) * n / s);
  }

 private:
  constexpr sampled_topk(std::uint64_t k, double r, double rate, std::uint64_t seed)
      : count_(k), ratio_(r), rate_(rate), seed_(seed) {}

  static double checked_rate(double rate) {
    GRADZIP_EXPECTS(rate > 0.0 && rate <= max_sample_rate, "sampled_topk: sample rate must be in (0, ",
                    max_sample_rate, "], got ", rate);
    return rate;
  }

  std::uint64_t count_ = 0;
  double ratio_ = 0.01;  // > 0: k is a ratio of n (the default, 1 %); else count_
  double rate_ = default_sample_rate;
  std::uint64_t seed_ = 0x5eed;
};

namespace detail {

/// |v|'s float bit pattern: ordered like |v| for every non-NaN float (NaN above +inf).
GRADZIP_HOST_DEVICE inline std::uint32_t magnitude_key(float v) {
  std::uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return bits & 0x7FFFFFFFu;
}

/// A threshold held as a magnitude key in device memory (the CUDA search's result), for the
/// threshold stage's kernels: |x| >= that float, NaN passing.
struct key_threshold {
  const std::uint32_t* key;
};
GRADZIP_HOST_DEVICE inline float threshold_value(key_threshold t) {
  float f;
  std::memcpy(&f, t.key, 4);
  return f;
}

/// The least double that rounds (to nearest, ties to even) to the float whose magnitude key is
/// `key`: |x| >= it exactly when float(|x|) >= that float. The search ranks a double by its
/// float (its key), so a double tensor keeps what the search counted, and no more: comparing
/// |x| with the float itself dropped the doubles just below it that round up to it.
GRADZIP_HOST_DEVICE inline double least_double_rounding_to(std::uint32_t key) {
  if (key == 0) return 0.0;
  float t, below;
  const std::uint32_t below_key = key - 1;
  std::memcpy(&t, &key, 4);
  std::memcpy(&below, &below_key, 4);
  const double midpoint = (static_cast<double>(t) + static_cast<double>(below)) / 2.0;  // exact: 25 bits
  if ((key & 1u) == 0) return midpoint;  // the tie goes to t, whose significand is even
  std::uint64_t bits;
  std::memcpy(&bits, &midpoint, 8);
  ++bits;  // the next double up (midpoint is positive and finite)
  double above;
  std::memcpy(&above, &bits, 8);
  return above;
}

/// The threshold as the compares read it, once: the float, and for double inputs the least
/// double that rounds to it.
struct key_operand {
  float value;
  double least_double;
};
GRADZIP_HOST_DEVICE inline key_operand threshold_operand(key_threshold t) {
  return {threshold_value(t), least_double_rounding_to(*t.key)};
}
GRADZIP_HOST_DEVICE inline bool passes(float x, key_operand t) { return !(fabsf(x) < t.value); }
GRADZIP_HOST_DEVICE inline bool passes(double x, key_operand t) { return !(fabs(x) < t.least_double); }
/// passes(x, threshold_operand(t)) == passes(x, t).
template <class V>
GRADZIP_HOST_DEVICE inline bool passes(V x, key_threshold t) {
  return passes(x, threshold_operand(t));
}

/// The largest finite float's key: a threshold never goes above it (inf and NaN are kept).
inline constexpr std::uint32_t max_threshold_key = 0x7F7FFFFFu;
/// The smallest normal float's key. A candidate list serves no threshold below it: where the FPU
/// flushes subnormals (DAZ, -ftz), the value compare keeps subnormal values under the list's floor.
inline constexpr std::uint32_t smallest_normal_key = 0x00800000u;

/**
 * The refinement of step 3, the same on both executors: each round histograms the keys in
 * [lo, hi] into `bins` bins of 2^shift keys (plus a count above hi, in hist[bins]) and `decide`
 * either fixes the threshold key or narrows [lo, hi].
 */
struct threshold_search {
  static constexpr unsigned bins = 2048;
  static constexpr int max_rounds = 5;  // 1 + one jump out of a wrong bracket + 3 narrowings
  std::uint32_t lo = 0, hi = 0;
  unsigned shift = 0;
  bool done = false;
  std::uint32_t tau_key = 0;

  GRADZIP_HOST_DEVICE void set_range(std::uint32_t l, std::uint32_t h) {
    lo = l;
    hi = h;
    shift = 0;
    while ((static_cast<std::uint64_t>(h - l) >> shift) >= bins) ++shift;
  }

  GRADZIP_HOST_DEVICE void finish(std::uint32_t key) {
    done = true;
    tau_key = key < max_threshold_key ? key : max_threshold_key;
  }

  /// The first round's bracket: sample keys (sorted descending, s of them) at ranks m / 2 and 2m.
  GRADZIP_HOST_DEVICE void start(std::uint32_t key_at_half_m, std::uint32_t key_at_two_m,
                                 std::uint64_t k, std::uint64_t n) {
    if (k >= n) return finish(0);  // everything
    set_range(key_at_two_m, key_at_half_m);
  }

  /// The sample ranks (1-based) whose keys `start` takes: m / 2 and 2m, within [1, s].
  GRADZIP_HOST_DEVICE static void bracket_ranks(std::uint64_t k, std::uint64_t n, std::uint64_t s,
                                                std::uint64_t& high_rank, std::uint64_t& low_rank) {
    std::uint64_t m = static_cast<std::uint64_t>((static_cast<gradzip::detail::uint128>(k) * s + n - 1) / n);
    m = m < 1 ? 1 : (m > s ? s : m);
    high_rank = m / 2 < 1 ? 1 : m / 2;
    low_rank = 2 * m < s ? 2 * m : s;
  }

  /// Whether the first round should gather the keys at or above its bracket's low end (the
  /// floor) into a list of `capacity` entries. About low_rank n / s keys of x reach the floor (the
  /// sample's key at rank low_rank). Where that would fill more than 3/4 of the list (k above about
  /// n / 20), the round would write most of it only to find it overflowed, so it is not gathered.
  GRADZIP_HOST_DEVICE static bool gather_pays(std::uint64_t k, std::uint64_t n, std::uint64_t s,
                                              std::uint64_t capacity) {
    using gradzip::detail::uint128;
    std::uint64_t high_rank = 1, low_rank = 1;
    bracket_ranks(k, n, s, high_rank, low_rank);
    return static_cast<uint128>(low_rank) * n / s <= static_cast<uint128>(capacity) * 3 / 4;
  }

  /// Histogram bin of a key: -1 below lo, `bins` above hi.
  GRADZIP_HOST_DEVICE int bin_of(std::uint32_t key) const {
    if (key > hi) return static_cast<int>(bins);
    if (key < lo) return -1;
    return static_cast<int>((key - lo) >> shift);
  }

  /// One round's verdict from hist[0..bins] (hist[bins]: keys above hi); cap = 1.2 k.
  GRADZIP_HOST_DEVICE void decide(const std::uint64_t* hist, std::uint64_t k, std::uint64_t cap) {
    const std::uint64_t above = hist[bins];
    if (above >= k) {  // the sample's bracket was too low
      if (above <= cap) return finish(hi + 1);
      return set_range(hi + 1, 0xFFFFFFFFu);
    }
    std::uint64_t running = above;
    for (int b = static_cast<int>((hi - lo) >> shift); b >= 0; --b) {
      running += hist[b];
      if (running < k) continue;
      const std::uint32_t first = lo + (static_cast<std::uint32_t>(b) << shift);
      const std::uint64_t wide_last = static_cast<std::uint64_t>(first) + (std::uint64_t{1} << shift) - 1;
      const std::uint32_t last = wide_last < hi ? static_cast<std::uint32_t>(wide_last) : hi;
      if (running <= cap) return finish(first);
      if (first == last) return finish(first + 1);  // > 0.2 k ties at one magnitude: keep those above
      return set_range(first, last);
    }
    if (lo == 0) return finish(0);  // fewer than k in all: keep everything (threshold 0)
    set_range(0, lo - 1);           // the bracket was too high
  }
};

}  // namespace detail
}  // namespace gradzip::sparsify
