#include <catch2/catch.hpp>

#include <set>

#include "gradzip/random/hash.hpp"
#include "gradzip/random/philox.hpp"
#include "gradzip/codec.hpp"

using gradzip::philox4x32_10;

// Known-answer vectors of Philox4x32-10 from the Random123 distribution (tests/kat_vectors).
TEST_CASE("philox4x32_10 matches the Random123 known-answer vectors", "[random]") {
  struct kat {
    gradzip::philox_words counter;
    gradzip::philox_key key;
    gradzip::philox_words expected;
  };
  const kat kats[] = {
      {{{0, 0, 0, 0}}, {{0, 0}}, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
       {{0xffffffffu, 0xffffffffu}},
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
       {{0xa4093822u, 0x299f31d0u}},
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const auto& k : kats) {
    const auto out = philox4x32_10(k.counter, k.key);
    for (int i = 0; i < 4; ++i) CHECK(out[i] == k.expected[i]);
  }
}

TEST_CASE("philox is usable in constant expressions", "[random]") {
  constexpr auto out = philox4x32_10({{0, 0, 0, 0}}, {{0, 0}});
  STATIC_REQUIRE(out[0] == 0x6627e8d5u);
}

TEST_CASE("philox_for keys the counter by index step and tensor", "[random]") {
  const auto a = gradzip::philox_for(7, 1, 2, 3);
  CHECK(a[0] == philox4x32_10({{3, 0, 1, 2}}, {{7, 0}})[0]);
  const auto big = gradzip::philox_for(0x100000002ull, 0, 0, 0x500000004ull);
  CHECK(big[1] == philox4x32_10({{4, 5, 0, 0}}, {{2, 1}})[1]);
  CHECK(gradzip::philox_for(7, 2, 2, 3)[0] != a[0]);
}

TEST_CASE("uniform_float stays in the unit interval", "[random]") {
  CHECK(gradzip::uniform_float(0) == 0.0f);
  CHECK(gradzip::uniform_float(0xFFFFFFFFu) < 1.0f);
  CHECK(gradzip::uniform_float(0x80000000u) == 0.5f);
}

TEST_CASE("hash64 is a bijection of the index for a fixed seed and depends on the seed", "[random]") {
  std::set<std::uint64_t> seen;
  for (std::uint64_t i = 0; i < 100000; ++i) seen.insert(gradzip::hash64(42, i));
  CHECK(seen.size() == 100000);
  CHECK(gradzip::hash64(1, 5) != gradzip::hash64(2, 5));
  // SplitMix64 reference: the first output of a generator seeded with 0 is mix64(golden gamma).
  CHECK(gradzip::mix64(0x9E3779B97F4A7C15ull) == 0xE220A8397B1DCDAFull);
}

TEST_CASE("hash_to_range is uniform enough over 64 buckets", "[random]") {
  std::uint64_t counts[64] = {};
  const std::uint64_t n = 64 * 4096;
  for (std::uint64_t i = 0; i < n; ++i) ++counts[gradzip::hash_to_range(gradzip::hash64(3, i), 64)];
  for (auto c : counts) {
    CHECK(c > 4096 * 0.9);
    CHECK(c < 4096 * 1.1);
  }
}

TEST_CASE("the host's batched random bits equal random_half_word element by element", "[random]") {
  // Counts that are and are not multiples of the AVX2 path's 64 elements (8 blocks); the last
  // starts put a carry into the counter's high word inside one batch of eight blocks.
  std::uint32_t words[256];
  for (std::uint64_t count : {std::uint64_t{8}, std::uint64_t{64}, std::uint64_t{72}, std::uint64_t{104},
                              std::uint64_t{256}}) {
    for (std::uint64_t first : {std::uint64_t{0}, std::uint64_t{4096}, (std::uint64_t{1} << 35) - 256,
                                (std::uint64_t{7} << 40), (std::uint64_t{1} << 35) - 32}) {
      const gradzip::quantize::compress_context ctx{17, 3};
      gradzip::detail::consecutive_half_words(0x1234567890ABCDEFull, ctx, first, count, words);
      for (std::uint64_t j = 0; j < count; ++j) {
        REQUIRE(words[j] == gradzip::random_half_word(0x1234567890ABCDEFull, 17, 3, first + j));
      }
    }
  }
}

TEST_CASE("random_half_word is half-word i mod 8 of Philox block i / 8, in the top 16 bits", "[random]") {
  for (std::uint64_t i : {std::uint64_t{0}, std::uint64_t{5}, std::uint64_t{8 * 1000 + 7}, (std::uint64_t{3} << 35) + 2}) {
    const auto block = gradzip::philox_for(99, 4, 6, i / 8);
    const std::uint32_t word = block[static_cast<int>((i % 8) / 2)];
    const std::uint32_t half = i % 2 == 0 ? (word & 0xFFFFu) : (word >> 16);
    CHECK(gradzip::random_half_word(99, 4, 6, i) == half << 16);
    CHECK(gradzip::uniform_float(gradzip::random_half_word(99, 4, 6, i)) == static_cast<float>(half) / 65536.0f);
  }
}

TEST_CASE("multiply_shift is multiply-add-shift over the index's two 32-bit halves", "[random]") {
  __extension__ using u128 = unsigned __int128;
  for (std::uint64_t key : {std::uint64_t{0}, std::uint64_t{7}, std::uint64_t{0xDEADBEEFCAFEF00Dull}}) {
    const auto f = gradzip::multiply_shift::from_key(key);
    CHECK(f.a0 == gradzip::hash64(key, 0));
    CHECK(f.a1 == gradzip::hash64(key, 1));
    CHECK(f.b == gradzip::hash64(key, 2));
    for (std::uint64_t i : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{0xFFFFFFFF}, std::uint64_t{1} << 32,
                            (std::uint64_t{5} << 32) + 12345, ~std::uint64_t{0}}) {
      const u128 sum = static_cast<u128>(f.a0) * (i & 0xFFFFFFFFu) + static_cast<u128>(f.a1) * (i >> 32) + f.b;
      CHECK(f(i) == static_cast<std::uint32_t>(static_cast<std::uint64_t>(sum) >> 32));
    }
  }
}

TEST_CASE("multiply_shift's values of two indices are jointly uniform over its keys", "[random]") {
  // Strong universality: over the draw of the function, (f(i), f(j)) is uniform for i != j. Here
  // 2^16 keys, and two 4-bit fields of each value: the top bits (the Count Sketch's sign and
  // the column's leading bits) and bits 27..30 (the column's alone). A chi-square statistic of
  // the 16 x 16 joint table has 255 degrees of freedom (mean 255, sd 22.6); 255 + 5 sd = 368.
  const std::pair<std::uint64_t, std::uint64_t> pairs[] = {
      {0, 1}, {7, 1000003}, {5, 5 + (std::uint64_t{1} << 32)}, {(std::uint64_t{1} << 33) + 1, 3}, {12, 13}};
  constexpr int keys = 1 << 16;
  for (const auto& [i, j] : pairs) {
    for (int shift : {28, 27}) {
      std::uint32_t table[16][16] = {};
      for (int k = 0; k < keys; ++k) {
        const auto f = gradzip::multiply_shift::from_key(static_cast<std::uint64_t>(k));
        ++table[(f(i) >> shift) & 15][(f(j) >> shift) & 15];
      }
      const double expected = keys / 256.0;
      double chi2 = 0;
      for (const auto& row : table) {
        for (std::uint32_t c : row) chi2 += (c - expected) * (c - expected) / expected;
      }
      INFO("indices " << i << ", " << j << ", bits from " << shift);
      CHECK(chi2 < 368);
    }
  }
}
