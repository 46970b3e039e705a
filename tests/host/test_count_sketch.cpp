// sketch::count_sketch: the fixed-point cells against their definition (and the conversions
// against long double), linearity (bit-exact on integer-valued inputs), thread-count
// independence, recovery of planted heavy hitters, unsketch through codec<topk>, and rejection
// of malformed or mismatched sketches.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"
#include "gradzip/sketch/count_sketch.hpp"

using namespace gradzip;

namespace {

std::vector<std::byte> sketch_of(const sketch::count_sketch& cs, const std::vector<float>& x, int threads = 0) {
  host exec(threads);
  std::vector<std::byte> out(cs.payload_bytes(x.size()));
  out.resize(cs.compress(exec, span<const float>(x), span<std::byte>(out)));
  return out;
}

std::vector<float> integers(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-1000, 1000);
  std::vector<float> x(n);
  for (auto& v : x) v = static_cast<float>(d(rng));
  return x;
}

}  // namespace

TEST_CASE("count sketch is linear: merge(sketch(a), sketch(b)) == sketch(a + b)", "[count_sketch]") {
  const sketch::count_sketch cs{5, 997, 42};
  host exec;
  const std::size_t n = 50000;
  // Integer values: every partial sum is exact in float, so the equality is bit for bit.
  const auto a = integers(n, 1), b = integers(n, 2);
  std::vector<float> sum(n);
  for (std::size_t i = 0; i < n; ++i) sum[i] = a[i] + b[i];
  auto merged = sketch_of(cs, a);
  const auto sketch_b = sketch_of(cs, b);
  cs.merge(exec, span<std::byte>(merged), span<const std::byte>(sketch_b));
  CHECK(merged == sketch_of(cs, sum));
  // Floats: equal to rounding (each cell's sum is rounded differently).
  const auto f = gradzip_tools::synthetic_gradient<float>(n, 3), g = gradzip_tools::synthetic_gradient<float>(n, 4);
  for (std::size_t i = 0; i < n; ++i) sum[i] = f[i] + g[i];
  auto fm = sketch_of(cs, f);
  const auto sketch_g = sketch_of(cs, g);
  cs.merge(exec, span<std::byte>(fm), span<const std::byte>(sketch_g));
  const auto direct = sketch_of(cs, sum);
  std::vector<float> x(n), y(n);
  cs.estimate(exec, span<const std::byte>(fm), span<float>(x));
  cs.estimate(exec, span<const std::byte>(direct), span<float>(y));
  double err = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    err += (x[i] - y[i]) * static_cast<double>(x[i] - y[i]);
    norm += static_cast<double>(y[i]) * y[i];
  }
  CHECK(std::sqrt(err / norm) < 1e-5);
}

/// v rounded to float, ties to even; past the float range (from the midpoint between FLT_MAX and
/// 2^128 up) an infinity, without the out-of-range conversion C++ leaves undefined.
float to_float_rounded(long double v) {
  if (std::fabs(v) >= 0x1.ffffffp127L) return std::copysign(std::numeric_limits<float>::infinity(), static_cast<float>(v > 0 ? 1 : -1));
  return static_cast<float>(v);
}

/// The table by the definition, independently of detail::fixed_point: the unit 2^(E - p) from
/// ilogb of the largest finite magnitude, q = round_half_even(v / unit) by ldexp, exact
/// integer sums, each cell rounded once through long double (64-bit significand: exact, then
/// one rounding to float). Cells that a non-finite value maps to are NaN.
template <class T>
std::vector<float> plain_table(const sketch::count_sketch& cs, const std::vector<T>& x) {
  const std::size_t n = x.size();
  float largest = 0.0f;
  for (const T& xi : x) {
    const float v = static_cast<float>(xi);
    if (std::isfinite(v)) largest = std::max(largest, std::fabs(v));
  }
  int bits_n = 0;
  for (std::size_t m = n; m != 0; m >>= 1) ++bits_n;
  const int precision = std::min(30, 61 - bits_n);
  const int unit = largest == 0.0f ? 0 : std::ilogb(largest) - precision;
  std::vector<std::int64_t> sums(static_cast<std::size_t>(cs.rows()) * cs.columns(), 0);
  std::vector<bool> poisoned(sums.size(), false);
  for (std::uint32_t r = 0; r < cs.rows(); ++r) {
    for (std::size_t i = 0; i < n; ++i) {
      const float v = static_cast<float>(x[i]);
      const std::uint64_t cell = cs.cell_of(r, i);
      if (!std::isfinite(v)) {
        poisoned[cell] = true;
        continue;
      }
      const auto q = static_cast<std::int64_t>(std::nearbyint(std::ldexp(static_cast<double>(v), -unit)));
      sums[cell] += sketch::count_sketch::sign_of(sketch::count_sketch::hash_of(cs.seed(), r, i)) < 0 ? -q : q;
    }
  }
  std::vector<float> cells(sums.size());
  for (std::size_t j = 0; j < cells.size(); ++j) {
    cells[j] = poisoned[j] ? std::numeric_limits<float>::quiet_NaN()
                           : to_float_rounded(std::ldexp(static_cast<long double>(sums[j]), unit));
  }
  return cells;
}

/// Every cell of `table` equals `want` (NaN where want is NaN, as gradzip's quiet NaN).
void check_cells(const sketch::count_sketch& cs, const std::vector<std::byte>& table, const std::vector<float>& want,
                 const char* what) {
  const std::uint8_t* t = cs.table_of(span<const std::byte>(table));
  std::size_t differing = 0;
  for (std::size_t j = 0; j < want.size(); ++j) {
    const float got = sketch::count_sketch::load_cell(t, j);
    const bool same = std::isnan(want[j]) ? gradzip::detail::bit_cast<std::uint32_t>(got) == sketch::count_sketch::poisoned_cell
                                          : gradzip::detail::bit_cast<std::uint32_t>(got) == gradzip::detail::bit_cast<std::uint32_t>(want[j]);
    if (!same && differing++ == 0) UNSCOPED_INFO(what << ": first difference at cell " << j << ": " << got << " != " << want[j]);
  }
  CHECK(differing == 0);
}

TEST_CASE("count sketch table equals the fixed-point definition, cell by cell", "[count_sketch]") {
  // n not a multiple of 8: the AVX2 path hashes eight indices per step, the tail one at a time.
  const std::size_t n = 10007;
  const auto x = gradzip_tools::synthetic_gradient<float>(n, 9);
  std::vector<double> wide(x.begin(), x.end());
  for (std::uint32_t rows : {1u, 3u, 5u}) {
    const sketch::count_sketch cs{rows, 613, 21};
    const auto want = plain_table(cs, x);
    for (int threads : {1, 2}) {
      check_cells(cs, sketch_of(cs, x, threads), want, "float input");
    }
    host exec;
    std::vector<std::byte> out(cs.payload_bytes(n));
    cs.compress(exec, span<const double>(wide), span<std::byte>(out));
    check_cells(cs, out, want, "double input");
  }
}

TEST_CASE("count sketch cells at the edges of the fixed point", "[count_sketch]") {
  const sketch::count_sketch cs{3, 61, 5};
  const auto inf = std::numeric_limits<float>::infinity();
  const auto nan = std::numeric_limits<float>::quiet_NaN();
  const float tiny = std::numeric_limits<float>::denorm_min(), huge = std::numeric_limits<float>::max();
  std::vector<std::pair<const char*, std::vector<float>>> cases = {
      {"empty", {}},
      {"zeros and a negative zero", std::vector<float>(100, 0.0f)},
      {"largest floats: sums overflow to infinity", std::vector<float>(1000, huge)},
      {"subnormals only", {tiny, -tiny, 3 * tiny, tiny, 5 * tiny, -7 * tiny, 1e-40f, -2e-41f}},
      {"largest magnitude below 2^-97: the scalar path", std::vector<float>(40, 1e-30f)},
      {"values far below the unit round to zero", {1.0f, 1e-12f, -1e-12f, 3e-10f, 0.5f, 0.25f}},
      {"ties round to even", {1.0f, std::ldexp(1.0f, -31), std::ldexp(3.0f, -31), std::ldexp(5.0f, -31), -std::ldexp(1.0f, -31)}},
  };
  cases[1].second[17] = -0.0f;
  // Non-finite values poison their cells only; they do not set the unit.
  std::vector<float> mixed = gradzip_tools::synthetic_gradient<float>(3001, 2);
  mixed[5] = nan;
  mixed[77] = inf;
  mixed[2999] = -inf;  // past the last group of eight: the scalar tail
  cases.emplace_back("NaN and infinities among normal values", mixed);
  for (const auto& [what, x] : cases) {
    for (int threads : {1, 2}) check_cells(cs, sketch_of(cs, x, threads), plain_table(cs, x), what);
  }
  // Every cell the NaN maps to is NaN, and no other is.
  const auto table = sketch_of(cs, mixed);
  const std::uint8_t* t = cs.table_of(span<const std::byte>(table));
  std::size_t nan_cells = 0;
  for (std::size_t j = 0; j < 3 * cs.columns(); ++j) nan_cells += std::isnan(sketch::count_sketch::load_cell(t, j)) ? 1 : 0;
  std::set<std::uint64_t> expected;
  for (std::uint32_t r = 0; r < 3; ++r) {
    for (std::size_t i : {5, 77, 2999}) expected.insert(cs.cell_of(r, i));
  }
  CHECK(nan_cells == expected.size());
}

TEST_CASE("count sketch's fixed point: conversions equal long double's, ties to even", "[count_sketch]") {
  using gradzip::detail::fixed_point;
  std::mt19937_64 rng(17);
  std::size_t checked = 0;
  for (int unit : {-179, -160, -149, -140, -126, -100, -60, -21, 0, 30, 100, 127}) {
    const fixed_point fp{unit};
    for (int trial = 0; trial < 20000; ++trial) {
      // Magnitudes spread over every bit width, including exact ties after the shift.
      const int width = static_cast<int>(rng() % 63);
      std::int64_t s = static_cast<std::int64_t>(rng() >> (64 - std::max(width, 1)));
      if (trial % 7 == 0) s = ((s >> 8) | 1) << (rng() % 8);  // trailing zeros: ties and exact values
      if (rng() & 1) s = -s;
      const float want = to_float_rounded(std::ldexp(static_cast<long double>(s), unit));
      const float got = fp.to_float(s);
      if (gradzip::detail::bit_cast<std::uint32_t>(got) != gradzip::detail::bit_cast<std::uint32_t>(want)) {
        FAIL("unit 2^" << unit << ", s = " << s << ": " << got << " != " << want);
      }
      ++checked;
    }
  }
  CHECK(checked == 12 * 20000);
  // to_fixed: round_half_even(v / unit) for v up to the largest magnitude.
  for (float largest : {std::numeric_limits<float>::denorm_min() * 5, 1e-38f, 1e-30f, 1.0f, 3e5f, 3e38f}) {
    for (std::uint64_t n : {std::uint64_t{1}, std::uint64_t{1} << 20, std::uint64_t{1} << 40, fixed_point::max_count}) {
      const fixed_point fp = fixed_point::for_values(gradzip::detail::bit_cast<std::uint32_t>(largest), n);
      CHECK(fp.unit_exponent == std::ilogb(largest) - fixed_point::precision(n));
      for (int trial = 0; trial < 2000; ++trial) {
        const float v = largest * static_cast<float>(static_cast<double>(rng() >> 11) / 9007199254740992.0) * ((rng() & 1) ? 1 : -1);
        const auto want = static_cast<std::int64_t>(std::nearbyint(std::ldexp(static_cast<long double>(v), -fp.unit_exponent)));
        REQUIRE(fp.to_fixed(v) == want);
        REQUIRE(std::llabs(want) <= (std::int64_t{1} << (fixed_point::precision(n) + 1)));
        REQUIRE(std::llabs(want) < (std::int64_t{1} << 31));
      }
    }
  }
  CHECK(fixed_point::precision(1) == 30);
  CHECK(fixed_point::precision((std::uint64_t{1} << 31) - 1) == 30);
  CHECK(fixed_point::precision(std::uint64_t{1} << 31) == 29);
  CHECK(fixed_point::precision(fixed_point::max_count) == 0);
}

TEST_CASE("count sketch estimates equal the plain median of the rows' signed cells", "[count_sketch]") {
  // n spans several 512-element tiles and ends inside one and inside an eight-lane group; even
  // row counts take the mean of the two middle values.
  const std::size_t n = 1237;
  const auto x = gradzip_tools::synthetic_gradient<float>(n, 4);
  for (std::uint32_t rows : {1u, 2u, 4u, 5u}) {
    const sketch::count_sketch cs{rows, 97, 3};
    const auto table = sketch_of(cs, x);
    const std::uint8_t* t = cs.table_of(span<const std::byte>(table));
    for (int threads : {1, 2}) {
      host exec(threads);
      std::vector<float> estimates(n);
      cs.estimate(exec, span<const std::byte>(table), span<float>(estimates));
      std::size_t differing = 0;
      for (std::size_t i = 0; i < n; ++i) {
        std::vector<float> v;
        for (std::uint32_t r = 0; r < rows; ++r) {
          const std::uint32_t h = sketch::count_sketch::hash_of(cs.seed(), r, i);
          v.push_back(sketch::count_sketch::sign_of(h) * sketch::count_sketch::load_cell(t, cs.cell_of(r, i)));
        }
        std::sort(v.begin(), v.end());
        const float want = rows % 2 == 1 ? v[rows / 2] : 0.5f * (v[rows / 2 - 1] + v[rows / 2]);
        if (estimates[i] != want && differing++ == 0) {
          UNSCOPED_INFO("first difference: element " << i << ", " << estimates[i] << " != " << want);
        }
      }
      INFO("rows " << rows << ", threads " << threads);
      CHECK(differing == 0);
    }
  }
}

TEST_CASE("count sketch medians leave NaN rows out, and an even mean does not overflow", "[count_sketch]") {
  using cs = sketch::count_sketch;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto bits = [](float v) { return gradzip::detail::bit_cast<std::uint32_t>(v); };
  const auto median = [](std::vector<float> v) { return cs::median(v.data(), static_cast<std::uint32_t>(v.size())); };
  // A NaN row, wherever it sits, is left out (it stayed in place in the network, so whether the
  // median was NaN depended on its row).
  CHECK(median({nan, 1.0f, 3.0f}) == 2.0f);
  CHECK(median({1.0f, nan, 3.0f}) == 2.0f);
  CHECK(median({1.0f, 3.0f, -nan}) == 2.0f);
  CHECK(median({5.0f, nan, 1.0f, nan, 3.0f}) == 3.0f);
  CHECK(bits(median({nan, -nan, nan})) == cs::poisoned_cell);  // NaN only when every row is
  CHECK(bits(median({-nan})) == cs::poisoned_cell);
  // Two middle values near fp32's top: their mean, not inf.
  CHECK(median({3e38f, 3e38f}) == 3e38f);
  CHECK(median({-3e38f, -3.2e38f, -3.3e38f, -3.1e38f}) == 0.5f * -3.2e38f + 0.5f * -3.1e38f);
  CHECK(std::isfinite(median({-3e38f, -3.2e38f, -3.3e38f, -3.1e38f})));
  CHECK(median({3e38f, -3e38f}) == 0.0f);
  CHECK(median({1.0f, 2.0f}) == 1.5f);
  CHECK(median({std::numeric_limits<float>::infinity(), 1.0f}) == std::numeric_limits<float>::infinity());
  CHECK(bits(median({std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()})) == cs::poisoned_cell);
  // End to end: one NaN element. Its estimate is NaN (every cell it maps to is poisoned); an
  // element sharing one cell with it keeps its other rows' median, whichever row they share.
  const cs sketch{3, 61, 1};
  auto x = gradzip_tools::synthetic_gradient<float>(2000, 9);
  x[77] = nan;
  const auto table = sketch_of(sketch, x);
  host exec;
  std::vector<float> estimates(x.size());
  sketch.estimate(exec, span<const std::byte>(table), span<float>(estimates));
  CHECK(bits(estimates[77]) == cs::poisoned_cell);
  std::size_t sharing = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (i == 77) continue;
    std::uint32_t shared = 0;
    for (std::uint32_t r = 0; r < 3; ++r) shared += sketch.cell_of(r, i) == sketch.cell_of(r, 77) ? 1u : 0u;
    sharing += shared != 0 ? 1 : 0;
    INFO("element " << i << " shares " << shared << " of the NaN's cells");
    CHECK(std::isnan(estimates[i]) == (shared == 3));
  }
  CHECK(sharing > 50);  // about 3 x 2000 / 61 elements share a cell
}

TEST_CASE("count sketch merges NaNs as its quiet NaN and unseals the merged payload", "[count_sketch]") {
  using cs = sketch::count_sketch;
  const cs sketch{2, 16, 5};
  host exec;
  const float inf = std::numeric_limits<float>::infinity();
  const auto bits = [](float v) { return gradzip::detail::bit_cast<std::uint32_t>(v); };
  const std::vector<float> ones(100, 1.0f);
  auto into = sketch_of(sketch, ones);
  auto other = sketch_of(sketch, ones);
  const auto table = [&](std::vector<std::byte>& p) { return const_cast<std::uint8_t*>(sketch.table_of(span<const std::byte>(p))); };
  // inf + -inf in cell 3 (x86 makes 0xFFC00000 of it, a GPU 0x7FFFFFFF); a negative NaN in cell 4.
  cs::store_cell(table(into), 3, inf);
  cs::store_cell(table(other), 3, -inf);
  cs::store_cell(table(other), 4, -std::numeric_limits<float>::quiet_NaN());
  const float cell5 = cs::load_cell(table(into), 5) + cs::load_cell(table(other), 5);
  wire::seal(span<std::byte>(into));
  sketch.merge(exec, span<std::byte>(into), span<const std::byte>(other));
  // The merged payload reads back (its seal is gone rather than stale) with gradzip's NaN.
  CHECK((wire::read_header(span<const std::byte>(into)).flags & wire::flag_checksum) == 0);
  const std::uint8_t* merged = sketch.table_of(span<const std::byte>(into));
  CHECK(bits(cs::load_cell(merged, 3)) == cs::poisoned_cell);
  CHECK(bits(cs::load_cell(merged, 4)) == cs::poisoned_cell);
  CHECK(cs::load_cell(merged, 5) == cell5);
  CHECK(bits(cs::sum_cells(-std::numeric_limits<float>::quiet_NaN(), 1.0f)) == cs::poisoned_cell);
  // unsketch checks k against n first, under its own name.
  std::vector<std::byte> top(1024);
  CHECK_THROWS_WITH(sketch.unsketch(exec, span<const std::byte>(other), 100, 101, span<std::byte>(top)),
                    "count_sketch::unsketch: k = 101 exceeds n = 100");
}

TEST_CASE("count sketch bytes do not depend on the thread count", "[count_sketch]") {
  const auto x = gradzip_tools::synthetic_gradient<float>(100003, 5);
  for (std::uint32_t rows : {1u, 3u, 5u, 8u}) {
    const sketch::count_sketch cs{rows, 1234, 7};
    CHECK(sketch_of(cs, x, 1) == sketch_of(cs, x, 2));
  }
}

TEST_CASE("count sketch recovers planted heavy hitters", "[count_sketch]") {
  // n = 2^20 standard normal entries plus 100 heavy hitters of magnitude 50..150 (random
  // signs and places). With 5 rows of n / 100 columns, each estimate's noise has a standard
  // deviation near sqrt(n / columns) = 10, so the hitters stand clear; the docs quote this size.
  const std::size_t n = std::size_t{1} << 20;
  const std::uint64_t hitters = 100;
  std::mt19937_64 rng(11);
  std::normal_distribution<float> noise;
  std::vector<float> x(n);
  for (auto& v : x) v = noise(rng);
  std::vector<std::uint64_t> planted;
  while (planted.size() < hitters) {
    const std::uint64_t i = rng() % n;
    if (std::find(planted.begin(), planted.end(), i) != planted.end()) continue;
    planted.push_back(i);
    x[i] = (rng() % 2 ? 1.0f : -1.0f) * (50.0f + static_cast<float>(rng() % 100));
  }
  std::sort(planted.begin(), planted.end());
  const sketch::count_sketch cs{5, n / 100, 2024};
  host exec;
  const auto table = sketch_of(cs, x);
  std::vector<std::byte> top(cs.max_unsketch_bytes(n, hitters));
  top.resize(cs.unsketch(exec, span<const std::byte>(table), n, hitters, span<std::byte>(top)));
  const auto found = test::payload_indices(top);
  std::size_t recalled = 0;
  for (auto i : found) recalled += std::binary_search(planted.begin(), planted.end(), i) ? 1 : 0;
  INFO("recall " << recalled << " / " << hitters);
  CHECK(recalled >= 99);
  // The unsketched payload is an ordinary top-k payload: its values estimate the hitters.
  std::vector<float> dense(n);
  codec<sparsify::topk>{sparsify::topk::count(hitters)}.decompress(exec, span<const std::byte>(top), span<float>(dense));
  for (auto i : planted) {
    if (dense[i] != 0.0f) CHECK(std::abs(dense[i] - x[i]) < 40.0f);
  }
}

TEST_CASE("count sketch rejects malformed and mismatched sketches", "[count_sketch]") {
  const sketch::count_sketch cs{3, 100, 9};
  host exec;
  const auto good = sketch_of(cs, gradzip_tools::synthetic_gradient<float>(500, 6));
  std::vector<float> out(500);
  const auto rejects = [&](const sketch::count_sketch& reader, const std::vector<std::byte>& bytes, wire::format_errc code) {
    try {
      reader.estimate(exec, span<const std::byte>(bytes), span<float>(out));
      FAIL("accepted");
    } catch (const format_error& e) {
      INFO(e.what());
      CHECK(e.code() == code);
    }
  };
  rejects(sketch::count_sketch{4, 100, 9}, good, wire::format_errc::bad_params);   // rows
  rejects(sketch::count_sketch{3, 101, 9}, good, wire::format_errc::bad_params);   // columns
  rejects(sketch::count_sketch{3, 100, 10}, good, wire::format_errc::bad_params);  // seed
  auto old_hash = good;  // hash family 0: hashed before multiply-shift, its buckets are not ours
  old_hash[wire::read_header(span<const std::byte>(good)).sections[0].offset + 4] = std::byte{0};
  rejects(cs, old_hash, wire::format_errc::bad_params);
  auto truncated = good;
  truncated.resize(good.size() - 16);
  rejects(cs, truncated, wire::format_errc::truncated);
  auto other_codec = good;
  other_codec[9] = std::byte{1};  // the structure id byte of the codec id
  rejects(cs, other_codec, wire::format_errc::codec_mismatch);
  std::vector<float> wrong_size(499);
  CHECK_THROWS_AS(cs.estimate(exec, span<const std::byte>(good), span<float>(wrong_size)), format_error);
  auto into = good;
  const auto longer = sketch_of(cs, std::vector<float>(501));
  CHECK_THROWS_AS(cs.merge(exec, span<std::byte>(into), span<const std::byte>(longer)), format_error);
  std::vector<std::byte> top(cs.max_unsketch_bytes(501, 5));
  CHECK_THROWS_AS(cs.unsketch(exec, span<const std::byte>(good), 501, 5, span<std::byte>(top)), format_error);
  CHECK_THROWS_AS((sketch::count_sketch{0, 10, 1}), invalid_argument);
  CHECK_THROWS_AS((sketch::count_sketch{3, 0, 1}), invalid_argument);
  CHECK_THROWS_AS((sketch::count_sketch{3, sketch::count_sketch::max_columns + 1, 1}), invalid_argument);
  CHECK(sketch::count_sketch{3, sketch::count_sketch::max_columns, 1}.columns() == sketch::count_sketch::max_columns);
}

#if defined(__AVX2__)
TEST_CASE("count sketch's AVX2 hashing equals multiply_shift and bucket_of", "[count_sketch]") {
  // High halves other than 0 (tensors above 2^32 elements, too large to sketch in a test) and
  // runs that end at a low half's last value.
  using cs = sketch::count_sketch;
  for (std::uint64_t columns : {std::uint64_t{1}, std::uint64_t{613}, cs::max_columns}) {
    const multiply_shift f = cs::row_hash(99, 2);
    for (std::uint64_t first : {std::uint64_t{0}, std::uint64_t{1001}, (std::uint64_t{1} << 32) - 8,
                                (std::uint64_t{3} << 32) + 77, (std::uint64_t{9} << 32) - 8}) {
      const gradzip::detail::multiply_shift_avx2 hasher(f, first >> 32, columns);
      alignas(32) std::uint32_t hashes[8], buckets[8];
      hasher.hash_8(hasher.lanes_from(static_cast<std::uint32_t>(first)), hashes, buckets);
      for (int l = 0; l < 8; ++l) {
        const std::uint32_t h = f(first + static_cast<std::uint64_t>(l));
        CHECK(hashes[l] == h);
        CHECK(buckets[l] == cs::bucket_of(h, columns));
        CHECK(buckets[l] < columns);
      }
    }
  }
}
#endif

namespace {
/// Whether S has an unsketch that takes its element count from the payload (exec, sketch, k, out).
template <class S, class = void>
struct unsketch_trusts_payload_n : std::false_type {};
template <class S>
struct unsketch_trusts_payload_n<S, std::void_t<decltype(std::declval<const S&>().unsketch(
                                        std::declval<host&>(), span<const std::byte>(), std::uint64_t{}, span<std::byte>()))>>
    : std::true_type {};
}  // namespace

TEST_CASE("count sketch: a hostile element count is rejected before anything is allocated", "[count_sketch][hostile]") {
  // Issue 22: unsketch(exec, sketch, k, out) sized its scratch from the payload's n: a giant n
  // asked for an allocation of the attacker's size (std::bad_alloc here), and an n whose byte
  // size wraps gave a small buffer that estimate overflowed (ASan). Every entry point now takes
  // the caller's n and checks the payload against it first.
  CHECK_FALSE(unsketch_trusts_payload_n<sketch::count_sketch>::value);
  const sketch::count_sketch cs{3, 100, 9};
  const auto good = sketch_of(cs, std::vector<float>(500, 1.0f));
  for (const std::uint64_t hostile_n : {std::uint64_t{0x8000000000011240} / 4, (std::uint64_t{1} << 62) + 8}) {
    auto bad = good;
    wire::detail::store_le(reinterpret_cast<std::uint8_t*>(bad.data()) + 16, hostile_n, 8);  // the header's n
    host exec;
    std::vector<std::byte> top(cs.max_unsketch_bytes(500, 5), std::byte{0x5A});
    std::vector<float> estimates(500, 42.0f);
    const auto top_before = top;
    const auto rejects = [&](auto call) {
      try {
        call();
        FAIL("accepted n = " << hostile_n);
      } catch (const format_error& e) {
        INFO(e.what());
        CHECK(e.code() == wire::format_errc::size_mismatch);
      }
    };
    rejects([&] { cs.unsketch(exec, span<const std::byte>(bad), 500, 5, span<std::byte>(top)); });
    rejects([&] { cs.estimate(exec, span<const std::byte>(bad), span<float>(estimates)); });
    auto into = good;
    rejects([&] { cs.merge(exec, span<std::byte>(into), span<const std::byte>(bad)); });
    CHECK(exec.scratch_capacity() == 0);  // nothing allocated
    CHECK(top == top_before);             // nothing written
    CHECK(estimates == std::vector<float>(500, 42.0f));
    CHECK(into == good);
  }
}
