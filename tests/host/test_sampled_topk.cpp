// sparsify::sampled_topk (DGC): the kept count lands in [k, 1.2 k], the kept elements are the
// largest, the search is deterministic, and the documented exceptions behave as documented.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"

using namespace gradzip;

namespace {
using dgc = codec<sparsify::sampled_topk>;

/// The payload's kept indices, checked to be exactly the elements at or above the smallest kept
/// magnitude (a threshold selection).
template <class T>
std::vector<std::uint64_t> checked_selection(const dgc& c, const std::vector<T>& x, int threads) {
  host exec(threads);
  const auto p = test::compress(c, exec, x);
  const auto kept = test::payload_indices(p);
  double smallest = std::numeric_limits<double>::infinity();
  for (auto i : kept) smallest = std::min(smallest, std::abs(static_cast<double>(to_float(x[i]))));
  std::size_t next = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const bool is_kept = next < kept.size() && kept[next] == i;
    if (is_kept) ++next;
    if (!is_kept) REQUIRE(std::abs(static_cast<double>(to_float(x[i]))) < smallest);
  }
  return kept;
}

/// DGC's search written plainly (every round over all of x, as the device does): the sample's
/// bracket, full histograms until the search decides, then every element whose key (its float's
/// magnitude bits: NaN above inf) is at least tau's.
template <class T>
std::vector<std::uint64_t> reference_selection(const sparsify::sampled_topk& s, const std::vector<T>& x) {
  using sparsify::detail::magnitude_key;
  const std::uint64_t n = x.size(), k = s.target_count(n);
  if (k == 0) return {};
  const std::uint64_t size = s.sample_size(n);
  std::vector<std::uint32_t> keys(size);
  for (std::uint64_t j = 0; j < size; ++j) {
    keys[j] = magnitude_key(static_cast<float>(to_float(x[sparsify::sampled_topk::sample_position(s.seed(), n, size, j)])));
  }
  std::sort(keys.begin(), keys.end(), std::greater<>());
  std::uint64_t high = 1, low = 1;
  sparsify::detail::threshold_search::bracket_ranks(k, n, size, high, low);
  sparsify::detail::threshold_search state;
  state.start(keys[high - 1], keys[low - 1], k, n);
  while (!state.done) {
    std::vector<std::uint64_t> hist(sparsify::detail::threshold_search::bins + 1, 0);
    for (const T& v : x) {
      const int b = state.bin_of(magnitude_key(static_cast<float>(to_float(v))));
      if (b >= 0) ++hist[static_cast<std::size_t>(b)];
    }
    state.decide(hist.data(), k, sparsify::sampled_topk::upper_count(k, n));
  }
  std::vector<std::uint64_t> kept;
  for (std::uint64_t i = 0; i < n; ++i) {
    if (magnitude_key(static_cast<float>(to_float(x[i]))) >= state.tau_key) kept.push_back(i);
  }
  return kept;
}

}  // namespace

static_assert(dgc::data_dependent_count && !dgc::summable);

TEST_CASE("sampled top-k's stepped sample positions are sample_position's", "[sampled_topk]") {
  const std::uint64_t huge = (std::uint64_t{1} << 40) + 7;  // j n beyond 64 bits: 128-bit strata
  for (const auto& ns : {std::pair<std::uint64_t, std::uint64_t>{1000, 1000}, {1000, 7}, {300000, 3000},
                          {(std::uint64_t{1} << 33) + 5, 85899346}, {huge, huge / 20}}) {
    const std::uint64_t n = ns.first, s = ns.second;  // not a structured binding: C++17 lambdas cannot capture one
    for (const std::uint64_t first : {std::uint64_t{0}, s / 3, s - std::min<std::uint64_t>(s, 500)}) {
      const std::uint64_t last = std::min(s, first + 500);
      std::uint64_t next = first, mismatches = 0;
      sparsify::sampled_topk::for_each_sample_position(77, n, s, first, last, [&](std::uint64_t j, std::uint64_t i) {
        mismatches += j != next++ || i != sparsify::sampled_topk::sample_position(77, n, s, j) ? 1 : 0;
      });
      INFO("n " << n << ", s " << s << ", from " << first);
      CHECK(next == last);
      CHECK(mismatches == 0);
    }
  }
}

TEST_CASE("sampled top-k gathers its list where the keys the sample expects at the floor fill at most 3/4 of it", "[sampled_topk]") {
  using search = sparsify::detail::threshold_search;
  // n / s = 64; k = 10486 gives m = 164 and the floor at sample rank 328: 20,992 keys expected.
  const std::uint64_t n = std::uint64_t{1} << 20, s = 16384, k = 10486;
  std::uint64_t high = 0, low = 0;
  search::bracket_ranks(k, n, s, high, low);
  REQUIRE(low == 328);
  CHECK(search::gather_pays(k, n, s, 27990));   // 3/4 of 27,990 is 20,992.5
  CHECK(!search::gather_pays(k, n, s, 27989));  // 20,991.75
  // Everything sampled (k near n): the floor is the sample's last key, n keys expected.
  CHECK(!search::gather_pays(n - 1, n, s, n / 8));
  CHECK(search::gather_pays(1, n, s, n / 8));
}

TEST_CASE("sampled top-k selects what the plain search over all of x selects, from its candidate list or not", "[sampled_topk]") {
  const std::size_t n = 300000;
  const auto g = gradzip_tools::synthetic_gradient<float>(n, 31);
  const auto check = [](const sparsify::sampled_topk& s, const auto& x) {
    const auto want = reference_selection(s, x);
    for (int threads : {1, 2, 3}) {
      INFO(threads << " threads");
      host exec(threads);
      CHECK(test::payload_indices(test::compress(codec<sparsify::sampled_topk>{s}, exec, x)) == want);
    }
  };
  // The candidates (keys >= the first bracket's floor, about 2 k) fit the list (n / 8): one read.
  check(sparsify::sampled_topk::ratio(0.01), g);
  check(sparsify::sampled_topk::ratio(0.001, 0.05), g);
  check(sparsify::sampled_topk::ratio(0.01), std::vector<double>(g.begin(), g.end()));
  // About 2 k = n / 5 candidates would overflow the list: it is not gathered, and the rounds,
  // count and emit read x.
  check(sparsify::sampled_topk::ratio(0.1), g);
  // The large values all in the last third: about 2 k = n / 12.5 fit the list, not the last
  // chunk's share (with 2 or 3 threads), which overflows alone.
  std::vector<float> late(n, 1e-4f);
  for (std::size_t i = 2 * n / 3; i < n; ++i) late[i] = g[i];
  check(sparsify::sampled_topk::ratio(0.04), late);
  const auto s = sparsify::sampled_topk::ratio(0.04);  // about 2 k candidates: the list is gathered
  const std::uint64_t size = s.sample_size(n);
  // The sample sees only 10s where the rest holds 1s and 1e-3s: the first bracket is too high,
  // the search goes below the floor, and reads x from there.
  std::vector<float> fooled(n, 1e-3f);
  for (std::size_t i = 0; i < n; i += 13) fooled[i] = 1.0f;
  for (std::uint64_t j = 0; j < size; ++j) fooled[sparsify::sampled_topk::sample_position(s.seed(), n, size, j)] = 10.0f;
  check(s, fooled);
  // The floor is a NaN's key and the threshold is capped at the largest finite float, below it:
  // the infinities pass without being listed, so the count and the emit read x.
  const auto wide = sparsify::sampled_topk::ratio(0.01, 0.001);  // kept: k + the sample + 100 <= 1.2 k
  const auto nans = test::nan_floor_input(wide, g);
  check(wide, nans);
}

TEST_CASE("sampled top-k over doubles keeps those that round to the threshold float", "[sampled_topk]") {
  // The search ranks a double by its float. Eleven distinct doubles just below 5 round to 5.0f,
  // the threshold the search lands on for k = 10: all eleven are kept (k <= 11 <= 1.2 k). The
  // compare against 5.0 itself, in double, kept none of them (a review's repro).
  const std::size_t n = 100;
  for (const double below : {1e-9, 2e-8}) {  // 5 - 22e-8 still rounds to 5.0f (half its ulp is 2.4e-7)
    const auto s = sparsify::sampled_topk::count(10, 0.05);
    // One of them sampled (the search's first bracket then lands on 5.0f's key), the others not.
    const std::uint64_t size = s.sample_size(n);
    std::vector<bool> sampled(n, false);
    for (std::uint64_t j = 0; j < size; ++j) sampled[sparsify::sampled_topk::sample_position(s.seed(), n, size, j)] = true;
    std::vector<double> x(n, 1.0);
    x[sparsify::sampled_topk::sample_position(s.seed(), n, size, 0)] = 5.0 - below;
    for (std::size_t i = 0, placed = 1; placed < 11; ++i) {
      if (!sampled[i]) x[i] = 5.0 - below * static_cast<double>(++placed);
    }
    const auto want = reference_selection(s, x);
    REQUIRE(want.size() == 11);
    for (int threads : {1, 2}) {
      host exec(threads);
      INFO(threads << " threads, below " << below);
      CHECK(test::payload_indices(test::compress(dgc{s}, exec, x)) == want);
    }
  }
  // Ties at the float's midpoint go to the even neighbour: 1 + 2^-24 rounds to 1.0f, 1 + 3 2^-24
  // to 1 + 2^-22 (even), so with the threshold at 1.0f the first is kept, a value below is not.
  using sparsify::detail::least_double_rounding_to;
  using sparsify::detail::magnitude_key;
  CHECK(least_double_rounding_to(magnitude_key(1.0f)) == 1.0 - 0x1p-25);           // 1.0f's key is even
  CHECK(least_double_rounding_to(magnitude_key(1.0f + 0x1p-23f)) == std::nextafter(1.0 + 0x1p-24, 2.0));  // odd
  CHECK(least_double_rounding_to(0) == 0.0);
  CHECK(least_double_rounding_to(1) == std::nextafter(0x1p-150, 1.0));              // the least subnormal, odd
  for (std::uint32_t key : {1u, 2u, 0x00800000u, 0x3F800000u, 0x3F800001u, 0x7F7FFFFFu}) {
    const double t = least_double_rounding_to(key);
    INFO("key " << key);
    CHECK(magnitude_key(static_cast<float>(t)) == key);
    CHECK(magnitude_key(static_cast<float>(std::nextafter(t, 0.0))) == key - 1);
  }
}

TEST_CASE("sampled top-k keeps between k and 1.2 k of the largest elements", "[sampled_topk]") {
  for (std::size_t n : {std::size_t{1}, std::size_t{100}, std::size_t{4097}, std::size_t{300000}, std::size_t{1} << 21}) {
    const auto x = gradzip_tools::synthetic_gradient<float>(n, 90 + n);
    for (double ratio : {0.0001, 0.001, 0.01, 0.1, 0.5}) {
      for (double rate : {0.001, 0.01, 0.05}) {
        const dgc c{sparsify::sampled_topk::ratio(ratio, rate)};
        const std::uint64_t k = c.structure().target_count(n);
        INFO("n = " << n << ", ratio " << ratio << ", sample rate " << rate << ", k = " << k);
        const auto kept = checked_selection(c, x, 2);
        CHECK(kept.size() >= k);
        CHECK(kept.size() <= k + k / 5);
        CHECK(checked_selection(c, x, 1) == kept);  // the same on any thread count
      }
    }
  }
}

TEST_CASE("sampled top-k on heavy-tailed, uniform and ordered inputs", "[sampled_topk]") {
  const std::size_t n = 1 << 18;
  std::vector<float> ramp(n), uniform(n), spikes(n, 1e-3f);
  for (std::size_t i = 0; i < n; ++i) {
    ramp[i] = static_cast<float>(i);  // the sample's strata see the extremes
    uniform[i] = static_cast<float>((i * 2654435761u) % 1000003) / 1000003.0f - 0.5f;
  }
  for (std::size_t i = 0; i < n; i += 97) spikes[i] = 100.0f + static_cast<float>(i);  // 2703 spikes
  for (const auto* x : {&ramp, &uniform, &spikes}) {
    for (double ratio : {0.001, 0.01, 0.05}) {
      const dgc c{sparsify::sampled_topk::ratio(ratio)};
      const std::uint64_t k = c.structure().target_count(n);
      const auto kept = checked_selection(c, *x, 2);
      if (x == &spikes && k > 2703) {  // > 0.2 k ties at 1e-3: only the spikes above it
        CHECK(kept.size() == 2703);
        continue;
      }
      CHECK(kept.size() >= k);
      CHECK(kept.size() <= k + k / 5);
    }
  }
}

TEST_CASE("sampled top-k with massive ties keeps those above the tie, never more than 1.2 k", "[sampled_topk]") {
  std::vector<float> x(100000, 0.0f);
  for (std::size_t i = 0; i < 500; ++i) x[i * 200] = 1.0f + static_cast<float>(i);  // 500 nonzeros
  const dgc c{sparsify::sampled_topk::count(2000)};
  const auto kept = checked_selection(c, x, 2);
  CHECK(kept.size() == 500);  // fewer than k nonzero: the nonzeros, not the zeros
  std::vector<float> plateau(100000, 0.5f);
  for (std::size_t i = 0; i < 100; ++i) plateau[i * 1000 + 3] = 2.0f;
  const auto top = checked_selection(dgc{sparsify::sampled_topk::count(1000)}, plateau, 2);
  CHECK(top.size() == 100);  // 99,900 tie at 0.5: only the 100 above
}

TEST_CASE("sampled top-k edge cases", "[sampled_topk]") {
  host exec;
  const auto x = gradzip_tools::synthetic_gradient<float>(1000, 5);
  CHECK(checked_selection(dgc{sparsify::sampled_topk::count(0)}, x, 2).empty());
  CHECK(checked_selection(dgc{sparsify::sampled_topk::count(1000)}, x, 2).size() == 1000);
  CHECK(checked_selection(dgc{sparsify::sampled_topk::count(1)}, x, 2).size() == 1);
  CHECK(test::compress(dgc{sparsify::sampled_topk::ratio(0.1)}, exec, std::vector<float>{}).size() ==
        dgc::layout(element_type::f32, 0, 0).total_bytes());
  CHECK_THROWS_AS(sparsify::sampled_topk::ratio(0.01, 0.0), invalid_argument);
  CHECK_THROWS_AS(sparsify::sampled_topk::ratio(0.01, 0.2), invalid_argument);
  CHECK_THROWS_AS(sparsify::sampled_topk::ratio(1.5), invalid_argument);
  CHECK_THROWS_AS(dgc{sparsify::sampled_topk::count(1001)}.max_compressed_bytes<float>(1000), invalid_argument);
  // NaN and infinities are always kept, as by the threshold stage.
  auto y = gradzip_tools::synthetic_gradient<float>(10000, 6);
  y[17] = std::numeric_limits<float>::quiet_NaN();
  y[18] = -std::numeric_limits<float>::infinity();
  const auto kept = test::payload_indices(test::compress(dgc{sparsify::sampled_topk::count(50)}, exec, y));
  CHECK(std::count(kept.begin(), kept.end(), 17u) == 1);
  CHECK(std::count(kept.begin(), kept.end(), 18u) == 1);
}

TEST_CASE("sampled top-k decodes through every encoding and element type", "[sampled_topk]") {
  const auto f = gradzip_tools::synthetic_gradient<float>(50000, 8);
  const auto s = sparsify::sampled_topk::ratio(0.02);
  const auto base = test::round_trip(dgc{s}, f);
  CHECK(test::round_trip(codec<sparsify::sampled_topk, quantize::none, encode::automatic>{s}, f) == base);
  CHECK(test::round_trip(codec<sparsify::sampled_topk, quantize::none, encode::delta_varint>{s}, f) == base);
  std::vector<double> d(f.begin(), f.end());
  CHECK(test::round_trip(dgc{s}, d) == base);  // exact doubles of floats: the same choice
}
