#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"

using namespace gradzip;

namespace {
using th = codec<sparsify::threshold>;

template <class T>
std::vector<std::uint64_t> reference_kept(const std::vector<T>& x, double tau) {
  std::vector<std::uint64_t> out;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = static_cast<double>(to_float(x[i]));
    if (std::isnan(v) || std::abs(v) >= tau) out.push_back(i);
  }
  return out;
}
}  // namespace

static_assert(th::data_dependent_count && !th::summable);

TEST_CASE("threshold keeps exactly the elements with |x| >= tau, in order", "[threshold]") {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{300001}}) {
    auto x = gradzip_tools::synthetic_gradient<float>(n, 60 + n);
    if (n > 10) x[7] = std::numeric_limits<float>::quiet_NaN();
    for (double tau : {0.0, 1e-3, 0.05, 1e9}) {
      for (int threads : {1, 2}) {
        host exec(threads);
        const th c{sparsify::threshold{tau}};
        std::vector<std::byte> p(c.max_compressed_bytes<float>(n));
        const std::size_t bytes = c.compress(exec, span<const float>(x), span<std::byte>(p));
        p.resize(bytes);
        const auto expected = reference_kept(x, tau);
        REQUIRE(test::payload_indices(p) == expected);
        REQUIRE(bytes == th::layout(element_type::f32, n, expected.size()).total_bytes());
        std::vector<float> out(n, 5.0f);
        c.decompress(exec, span<const std::byte>(p), span<float>(out));
        std::size_t next = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const bool kept = next < expected.size() && expected[next] == i;
          if (kept) ++next;
          if (kept && !std::isnan(x[i])) REQUIRE(out[i] == x[i]);
          if (!kept) REQUIRE(out[i] == 0.0f);
        }
      }
    }
  }
}

TEST_CASE("threshold compares exactly against a double tau", "[threshold]") {
  const float above = 0.1f;                                   // 0.100000001490116... > 0.1
  const float below = std::nextafter(0.1f, 0.0f);             // 0.0999999940395...   < 0.1
  const std::vector<float> x = {above, below, -above, -below, 0.0f};
  host exec;
  const auto p = test::compress(th{sparsify::threshold{0.1}}, exec, x);
  CHECK(test::payload_indices(p) == std::vector<std::uint64_t>{0, 2});
  const std::vector<double> xd = {0.1, std::nextafter(0.1, 0.0), -0.1};
  CHECK(test::payload_indices(test::compress(th{sparsify::threshold{0.1}}, exec, xd)) ==
        std::vector<std::uint64_t>{0, 2});
#if GRADZIP_HAS_HALF
  const std::vector<__nv_bfloat16> xb = {__float2bfloat16(0.5f), __float2bfloat16(0.25f)};
  CHECK(test::payload_indices(test::compress(th{sparsify::threshold{0.3}}, exec, xb)) ==
        std::vector<std::uint64_t>{0});
#endif
  CHECK_THROWS_AS(sparsify::threshold{-1.0}, invalid_argument);
  CHECK_THROWS_AS(sparsify::threshold{std::numeric_limits<double>::infinity()}, invalid_argument);
  CHECK_THROWS_AS(sparsify::threshold{std::nan("")}, invalid_argument);
}

TEST_CASE("threshold values compose with casts and bucketed quantizers", "[threshold]") {
  const auto x = gradzip_tools::synthetic_gradient<float>(20000, 3);
  std::vector<float> magnitudes(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) magnitudes[i] = std::abs(x[i]);
  std::sort(magnitudes.begin(), magnitudes.end());
  const double tau = magnitudes[x.size() * 95 / 100];  // keeps about 5 %
  const auto kept = reference_kept(x, tau);
  REQUIRE(kept.size() > 900);
  const auto fp16 = test::round_trip(codec<sparsify::threshold, quantize::cast_fp16>{sparsify::threshold{tau}}, x);
  const auto q8 = test::round_trip(codec<sparsify::threshold, quantize::uniform<8>>{sparsify::threshold{tau}}, x);
  std::size_t nonzero = 0;
  for (auto i : kept) {
    REQUIRE(fp16[i] == detail::half_bits_to_float(quantize::float_to_half_bits(x[i])));
    REQUIRE(std::abs(q8[i] - x[i]) <= 0.5f * (magnitudes.back() * 2 / 255) * 1.001f);  // half a step
    nonzero += q8[i] != 0.0f;
  }
  CHECK(nonzero > kept.size() / 2);
}

TEST_CASE("threshold refuses an output buffer smaller than the payload it needs", "[threshold]") {
  const auto x = gradzip_tools::synthetic_gradient<float>(1000, 3);
  host exec;
  std::vector<std::byte> small(200);
  CHECK_THROWS_AS(th{sparsify::threshold{0.0}}.compress(exec, span<const float>(x), span<std::byte>(small)),
                  invalid_argument);
}

TEST_CASE("compress_async on the host writes compress's bytes and size", "[threshold]") {
  host exec;
  const auto x = gradzip_tools::synthetic_gradient<float>(10000, 77);
  const codec<sparsify::threshold> c{sparsify::threshold{0.5}};
  const auto expected = test::compress(c, exec, x);
  std::vector<std::byte> out(c.max_compressed_bytes<float>(x.size()));
  std::uint64_t size = 0;
  c.compress_async(exec, span<const float>(x), span<std::byte>(out), &size);
  REQUIRE(size == expected.size());
  out.resize(size);
  CHECK(out == expected);
  // The output must hold the bound, not just this payload.
  std::vector<std::byte> tight(expected.size());
  CHECK_THROWS_AS(c.compress_async(exec, span<const float>(x), span<std::byte>(tight), &size), invalid_argument);
}
