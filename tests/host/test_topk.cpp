#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"

using namespace gradzip;

namespace {

template <class T>
std::vector<std::uint64_t> topk_indices(const std::vector<T>& x, std::uint64_t k, int threads = 0) {
  host exec(threads);
  codec<sparsify::topk> c{sparsify::topk::count(k)};
  return test::payload_indices(test::compress(c, exec, x));
}

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng);
  return x;
}

}  // namespace

TEST_CASE("topk selection matches the sorted reference", "[topk]") {
  const std::size_t sizes[] = {1, 2, 7, 100, 4095, 4097, 70000, 300001};
  for (std::size_t n : sizes) {
    const auto x = random_floats(n, n);
    for (std::uint64_t k : {std::uint64_t{1}, std::uint64_t{n / 100 + 1}, std::uint64_t{n / 3 + 1},
                            std::uint64_t{n}}) {
      INFO("n = " << n << ", k = " << k);
      CHECK(topk_indices(x, k) == test::reference_topk(x, k));
    }
  }
}

TEST_CASE("topk on a heavy-tailed gradient at 1 % thread counts agree byte for byte", "[topk]") {
  const auto g = gradzip_tools::synthetic_gradient<float>(1 << 20, 7);
  codec<sparsify::topk> c{sparsify::topk::ratio(0.01)};
  host one(1), two(2), four(4);
  const auto a = test::compress(c, one, g);
  CHECK(a == test::compress(c, two, g));
  CHECK(a == test::compress(c, four, g));
  CHECK(test::payload_indices(a) == test::reference_topk(g, c.structure().selected_count(g.size())));
}

TEST_CASE("topk ties break toward the lower index across chunks", "[topk]") {
  // Every value equal: the k lowest indices win. Large enough to span several chunks.
  std::vector<float> same(200000, 0.5f);
  std::vector<std::uint64_t> first(1000);
  std::iota(first.begin(), first.end(), 0);
  CHECK(topk_indices(same, 1000, 4) == first);
  // Signs do not matter, only magnitude: -3 and 3 tie.
  std::vector<float> x = {3, -3, 1, 3, -3};
  CHECK(topk_indices(x, 2) == std::vector<std::uint64_t>{0, 1});
  CHECK(topk_indices(x, 3) == std::vector<std::uint64_t>{0, 1, 3});
  // +0 and -0 tie.
  std::vector<float> zeros = {0.0f, -0.0f, 0.0f};
  CHECK(topk_indices(zeros, 2) == std::vector<std::uint64_t>{0, 1});
}

TEST_CASE("topk with ties straddling the threshold in many chunks", "[topk]") {
  std::vector<float> x(500000, 1.0f);
  for (std::size_t i = 0; i < x.size(); i += 7) x[i] = 2.0f;  // 71429 larger values
  const std::uint64_t k = 100000;                              // 28571 ties at 1.0 are taken
  CHECK(topk_indices(x, k, 3) == test::reference_topk(x, k));
}

TEST_CASE("topk ties at the threshold split across chunks from the candidate list", "[topk]") {
  // `above` values above 3, 2 x `above` ties at exactly 3 scattered over every chunk, the rest
  // below 1: the ties are taken from the candidate list, lowest indices first. With 1,000 above
  // both thread counts take the one-read path; with 10,000 above, 4 threads (a quarter of the
  // list each) skip it and take the histogram and the list.
  for (std::size_t above : {std::size_t{1000}, std::size_t{10000}}) {
    auto x = random_floats(1 << 20, 21);
    for (auto& v : x) v = std::fmod(v, 1.0f);
    for (std::size_t j = 0; j < 3 * above; ++j) {
      x[j * (x.size() / (3 * above)) + 5] = j % 3 == 0 ? 4.0f + static_cast<float>(j) : -3.0f;
    }
    for (std::uint64_t k : {above, above + 1, 2 * above, 3 * above - 1, 3 * above}) {
      INFO("above = " << above << ", k = " << k);
      const auto want = test::reference_topk(x, k);
      CHECK(topk_indices(x, k, 1) == want);
      CHECK(topk_indices(x, k, 4) == want);
    }
  }
}

TEST_CASE("topk falls back from one read when the sample misleads it", "[topk]") {
  const std::size_t n = 1 << 20;
  const std::size_t m = detail::topk_sample_size(n);
  REQUIRE(m == 16384);
  SECTION("the sample sees only the largest keys: fewer than k lie above its bound") {
    auto x = random_floats(n, 31);
    for (std::size_t j = 0; j < m; ++j) x[j * n / m] = 100.0f + static_cast<float>(j % 7);
    for (std::uint64_t k : {std::uint64_t{20000}, std::uint64_t{16385}}) {
      const auto want = test::reference_topk(x, k);
      CHECK(topk_indices(x, k, 1) == want);
      CHECK(topk_indices(x, k, 2) == want);
    }
  }
  SECTION("the sample misses a chunk of large keys: that chunk overflows its share of the list") {
    auto x = random_floats(n, 32);
    for (std::size_t i = 0; i < n / 2; ++i) {
      if (i % (n / m) != 0) x[i] = 50.0f + x[i];  // large unless sampled
    }
    const std::uint64_t k = n / 100;
    const auto want = test::reference_topk(x, k);
    CHECK(topk_indices(x, k, 1) == want);
    CHECK(topk_indices(x, k, 2) == want);
  }
}

TEST_CASE("topk refines with extra reads when one bin holds too many candidates", "[topk]") {
  // All values share their top 11 key bits (same exponent, same top mantissa bits) and differ
  // only in the low bits: the candidate buffer would overflow, so the refinement path runs.
  std::vector<float> x(300000);
  std::mt19937 rng(3);
  for (auto& v : x) {
    const std::uint32_t bits = 0x3F800000u | (rng() & 0xFFFFu);
    std::memcpy(&v, &bits, 4);
  }
  for (std::uint64_t k : {1ull, 1000ull, 150000ull}) CHECK(topk_indices(x, k, 2) == test::reference_topk(x, k));
}

TEST_CASE("topk ranks NaN above infinity and all NaNs equal", "[topk]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {1, -inf, 2, nan, 5, -nan, inf, 3};
  CHECK(topk_indices(x, 1) == std::vector<std::uint64_t>{3});
  CHECK(topk_indices(x, 2) == std::vector<std::uint64_t>{3, 5});
  CHECK(topk_indices(x, 4) == std::vector<std::uint64_t>{1, 3, 5, 6});
}

TEST_CASE("topk on doubles uses 64-bit keys", "[topk]") {
  std::vector<double> x(50000);
  std::mt19937_64 rng(11);
  std::normal_distribution<double> d;
  for (auto& v : x) v = d(rng);
  x[17] = x[18] * (1 + 1e-15);  // differs from x[18] below float precision
  CHECK(topk_indices(x, 500) == test::reference_topk(x, 500));
  std::vector<double> near = {1.0, 1.0 + 1e-15, 1.0 + 2e-15};
  CHECK(topk_indices(near, 1) == std::vector<std::uint64_t>{2});
}

#if GRADZIP_HAS_HALF
TEST_CASE("topk on half and bfloat16", "[topk]") {
  const auto f = random_floats(20000, 5);
  std::vector<__half> h(f.size());
  std::vector<__nv_bfloat16> b(f.size());
  for (std::size_t i = 0; i < f.size(); ++i) {
    h[i] = __float2half_rn(f[i]);
    b[i] = __float2bfloat16_rn(f[i]);
  }
  CHECK(topk_indices(h, 200) == test::reference_topk(h, 200));
  CHECK(topk_indices(b, 200) == test::reference_topk(b, 200));  // bf16 has many ties
}
#endif

TEST_CASE("topk parameters are validated with messages that name the value", "[topk]") {
  CHECK_THROWS_WITH(sparsify::topk::ratio(1.5), "topk: ratio must be in (0, 1], got 1.5");
  CHECK_THROWS_AS(sparsify::topk::ratio(0.0), gradzip::invalid_argument);
  CHECK_THROWS_AS(sparsify::topk::ratio(std::nan("")), gradzip::invalid_argument);
  CHECK_THROWS_WITH(sparsify::topk::count(11).selected_count(10),
                    "topk: k = 11 exceeds the tensor's element count 10");
}

TEST_CASE("topk ratio rounds up and keeps at least one element", "[topk]") {
  const auto r = sparsify::topk::ratio(0.01);
  CHECK(r.selected_count(0) == 0);
  CHECK(r.selected_count(1) == 1);
  CHECK(r.selected_count(100) == 1);
  CHECK(r.selected_count(101) == 2);
  CHECK(r.selected_count(1 << 24) == 167773);
  CHECK(sparsify::topk::ratio(1.0).selected_count(77) == 77);
  // Decimal ratios whose double is a little above them: 0.07 x 100 is 7.000000000000001 in
  // double, and keeps 7 (it kept 8); a product truly above a whole number still rounds up.
  CHECK(sparsify::topk::ratio(0.07).selected_count(100) == 7);
  CHECK(sparsify::randomk::ratio(0.07, 1).selected_count(100) == 7);
  CHECK(sparsify::sampled_topk::ratio(0.07).target_count(100) == 7);
  CHECK(sparsify::topk::ratio(0.29).selected_count(100) == 29);
  CHECK(sparsify::topk::ratio(0.07).selected_count(101) == 8);  // 7.07
  CHECK(sparsify::topk::ratio(0.0700001).selected_count(100) == 8);
  CHECK(sparsify::topk::ratio(0.5).selected_count((std::uint64_t{1} << 41) + 1) == (std::uint64_t{1} << 40) + 1);
  // Every ratio d / 1000 of n = 1000 keeps d, and of n = 10^6 keeps 1000 d.
  for (int d = 1; d <= 1000; ++d) {
    INFO("ratio " << d << " / 1000");
    CHECK(sparsify::topk::ratio(d / 1000.0).selected_count(1000) == static_cast<std::uint64_t>(d));
    CHECK(sparsify::topk::ratio(d / 1000.0).selected_count(1000000) == static_cast<std::uint64_t>(d) * 1000);
  }
}

TEST_CASE("sparsifiers constructed by default keep 1 %", "[topk]") {
  CHECK(sparsify::topk{}.selected_count(1000) == 10);
  CHECK(sparsify::randomk{}.selected_count(1000) == 10);
  CHECK(sparsify::sampled_topk{}.target_count(1000) == 10);
  CHECK(sparsify::sampled_topk{}.sample_rate() == sparsify::sampled_topk::default_sample_rate);
  // A default sampled top-k codec sends about 1 % (it sent nothing: its k was 0).
  host exec;
  const auto x = gradzip_tools::synthetic_gradient<float>(100000, 4);
  const auto kept = test::payload_indices(test::compress(codec<sparsify::sampled_topk>{}, exec, x));
  CHECK(kept.size() >= 1000);
  CHECK(kept.size() <= 1200);
}

TEST_CASE("topk of zero elements and k = 0", "[topk]") {
  host exec;
  codec<sparsify::topk> c{sparsify::topk::count(0)};
  std::vector<float> x = {1, 2, 3};
  const auto p = test::compress(c, exec, x);
  CHECK(test::payload_indices(p).empty());
  std::vector<float> empty;
  codec<sparsify::topk> r{sparsify::topk::ratio(0.5)};
  const auto q = test::compress(r, exec, empty);
  CHECK(wire::read_header(span<const std::byte>(q)).element_count == 0);
  std::vector<float> out;
  r.decompress(exec, span<const std::byte>(q), span<float>(out));
}
