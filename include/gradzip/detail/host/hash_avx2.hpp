// `hash64` and `hash_to_range` (random/hash.hpp) for four consecutive indices per AVX2 vector,
// bit for bit the scalar results: the host Count Sketch is bound by its hashes (three 64-bit
// multiplies per element and row, all on the one scalar multiplier), and AVX2's four 32 x 32
// multipliers per instruction do the same work in about two thirds of the time.
#pragma once

#if defined(__AVX2__)
#include <immintrin.h>

#include <cstdint>

#include "gradzip/random/hash.hpp"

namespace gradzip::detail {

class hash64_avx2 {
 public:
  /// Hashes of (seed, i) mapped to [0, range); range must be below 2^32.
  hash64_avx2(std::uint64_t seed, std::uint64_t range)
      : offset_(set(static_cast<std::uint64_t>((seed + 1) * golden_gamma))),
        m1_low_(set(mix1 & 0xFFFFFFFFu)), m1_high_(set(mix1 >> 32)),
        m2_low_(set(mix2 & 0xFFFFFFFFu)), m2_high_(set(mix2 >> 32)), range_(set(range)) {}

  /// hash64(seed, i) for the four indices in `index`.
  __m256i hash(__m256i index) const {
    __m256i z = _mm256_add_epi64(index, offset_);
    z = multiply(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), m1_low_, m1_high_);
    z = multiply(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), m2_low_, m2_high_);
    return _mm256_xor_si256(z, _mm256_srli_epi64(z, 31));
  }

  /// hash_to_range(h, range) for range < 2^32: (h_high range + (h_low range >> 32)) >> 32, which
  /// cannot overflow 64 bits.
  __m256i to_range(__m256i h) const {
    const __m256i high = _mm256_mul_epu32(_mm256_srli_epi64(h, 32), range_);
    const __m256i low = _mm256_srli_epi64(_mm256_mul_epu32(h, range_), 32);
    return _mm256_srli_epi64(_mm256_add_epi64(high, low), 32);
  }

 private:
  // SplitMix64's multipliers (random/hash.hpp's mix64).
  static constexpr std::uint64_t mix1 = 0xBF58476D1CE4E5B9ull;
  static constexpr std::uint64_t mix2 = 0x94D049BB133111EBull;

  static __m256i set(std::uint64_t v) { return _mm256_set1_epi64x(static_cast<long long>(v)); }

  /// a * m mod 2^64 from three 32 x 32 products (the high x high one falls off the top).
  static __m256i multiply(__m256i a, __m256i m_low, __m256i m_high) {
    const __m256i low = _mm256_mul_epu32(a, m_low);
    const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), m_low), _mm256_mul_epu32(a, m_high));
    return _mm256_add_epi64(low, _mm256_slli_epi64(cross, 32));
  }

  __m256i offset_, m1_low_, m1_high_, m2_low_, m2_high_, range_;
};

}  // namespace gradzip::detail
#endif
