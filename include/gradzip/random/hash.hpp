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
 * @code
 * std::uint64_t h = gradzip::hash64(seed, i);
 * std::uint64_t bucket = gradzip::hash_to_range(h, columns);  // in [0, columns)
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

}  // namespace gradzip
