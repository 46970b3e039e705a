// hash::partition (Zen): balanced loads, a fixed-size split whose overflow is bounded and
// reported, and the hash bitmap over a part's members.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <set>

#include "gradzip/gradzip.hpp"
#include "gradzip/hash/partition.hpp"

using namespace gradzip;

TEST_CASE("hash partition loads are balanced: max / mean <= 1.1 at n = 2^24, P = 64", "[partition]") {
  const hash::partition zen{64, 7};
  const std::uint64_t n = std::uint64_t{1} << 24;
  const auto load = zen.loads(n);
  const double mean = static_cast<double>(n) / 64;
  const double most = static_cast<double>(*std::max_element(load.begin(), load.end()));
  INFO("max / mean = " << most / mean);
  CHECK(most / mean <= 1.1);
}

TEST_CASE("fixed split places, overflows and reports, never drops silently", "[partition]") {
  const hash::partition zen{16, 3};
  const std::uint64_t n = 1000000;
  std::mt19937_64 rng(5);
  std::set<std::uint64_t> chosen{0};  // index 0 is an ordinary index
  while (chosen.size() < 10000) chosen.insert(rng() % n);
  const std::vector<std::uint64_t> sorted(chosen.begin(), chosen.end());
  for (std::uint64_t capacity : {700ull, 600ull, 100ull}) {
    const std::uint64_t overflow = 300;
    std::vector<std::uint64_t> slots(16 * capacity), counts(16), spill(overflow);
    std::vector<std::uint32_t> spill_parts(overflow);
    const auto r = zen.split_fixed(span<const std::uint64_t>(sorted), n, capacity, overflow, span<std::uint64_t>(slots),
                                   span<std::uint64_t>(counts), span<std::uint64_t>(spill), span<std::uint32_t>(spill_parts));
    std::multiset<std::uint64_t> seen;
    for (std::uint32_t p = 0; p < 16; ++p) {
      REQUIRE(counts[p] <= capacity);
      for (std::uint64_t j = 0; j < counts[p]; ++j) {
        const std::uint64_t i = slots[p * capacity + j];
        REQUIRE(zen.part_of(i) == p);
        if (j > 0) REQUIRE(i > slots[p * capacity + j - 1]);
        seen.insert(i);
      }
    }
    for (std::uint64_t j = 0; j < r.overflowed; ++j) {
      REQUIRE(zen.part_of(spill[j]) == spill_parts[j]);
      seen.insert(spill[j]);
    }
    INFO("capacity " << capacity << ": overflowed " << r.overflowed << ", unplaced " << r.unplaced);
    CHECK(r.overflowed <= overflow);
    CHECK(seen.size() + r.unplaced == sorted.size());  // every index placed once or counted
    for (auto i : seen) REQUIRE(chosen.count(i) == 1);
    if (capacity == 700) CHECK(r.overflowed == 0);      // 10000 / 16 = 625 on average
    if (capacity == 100) CHECK(r.unplaced > 0);         // and reported as such
  }
}

TEST_CASE("the hash bitmap encodes a part's result over its members", "[partition]") {
  const hash::partition zen{8, 11};
  const std::uint64_t n = 50000;
  for (std::uint32_t p : {0u, 3u, 7u}) {
    std::vector<std::uint64_t> members;
    for (std::uint64_t i = 0; i < n; ++i) {
      if (zen.part_of(i) == p) members.push_back(i);
    }
    std::vector<std::uint64_t> subset;
    for (std::size_t j = 0; j < members.size(); j += 3) subset.push_back(members[j]);
    std::vector<std::uint64_t> bits((members.size() + 63) / 64);
    CHECK(zen.encode_bitmap(p, n, span<const std::uint64_t>(subset), span<std::uint64_t>(bits)) == members.size());
    CHECK(zen.decode_bitmap(p, n, span<const std::uint64_t>(bits)) == subset);
    // A non-member index is refused on encode; a bit past the members on decode.
    std::vector<std::uint64_t> stranger{members[0] == 0 ? 1u : 0u};
    if (zen.part_of(stranger[0]) != p) {
      CHECK_THROWS_AS(zen.encode_bitmap(p, n, span<const std::uint64_t>(stranger), span<std::uint64_t>(bits)), invalid_argument);
    }
    std::vector<std::uint64_t> padded(bits.size() + 1, 0);
    padded.back() = 1;  // a member bit beyond the last member
    CHECK_THROWS_AS(zen.decode_bitmap(p, n, span<const std::uint64_t>(padded)), format_error);
  }
}
