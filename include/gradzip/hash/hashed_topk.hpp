/**
 * @file hashed_topk.hpp
 * @brief `hash::hashed_topk`: DRAGONN-style hashed sparsification with a deterministic collision
 * rule, as a structure stage (explicit indices, any values stage and index encoding).
 *
 * DRAGONN (Wang et al., "DRAGONN: Distributed Randomized Approximate Gradients of Neural
 * Networks", ICML 2022) estimates a top-k threshold from a sample, then hashes the survivors
 * (|x| >= threshold) into m slots and sends the slots. Its released code writes colliding
 * survivors non-atomically (the last writer wins, run to run), uses index 0 as the empty marker
 * (so element 0 can never be sent), and its decoder overwrites instead of summing. Here:
 *
 * 1. The threshold is the sample's magnitude at rank ceil(k s / n) (s = ceil(rate n) stratified
 *    samples, as `sampled_topk` draws them, without refinement).
 * 2. Survivor i goes to slot hash_to_range(hash64(seed, i), m), m = ceil(slot_ratio n) (default
 *    m = k). Each slot keeps the survivor with the larger |x|, then the lower index: one 64-bit
 *    max of (magnitude key << 33 | (2^33 - 1 - i)), so the winner does not depend on the order
 *    of the writes (a 64-bit atomicMax on the GPU). An empty slot holds 0, which no survivor
 *    encodes: index 0 is an ordinary index. n must be below 2^33.
 * 3. The winners are emitted in index order: an ordinary sparse payload, at most m elements,
 *    whose decoder validates every index and accumulates (`decompress_add` sums payloads).
 *
 * Survivors that lose a collision are dropped; with s survivors in m slots the expected lost
 * fraction is 1 - (m / s)(1 - (1 - 1/m)^s), about 1 - (1 - e^-L) / L at load factor L = s / m
 * (tests/host/test_hashed_topk.cpp measures it against this).
 *
 * Host and CUDA (detail/cuda/hashed_topk.cuh, a 64-bit atomicMax per survivor) give the same bytes.
 *
 * @code
 * gradzip::codec<gradzip::hash::hashed_topk> c{gradzip::hash::hashed_topk::ratio(0.01)};
 * @endcode
 */
#pragma once

#include <cmath>
#include <cstdint>

#include "gradzip/core/config.hpp"
#include "gradzip/core/error.hpp"
#include "gradzip/random/hash.hpp"
#include "gradzip/sparsify/kept_count.hpp"
#include "gradzip/sparsify/sampled_topk.hpp"

namespace gradzip::hash {

class hashed_topk {
 public:
  static constexpr std::uint8_t id = 7;
  static constexpr bool explicit_indices = true;
  static constexpr bool summable = false;
  static constexpr bool data_dependent_count = true;
  static constexpr std::uint64_t max_elements = (std::uint64_t{1} << 33) - 1;

  constexpr hashed_topk() = default;

  /// About k survivors into k slots (slot_ratio 0: m = k); sample rate as sampled_topk's.
  static hashed_topk ratio(double r, double slot_ratio = 0.0, double sample_rate = 0.01, std::uint64_t seed = 0xd2a6) {
    GRADZIP_EXPECTS(slot_ratio >= 0.0 && slot_ratio <= 1.0, "hashed_topk: slot ratio must be in [0, 1], got ", slot_ratio);
    GRADZIP_EXPECTS(sample_rate > 0.0 && sample_rate <= sparsify::sampled_topk::max_sample_rate,
                    "hashed_topk: sample rate must be in (0, ", sparsify::sampled_topk::max_sample_rate, "], got ",
                    sample_rate);
    return hashed_topk(sparsify::detail::checked_ratio(r, "hashed_topk"), slot_ratio, sample_rate, seed);
  }

  /// k, the survivors the threshold aims at.
  std::uint64_t target_count(std::uint64_t n) const { return sparsify::detail::kept_count(0, ratio_, n, "hashed_topk"); }
  /// m, the slots (the most elements a payload holds).
  std::uint64_t slots(std::uint64_t n) const {
    if (slot_ratio_ <= 0.0) return target_count(n);
    return sparsify::detail::kept_count(0, slot_ratio_, n, "hashed_topk");
  }
  std::uint64_t selected_count(std::uint64_t n) const { return slots(n); }

  double sample_rate() const noexcept { return sample_rate_; }
  std::uint64_t seed() const noexcept { return seed_; }

  GRADZIP_HOST_DEVICE static std::uint64_t slot_of(std::uint64_t seed, std::uint64_t i, std::uint64_t m) {
    return hash_to_range(hash64(seed, i), m);
  }
  /// The slot word of survivor i: larger magnitude first, then the lower index. Never 0.
  GRADZIP_HOST_DEVICE static std::uint64_t slot_word(std::uint32_t key, std::uint64_t i) {
    return (static_cast<std::uint64_t>(key) << 33) | (max_elements - i);
  }

 private:
  constexpr hashed_topk(double r, double slot_ratio, double sample_rate, std::uint64_t seed)
      : ratio_(r), slot_ratio_(slot_ratio), sample_rate_(sample_rate), seed_(seed) {}

  double ratio_ = 0.01;
  double slot_ratio_ = 0.0;
  double sample_rate_ = 0.01;
  std::uint64_t seed_ = 0xd2a6;
};

}  // namespace gradzip::hash
