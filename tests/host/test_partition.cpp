// hash::partition (Zen): balanced loads, a fixed-size split whose overflow is bounded and
// reported, and the hash bitmap over a part's members.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <set>

#include "common/helpers.hpp"
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
    const test::part_members part(zen, p, n);
    const auto& members = part.all;
    const auto& subset = part.every_third;
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
  // A part past the last is refused, as CUDA refuses it, not an empty result.
  std::vector<std::uint64_t> bits(4);
  CHECK_THROWS_WITH(zen.encode_bitmap(8, n, span<const std::uint64_t>(), span<std::uint64_t>(bits)),
                    "partition: part 8 of 8");
  CHECK_THROWS_WITH(zen.decode_bitmap(9, n, span<const std::uint64_t>(bits)), "partition: part 9 of 8");
}

TEST_CASE("fixed split names a bad index and writes nothing", "[partition]") {
  const hash::partition zen{4, 3};
  std::vector<std::uint64_t> slots(4 * 8), counts(4, 77), spill(4);
  std::vector<std::uint32_t> spill_parts(4);
  const auto split = [&](std::vector<std::uint64_t> sorted) {
    return zen.split_fixed(span<const std::uint64_t>(sorted), 100, 8, 4, span<std::uint64_t>(slots),
                           span<std::uint64_t>(counts), span<std::uint64_t>(spill), span<std::uint32_t>(spill_parts));
  };
  CHECK_THROWS_WITH(split({1, 5, 5, 9}), "partition::split_fixed: sorted[2] is 5 after 5: indices must be increasing "
                                         "and below n = 100");
  CHECK_THROWS_WITH(split({100}), "partition::split_fixed: sorted[0] is 100: indices must be increasing and below n = 100");
  CHECK(counts == std::vector<std::uint64_t>(4, 77));  // the bad list was found before any write
  CHECK(split({1, 5, 9}).unplaced == 0);
}

TEST_CASE("partition's executor overloads on the host give the plain functions' results", "[partition]") {
  const hash::partition zen{8, 11};
  host exec;
  const std::uint64_t n = 20000;
  CHECK(zen.loads(exec, n) == zen.loads(n));
  const std::vector<std::uint64_t> members = test::part_members(zen, 2, n).all;
  std::vector<std::uint64_t> bits((members.size() + 63) / 64);
  CHECK(zen.encode_bitmap(exec, 2, n, span<const std::uint64_t>(members), span<std::uint64_t>(bits)) == members.size());
  std::vector<std::uint64_t> out(members.size());
  CHECK(zen.decode_bitmap(exec, 2, n, span<const std::uint64_t>(bits), span<std::uint64_t>(out)) == members.size());
  CHECK(out == members);
  std::vector<std::uint64_t> too_small(members.size() - 1);
  CHECK_THROWS_AS(zen.decode_bitmap(exec, 2, n, span<const std::uint64_t>(bits), span<std::uint64_t>(too_small)),
                  invalid_argument);
  // A capacity so large that parts x capacity wraps is refused, not trusted.
  std::vector<std::uint64_t> slots(8), counts(8), spill(1);
  std::vector<std::uint32_t> spill_parts(1);
  CHECK_THROWS_AS(zen.split_fixed(exec, span<const std::uint64_t>(members), n, std::uint64_t{1} << 61, 1,
                                  span<std::uint64_t>(slots), span<std::uint64_t>(counts), span<std::uint64_t>(spill),
                                  span<std::uint32_t>(spill_parts)),
                  invalid_argument);
}
