#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"

using namespace gradzip;

namespace {
using test::dense;
using test::round_trip;

float bucket_max_abs(const std::vector<float>& x, std::size_t b, std::size_t bucket) {
  float m = 0;
  for (std::size_t i = b; i < std::min(x.size(), b + bucket); ++i) m = std::max(m, std::abs(x[i]));
  return m;
}
}  // namespace

TEST_CASE("terngrad sends zero or plus or minus the bucket's max magnitude", "[terngrad]") {
  const auto x = gradzip_tools::synthetic_gradient<float>(1300, 8);
  using t = quantize::terngrad<>;
  const auto out = round_trip(dense<t>{{}, t{3}}, x, {1, 0});
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float s = bucket_max_abs(x, i / 512 * 512, 512);
    REQUIRE((out[i] == 0.0f || out[i] == s || out[i] == -s));
    if (out[i] != 0.0f) REQUIRE((out[i] < 0) == (x[i] < 0));
  }
  CHECK(dense<t>::layout(element_type::f32, 1300, 1300).at(2).size == 41 * 2 * 4);  // 2 bits
}

TEST_CASE("terngrad keeps the bucket's largest magnitude at every draw", "[terngrad]") {
  // Its probability is |v| / s = 1: the encode compares |v| with (1 - u) s, exact at u = 0.
  // Every value is +-s but one per bucket, smaller, which is not checked. s = 1.1015625, whose
  // product with its rounded reciprocal is 1 - 2^-24: a reciprocal-based encode drops it when
  // u = 0, once in 2^16 draws, about 16 times in these 2^20.
  std::vector<float> x(std::size_t{1} << 18);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = (i % 3 == 0 ? -1.0f : 1.0f) * (i % 512 == 7 ? 0.5f : 1.1015625f);
  for (std::uint64_t step = 0; step < 4; ++step) {
    const auto out = round_trip(dense<quantize::terngrad<>>{{}, quantize::terngrad<>{step}}, x, {step, 0});
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (i % 512 != 7) REQUIRE(out[i] == x[i]);
    }
  }
}

TEST_CASE("terngrad keeps zeros zero in a bucket of subnormal values", "[terngrad]") {
  // (1 - u) s for a subnormal s rounds to 0 for most u: without scaling s up first, 0 < 0 fails
  // and a zero is sent as +s (half the draws at s = 2^-149).
  for (const int e : {-149, -140, -134, -127}) {
    std::vector<float> x(1024, 0.0f);
    x[5] = std::ldexp(1.0f, e);
    x[700] = -std::ldexp(1.0f, e);
    for (std::uint64_t step = 0; step < 4; ++step) {
      const auto out = round_trip(dense<quantize::terngrad<>>{{}, quantize::terngrad<>{step}}, x, {step, 0});
      INFO("scaler 2^" << e << ", step " << step);
      REQUIRE(out == x);  // the zeros stay zero, and +-s (probability 1) is kept
    }
  }
}

TEST_CASE("terngrad is unbiased within its variance bound", "[terngrad]") {
  // Per value Var = |v| (s - |v|); the mean of 2,000 draws is within 5 of its standard
  // deviations sqrt(|v| (s - |v|) / 2000) (plus float rounding).
  const std::size_t n = 512, trials = 2000;
  const auto x = gradzip_tools::synthetic_gradient<float>(n, 81);
  using t = quantize::terngrad<>;
  const dense<t> c{{}, t{11}};
  std::vector<double> sum(n, 0.0);
  for (std::uint32_t s = 0; s < trials; ++s) {
    const auto out = round_trip(c, x, {s, 0});
    for (std::size_t i = 0; i < n; ++i) sum[i] += out[i];
  }
  const double scaler = bucket_max_abs(x, 0, 512);
  for (std::size_t i = 0; i < n; ++i) {
    const double v = std::abs(x[i]);
    const double sd = std::sqrt(v * (scaler - v) / trials);
    REQUIRE(std::abs(sum[i] / trials - x[i]) <= 5 * sd + 1e-6 * scaler);
  }
}

TEST_CASE("terngrad clipping caps the scaler at 2.5 standard deviations", "[terngrad]") {
  std::vector<float> x(512);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = (i % 2 ? 1.0f : -1.0f) * 0.01f;
  x[7] = 100.0f;  // an outlier
  double mean = 0, sq = 0;
  for (float v : x) {
    mean += v;
    sq += double(v) * v;
  }
  mean /= 512;
  const double sigma = std::sqrt(sq / 512 - mean * mean);
  using clipped = quantize::terngrad<true>;
  const auto out = round_trip(dense<clipped>{{}, clipped{1}}, x);
  for (float v : out) REQUIRE(std::abs(v) <= 2.5 * sigma * 1.0001);
  CHECK(out[7] == Approx(2.5 * sigma).epsilon(1e-4));  // the outlier saturates at +s
}

TEST_CASE("terngrad decoders reject code 3", "[terngrad]") {
  host exec;
  std::vector<float> x(64, 0.5f), out(64, 1.0f);
  using t = quantize::terngrad<>;
  std::vector<std::byte> p(dense<t>{}.max_compressed_bytes<float>(64));
  dense<t>{}.compress(exec, span<const float>(x), span<std::byte>(p));
  const auto h = wire::read_header(span<const std::byte>(p));
  auto* words = reinterpret_cast<std::uint8_t*>(p.data()) + h.sections[2].offset;
  words[0] |= 1;
  words[4] |= 1;  // code 0 = 3
  try {
    dense<t>{}.decompress_add(exec, span<const std::byte>(p), span<float>(out));
    FAIL("accepted code 3");
  } catch (const format_error& e) {
    CHECK(e.code() == wire::format_errc::bad_code);
  }
  CHECK(out == std::vector<float>(64, 1.0f));
}

TEST_CASE("onebit decodes to the mean of each side of every bucket", "[onebit]") {
  auto x = gradzip_tools::synthetic_gradient<float>(1200, 9);
  const auto out = round_trip(dense<quantize::onebit<>>{}, x);
  for (std::size_t b = 0; b < x.size(); b += 512) {
    const std::size_t e = std::min(x.size(), b + 512);
    double pos = 0, neg = 0;
    int np = 0, nn = 0;
    for (std::size_t i = b; i < e; ++i) {
      if (x[i] < 0) {
        neg += x[i];
        ++nn;
      } else {
        pos += x[i];
        ++np;
      }
    }
    double sum_out = 0, sum_in = 0;
    for (std::size_t i = b; i < e; ++i) {
      const double expected = x[i] < 0 ? neg / nn : pos / np;
      REQUIRE(std::abs(out[i] - expected) <= 1e-5 * std::abs(expected) + 1e-12);
      sum_out += out[i];
      sum_in += x[i];
    }
    CHECK(sum_out == Approx(sum_in).margin(1e-6));  // each side's sum is kept
  }
  std::vector<float> all_positive(100, 2.0f);
  CHECK(round_trip(dense<quantize::onebit<>>{}, all_positive) == all_positive);
}

TEST_CASE("onebit and terngrad mark non-finite buckets", "[onebit]") {
  auto x = gradzip_tools::synthetic_gradient<float>(1024, 10);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  const auto a = round_trip(dense<quantize::onebit<>>{}, x);
  const auto b = round_trip(dense<quantize::terngrad<>>{}, x);
  for (std::size_t i = 0; i < 512; ++i) REQUIRE((std::isnan(a[i]) && std::isnan(b[i])));
  for (std::size_t i = 512; i < 1024; ++i) REQUIRE((std::isfinite(a[i]) && std::isfinite(b[i])));
}
