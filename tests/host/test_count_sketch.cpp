// sketch::count_sketch: linearity (bit-exact on integer-valued inputs), thread-count
// independence, recovery of planted heavy hitters, unsketch through codec<topk>, and rejection
// of malformed or mismatched sketches.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>

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

TEST_CASE("count sketch table equals the plain definition, element by element", "[count_sketch]") {
  // n not a multiple of 8: the AVX2 path hashes eight indices per step, the tail one at a time.
  const std::size_t n = 10007;
  const auto x = gradzip_tools::synthetic_gradient<float>(n, 9);
  std::vector<double> wide(x.begin(), x.end());
  for (std::uint32_t rows : {1u, 3u, 5u}) {
    const sketch::count_sketch cs{rows, 613, 21};
    // Each cell: its sum over [0, n / 2) plus its sum over [n / 2, n), each in element order.
    std::vector<float> first(static_cast<std::size_t>(rows) * cs.columns(), 0.0f), second(first), cells(first);
    for (std::uint32_t r = 0; r < rows; ++r) {
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t h = sketch::count_sketch::hash_of(cs.seed(), r, i);
        (i < n / 2 ? first : second)[cs.cell_of(r, i)] += sketch::count_sketch::sign_of(h) * x[i];
      }
    }
    for (std::size_t j = 0; j < cells.size(); ++j) cells[j] = first[j] + second[j];
    host exec;
    for (const auto& table : {sketch_of(cs, x), [&] {
                                std::vector<std::byte> out(cs.payload_bytes(n));
                                cs.compress(exec, span<const double>(wide), span<std::byte>(out));
                                return out;
                              }()}) {
      const std::uint8_t* t = cs.table_of(span<const std::byte>(table));
      for (std::size_t j = 0; j < cells.size(); ++j) {
        if (sketch::count_sketch::load_cell(t, j) != cells[j]) FAIL("rows " << rows << ": cell " << j << " differs");
      }
    }
  }
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
