#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"

using namespace gradzip;

namespace {
using test::dense;
using test::round_trip;

std::vector<double> bucket_norms(const std::vector<float>& x, std::size_t bucket) {
  std::vector<double> norms;
  for (std::size_t b = 0; b < x.size(); b += bucket) {
    double s = 0;
    for (std::size_t i = b; i < std::min(x.size(), b + bucket); ++i) s += double(x[i]) * x[i];
    norms.push_back(std::sqrt(s));
  }
  return norms;
}
}  // namespace

TEST_CASE("qsgd code widths are minimal", "[qsgd]") {
  STATIC_REQUIRE(quantize::qsgd<1>::bits == 2);
  STATIC_REQUIRE(quantize::qsgd<7>::bits == 4);
  STATIC_REQUIRE(quantize::qsgd<15>::bits == 5);
  STATIC_REQUIRE(quantize::qsgd<127>::bits == 8);
  // 1000 values, 4-bit codes: 32 groups x 4 words x 4 bytes; 8 buckets of 128 x 4 bytes.
  CHECK(dense<quantize::qsgd<7>>::layout(element_type::f32, 1000, 1000).at(1).size == 32);
  CHECK(dense<quantize::qsgd<7>>::layout(element_type::f32, 1000, 1000).at(2).size == 512);
}

TEST_CASE("qsgd decodes to multiples of norm over levels with the value's sign", "[qsgd]") {
  const auto x = gradzip_tools::synthetic_gradient<float>(1000, 3);
  const auto out = round_trip(dense<quantize::qsgd<7>>{{}, quantize::qsgd<7>{1}}, x);
  const auto norms = bucket_norms(x, 128);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double unit = norms[i / 128] / 7;
    const double level = std::abs(out[i]) / unit;
    REQUIRE(std::abs(level - std::round(level)) < 1e-3);
    REQUIRE(std::abs(out[i] - x[i]) <= unit * 1.001);  // within one level
    if (out[i] != 0.0f) REQUIRE((out[i] < 0) == (x[i] < 0));
  }
}

TEST_CASE("qsgd is unbiased and within its variance bound", "[qsgd]") {
  // 2,000 round trips with distinct steps. Per value Var = p (1 - p) (N / s)^2 <= (N / s)^2 / 4,
  // so the mean of 2,000 has standard deviation <= (N / s) / (2 sqrt(2000)); every element must
  // be within 5 of those, and the total measured variance within 10 % of the theoretical.
  const std::size_t n = 512, trials = 2000;
  const auto x = gradzip_tools::synthetic_gradient<float>(n, 78);
  using q = quantize::qsgd<3>;
  const dense<q> c{{}, q{2024}};
  std::vector<double> sum(n, 0.0), sum_sq(n, 0.0);
  for (std::uint32_t s = 0; s < trials; ++s) {
    const auto out = round_trip(c, x, {s, 1});
    for (std::size_t i = 0; i < n; ++i) {
      sum[i] += out[i];
      sum_sq[i] += double(out[i]) * out[i];
    }
  }
  const auto norms = bucket_norms(x, 128);
  double measured = 0, theory = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double unit = norms[i / 128] / 3;
    const double mean = sum[i] / trials;
    REQUIRE(std::abs(mean - x[i]) <= 5 * unit / (2 * std::sqrt(double(trials))) + 1e-6 * unit);
    const double l = std::abs(x[i]) / unit;
    const double p = l - std::floor(l);
    theory += p * (1 - p) * unit * unit;
    measured += sum_sq[i] / trials - mean * mean;
  }
  CHECK(measured <= 1.1 * theory);
  CHECK(measured >= 0.9 * theory);
  // The paper's bound per bucket: E||Q(v) - v||^2 <= min(d / s^2, sqrt(d) / s) ||v||^2.
  double bound = 0;
  for (double norm : norms) bound += std::min(128.0 / 9, std::sqrt(128.0) / 3) * norm * norm;
  CHECK(measured <= bound);
}

TEST_CASE("qsgd on zero and non-finite buckets", "[qsgd]") {
  std::vector<float> x(384, 0.0f);
  x[200] = std::numeric_limits<float>::infinity();
  x[300] = 1.0f;
  const auto out = round_trip(dense<quantize::qsgd<7>>{}, x);
  for (std::size_t i = 0; i < 128; ++i) REQUIRE(out[i] == 0.0f);
  for (std::size_t i = 128; i < 256; ++i) REQUIRE(std::isnan(out[i]));
  CHECK(out[300] == 1.0f);  // the only non-zero of its bucket: level s exactly, norm 1
}

TEST_CASE("scaled sign keeps each bucket's mean magnitude and plain sign sends plus or minus one", "[sign]") {
  auto x = gradzip_tools::synthetic_gradient<float>(1100, 4);
  x[5] = 0.0f;
  const auto scaled = round_trip(dense<quantize::scaled_sign>{}, x);
  const auto plain = round_trip(dense<quantize::sign<false>>{}, x);
  for (std::size_t b = 0; b < x.size(); b += 512) {
    const std::size_t e = std::min(x.size(), b + 512);
    double mean = 0;
    for (std::size_t i = b; i < e; ++i) mean += std::abs(x[i]);
    mean /= double(e - b);
    for (std::size_t i = b; i < e; ++i) {
      REQUIRE(std::abs(std::abs(scaled[i]) - mean) <= 1e-5 * mean);
      REQUIRE((scaled[i] < 0) == (x[i] < 0));
      REQUIRE(plain[i] == (x[i] < 0 ? -1.0f : 1.0f));
    }
  }
  CHECK(plain[5] == 1.0f);  // zero is sent as positive
  // One bit per value plus one fp32 per bucket of 512.
  CHECK(dense<quantize::scaled_sign>::layout(element_type::f32, 1100, 1100).at(2).size == 35 * 4);
}

TEST_CASE("scaled sign with error feedback tracks the gradient sum", "[sign]") {
  using codec_t = dense<quantize::scaled_sign>;
  const std::size_t n = 4096;
  host exec;
  feedback::error_feedback<codec_t, float, host> ef(exec, codec_t{}, n);
  std::vector<std::byte> out(ef.max_compressed_bytes<float>());
  std::vector<double> total(n, 0.0), sent(n, 0.0);
  for (std::uint32_t s = 0; s < 10; ++s) {
    const auto g = gradzip_tools::synthetic_gradient<float>(n, 300 + s);
    for (std::size_t i = 0; i < n; ++i) total[i] += g[i];
    const auto bytes = ef.compress(exec, span<const float>(g), span<std::byte>(out), {s, 0});
    std::vector<float> d(n);
    codec_t{}.decompress(exec, span<const std::byte>(out.data(), bytes), span<float>(d));
    for (std::size_t i = 0; i < n; ++i) sent[i] += d[i];
  }
  const auto e = ef.residual();
  for (std::size_t i = 0; i < n; ++i) REQUIRE(std::abs(sent[i] + e[i] - total[i]) < 1e-5);
}

TEST_CASE("malformed qsgd and sign parameters are rejected", "[qsgd]") {
  host exec;
  std::vector<float> x(100, 1.0f), out(100);
  std::vector<std::byte> p(dense<quantize::qsgd<7>>{}.max_compressed_bytes<float>(100));
  dense<quantize::qsgd<7>>{}.compress(exec, span<const float>(x), span<std::byte>(p));
  CHECK_THROWS_AS(dense<quantize::qsgd<15>>{}.decompress(exec, span<const std::byte>(p), span<float>(out)), format_error);
  CHECK_THROWS_AS((dense<quantize::qsgd<7, 256>>{}.decompress(exec, span<const std::byte>(p), span<float>(out))), format_error);
  CHECK_THROWS_AS(dense<quantize::scaled_sign>{}.decompress(exec, span<const std::byte>(p), span<float>(out)), format_error);
  std::vector<std::byte> s(dense<quantize::scaled_sign>{}.max_compressed_bytes<float>(100));
  dense<quantize::scaled_sign>{}.compress(exec, span<const float>(x), span<std::byte>(s));
  try {
    dense<quantize::sign<false>>{}.decompress(exec, span<const std::byte>(s), span<float>(out));
    FAIL("accepted");
  } catch (const format_error& e) {
    CHECK(e.code() == wire::format_errc::bad_params);
  }
}

TEST_CASE("qsgd decoders reject levels above Levels", "[qsgd]") {
  // Levels = 5 needs 3 level bits, so codes can spell levels 6 and 7, which no compressor writes.
  using q5 = quantize::qsgd<5>;
  STATIC_REQUIRE(q5::codes_need_check);
  STATIC_REQUIRE(!quantize::qsgd<7>::codes_need_check);
  host exec;
  const auto x = gradzip_tools::synthetic_gradient<float>(200, 5);
  std::vector<std::byte> p(dense<q5>{}.max_compressed_bytes<float>(x.size()));
  dense<q5>{}.compress(exec, span<const float>(x), span<std::byte>(p));
  const auto h = wire::read_header(span<const std::byte>(p));
  // Set every bit of code 0: negative, level 7 (code 15).
  auto* words = reinterpret_cast<std::uint8_t*>(p.data()) + h.sections[2].offset;
  for (int bit = 0; bit <= 3; ++bit) words[bit * 4] |= 1;
  std::vector<float> out(x.size(), 2.0f);
  try {
    dense<q5>{}.decompress_add(exec, span<const std::byte>(p), span<float>(out));
    FAIL("accepted a level above Levels");
  } catch (const format_error& e) {
    CHECK(e.code() == wire::format_errc::bad_code);
    CHECK(std::string(e.what()) == "decompress: value code out of range: value 0 has code 15, the stage's largest is 11");
  }
  CHECK(out == std::vector<float>(x.size(), 2.0f));
}
