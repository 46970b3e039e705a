#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"

using namespace gradzip;

namespace {
using rk = codec<sparsify::randomk, quantize::none, encode::none>;
using rk_fp16 = codec<sparsify::randomk, quantize::cast_fp16, encode::none>;

std::vector<std::uint64_t> chosen(std::uint64_t n, std::uint64_t k, std::uint64_t seed, quantize::compress_context ctx) {
  std::uint8_t p[24];
  sparsify::randomk::count(k, seed).write_params(p, ctx);
  std::vector<std::uint64_t> out(k);
  for (std::uint64_t j = 0; j < k; ++j) out[j] = sparsify::randomk::index_of(p, n, k, j);
  return out;
}
}  // namespace

static_assert(rk::summable && rk_fp16::summable, "random-k payloads are summable at compile time");
static_assert(rk::implicit_indices && !rk::has_indices && !rk::dense);

TEST_CASE("random-k selects exactly k distinct increasing indices, one per stratum", "[randomk]") {
  for (std::uint64_t n : {1ull, 7ull, 1000ull, 4097ull, (1ull << 33) + 5}) {
    for (std::uint64_t k : {1ull, 3ull, 7ull, 100ull}) {
      if (k > n) continue;
      const auto idx = chosen(n, k, 42, {3, 9});
      for (std::uint64_t j = 0; j < k; ++j) {
        REQUIRE(idx[j] >= sparsify::randomk::stratum_begin(n, k, j));
        REQUIRE(idx[j] < sparsify::randomk::stratum_begin(n, k, j + 1));
        if (j > 0) REQUIRE(idx[j] > idx[j - 1]);
      }
    }
  }
  CHECK(chosen(1000, 10, 42, {3, 9}) == chosen(1000, 10, 42, {3, 9}));   // same key: same set
  CHECK(chosen(1000, 10, 42, {3, 9}) != chosen(1000, 10, 42, {4, 9}));   // next step: another
  CHECK(chosen(1000, 10, 42, {3, 9}) != chosen(1000, 10, 43, {3, 9}));
  CHECK(chosen(5, 5, 1, {}) == std::vector<std::uint64_t>{0, 1, 2, 3, 4});  // k = n: everything
}

TEST_CASE("random-k payloads carry k values and no indices, and decode scaled", "[randomk]") {
  const auto x = gradzip_tools::synthetic_gradient<float>(1000, 4);
  const rk c{sparsify::randomk::count(10, 77)};
  host exec;
  std::vector<std::byte> p(c.max_compressed_bytes<float>(x.size()));
  const auto bytes = c.compress(exec, span<const float>(x), span<std::byte>(p), {5, 2});
  CHECK(rk::layout(element_type::f32, 1000, 10).at(1).size == 40);  // 10 fp32 values only
  CHECK(bytes == p.size());
  std::vector<float> out(x.size());
  c.decompress(exec, span<const std::byte>(p.data(), bytes), span<float>(out));
  const auto idx = chosen(1000, 10, 77, {5, 2});
  const std::set<std::uint64_t> picked(idx.begin(), idx.end());
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (picked.count(i)) {
      REQUIRE(out[i] == x[i] * 100.0f);  // stratum length n / k = 100
    } else {
      REQUIRE(out[i] == 0.0f);
    }
  }
  const rk unscaled{sparsify::randomk::count(10, 77, false)};
  unscaled.compress(exec, span<const float>(x), span<std::byte>(p), {5, 2});
  unscaled.decompress(exec, span<const std::byte>(p.data(), bytes), span<float>(out));
  for (auto i : idx) REQUIRE(out[i] == x[i]);
}

TEST_CASE("random-k payloads of several workers sum to the payload of the summed gradients", "[randomk]") {
  const std::size_t n = 5000;
  const rk c{sparsify::randomk::ratio(0.02, 1234)};
  host exec;
  std::vector<float> total(n, 0.0f), summed_values;
  std::vector<std::byte> p(c.max_compressed_bytes<float>(n));
  for (int worker = 0; worker < 4; ++worker) {
    const auto g = gradzip_tools::synthetic_gradient<float>(n, 300 + worker);
    for (std::size_t i = 0; i < n; ++i) total[i] += g[i];
    c.compress(exec, span<const float>(g), span<std::byte>(p), {7, 1});
    const auto h = wire::read_header(span<const std::byte>(p));
    const auto* v = reinterpret_cast<const float*>(p.data() + h.sections[1].offset);
    if (summed_values.empty()) summed_values.assign(v, v + h.sections[1].size / 4);
    else for (std::size_t j = 0; j < summed_values.size(); ++j) summed_values[j] += v[j];
  }
  std::vector<std::byte> of_sum(p.size());
  c.compress(exec, span<const float>(total), span<std::byte>(of_sum), {7, 1});
  const auto h = wire::read_header(span<const std::byte>(of_sum));
  REQUIRE(h.sections[1].size == summed_values.size() * 4);
  CHECK(std::memcmp(of_sum.data() + h.sections[1].offset, summed_values.data(), h.sections[1].size) == 0);
}

TEST_CASE("random-k is unbiased within its variance bound", "[randomk]") {
  // Element i is sent as len x_i with probability 1 / len (len = 8 here): Var = x_i^2 (len - 1);
  // the mean of 4,000 steps lies within 5 standard deviations.
  const std::size_t n = 400, trials = 4000;
  const auto x = gradzip_tools::synthetic_gradient<float>(n, 17);
  const rk c{sparsify::randomk::count(50, 99)};
  std::vector<double> sum(n, 0.0);
  for (std::uint32_t s = 0; s < trials; ++s) {
    const auto out = test::round_trip(c, x, {s, 0});
    for (std::size_t i = 0; i < n; ++i) sum[i] += out[i];
  }
  for (std::size_t i = 0; i < n; ++i) {
    const double sd = std::abs(x[i]) * std::sqrt(7.0 / trials);
    REQUIRE(std::abs(sum[i] / trials - x[i]) <= 5 * sd + 1e-7);
  }
}

TEST_CASE("random-k composes with casts and rejects bad parameters", "[randomk]") {
  const auto x = gradzip_tools::synthetic_gradient<float>(300, 8);
  const auto out = test::round_trip(rk_fp16{sparsify::randomk::count(30, 5)}, x, {1, 1});
  int nonzero = 0;
  for (float v : out) nonzero += v != 0.0f;
  CHECK(nonzero <= 30);
  CHECK(nonzero >= 28);  // a chosen element that is exactly zero decodes to zero
  CHECK_THROWS_AS(sparsify::randomk::ratio(0.0, 1), invalid_argument);
  CHECK_THROWS_AS(rk{sparsify::randomk::count(400, 1)}.max_compressed_bytes<float>(300), invalid_argument);
  host exec;
  auto p = test::compress(rk{sparsify::randomk::count(30, 5)}, exec, x);
  std::vector<float> o(300, 2.0f);
  // Params at 96 + 8 (after the header of 2 sections and the count): scaled byte at +16.
  auto q = p;
  q[96 + 8 + 16] = std::byte{2};
  test::expect_rejected(rk{}, exec, q, o, wire::format_errc::bad_params);
  q = p;
  q[96 + 8 + 20] = std::byte{1};
  test::expect_rejected(rk{}, exec, q, o, wire::format_errc::nonzero_reserved);
  test::expect_rejected(codec<sparsify::none, quantize::none, encode::none>{}, exec, p, o,
                        wire::format_errc::codec_mismatch);
}

TEST_CASE("random-k's unbiasing factor is the stratum's length exactly, beyond 2^24", "[randomk]") {
  std::uint8_t params[24] = {};
  params[16] = 1;  // scaled
  const std::uint64_t n = (std::uint64_t{1} << 25) + 1;  // one stratum of 2^25 + 1: not a float
  CHECK(sparsify::randomk::value_scale(params, n, 1, 0) == static_cast<double>(n));
  const std::uint64_t big = (std::uint64_t{1} << 40) + 3;  // strata of 2^39 + 1 and 2^39 + 2
  CHECK(sparsify::randomk::value_scale(params, big, 2, 0) + sparsify::randomk::value_scale(params, big, 2, 1) ==
        static_cast<double>(big));
  params[16] = 0;
  CHECK(sparsify::randomk::value_scale(params, n, 1, 0) == 1.0);
}

TEST_CASE("random-k composes with bucketed quantizers: buckets over the k kept values", "[randomk]") {
  using rk_u4 = codec<sparsify::randomk, quantize::uniform<4>, encode::none>;
  using dense_u4 = codec<sparsify::none, quantize::uniform<4>, encode::none>;
  static_assert(!rk_u4::summable && rk_u4::implicit_indices && rk_u4::bucketed);
  host exec;
  const std::uint64_t n = 100003, k = 1237;  // k not a multiple of the bucket (512) or of 32
  const auto x = gradzip_tools::synthetic_gradient<float>(n, 12);
  const rk_u4 c{sparsify::randomk::count(k, 5)};
  const auto payload = test::compress(c, exec, x, {7, 3});
  // Section sizes: params, then k values' scales and 4-bit codes, no indices.
  const wire::header h = wire::read_header(span<const std::byte>(payload));
  REQUIRE(h.section_count == 3);
  // Reference: the kept values quantized as a dense tensor of k elements (nearest rounding has
  // no randomness, so the bucket codes are the same), placed at the chosen indices, scaled by
  // each stratum's length.
  const auto idx = chosen(n, k, 5, {7, 3});
  std::vector<float> kept(k);
  for (std::uint64_t j = 0; j < k; ++j) kept[j] = x[idx[j]];
  std::vector<float> q(k);
  const auto dense_payload = test::compress(dense_u4{}, exec, kept);
  dense_u4{}.decompress(exec, span<const std::byte>(dense_payload), span<float>(q));
  std::vector<float> out(n, 1.0f);
  c.decompress(exec, span<const std::byte>(payload), span<float>(out));
  std::vector<float> expected(n, 0.0f);
  for (std::uint64_t j = 0; j < k; ++j) {
    const double len = static_cast<double>(sparsify::randomk::stratum_begin(n, k, j + 1) - sparsify::randomk::stratum_begin(n, k, j));
    expected[idx[j]] = static_cast<float>(0.0f + static_cast<double>(q[j]) * len);
  }
  CHECK(out == expected);
  std::vector<float> added(n, 0.0f);
  c.decompress_add(exec, span<const std::byte>(payload), span<float>(added));
  CHECK(added == expected);
  // The per-element reading the CUDA decoder uses (index_at, value_at) agrees element by element.
  detail::payload_view v;
  REQUIRE(detail::frame<rk_u4>::parse(reinterpret_cast<const std::uint8_t*>(payload.data()), payload.size(), v).ok());
  for (std::uint64_t j = 0; j < k; ++j) {
    REQUIRE(detail::frame<rk_u4>::index_at(v, j) == idx[j]);
    REQUIRE(static_cast<float>(0.0f + detail::frame<rk_u4>::value_at(v, element_type::f32, j)) == expected[idx[j]]);
  }
  // A stochastic bucketed stage draws from (seed, step, tensor index): same key, same bytes.
  using rk_q = codec<sparsify::randomk, quantize::qsgd<7>, encode::none>;
  const rk_q s{sparsify::randomk::count(k, 5), quantize::qsgd<7>{11}};
  CHECK(test::compress(s, exec, x, {7, 3}) == test::compress(s, exec, x, {7, 3}));
  CHECK(test::compress(s, exec, x, {7, 3}) != test::compress(s, exec, x, {8, 3}));
}
