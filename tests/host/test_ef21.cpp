// feedback::ef21 (Richtárik et al. 2021): the worker's and the aggregate's update against a plain
// reference, top-k's contraction on a fixed gradient, and save/restore.
#include <catch2/catch.hpp>

#include <cmath>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"

using namespace gradzip;

namespace {
using sparse = codec<sparsify::topk>;
using ef21_t = feedback::ef21<sparse, float, host>;

double squared_norm(const std::vector<float>& x) {
  double s = 0.0;
  for (float v : x) s += static_cast<double>(v) * v;
  return s;
}
}  // namespace

TEST_CASE("EF21 follows the paper's update step for step", "[ef21]") {
  const std::size_t n = 4000;
  const int ranks = 3;
  host exec;
  const sparse c{sparsify::topk::ratio(0.02)};
  std::vector<ef21_t> workers;
  for (int r = 0; r < ranks; ++r) workers.emplace_back(exec, c, n);
  ef21_t& first = workers[0];
  // The reference: each worker's g_i and the common g, in float as the wrapper computes them.
  std::vector<std::vector<float>> g_i(ranks, std::vector<float>(n, 0.0f));
  std::vector<float> g(n, 0.0f);
  for (std::uint32_t step = 0; step < 8; ++step) {
    std::vector<float> average(n, 0.0f);
    for (int r = 0; r < ranks; ++r) {
      const auto x = gradzip_tools::synthetic_gradient<float>(n, 100 * step + static_cast<std::uint32_t>(r));
      std::vector<float> difference(n);
      for (std::size_t i = 0; i < n; ++i) difference[i] = x[i] - g_i[r][i];
      std::vector<std::byte> out(workers[r].max_compressed_bytes<float>());
      out.resize(workers[r].compress(exec, span<const float>(x), span<std::byte>(out), {step, 0}));
      // c_i is the top 2 % of x_i - g_i, sent exactly (no values stage), and g_i takes it.
      REQUIRE(test::payload_indices(out) == test::reference_topk(difference, c.structure().selected_count(n)));
      c.decompress_add(exec, span<const std::byte>(out), span<float>(g_i[r]));
      c.decompress_add(exec, span<const std::byte>(out), span<float>(average), 1.0f / ranks);
      const auto got = workers[r].local();
      for (std::size_t i = 0; i < n; ++i) REQUIRE(got[i] == g_i[r][i]);
    }
    for (std::size_t i = 0; i < n; ++i) g[i] += average[i];
    for (auto& w : workers) {
      std::vector<float> a = average;
      w.apply(exec, span<float>(a));
      REQUIRE(a == g);  // apply hands g back in place
    }
    const auto got = first.estimate();
    REQUIRE(std::vector<float>(got.begin(), got.end()) == g);
  }
  // g is the average of the g_i (to rounding): the invariant of the algorithm.
  for (std::size_t i = 0; i < n; ++i) {
    const double mean = (static_cast<double>(g_i[0][i]) + g_i[1][i] + g_i[2][i]) / ranks;
    REQUIRE(std::abs(g[i] - mean) <= 1e-5 * (1.0 + std::abs(mean)));
  }
}

TEST_CASE("EF21 with top-k contracts toward a fixed gradient", "[ef21]") {
  // Top-k is contractive: ||C(v) - v||^2 <= (1 - k/n) ||v||^2 (EF21's Definition 1 with
  // alpha = k/n). For a fixed gradient x, x - g_i is what top-k left, so each step's
  // ||x - g_i||^2 is at most (1 - k/n) times the last one, and reaches 0 after n/k steps.
  const std::size_t n = 1000, k = 50;
  host exec;
  const sparse c{sparsify::topk::count(k)};
  ef21_t ef(exec, c, n);
  const auto x = gradzip_tools::synthetic_gradient<float>(n, 7);
  double last = squared_norm(x);
  std::vector<std::byte> out(ef.max_compressed_bytes<float>());
  for (std::uint32_t step = 0; step < n / k; ++step) {
    ef.compress(exec, span<const float>(x), span<std::byte>(out));
    std::vector<float> left(n);
    const auto g_i = ef.local();
    for (std::size_t i = 0; i < n; ++i) left[i] = x[i] - g_i[i];
    const double now = squared_norm(left);
    INFO("step " << step);
    REQUIRE(now <= (1.0 - static_cast<double>(k) / n) * last * (1.0 + 1e-6));
    last = now;
  }
  CHECK(last == 0.0);
}

TEST_CASE("EF21 saves and restores g_i and g", "[ef21]") {
  const std::size_t n = 600;
  host exec;
  const sparse c{sparsify::topk::ratio(0.05)};
  ef21_t a(exec, c, n), b(exec, c, n);
  std::vector<std::byte> out(a.max_compressed_bytes<float>());
  for (std::uint32_t step = 0; step < 3; ++step) {
    const auto x = gradzip_tools::synthetic_gradient<float>(n, 30 + step);
    a.compress(exec, span<const float>(x), span<std::byte>(out));
    std::vector<float> average(x.begin(), x.end());
    a.apply(exec, span<float>(average));
  }
  const auto state = a.save(exec);
  b.restore(exec, span<const std::byte>(state));
  CHECK(b.save(exec) == state);
  const auto x = gradzip_tools::synthetic_gradient<float>(n, 99);
  std::vector<std::byte> out_a(out.size()), out_b(out.size());
  REQUIRE(a.compress(exec, span<const float>(x), span<std::byte>(out_a)) ==
          b.compress(exec, span<const float>(x), span<std::byte>(out_b)));
  CHECK(out_a == out_b);

  // Bad states change nothing.
  const auto before = b.save(exec);
  auto longer = state;
  longer.resize(state.size() + 16);
  CHECK_THROWS_AS(b.restore(exec, span<const std::byte>(longer)), format_error);
  CHECK_THROWS_WITH(b.restore(exec, span<const std::byte>(longer)),
                    Catch::Matchers::Contains("ef21::restore") && Catch::Matchers::Contains("16"));
  auto shorter = state;
  shorter.resize(state.size() - 16);
  CHECK_THROWS_AS(b.restore(exec, span<const std::byte>(shorter)), format_error);
  ef21_t other(exec, c, n + 1);
  CHECK_THROWS_AS(other.restore(exec, span<const std::byte>(state)), format_error);
  CHECK(b.save(exec) == before);
}

TEST_CASE("EF21 names a wrong size and changes nothing", "[ef21]") {
  const std::size_t n = 100;
  host exec;
  ef21_t ef(exec, sparse{sparsify::topk::count(5)}, n);
  const auto x = gradzip_tools::synthetic_gradient<float>(50, 1);
  std::vector<std::byte> out(ef.max_compressed_bytes<float>());
  CHECK_THROWS_WITH(ef.compress(exec, span<const float>(x), span<std::byte>(out)),
                    Catch::Matchers::Contains("ef21: gradient has 50 elements, the state 100"));
  std::vector<float> average(50);
  CHECK_THROWS_WITH(ef.apply(exec, span<float>(average)),
                    Catch::Matchers::Contains("ef21::apply: average has 50 elements, the state 100"));
  const auto full = gradzip_tools::synthetic_gradient<float>(n, 1);
  std::vector<std::byte> small(10);
  CHECK_THROWS_WITH(ef.compress(exec, span<const float>(full), span<std::byte>(small)),
                    Catch::Matchers::Contains("ef21::compress: the output buffer holds 10 bytes"));
  for (float v : ef.local()) REQUIRE(v == 0.0f);
}
