/**
 * @file hash.hpp
 * @brief `hash64(seed, index)`: a stateless 64-bit hash of an index, the same on every executor.
 *
 * The finalizer is SplitMix64's (Steele, Lea, Flood, "Fast splittable pseudorandom number
 * generators", OOPSLA'14; constants from Vigna's public-domain splitmix64.c), applied to
 * `index + (seed + 1) * golden_gamma`. It is a bijection of `index` for a fixed seed, so distinct
 * indices never collide in the full 64-bit output. Hash-based stages (bucket choice, partitions)
 * reduce it to a range with `hash_to_range`, which uses the high bits (Lemire's multiply-shift).
 *
 * `multiply_shift` is the cheaper, provably pairwise independent family the Count Sketch uses.
 *
 * @code
 * const std::uint64_t i = 12345, columns = 1000;
 * std::uint64_t h = gradzip::hash64(seed, i);
 * std::uint64_t bucket = gradzip::hash_to_range(h, columns);  // in [0, columns)
 * const auto f = gradzip::multiply_shift::from_key(seed);      // 2-independent onto 32 bits
 * std::uint32_t g = f(i);
 * @endcode
 */
#pragma once

#include <cstdint>

#include "gradzip/core/config.hpp"

namespace gradzip {

namespace detail {
inline constexpr std::uint64_t golden_gamma = 0x9E3779B97F4A7C15ull;
}

/// SplitMix64's output function (a bijection on 64-bit words).
GRADZIP_HOST_DEVICE constexpr std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

GRADZIP_HOST_DEVICE constexpr std::uint64_t hash64(std::uint64_t seed, std::uint64_t index) {
  return mix64(index + (seed + 1) * detail::golden_gamma);
}

/// Maps a 64-bit hash uniformly to [0, range) using its high bits.
GRADZIP_HOST_DEVICE constexpr std::uint64_t hash_to_range(std::uint64_t hash, std::uint64_t range) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(hash, range);
#else
  __extension__ using u128 = unsigned __int128;  // GCC/Clang extension, silenced for -Wpedantic
  return static_cast<std::uint64_t>((static_cast<u128>(hash) * range) >> 64);
#endif
}

/**
 * Strongly universal (pairwise independent) hashing of 64-bit indices onto 32 bits: the index
 * is split into 32-bit halves (lo, hi) and
 *
 *     f(i) = ((a0 lo + a1 hi + b) mod 2^64) >> 32,   a0, a1, b uniform 64-bit words.
 *
 * Dietzfelbinger's multiply-add-shift extended to vectors of words (Dietzfelbinger, "Universal
 * hashing and k-wise independent random variables via integer arithmetic without primes",
 * STACS 1996; Thorup, "High speed hashing for integers and strings", 2015, where 2w-bit
 * multipliers on w-bit words give w strongly universal bits): for any two distinct indices,
 * (f(i), f(j)) is uniform on 32 x 32 bits over the choice of (a0, a1, b). One 64 x 32-bit
 * multiply per index below 2^32 (a1 hi + b is then the constant b).
 */
struct multiply_shift {
  std::uint64_t a0 = 0, a1 = 0, b = 0;

  /// The function drawn from `key` (SplitMix64 outputs stand in for the uniform words).
  GRADZIP_HOST_DEVICE static constexpr multiply_shift from_key(std::uint64_t key) {
    return {hash64(key, 0), hash64(key, 1), hash64(key, 2)};
  }
  /// a1 hi + b: the additive constant shared by every index whose high half is `high`.
  GRADZIP_HOST_DEVICE constexpr std::uint64_t offset(std::uint64_t high) const { return a1 * high + b; }
  GRADZIP_HOST_DEVICE constexpr std::uint32_t operator()(std::uint64_t i) const {
    return static_cast<std::uint32_t>((a0 * (i & 0xFFFFFFFFu) + offset(i >> 32)) >> 32);
  }
};

}  // namespace gradzip
