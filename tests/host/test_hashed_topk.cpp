// hash::hashed_topk: winners by the deterministic rule (larger |x|, then lower index) whatever
// the thread count, index 0 selectable, decode sums, and the measured collision loss against
// the analytical expectation 1 - (m / s)(1 - (1 - 1/m)^s).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"

using namespace gradzip;

namespace {

using hashed = codec<hash::hashed_topk>;

/// The reference: the sample threshold's survivors, one per slot by the rule, in index order.
std::vector<std::uint64_t> reference(const hash::hashed_topk& s, const std::vector<float>& x, std::uint64_t& survivors) {
  const std::uint64_t n = x.size(), k = s.target_count(n), m = s.slots(n);
  std::uint32_t tau = 0;
  if (k < n) {
    const std::uint64_t size = sparsify::sampled_topk::sample_size(n, s.sample_rate());
    std::vector<std::uint32_t> keys;
    for (std::uint64_t j = 0; j < size; ++j) {
      keys.push_back(sparsify::detail::magnitude_key(x[sparsify::sampled_topk::sample_position(s.seed(), n, size, j)]));
    }
    std::sort(keys.begin(), keys.end(), std::greater<>());
    const std::uint64_t rank = std::min<std::uint64_t>(std::max<std::uint64_t>((k * size + n - 1) / n, 1), size);
    tau = keys[rank - 1];
  }
  std::map<std::uint64_t, std::pair<std::uint32_t, std::uint64_t>> best;  // slot -> (key, index)
  survivors = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint32_t key = sparsify::detail::magnitude_key(x[i]);
    if (key < tau) continue;
    ++survivors;
    const std::uint64_t slot = hash::hashed_topk::slot_of(s.seed(), i, m);
    auto it = best.find(slot);
    if (it == best.end() || key > it->second.first) best[slot] = {key, i};  // ties: the lower index came first
  }
  std::vector<std::uint64_t> kept;
  for (const auto& [slot, winner] : best) kept.push_back(winner.second);
  std::sort(kept.begin(), kept.end());
  return kept;
}

}  // namespace

TEST_CASE("hashed top-k keeps one survivor per slot by the deterministic rule", "[hashed_topk]") {
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{200003}}) {
    const auto x = gradzip_tools::synthetic_gradient<float>(n, 70 + n);
    for (double slot_ratio : {0.0, 0.002, 0.02}) {
      const auto s = hash::hashed_topk::ratio(0.01, slot_ratio);
      std::uint64_t survivors = 0;
      const auto expected = reference(s, x, survivors);
      for (int threads : {1, 2}) {
        host exec(threads);
        const auto p = test::compress(hashed{s}, exec, x);
        INFO("n = " << n << ", slot ratio " << slot_ratio << ", threads " << threads);
        REQUIRE(test::payload_indices(p) == expected);
        CHECK(expected.size() <= s.slots(n));
      }
    }
  }
}

TEST_CASE("hashed top-k selects index 0 and its payloads sum on decode", "[hashed_topk]") {
  std::vector<float> x(10000, 0.001f);
  x[0] = 50.0f;  // index 0 is the largest: DRAGONN's sentinel could never send it
  x[9999] = -40.0f;
  host exec;
  const hashed c{hash::hashed_topk::ratio(0.001, 0.01)};
  const auto p = test::compress(c, exec, x);
  const auto kept = test::payload_indices(p);
  REQUIRE(!kept.empty());
  CHECK(kept.front() == 0);
  std::vector<float> sum(x.size(), 0.0f);
  c.decompress_add(exec, span<const std::byte>(p), span<float>(sum));
  c.decompress_add(exec, span<const std::byte>(p), span<float>(sum));  // two workers, same payload
  CHECK(sum[0] == 100.0f);
  CHECK(sum[9999] == -80.0f);
}

TEST_CASE("hashed top-k loses survivors to collisions as the load factor predicts", "[hashed_topk]") {
  const std::size_t n = std::size_t{1} << 20;
  const auto x = gradzip_tools::synthetic_gradient<float>(n, 3);
  host exec;
  for (double load : {0.25, 0.5, 1.0, 2.0}) {
    const double ratio = 0.01;
    const auto s = hash::hashed_topk::ratio(ratio, ratio / load);
    const auto p = test::compress(hashed{s}, exec, x);
    std::uint64_t survivors = 0;
    reference(s, x, survivors);
    const double m = static_cast<double>(s.slots(n)), sv = static_cast<double>(survivors);
    const double lost = 1.0 - static_cast<double>(test::payload_indices(p).size()) / sv;
    const double expected = 1.0 - (m / sv) * (1.0 - std::pow(1.0 - 1.0 / m, sv));
    WARN("load " << sv / m << ": lost " << lost << ", expected " << expected);
    CHECK(std::abs(lost - expected) < 0.01);
  }
}

TEST_CASE("hashed top-k parameters are checked", "[hashed_topk]") {
  CHECK_THROWS_AS(hash::hashed_topk::ratio(0.0), invalid_argument);
  CHECK_THROWS_AS(hash::hashed_topk::ratio(0.01, 1.5), invalid_argument);
  CHECK_THROWS_AS(hash::hashed_topk::ratio(0.01, 0.0, 0.5), invalid_argument);
}
