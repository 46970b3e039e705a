// The host's fp16 and bf16 casts of a dense run of floats, eight at a time.
//
// What `torch`'s `.half()` compiles to on x86 is F16C's vcvtps2ph, eight floats per instruction.
// The element-wise stage (quantize/cast.hpp) rounds the same way (round to nearest even, over-
// flow to inf, exact half subnormals) but writes one 2-byte value at a time; here a run is
// converted by the instruction and only NaN lanes are redone, since vcvtps2ph keeps a NaN's
// payload and gradzip sends the one quiet NaN 0x7E00 (with its sign). bf16 has no instruction
// before AVX-512 BF16: the same integer rounding as `float_to_bf16_bits`, in AVX2 lanes. Both are
// bit-exact with the scalar functions; tests/host/test_cast.cpp checks every float's high half
// against them.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "gradzip/quantize/float_formats.hpp"

namespace gradzip::detail {

/// out[i] = float_to_half_bits(x[i]) for i < n (out: 2n bytes, any alignment).
inline void cast_run_f16(const float* x, std::uint64_t n, std::uint8_t* out) {
  std::uint64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) {  // NaNs: gradzip's quiet NaN
      for (int l = 0; l < 8; ++l) {
        const std::uint16_t bits = quantize::float_to_half_bits(x[i + l]);
        std::memcpy(out + 2 * (i + l), &bits, 2);
      }
    }
  }
#endif
  for (; i < n; ++i) {
    const std::uint16_t bits = quantize::float_to_half_bits(x[i]);
    std::memcpy(out + 2 * i, &bits, 2);
  }
}

/// out[i] = float_to_bf16_bits(x[i]) for i < n (out: 2n bytes, any alignment).
inline void cast_run_bf16(const float* x, std::uint64_t n, std::uint8_t* out) {
  std::uint64_t i = 0;
#if defined(__AVX2__)
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i inf = _mm256_set1_epi32(0x7F800000);
  const __m256i bias = _mm256_set1_epi32(0x7FFF);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i quiet = _mm256_set1_epi32(0x0040);
  for (; i + 8 <= n; i += 8) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(v, 16), one);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(v, bias), odd), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(v, abs_mask), inf);  // signed compare: fine,
    const __m256i quieted = _mm256_or_si256(_mm256_srli_epi32(v, 16), quiet);    // both sides are >= 0
    const __m256i bits = _mm256_blendv_epi8(rounded, quieted, nan);
    // Lanes hold values below 2^16: pack the 32-bit lanes to 16 bits, then undo packus's
    // per-128-bit-half interleave.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), _mm256_castsi256_si128(packed));
  }
#endif
  for (; i < n; ++i) {
    const std::uint16_t bits = quantize::float_to_bf16_bits(x[i]);
    std::memcpy(out + 2 * i, &bits, 2);
  }
}

}  // namespace gradzip::detail
