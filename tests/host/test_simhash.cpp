// hash::simhash: exact along each block, unbiased over the projection (statistical, fixed seeds,
// on Gaussian, heavy-tailed and sparse blocks), error as the Gaussian formula predicts,
// deterministic bytes, NaN blocks loud, and malformed payloads rejected.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>

#include "common/synthetic_gradient.hpp"
#include "gradzip/hash/simhash.hpp"

using namespace gradzip;

namespace {

std::vector<std::byte> hash_of(const hash::simhash& sh, const std::vector<float>& x, quantize::compress_context ctx,
                               int threads = 0) {
  host exec(threads);
  std::vector<std::byte> out(sh.max_compressed_bytes<float>(x.size()));
  out.resize(sh.compress(exec, span<const float>(x), span<std::byte>(out), ctx));
  return out;
}

std::vector<float> estimate(const hash::simhash& sh, const std::vector<std::byte>& payload, std::size_t n) {
  host exec;
  std::vector<float> out(n);
  sh.decompress(exec, span<const std::byte>(payload), span<float>(out));
  return out;
}

std::vector<float> gaussian(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng);
  return x;
}

double dot(const float* a, const float* b, std::size_t n) {
  double s = 0.0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

/// Mean and per-coordinate variance of `draws` decodes (one per step) of x.
struct moments {
  std::vector<double> mean, variance;
  double relative_mse = 0.0;  // mean over draws of |x^ - x|^2 / |x|^2
};
moments draw(const hash::simhash& sh, const std::vector<float>& x, int draws) {
  const std::size_t n = x.size();
  std::vector<double> sum(n, 0.0), sum2(n, 0.0);
  double mse = 0.0;
  const double norm2 = dot(x.data(), x.data(), n);
  for (int s = 0; s < draws; ++s) {
    const auto e = estimate(sh, hash_of(sh, x, {static_cast<std::uint32_t>(s), 5}), n);
    double err = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      sum[i] += e[i];
      sum2[i] += static_cast<double>(e[i]) * e[i];
      err += (e[i] - static_cast<double>(x[i])) * (e[i] - static_cast<double>(x[i]));
    }
    mse += err / norm2;
  }
  moments m{std::vector<double>(n), std::vector<double>(n), mse / draws};
  for (std::size_t i = 0; i < n; ++i) {
    m.mean[i] = sum[i] / draws;
    m.variance[i] = sum2[i] / draws - m.mean[i] * m.mean[i];
  }
  return m;
}

}  // namespace

TEST_CASE("simhash is exact along every block, for every size", "[simhash]") {
  const hash::simhash sh{64, 16, 7};
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{63}, std::size_t{64}, std::size_t{65},
                        std::size_t{1000}}) {
    const auto x = gradzip_tools::synthetic_gradient<float>(n, 11);
    const auto payload = hash_of(sh, x, {3, 1});
    CHECK(payload.size() == sh.max_compressed_bytes<float>(n));
    const auto e = estimate(sh, payload, n);
    for (std::size_t first = 0; first < n; first += 64) {
      const std::size_t count = std::min<std::size_t>(64, n - first);
      const double norm2 = dot(x.data() + first, x.data() + first, count);
      INFO("n = " << n << ", block at " << first);
      // <x^, x> = |x|^2 up to float rounding (x^ is rounded once per coordinate).
      CHECK(std::abs(dot(e.data() + first, x.data() + first, count) - norm2) <= 1e-4 * norm2 + 1e-30);
    }
  }
  // n = 0: a payload with no blocks.
  const auto empty = hash_of(sh, {}, {});
  CHECK(estimate(sh, empty, 0).empty());
}

TEST_CASE("simhash decodes gradients near fp32's largest without overflow", "[simhash]") {
  // Entries up to about 3e37 (|x| about 2e38 per block of 64): each decode round scales by
  // 1 / sqrt(B) before its H, so no partial sum passes the estimate's own size. With H first
  // the sums passed 3.4e38 and the blocks decoded to NaN.
  const hash::simhash sh{64, 16, 7};
  auto x = gradzip_tools::synthetic_gradient<float>(640, 3);
  float largest = 0.0f;
  for (const float v : x) largest = std::max(largest, std::abs(v));
  for (auto& v : x) v = v / largest * 3e37f;
  for (std::uint32_t step = 0; step < 20; ++step) {
    const auto e = estimate(sh, hash_of(sh, x, {step, 1}), x.size());
    for (std::size_t first = 0; first < x.size(); first += 64) {
      INFO("step " << step << ", block at " << first);
      REQUIRE(std::all_of(e.begin() + first, e.begin() + first + 64, [](float v) { return std::isfinite(v); }));
      const double norm2 = dot(x.data() + first, x.data() + first, 64);
      CHECK(std::abs(dot(e.data() + first, x.data() + first, 64) - norm2) <= 1e-4 * norm2);
    }
  }
}

TEST_CASE("simhash's estimate is unbiased over the projection", "[simhash]") {
  // 4,000 draws (steps) of B = 256, m = 64. For each coordinate the mean of the draws minus x,
  // over the standard error sqrt(variance / draws), is about N(0, 1) if the estimator is
  // unbiased; the test bounds the sum of their squares (chi-square with B degrees of freedom,
  // mean B, sd sqrt(2B) = 22.6) by B + 6 sd, and every single one by 5.5 (p ~ 1e-5 over 256).
  const hash::simhash sh{256, 64, 99};
  const int draws = 4000;
  std::vector<float> sparse(256, 0.0f);
  sparse[0] = 3.0f;
  sparse[17] = -1.0f;
  sparse[200] = 0.5f;
  std::vector<float> spike(256, 0.0f);
  spike[31] = -2.0f;
  const std::pair<const char*, std::vector<float>> inputs[] = {
      {"gaussian", gaussian(256, 1)},
      {"heavy-tailed", gradzip_tools::synthetic_gradient<float>(256, 2)},
      {"three nonzeros", sparse},
      {"one nonzero", spike},
  };
  for (const auto& [name, x] : inputs) {
    const moments m = draw(sh, x, draws);
    double chi2 = 0.0, worst = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double z = (m.mean[i] - x[i]) / std::sqrt(m.variance[i] / draws + 1e-12);
      chi2 += z * z;
      worst = std::max(worst, std::abs(z));
    }
    INFO(name << ": chi-square " << chi2 << ", largest |z| " << worst);
    CHECK(chi2 < 256 + 6 * std::sqrt(2.0 * 256));
    CHECK(worst < 5.5);
  }
}

TEST_CASE("simhash's error matches pi B / (2 m) - 1 on Gaussian blocks", "[simhash]") {
  for (std::uint32_t m : {32u, 128u, 256u}) {
    const hash::simhash sh{256, m, 5};
    const moments r = draw(sh, gaussian(1024, 3), 300);
    const double predicted = 3.14159265358979 * 256 / (2.0 * m) - 1.0;
    INFO("m = " << m << ": measured " << r.relative_mse << ", predicted " << predicted);
    CHECK(std::abs(r.relative_mse - predicted) < 0.1 * predicted);
  }
}

TEST_CASE("simhash bytes depend on (seed, step, tensor), not on the thread count", "[simhash]") {
  const hash::simhash sh{128, 32, 1};
  const auto x = gradzip_tools::synthetic_gradient<float>(5000, 4);
  const auto one = hash_of(sh, x, {9, 2}, 1);
  CHECK(one == hash_of(sh, x, {9, 2}, 2));
  CHECK(one != hash_of(sh, x, {10, 2}));
  CHECK(one != hash_of(sh, x, {9, 3}));
  CHECK(one != hash_of(hash::simhash{128, 32, 2}, x, {9, 2}));
}

TEST_CASE("simhash sends a block with NaN or inf as NaN, and the other blocks as usual", "[simhash]") {
  const hash::simhash sh{64, 16, 3};
  auto x = gradzip_tools::synthetic_gradient<float>(200, 8);
  x[70] = std::numeric_limits<float>::infinity();
  x[150] = std::nanf("");
  const auto e = estimate(sh, hash_of(sh, x, {}), 200);
  for (std::size_t i = 0; i < 200; ++i) {
    const bool poisoned = i >= 64 && i < 192;  // blocks 1 (inf) and 2 (NaN)
    CHECK(std::isnan(e[i]) == poisoned);
  }
  auto clean = x;
  clean[70] = 1.0f;
  clean[150] = 1.0f;
  const auto c = estimate(sh, hash_of(sh, clean, {}), 200);
  for (std::size_t i = 0; i < 64; ++i) CHECK(c[i] == e[i]);
}

TEST_CASE("simhash rejects malformed and mismatched payloads, writing nothing", "[simhash]") {
  const hash::simhash sh{64, 16, 9};
  const auto x = gradzip_tools::synthetic_gradient<float>(300, 6);
  const auto good = hash_of(sh, x, {1, 1});
  const wire::header h = wire::read_header(span<const std::byte>(good));
  const std::size_t scales = h.sections[1].offset, codes = h.sections[2].offset;
  host exec;
  const auto rejects = [&](const hash::simhash& reader, const std::vector<std::byte>& bytes, wire::format_errc code,
                           std::size_t n = 300) {
    std::vector<float> out(n, 1.0f);
    try {
      reader.decompress_add(exec, span<const std::byte>(bytes), span<float>(out));
      FAIL("accepted");
    } catch (const format_error& e) {
      INFO(e.what());
      CHECK(e.code() == code);
    }
    CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 1.0f; }));
  };
  rejects(hash::simhash{128, 16, 9}, good, wire::format_errc::bad_params);  // block
  rejects(hash::simhash{64, 24, 9}, good, wire::format_errc::bad_params);   // bits
  rejects(hash::simhash{64, 16, 8}, good, wire::format_errc::bad_params);   // seed
  rejects(sh, good, wire::format_errc::size_mismatch, 299);
  std::vector<double> as_double(300, 1.0);  // an f32 payload is not a double tensor's
  CHECK_THROWS_WITH(sh.decompress_add(exec, span<const std::byte>(good), span<double>(as_double)),
                    "simhash: element type differs from the expected one: it holds f32, expected f64");
  CHECK(as_double == std::vector<double>(300, 1.0));
  auto truncated = good;
  truncated.resize(good.size() - 16);
  rejects(sh, truncated, wire::format_errc::truncated);
  auto other_codec = good;
  other_codec[9] = std::byte{7};
  rejects(sh, other_codec, wire::format_errc::codec_mismatch);
  for (std::uint32_t bad : {0x80000000u, 0xBF800000u, 0x7F800000u, 0x7FC00001u, 0xFFC00000u}) {
    auto corrupt = good;  // -0, -1, inf, a NaN other than the canonical one, a negative NaN
    for (int k = 0; k < 4; ++k) corrupt[scales + 4 + k] = static_cast<std::byte>(bad >> (8 * k));
    rejects(sh, corrupt, wire::format_errc::bad_scale);
  }
  auto negative = good;
  for (int k = 0; k < 4; ++k) negative[scales + 8 + k] = static_cast<std::byte>(0xBF800000u >> (8 * k));
  std::vector<float> out(300, 1.0f);
  CHECK_THROWS_WITH(sh.decompress_add(exec, span<const std::byte>(negative), span<float>(out)),
                    "simhash: bad block scale: block 2 has the scale word 0xbf800000, which is negative or not "
                    "finite (the one non-finite scale is the NaN marker 0x7fc00000)");
  auto nan_with_bits = good;  // a poisoned block must carry zero bits
  for (int k = 0; k < 4; ++k) nan_with_bits[scales + 4 + k] = static_cast<std::byte>(hash::simhash::poisoned_scale >> (8 * k));
  nan_with_bits[codes + 2] = std::byte{0};
  nan_with_bits[codes + 3] = std::byte{4};  // block 1's bit 10: bit 26 of the payload
  rejects(sh, nan_with_bits, wire::format_errc::bad_code);
  CHECK_THROWS_WITH(sh.decompress_add(exec, span<const std::byte>(nan_with_bits), span<float>(out)),
                    "simhash: value code out of range: value 26 has code 1, the stage's largest is 0");
  std::vector<float> kept(300, 1.0f);  // decompress, too, writes nothing before validating
  CHECK_THROWS_AS(sh.decompress(exec, span<const std::byte>(truncated), span<float>(kept)), format_error);
  CHECK(std::all_of(kept.begin(), kept.end(), [](float v) { return v == 1.0f; }));
  CHECK_THROWS_AS((hash::simhash{48, 16, 1}), invalid_argument);
  CHECK_THROWS_AS((hash::simhash{64, 12, 1}), invalid_argument);
  CHECK_THROWS_AS((hash::simhash{64, 128, 1}), invalid_argument);
}
