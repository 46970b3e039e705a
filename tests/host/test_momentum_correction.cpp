// feedback::momentum_correction (DGC): the accumulation and masking against a plain reference,
// nothing lost over steps, and save/restore.
#include <catch2/catch.hpp>

#include <cmath>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"

using namespace gradzip;

namespace {
using sparse = codec<sparsify::topk>;
}

TEST_CASE("momentum correction follows DGC's update step for step", "[momentum_correction]") {
  const std::size_t n = 5000;
  const float m = 0.9f;
  host exec;
  const sparse c{sparsify::topk::ratio(0.01)};
  feedback::momentum_correction<sparse, float, host> mc(exec, c, n, m);
  std::vector<float> u(n, 0.0f), v(n, 0.0f);  // the reference state
  std::vector<double> sent(n, 0.0), added(n, 0.0);
  for (std::uint32_t step = 0; step < 20; ++step) {
    const auto g = gradzip_tools::synthetic_gradient<float>(n, 300 + step);
    for (std::size_t i = 0; i < n; ++i) {
      u[i] = std::fma(m, u[i], g[i]);
      v[i] = v[i] + u[i];
      added[i] += u[i];
    }
    std::vector<std::byte> out(mc.max_compressed_bytes<float>());
    const std::size_t bytes = mc.compress(exec, span<const float>(g), span<std::byte>(out));
    std::vector<float> d(n);
    c.decompress(exec, span<const std::byte>(out.data(), bytes), span<float>(d));
    // The payload is the top 1 % of the reference's v.
    out.resize(bytes);
    CHECK(test::payload_indices(out) == test::reference_topk(v, c.structure().selected_count(n)));
    for (std::size_t i = 0; i < n; ++i) {
      v[i] -= d[i];
      if (d[i] != 0.0f) u[i] = 0.0f;
      sent[i] += d[i];
    }
    const auto got_u = mc.velocity();
    const auto got_v = mc.accumulated();
    for (std::size_t i = 0; i < n; ++i) {
      REQUIRE(got_u[i] == u[i]);
      REQUIRE(got_v[i] == v[i]);
    }
  }
  // Nothing is lost: what was sent plus what is held is every velocity added (to rounding).
  for (std::size_t i = 0; i < n; ++i) {
    REQUIRE(std::abs(sent[i] + v[i] - added[i]) <= 1e-5 * (1.0 + std::abs(added[i])));
  }
}

TEST_CASE("momentum correction saves and restores its state", "[momentum_correction]") {
  const std::size_t n = 700;
  host exec;
  const sparse c{sparsify::topk::ratio(0.05)};
  feedback::momentum_correction<sparse, float, host> a(exec, c, n, 0.5f), b(exec, c, n, 0.5f);
  std::vector<std::byte> out(a.max_compressed_bytes<float>());
  for (std::uint32_t step = 0; step < 3; ++step) {
    const auto g = gradzip_tools::synthetic_gradient<float>(n, 20 + step);
    a.compress(exec, span<const float>(g), span<std::byte>(out));
  }
  const auto state = a.save(exec);
  b.restore(exec, span<const std::byte>(state));
  const auto g = gradzip_tools::synthetic_gradient<float>(n, 99);
  std::vector<std::byte> out_a(out.size()), out_b(out.size());
  const auto bytes_a = a.compress(exec, span<const float>(g), span<std::byte>(out_a));
  const auto bytes_b = b.compress(exec, span<const float>(g), span<std::byte>(out_b));
  REQUIRE(bytes_a == bytes_b);
  CHECK(out_a == out_b);

  auto truncated = state;
  truncated.resize(state.size() - 16);
  CHECK_THROWS_AS(b.restore(exec, span<const std::byte>(truncated)), format_error);
  feedback::momentum_correction<sparse, float, host> other(exec, c, n + 1, 0.5f);
  CHECK_THROWS_AS(other.restore(exec, span<const std::byte>(state)), format_error);
  CHECK_THROWS_AS((feedback::momentum_correction<sparse, float, host>(exec, c, n, 1.0f)), invalid_argument);
}

TEST_CASE("double states update in double: momentum correction and signum", "[momentum_correction]") {
  host exec;
  const std::size_t n = 4;
  const std::vector<double> g = {1000.0, 0.1, 1e-9, 1e-9};  // top-1 sends element 0 only
  const sparse top1{sparsify::topk::count(1)};
  feedback::momentum_correction<sparse, double, host> mc(exec, top1, n, 0.5f);
  std::vector<std::byte> out(mc.max_compressed_bytes<double>());
  for (int step = 0; step < 3; ++step) mc.compress(exec, span<const double>(g), span<std::byte>(out));
  // u = 1, 1.5, 1.75 times g, v their sum (4.25 g), each one rounding in double: in float,
  // 0.1 and 1e-9 would show float's 24 bits.
  const auto u = [](double x) { return std::fma(0.5, std::fma(0.5, x, x), x); };
  CHECK(mc.velocity()[1] == u(0.1));
  CHECK(mc.accumulated()[1] == 0.1 + std::fma(0.5, 0.1, 0.1) + u(0.1));
  CHECK(mc.accumulated()[2] == 1e-9 + std::fma(0.5, 1e-9, 1e-9) + u(1e-9));
  using sign_codec = codec<sparsify::none, quantize::sign<false>, encode::none>;
  feedback::signum<sign_codec, double, host> sg(exec, sign_codec{}, n, 0.25f);
  std::vector<std::byte> so(sg.max_compressed_bytes<double>());
  sg.compress(exec, span<const double>(g), span<std::byte>(so));
  CHECK(sg.momentum()[1] == std::fma(0.25, 0.0, 0.75 * 0.1));
}

TEST_CASE("momentum correction over sampled top-k keeps v zero where it sent", "[momentum_correction]") {
  const std::size_t n = 20000;
  host exec;
  using dgc = codec<sparsify::sampled_topk>;
  feedback::momentum_correction<dgc, float, host> mc(exec, dgc{sparsify::sampled_topk::ratio(0.01)}, n, 0.9f);
  std::vector<std::byte> out(mc.max_compressed_bytes<float>());
  for (std::uint32_t step = 0; step < 5; ++step) {
    const auto g = gradzip_tools::synthetic_gradient<float>(n, 40 + step);
    const auto bytes = mc.compress(exec, span<const float>(g), span<std::byte>(out));
    std::vector<std::byte> p(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(bytes));
    const auto kept = test::payload_indices(p);
    CHECK(kept.size() >= n / 100);
    CHECK(kept.size() <= n / 100 + n / 500);
    for (auto i : kept) {
      REQUIRE(mc.accumulated()[i] == 0.0f);
      REQUIRE(mc.velocity()[i] == 0.0f);
    }
  }
}
