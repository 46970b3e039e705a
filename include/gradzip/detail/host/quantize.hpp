// The host's bucketed values stages: encoding buckets and decoding them into a tensor.
//
// Written for the compiler's vectorizer and the cache: a bucket's statistics are gathered in
// the canonical 32-lane order (quantize/bucket_stats.hpp) in one read, then its codes are made
// 256 at a time from the same (now cached) values, with the random bits of eight consecutive
// elements drawn by one Philox evaluation, and packed into bit planes with AVX2 or SSE2 `movemask`
// where the target has it. Decoding expands each bit-plane group of 32 codes through a table and
// accumulates the decoded values contiguously. No allocation: buffers live on the stack.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "gradzip/core/executor.hpp"
#include "gradzip/detail/codec_traits.hpp"
#include "gradzip/detail/host/parallel.hpp"
#include "gradzip/detail/values.hpp"
#include "gradzip/quantize/bucket_stats.hpp"
#include "gradzip/random/philox.hpp"

namespace gradzip::detail {

/// Packs 32 codes into `bits` bit-plane words (quantize/bit_packing.hpp's layout).
template <class Code>
inline void pack_32(const Code* codes, int bits, std::uint32_t* words) {
#if defined(__AVX2__)
  if constexpr (sizeof(Code) == 1) {  // bit b of each byte moved to its top bit: one word per plane
    const __m256i all = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes));
    for (int b = 0; b < bits; ++b) {
      const __m256i top = _mm256_sll_epi16(all, _mm_cvtsi32_si128(7 - b));
      words[b] = static_cast<std::uint32_t>(_mm256_movemask_epi8(top));
    }
    return;
  }
#elif defined(__SSE2__)
  if constexpr (sizeof(Code) == 1) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16));
    for (int b = 0; b < bits; ++b) {  // bit b of every byte moved to its top bit, then gathered
      const __m128i shift = _mm_cvtsi32_si128(7 - b);
      const auto low = static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_sll_epi16(lo, shift)));
      const auto high = static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_sll_epi16(hi, shift)));
      words[b] = low | (high << 16);
    }
    return;
  }
#endif
  quantize::pack_group(codes, 32, bits, words);
}

/// Byte i of spread_byte(v) is bit i of v: eight codes' bits of one plane, one per byte.
constexpr std::uint64_t spread_byte(unsigned v) {
  std::uint64_t out = 0;
  for (int i = 0; i < 8; ++i) out |= static_cast<std::uint64_t>((v >> i) & 1u) << (8 * i);
  return out;
}

struct spread_table {
  std::uint64_t entry[256];
  constexpr spread_table() : entry() {
    for (unsigned v = 0; v < 256; ++v) entry[v] = spread_byte(v);
  }
};
inline constexpr spread_table spread_bytes{};

/// Unpacks one group's `bits` words into 32 codes. Codes are gathered as bytes (eight per
/// 64-bit word, one table lookup per byte of a plane), so codes of up to 8 bits need no
/// per-code work at all; with AVX2, byte codes are built one plane per vector step.
template <class Code>
inline void unpack_32(const std::uint8_t* words, int bits, Code* codes) {
#if defined(__AVX2__)
  if constexpr (sizeof(Code) == 1) {
    // Each plane's word broadcast, byte l of the vector taking the word's byte l / 8, then
    // tested against bit l % 8: a byte mask of the codes with this bit, six instructions per
    // plane for all 32 codes.
    const __m256i byte_of = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                             2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit_of = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
    __m256i out = _mm256_setzero_si256();
    for (int b = 0; b < bits; ++b) {
      std::uint32_t w;
      std::memcpy(&w, words + 4 * b, 4);
      const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(w)), byte_of);
      const __m256i has = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit_of), bit_of);
      out = _mm256_or_si256(out, _mm256_and_si256(has, _mm256_set1_epi8(static_cast<char>(1 << b))));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes), out);
    return;
  }
#endif
  std::uint64_t low[4] = {0, 0, 0, 0};   // planes 0..7: code l in byte l % 8 of low[l / 8]
  std::uint64_t high[4] = {0, 0, 0, 0};  // planes 8..15, likewise
  for (int b = 0; b < bits; ++b) {
    std::uint32_t w;
    std::memcpy(&w, words + 4 * b, 4);
    std::uint64_t* into = b < 8 ? low : high;
    for (int q = 0; q < 4; ++q) into[q] |= spread_bytes.entry[(w >> (8 * q)) & 0xFFu] << (b % 8);
  }
  if constexpr (sizeof(Code) == 1) {
    std::memcpy(codes, low, 32);  // little-endian: byte l is code l
  } else {
    std::uint8_t lo[32], hi[32];
    std::memcpy(lo, low, 32);
    std::memcpy(hi, high, 32);
    for (int l = 0; l < 32; ++l) codes[l] = static_cast<Code>(lo[l] | (hi[l] << 8));
  }
}

/// One step of the lanes' butterfly: lane l < Offset merges lane l + Offset into itself.
template <class Values, int Offset>
inline void merge_lanes(float (&acc)[4][32]) {
  for (int l = 0; l < Offset; ++l) {
    const quantize::bucket_stats merged = Values::merge({{acc[0][l], acc[1][l], acc[2][l], acc[3][l]}},
                                                        {{acc[0][l + Offset], acc[1][l + Offset],
                                                          acc[2][l + Offset], acc[3][l + Offset]}});
    for (int k = 0; k < 4; ++k) acc[k][l] = merged.v[k];
  }
}

/// The least and greatest of x[0, m) (m >= 1 16-bit floats: bf16 or fp16), and whether all are
/// finite, from their bits alone: three integer reductions (a signed maximum, an unsigned maximum
/// and minimum) that vectorize 32 values to a 512-bit register, where the float path widens
/// each value and compares it three times (0.81x bf16 uniform 4-bit's compress at 2^16).
/// As unsigned integers, negative values (sign bit set) are above positive ones and ordered by
/// magnitude; as signed ones, the non-negative values are the largest, ordered by magnitude.
/// - least: the negative of largest magnitude if there is one (the unsigned maximum), else the
///   smallest magnitude (the unsigned minimum);
/// - greatest: the largest non-negative value if there is one (the signed maximum), else the
///   negative of smallest magnitude (the unsigned minimum, all being negative);
/// - finite: no non-negative bits at or above the exponent's mask (inf, NaN) under the signed
///   maximum, no negative ones under the unsigned maximum.
struct extrema_16 {
  float lo, hi;
  bool finite;
};
template <class T>
inline extrema_16 extrema_of_16_bit(const T* x, std::uint64_t m) {
  static_assert(sizeof(T) == 2, "extrema_of_16_bit: bf16 or fp16");
  constexpr std::uint16_t exponent = element_traits<T>::type == element_type::bf16 ? 0x7F80u : 0x7C00u;
  std::int16_t signed_max = -0x8000;
  std::uint16_t unsigned_max = 0, unsigned_min = 0xFFFFu;
  for (std::uint64_t j = 0; j < m; ++j) {
    const auto b = bit_cast<std::uint16_t>(x[j]);
    const auto s = static_cast<std::int16_t>(b);
    signed_max = s > signed_max ? s : signed_max;
    unsigned_max = b > unsigned_max ? b : unsigned_max;
    unsigned_min = b < unsigned_min ? b : unsigned_min;
  }
  const std::uint16_t lo = unsigned_max >= 0x8000u ? unsigned_max : unsigned_min;
  const std::uint16_t hi = signed_max >= 0 ? static_cast<std::uint16_t>(signed_max) : unsigned_min;
  const bool finite = signed_max < static_cast<std::int16_t>(exponent) && unsigned_max < (0x8000u | exponent);
  return {static_cast<float>(to_float(bit_cast<T>(lo))), static_cast<float>(to_float(bit_cast<T>(hi))), finite};
}

/// The canonical statistics of x[begin, end) (quantize/bucket_stats.hpp's order), read once; a
/// stage whose statistics are extrema takes them from 16-bit floats' bits (`extrema_of_16_bit`).
/// The 32 lanes' statistics are kept as four arrays of 32 floats, so that the loop over lanes
/// is a loop over contiguous floats the compiler turns into vector instructions.
template <class Values, class T>
quantize::bucket_stats bucket_statistics(const T* x, std::uint64_t begin, std::uint64_t end) {
  if constexpr (sizeof(T) == 2 && has_extrema_stats<Values>) {  // no order to keep
    const extrema_16 e = extrema_of_16_bit(x + begin, end - begin);
    return Values::stats_of_extrema(e.lo, e.hi, e.finite);
  }
  alignas(64) float acc[4][32];
  const quantize::bucket_stats empty = Values::empty_stats();
  for (int k = 0; k < 4; ++k) std::fill(acc[k], acc[k] + 32, empty.v[k]);
  const auto add_row = [&](const T* row, int lanes) {
    for (int l = 0; l < lanes; ++l) {
      quantize::bucket_stats s{{acc[0][l], acc[1][l], acc[2][l], acc[3][l]}};
      Values::add(s, static_cast<float>(to_float(row[l])));
      for (int k = 0; k < 4; ++k) acc[k][l] = s.v[k];
    }
  };
  std::uint64_t j = begin;
  for (; j + 32 <= end; j += 32) add_row(x + j, 32);
  if (j < end) add_row(x + j, static_cast<int>(end - j));
  // Lane 0's side of the xor butterfly: merges are commutative bit for bit, so lane l and lane
  // l ^ offset hold the same value and lane 0 only needs lanes below the offset (31 merges).
  // The merges stay on the four arrays, so the offsets 16 and 8 are vector instructions (as an
  // array of 32 structs they were scalar, and took as long as the 512 values' loop above).
  // Each offset is a compile-time constant (`merge_lanes<Offset>`): with a run-time offset, GCC
  // turned the stores of a stage's constant components (sum_and_flag's zeros) into
  // variable-length memsets, two `rep stos` per step, half of QSGD's statistics time.
  merge_lanes<Values, 16>(acc);
  merge_lanes<Values, 8>(acc);
  merge_lanes<Values, 4>(acc);
  merge_lanes<Values, 2>(acc);
  merge_lanes<Values, 1>(acc);
  return {{acc[0][0], acc[1][0], acc[2][0], acc[3][0]}};
}

#if defined(__AVX2__)
/// One Philox round on four blocks held in the even 32-bit lanes of 64-bit lanes (vpmuludq's
/// operand layout). The odd lanes carry garbage (the products' other halves) that no later
/// multiply reads, so a round is two multiplies, two shifts and four xors.
inline void philox_round_4(__m256i& c0, __m256i& c1, __m256i& c2, __m256i& c3, __m256i m0, __m256i m1,
                           __m256i k0, __m256i k1) {
  const __m256i p0 = _mm256_mul_epu32(c0, m0);
  const __m256i p1 = _mm256_mul_epu32(c2, m1);
#if defined(__AVX512VL__)
  // One three-way xor (truth table 0x96) instead of two.
  c0 = _mm256_ternarylogic_epi32(_mm256_srli_epi64(p1, 32), c1, k0, 0x96);
  c2 = _mm256_ternarylogic_epi32(_mm256_srli_epi64(p0, 32), c3, k1, 0x96);
#else
  c0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), c1), k0);
  c2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), c3), k1);
#endif
  c1 = p1;
  c3 = p0;
}

/// Philox4x32-10 of eight consecutive counters (c, c + 1, ..., c + 7, step, tensor id) at a
/// time, written as 32 words in block order: the same words as eight `philox_for` calls. Blocks
/// 0, 2, 4, 6 run in the even lanes and blocks 1, 3, 5, 7 in the (shifted down) odd lanes, side
/// by side. The ten rounds' keys and the step and tensor words are broadcast once per object,
/// not per eight blocks (they were a fifth of the instructions).
class philox_avx2 {
 public:
  philox_avx2(std::uint64_t seed, quantize::compress_context ctx)
      : m0_(_mm256_set1_epi32(static_cast<int>(philox_m0))), m1_(_mm256_set1_epi32(static_cast<int>(philox_m1))),
        step_(_mm256_set1_epi32(static_cast<int>(ctx.step))),
        tensor_(_mm256_set1_epi32(static_cast<int>(ctx.tensor_id))) {
    auto k0 = static_cast<std::uint32_t>(seed), k1 = static_cast<std::uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {
      key0_[round] = _mm256_set1_epi32(static_cast<int>(k0));
      key1_[round] = _mm256_set1_epi32(static_cast<int>(k1));
      k0 += philox_w0;
      k1 += philox_w1;
    }
  }

  void blocks_8(std::uint64_t counter_first, std::uint32_t* out) const {
    __m256i lows, highs;
    counters(counter_first, lows, highs);
    __m256i e0 = lows, e1 = highs, e2 = step_, e3 = tensor_;
    __m256i o0 = _mm256_srli_epi64(lows, 32), o1 = _mm256_srli_epi64(highs, 32), o2 = step_, o3 = tensor_;
    for (int round = 0; round < 10; ++round) {
      philox_round_4(e0, e1, e2, e3, m0_, m1_, key0_[round], key1_[round]);
      philox_round_4(o0, o1, o2, o3, m0_, m1_, key0_[round], key1_[round]);
    }
    // Odd blocks back into the odd lanes, then a 4 x 8 transpose into block order.
    const __m256i c0 = _mm256_blend_epi32(e0, _mm256_slli_epi64(o0, 32), 0xAA);
    const __m256i c1 = _mm256_blend_epi32(e1, _mm256_slli_epi64(o1, 32), 0xAA);
    const __m256i c2 = _mm256_blend_epi32(e2, _mm256_slli_epi64(o2, 32), 0xAA);
    const __m256i c3 = _mm256_blend_epi32(e3, _mm256_slli_epi64(o3, 32), 0xAA);
    const __m256i a01 = _mm256_unpacklo_epi32(c0, c1);  // blocks 0, 1 | 4, 5: words 0 and 1
    const __m256i a23 = _mm256_unpacklo_epi32(c2, c3);  // blocks 0, 1 | 4, 5: words 2 and 3
    const __m256i b01 = _mm256_unpackhi_epi32(c0, c1);  // blocks 2, 3 | 6, 7
    const __m256i b23 = _mm256_unpackhi_epi32(c2, c3);
    const __m256i blocks04 = _mm256_unpacklo_epi64(a01, a23);
    const __m256i blocks15 = _mm256_unpackhi_epi64(a01, a23);
    const __m256i blocks26 = _mm256_unpacklo_epi64(b01, b23);
    const __m256i blocks37 = _mm256_unpackhi_epi64(b01, b23);
    auto* v = reinterpret_cast<__m256i*>(out);
    _mm256_storeu_si256(v + 0, _mm256_permute2x128_si256(blocks04, blocks15, 0x20));
    _mm256_storeu_si256(v + 1, _mm256_permute2x128_si256(blocks26, blocks37, 0x20));
    _mm256_storeu_si256(v + 2, _mm256_permute2x128_si256(blocks04, blocks15, 0x31));
    _mm256_storeu_si256(v + 3, _mm256_permute2x128_si256(blocks26, blocks37, 0x31));
  }

 private:
  /// The low and high words of counters first .. first + 7, one per 32-bit lane.
  static void counters(std::uint64_t first, __m256i& lows, __m256i& highs) {
    const auto low = static_cast<std::uint32_t>(first);
    if (low <= 0xFFFFFFFFu - 7) {  // no carry into the high word among the eight
      lows = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(low)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      highs = _mm256_set1_epi32(static_cast<int>(first >> 32));
      return;
    }
    alignas(32) std::uint32_t l[8], h[8];
    for (int b = 0; b < 8; ++b) {
      const std::uint64_t counter = first + static_cast<std::uint64_t>(b);
      l[b] = static_cast<std::uint32_t>(counter);
      h[b] = static_cast<std::uint32_t>(counter >> 32);
    }
    lows = _mm256_load_si256(reinterpret_cast<const __m256i*>(l));
    highs = _mm256_load_si256(reinterpret_cast<const __m256i*>(h));
  }

  __m256i m0_, m1_, step_, tensor_;
  __m256i key0_[10], key1_[10];
};
#endif

/// Philox blocks first_block, first_block + 1, ... (`blocks` of them, at most 64), written as
/// 4 words each in block order, evaluated side by side: with AVX2, eight blocks per vector
/// (Philox is most of a stochastic quantizer's cost); otherwise as a structure of arrays, so
/// each round is a loop of widening multiplies. The same words as `philox_for`.
inline void philox_blocks(std::uint64_t seed, quantize::compress_context ctx, std::uint64_t first_block,
                          int blocks, std::uint32_t* out) {
  int b = 0;
#if defined(__AVX2__)
  if (blocks >= 8) {
    const philox_avx2 philox(seed, ctx);
    for (; b + 8 <= blocks; b += 8) philox.blocks_8(first_block + static_cast<std::uint64_t>(b), out + 4 * b);
  }
#endif
  constexpr int most = 64;
  std::uint32_t c0[most], c1[most], c2[most], c3[most];
  const int rest = blocks - b;
  for (int r = 0; r < rest; ++r) {
    const std::uint64_t counter = first_block + static_cast<std::uint64_t>(b + r);
    c0[r] = static_cast<std::uint32_t>(counter);
    c1[r] = static_cast<std::uint32_t>(counter >> 32);
    c2[r] = static_cast<std::uint32_t>(ctx.step);  // below 2^32: check_context
    c3[r] = static_cast<std::uint32_t>(ctx.tensor_id);
  }
  auto k0 = static_cast<std::uint32_t>(seed), k1 = static_cast<std::uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    for (int r = 0; r < rest; ++r) {
      const std::uint64_t p0 = static_cast<std::uint64_t>(philox_m0) * c0[r];
      const std::uint64_t p1 = static_cast<std::uint64_t>(philox_m1) * c2[r];
      const std::uint32_t n0 = static_cast<std::uint32_t>(p1 >> 32) ^ c1[r] ^ k0;
      const std::uint32_t n2 = static_cast<std::uint32_t>(p0 >> 32) ^ c3[r] ^ k1;
      c1[r] = static_cast<std::uint32_t>(p1);
      c3[r] = static_cast<std::uint32_t>(p0);
      c0[r] = n0;
      c2[r] = n2;
    }
    k0 += philox_w0;
    k1 += philox_w1;
  }
  for (int r = 0; r < rest; ++r) {
    std::uint32_t* words = out + 4 * (b + r);
    words[0] = c0[r];
    words[1] = c1[r];
    words[2] = c2[r];
    words[3] = c3[r];
  }
}

/// The stochastic stages' random words (`random_half_word`) for `count` (a multiple of 8, at
/// most 256) consecutive elements from tensor index `first` (a multiple of 8): one Philox block
/// per eight elements, each 32-bit word split into its two halves, moved to the top.
/// tests/host/test_random.cpp checks them against `random_half_word`.
inline void consecutive_half_words(std::uint64_t seed, quantize::compress_context ctx, std::uint64_t first,
                                   std::uint64_t count, std::uint32_t* out) {
  std::uint32_t words[128];
  philox_blocks(seed, ctx, first >> 3, static_cast<int>(count / 8), words);
  // Even element 2w takes word w's low half, odd 2w + 1 its high half. Written on the words'
  // values, not their bytes, GCC vectorizes it (a shift, a mask, two unpacks, two lane
  // permutes per 16 elements); reading them as 16-bit halves in memory needed a copy of the
  // words, a libc memmove call per block (4 % of QSGD's compress).
  for (std::uint64_t w = 0; w < count / 2; ++w) {
    out[2 * w] = words[w] << 16;
    out[2 * w + 1] = words[w] & 0xFFFF0000u;
  }
}

/// Whether every value of x[0, m) is one `encode_in_range` takes: one vectorized pass over the
/// block the encode is about to read anyway (it is in L1).
template <class T>
inline bool all_in_encode_range(const T* x, std::uint64_t m, std::uint32_t floor) {
  std::uint32_t outside = 0;
  for (std::uint64_t j = 0; j < m; ++j) outside |= outside_encode_range(static_cast<float>(to_float(x[j])), floor);
  return outside == 0;
}

template <>
struct values_backend<host> {
  static constexpr std::uint64_t block = 256;  // values encoded per step, a multiple of 32

  /// Encodes x[0 .. count) bucket by bucket: scale records, then bit-packed codes.
  template <class Values, class T, class IndexOf>
  static void encode_buckets(host& exec, const Values& values, const T* x, std::uint64_t count,
                             std::uint8_t* scales, std::uint8_t* codes, IndexOf index_of,
                             quantize::compress_context ctx) {
    const std::uint64_t buckets = Values::bucket_count(count);
    const std::size_t chunks = std::max<std::size_t>(1, chunk_count(exec, count));
    for_each_chunk(exec, chunks, [&](std::size_t c) {
      const index_range mine = chunk_of(buckets, chunks, c);
      for (std::uint64_t b = mine.begin; b < mine.end; ++b) {
        const std::uint64_t begin = b * Values::bucket;
        const std::uint64_t end = std::min<std::uint64_t>(count, begin + Values::bucket);
        prefetch_next_bucket(x, end, std::min<std::uint64_t>(count, end + Values::bucket));
        const auto record = Values::make_record(bucket_statistics<Values>(x, begin, end), end - begin);
        Values::store_record(scales, b, record);
        for (std::uint64_t g = begin; g < end; g += block) {
          encode_block(values, x, g, std::min<std::uint64_t>(end - g, block), record, codes, index_of, ctx);
        }
      }
    });
  }

  /// Asks for x[begin, end) ahead of its statistics pass: the current bucket's codes are
  /// computed from cache meanwhile, so its read overlaps that work.
  template <class T>
  static void prefetch_next_bucket(const T* x, std::uint64_t begin, std::uint64_t end) {
    const auto* from = reinterpret_cast<const char*>(x + begin);
    const auto* to = reinterpret_cast<const char*>(x + end);
    for (const char* p = from; p < to; p += 64) __builtin_prefetch(p);
  }

  /// Codes for x[g, g + m) (g a multiple of 32, m <= block), written as packed groups.
  template <class Values, class T, class IndexOf>
  static void encode_block(const Values& values, const T* x, std::uint64_t g, std::uint64_t m,
                           const typename Values::record& record, std::uint8_t* codes,
                           IndexOf index_of, quantize::compress_context ctx) {
    alignas(16) typename Values::code_type code[block];
    const auto encode_all = [&](auto word_of) {
      const auto encode_run = [&](auto encode) {
        for (std::uint64_t j = 0; j < m; ++j) {
          code[j] = static_cast<typename Values::code_type>(encode(static_cast<float>(to_float(x[g + j])), word_of(j)));
        }
      };
      if constexpr (has_in_range_encode<Values>) {
        if (all_in_encode_range(x + g, m, Values::in_range_floor(record))) {
          encode_run([&](float v, std::uint32_t random) { return values.encode_in_range(v, record, random); });
          return;
        }
      }
      encode_run(quantize::bucket_encoder(values, record));
    };
    if constexpr (Values::stochastic) {
      std::uint32_t random[block];
      if constexpr (std::is_same_v<IndexOf, identity_index>) {
        consecutive_half_words(values.seed, ctx, g, (m + 7) / 8 * 8, random);
      } else {
        for (std::uint64_t j = 0; j < m; ++j) random[j] = quantize::element_random(values, index_of(g + j), ctx);
      }
      encode_all([&](std::uint64_t j) { return random[j]; });
    } else {
      encode_all([](std::uint64_t) { return 0u; });  // deterministic stages ignore the word
    }
    const std::uint64_t padded = (m + 31) / 32 * 32;
    std::fill(code + m, code + padded, typename Values::code_type{0});
    for (std::uint64_t q = 0; q < padded; q += 32) {
      std::uint32_t words[16];
      pack_32(code + q, Values::bits, words);
      std::memcpy(codes + ((g + q) / 32) * Values::bits * 4, words, Values::bits * 4);
    }
  }

  /// Whether every code of the payload's `count` values is one the stage writes, compared on
  /// the bit planes 32 codes at a time (`first_code_above`); `bad` is the first that is not.
  template <class Values>
  static bool codes_valid(const std::uint8_t* codes, std::uint64_t first_group, std::uint64_t last_group,
                          std::uint64_t count, std::uint64_t& bad) {
    for (std::uint64_t q = first_group; q < last_group; ++q) {
      const int l = quantize::first_code_above<Values::bits>(codes + q * Values::bits * 4, Values::max_code,
                                                             count - q * 32);
      if (l >= 0) {
        bad = q * 32 + static_cast<std::uint64_t>(l);
        return false;
      }
    }
    return true;
  }

  /// out[index_of(j)] += alpha x value j (x scale_of(j), in double, when given: random-k's
  /// unbiasing factor) for the values of groups [first_group, last_group).
  template <class Values, class T, class IndexOf, class ScaleOf = std::nullptr_t>
  static void decode_groups(const std::uint8_t* scales, const std::uint8_t* codes, std::uint64_t count,
                            std::uint64_t first_group, std::uint64_t last_group, IndexOf index_of,
                            T* out, float alpha, ScaleOf scale_of = nullptr) {
    for (std::uint64_t q = first_group; q < last_group; ++q) {
      const auto record = Values::load_record(scales, q * 32 / Values::bucket);
      typename Values::code_type code[32];
      unpack_32(codes + q * Values::bits * 4, Values::bits, code);
      const std::uint64_t j0 = q * 32;
      const int n = static_cast<int>(std::min<std::uint64_t>(32, count - j0));
      // A whole dense group decodes straight into its accumulation, one loop: through value[],
      // the decode's 256-bit stores were reloaded 512 bits at a time by the accumulation (built
      // for AVX-512), loads that cannot forward from two stores in flight. 0.74-0.91x the time.
      if constexpr (std::is_same_v<ScaleOf, std::nullptr_t> && std::is_same_v<IndexOf, identity_index>) {
        if (n == 32) {
          T* y = out + j0;
          for_each_decoded<Values>(code, record, [&](int l, float v) { accumulate(y[l], v, alpha); });
          continue;
        }
      }
      float value[32];
      decode_codes<Values>(code, record, value);
      if constexpr (!std::is_same_v<ScaleOf, std::nullptr_t>) {
        for (int l = 0; l < n; ++l) accumulate(out[index_of(j0 + l)], value[l] * scale_of(j0 + l), alpha);
      } else if constexpr (std::is_same_v<IndexOf, identity_index>) {
        T* y = out + j0;
        for (int l = 0; l < n; ++l) accumulate(y[l], value[l], alpha);
      } else {
        for (int l = 0; l < n; ++l) accumulate(out[index_of(j0 + l)], value[l], alpha);
      }
    }
  }
};

}  // namespace gradzip::detail
