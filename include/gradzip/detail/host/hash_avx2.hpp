// `multiply_shift` (random/hash.hpp) and the Count Sketch's bucket reduction for eight
// consecutive indices per step under AVX2, bit for bit the scalar results. Indices are grouped
// by their high 32-bit half, so a1 hi + b is one constant and each index costs the 64 x 32-bit
// product a0 lo: two 32 x 32 multiplies, four indices per instruction. The bucket is one more.
#pragma once

#if defined(__AVX2__)
#include <immintrin.h>

#include <cstdint>

#include "gradzip/random/hash.hpp"

namespace gradzip::detail {

class multiply_shift_avx2 {
 public:
  /// f on the indices whose high half is `high`; buckets ((f mod 2^31) columns) >> 31, which
  /// needs columns <= 2^31.
  multiply_shift_avx2(const multiply_shift& f, std::uint64_t high, std::uint64_t columns)
      : a_low_(set(f.a0 & 0xFFFFFFFFu)), a_high_(set(f.a0 >> 32)), offset_(set(f.offset(high))), columns_(set(columns)) {}

  /// The first four low halves of a run starting at low half `first` (the next four are + 4).
  static __m256i lanes_from(std::uint32_t first) {
    const auto f = static_cast<long long>(first);
    return _mm256_setr_epi64x(f, f + 1, f + 2, f + 3);
  }

  /// Hashes and buckets of the eight indices with low halves `low`, `low` + 4 (lanes of 64 bits;
  /// a run never wraps a low half) as 32-bit words in index order; returns the next eight's `low`.
  __m256i hash_8(__m256i low, std::uint32_t* hashes, std::uint32_t* buckets) const {
    const __m256i four = _mm256_set1_epi64x(4);
    const __m256i high = _mm256_add_epi64(low, four);
    const __m256i h = pack(hash(low), hash(high));
    const __m256i even = bucket(h), odd = bucket(_mm256_srli_epi64(h, 32));
    const __m256i b = _mm256_or_si256(even, _mm256_slli_epi64(odd, 32));  // b0 b1 b2 ... in order
    _mm256_store_si256(reinterpret_cast<__m256i*>(hashes), h);
    _mm256_store_si256(reinterpret_cast<__m256i*>(buckets), b);
    return _mm256_add_epi64(high, four);
  }

 private:
  static __m256i set(std::uint64_t v) { return _mm256_set1_epi64x(static_cast<long long>(v)); }

  /// f of four low halves, in the low 32 bits of each 64-bit lane (upper bits zero).
  __m256i hash(__m256i low) const {
    const __m256i product =
        _mm256_add_epi64(_mm256_mul_epu32(low, a_low_), _mm256_slli_epi64(_mm256_mul_epu32(low, a_high_), 32));
    return _mm256_srli_epi64(_mm256_add_epi64(product, offset_), 32);
  }
  /// Buckets of the hashes in the even 32-bit lanes of h, in the low halves of 64-bit lanes.
  __m256i bucket(__m256i h) const {
    const __m256i low31 = _mm256_set1_epi64x(0x7FFFFFFF);
    return _mm256_srli_epi64(_mm256_mul_epu32(_mm256_and_si256(h, low31), columns_), 31);
  }
  /// Eight 32-bit words in order from the low halves of a's and b's 64-bit lanes.
  static __m256i pack(__m256i a, __m256i b) {
    const __m256i interleaved = _mm256_or_si256(a, _mm256_slli_epi64(b, 32));  // a0 b0 a1 b1 ...
    return _mm256_permutevar8x32_epi32(interleaved, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
  }

  __m256i a_low_, a_high_, offset_, columns_;
};

}  // namespace gradzip::detail
#endif
