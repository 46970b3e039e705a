#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"
#include "gradzip/detail/host/quantize.hpp"
#include "gradzip/quantize/qsgd.hpp"
#include "gradzip/quantize/terngrad.hpp"

using namespace gradzip;
using quantize::rounding;

namespace {
template <int Bits, rounding R = rounding::nearest, std::uint32_t B = 512>
using dense_uniform = codec<sparsify::none, quantize::uniform<Bits, R, B>, encode::none>;

using test::round_trip;

/// Per-bucket step of max-min quantization with L levels.
std::vector<float> bucket_steps(const std::vector<float>& x, std::size_t bucket, unsigned levels) {
  std::vector<float> steps;
  for (std::size_t b = 0; b < x.size(); b += bucket) {
    const auto e = x.begin() + std::min(x.size(), b + bucket);
    const float lo = *std::min_element(x.begin() + b, e), hi = *std::max_element(x.begin() + b, e);
    steps.push_back((hi - lo) / levels);
  }
  return steps;
}
}  // namespace

TEST_CASE("bit packing round trips every width and count", "[uniform]") {
  std::mt19937 rng(1);
  for (int bits = 1; bits <= 8; ++bits) {
    for (int n : {1, 7, 31, 32}) {
      std::uint8_t codes[32] = {};
      for (int l = 0; l < n; ++l) codes[l] = static_cast<std::uint8_t>(rng() & ((1u << bits) - 1));
      std::uint32_t words[8];
      quantize::pack_group(codes, n, bits, words);
      for (int l = 0; l < 32; ++l) {
        REQUIRE(quantize::unpack_code(reinterpret_cast<const std::uint8_t*>(words), bits, l) ==
                (l < n ? codes[l] : 0u));
      }
    }
  }
  CHECK(quantize::packed_bytes(0, 3) == 0);
  CHECK(quantize::packed_bytes(33, 3) == 24);
}

TEST_CASE("bit packing uses bit planes of 32 codes", "[uniform]") {
  std::uint8_t codes[32];
  for (int l = 0; l < 32; ++l) codes[l] = static_cast<std::uint8_t>(l % 4);
  std::uint32_t words[2];
  quantize::pack_group(codes, 32, 2, words);
  CHECK(words[0] == 0xAAAAAAAAu);  // bit 0 of l % 4: set for odd l
  CHECK(words[1] == 0xCCCCCCCCu);  // bit 1: set for l % 4 in {2, 3}
}

TEST_CASE("eight codes' bytes transpose into their bit planes' bytes", "[uniform]") {
  // quantize::transpose_bits_8x8 (a CUDA lane's run of 8 codes) against pack_group's planes.
  std::mt19937 rng(5);
  for (int trial = 0; trial < 2000; ++trial) {
    std::uint8_t codes[8];
    for (auto& c : codes) c = static_cast<std::uint8_t>(rng());
    std::uint32_t lo, hi;
    std::memcpy(&lo, codes, 4);
    std::memcpy(&hi, codes + 4, 4);
    if (trial == 0) lo = hi = 0x80402010u;  // one bit per code, on the diagonal's other side
    std::uint8_t from[8];
    std::memcpy(from, &lo, 4);
    std::memcpy(from + 4, &hi, 4);
    quantize::transpose_bits_8x8(lo, hi);
    std::uint32_t planes[8];
    quantize::pack_group(from, 8, 8, planes);
    for (int b = 0; b < 8; ++b) {
      INFO("trial " << trial << ", plane " << b);
      CHECK(((b < 4 ? lo : hi) >> (8 * (b % 4)) & 0xFFu) == planes[b]);
    }
  }
}

TEST_CASE("uniform nearest stays within half a step of every value", "[uniform]") {
  for (std::size_t n : {std::size_t{1}, std::size_t{511}, std::size_t{512}, std::size_t{513}, std::size_t{100003}}) {
    const auto g = gradzip_tools::synthetic_gradient<float>(n, n);
    const auto check = [&](const std::vector<float>& out, unsigned levels) {
      const auto steps = bucket_steps(g, 512, levels);
      // t = (v - lo) x (1 / step) is a float up to L from three roundings (the difference, the
      // bucket's reciprocal, the product): up to 3 L x 2^-24 steps, so the error is at most
      // step / 2 x (1 + 6 L 2^-24).
      const float slack = 1e-5f + 6.0f * static_cast<float>(levels) * 0x1p-24f;
      for (std::size_t i = 0; i < n; ++i) {
        REQUIRE(std::abs(out[i] - g[i]) <= 0.5f * steps[i / 512] * (1 + slack) + 1e-12f);
      }
    };
    check(round_trip(dense_uniform<2>{}, g), 3);
    check(round_trip(dense_uniform<4>{}, g), 15);
    check(round_trip(dense_uniform<8>{}, g), 255);
    // 9..16 bits take 16-bit codes (the README's range is 1..16).
    check(round_trip(dense_uniform<9>{}, g), 511);
    check(round_trip(dense_uniform<12>{}, g), 4095);
    check(round_trip(dense_uniform<16>{}, g), 65535);
  }
}

TEST_CASE("a bucket's ratio stays within two ulps of the quotient for every binade of the divisor", "[uniform]") {
  // quantize::bucket_ratio: x x (c / d) with c / d once per bucket. Below d = 2^-100 c / d could
  // overflow (c / 2^-149 is inf): the ratio scales x and d by 2^100 there.
  for (const float c : {1.0f, 7.0f, 127.0f}) {
    for (int e = -149; e <= 127; ++e) {
      for (const float mantissa : {1.0f, 1.5f, 1.9999999f}) {
        const float d = std::ldexp(mantissa, e);
        if (!std::isfinite(d) || d == 0.0f) continue;
        const auto ratio = quantize::bucket_ratio::of(c, d);
        for (const float k : {0.0f, 0.25f, 0.5f, 1.0f}) {
          const float x = d * k;  // exact where d's binade allows; the check uses x as rounded
          const double want = static_cast<double>(x) * c / d;
          const float got = ratio(x);
          INFO("c " << c << " d " << d << " x " << x);
          REQUIRE(std::isfinite(got));
          REQUIRE(std::abs(got - want) <= 2 * std::ldexp(1.0, std::ilogb(std::max(want, 1e-30)) - 23));
        }
      }
    }
  }
}

TEST_CASE("uniform nearest gives exact codes in a bucket of subnormal values", "[uniform]") {
  // Values 0, 2^-149, ..., 15 x 2^-149: the step is 2^-149 and each value is its own code. Without
  // bucket_ratio's scaling 1 / step would be inf and every code NaN's.
  std::vector<float> x(512);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(static_cast<float>(i % 16), -149);
  CHECK(round_trip(dense_uniform<4>{}, x) == x);
}

TEST_CASE("uniform sizes follow bits and bucket", "[uniform]") {
  CHECK(dense_uniform<4>::layout(element_type::f32, 1000, 1000).at(1).size == 2 * 8);     // 2 buckets
  CHECK(dense_uniform<4>::layout(element_type::f32, 1000, 1000).at(2).size == 32 * 4 * 4); // 32 groups
  CHECK(dense_uniform<1, rounding::nearest, 32>::layout(element_type::f64, 64, 64).at(2).size == 8);
}

TEST_CASE("uniform on constant and zero buckets decodes exactly", "[uniform]") {
  std::vector<float> x(1500, 3.25f);
  std::fill(x.begin() + 512, x.begin() + 1024, 0.0f);
  CHECK(round_trip(dense_uniform<3>{}, x) == x);
  CHECK(round_trip(dense_uniform<3, rounding::stochastic>{}, x, {5, 0}) == x);
}

TEST_CASE("uniform marks a bucket with NaN or infinity as NaN and keeps the others", "[uniform]") {
  auto x = gradzip_tools::synthetic_gradient<float>(1536, 2);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[600] = std::numeric_limits<float>::infinity();
  const auto out = round_trip(dense_uniform<4>{}, x);
  for (std::size_t i = 0; i < 1024; ++i) REQUIRE(std::isnan(out[i]));
  for (std::size_t i = 1024; i < 1536; ++i) REQUIRE(std::isfinite(out[i]));
}

TEST_CASE("uniform marks a bucket whose range overflows float as NaN and keeps the others", "[uniform]") {
  // hi - lo = 6e38 is inf: no finite step, so the record is poisoned rather than a code computed
  // from (v - lo) / inf (NaN, then a float-to-int conversion of NaN).
  CHECK(std::isnan(quantize::uniform<4>::make_record(-3e38f, 3e38f, true).step));
  auto x = gradzip_tools::synthetic_gradient<float>(1024, 3);
  x[7] = 3e38f;
  x[300] = -3e38f;
  for (const auto& out : {round_trip(dense_uniform<4>{}, x), round_trip(dense_uniform<4, rounding::stochastic>{}, x, {5, 0})}) {
    for (std::size_t i = 0; i < 512; ++i) REQUIRE(std::isnan(out[i]));
    for (std::size_t i = 512; i < 1024; ++i) REQUIRE(std::isfinite(out[i]));
  }
  // One sign only: 3e38 - (-1) is finite, and the bucket keeps its values' codes.
  x[300] = -1.0f;
  const auto out = round_trip(dense_uniform<4>{}, x);
  CHECK(std::abs(out[7] - 3e38f) <= 3e38f * 1e-6f);
  for (std::size_t i = 0; i < 512; ++i) REQUIRE(std::isfinite(out[i]));
}

TEST_CASE("uniform works on double half and bfloat16 tensors", "[uniform]") {
  const auto g = gradzip_tools::synthetic_gradient<double>(2000, 3);
  const auto out = round_trip(dense_uniform<8>{}, g);
  std::vector<float> gf(g.begin(), g.end());
  const auto steps = bucket_steps(gf, 512, 255);
  for (std::size_t i = 0; i < g.size(); ++i) REQUIRE(std::abs(out[i] - gf[i]) <= 0.5f * steps[i / 512] * 1.0001f + 1e-12f);
#if GRADZIP_HAS_HALF
  std::vector<__nv_bfloat16> b(gf.size());
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = __float2bfloat16_rn(gf[i]);
  CHECK(round_trip(dense_uniform<8>{}, b).size() == b.size());
#endif
}

#if GRADZIP_HAS_HALF
namespace {
/// Stages derived from uniform: with a constructor, the same statistics; with any of the
/// statistics' functions of their own, not extrema (and the trait says so, not a compile error).
struct uniform_with_a_constructor : quantize::uniform<4> {
  explicit uniform_with_a_constructor(int) {}
};
struct uniform_with_own_add : quantize::uniform<4> {
  static void add(quantize::bucket_stats& s, float v) { quantize::uniform<4>::add(s, 2.0f * v); }
};
struct uniform_with_own_empty_stats : quantize::uniform<4> {
  static quantize::bucket_stats empty_stats() { return {{0.0f, 0.0f, 0.0f, 0.0f}}; }
};
struct uniform_with_template_add : quantize::uniform<4> {
  template <class V>
  static void add(quantize::bucket_stats& s, V v) { quantize::uniform<4>::add(s, static_cast<float>(v)); }
};
struct uniform_with_double_add : quantize::uniform<4> {
  static void add(quantize::bucket_stats& s, double v) { quantize::uniform<4>::add(s, static_cast<float>(v)); }
};
struct uniform_with_own_make_record : quantize::uniform<4> {
  static record make_record(quantize::bucket_stats s, std::uint32_t) { return {s.v[0], 1.0f}; }
};
static_assert(detail::has_extrema_stats<quantize::uniform<4>>);
static_assert(detail::has_extrema_stats<quantize::uniform<2, rounding::stochastic, 64>>);
static_assert(detail::has_extrema_stats<uniform_with_a_constructor>);
static_assert(!detail::has_extrema_stats<uniform_with_own_add>);
static_assert(!detail::has_extrema_stats<uniform_with_own_empty_stats>);
static_assert(!detail::has_extrema_stats<uniform_with_template_add>);
static_assert(!detail::has_extrema_stats<uniform_with_double_add>);
static_assert(!detail::has_extrema_stats<uniform_with_own_make_record>);
static_assert(detail::has_extrema_stats<quantize::terngrad<false>>);
static_assert(!detail::has_extrema_stats<quantize::terngrad<true>>);  // its sums need the order
static_assert(!detail::has_extrema_stats<quantize::qsgd<7>>);

/// Stage S's record of the 16-bit values `bits`, from the host's statistics (for 16-bit inputs,
/// the extrema of their bits) and from the stage's own `add` over them one by one.
template <class S, class T>
void check_extrema_record(const std::vector<std::uint16_t>& bits) {
  std::vector<T> x(bits.size());
  std::memcpy(static_cast<void*>(x.data()), bits.data(), 2 * bits.size());
  quantize::bucket_stats one_by_one = S::empty_stats();
  for (const T& v : x) S::add(one_by_one, to_float(v));
  const auto expected = S::make_record(one_by_one, x.size());
  const auto got = S::make_record(detail::bucket_statistics<S>(x.data(), 0, x.size()), x.size());
  INFO("bits[0] " << std::hex << bits[0] << " of " << std::dec << bits.size());
  CHECK(std::memcmp(&expected, &got, sizeof got) == 0);
}

template <class T>
void check_extrema_records(std::uint16_t exponent) {
  const std::uint16_t nan = exponent | 0x40u, neg = 0x8000u, one = element_traits<T>::type == element_type::bf16 ? 0x3F80u : 0x3C00u;
  const std::uint16_t largest = exponent - 1;  // the largest finite magnitude
  const std::vector<std::vector<std::uint16_t>> buckets = {
      {0}, {neg}, {0, neg}, {neg, 0}, {neg, neg},              // zeros of either sign: lo and hi +0
      {one}, {one, 2 * one}, {std::uint16_t(neg | one)},       // one value, all positive, all negative
      {std::uint16_t(neg | one), std::uint16_t(neg | 0x4000u)}, {std::uint16_t(neg | 1u), 1u},  // subnormals
      {std::uint16_t(neg | one), 0x4000u, 0},                  // both signs
      {neg, one}, {one, neg}, {neg, std::uint16_t(neg | one)},  // -0 the least, or not
      {largest, std::uint16_t(neg | largest)},                 // a range beyond float's: poisoned
      {exponent}, {std::uint16_t(neg | exponent)}, {nan}, {std::uint16_t(neg | nan)},  // inf, -inf, NaN, -NaN
      {one, nan}, {std::uint16_t(neg | nan), one}, {one, std::uint16_t(neg | exponent), 0}, {largest, exponent}};
  for (const auto& b : buckets) {
    check_extrema_record<quantize::uniform<4>, T>(b);
    check_extrema_record<quantize::terngrad<false>, T>(b);
  }
  // Each of those values among 64 to 512 ordinary ones (normal, of small magnitude; positive,
  // negative or both), at the start, the middle and the end: the vector loop's lanes and its
  // remainder, not only a few scalar steps.
  std::mt19937 rng(5);
  for (const auto& special : buckets) {
    for (std::size_t length : {64, 100, 512}) {
      for (std::size_t at : {std::size_t{0}, length / 2 + 1, length - special.size()}) {
        for (int signs = 0; signs < 3; ++signs) {
          std::vector<std::uint16_t> b(length);
          for (auto& v : b) {
            const bool negative = signs == 1 || (signs == 2 && rng() % 2 == 1);
            v = static_cast<std::uint16_t>((negative ? neg : 0u) | (0x2000u + rng() % 0x1000u));
          }
          std::copy(special.begin(), special.end(), b.begin() + static_cast<std::ptrdiff_t>(at));
          check_extrema_record<quantize::uniform<4>, T>(b);
          check_extrema_record<quantize::terngrad<false>, T>(b);
        }
      }
    }
  }
  // Random buckets of every length to 40, any bits, a special one in some.
  for (int trial = 0; trial < 4000; ++trial) {
    std::vector<std::uint16_t> b(1 + rng() % 40);
    for (auto& v : b) v = static_cast<std::uint16_t>(rng());
    for (auto& v : b) {
      if ((v & exponent) == exponent) v = static_cast<std::uint16_t>(v ^ (trial % 3 == 0 ? 0 : 0x4000u));  // mostly finite
    }
    check_extrema_record<quantize::uniform<4>, T>(b);
    check_extrema_record<quantize::terngrad<false>, T>(b);
  }
}
}  // namespace

TEST_CASE("16-bit inputs' extrema from their bits give the records of the stages' own statistics", "[uniform]") {
  check_extrema_records<__nv_bfloat16>(0x7F80u);
  check_extrema_records<__half>(0x7C00u);
}
#endif

TEST_CASE("uniform stochastic rounding is unbiased within its variance bound", "[uniform]") {
  // 2,000 round trips with distinct steps. Each decoded value has variance
  // p (1 - p) step^2 <= step^2 / 4 (p = fractional part of t), so the mean of 2,000 has standard
  // deviation <= step / (2 sqrt(2000)). We require every element within 5 of those standard
  // deviations (plus float rounding), and the measured variance within 10 % of the theoretical.
  const std::size_t n = 1024, trials = 2000;
  const auto x = gradzip_tools::synthetic_gradient<float>(n, 77);
  using q = quantize::uniform<2, rounding::stochastic>;
  const codec<sparsify::none, q, encode::none> c{{}, q{1234}};
  std::vector<double> sum(n, 0.0), sum_sq(n, 0.0);
  for (std::uint32_t s = 0; s < trials; ++s) {
    const auto out = round_trip(c, x, {s, 9});
    for (std::size_t i = 0; i < n; ++i) {
      sum[i] += out[i];
      sum_sq[i] += static_cast<double>(out[i]) * out[i];
    }
  }
  const auto steps = bucket_steps(x, 512, 3);
  double measured_var = 0.0, theory_var = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double step = steps[i / 512];
    const double mean = sum[i] / trials;
    const double bound = 5.0 * step / (2.0 * std::sqrt(double(trials))) + 1e-6 * step;
    INFO("element " << i << ": x = " << x[i] << ", mean = " << mean << ", step = " << step);
    REQUIRE(std::abs(mean - x[i]) <= bound);
    const double lo = *std::min_element(x.begin() + (i / 512) * 512, x.begin() + (i / 512) * 512 + 512);
    const double t = (x[i] - lo) / step;
    const double p = t - std::floor(t);
    theory_var += p * (1 - p) * step * step;
    measured_var += sum_sq[i] / trials - mean * mean;
  }
  CHECK(measured_var <= 1.1 * theory_var + 1e-12);
  CHECK(measured_var >= 0.9 * theory_var);
}

TEST_CASE("uniform payloads are deterministic across thread counts and keyed by step", "[uniform]") {
  const auto g = gradzip_tools::synthetic_gradient<float>(300000, 5);
  using q = quantize::uniform<4, rounding::stochastic>;
  const codec<sparsify::none, q, encode::none> c{{}, q{42}};
  host one(1), two(2);
  std::vector<std::byte> a(c.max_compressed_bytes<float>(g.size())), b(a.size()), d(a.size());
  c.compress(one, span<const float>(g), span<std::byte>(a), {7, 3});
  c.compress(two, span<const float>(g), span<std::byte>(b), {7, 3});
  c.compress(two, span<const float>(g), span<std::byte>(d), {8, 3});
  CHECK(a == b);
  CHECK(a != d);
}

TEST_CASE("top-k values quantized to 4 bits", "[uniform]") {
  const auto g = gradzip_tools::synthetic_gradient<float>(200000, 6);
  host exec;
  const codec<sparsify::topk, quantize::uniform<4>, encode::coo> c{sparsify::topk::ratio(0.01)};
  std::vector<std::byte> p(c.max_compressed_bytes<float>(g.size()));
  const auto bytes = c.compress(exec, span<const float>(g), span<std::byte>(p));
  p.resize(bytes);
  const auto idx = test::payload_indices(p);
  REQUIRE(idx == test::reference_topk(g, 2000));
  std::vector<float> kept(idx.size());
  for (std::size_t j = 0; j < idx.size(); ++j) kept[j] = g[idx[j]];
  const auto steps = bucket_steps(kept, 512, 15);
  std::vector<float> out(g.size());
  c.decompress(exec, span<const std::byte>(p), span<float>(out));
  for (std::size_t j = 0; j < idx.size(); ++j) {
    REQUIRE(std::abs(out[idx[j]] - kept[j]) <= 0.5f * steps[j / 512] * 1.0001f);
  }
  CHECK(bytes < 2000 * 5 + 400);  // 4 index bytes + half a byte per value + scales + header
}

TEST_CASE("malformed uniform payloads are rejected", "[uniform]") {
  host exec;
  const std::vector<float> x(100, 1.0f);
  std::vector<float> out(100);
  std::vector<std::byte> p(dense_uniform<4>{}.max_compressed_bytes<float>(100));
  dense_uniform<4>{}.compress(exec, span<const float>(x), span<std::byte>(p));
  // Header 128 (3 sections: params at 128, scales, values); params: count u64, bits, rounding,
  // 2 zero bytes, bucket u32.
  auto expect = [&](const auto& decoder, const std::vector<std::byte>& bytes, wire::format_errc code) {
    test::expect_rejected(decoder, exec, bytes, out, code);
  };
  expect(dense_uniform<3>{}, p, wire::format_errc::bad_params);                      // bits
  expect(dense_uniform<4, rounding::stochastic>{}, p, wire::format_errc::bad_params);  // rounding
  expect(dense_uniform<4, rounding::nearest, 256>{}, p, wire::format_errc::bad_params);  // bucket
  expect(codec<sparsify::none, quantize::cast_fp16, encode::none>{}, p, wire::format_errc::codec_mismatch);
  auto q = p;
  q[138] = std::byte{1};  // reserved
  expect(dense_uniform<4>{}, q, wire::format_errc::nonzero_reserved);
  q = p;
  wire::detail::store_le(reinterpret_cast<std::uint8_t*>(q.data()) + 72 + 16, 16, 8);  // scales 8 -> 16
  expect(dense_uniform<4>{}, q, wire::format_errc::bad_section_size);
}

TEST_CASE("the host's group packing and unpacking agree with the portable bit planes", "[uniform]") {
  // detail::pack_32 / unpack_32 (SSE2 and AVX2 paths where compiled) against pack_group and
  // unpack_code, for every width and for byte and 16-bit codes.
  std::mt19937 rng(11);
  for (int bits = 1; bits <= 16; ++bits) {
    for (int trial = 0; trial < 50; ++trial) {
      std::uint16_t wide[32];
      for (auto& c : wide) c = static_cast<std::uint16_t>(rng() & ((1u << bits) - 1));
      std::uint32_t words[16], reference[16];
      quantize::pack_group(wide, 32, bits, reference);
      gradzip::detail::pack_32(wide, bits, words);
      REQUIRE(std::equal(words, words + bits, reference));
      std::uint16_t back[32];
      gradzip::detail::unpack_32(reinterpret_cast<const std::uint8_t*>(words), bits, back);
      REQUIRE(std::equal(back, back + 32, wide));
      if (bits > 8) continue;
      std::uint8_t narrow[32], narrow_back[32];
      for (int l = 0; l < 32; ++l) narrow[l] = static_cast<std::uint8_t>(wide[l]);
      gradzip::detail::pack_32(narrow, bits, words);
      REQUIRE(std::equal(words, words + bits, reference));
      gradzip::detail::unpack_32(reinterpret_cast<const std::uint8_t*>(words), bits, narrow_back);
      for (int l = 0; l < 32; ++l) {
        REQUIRE(narrow_back[l] == narrow[l]);
        REQUIRE(narrow_back[l] == quantize::unpack_code(reinterpret_cast<const std::uint8_t*>(words), bits, l));
      }
    }
  }
}

template <int Bits>
void check_codes_above(std::mt19937& rng) {
  // Codes drawn near a bound so that both sides and equality occur often, every bound below 2^Bits
  // (up to 300 of them for the wide codes).
  const unsigned top = (1u << Bits) - 1;
  for (unsigned max = 0; max <= top; max += (top > 300 ? top / 300 : 1)) {
    std::uint16_t codes[32];
    for (auto& c : codes) {
      const unsigned near = max + (rng() % 5) - 2;
      c = static_cast<std::uint16_t>((rng() % 3 == 0 ? rng() : near) & top);
    }
    std::uint32_t words[16];
    quantize::pack_group(codes, 32, Bits, words);
    std::uint32_t expected = 0;
    for (int l = 0; l < 32; ++l) expected |= static_cast<std::uint32_t>(codes[l] > max) << l;
    INFO(Bits << " bits, max " << max);
    REQUIRE(quantize::codes_above<Bits>(reinterpret_cast<const std::uint8_t*>(words), max) == expected);
  }
}

template <int... Bits>
void check_codes_above_widths(std::mt19937& rng) {
  (check_codes_above<Bits>(rng), ...);
}

TEST_CASE("codes above a bound are found on the bit planes, without unpacking", "[uniform]") {
  // A decoder's code check (TernGrad, QSGD with levels not 2^m - 1) compares all 32 codes of a
  // group with the stage's largest code bit-serially from the top plane down.
  std::mt19937 rng(5);
  for (int trial = 0; trial < 40; ++trial) check_codes_above_widths<1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16>(rng);
}

TEST_CASE("stochastic rounding over all 2^16 draws is biased by less than 2^-16 of a step", "[uniform]") {
  // Uniform and QSGD round t to floor(t + u) with u = h / 2^16 (random_half_word). Over all
  // 65,536 draws h the mean code is exactly floor(t) + floor(frac(t) 2^16) / 2^16: at most 2^-16
  // of a step below t, never above (up to the float rounding of t itself, 2^-21 here).
  const quantize::uniform<4, rounding::stochastic> stage{7};
  const quantize::qsgd<7> qsgd{7};
  const quantize::uniform_record r{-1.0f, 0.25f};  // t = (v + 1) / 0.25, in [0, 8): no clamping at 15
  const quantize::qsgd_record n{2.0f};               // level = |v| / 2 x 7
  const double resolution = 1.0 / 65536.0, rounding_slack = 1.0 / (1 << 21);
  double lowest = 0.0, highest = -1.0;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> value(-0.99f, 0.99f);
  for (int trial = 0; trial < 200; ++trial) {
    const float v = trial < 2 ? std::array<float, 2>{0.0f, 0.5f + 1.0f / 65536.0f}[trial] : value(rng);
    double sum_uniform = 0.0, sum_qsgd = 0.0;
    for (std::uint32_t h = 0; h < 65536; ++h) {
      sum_uniform += stage.encode(v, r, h << 16);
      sum_qsgd += static_cast<double>(qsgd.encode(v, n, h << 16) >> 1);
    }
    for (double bias : {sum_uniform / 65536.0 - (static_cast<double>(v) + 1.0) / 0.25,
                        sum_qsgd / 65536.0 - std::abs(static_cast<double>(v)) / 2.0 * 7.0}) {
      lowest = std::min(lowest, bias);
      highest = std::max(highest, bias);
    }
  }
  INFO("bias from " << lowest << " to " << highest << " steps");
  CHECK(lowest > -(resolution + rounding_slack));
  CHECK(highest < rounding_slack);
  CHECK(lowest < -resolution / 4);  // 16 bits make a real, measurable bias, which the bound caps
}
