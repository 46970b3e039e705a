#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"

#if GRADZIP_HAS_HALF
#include <cuda_fp8.h>
#endif

using namespace gradzip;

namespace {
using test::dense;
using test::round_trip;

float e4m3(float f) { return quantize::e4m3_bits_to_float(quantize::float_to_e4m3_bits(f)); }
float e5m2(float f) { return quantize::e5m2_bits_to_float(quantize::float_to_e5m2_bits(f)); }
constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float qnan = std::numeric_limits<float>::quiet_NaN();
}  // namespace

static_assert(dense<quantize::cast_fp8_e4m3>::summable);
static_assert(quantize::cast_fp8_e5m2::value_size(element_type::f32) == 1);

TEST_CASE("fp8 e4m3 rounds to nearest even and saturates at 448", "[fp8]") {
  CHECK(e4m3(448.0f) == 448.0f);
  CHECK(e4m3(1e9f) == 448.0f);
  CHECK(e4m3(-500.0f) == -448.0f);
  CHECK(e4m3(1.0f + 1.0f / 16) == 1.0f);               // tie between 1 and 1.125: to even
  CHECK(e4m3(1.0f + 3.0f / 16) == 1.25f);              // tie between 1.125 and 1.25: to even
  CHECK(e4m3(std::ldexp(1.0f, -9)) == std::ldexp(1.0f, -9));  // smallest subnormal
  CHECK(e4m3(std::ldexp(1.0f, -10)) == 0.0f);          // halfway to 0: even
  CHECK(e4m3(std::ldexp(1.5f, -10)) == std::ldexp(1.0f, -9));
  CHECK(std::isnan(e4m3(inf)));                        // no infinities in e4m3
  CHECK(std::isnan(e4m3(qnan)));
  CHECK(quantize::float_to_e4m3_bits(-qnan) == 0xFF);
  CHECK(std::signbit(e4m3(-0.0f)));
  for (int b = 0; b < 256; ++b) {  // every pattern decodes and re-encodes to itself (NaN aside)
    const float f = quantize::e4m3_bits_to_float(static_cast<std::uint8_t>(b));
    if (!std::isnan(f)) REQUIRE(quantize::float_to_e4m3_bits(f) == b);
  }
}

TEST_CASE("fp8 e5m2 rounds to nearest even, saturates at 57344 and keeps inf", "[fp8]") {
  CHECK(e5m2(57344.0f) == 57344.0f);
  CHECK(e5m2(1e9f) == 57344.0f);
  CHECK(e5m2(inf) == inf);
  CHECK(e5m2(-inf) == -inf);
  CHECK(std::isnan(e5m2(qnan)));
  CHECK(e5m2(1.0f + 1.0f / 8) == 1.0f);                // tie to even
  CHECK(e5m2(std::ldexp(1.0f, -16)) == std::ldexp(1.0f, -16));
  for (int b = 0; b < 256; ++b) {
    const float f = quantize::e5m2_bits_to_float(static_cast<std::uint8_t>(b));
    if (!std::isnan(f)) REQUIRE(quantize::float_to_e5m2_bits(f) == b);
  }
}

#if GRADZIP_HAS_HALF
TEST_CASE("fp8 conversions equal CUDA's satfinite conversions on finite floats", "[fp8]") {
  std::uint64_t mismatches = 0;
  for (std::uint64_t b = 0; b < (std::uint64_t{1} << 32); b += 101) {
    const float f = detail::bit_cast<float>(static_cast<std::uint32_t>(b));
    if (!std::isfinite(f)) continue;  // inf and NaN follow gradzip's documented rule
    mismatches += quantize::float_to_e4m3_bits(f) != __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
    mismatches += quantize::float_to_e5m2_bits(f) != __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E5M2);
  }
  CHECK(mismatches == 0);
}

TEST_CASE("fp8 decoding equals CUDA's on all 256 patterns", "[fp8]") {
  for (int b = 0; b < 256; ++b) {
    const auto bits = static_cast<__nv_fp8_storage_t>(b);
    const float e4 = detail::half_bits_to_float(__nv_cvt_fp8_to_halfraw(bits, __NV_E4M3).x);
    const float e5 = detail::half_bits_to_float(__nv_cvt_fp8_to_halfraw(bits, __NV_E5M2).x);
    const float ours4 = quantize::e4m3_bits_to_float(static_cast<std::uint8_t>(b));
    const float ours5 = quantize::e5m2_bits_to_float(static_cast<std::uint8_t>(b));
    if (std::isnan(e4)) REQUIRE(std::isnan(ours4)); else REQUIRE(ours4 == e4);
    if (std::isnan(e5)) REQUIRE(std::isnan(ours5)); else REQUIRE(ours5 == e5);
  }
}
#endif

TEST_CASE("fp8 casts round trip dense and top-k values with 1 byte per value", "[fp8]") {
  const auto x = gradzip_tools::synthetic_gradient<float>(1000, 5);
  const auto out = round_trip(dense<quantize::cast_fp8_e4m3>{}, x);
  const auto out5 = round_trip(dense<quantize::cast_fp8_e5m2>{}, x);
  for (std::size_t i = 0; i < x.size(); ++i) {
    REQUIRE(out[i] == e4m3(x[i]));
    REQUIRE(out5[i] == e5m2(x[i]));
  }
  using topk8 = codec<sparsify::topk, quantize::cast_fp8_e4m3>;
  CHECK(topk8::layout(element_type::f32, 1000, 10).at(2).size == 10);
  const auto sparse = round_trip(topk8{sparsify::topk::count(10)}, x);
  int sent = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (sparse[i] != 0.0f) {
      ++sent;
      REQUIRE(sparse[i] == e4m3(x[i]));
    }
  }
  CHECK(sent == 10);
}

TEST_CASE("fp8 payloads are rejected by a decoder of the other format", "[fp8]") {
  host exec;
  const std::vector<float> x(40, 0.5f);
  const auto p = test::compress(dense<quantize::cast_fp8_e4m3>{}, exec, x);
  std::vector<float> out(40, 7.0f);
  CHECK_THROWS_AS(dense<quantize::cast_fp8_e5m2>{}.decompress(exec, span<const std::byte>(p),
                                                             span<float>(out)),
                  format_error);
  CHECK(out[0] == 7.0f);
}

// ---------------------------------------------------------------------------------------------
// natural compression

TEST_CASE("natural compression sends powers of two that bracket each value", "[natural]") {
  const auto x = gradzip_tools::synthetic_gradient<float>(1500, 12);
  for (int bits : {8, 9}) {
    const auto out = bits == 8 ? round_trip(dense<quantize::natural<8>>{{}, quantize::natural<8>{4}}, x, {3, 1})
                               : round_trip(dense<quantize::natural<9>>{{}, quantize::natural<9>{4}}, x, {3, 1});
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float a = std::abs(x[i]);
      if (a == 0.0f) {
        REQUIRE(out[i] == 0.0f);
        continue;
      }
      const float lower = std::ldexp(1.0f, std::ilogb(a));
      const float o = std::abs(out[i]);
      REQUIRE((o == lower || o == 2 * lower));
      REQUIRE(std::signbit(out[i]) == std::signbit(x[i]));
    }
  }
  using nat8 = dense<quantize::natural<8>>;
  using nat9 = dense<quantize::natural<9>>;
  CHECK(nat8::layout(element_type::f32, 1500, 1500).at(2).size == 47 * 8 * 4);
  CHECK(nat9::layout(element_type::f32, 1500, 1500).at(2).size == 47 * 9 * 4);
  CHECK(nat8::layout(element_type::f32, 1500, 1500).at(1).size == 3 * 4);  // one i32 per bucket
}

TEST_CASE("natural compression keeps powers of two exact and handles edge buckets", "[natural]") {
  using nat = quantize::natural<8>;
  std::vector<float> x(512 + 4, 0.0f);
  x[0] = 1.0f;
  x[1] = -0.5f;
  x[3] = 4.0f;
  x[4] = -0.0f;
  x[512] = std::numeric_limits<float>::max();  // the second bucket spans 2^1 .. 2^127
  x[513] = std::ldexp(1.0f, -140);
  x[514] = std::ldexp(1.0f, -149);
  x[515] = -1.5f;
  const auto out = round_trip(dense<nat>{{}, nat{9}}, x);
  CHECK(out[0] == 1.0f);
  CHECK(out[1] == -0.5f);
  CHECK(out[2] == 0.0f);
  CHECK(out[3] == 4.0f);
  CHECK(out[4] == 0.0f);
  CHECK(out[512] == std::ldexp(1.0f, 127));  // no power of two above 2^127 in float: rounds down
  // Below the bucket's smallest magnitude 2^1: 0 or 2 (with the right mean, tested below).
  CHECK((out[513] == 0.0f || out[513] == 2.0f));
  CHECK((out[514] == 0.0f || out[514] == 2.0f));
  CHECK((out[515] == -0.0f || out[515] == -2.0f));
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{511}, std::size_t{513}, std::size_t{37}}) {
    std::vector<float> zeros(n, 0.0f);
    for (float v : round_trip(dense<nat>{}, zeros)) REQUIRE(v == 0.0f);
  }
  std::vector<float> poisoned(600, 1.0f);
  poisoned[3] = std::numeric_limits<float>::infinity();
  const auto p = round_trip(dense<nat>{}, poisoned);
  CHECK(std::isnan(p[0]));
  CHECK(std::isnan(p[511]));
  CHECK(p[512] == 1.0f);  // the next bucket is unaffected
}

TEST_CASE("natural compression is unbiased within its variance bound", "[natural]") {
  // Per value Var = (|v| - 2^e)(2^(e+1) - |v|) <= v^2 / 8; the mean of 2,000 draws must be
  // within 5 of its standard deviations (plus float rounding).
  const std::size_t n = 512, trials = 2000;
  const auto x = gradzip_tools::synthetic_gradient<float>(n, 33);
  using nat = quantize::natural<8>;
  const dense<nat> c{{}, nat{21}};
  std::vector<double> sum(n, 0.0), sq(n, 0.0);
  for (std::uint32_t s = 0; s < trials; ++s) {
    const auto out = round_trip(c, x, {s, 2});
    for (std::size_t i = 0; i < n; ++i) {
      sum[i] += out[i];
      sq[i] += (double(out[i]) - x[i]) * (double(out[i]) - x[i]);
    }
  }
  double total_var = 0, total_bound = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double a = std::abs(x[i]);
    const double lower = std::ldexp(1.0, std::ilogb(x[i] == 0 ? 1.0f : x[i]));
    const double var = x[i] == 0 ? 0.0 : (a - lower) * (2 * lower - a);
    REQUIRE(var <= a * a / 8 * (1 + 1e-6));
    REQUIRE(std::abs(sum[i] / trials - x[i]) <= 5 * std::sqrt(var / trials) + 1e-6 * a);
    total_var += sq[i] / trials;
    total_bound += a * a / 8;
  }
  CHECK(total_var <= total_bound);  // measured variance within the omega = 1/8 bound
}

TEST_CASE("natural compression is unbiased below the bucket's exponent range", "[natural]") {
  // With max 2^100 in the bucket, natural<8> spans 2^-26 .. 2^100: 1.3 x 2^-28 becomes 2^-26
  // with probability 0.325, else 0 (Var = v (2^-26 - v)).
  using nat = quantize::natural<8>;
  std::vector<float> x(64, 0.0f);
  x[0] = std::ldexp(1.0f, 100);
  x[1] = std::ldexp(1.3f, -28);
  const std::size_t trials = 2000;
  double sum = 0;
  for (std::uint32_t s = 0; s < trials; ++s) sum += round_trip(dense<nat>{{}, nat{5}}, x, {s, 0})[1];
  const double v = x[1], m = std::ldexp(1.0, -26);
  CHECK(std::abs(sum / trials - v) <= 5 * std::sqrt(v * (m - v) / trials));
}

// The executors find the fast paths by detection: a renamed member would silently fall back.
static_assert(detail::has_in_range_encode<quantize::natural<8>> && detail::has_in_range_encode<quantize::natural<9>>);
static_assert(detail::has_in_range_decode<quantize::natural<8>> && detail::has_in_range_decode<quantize::natural<9>>);

TEST_CASE("natural's in-range encode gives encode's codes wherever the host takes it", "[natural]") {
  // The host encodes a block with `encode_in_range` when every value is 0 or at least
  // `in_range_floor`: the two must agree there, for every bucket exponent, both code widths,
  // mantissas at their edges and draws at the boundary of a round up.
  const auto agree = [](auto stage) {
    using nat = decltype(stage);
    std::mt19937 gen(17);
    std::uniform_int_distribution<std::uint32_t> word;
    for (std::int32_t top = -149; top <= 127; ++top) {
      const typename nat::record r{top};
      const std::uint32_t floor = nat::in_range_floor(r);
      REQUIRE(floor >= 0x00800000u);
      for (int trial = 0; trial < 400; ++trial) {
        // Magnitudes from the floor to 2^(top + 1) (above the bucket's largest, at most 2^top;
        // never inf), both signs. Below top = -127 that range holds no normal float: only 0 is
        // in range there.
        const auto ceiling = std::min(detail::bit_cast<std::uint32_t>(std::ldexp(1.0f, top + 1)), 0x7F7FFFFFu);
        std::uint32_t a = ceiling < floor ? 0u : floor + word(gen) % (ceiling - floor + 1);
        if (trial % 4 == 0 && a != 0) a = (a & 0xFF800000u) | (trial % 8 == 0 ? 0u : 0x7FFFFFu);  // mantissa edges
        if (trial == 1) a = 0;
        const float v = detail::bit_cast<float>(a | (word(gen) & 0x80000000u));
        const std::uint32_t threshold = ((a << 9) >> 8) << 8;  // a draw below it rounds up
        for (std::uint32_t random : {word(gen), threshold, threshold - 256u, threshold + 255u, 0u, 0xFFFFFFFFu}) {
          INFO("top " << top << ", |v| bits " << a << ", random " << random);
          REQUIRE(stage.encode_in_range(v, r, random) == stage.encode(v, r, random));
        }
      }
    }
    CHECK(nat::in_range_floor({nat::poisoned}) == 0x7F800000u);
  };
  agree(quantize::natural<8>{3});
  agree(quantize::natural<9>{3});
}

TEST_CASE("natural compression takes the in-range encode block by block", "[natural]") {
  // Two buckets of 512, both with top = 1: in each, the first 256-value block holds a value below
  // the bucket's range (a subnormal in the second), the other block only in-range values and
  // zeros. Each code must be a power of two bracketing its value (0 or 2^lowest below the
  // range), whichever encode made it.
  using nat = quantize::natural<8>;
  std::vector<float> x(1024);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(1.0f + static_cast<float>(i % 7) / 8, -static_cast<int>(i % 90));
  x[5] = std::ldexp(1.5f, -140);  // subnormal, below 2^lowest = 2^(1 - 127 + 1)
  x[300] = 0.0f;
  x[700] = std::ldexp(1.25f, -149 + 3);  // the second bucket's first block takes encode
  const auto out = round_trip(dense<nat>{{}, nat{8}}, x, {2, 1});
  const float lowest = std::ldexp(1.0f, -125);  // top = 1 in both buckets: 2^(1 - 127 + 1)
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("i = " << i);
    if (x[i] == 0.0f) {
      REQUIRE(out[i] == 0.0f);
    } else if (x[i] < lowest) {
      REQUIRE((out[i] == 0.0f || out[i] == lowest));
    } else {
      const float lower = std::ldexp(1.0f, std::ilogb(x[i]));
      REQUIRE((out[i] == lower || out[i] == 2 * lower));
    }
  }
}

TEST_CASE("natural's in-range decode gives decode's values from its code floor on", "[natural]") {
  // The host decodes a group of 32 codes by `decode_in_range` when every code's c is 0 or at
  // least `in_range_code_floor`: bit for bit `decode` there, for encoders' tops, hostile tops
  // and poisoned buckets; and up to top = 127 the floor is the first code whose value is a
  // normal float.
  const auto agree = [](auto stage) {
    using nat = decltype(stage);
    std::vector<std::int32_t> tops = {INT32_MIN, -5000, -1001, -1000, -400, 300, 1001, INT32_MAX - 1, nat::poisoned};
    for (std::int32_t top = -160; top <= 140; ++top) tops.push_back(top);
    for (const std::int32_t top : tops) {
      const typename nat::record r{top};
      const unsigned floor = nat::in_range_code_floor(r);
      REQUIRE(floor >= 1);
      REQUIRE(floor <= nat::exponent_codes + 1u);
      for (unsigned code = 0; code < (2u << (nat::bits - 1)); ++code) {
        const unsigned c = code >> 1;
        const auto bits = detail::bit_cast<std::uint32_t>(nat::decode(code, r));
        INFO("top " << top << ", code " << code);
        if (c == 0 || c >= floor) {
          REQUIRE(detail::bit_cast<std::uint32_t>(nat::decode_in_range(code, r)) == bits);
        }
        if (top <= 127 && c != 0) {  // above 127 (hostile) every code takes `decode`
          const std::uint32_t exponent = (bits >> 23) & 0xFFu;
          const bool normal = exponent != 0 && exponent != 0xFFu;
          REQUIRE(normal == (c >= floor));
        }
      }
    }
  };
  agree(quantize::natural<8>{});
  agree(quantize::natural<9>{});
}

TEST_CASE("natural decoding takes the in-range decode group by group", "[natural]") {
  // The bucket's largest value is 2^-10 (top = -10, 2^lowest = 2^(-10 - 127 + 1) = 2^-136), so
  // 2^-133 (a power of two: never rounded up) has code c = 4: a subnormal value, which the in-range decode must not produce,
  // so its group of 32 takes `decode`; the other groups do not.
  using nat = quantize::natural<8>;
  std::vector<float> x(256);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(1.0f + static_cast<float>(i % 5) / 8, -10 - static_cast<int>(i % 40));
  x[40] = std::ldexp(1.0f, -133);
  x[41] = -std::ldexp(1.5f, -148);
  // The floor's neighbour: 2^-127 has c = 10, one below in_range_code_floor (11), in its own group.
  x[100] = std::ldexp(1.0f, -127);
  for (std::uint32_t step = 0; step < 20; ++step) {
    const auto out = round_trip(dense<nat>{{}, nat{8}}, x, {step, 1});
    for (std::size_t i = 0; i < x.size(); ++i) {
      INFO("i = " << i << ", step " << step);
      const float a = std::abs(x[i]);
      const float o = std::abs(out[i]);
      if (a < std::ldexp(1.0f, -136)) {  // below 2^lowest
        REQUIRE((o == 0.0f || o == std::ldexp(1.0f, -136)));
      } else {
        const float lower = std::ldexp(1.0f, std::ilogb(a));
        REQUIRE((o == lower || o == 2 * lower));
      }
      REQUIRE((o == 0.0f || std::signbit(out[i]) == std::signbit(x[i])));
    }
  }
}

TEST_CASE("malformed natural payloads are rejected with precise errors", "[natural]") {
  host exec;
  const std::vector<float> x(100, 1.5f);
  const auto p = test::compress(dense<quantize::natural<8>>{}, exec, x);
  std::vector<float> out(100, 9.0f);
  auto expect = [&](const auto& decoder, const std::vector<std::byte>& bytes, wire::format_errc code) {
    test::expect_rejected(decoder, exec, bytes, out, code);
  };
  expect(dense<quantize::natural<9>>{}, p, wire::format_errc::bad_params);        // code width
  expect(dense<quantize::natural<8, 256>>{}, p, wire::format_errc::bad_params);   // bucket
  // Section table at 48: entries of 24 bytes (tag u32, flags u32, offset u64, size u64).
  auto q = p;
  wire::detail::store_le(reinterpret_cast<std::uint8_t*>(q.data()) + 48 + 24 + 16, 8, 8);  // scales 4 -> 8
  expect(dense<quantize::natural<8>>{}, q, wire::format_errc::bad_section_size);
  q = p;
  wire::detail::store_le(reinterpret_cast<std::uint8_t*>(q.data()) + 48 + 48 + 16, 64, 8);  // codes 128 -> 64
  expect(dense<quantize::natural<8>>{}, q, wire::format_errc::bad_section_size);
}

TEST_CASE("natural decode saturates exactly for any bucket exponent, hostile ones included", "[natural]") {
  // The value of code (c, sign) in a bucket of top exponent `top`: 2^(top - 127 + c) for c > 0,
  // 0 below 2^-149, inf above 2^127, computed here in 64-bit integers and double.
  const auto expected = [](std::int64_t top, unsigned code) -> std::uint32_t {
    const unsigned c = code >> 1;
    std::uint32_t bits = 0;
    if (c != 0) {
      const std::int64_t e = top - 127 + c;
      if (e > 127) {
        bits = 0x7F800000u;
      } else if (e >= -149) {
        bits = detail::bit_cast<std::uint32_t>(static_cast<float>(std::ldexp(1.0, static_cast<int>(e))));
      }
    }
    return bits | ((code & 1u) << 31);
  };
  for (std::int64_t top : {std::int64_t{INT32_MIN}, std::int64_t{-5000}, std::int64_t{-1001}, std::int64_t{-400},
                           std::int64_t{-149}, std::int64_t{-22}, std::int64_t{0}, std::int64_t{127}, std::int64_t{300},
                           std::int64_t{1001}, std::int64_t{INT32_MAX - 1}}) {
    for (unsigned code = 0; code < 256; ++code) {
      const float v = quantize::natural<8>::decode(code, {static_cast<std::int32_t>(top)});
      if (detail::bit_cast<std::uint32_t>(v) != expected(top, code)) FAIL("top " << top << ", code " << code);
    }
  }
  // A poisoned bucket decodes to NaN.
  CHECK(std::isnan(quantize::natural<8>::decode(2, {quantize::natural<8>::poisoned})));
}
