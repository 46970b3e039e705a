// Device tests: the CUDA executor must produce the host executor's bytes exactly. Without a GPU
// every test prints GRADZIP_NO_GPU and returns, and ctest reports it skipped.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <memory>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../../examples/log_scale4.hpp"
#include "../../examples/stochastic_bf16.hpp"
#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"
#include "common/thread_communicator.hpp"
#include "common/top_level_stage.hpp"
#include "common/two_faults.hpp"
#include "common/topk_pairs.cuh"
#include "device/device_helpers.cuh"
#include "gradzip/gradzip.cuh"
#if defined(GRADZIP_SIMT)
#include "gradzip_simt/settings.hpp"
#endif

namespace gz = gradzip;

namespace {

template <class Codec, class T>
std::vector<std::byte> device_compress(const Codec& c, gz::cuda& exec, const std::vector<T>& x) {
  device_vector<T> dx(x);
  device_vector<std::byte> out(c.template max_compressed_bytes<T>(x.size()));
  const std::size_t bytes = c.compress(exec, gz::span<const T>(dx.data, x.size()), out.view());
  exec.synchronize();
  return out.download(bytes);  // the bytes past the payload were never written
}

template <class T, class Codec = gz::codec<gz::sparsify::topk>>
void check_parity(const std::vector<T>& x, const Codec& c, gz::cuda& dev) {
  gz::host host;
  const auto expected = test::compress(c, host, x);
  const auto got = device_compress(c, dev, x);
  INFO("n = " << x.size());
  REQUIRE(got.size() == expected.size());
  CHECK(std::memcmp(got.data(), expected.data(), got.size()) == 0);
}

/// The device decodes a host-made payload of n elements to the host's floats, bit for bit.
template <class Codec>
void check_decode_parity(const Codec& c, const std::vector<std::byte>& payload, std::size_t n, gz::cuda& dev) {
  gz::host host;
  device_vector<std::byte> dp(payload);
  device_vector<float> dout(n);
  c.decompress(dev, gz::span<const std::byte>(dp.data, payload.size()), dout.view());
  dev.check();
  std::vector<float> expected(n);
  c.decompress(host, gz::span<const std::byte>(payload), gz::span<float>(expected));
  const auto got = dout.download();
  INFO("n = " << n);
  CHECK(output_difference(got.data(), expected.data(), n) == "");
}

/// The device adds alpha x a host-made payload into acc as the host does, bit for bit.
template <class Codec>
void check_decompress_add_parity(const Codec& c, const std::vector<std::byte>& payload, std::vector<float> acc,
                                 gz::cuda& dev, float alpha = 0.25f) {
  gz::host host;
  device_vector<std::byte> dp(payload);
  device_vector<float> dacc(acc);
  c.decompress_add(dev, gz::span<const std::byte>(dp.data, payload.size()), dacc.view(), alpha);
  dev.check();
  c.decompress_add(host, gz::span<const std::byte>(payload), gz::span<float>(acc), alpha);
  const auto got = dacc.download();
  INFO("n = " << acc.size());
  CHECK(output_difference(got.data(), acc.data(), acc.size()) == "");
}

template <class T>
std::vector<T> converted(const std::vector<float>& f) {
  std::vector<T> out(f.size());
  for (std::size_t i = 0; i < f.size(); ++i) out[i] = gz::from_double<T>(f[i]);
  return out;
}

/// The device sketches x (uploaded after `offset` leading elements, so offset 1 gives a span
/// that is not 16-byte aligned) to the host's bytes.
template <class T>
void check_sketch_parity(const gz::sketch::count_sketch& cs, const std::vector<T>& x, gz::cuda& dev,
                         std::size_t offset = 0) {
  gz::host host;
  std::vector<std::byte> expected(cs.payload_bytes(x.size()));
  cs.compress(host, gz::span<const T>(x), gz::span<std::byte>(expected));
  std::vector<T> padded(offset + x.size());
  std::copy(x.begin(), x.end(), padded.begin() + static_cast<std::ptrdiff_t>(offset));
  device_vector<T> dx(padded);
  device_vector<std::byte> out(expected.size());
  cs.compress(dev, gz::span<const T>(dx.data + offset, x.size()), out.view());
  dev.check();
  INFO("n = " << x.size() << ", element bytes " << sizeof(T) << ", offset " << offset);
  CHECK(out.download() == expected);
}

/// Warp `warp`'s look-back for tile `tile`, over words the test lays out (the emit walks back
/// in warps 0 and 1).
__global__ __launch_bounds__(64) void lookback_probe_kernel(std::uint64_t* status, std::uint64_t tile, std::uint64_t aggregate,
                                                            unsigned warp, std::uint64_t* before) {
  if (threadIdx.x / 32 != warp) return;
  const std::uint64_t b = gz::detail::tile_lookback(status, tile, aggregate);
  before[threadIdx.x % 32] = b;  // every lane gets it
}

}  // namespace

TEST_CASE("decoupled look-back sums aggregates back to the nearest inclusive prefix", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  using status = gz::detail::tile_status;
  // Executors that run one block at a time only ever show a finished (inclusive) predecessor;
  // here the words show what a GPU can: aggregates published, inclusive prefixes not yet.
  const auto probe = [&](const std::vector<std::uint64_t>& words, std::uint64_t aggregate) {
    const std::uint64_t tile = words.size() - 1;  // its own word, zero until published
    std::uint64_t found[2] = {};
    for (unsigned warp : {0u, 1u}) {
      device_vector<std::uint64_t> dw(words);
      device_vector<std::uint64_t> before(32);
      gz::detail::launch(lookback_probe_kernel, 1, 64, 0, dev.stream(), dw.data, tile, aggregate, warp, before.data);
      dev.synchronize();
      const auto b = before.download();
      INFO("tile " << tile << ", warp " << warp);
      CHECK(std::all_of(b.begin(), b.end(), [&](std::uint64_t v) { return v == b[0]; }));
      auto after = dw.download();
      CHECK(after[tile] == (status::inclusive | (b[0] + aggregate)));
      after[tile] = words[tile];
      CHECK(after == words);  // earlier tiles' words are only read
      found[warp] = b[0];
    }
    CHECK(found[0] == found[1]);
    return found[0];
  };
  CHECK(probe({status::inclusive | 5, status::aggregate | 3, status::aggregate | 4, 0}, 2) == 12);
  CHECK(probe({status::inclusive | 1, status::inclusive | 9, status::aggregate | 6, 0}, 7) == 15);  // stops at tile 1
  CHECK(probe({0}, 4) == 0);                                                                       // tile 0
  // Walks of more than one step of 32 words: tile 70 sums tiles 69 .. 3 and stops at tile 2's
  // inclusive 100 (tiles 0 and 1 hold words that must not be added).
  std::vector<std::uint64_t> long_walk(71, 0);
  long_walk[0] = status::inclusive | 1000;
  long_walk[1] = status::aggregate | 1000;
  long_walk[2] = status::inclusive | 100;
  std::uint64_t expected = 100;
  for (std::size_t t = 3; t < 70; ++t) {
    long_walk[t] = status::aggregate | t;
    expected += t;
  }
  CHECK(probe(long_walk, 9) == expected);
  long_walk[40] = status::inclusive | 7;  // now the nearest inclusive: tiles 69 .. 41, then 7
  CHECK(probe(long_walk, 9) == 7 + (41 + 69) * 29 / 2);
  // Exactly 32 earlier tiles, none inclusive but tile 0.
  std::vector<std::uint64_t> window(33, status::aggregate | 2);
  window[0] = status::inclusive | 2;
  window[32] = 0;
  CHECK(probe(window, 1) == 64);
}

TEST_CASE("cuda topk payloads equal the host's byte for byte (float)", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda exec;
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{65537},
                        std::size_t{1} << 20, std::size_t{3000001}}) {
    for (std::uint64_t seed : {1ull, 2ull}) {
      const auto g = gradzip_tools::synthetic_gradient<float>(n, seed);
      for (double r : {0.001, 0.01, 0.3, 1.0}) check_parity(g, gz::codec<gz::sparsify::topk>{gz::sparsify::topk::ratio(r)}, exec);
    }
  }
}

TEST_CASE("cuda topk parity for double half and bfloat16", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda exec;
  std::vector<std::size_t> sizes{513, 200003};
#if !defined(GRADZIP_SIMT)
  // On a GPU, past the one-launch select (2^21) and past the sampled start (2^23): the
  // launches' emit, then the sampled path's, write the frame (SIMT takes the launches at 200,003).
  sizes.push_back(3000001);
  sizes.push_back((std::size_t{1} << 23) + 5);
#endif
  for (std::size_t n : sizes) {
    const auto g = gradzip_tools::synthetic_gradient<float>(n, 9);
    const gz::codec<gz::sparsify::topk> c{gz::sparsify::topk::ratio(0.01)};
    check_parity(gradzip_tools::synthetic_gradient<double>(n, 9), c, exec);
    check_parity(converted<__half>(g), c, exec);
    check_parity(converted<__nv_bfloat16>(g), c, exec);
  }
  // k = 0: the select launches only its sink's prologue, which writes the frame.
  const auto g = gradzip_tools::synthetic_gradient<float>(513, 9);
  const gz::codec<gz::sparsify::topk> none{gz::sparsify::topk::count(0)};
  check_parity(gradzip_tools::synthetic_gradient<double>(513, 9), none, exec);
  check_parity(converted<__half>(g), none, exec);
  check_parity(converted<__nv_bfloat16>(g), none, exec);
}

TEST_CASE("cuda topk parity on ties NaN and single-bin inputs", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda exec;
  const gz::codec<gz::sparsify::topk> c{gz::sparsify::topk::count(1000)};
  check_parity(std::vector<float>(300000, 0.5f), c, exec);  // every element ties
  std::vector<float> mixed(300000, 1.0f);
  for (std::size_t i = 0; i < mixed.size(); i += 7) mixed[i] = 2.0f;
  check_parity(mixed, gz::codec<gz::sparsify::topk>{gz::sparsify::topk::count(100000)}, exec);
  std::vector<float> one_bin(300000);
  std::mt19937 rng(3);
  for (auto& v : one_bin) {
    const std::uint32_t bits = 0x3F800000u | (rng() & 0xFFFFu);
    std::memcpy(&v, &bits, 4);
  }
  check_parity(one_bin, c, exec);
  auto with_nan = gradzip_tools::synthetic_gradient<float>(100000, 4);
  with_nan[5] = std::numeric_limits<float>::quiet_NaN();
  with_nan[99] = -std::numeric_limits<float>::infinity();
  check_parity(with_nan, c, exec);
  check_parity(std::vector<float>(10, 1.0f), gz::codec<gz::sparsify::topk>{gz::sparsify::topk::count(0)}, exec);
}

TEST_CASE("cuda topk: candidate list or x, early stops, ties across tiles", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda exec;
  using topk = gz::codec<gz::sparsify::topk>;
  // Ties at T spread over many 2,048-element tiles, in a candidate list that fits
  // (2 x 35,295 of 600,000 <= n / 8): the emit's two look-backs place the first 14,705 ties.
  std::vector<float> ties(600000, 0.001f);
  for (std::size_t i = 0; i < ties.size(); i += 17) ties[i] = -2.0f;
  for (std::size_t i = 5; i < ties.size(); i += 17) ties[i] = 1.0f;
  check_parity(ties, topk{gz::sparsify::topk::count(50000)}, exec);
  // The same with the list too small (m = 2 x 46,154 > 75,000): every pass after the first
  // reads x again, to the same bytes.
  for (std::size_t i = 0; i < ties.size(); i += 13) ties[i] = -2.0f;
  for (std::size_t i = 5; i < ties.size(); i += 13) ties[i] = 1.0f;
  check_parity(ties, topk{gz::sparsify::topk::count(50000)}, exec);
  // Early stops. 1,000 keys in the first digit's bin of 4.0 (4.0 itself included: its key is the
  // bin's lowest, which "above prefix - 1" must take), the rest far below: k = 1,000 takes the
  // bin whole at the first digit. Adding 600 keys in 2.0's bin, 500 of them sharing the highest
  // second digit (0x40000200 exactly among them), k = 1,500 stops at the second digit.
  std::vector<float> stops(200003);
  std::mt19937 rng(17);
  for (auto& v : stops) v = 1e-3f * static_cast<float>(rng() % 1000 + 1);
  for (std::size_t j = 0; j < 1000; ++j) stops[38 + 190 * j] = (j % 2 ? -1.0f : 1.0f) * (4.0f + 0.0004f * static_cast<float>(j));
  check_parity(stops, topk{gz::sparsify::topk::count(1000)}, exec);
  for (std::size_t j = 0; j < 600; ++j) {
    // Second digit 1 (bits 9-19) for the 500, with duplicates (j % 400); second digit 0 for the rest.
    const std::uint32_t low = j < 500 ? 0x200u + static_cast<std::uint32_t>(j % 400) : static_cast<std::uint32_t>(j);
    const std::uint32_t bits = 0x40000000u | low;  // 2.0 and keys just above it
    std::memcpy(&stops[101 + 330 * j], &bits, 4);  // odd: never one of the 4.0 positions (even)
  }
  check_parity(stops, topk{gz::sparsify::topk::count(1500)}, exec);
  check_parity(stops, topk{gz::sparsify::topk::count(1499)}, exec);  // no whole bin: resolved at the last digit
  check_parity(gradzip_tools::synthetic_gradient<double>(70001, 3), topk{gz::sparsify::topk::count(700)}, exec);
}

namespace {

template <gz::detail::topk_counting Counting, class T>
std::vector<std::uint64_t> device_topk(const std::vector<T>& x, std::uint64_t k, gz::cuda& dev,
                                       std::vector<std::string>& marks,
                                       std::uint64_t sample_from = gz::detail::cuda_topk_sample_from,
                                       std::uint64_t resident_up_to = 0) {
  device_vector<T> dx(x);
  device_vector<std::uint64_t> index(k);
  device_vector<T> values(k);
  marks.clear();
  gz::detail::cuda_topk<Counting>(dev, gz::span<const T>(dx.data, x.size()), k,
                                  gradzip_tools::topk_pair_sink{index.data, values.data},
                                  [&](const char* name) { marks.emplace_back(name); }, sample_from, resident_up_to);
  dev.check();
  const auto i = index.download();
  const auto v = values.download();
  std::size_t wrong_values = 0;
  for (std::size_t j = 0; j < k; ++j) wrong_values += i[j] >= x.size() || std::memcmp(&v[j], &x[i[j]], sizeof(T)) != 0;
  CHECK(wrong_values == 0);
  return i;
}

/// The device top-k's state after its last call on dev (the start of dev's scratch).
template <class T>
gz::detail::cuda_topk_state<gz::key_type_t<T>> last_topk_state(gz::cuda& dev) {
  gz::detail::cuda_topk_state<gz::key_type_t<T>> st{};
  GRADZIP_CUDA_TRY(cudaMemcpy(&st, dev.scratch(0), sizeof(st), cudaMemcpyDeviceToHost));
  return st;
}

}  // namespace

TEST_CASE("cuda topk counts digits alike by match_any and per element, and marks each launch", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  using gz::detail::topk_counting;
  std::vector<float> ties(600000, 0.001f);  // ties at T across many tiles (as the test above)
  for (std::size_t i = 0; i < ties.size(); i += 17) ties[i] = -2.0f;
  for (std::size_t i = 5; i < ties.size(); i += 17) ties[i] = 1.0f;
  const auto g = gradzip_tools::synthetic_gradient<float>(70001, 5);
  const std::vector<std::string> fp32_launches = {"init", "histogram", "compact", "histogram", "emit"};
  for (const auto& [x, k] : {std::pair<const std::vector<float>&, std::uint64_t>{g, 1}, {g, 700}, {g, 70001},
                             {ties, 50000}}) {
    INFO("n " << x.size() << ", k " << k);
    const auto want = test::reference_topk(x, k);
    std::vector<std::string> marks;
    CHECK(device_topk<topk_counting::match_any>(x, k, dev, marks) == want);
    CHECK(marks == fp32_launches);
    CHECK(device_topk<topk_counting::per_element>(x, k, dev, marks) == want);
    CHECK(marks == fp32_launches);
  }
}

TEST_CASE("cuda topk starts from a sample's bound, and falls back when the sample misleads or the list overflows",
          "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  using gz::detail::topk_counting;
  constexpr std::uint64_t from = 1 << 16;  // the sampled select at test sizes (by default from 2^23)
  const std::vector<std::string> sampled_launches = {"init",    "sample",            "compact_sampled", "histogram",
                                                     "compact", "histogram_sampled", "histogram",       "emit"};
  std::vector<std::string> marks;
  SECTION("it holds: x is read once, and the list stays the sampled one") {
    const auto g = gradzip_tools::synthetic_gradient<float>(200003, 7);
    for (const std::uint64_t k : {1, 200, 2000}) {
      INFO("k " << k);
      CHECK(device_topk<topk_counting::per_element>(g, k, dev, marks, from) == test::reference_topk(g, k));
      CHECK(marks == sampled_launches);
      const auto st = last_topk_state<float>(dev);
      CHECK(st.sampled == 1);
      CHECK(st.candidates >= k);
      // About the sample's share of n (the k-th largest sample and 4 sigma): not a whole bin's.
      const std::uint64_t m = gz::detail::topk_sample_size(g.size());
      CHECK(st.candidates <= 2 * gz::detail::topk_sample_rank(g.size(), k, m) * (g.size() / m));
    }
    CHECK(device_topk<topk_counting::match_any>(g, 2000, dev, marks, from) == test::reference_topk(g, 2000));
    const auto d = gradzip_tools::synthetic_gradient<double>(200003, 8);
    CHECK(device_topk<topk_counting::per_element>(d, 2000, dev, marks, from) == test::reference_topk(d, 2000));
    CHECK(last_topk_state<double>(dev).sampled == 1);
    const auto b = converted<__nv_bfloat16>(g);  // 16-bit keys: many ties at T
    CHECK(device_topk<topk_counting::per_element>(b, 2000, dev, marks, from) == test::reference_topk(b, 2000));
    CHECK(last_topk_state<__nv_bfloat16>(dev).sampled == 1);
    const auto h = converted<__half>(g);
    CHECK(device_topk<topk_counting::per_element>(h, 2000, dev, marks, from) == test::reference_topk(h, 2000));
    CHECK(marks == sampled_launches);
    CHECK(last_topk_state<__half>(dev).sampled == 1);
    // Below sample_from, or with a k whose expected list would crowd the list: the radix select.
    CHECK(device_topk<topk_counting::per_element>(g, 2000, dev, marks, 200004) == test::reference_topk(g, 2000));
    CHECK(marks == std::vector<std::string>{"init", "histogram", "compact", "histogram", "emit"});
    CHECK(device_topk<topk_counting::per_element>(g, 40000, dev, marks, from) == test::reference_topk(g, 40000));
    CHECK(marks.at(1) == "histogram");
  }
  SECTION("the sample sees only the largest keys: fewer than k reach its bound") {
    std::vector<float> x = gradzip_tools::synthetic_gradient<float>(200003, 9);
    const std::uint64_t m = gz::detail::topk_sample_size(x.size());
    for (std::uint64_t j = 0; j < m; ++j) x[j * x.size() / m] = 100.0f + static_cast<float>(j);
    CHECK(device_topk<topk_counting::per_element>(x, 2000, dev, marks, from) == test::reference_topk(x, 2000));
    CHECK(marks == sampled_launches);
    CHECK(last_topk_state<float>(dev).sampled == 0);
    CHECK(device_topk<topk_counting::match_any>(x, 2000, dev, marks, from) == test::reference_topk(x, 2000));
    CHECK(last_topk_state<float>(dev).sampled == 0);
    std::vector<double> d(x.begin(), x.end());
    CHECK(device_topk<topk_counting::per_element>(d, 2000, dev, marks, from) == test::reference_topk(d, 2000));
    CHECK(last_topk_state<double>(dev).sampled == 0);
  }
  SECTION("the first digit's bin holds the bound and exactly the rank: T resolves there, from the list") {
    // 1.1 at the m sampled positions, 1.0 elsewhere: one first-digit bin (0x3F8) holds both, the
    // list holds the k = m keys 1.1 and the select takes its bin whole (threshold just below the
    // bin). The emit must read the list: from x it would take every 1.0 of the bin too.
    std::vector<float> x(200003, 1.0f);
    const std::uint64_t m = gz::detail::topk_sample_size(x.size());
    for (std::uint64_t j = 0; j < m; ++j) x[j * x.size() / m] = 1.1f;
    CHECK(device_topk<topk_counting::per_element>(x, m, dev, marks, from) == test::reference_topk(x, m));
    const auto st = last_topk_state<float>(dev);
    CHECK(st.sampled == 1);
    CHECK(st.candidates == m);
    CHECK(st.resolved == 1);
    CHECK(st.ties_to_take == 0);
  }
  SECTION("the list outgrows its capacity: more keys reach the bound than it holds") {
    const std::vector<float> x(200003, -0.5f);  // all equal: ties to the lowest indices
    CHECK(device_topk<topk_counting::per_element>(x, 100, dev, marks, from) == test::reference_topk(x, 100));
    CHECK(last_topk_state<float>(dev).sampled == 0);
    // 1 % distinct large keys and a flat rest at the sample's bound: the list overflows, and the
    // radix select finds the large keys in their own bins.
    std::vector<float> y(200003, 0.25f);
    for (std::size_t i = 3; i < y.size(); i += 101) y[i] = 2.0f + 1e-4f * static_cast<float>(i % 1000);
    CHECK(device_topk<topk_counting::per_element>(y, 1500, dev, marks, from) == test::reference_topk(y, 1500));
    CHECK(last_topk_state<float>(dev).sampled == 0);
  }
}

namespace {

/// The device top-k by the one-launch select where it fits (checked against the marks), and by
/// the multi-launch one: both must give the host's selection.
template <gz::detail::topk_counting Counting, class T>
void check_resident_topk(const std::vector<T>& x, std::uint64_t k, gz::cuda& dev) {
  INFO("n " << x.size() << ", k " << k << ", " << sizeof(T) << "-byte elements");
  const auto want = test::reference_topk(x, k);
  const std::uint64_t holds =
      gz::detail::cuda_topk_resident_blocks<T, Counting, gradzip_tools::topk_pair_sink<T>>(dev);
  const bool fits = x.size() <= holds * gz::detail::topk_resident_tile;
  std::vector<std::string> marks;
  CHECK(device_topk<Counting>(x, k, dev, marks, gz::detail::cuda_topk_sample_from, gz::detail::cuda_topk_resident_max) ==
        want);
  CHECK((marks == std::vector<std::string>{"resident"}) == fits);
  CHECK(device_topk<Counting>(x, k, dev, marks) == want);
  CHECK(marks.at(0) == "init");
}

}  // namespace

TEST_CASE("cuda topk of a small input is one cooperative launch, with the multi-launch select's result", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  using gz::detail::topk_counting;
  // A SIMT build holds 4 SMs x 2 blocks of 4,096 elements at once, so these sizes run resident
  // there too (under --simt-max-grid=3 only n <= 12,288 does; the larger ones take the launches,
  // and `fits` expects that); a GPU holds far more.
  const auto g = gradzip_tools::synthetic_gradient<float>(20000, 11);
  for (const std::uint64_t k : {1, 7, 200, 2000, 19999, 20000}) check_resident_topk<topk_counting::per_element>(g, k, dev);
  check_resident_topk<topk_counting::match_any>(g, 200, dev);
  check_resident_topk<topk_counting::per_element>(std::vector<float>(g.begin(), g.begin() + 7), 3, dev);  // one short run
  check_resident_topk<topk_counting::per_element>(std::vector<float>(g.begin(), g.begin() + 4097), 40, dev);
  check_resident_topk<topk_counting::per_element>(gradzip_tools::synthetic_gradient<double>(9001, 12), 90, dev);
  check_resident_topk<topk_counting::per_element>(converted<__nv_bfloat16>(g), 300, dev);  // 16-bit elements: ties at T
  check_resident_topk<topk_counting::per_element>(converted<__half>(g), 3000, dev);
  // Ties at T in every block: the first ties_to_take go to the lowest indices, across blocks.
  std::vector<float> ties(30000, 0.001f);
  for (std::size_t i = 0; i < ties.size(); i += 17) ties[i] = -2.0f;
  for (std::size_t i = 5; i < ties.size(); i += 19) ties[i] = 1.0f;
  check_resident_topk<topk_counting::per_element>(ties, 5000, dev);
  check_resident_topk<topk_counting::match_any>(ties, 5000, dev);
  // Zeros only: the prefix stays 0 (no early stop), T = 0, the first k indices.
  check_resident_topk<topk_counting::per_element>(std::vector<float>(12345, 0.0f), 10, dev);
  // k = the keys of the first digit's chosen bin (4.0 to 4.4: one bin): T resolves at the first
  // digit, and the later digits' passes do not run.
  std::vector<float> stops(25000);
  std::mt19937 rng(3);
  for (auto& v : stops) v = 1e-3f * static_cast<float>(rng() % 1000 + 1);
  for (std::size_t j = 0; j < 1000; ++j) stops[11 + 24 * j] = (j % 2 ? -1.0f : 1.0f) * (4.0f + 0.0004f * static_cast<float>(j));
  check_resident_topk<topk_counting::per_element>(stops, 1000, dev);
  check_resident_topk<topk_counting::per_element>(stops, 999, dev);
  // Through the codec: the payload equals the host's.
  check_parity(g, gz::codec<gz::sparsify::topk>{gz::sparsify::topk::ratio(0.01)}, dev);
  check_parity(g, gz::codec<gz::sparsify::topk, gz::quantize::qsgd<7>>{gz::sparsify::topk::ratio(0.05)}, dev);
}

#if defined(GRADZIP_SIMT)
// SIMT only: an MPS client's share of the SMs, which a GPU test cannot arrange.
TEST_CASE("cuda topk falls back to launches when the device declines the cooperative one", "[gpu]") {
  REQUIRE_GPU();
  using gz::detail::topk_counting;
  using sink = gradzip_tools::topk_pair_sink<float>;
  struct shape {  // 4 SMs with cooperative launches, any grid (whatever --simt-* asked), restored afterwards
    gradzip_simt::settings saved = gradzip_simt::config();
    shape() {
      gradzip_simt::config().sm_count = 4;
      gradzip_simt::config().max_grid_x = 0x7FFFFFFFu;
      gradzip_simt::config().cooperative_launch = true;
    }
    ~shape() { gradzip_simt::config() = saved; }
  } device_shape;
  gz::cuda dev;
  REQUIRE(dev.cooperative_sms() == 4);  // the attribute promises every SM
  // Blocks per SM as the backend answers (--simt-blocks-per-sm); the device now holds one SM's
  // worth at once, fewer than occupancy x SMs promise.
  const int p = gz::detail::cuda_topk_resident_per_sm<float, topk_counting::per_element, sink>();
  REQUIRE(p >= 1);
  REQUIRE((2 * static_cast<std::uint64_t>(p) + 1) * gz::detail::topk_resident_tile <= gz::detail::cuda_topk_resident_max);
  gradzip_simt::config().max_cooperative_blocks = static_cast<unsigned>(p);
  const auto blocks_of = [](std::uint64_t blocks) { return blocks * gz::detail::topk_resident_tile - 100; };
  const auto resident_topk = [&](gz::cuda& exec, const std::vector<float>& x, std::vector<std::string>& marks) {
    return device_topk<topk_counting::per_element>(x, x.size() / 100, exec, marks, gz::detail::cuda_topk_sample_from,
                                                   gz::detail::cuda_topk_resident_max) ==
           test::reference_topk(x, x.size() / 100);
  };
  const std::uint64_t declined = gradzip_simt::declined_cooperative_launches();
  const auto g = gradzip_tools::synthetic_gradient<float>(blocks_of(2 * p + 1), 13);
  std::vector<std::string> marks;
  CHECK(resident_topk(dev, g, marks));
  CHECK(marks.at(0) == "init");
  CHECK(cudaGetLastError() == cudaSuccess);  // the declined launch leaves no error for the next check
  CHECK(gradzip_simt::declined_cooperative_launches() == declined + 1);
  CHECK(dev.cooperative_sms() == 2);  // fewer than ceil((2p + 1) / p) = 3 SMs' worth
  // The executor remembers: 2p + 1 blocks are not tried again, through the codec either.
  CHECK(resident_topk(dev, g, marks));
  CHECK(marks.at(0) == "init");
  check_parity(g, gz::codec<gz::sparsify::topk>{gz::sparsify::topk::ratio(0.01)}, dev);
  CHECK(gradzip_simt::declined_cooperative_launches() == declined + 1);
  const std::vector<float> small(g.begin(), g.begin() + static_cast<std::ptrdiff_t>(blocks_of(p)));  // resident still
  CHECK(resident_topk(dev, small, marks));
  CHECK(marks == std::vector<std::string>{"resident"});
  // p + 1 blocks fit the 2 SMs' worth still assumed, and decline: one SM's worth is left.
  const std::vector<float> more(g.begin(), g.begin() + static_cast<std::ptrdiff_t>(blocks_of(p + 1)));
  CHECK(resident_topk(dev, more, marks));
  CHECK(marks.at(0) == "init");
  CHECK(gradzip_simt::declined_cooperative_launches() == declined + 2);
  CHECK(dev.cooperative_sms() == 1);
  CHECK(resident_topk(dev, small, marks));
  CHECK(marks == std::vector<std::string>{"resident"});
  // Another executor has not learned it, and tries once.
  gz::cuda other;
  CHECK(resident_topk(other, g, marks));
  CHECK(gradzip_simt::declined_cooperative_launches() == declined + 3);
  CHECK(other.cooperative_sms() == 2);
}

// SIMT only: a device without cooperative launches (cudaDevAttrCooperativeLaunch 0).
TEST_CASE("cuda topk runs the launches on a device without cooperative launches", "[gpu]") {
  REQUIRE_GPU();
  struct none {
    bool saved = gradzip_simt::config().cooperative_launch;
    none() { gradzip_simt::config().cooperative_launch = true; }  // for `earlier` below
    void off() { gradzip_simt::config().cooperative_launch = false; }
    ~none() { gradzip_simt::config().cooperative_launch = saved; }
  } no_cooperative;
  gz::cuda earlier;  // made while the attribute said 1
  no_cooperative.off();
  gz::cuda dev;
  CHECK(earlier.cooperative_sms() == earlier.sm_count());
  CHECK(dev.cooperative_sms() == 0);
  using gz::detail::topk_counting;
  const std::uint64_t declined = gradzip_simt::declined_cooperative_launches();
  // 3 blocks: resident on any other device, and more than one SM's worth at the backend's
  // default 2 per SM, so that only cudaErrorNotSupported's meaning takes `earlier` to 0 below.
  const auto g = gradzip_tools::synthetic_gradient<float>(12000, 14);
  std::vector<std::string> marks;
  CHECK(device_topk<topk_counting::per_element>(g, 120, dev, marks, gz::detail::cuda_topk_sample_from,
                                                gz::detail::cuda_topk_resident_max) == test::reference_topk(g, 120));
  CHECK(marks.at(0) == "init");
  CHECK(cudaGetLastError() == cudaSuccess);
  check_parity(g, gz::codec<gz::sparsify::topk>{gz::sparsify::topk::ratio(0.01)}, dev);
  CHECK(gradzip_simt::declined_cooperative_launches() == declined);  // the attribute said so: none tried
  // An executor made before reads the attribute no more: its first launch declines
  // (cudaErrorNotSupported) and teaches it that no cooperative launch runs; the second is not tried.
  for (int call = 0; call < 2; ++call) {
    CHECK(device_topk<topk_counting::per_element>(g, 120, earlier, marks, gz::detail::cuda_topk_sample_from,
                                                  gz::detail::cuda_topk_resident_max) == test::reference_topk(g, 120));
    CHECK(marks.at(0) == "init");
  }
  CHECK(gradzip_simt::declined_cooperative_launches() == declined + 1);
  CHECK(earlier.cooperative_sms() == 0);
  // launch_cooperative itself declines (cudaErrorNotSupported), launching nothing and leaving no
  // error behind.
  device_vector<float> dx(g);
  device_vector<unsigned> hist(4 * gz::detail::topk_digit_bins);
  device_vector<unsigned long long> counts(2);
  device_vector<std::uint64_t> index(1);
  device_vector<float> values(1);
  const gradzip_tools::topk_pair_sink sink{index.data, values.data};
  CHECK(gz::detail::launch_cooperative(
      gz::detail::topk_resident_kernel<float, std::uint32_t, topk_counting::per_element, gradzip_tools::topk_pair_sink<float>>, 2,
      gz::detail::topk_policy::threads, 0, dev.stream(), dx.data, std::uint64_t{g.size()}, std::uint64_t{1}, hist.data,
      counts.data, sink) == cudaErrorNotSupported);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(gradzip_simt::declined_cooperative_launches() == declined + 2);
}
#endif

TEST_CASE("cuda decompress_add equals the host's result", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  gz::host host;
  const std::size_t n = 1 << 18;
  const gz::codec<gz::sparsify::topk> c{gz::sparsify::topk::ratio(0.02)};
  const auto payload = test::compress(c, host, gradzip_tools::synthetic_gradient<float>(n, 5));
  check_decompress_add_parity(c, payload, gradzip_tools::synthetic_gradient<float>(n, 6), dev);

  // decompress overwrites what the output held.
  device_vector<std::byte> dp(payload);
  device_vector<float> dacc(gradzip_tools::synthetic_gradient<float>(n, 6));
  std::vector<float> dense(n);
  c.decompress(host, gz::span<const std::byte>(payload), gz::span<float>(dense));
  c.decompress(dev, gz::span<const std::byte>(dp.data, payload.size()), dacc.view());
  dev.check();
  const auto got_dense = dacc.download();
  CHECK(output_difference(got_dense.data(), dense.data(), n) == "");
}

TEST_CASE("cuda decoding rejects bad payloads and changes nothing", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  gz::host host;
  const gz::codec<gz::sparsify::topk> c{gz::sparsify::topk::count(3)};
  const auto good = test::compress(c, host, std::vector<float>{0.1f, -9, 0.2f, 8, 0.3f, 7, 0.4f, 0.5f, 0.6f, 0.7f});
  struct bad {
    std::size_t at;
    std::uint8_t value;
    gz::wire::format_errc code;
  };
  const bad cases[] = {{0, 'X', gz::wire::format_errc::bad_magic},
                       {4, 2, gz::wire::format_errc::unsupported_version},
                       {9, 9, gz::wire::format_errc::codec_mismatch},
                       {128, 11, gz::wire::format_errc::count_overflow},
                       {148, 10, gz::wire::format_errc::index_out_of_range},
                       {152, 3, gz::wire::format_errc::index_not_increasing}};
  for (const auto& b : cases) {
    auto payload = good;
    payload[b.at] = std::byte{b.value};
    device_vector<std::byte> dp(payload);
    device_vector<float> acc(std::vector<float>(10, 1.0f));
    c.decompress_add(dev, gz::span<const std::byte>(dp.data, payload.size()), acc.view());
    try {
      dev.check();
      FAIL("accepted a payload with byte " << b.at << " = " << int(b.value));
    } catch (const gz::format_error& e) {
      CHECK(e.code() == b.code);
    }
    CHECK(acc.download() == std::vector<float>(10, 1.0f));
  }
  // Truncated: the device sees fewer bytes than the header promises.
  device_vector<std::byte> dp(good);
  device_vector<float> acc(std::vector<float>(10, 1.0f));
  c.decompress_add(dev, gz::span<const std::byte>(dp.data, good.size() - 16), acc.view());
  CHECK_THROWS_AS(dev.check(), gz::format_error);
  dev.check();  // the error was cleared
}

TEST_CASE("cuda decompress_add_all checks every payload first, then adds them in order", "[gpu]") {
  REQUIRE_GPU();
  gz::host host;
  gz::cuda dev;
  const gz::codec<gz::sparsify::topk, gz::quantize::qsgd<7>> c{gz::sparsify::topk::ratio(0.1), gz::quantize::qsgd<7>{1}};
  const std::size_t n = 700;
  std::vector<std::vector<std::byte>> payloads;
  for (std::uint64_t r = 0; r < 3; ++r) payloads.push_back(test::compress(c, host, gradzip_tools::synthetic_gradient<float>(n, r), {0, r}));
  std::vector<device_vector<std::byte>> dp;
  std::vector<gz::span<const std::byte>> views;
  for (const auto& p : payloads) {
    dp.emplace_back(p);
    views.emplace_back(dp.back().data, p.size());
  }
  const std::vector<float> start = gradzip_tools::synthetic_gradient<float>(n, 9);
  std::vector<float> want = start;  // payload by payload, each addition rounded
  for (const auto& p : payloads) c.decompress_add(host, gz::span<const std::byte>(p), gz::span<float>(want), 0.5f);
  device_vector<float> acc(start);
#if defined(GRADZIP_SIMT)
  // Each payload validated once: its checks before any addition, and not again in the additions.
  const std::uint64_t before_one = gradzip_simt::launches_of("validate_kernel<");
  device_vector<float> scratch(n);
  c.decompress_add(dev, views[0], scratch.view());
  dev.check();  // launches are counted as the stream runs them
  const std::uint64_t one = gradzip_simt::launches_of("validate_kernel<") - before_one;
  CHECK(one == 1);  // COO: each element's index and code, in one kernel
  const std::uint64_t before_all = gradzip_simt::launches_of("validate_kernel<");
#endif
  c.decompress_add_all(dev, gz::span<const gz::span<const std::byte>>(views), acc.view(), 0.5f);
  dev.check();
#if defined(GRADZIP_SIMT)
  CHECK(gradzip_simt::launches_of("validate_kernel<") - before_all == 3 * one);
  const std::uint64_t before_sum = gradzip_simt::launches_of("validate_kernel<");
  c.decompress_all(dev, gz::span<const gz::span<const std::byte>>(views), scratch.view());
  dev.check();
  CHECK(gradzip_simt::launches_of("validate_kernel<") - before_sum == 3 * one);
  std::vector<float> sum(n, 0.0f);
  for (const auto& p : payloads) c.decompress_add(host, gz::span<const std::byte>(p), gz::span<float>(sum));
  const auto got_sum = scratch.download();
  CHECK(output_difference(got_sum.data(), sum.data(), n) == "");
#endif
  std::vector<float> got = acc.download();
  CHECK(output_difference(got.data(), want.data(), n) == "");
  // The last payload bad: the first two must not have been added.
  auto bad = payloads[2];
  bad[0] = std::byte{'X'};
  device_vector<std::byte> dbad(bad);
  views[2] = gz::span<const std::byte>(dbad.data, bad.size());
  device_vector<float> untouched(start);
  c.decompress_add_all(dev, gz::span<const gz::span<const std::byte>>(views), untouched.view(), 0.5f);
  try {
    dev.check();
    FAIL("accepted a payload with a bad magic");
  } catch (const gz::format_error& e) {
    CHECK(e.code() == gz::wire::format_errc::bad_magic);
  }
  CHECK(untouched.download() == start);
}

namespace {
/// Whether a double is not a float: what a state or output computed in float would always be.
bool beyond_float(double v) { return v != static_cast<double>(static_cast<float>(v)); }
}  // namespace

/// Steps a host and a CUDA instance of one stateful wrapper (error feedback, momentum
/// correction, EF21) on the same gradients: each step's payloads must match byte for byte, and
/// `after(payload)` checks anything else a step does; then the saved states must match, and the
/// host's state must restore into a fresh CUDA instance.
template <class T = float, class Host, class Device, class Make, class After>
void expect_wrapper_parity(gz::host& host, gz::cuda& dev, Host& h, Device& d, std::size_t n, std::uint32_t salt,
                           Make make_device, After after) {
  std::vector<std::byte> hout(h.template max_compressed_bytes<T>());
  device_vector<std::byte> dout(hout.size());
  for (std::uint32_t step = 0; step < 4; ++step) {
    const auto g = gradzip_tools::synthetic_gradient<T>(n, salt + step);
    device_vector<T> dg(g);
    const auto hb = h.compress(host, gz::span<const T>(g), gz::span<std::byte>(hout));
    const auto db = d.compress(dev, gz::span<const T>(dg.data, n), dout.view());
    dev.check();
    INFO("step " << step);
    REQUIRE(hb == db);
    CHECK(dout.download(db) == std::vector<std::byte>(hout.begin(), hout.begin() + hb));
    after(gz::span<const std::byte>(hout.data(), hb));
  }
  const auto state = h.save(host);
  CHECK(d.save(dev) == state);
  auto restored = make_device(dev);
  restored.restore(dev, gz::span<const std::byte>(state));
  CHECK(restored.save(dev) == state);
}

TEST_CASE("cuda error feedback follows the host's step for step", "[gpu]") {
  REQUIRE_GPU();
  using codec_t = gz::codec<gz::sparsify::topk>;
  const std::size_t n = 100000;
  gz::cuda dev;
  gz::host host;
  const codec_t c{gz::sparsify::topk::ratio(0.01)};
  gz::feedback::error_feedback<codec_t, float, gz::host> h(host, c, n);
  gz::feedback::error_feedback<codec_t, float, gz::cuda> d(dev, c, n);
  expect_wrapper_parity(
      host, dev, h, d, n, 50, [&](gz::cuda& e) { return gz::feedback::error_feedback<codec_t, float, gz::cuda>(e, c, n); },
      [](gz::span<const std::byte>) {});
}

TEST_CASE("cuda momentum correction follows the host's step for step", "[gpu]") {
  REQUIRE_GPU();
  using codec_t = gz::codec<gz::sparsify::topk>;
  const std::size_t n = 50000;
  gz::cuda dev;
  gz::host host;
  const codec_t c{gz::sparsify::topk::ratio(0.01)};
  gz::feedback::momentum_correction<codec_t, float, gz::host> h(host, c, n, 0.9f);
  gz::feedback::momentum_correction<codec_t, float, gz::cuda> d(dev, c, n, 0.9f);
  expect_wrapper_parity(
      host, dev, h, d, n, 60,
      [&](gz::cuda& e) { return gz::feedback::momentum_correction<codec_t, float, gz::cuda>(e, c, n, 0.9f); },
      [](gz::span<const std::byte>) {});
  // Over double, both compute in double: in float, every value of v would be a float.
  gz::feedback::momentum_correction<codec_t, double, gz::host> hd(host, c, n, 0.9f);
  gz::feedback::momentum_correction<codec_t, double, gz::cuda> dd(dev, c, n, 0.9f);
  expect_wrapper_parity<double>(
      host, dev, hd, dd, n, 80,
      [&](gz::cuda& e) { return gz::feedback::momentum_correction<codec_t, double, gz::cuda>(e, c, n, 0.9f); },
      [](gz::span<const std::byte>) {});
  const auto v = hd.accumulated();
  CHECK(std::count_if(v.begin(), v.end(), beyond_float) > static_cast<std::ptrdiff_t>(n / 2));
}

TEST_CASE("cuda fused compressor follows the host's groups, state and decode", "[gpu]") {
  REQUIRE_GPU();
  using codec_t = gz::codec<gz::sparsify::topk>;
  const gz::fusion::layout l({3000, 17, 1, 20000, 0, 4096}, {0, 2, 3});
  gz::cuda dev;
  gz::host host;
  const codec_t c{gz::sparsify::topk::ratio(0.02)};
  for (const auto kept : {gz::fusion::state::error_feedback, gz::fusion::state::momentum_correction}) {
    gz::fusion::fused_compressor<codec_t, float, gz::host> h(host, c, l, kept);
    gz::fusion::fused_compressor<codec_t, float, gz::cuda> d(dev, c, l, kept);
    gz::fusion::flat_buffer<float, gz::cuda> grads(dev, l), dsum(dev, l);
    std::vector<float> hsum(l.total(), 0.0f);
    for (std::uint32_t step = 0; step < 3; ++step) {
      const auto g = gradzip_tools::synthetic_gradient<float>(l.total(), 90 + step);
      GRADZIP_CUDA_TRY(cudaMemcpy(grads.all().data(), g.data(), g.size() * sizeof(float), cudaMemcpyHostToDevice));
      for (std::size_t group = 0; group < l.group_count(); ++group) {
        std::vector<std::byte> hout(h.max_compressed_bytes(group));
        device_vector<std::byte> dout(hout.size());
        const auto hb = h.compress(host, group, gz::span<const float>(g), gz::span<std::byte>(hout), {step, 5});
        const auto db = d.compress(dev, group, gz::span<const float>(grads.all()), dout.view(), {step, 5});
        dev.check();
        INFO("step " << step << " group " << group);
        REQUIRE(hb == db);
        CHECK(dout.download(db) == std::vector<std::byte>(hout.begin(), hout.begin() + hb));
        h.decompress_add(host, group, gz::span<const std::byte>(hout.data(), hb), gz::span<float>(hsum), 0.5f);
        d.decompress_add(dev, group, gz::span<const std::byte>(dout.data, db), dsum.all(), 0.5f);
        dev.check();
      }
    }
    std::vector<float> back(l.total());
    GRADZIP_CUDA_TRY(cudaMemcpy(back.data(), dsum.all().data(), back.size() * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(back == hsum);
    CHECK(d.save(dev) == h.save(host));
  }
}

TEST_CASE("cuda EF21 follows the host's step for step", "[gpu]") {
  REQUIRE_GPU();
  using codec_t = gz::codec<gz::sparsify::topk>;
  const std::size_t n = 40000;
  gz::cuda dev;
  gz::host host;
  const codec_t c{gz::sparsify::topk::ratio(0.01)};
  gz::feedback::ef21<codec_t, float, gz::host> h(host, c, n);
  gz::feedback::ef21<codec_t, float, gz::cuda> d(dev, c, n);
  // Each step's average is that payload's decode, halved: apply adds it to g and hands g back.
  const auto apply_both = [&](gz::span<const std::byte> payload) {
    std::vector<float> average(n, 0.0f);
    c.decompress_add(host, payload, gz::span<float>(average), 0.5f);
    device_vector<float> daverage(average);
    h.apply(host, gz::span<float>(average));
    d.apply(dev, daverage.view());
    CHECK(daverage.download() == average);
  };
  expect_wrapper_parity(
      host, dev, h, d, n, 80, [&](gz::cuda& e) { return gz::feedback::ef21<codec_t, float, gz::cuda>(e, c, n); }, apply_both);
}

TEST_CASE("cuda signum and majority vote follow the host", "[gpu]") {
  REQUIRE_GPU();
  using sign_codec = gz::codec<gz::sparsify::none, gz::quantize::sign<false>, gz::encode::none>;
  const std::size_t n = 100003;
  gz::cuda dev;
  gz::host host;
  gz::feedback::signum<sign_codec, float, gz::host> h(host, sign_codec{}, n, 0.9f);
  gz::feedback::signum<sign_codec, float, gz::cuda> d(dev, sign_codec{}, n, 0.9f);
  std::vector<std::byte> hout(h.max_compressed_bytes<float>());
  device_vector<std::byte> dout(hout.size());
  std::vector<std::vector<std::byte>> host_payloads;
  for (std::uint32_t step = 0; step < 3; ++step) {
    const auto g = gradzip_tools::synthetic_gradient<float>(n, 70 + step);
    device_vector<float> dg(g);
    const auto hb = h.compress(host, gz::span<const float>(g), gz::span<std::byte>(hout));
    const auto db = d.compress(dev, gz::span<const float>(dg.data, n), dout.view());
    dev.check();
    REQUIRE(hb == db);
    const auto got = dout.download();
    CHECK(std::memcmp(got.data(), hout.data(), hb) == 0);
    host_payloads.push_back(std::vector<std::byte>(hout.begin(), hout.begin() + hb));
  }
  CHECK(h.save(host) == d.save(dev));
  // Majority vote over the three payloads, on each executor.
  std::vector<gz::span<const std::byte>> hv;
  std::vector<std::unique_ptr<device_vector<std::byte>>> staged;  // device_vector does not move
  std::vector<gz::span<const std::byte>> dv;
  for (const auto& p : host_payloads) {
    hv.emplace_back(p);
    staged.push_back(std::make_unique<device_vector<std::byte>>(p));
  }
  for (const auto& p : staged) dv.emplace_back(p->data, p->size);
  std::vector<float> expected(n);
  gz::quantize::majority_vote(host, sign_codec{}, gz::span<const gz::span<const std::byte>>(hv), gz::span<float>(expected));
  device_vector<float> vote(n);
  gz::quantize::majority_vote(dev, sign_codec{}, gz::span<const gz::span<const std::byte>>(dv), vote.view());
  dev.check();
  const auto got = vote.download();
  CHECK(output_difference(got.data(), expected.data(), n) == "");
  // A bad payload anywhere in the vote leaves the output as it was (every check runs first).
  device_vector<std::byte> zeros(std::vector<std::byte>(64));
  for (std::size_t bad_at : {std::size_t{0}, dv.size()}) {
    auto with_bad = dv;
    with_bad.insert(with_bad.begin() + static_cast<std::ptrdiff_t>(bad_at), gz::span<const std::byte>(zeros.data, zeros.size));
    device_vector<float> untouched(std::vector<float>(n, 42.0f));
    gz::quantize::majority_vote(dev, sign_codec{}, gz::span<const gz::span<const std::byte>>(with_bad), untouched.view());
    CHECK_THROWS_AS(dev.check(), gz::format_error);
    CHECK(untouched.download() == std::vector<float>(n, 42.0f));
  }
  // Over double, Signum's momentum is computed in double on both executors.
  gz::feedback::signum<sign_codec, double, gz::host> hd(host, sign_codec{}, n, 0.9f);
  gz::feedback::signum<sign_codec, double, gz::cuda> dd(dev, sign_codec{}, n, 0.9f);
  expect_wrapper_parity<double>(
      host, dev, hd, dd, n, 90,
      [&](gz::cuda& e) { return gz::feedback::signum<sign_codec, double, gz::cuda>(e, sign_codec{}, n, 0.9f); },
      [](gz::span<const std::byte>) {});
  const auto m = hd.momentum();
  CHECK(std::count_if(m.begin(), m.end(), beyond_float) > static_cast<std::ptrdiff_t>(n / 2));
}

TEST_CASE("cuda compress and decompress_add allocate nothing after reserve", "[gpu]") {
  REQUIRE_GPU();
  const std::size_t n = 1 << 20;
  const auto g = gradzip_tools::synthetic_gradient<float>(n, 1);
  const auto check = [&](const auto& c) {
    gz::cuda exec;
    exec.reserve(c.template workspace_bytes<float>(exec, n));
    const std::size_t capacity = exec.scratch_capacity();
    for (int step = 0; step < 2; ++step) {
      const auto payload = device_compress(c, exec, g);
      device_vector<std::byte> dp(payload);
      device_vector<float> acc{std::vector<float>(n)};  // initialized: decompress_add reads it
      c.decompress_add(exec, gz::span<const std::byte>(dp.data, payload.size()), acc.view());
      exec.check();
    }
    CHECK(exec.scratch_capacity() == capacity);
  };
  check(gz::codec<gz::sparsify::topk>{gz::sparsify::topk::ratio(0.01)});
  check(gz::codec<gz::sparsify::topk, gz::quantize::none, gz::encode::bitmap>{gz::sparsify::topk::ratio(0.01)});
  check(gz::codec<gz::sparsify::sampled_topk, gz::quantize::uniform<4>, gz::encode::automatic>{
      gz::sparsify::sampled_topk::ratio(0.3)});
}

// Not in an anonymous namespace: kernels instantiated over such a type have no dynamic symbol,
// so the SIMT backend cannot name them in its launch record (tools/check_kernels.py --launches).
namespace gradzip_test {

/// A stage derived from a built-in cast (as benchmarks/cuda_quantize.cu's `seeded` is): the
/// dense emit packs its codes like the cast's.
struct derived_fp8 : gz::quantize::cast_fp8_e5m2 {};

}  // namespace gradzip_test

TEST_CASE("cuda dense and cast codecs equal the host's bytes and decode alike", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  gz::host host;
  using dense_fp16 = gz::codec<gz::sparsify::none, gz::quantize::cast_fp16, gz::encode::none>;
  using dense_bf16 = gz::codec<gz::sparsify::none, gz::quantize::cast_bf16, gz::encode::none>;
  using dense_raw = gz::codec<gz::sparsify::none, gz::quantize::none, gz::encode::none>;
  using topk_fp16 = gz::codec<gz::sparsify::topk, gz::quantize::cast_fp16, gz::encode::coo>;
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{1} << 20}) {
    auto g = gradzip_tools::synthetic_gradient<float>(n, 21);
    g[0] = 1e6f;  // fp16 overflow
    check_parity(g, dense_fp16{}, dev);
    check_parity(g, dense_bf16{}, dev);
    check_parity(g, dense_raw{}, dev);
    check_parity(converted<double>(g), dense_raw{}, dev);
    check_parity(converted<__half>(g), gz::codec<gz::sparsify::none, gradzip_test::derived_fp8, gz::encode::none>{}, dev);
    check_parity(converted<__half>(g), dense_bf16{}, dev);
    check_parity(g, topk_fp16{gz::sparsify::topk::ratio(0.01)}, dev);
    check_parity(converted<__nv_bfloat16>(g), dense_fp16{}, dev);
    check_parity(g, gz::codec<gz::sparsify::none, gz::quantize::cast_fp8_e4m3, gz::encode::none>{}, dev);
    check_parity(g, gz::codec<gz::sparsify::none, gz::quantize::cast_fp8_e5m2, gz::encode::none>{}, dev);
    check_parity(g, gz::codec<gz::sparsify::topk, gz::quantize::cast_fp8_e4m3>{gz::sparsify::topk::ratio(0.01)}, dev);
    check_parity(g, topk_fp16{gz::sparsify::topk::count(0)}, dev);  // the frame alone
    check_parity(g, gz::codec<gz::sparsify::topk, gz::quantize::cast_fp8_e4m3>{gz::sparsify::topk::count(0)}, dev);
    check_parity(g, gz::codec<gz::sparsify::randomk, gz::quantize::none, gz::encode::none>{
                        gz::sparsify::randomk::ratio(0.01, 5)}, dev);
    check_parity(g, gz::codec<gz::sparsify::threshold>{gz::sparsify::threshold{0.01}}, dev);
    check_parity(g, gz::codec<gz::sparsify::blockwise_topk>{gz::sparsify::blockwise_topk{1024, 10}}, dev);
    check_parity(converted<double>(g), gz::codec<gz::sparsify::blockwise_topk>{gz::sparsify::blockwise_topk{4096, 41}}, dev);
    check_parity(converted<__nv_bfloat16>(g), gz::codec<gz::sparsify::blockwise_topk, gz::quantize::qsgd<7>>{
                        gz::sparsify::blockwise_topk{100, 3}, gz::quantize::qsgd<7>{3}}, dev);
    check_parity(g, gz::codec<gz::sparsify::threshold, gz::quantize::uniform<4>>{gz::sparsify::threshold{0.001}}, dev);
    check_parity(converted<__nv_bfloat16>(g), gz::codec<gz::sparsify::threshold>{gz::sparsify::threshold{0.005}}, dev);
    check_parity(converted<double>(g), gz::codec<gz::sparsify::threshold>{gz::sparsify::threshold{0.0}}, dev);
    check_parity(g, gz::codec<gz::sparsify::randomk, gz::quantize::cast_bf16, gz::encode::none>{
                        gz::sparsify::randomk::count(1, 5)}, dev);
    // Decode on the device equals decode on the host.
    check_decode_parity(dense_bf16{}, test::compress(dense_bf16{}, host, g), n, dev);
  }
}

TEST_CASE("cuda bucketed quantizers over random-k values equal the host's bytes and decode", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  gz::host host;
  using s2 = gz::quantize::uniform<2, gz::quantize::rounding::stochastic>;
  using rk_s2 = gz::codec<gz::sparsify::randomk, s2, gz::encode::none>;
  using rk_q = gz::codec<gz::sparsify::randomk, gz::quantize::qsgd<7>, gz::encode::none>;
  for (std::size_t n : {std::size_t{1}, std::size_t{5000}, std::size_t{1} << 20}) {
    const auto g = gradzip_tools::synthetic_gradient<float>(n, 43);
    const rk_s2 c{gz::sparsify::randomk::ratio(0.01, 5), s2{9}};
    check_parity(g, c, dev);
    check_parity(g, rk_q{gz::sparsify::randomk::ratio(0.05, 6), gz::quantize::qsgd<7>{4}}, dev);
    check_decode_parity(c, test::compress(c, host, g), n, dev);
  }
}

TEST_CASE("cuda bucketed quantizers equal the host's bytes", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  gz::host host;
  using q4 = gz::quantize::uniform<4>;
  using s2 = gz::quantize::uniform<2, gz::quantize::rounding::stochastic>;
  using q8 = gz::quantize::uniform<8, gz::quantize::rounding::nearest, 128>;
  const gz::codec<gz::sparsify::none, s2, gz::encode::none> stochastic{{}, s2{31}};
  for (std::size_t n : {std::size_t{1}, std::size_t{513}, std::size_t{100003}, std::size_t{1} << 21}) {
    auto g = gradzip_tools::synthetic_gradient<float>(n, 33);
    if (n > 600) g[600] = std::numeric_limits<float>::quiet_NaN();  // a poisoned bucket
    check_parity(g, gz::codec<gz::sparsify::none, q4, gz::encode::none>{}, dev);
    check_parity(g, gz::codec<gz::sparsify::none, q8, gz::encode::none>{}, dev);
    check_parity(g, gz::codec<gz::sparsify::topk, q4, gz::encode::coo>{gz::sparsify::topk::ratio(0.01)}, dev);
    check_parity(converted<__nv_bfloat16>(g), gz::codec<gz::sparsify::none, q4, gz::encode::none>{}, dev);
    check_parity(g, gz::codec<gz::sparsify::none, gz::quantize::scaled_sign, gz::encode::none>{}, dev);
    check_parity(g, gz::codec<gz::sparsify::none, gz::quantize::sign<false>, gz::encode::none>{}, dev);
    check_parity(g, gz::codec<gz::sparsify::none, gz::quantize::qsgd<7>, gz::encode::none>{{}, gz::quantize::qsgd<7>{9}}, dev);
    check_parity(g, gz::codec<gz::sparsify::topk, gz::quantize::qsgd<127>, gz::encode::coo>{
                        gz::sparsify::topk::ratio(0.01), gz::quantize::qsgd<127>{4}}, dev);
    check_parity(g, gz::codec<gz::sparsify::none, gz::quantize::terngrad<true>, gz::encode::none>{
                        {}, gz::quantize::terngrad<true>{6}}, dev);
    // Without clipping TernGrad gathers no sums (its statistics are max |v| and the flag).
    check_parity(g, gz::codec<gz::sparsify::none, gz::quantize::terngrad<false>, gz::encode::none>{
                        {}, gz::quantize::terngrad<false>{7}}, dev);
    check_parity(g, gz::codec<gz::sparsify::none, gz::quantize::onebit<>, gz::encode::none>{}, dev);
    check_parity(g, gz::codec<gz::sparsify::none, gz::quantize::natural<8>, gz::encode::none>{
                        {}, gz::quantize::natural<8>{12}}, dev);
    check_parity(g, gz::codec<gz::sparsify::topk, gz::quantize::natural<9>>{
                        gz::sparsify::topk::ratio(0.01), gz::quantize::natural<9>{12}}, dev);
    // Stochastic rounding keyed by (seed, step, tensor, index): same bytes on both executors.
    std::vector<std::byte> expected(stochastic.max_compressed_bytes<float>(n));
    expected.resize(stochastic.compress(host, gz::span<const float>(g), gz::span<std::byte>(expected), {5, 2}));
    device_vector<float> dx(g);
    device_vector<std::byte> out(expected.size());
    stochastic.compress(dev, gz::span<const float>(dx.data, n), out.view(), {5, 2});
    dev.synchronize();
    const auto got = out.download();
    CHECK(std::memcmp(got.data(), expected.data(), expected.size()) == 0);
    // And the device decodes what the host encoded, to the same floats.
    check_decode_parity(stochastic, expected, n, dev);
  }
}

TEST_CASE("cuda natural compression takes its in-range encode and decode, with the host's bytes and floats", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  // A warp step (256 values) takes `encode_in_range` only where every value is 0 or at least
  // the bucket's 2^lowest: here steps with a value below the range, a subnormal, or a lane of a
  // shared warp (buckets of 64) whose bucket has one, beside steps that qualify; bf16 too.
  std::vector<float> g(3000);
  for (std::size_t i = 0; i < g.size(); ++i) {
    g[i] = std::ldexp((i % 2 ? -1.0f : 1.0f) * (1.0f + static_cast<float>(i % 13) / 16), -static_cast<int>(i % 70));
  }
  g[20] = std::ldexp(1.5f, -138);      // below 2^lowest: 2^(1 - 127 + 1) in its bucket of 512, 2^(0 - 127 + 1) of 64
  g[700] = std::ldexp(1.25f, -146);    // subnormal
  g[1300] = 0.0f;
  g[2100] = -std::ldexp(1.0f, -131);
  g[2999] = std::ldexp(1.0f, 60);      // the last bucket's range starts at 2^-66
  using n8 = gz::quantize::natural<8>;
  using n8_64 = gz::quantize::natural<8, 64>;
  using n9 = gz::quantize::natural<9, 128>;
  const gz::codec<gz::sparsify::none, n8, gz::encode::none> c8{{}, n8{3}};
  const gz::codec<gz::sparsify::none, n8_64, gz::encode::none> c8_64{{}, n8_64{4}};
  const gz::codec<gz::sparsify::none, n9, gz::encode::none> c9{{}, n9{5}};
  check_parity(g, c8, dev);
  check_parity(g, c8_64, dev);
  check_parity(g, c9, dev);
  check_parity(converted<__nv_bfloat16>(g), gz::codec<gz::sparsify::none, n8, gz::encode::none>{{}, n8{6}}, dev);
  // And the decode, whose run of 8 takes `decode_in_range` where its codes all decode to normal
  // floats: natural<9>'s codes for g[20], g[700] and g[2100] decode to subnormals, the others'
  // do not.
  gz::host host;
  check_decode_parity(c8, test::compress(c8, host, g), g.size(), dev);
  check_decode_parity(c8_64, test::compress(c8_64, host, g), g.size(), dev);
  check_decode_parity(c9, test::compress(c9, host, g), g.size(), dev);
}

/// The device's bytes and its decode of the host's payload, for uniform quantization at width Bits.
template <int Bits>
void check_width(const std::vector<float>& g, gz::cuda& dev) {
  const gz::codec<gz::sparsify::none, gz::quantize::uniform<Bits>, gz::encode::none> c{};
  INFO(Bits << " bits");
  check_parity(g, c, dev);
  gz::host host;
  check_decode_parity(c, test::compress(c, host, g), g.size(), dev);
}

template <int... Bits>
void check_every_width(const std::vector<float>& g, gz::cuda& dev) {
  (check_width<Bits>(g, dev), ...);
}

TEST_CASE("cuda dense codes of every width give the host's bit planes, and decode them", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  // A lane's eight codes become their planes' bytes by a bit transpose (3 to 8 bits), by planes
  // of bits otherwise; the four lanes of a group then exchange bytes. A decode's run transposes
  // back. Widths 2, 4 and 8 are above.
  for (std::size_t n : {std::size_t{7}, std::size_t{300}, std::size_t{5003}}) {
    const auto g = gradzip_tools::synthetic_gradient<float>(n, 41);
    check_every_width<1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16>(g, dev);
  }
}

/// The device's decompress and decompress_add (onto a nonzero accumulator) of the host's QSGD
/// payload equal the host's floats.
template <class Q>
void check_qsgd_decode(const std::vector<float>& g, gz::cuda& dev) {
  const gz::codec<gz::sparsify::none, Q, gz::encode::none> c{{}, Q{3}};
  gz::host host;
  const auto payload = test::compress(c, host, g);
  check_decode_parity(c, payload, g.size(), dev);
  std::vector<float> acc(g.size());
  for (std::size_t i = 0; i < acc.size(); ++i) acc[i] = 0.5f - static_cast<float>(i % 7);
  check_decompress_add_parity(c, payload, acc, dev);
}

TEST_CASE("cuda QSGD decodes by table where a bucket's lanes hold its codes, to the host's floats", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  // By table: 4-bit codes in buckets of 128 (two buckets of 16 lanes per warp) or 512, 3-bit
  // codes; per element: buckets of 64 (8 lanes for 16 codes) and 5-bit codes. Levels 5 has codes
  // a payload may not hold (checked before the apply). Sizes end mid-bucket and mid-warp; a NaN
  // poisons a bucket.
  for (std::size_t n : {std::size_t{1}, std::size_t{100}, std::size_t{255}, std::size_t{257}, std::size_t{4099},
                        std::size_t{70001}}) {
    auto g = gradzip_tools::synthetic_gradient<float>(n, 29);
    if (n > 300) g[200] = std::numeric_limits<float>::quiet_NaN();
    INFO("n = " << n);
    check_qsgd_decode<gz::quantize::qsgd<7>>(g, dev);
    check_qsgd_decode<gz::quantize::qsgd<3>>(g, dev);
    check_qsgd_decode<gz::quantize::qsgd<5>>(g, dev);
    check_qsgd_decode<gz::quantize::qsgd<7, 512>>(g, dev);
    check_qsgd_decode<gz::quantize::qsgd<7, 64>>(g, dev);
    check_qsgd_decode<gz::quantize::qsgd<15>>(g, dev);
  }
  static_assert(gz::detail::decodes_by_table<gz::codec<gz::sparsify::none, gz::quantize::qsgd<7>, gz::encode::none>>);
  static_assert(gz::detail::decodes_by_table<gz::codec<gz::sparsify::none, gz::quantize::qsgd<7, 512>, gz::encode::none>>);
  static_assert(!gz::detail::decodes_by_table<gz::codec<gz::sparsify::none, gz::quantize::qsgd<7, 64>, gz::encode::none>>);
  static_assert(!gz::detail::decodes_by_table<gz::codec<gz::sparsify::none, gz::quantize::qsgd<15>, gz::encode::none>>);
  static_assert(!gz::detail::decodes_by_table<gz::codec<gz::sparsify::none, gz::quantize::uniform<4>, gz::encode::none>>);
}

TEST_CASE("cuda buckets under 256 elements share a warp and give the host's bytes", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  // A warp takes 256 / B buckets per step where B divides 256 (2 of QSGD's 128, 8 of 32): its
  // lanes play the canonical order's 32 lanes of each. Sizes end mid-bucket and mid-step; a NaN
  // poisons one bucket and an infinity another, next to clean buckets of the same step.
  using gz::quantize::rounding;
  for (std::size_t n : {std::size_t{1}, std::size_t{31}, std::size_t{100}, std::size_t{255}, std::size_t{257},
                        std::size_t{4099}, std::size_t{70001}}) {
    auto g = gradzip_tools::synthetic_gradient<float>(n, 23);
    if (n > 300) {
      g[97] = std::numeric_limits<float>::quiet_NaN();
      g[n - 40] = -std::numeric_limits<float>::infinity();
    }
    check_parity(g, gz::codec<gz::sparsify::none, gz::quantize::qsgd<15>, gz::encode::none>{{}, gz::quantize::qsgd<15>{3}}, dev);
    check_parity(g, gz::codec<gz::sparsify::none, gz::quantize::qsgd<7, 64>, gz::encode::none>{{}, gz::quantize::qsgd<7, 64>{5}},
                 dev);
    using s4 = gz::quantize::uniform<4, rounding::stochastic, 32>;
    check_parity(g, gz::codec<gz::sparsify::none, s4, gz::encode::none>{{}, s4{7}}, dev);
    check_parity(converted<__nv_bfloat16>(g), gz::codec<gz::sparsify::none, s4, gz::encode::none>{{}, s4{7}}, dev);
    using t64 = gz::quantize::terngrad<false, 64>;
    check_parity(g, gz::codec<gz::sparsify::none, t64, gz::encode::none>{{}, t64{2}}, dev);
    // 16-bit inputs: the host finds these stages' extrema on the bits, the device by floats.
    check_parity(converted<__nv_bfloat16>(g), gz::codec<gz::sparsify::none, t64, gz::encode::none>{{}, t64{2}}, dev);
    check_parity(converted<__half>(g), gz::codec<gz::sparsify::none, s4, gz::encode::none>{{}, s4{7}}, dev);
    check_parity(g, gz::codec<gz::sparsify::none, gz::quantize::onebit<32>, gz::encode::none>{}, dev);
    check_parity(g, gz::codec<gz::sparsify::none, gz::quantize::sign<true, 128>, gz::encode::none>{}, dev);
    check_parity(g, gz::codec<gz::sparsify::none, gz::quantize::uniform<2, rounding::nearest, 256>, gz::encode::none>{}, dev);
    // 96 does not divide 256: a warp per bucket, as before.
    check_parity(g, gz::codec<gz::sparsify::none, gz::quantize::qsgd<7, 96>, gz::encode::none>{{}, gz::quantize::qsgd<7, 96>{5}},
                 dev);
  }
}

TEST_CASE("cuda 16-byte loads and their scalar fallback give the host's bytes (unaligned spans)", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  gz::host host;
  // A span that starts one element into an allocation is not 16-byte aligned: every run of 8
  // takes the scalar path; the aligned spans of the other tests take the vector one.
  const auto unaligned = [&](const auto& c, const auto& x) {
    using T = typename std::decay_t<decltype(x)>::value_type;
    std::vector<T> padded(x.size() + 1);
    std::copy(x.begin(), x.end(), padded.begin() + 1);
    device_vector<T> dx(padded);
    const auto expected = test::compress(c, host, x);
    device_vector<std::byte> out(c.template max_compressed_bytes<T>(x.size()));
    const std::size_t bytes = c.compress(dev, gz::span<const T>(dx.data + 1, x.size()), out.view());
    dev.synchronize();
    INFO("n = " << x.size() << ", element bytes " << sizeof(T));
    CHECK(out.download(bytes) == expected);
  };
  using q4 = gz::quantize::uniform<4>;
  using s2 = gz::quantize::uniform<2, gz::quantize::rounding::stochastic>;
  for (std::size_t n : {std::size_t{9}, std::size_t{4099}, std::size_t{70001}}) {
    const auto g = gradzip_tools::synthetic_gradient<float>(n, 61);
    unaligned(gz::codec<gz::sparsify::none, q4, gz::encode::none>{}, g);
    unaligned(gz::codec<gz::sparsify::none, s2, gz::encode::none>{{}, s2{3}}, g);
    unaligned(gz::codec<gz::sparsify::none, q4, gz::encode::none>{}, converted<__half>(g));
    unaligned(gz::codec<gz::sparsify::none, q4, gz::encode::none>{}, converted<double>(g));
    unaligned(gz::codec<gz::sparsify::none, gz::quantize::cast_fp16, gz::encode::none>{}, g);
    unaligned(gz::codec<gz::sparsify::none, gz::quantize::cast_fp8_e4m3, gz::encode::none>{}, converted<__nv_bfloat16>(g));
    unaligned(gz::codec<gz::sparsify::none, gz::quantize::none, gz::encode::none>{}, converted<double>(g));
    unaligned(gz::codec<gz::sparsify::threshold>{gz::sparsify::threshold{0.01}}, g);
    check_parity(g, gz::codec<gz::sparsify::threshold>{gz::sparsify::threshold{0.01}}, dev);  // tiles cut mid-run
    unaligned(gz::codec<gz::sparsify::sampled_topk>{gz::sparsify::sampled_topk::ratio(0.01)}, converted<double>(g));
    unaligned(gz::codec<gz::hash::hashed_topk>{gz::hash::hashed_topk::ratio(0.01)}, g);
    unaligned(gz::codec<gz::sparsify::topk>{gz::sparsify::topk::ratio(0.01)}, g);
    unaligned(gz::codec<gz::sparsify::topk>{gz::sparsify::topk::ratio(0.3)}, converted<__nv_bfloat16>(g));
    unaligned(gz::codec<gz::sparsify::topk>{gz::sparsify::topk::ratio(0.01)}, converted<double>(g));
    unaligned(gz::codec<gz::sparsify::threshold, gz::quantize::uniform<4>>{gz::sparsify::threshold{0.002}}, converted<__half>(g));
    check_sketch_parity(gz::sketch::count_sketch{3, 97, 4}, g, dev, 1);
  }
}

namespace {

/// The device decodes `payload` into an output of T that starts `offset` elements into its
/// allocation (offset 1: not 16-byte aligned, the dense apply's scalar path) exactly as the host
/// does: decompress_add at alpha 1 and 0.375, and decompress; the element before the span is
/// left alone.
template <class T, class Codec>
void check_decode_modes(const Codec& c, const std::vector<std::byte>& payload, std::size_t n, std::size_t offset,
                        gz::cuda& dev) {
  gz::host host;
  auto start = converted<T>(gradzip_tools::synthetic_gradient<float>(n, 78));
  if (n > 5) start[5] = gz::from_double<T>(-0.0);
  std::vector<T> padded(offset + n, gz::from_double<T>(7.0));
  std::copy(start.begin(), start.end(), padded.begin() + static_cast<std::ptrdiff_t>(offset));
  device_vector<std::byte> dp(payload);
  const gz::span<const std::byte> on_device(dp.data, payload.size());
  struct mode {
    const char* name;
    bool overwrite;  // decompress
    float alpha;
  };
  for (const mode m : {mode{"decompress_add", false, 1.0f}, mode{"decompress_add", false, 0.375f},
                       mode{"decompress", true, 1.0f}}) {
    INFO(m.name << ", alpha " << m.alpha << ", n = " << n << ", output bytes " << sizeof(T) << ", offset " << offset);
    std::vector<T> expected = start;
    device_vector<T> dy(padded);
    const gz::span<T> out(dy.data + offset, n);
    if (m.overwrite) {
      c.decompress(host, gz::span<const std::byte>(payload), gz::span<T>(expected));
      c.decompress(dev, on_device, out);
    } else {
      c.decompress_add(host, gz::span<const std::byte>(payload), gz::span<T>(expected), m.alpha);
      c.decompress_add(dev, on_device, out, m.alpha);
    }
    dev.check();
    const auto got = dy.download();
    CHECK(output_difference(got.data() + offset, expected.data(), n) == "");
    CHECK(std::memcmp(got.data(), padded.data(), offset * sizeof(T)) == 0);
  }
}

/// Every output type and both alignments.
template <class Codec>
void check_decode_all_outputs(const Codec& c, const std::vector<std::byte>& payload, std::size_t n, gz::cuda& dev) {
  for (std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
    check_decode_modes<float>(c, payload, n, offset, dev);
    check_decode_modes<double>(c, payload, n, offset, dev);
    check_decode_modes<__half>(c, payload, n, offset, dev);
    check_decode_modes<__nv_bfloat16>(c, payload, n, offset, dev);
  }
}

}  // namespace

TEST_CASE("cuda decode equals the host's for every values stage, output type, alignment and mode", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  gz::host host;
  using dense_raw = gz::codec<gz::sparsify::none, gz::quantize::none, gz::encode::none>;
  using s2 = gz::quantize::uniform<2, gz::quantize::rounding::stochastic>;
  using q8 = gz::quantize::uniform<8, gz::quantize::rounding::nearest, 128>;
  // Sizes that end inside a run of 8, inside a group of 32, and on a whole run.
  for (std::size_t n : {std::size_t{13}, std::size_t{4099}, std::size_t{4096}}) {
    auto g = gradzip_tools::synthetic_gradient<float>(n, 79);
    g[3] = -0.0f;
    g[7] = 1e-41f;  // subnormal
    if (n > 1000) g[1000] = std::numeric_limits<float>::infinity();  // a poisoned bucket
    const auto all_outputs = [&](const auto& c, const auto& x) {
      check_decode_all_outputs(c, test::compress(c, host, x), n, dev);
    };
    const auto float_output = [&](const auto& c) {
      const auto payload = test::compress(c, host, g);
      check_decode_modes<float>(c, payload, n, 0, dev);
      check_decode_modes<float>(c, payload, n, 1, dev);
    };
    // Element-wise values of every wire type.
    all_outputs(dense_raw{}, g);
    all_outputs(dense_raw{}, converted<double>(g));
    float_output(dense_raw{});
    check_decode_modes<double>(dense_raw{}, test::compress(dense_raw{}, host, converted<__half>(g)), n, 1, dev);
    check_decode_modes<float>(dense_raw{}, test::compress(dense_raw{}, host, converted<__nv_bfloat16>(g)), n, 0, dev);
    all_outputs(gz::codec<gz::sparsify::none, gz::quantize::cast_fp16, gz::encode::none>{}, g);
    float_output(gz::codec<gz::sparsify::none, gz::quantize::cast_bf16, gz::encode::none>{});
    float_output(gz::codec<gz::sparsify::none, gz::quantize::cast_fp8_e4m3, gz::encode::none>{});
    // Bucketed values: the dense apply decodes a run of 8 from the group's planes.
    all_outputs(gz::codec<gz::sparsify::none, gz::quantize::uniform<4>, gz::encode::none>{}, g);
    float_output(gz::codec<gz::sparsify::none, q8, gz::encode::none>{});
    float_output(gz::codec<gz::sparsify::none, s2, gz::encode::none>{{}, s2{5}});
    float_output(gz::codec<gz::sparsify::none, gz::quantize::qsgd<7>, gz::encode::none>{{}, gz::quantize::qsgd<7>{9}});
    float_output(gz::codec<gz::sparsify::none, gz::quantize::scaled_sign, gz::encode::none>{});
    float_output(gz::codec<gz::sparsify::none, gz::quantize::onebit<>, gz::encode::none>{});
    float_output(gz::codec<gz::sparsify::none, gz::quantize::natural<8>, gz::encode::none>{{}, gz::quantize::natural<8>{12}});
    float_output(gz::codec<gz::sparsify::none, gz::quantize::terngrad<true>, gz::encode::none>{{}, gz::quantize::terngrad<true>{6}});
    // Sparse payloads: COO, implicit, bitmap and delta-varint indices.
    all_outputs(gz::codec<gz::sparsify::topk>{gz::sparsify::topk::ratio(0.05)}, g);
    float_output(gz::codec<gz::sparsify::topk, gz::quantize::uniform<4>>{gz::sparsify::topk::ratio(0.05)});
    all_outputs(gz::codec<gz::sparsify::randomk, gz::quantize::none, gz::encode::none>{gz::sparsify::randomk::ratio(0.05, 3)}, g);
    float_output(gz::codec<gz::sparsify::randomk, gz::quantize::qsgd<7>, gz::encode::none>{
        gz::sparsify::randomk::ratio(0.05, 4), gz::quantize::qsgd<7>{2}});
    all_outputs(gz::codec<gz::sparsify::topk, gz::quantize::none, gz::encode::bitmap>{gz::sparsify::topk::ratio(0.2)}, g);
    float_output(gz::codec<gz::sparsify::topk, gz::quantize::cast_fp16, gz::encode::delta_varint>{gz::sparsify::topk::ratio(0.01)});
  }
}

TEST_CASE("cuda runs values stages written outside the library to the host's bytes", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  gz::host host;
  using log4 = example::log_scale4;
  using sbf16 = example::stochastic_bf16;
  const gz::codec<gz::sparsify::none, log4, gz::encode::none> dense_log4;
  const gz::codec<gz::sparsify::topk, log4> topk_log4{gz::sparsify::topk::ratio(0.05)};
  const gz::codec<gz::sparsify::none, sbf16, gz::encode::none> dense_sbf16{{}, sbf16{3}};
  const gz::codec<gz::sparsify::topk, sbf16> topk_sbf16{gz::sparsify::topk::ratio(0.05), sbf16{3}};
  for (std::size_t n : {std::size_t{1}, std::size_t{300}, std::size_t{70001}}) {
    auto g = gradzip_tools::synthetic_gradient<float>(n, 44);
    if (n > 200) g[200] = std::numeric_limits<float>::quiet_NaN();
    check_parity(g, dense_log4, dev);
    check_parity(g, topk_log4, dev);
    check_parity(g, gz::codec<gz::sparsify::topk, sbf16>{gz::sparsify::topk::count(0), sbf16{3}}, dev);  // frame only
    // The executors encode through a stage's encoder, unless it is inherited beside the stage's encode.
    check_parity(g, gz::codec<gz::sparsify::none, gradzip_test::top_level_uniform, gz::encode::none>{}, dev);
    check_parity(g, gz::codec<gz::sparsify::topk, gradzip_test::top_level_uniform>{gz::sparsify::topk::ratio(0.05)}, dev);
    check_parity(g, gz::codec<gz::sparsify::none, gradzip_test::bottom_level_uniform, gz::encode::none>{}, dev);
    check_parity(g, gz::codec<gz::sparsify::topk, gradzip_test::bottom_level_uniform>{gz::sparsify::topk::ratio(0.05)}, dev);
    // Natural compression's fast paths, likewise, unless a derived stage wrote its own encode or decode
    // (as nvcc's front end sees the traits; tests/host/test_custom_stages.cpp asserts them for g++).
    static_assert(gz::detail::has_in_range_encode<gz::quantize::natural<8>> &&
                  gz::detail::has_in_range_decode<gz::quantize::natural<8>>);
    static_assert(!gz::detail::has_in_range_encode<gradzip_test::zero_natural> &&
                  gz::detail::has_in_range_decode<gradzip_test::zero_natural>);
    static_assert(gz::detail::has_in_range_encode<gradzip_test::half_natural> &&
                  !gz::detail::has_in_range_decode<gradzip_test::half_natural>);
    check_parity(g, gz::codec<gz::sparsify::none, gradzip_test::zero_natural, gz::encode::none>{{}, gradzip_test::zero_natural{5}}, dev);
    const gz::codec<gz::sparsify::none, gradzip_test::half_natural, gz::encode::none> half_natural{{}, gradzip_test::half_natural{5}};
    check_parity(g, half_natural, dev);
    check_decode_parity(half_natural, test::compress(half_natural, host, g), n, dev);
    check_decode_parity(dense_log4, test::compress(dense_log4, host, g), n, dev);
    // A stochastic element-wise stage: each element's word keyed by (seed, step, tensor, index).
    for (const gz::quantize::compress_context ctx : {gz::quantize::compress_context{0, 0}, {9, 2}}) {
      for (const bool sparse : {false, true}) {
        const auto expected = sparse ? test::compress(topk_sbf16, host, g, ctx) : test::compress(dense_sbf16, host, g, ctx);
        device_vector<float> dx(g);
        device_vector<std::byte> out(expected.size());
        const std::size_t bytes = sparse ? topk_sbf16.compress(dev, gz::span<const float>(dx.data, n), out.view(), ctx)
                                         : dense_sbf16.compress(dev, gz::span<const float>(dx.data, n), out.view(), ctx);
        dev.synchronize();
        INFO("n = " << n << ", step " << ctx.step << (sparse ? ", top-k" : ", dense"));
        REQUIRE(bytes == expected.size());
        CHECK(out.download(bytes) == expected);
      }
    }
  }
}

namespace {

/// Host and device compress to the same bytes, and each decodes the other's payload alike.
template <class Codec>
void check_encoding_parity(const Codec& c, std::size_t n, std::uint64_t seed) {
  gz::cuda dev;
  gz::host host;
  const auto x = gradzip_tools::synthetic_gradient<float>(n, seed);
  const auto expected = test::compress(c, host, x);
  const auto got = device_compress(c, dev, x);
  REQUIRE(got.size() == expected.size());
  CHECK(std::memcmp(got.data(), expected.data(), got.size()) == 0);
  check_decompress_add_parity(c, expected, gradzip_tools::synthetic_gradient<float>(n, seed + 1), dev, 0.5f);
}

}  // namespace

TEST_CASE("cuda bitmap delta-varint and automatic encodings equal the host's bytes", "[gpu]") {
  REQUIRE_GPU();
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{1} << 20}) {
    for (double ratio : {0.001, 0.01, 0.3, 1.0}) {
      INFO("n = " << n << ", ratio " << ratio);
      const auto s = gz::sparsify::topk::ratio(ratio);
      check_encoding_parity(gz::codec<gz::sparsify::topk, gz::quantize::none, gz::encode::bitmap>{s}, n, 40);
      check_encoding_parity(gz::codec<gz::sparsify::topk, gz::quantize::none, gz::encode::delta_varint>{s}, n, 41);
      check_encoding_parity(gz::codec<gz::sparsify::topk, gz::quantize::none, gz::encode::automatic>{s}, n, 42);
      check_encoding_parity(gz::codec<gz::sparsify::topk, gz::quantize::uniform<4>, gz::encode::automatic>{s}, n, 43);
    }
  }
  check_encoding_parity(gz::codec<gz::sparsify::threshold, gz::quantize::none, gz::encode::bitmap>{
                            gz::sparsify::threshold{0.01}}, 1 << 20, 44);
}

TEST_CASE("cuda rejects malformed bitmap and delta-varint payloads", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  gz::host host;
  const std::size_t n = 5000;
  const auto x = gradzip_tools::synthetic_gradient<float>(n, 45);
  const auto reject = [&](const auto& c, const std::vector<std::byte>& payload, gz::wire::format_errc code) {
    device_vector<std::byte> dp(payload);
    device_vector<float> acc(std::vector<float>(n, 1.0f));
    c.decompress_add(dev, gz::span<const std::byte>(dp.data, payload.size()), acc.view());
    try {
      dev.check();
      FAIL("accepted");
    } catch (const gz::format_error& e) {
      CHECK(e.code() == code);
    }
    CHECK(acc.download() == std::vector<float>(n, 1.0f));
  };
  const gz::codec<gz::sparsify::topk, gz::quantize::none, gz::encode::bitmap> bitmap{gz::sparsify::topk::count(100)};
  auto p = test::compress(bitmap, host, x);
  const auto at = gz::wire::read_header(gz::span<const std::byte>(p)).sections[1].offset;
  p[at + n / 8] |= std::byte{0x80};  // bit n + 3 of 5000: past n
  reject(bitmap, p, gz::wire::format_errc::bitmap_bit_past_end);
  p = test::compress(bitmap, host, x);
  p[at] ^= std::byte{0x01};  // one bit more or fewer than the count
  reject(bitmap, p, gz::wire::format_errc::bitmap_count_mismatch);

  const gz::codec<gz::sparsify::topk, gz::quantize::none, gz::encode::delta_varint> delta{gz::sparsify::topk::count(100)};
  p = test::compress(delta, host, x);
  const auto dat = gz::wire::read_header(gz::span<const std::byte>(p)).sections[1].offset;
  p[dat] = std::byte{1};  // chunk 0's base must be 0
  reject(delta, p, gz::wire::format_errc::bad_chunk_table);
}

TEST_CASE("cuda sampled top-k equals the host's bytes", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  for (std::size_t n : {std::size_t{1}, std::size_t{5000}, std::size_t{1} << 20, std::size_t{3} << 20}) {
    const auto x = gradzip_tools::synthetic_gradient<float>(n, 50);
    for (double ratio : {0.001, 0.01, 0.1}) {
      INFO("n = " << n << ", ratio " << ratio);
      const gz::codec<gz::sparsify::sampled_topk> c{gz::sparsify::sampled_topk::ratio(ratio)};
      check_parity(x, c, dev);
      check_parity(converted<double>(x), c, dev);
      check_parity(converted<__nv_bfloat16>(x), c, dev);
    }
  }
  std::vector<float> ties(100000, 0.5f);  // the tie fallback
  for (std::size_t i = 0; i < 100; ++i) ties[i * 1000] = 2.0f;
  check_parity(ties, gz::codec<gz::sparsify::sampled_topk>{gz::sparsify::sampled_topk::count(1000)}, dev);
  // Doubles just below the threshold float that round up to it: kept on both executors (the
  // compare is against the least double that rounds to it, sparsify::detail::key_operand).
  const auto s = gz::sparsify::sampled_topk::count(10, 0.05);
  const std::size_t n = 100, size = s.sample_size(n);
  std::vector<bool> sampled(n, false);
  for (std::uint64_t j = 0; j < size; ++j) sampled[gz::sparsify::sampled_topk::sample_position(s.seed(), n, size, j)] = true;
  std::vector<double> x(n, 1.0);
  x[gz::sparsify::sampled_topk::sample_position(s.seed(), n, size, 0)] = 5.0 - 1e-9;
  for (std::size_t i = 0, placed = 1; placed < 11; ++i) {
    if (!sampled[i]) x[i] = 5.0 - 1e-9 * static_cast<double>(++placed);
  }
  gz::host host;
  const gz::codec<gz::sparsify::sampled_topk> c{s};
  CHECK(test::payload_indices(test::compress(c, host, x)).size() == 11);
  check_parity(x, c, dev);
}

TEST_CASE("cuda decoders refuse a payload with two faults for the host's first", "[gpu]") {
  REQUIRE_GPU();
  namespace tf = test::two_faults;
  gz::cuda dev;
  gz::host host;
  const auto same_error = [&](const auto& codec, const std::vector<std::byte>& bytes) {
    std::string want = "accepted", got = "accepted";
    std::vector<float> out(tf::n, 1.0f);
    try {
      codec.decompress_add(host, gz::span<const std::byte>(bytes), gz::span<float>(out));
    } catch (const gz::format_error& e) {
      want = e.what();
    }
    device_vector<std::byte> dp(bytes);
    device_vector<float> acc(std::vector<float>(tf::n, 1.0f));
    codec.decompress_add(dev, gz::span<const std::byte>(dp.data, bytes.size()), acc.view());
    try {
      dev.check();
    } catch (const gz::format_error& e) {
      got = e.what();
    }
    CHECK(want != "accepted");
    // The same error after the caller's name ("decompress" and "decompress (cuda)").
    const auto after_name = [](const std::string& m) { return m.substr(std::min(m.size(), m.find(": "))); };
    CHECK(after_name(got) == after_name(want));
    CHECK(acc.download() == std::vector<float>(tf::n, 1.0f));
  };
  const auto coo = tf::codec<tf::coo_codec>();
  same_error(coo, tf::coo(5, 100));
  same_error(coo, tf::coo(100, 5));
  same_error(coo, tf::coo(5, 5));
  same_error(tf::codec<tf::bitmap_codec>(), tf::bitmap());
  same_error(tf::codec<tf::delta_codec>(), tf::delta());
}

TEST_CASE("cuda simhash equals the host's bytes and decodes alike", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  gz::host host;
  for (const auto& [block, bits] : {std::pair<std::uint32_t, std::uint32_t>{8, 8}, {64, 16}, {1024, 128}, {8192, 1024}}) {
    const gz::hash::simhash sh{block, bits, 31};
    for (std::size_t n : {std::size_t{1}, std::size_t{block - 1}, std::size_t{3 * block + 5}, std::size_t{100000}}) {
      auto x = gradzip_tools::synthetic_gradient<float>(n, 7);
      if (n > 2 * block) x[block + 1] = std::numeric_limits<float>::quiet_NaN();  // one poisoned block
      if (n == block - 1) {  // entries up to 3e37: the decode scales before each H (simhash::decode_magnitude)
        float largest = 0.0f;
        for (const float v : x) largest = std::max(largest, std::abs(v));
        for (auto& v : x) v = v / largest * 3e37f;
      }
      std::vector<std::byte> expected(sh.max_compressed_bytes<float>(n));
      expected.resize(sh.compress(host, gz::span<const float>(x), gz::span<std::byte>(expected), {4, 2}));
      device_vector<float> dx(x);
      device_vector<std::byte> out(expected.size());
      const std::size_t bytes = sh.compress(dev, gz::span<const float>(dx.data, n), out.view(), {4, 2});
      dev.synchronize();
      INFO("block " << block << ", bits " << bits << ", n " << n);
      REQUIRE(bytes == expected.size());
      CHECK(out.download() == expected);
      // Decoding: the same floats as the host's (NaN where the host has NaN).
      std::vector<float> want(n, 0.5f);
      sh.decompress_add(host, gz::span<const std::byte>(expected), gz::span<float>(want), 0.25f);
      device_vector<float> acc(std::vector<float>(n, 0.5f));
      sh.decompress_add(dev, gz::span<const std::byte>(out.data, bytes), acc.view(), 0.25f);
      dev.check();
      const auto got = acc.download();
      for (std::size_t i = 0; i < n; ++i) {
        if (std::isnan(want[i])) {
          CHECK(std::isnan(got[i]));
        } else {
          CHECK(got[i] == want[i]);
        }
      }
    }
  }
}

TEST_CASE("cuda simhash rejects malformed payloads and changes nothing", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  gz::host host;
  const gz::hash::simhash sh{64, 16, 9};
  const auto x = gradzip_tools::synthetic_gradient<float>(300, 6);
  std::vector<std::byte> good(sh.max_compressed_bytes<float>(300));
  sh.compress(host, gz::span<const float>(x), gz::span<std::byte>(good));
  const auto h = gz::wire::read_header(gz::span<const std::byte>(good));
  const auto rejects = [&](const gz::hash::simhash& reader, const std::vector<std::byte>& bytes, gz::wire::format_errc code) {
    device_vector<std::byte> dp(bytes);
    device_vector<float> acc(std::vector<float>(300, 1.0f));
    reader.decompress_add(dev, gz::span<const std::byte>(dp.data, bytes.size()), acc.view());
    try {
      dev.check();
      FAIL("accepted");
    } catch (const gz::format_error& e) {
      CHECK(e.code() == code);
    }
    CHECK(acc.download() == std::vector<float>(300, 1.0f));
  };
  rejects(gz::hash::simhash{64, 16, 8}, good, gz::wire::format_errc::bad_params);
  auto negative = good;
  negative[h.sections[1].offset + 3] = std::byte{0x80};  // block 0's scale gets its sign bit
  rejects(sh, negative, gz::wire::format_errc::bad_scale);
  auto nan_with_bits = good;  // a poisoned block's bits must be zero
  for (int k = 0; k < 4; ++k) {
    nan_with_bits[h.sections[1].offset + 4 + k] = static_cast<std::byte>(gz::hash::simhash::poisoned_scale >> (8 * k));
  }
  nan_with_bits[h.sections[2].offset + 2] = std::byte{0};
  nan_with_bits[h.sections[2].offset + 3] = std::byte{4};  // block 1's bit 10
  rejects(sh, nan_with_bits, gz::wire::format_errc::bad_code);
  auto other = good;
  other[9] = std::byte{7};
  rejects(sh, other, gz::wire::format_errc::codec_mismatch);
}

TEST_CASE("cuda count sketch equals the host's bytes and estimates alike", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  gz::host host;
  for (const auto& [rows, columns] : {std::pair<std::uint32_t, std::uint64_t>{1, 1}, {3, 1000}, {5, 40000}}) {
    const gz::sketch::count_sketch cs{rows, columns, 12};
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4097}, std::size_t{1} << 20}) {
      const auto x = gradzip_tools::synthetic_gradient<float>(n, 3);
      std::vector<std::byte> expected(cs.payload_bytes(n));
      cs.compress(host, gz::span<const float>(x), gz::span<std::byte>(expected));
      device_vector<float> dx(x);
      device_vector<std::byte> out(expected.size());
      cs.compress(dev, gz::span<const float>(dx.data, n), out.view());
      dev.synchronize();
      INFO("rows " << rows << ", columns " << columns << ", n " << n);
      CHECK(out.download() == expected);
      std::vector<float> want(n);
      cs.estimate(host, gz::span<const std::byte>(expected), gz::span<float>(want));
      device_vector<float> got(n);
      cs.estimate(dev, gz::span<const std::byte>(out.data, expected.size()), got.view());
      dev.check();
      CHECK(got.download() == want);
    }
  }
  // The fixed point's edges: non-finite values poison their cells, subnormal and huge
  // magnitudes, ties, zeros; and a double input. The device's atomics add in any order.
  {
    const gz::sketch::count_sketch cs{3, 61, 5};
    const float tiny = std::numeric_limits<float>::denorm_min(), huge = std::numeric_limits<float>::max();
    std::vector<float> mixed = gradzip_tools::synthetic_gradient<float>(3001, 2);
    mixed[5] = std::numeric_limits<float>::quiet_NaN();
    mixed[77] = std::numeric_limits<float>::infinity();
    mixed[2999] = -std::numeric_limits<float>::infinity();
    const std::vector<std::vector<float>> inputs = {
        mixed,
        std::vector<float>(100, 0.0f),
        std::vector<float>(1000, huge),
        {tiny, -tiny, 3 * tiny, tiny, 5 * tiny, -7 * tiny, 1e-40f, -2e-41f},
        std::vector<float>(40, 1e-30f),
        {1.0f, std::ldexp(1.0f, -31), std::ldexp(3.0f, -31), std::ldexp(5.0f, -31), -std::ldexp(1.0f, -31)},
    };
    for (const auto& x : inputs) check_sketch_parity(cs, x, dev);
    const auto g = gradzip_tools::synthetic_gradient<float>(5000, 8);
    check_sketch_parity(cs, std::vector<double>(g.begin(), g.end()), dev);
  }
  // A sketch of another configuration is refused on the device too.
  const gz::sketch::count_sketch cs{3, 100, 1};
  std::vector<std::byte> table(cs.payload_bytes(10));
  const std::vector<float> ones(10, 1.0f);
  cs.compress(host, gz::span<const float>(ones), gz::span<std::byte>(table));
  device_vector<std::byte> dt(table);
  device_vector<float> est(std::vector<float>(10, 7.0f));
  gz::sketch::count_sketch{3, 100, 2}.estimate(dev, gz::span<const std::byte>(dt.data, table.size()), est.view());
  CHECK_THROWS_AS(dev.check(), gz::format_error);
  CHECK(est.download() == std::vector<float>(10, 7.0f));
}

TEST_CASE("cuda count sketch estimates equal the host's bits at every row count, poisoned cells included", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  gz::host host;
  // Rows 1 to 7 each have a kernel whose median network is unrolled; 8 and more share the one
  // that takes the row count at run time. Even counts average the two middle values. A NaN
  // gradient poisons a cell of every row, so the network meets NaNs in every position.
  std::vector<float> x = gradzip_tools::synthetic_gradient<float>(5003, 9);
  for (std::size_t i : {std::size_t{3}, std::size_t{1700}, std::size_t{4999}}) x[i] = std::numeric_limits<float>::quiet_NaN();
  x[40] = std::numeric_limits<float>::infinity();
  for (std::uint32_t rows : {1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 9u, 31u}) {
    const gz::sketch::count_sketch cs{rows, 211, 40 + rows};
    std::vector<std::byte> table(cs.payload_bytes(x.size()));
    cs.compress(host, gz::span<const float>(x), gz::span<std::byte>(table));
    std::vector<float> want(x.size());
    cs.estimate(host, gz::span<const std::byte>(table), gz::span<float>(want));
    device_vector<std::byte> dt(table);
    device_vector<float> got(x.size());
    cs.estimate(dev, gz::span<const std::byte>(dt.data, table.size()), got.view());
    dev.check();
    INFO("rows " << rows);
    const auto nans = std::count_if(want.begin(), want.end(), [](float v) { return std::isnan(v); });
    CHECK(nans > 0);
    CHECK(nans < static_cast<std::ptrdiff_t>(want.size()));
    const auto estimates = got.download();
    CHECK(output_difference(estimates.data(), want.data(), want.size()) == "");
  }
}

TEST_CASE("cuda count sketch merge and unsketch equal the host's", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  gz::host host;
  const gz::sketch::count_sketch cs{5, 3000, 8};
  const std::size_t n = 100003;
  const auto sketch_of = [&](std::uint32_t seed) {
    std::vector<std::byte> t(cs.payload_bytes(n));
    const auto x = gradzip_tools::synthetic_gradient<float>(n, seed);
    cs.compress(host, gz::span<const float>(x), gz::span<std::byte>(t));
    return t;
  };
  auto expected = sketch_of(1);
  const auto other = sketch_of(2);
  device_vector<std::byte> into(expected), from(other);
  cs.merge(host, gz::span<std::byte>(expected), gz::span<const std::byte>(other));
  cs.merge(dev, into.view(), gz::span<const std::byte>(from.data, from.size));
  dev.check();
  CHECK(into.download() == expected);
  for (std::uint64_t k : {std::uint64_t{1}, std::uint64_t{100}, std::uint64_t{5000}}) {
    std::vector<std::byte> want(cs.max_unsketch_bytes(n, k));
    want.resize(cs.unsketch(host, gz::span<const std::byte>(expected), n, k, gz::span<std::byte>(want)));
    device_vector<std::byte> got(cs.max_unsketch_bytes(n, k));
    const std::size_t bytes = cs.unsketch(dev, gz::span<const std::byte>(into.data, into.size), n, k, got.view());
    dev.check();
    INFO("k = " << k);
    CHECK(got.download(bytes) == want);
  }
  // Non-finite cells: inf + -inf and a negative NaN merge to poisoned_cell (a GPU's add makes
  // 0x7FFFFFFF, x86's 0xFFC00000: each executor writes gradzip's NaN), and a sealed `into` comes
  // back unsealed on both.
  {
    auto sealed = sketch_of(3);
    auto peer = sketch_of(4);
    const auto table_of = [&](std::vector<std::byte>& p) {
      return const_cast<std::uint8_t*>(cs.table_of(gz::span<const std::byte>(p)));
    };
    gz::sketch::count_sketch::store_cell(table_of(sealed), 10, std::numeric_limits<float>::infinity());
    gz::sketch::count_sketch::store_cell(table_of(peer), 10, -std::numeric_limits<float>::infinity());
    gz::sketch::count_sketch::store_cell(table_of(peer), 11, -std::numeric_limits<float>::quiet_NaN());
    gz::wire::seal(gz::span<std::byte>(sealed));
    device_vector<std::byte> d_into(sealed), d_peer(peer);
    cs.merge(host, gz::span<std::byte>(sealed), gz::span<const std::byte>(peer));
    cs.merge(dev, d_into.view(), gz::span<const std::byte>(d_peer.data, d_peer.size));
    dev.check();
    auto merged = d_into.download();
    CHECK(merged == sealed);
    CHECK((gz::wire::read_header(gz::span<const std::byte>(merged)).flags & gz::wire::flag_checksum) == 0);
    for (std::uint64_t j : {std::uint64_t{10}, std::uint64_t{11}}) {
      CHECK(gz::detail::bit_cast<std::uint32_t>(gz::sketch::count_sketch::load_cell(table_of(merged), j)) ==
            gz::sketch::count_sketch::poisoned_cell);
    }
  }
  // unsketch refuses k > n before it launches anything, with the host's message.
  {
    device_vector<std::byte> top(cs.max_unsketch_bytes(n, n));
    CHECK_THROWS_WITH(cs.unsketch(dev, gz::span<const std::byte>(into.data, into.size), n, n + 1, top.view()),
                      "count_sketch::unsketch: k = " + std::to_string(n + 1) + " exceeds n = " + std::to_string(n));
  }
  // A sketch of another n is refused and `into` is left as it was.
  std::vector<std::byte> shorter(cs.payload_bytes(n - 1));
  const std::vector<float> ones(n - 1, 1.0f);
  cs.compress(host, gz::span<const float>(ones), gz::span<std::byte>(shorter));
  device_vector<std::byte> bad(shorter);
  cs.merge(dev, into.view(), gz::span<const std::byte>(bad.data, bad.size));
  CHECK_THROWS_AS(dev.check(), gz::format_error);
  CHECK(into.download() == expected);
  // unsketch checks n against the payload's.
  device_vector<std::byte> top(cs.max_unsketch_bytes(n + 1, 10));
  cs.unsketch(dev, gz::span<const std::byte>(into.data, into.size), n + 1, 10, top.view());
  CHECK_THROWS_AS(dev.check(), gz::format_error);
}

TEST_CASE("cuda fetchsgd steps, saves and restores equal the host's", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  gz::host host;
  const gz::sketch::count_sketch cs{5, 2000, 17};
  const std::uint64_t n = 20000, k = 200;
  gz::sketch::fetchsgd on_host{cs, n, k, 0.9f};
  gz::sketch::fetchsgd on_device{dev, cs, n, k, 0.9f};
  const auto step_both = [&](int step) {
    std::vector<std::byte> summed(cs.payload_bytes(n));
    const auto x = gradzip_tools::synthetic_gradient<float>(n, 200 + step);
    cs.compress(host, gz::span<const float>(x), gz::span<std::byte>(summed));
    std::vector<std::byte> want(on_host.max_update_bytes());
    want.resize(on_host.step(host, gz::span<const std::byte>(summed), gz::span<std::byte>(want), 0.5f, 0.1f));
    device_vector<std::byte> ds(summed), got(on_device.max_update_bytes());
    const std::size_t bytes = on_device.step(dev, gz::span<const std::byte>(ds.data, ds.size), got.view(), 0.5f, 0.1f);
    dev.check();
    INFO("step " << step);
    CHECK(got.download(bytes) == want);
    CHECK(on_device.save(dev) == on_host.save(host));
  };
  for (int step = 0; step < 4; ++step) step_both(step);
  // Restore the host's state on a fresh device wrapper and continue in step.
  gz::sketch::fetchsgd restored{dev, cs, n, k, 0.9f};
  const auto state = on_host.save(host);
  restored.restore(dev, gz::span<const std::byte>(state));
  CHECK(restored.save(dev) == state);
  // A summed sketch of another configuration changes nothing on the device.
  const auto before = on_device.save(dev);
  const gz::sketch::count_sketch other{5, 2000, 18};
  std::vector<std::byte> wrong(other.payload_bytes(n));
  const std::vector<float> ones(n, 1.0f);
  other.compress(host, gz::span<const float>(ones), gz::span<std::byte>(wrong));
  device_vector<std::byte> dw(wrong), out(on_device.max_update_bytes());
  on_device.step(dev, gz::span<const std::byte>(dw.data, dw.size), out.view());
  CHECK_THROWS_AS(dev.check(), gz::format_error);
  CHECK(on_device.save(dev) == before);
}

TEST_CASE("cuda hash partition equals the host's loads, split and hash bitmap", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  gz::host host;
  const std::uint64_t n = 1000000;
  for (std::uint32_t parts : {1u, 16u, 5000u}) {
    const gz::hash::partition zen{parts, 3};
    INFO(parts << " parts");
    CHECK(zen.loads(dev, n) == zen.loads(n));
    std::mt19937_64 rng(parts);
    std::vector<std::uint64_t> sorted{0};  // index 0 is an ordinary index
    for (std::uint64_t i = 1; i < n; ++i) {
      if (rng() % 100 == 0) sorted.push_back(i);
    }
    for (std::uint64_t capacity : {std::uint64_t{0}, std::uint64_t{3}, std::uint64_t{700}}) {
      const std::uint64_t overflow = 300;
      std::vector<std::uint64_t> slots(parts * capacity, 7), counts(parts, 7), spill(overflow, 7);
      std::vector<std::uint32_t> spill_parts(overflow, 7);
      device_vector<std::uint64_t> ds(sorted), dslots(slots), dcounts(counts), dspill(spill);
      device_vector<std::uint32_t> dspill_parts(spill_parts);
      const auto want = zen.split_fixed(gz::span<const std::uint64_t>(sorted), n, capacity, overflow,
                                        gz::span<std::uint64_t>(slots), gz::span<std::uint64_t>(counts),
                                        gz::span<std::uint64_t>(spill), gz::span<std::uint32_t>(spill_parts));
#if defined(GRADZIP_SIMT)
      const std::uint64_t waits = gradzip_simt::host_waits();
#endif
      const auto got = zen.split_fixed(dev, gz::span<const std::uint64_t>(ds.data, ds.size), n, capacity, overflow,
                                       dslots.view(), dcounts.view(), dspill.view(), dspill_parts.view());
      INFO("capacity " << capacity);
#if defined(GRADZIP_SIMT)
      CHECK(gradzip_simt::host_waits() - waits == 1);  // the results, read once at the end
#endif
      CHECK(got.overflowed == want.overflowed);
      CHECK(got.unplaced == want.unplaced);
      CHECK(dslots.download() == slots);
      CHECK(dcounts.download() == counts);
      CHECK(dspill.download() == spill);
      CHECK(dspill_parts.download() == spill_parts);
    }
    // Not increasing, or not below n: refused as on the host, with its message, before any write.
    const std::vector<std::uint64_t> sentinel(parts, 7);
    for (const auto& [bad, message] :
         {std::pair<std::vector<std::uint64_t>, std::string>{{1, 2, 5, 3, 9}, "sorted[3] is 3 after 5"},
          {{0, 0}, "sorted[1] is 0 after 0"},
          {{n}, "sorted[0] is " + std::to_string(n)}}) {
      device_vector<std::uint64_t> du(bad), dslots(sentinel), dcounts(sentinel), dspill(std::vector<std::uint64_t>{7});
      device_vector<std::uint32_t> dparts(std::vector<std::uint32_t>{7});
      CHECK_THROWS_WITH(zen.split_fixed(dev, gz::span<const std::uint64_t>(du.data, du.size), n, 1, 1, dslots.view(),
                                        dcounts.view(), dspill.view(), dparts.view()),
                        "partition::split_fixed: " + message + ": indices must be increasing and below n = " +
                            std::to_string(n));
      CHECK(dslots.download() == sentinel);
      CHECK(dcounts.download() == sentinel);
      CHECK(dspill.download() == std::vector<std::uint64_t>{7});
      CHECK(dparts.download() == std::vector<std::uint32_t>{7});
    }
  }
  const gz::hash::partition zen{8, 11};
  const std::uint64_t m = 50000;
  for (std::uint32_t p : {0u, 3u, 7u}) {
    const test::part_members part(zen, p, m);
    const auto& members = part.all;
    const auto& subset = part.every_third;
    std::vector<std::uint64_t> bits((members.size() + 63) / 64);
    const std::uint64_t count = zen.encode_bitmap(p, m, gz::span<const std::uint64_t>(subset), gz::span<std::uint64_t>(bits));
    device_vector<std::uint64_t> dsubset(subset), dbits(std::vector<std::uint64_t>(bits.size(), ~0ull));
    INFO("part " << p);
    CHECK(zen.encode_bitmap(dev, p, m, gz::span<const std::uint64_t>(dsubset.data, dsubset.size), dbits.view()) == count);
    CHECK(dbits.download() == bits);
    device_vector<std::uint64_t> out(subset.size());
    CHECK(zen.decode_bitmap(dev, p, m, gz::span<const std::uint64_t>(dbits.data, dbits.size), out.view()) == subset.size());
    CHECK(out.download() == subset);
    std::vector<std::uint64_t> padded(bits.size() + 1, 0);
    padded.back() = 1;  // a member bit beyond the last member
    device_vector<std::uint64_t> dpadded(padded);
    CHECK_THROWS_AS(zen.decode_bitmap(dev, p, m, gz::span<const std::uint64_t>(dpadded.data, dpadded.size), out.view()),
                    gz::format_error);
    std::vector<std::uint64_t> stranger{members[0] == 0 ? 1u : 0u};
    if (zen.part_of(stranger[0]) != p) {
      device_vector<std::uint64_t> dstranger(stranger);
      CHECK_THROWS_AS(zen.encode_bitmap(dev, p, m, gz::span<const std::uint64_t>(dstranger.data, dstranger.size), dbits.view()),
                      gz::invalid_argument);
    }
  }
}

/// compress_async on the device: the same bytes as the host's compress, and the size left in
/// device memory.
template <class Codec>
void check_async(const std::vector<float>& x, const Codec& c, gz::cuda& dev) {
  gz::host host;
  const auto expected = test::compress(c, host, x);
  device_vector<float> dx(x);
  device_vector<std::byte> out(c.template max_compressed_bytes<float>(x.size()));
  device_vector<std::uint64_t> size(std::size_t{1});
  c.compress_async(dev, gz::span<const float>(dx.data, x.size()), out.view(), size.data);
  dev.check();
  const std::uint64_t bytes = size.download()[0];
  INFO("n = " << x.size());
  REQUIRE(bytes == expected.size());
  CHECK(out.download(bytes) == expected);
}

TEST_CASE("cuda compress_async gives compress's bytes and leaves the size on the device", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{3000}, std::size_t{1} << 20}) {
    const auto x = gradzip_tools::synthetic_gradient<float>(n, 71);
    check_async(x, gz::codec<gz::sparsify::threshold>{gz::sparsify::threshold{0.5}}, dev);
    check_async(x, gz::codec<gz::sparsify::threshold, gz::quantize::cast_fp16>{gz::sparsify::threshold{0.1}}, dev);
    check_async(x, gz::codec<gz::sparsify::sampled_topk>{gz::sparsify::sampled_topk::ratio(0.01)}, dev);
    check_async(x, gz::codec<gz::hash::hashed_topk>{gz::hash::hashed_topk::ratio(0.01)}, dev);
    check_async(x, gz::codec<gz::sparsify::topk>{gz::sparsify::topk::ratio(0.01)}, dev);
  }
}

/// The candidate list's control words as the last sampled top-k count over n elements of T left them.
template <class T>
gz::detail::dgc_list_control last_dgc_list(gz::cuda& dev, std::size_t n) {
  using backend = gz::detail::structure_backend<gz::cuda, gz::sparsify::sampled_topk>;
  gz::detail::dgc_list_control c{};
  GRADZIP_CUDA_TRY(cudaMemcpy(&c, backend::list_control<T>(dev, n), sizeof c, cudaMemcpyDeviceToHost));
  return c;
}

/// A selection sink that records each kept element's index at its position.
struct index_recorder {
  std::uint64_t* index;
  __device__ void operator()(std::uint64_t pos, std::uint64_t i, float) const { index[pos] = i; }
};

/// Sampled top-k's count over x, then its emit after x was zeroed on the device: the kept indices
/// where the emit read the list, none (the sentinel, all ones) where it read x.
std::vector<std::uint64_t> emit_after_zeroing(const gz::sparsify::sampled_topk& s, const std::vector<float>& x,
                                              gz::cuda& dev) {
  using backend = gz::detail::structure_backend<gz::cuda, gz::sparsify::sampled_topk>;
  device_vector<float> dx(x);
  const gz::span<const float> view(dx.data, x.size());
  const std::uint64_t k = backend::count(dev, s, view);
  device_vector<std::uint64_t> kept(std::vector<std::uint64_t>(k, ~std::uint64_t{0}));
  GRADZIP_CUDA_TRY(cudaMemsetAsync(dx.data, 0, x.size() * sizeof(float), dev.stream()));
  backend::select(dev, s, view, k, index_recorder{kept.data});
  dev.synchronize();
  return kept.download();
}

TEST_CASE("cuda sampled top-k reads its candidate list where it holds the keys, x elsewhere, with the host's bytes", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  gz::host host;
  using dgc = gz::codec<gz::sparsify::sampled_topk>;
  const std::size_t n = 300000;
  const std::uint64_t capacity = gz::detail::structure_backend<gz::cuda, gz::sparsify::sampled_topk>::list_capacity(n);
  constexpr std::uint64_t not_gathered = ~std::uint64_t{0};
  const auto listed = [&](const std::vector<float>& x, const gz::sparsify::sampled_topk& s) {
    CHECK(emit_after_zeroing(s, x, dev) == test::payload_indices(test::compress(dgc{s}, host, x)));
  };
  const auto from_x = [&](const std::vector<float>& x, const gz::sparsify::sampled_topk& s) {
    const auto kept = emit_after_zeroing(s, x, dev);
    CHECK(!kept.empty());
    CHECK(std::all_of(kept.begin(), kept.end(), [](std::uint64_t i) { return i == ~std::uint64_t{0}; }));
  };
  const auto g = gradzip_tools::synthetic_gradient<float>(n, 31);
  // The candidates (keys >= the first bracket's floor, about 2 k) fit the list: one read of x.
  const auto one = gz::sparsify::sampled_topk::ratio(0.01);
  for (const auto& s : {one, gz::sparsify::sampled_topk::ratio(0.001, 0.05)}) {
    check_parity(g, dgc{s}, dev);
    const auto c = last_dgc_list<float>(dev, n);
    CHECK(c.gathered >= s.target_count(n));
    CHECK(c.gathered <= capacity);
    check_async(g, dgc{s}, dev);
    CHECK(last_dgc_list<float>(dev, n).gathered == c.gathered);
    listed(g, s);
  }
  // No count over 64 n elements ran: the accessor throws instead of growing the scratch.
  CHECK_THROWS_AS(last_dgc_list<float>(dev, 64 * n), gz::invalid_argument);
  CHECK(last_dgc_list<float>(dev, n).gathered <= capacity);
  check_parity(converted<double>(g), dgc{one}, dev);
  CHECK(last_dgc_list<double>(dev, n).gathered <= capacity);
  check_parity(converted<__nv_bfloat16>(g), dgc{one}, dev);
  CHECK(last_dgc_list<__nv_bfloat16>(dev, n).gathered <= capacity);
  // About 2 k = n / 5 candidates would overflow it: not gathered; every pass reads x.
  const auto tenth = gz::sparsify::sampled_topk::ratio(0.1);
  check_parity(g, dgc{tenth}, dev);
  CHECK(last_dgc_list<float>(dev, n).gathered == not_gathered);
  from_x(g, tenth);

  const auto sample_of = [&](const gz::sparsify::sampled_topk& s) {
    std::vector<std::uint64_t> at(s.sample_size(n));
    for (std::uint64_t j = 0; j < at.size(); ++j) at[j] = gz::sparsify::sampled_topk::sample_position(s.seed(), n, at.size(), j);
    return at;
  };
  // A second round from the list: the sample's 2s and 0.5s bracket 5,000 values just above 1
  // (one bin, more than 1.2 k), so the search narrows to [1, 1 + 2^14 ulp), above the floor 0.5.
  {
    const auto at = sample_of(one);
    std::vector<float> band(n, 1e-3f);
    std::vector<bool> sampled(n, false);
    for (std::uint64_t j = 0; j < at.size(); ++j) {
      sampled[at[j]] = true;
      band[at[j]] = j < 20 ? 2.0f : (j < 60 ? 0.5f : 1e-3f);
    }
    std::uint32_t bits = 0x3F800000u;  // 1.0f
    for (std::size_t i = 0, placed = 0; i < n && placed < 5000; i += 37) {
      if (sampled[i]) continue;
      std::memcpy(&band[i], &bits, 4);
      ++bits;
      ++placed;
    }
    check_parity(band, dgc{one}, dev);
    const auto c = last_dgc_list<float>(dev, n);
    CHECK(c.gathered == 5060);  // 20 + 40 sampled, 5,000 placed
    CHECK(c.floor == 0x3F000000u);  // 0.5's key
    listed(band, one);
  }
  const auto s = gz::sparsify::sampled_topk::ratio(0.04);  // about 2 k = n / 12.5 expected candidates
  const auto at = sample_of(s);
  // The sample sees only 10s where the rest holds 1s and 1e-3s: the first bracket is too high,
  // the search goes below the floor, and the count and the emit read x.
  std::vector<float> fooled(n, 1e-3f);
  for (std::size_t i = 0; i < n; i += 13) fooled[i] = 1.0f;
  for (std::uint64_t i : at) fooled[i] = 10.0f;
  check_parity(fooled, dgc{s}, dev);
  CHECK(last_dgc_list<float>(dev, n).gathered <= capacity);  // gathered, not read
  check_async(fooled, dgc{s}, dev);
  from_x(fooled, s);
  // The sample sees only the smallest values: nearly all of x reaches its floor, and the list
  // overflows (its count says so).
  std::vector<float> low(n);
  for (std::size_t i = 0; i < n; ++i) low[i] = g[i] < 0 ? g[i] - 1.0f : g[i] + 1.0f;
  for (std::uint64_t i : at) low[i] = 1e-3f;
  check_parity(low, dgc{s}, dev);
  CHECK(last_dgc_list<float>(dev, n).gathered > capacity);
  check_async(low, dgc{s}, dev);
  from_x(low, s);
  // The floor is a NaN's key and the threshold is capped at the largest finite float, below it:
  // the infinities pass without being listed, so the count and the emit read x.
  const auto wide = gz::sparsify::sampled_topk::ratio(0.01, 0.001);  // kept: k + the sample + 100 <= 1.2 k
  const auto nans = test::nan_floor_input(wide, g);
  check_parity(nans, dgc{wide}, dev);
  CHECK(last_dgc_list<float>(dev, n).gathered <= capacity);
  check_async(nans, dgc{wide}, dev);
  from_x(nans, wide);
}

TEST_CASE("cuda hashed top-k equals the host's bytes (index 0 included)", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  for (std::size_t n : {std::size_t{1}, std::size_t{5000}, std::size_t{1} << 20}) {
    auto x = gradzip_tools::synthetic_gradient<float>(n, 61);
    x[0] = 1000.0f;  // index 0 must win its slot and be sent
    for (const auto& [ratio, slots] : {std::pair<double, double>{0.01, 0.0}, {0.01, 0.03}, {0.1, 0.05}}) {
      INFO("n = " << n << ", ratio " << ratio << ", slots " << slots);
      const auto h = gz::hash::hashed_topk::ratio(ratio, slots);
      check_parity(x, gz::codec<gz::hash::hashed_topk>{h}, dev);
      check_parity(converted<double>(x), gz::codec<gz::hash::hashed_topk>{h}, dev);
      check_parity(x, gz::codec<gz::hash::hashed_topk, gz::quantize::none, gz::encode::automatic>{h}, dev);
    }
  }
}

TEST_CASE("cuda Hadamard-rotated codecs equal the host's bytes and decode alike", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  gz::host host;
  using u4 = gz::codec<gz::sparsify::none, gz::quantize::uniform<4>, gz::encode::none>;
  using top = gz::codec<gz::sparsify::topk, gz::quantize::none, gz::encode::bitmap>;
  for (std::uint32_t block : {2u, 64u, 1024u, 8192u}) {
    const gz::transform::hadamard rotation{block, 17};
    for (std::size_t n : {std::size_t{1}, std::size_t{block + 3}, std::size_t{100000}}) {
      const auto x = gradzip_tools::synthetic_gradient<float>(n, 9);
      INFO("block " << block << ", n " << n);
      const gz::transform::rotated<u4> ru{u4{}, rotation};
      const gz::transform::rotated<top> rt{top{gz::sparsify::topk::ratio(0.05)}, rotation};
      const auto check = [&](const auto& c) {
        host.reserve(c.template workspace_bytes<float>(host, n));
        std::vector<std::byte> expected(c.template max_compressed_bytes<float>(n));
        expected.resize(c.compress(host, gz::span<const float>(x), gz::span<std::byte>(expected)));
        device_vector<float> dx(x);
        device_vector<std::byte> out(c.template max_compressed_bytes<float>(n));
        const std::size_t bytes = c.compress(dev, gz::span<const float>(dx.data, n), out.view());
        dev.synchronize();
        REQUIRE(bytes == expected.size());
        auto got = out.download();
        got.resize(bytes);
        CHECK(got == expected);
        std::vector<float> want(n, 0.25f);
        c.decompress_add(host, gz::span<const std::byte>(expected), gz::span<float>(want), 0.5f);
        device_vector<float> acc(std::vector<float>(n, 0.25f));
        c.decompress_add(dev, gz::span<const std::byte>(out.data, bytes), acc.view(), 0.5f);
        dev.check();
        CHECK(acc.download() == want);
        auto other = expected;  // another seed in the outer params: refused, nothing written
        other[gz::wire::read_header(gz::span<const std::byte>(expected)).sections[0].offset + 8] ^= std::byte{1};
        device_vector<std::byte> bad(other);
        device_vector<float> untouched(std::vector<float>(n, 0.25f));
        c.decompress_add(dev, gz::span<const std::byte>(bad.data, other.size()), untouched.view(), 0.5f);
        CHECK_THROWS_AS(dev.check(), gz::format_error);
        CHECK(untouched.download() == std::vector<float>(n, 0.25f));
      };
      check(ru);
      check(rt);
    }
  }
  // Into a double output both executors accumulate in double (detail::accumulate).
  const gz::transform::rotated<u4> ru{u4{}, gz::transform::hadamard{64, 17}};
  const std::size_t n = 1000;
  const auto x = gradzip_tools::synthetic_gradient<double>(n, 10);
  std::vector<std::byte> p(ru.max_compressed_bytes<double>(n));
  p.resize(ru.compress(host, gz::span<const double>(x), gz::span<std::byte>(p)));
  std::vector<double> want(n, 1.0000000000010001);
  ru.decompress_add(host, gz::span<const std::byte>(p), gz::span<double>(want), 0.5f);
  device_vector<std::byte> dp(p);
  device_vector<double> acc(std::vector<double>(n, 1.0000000000010001));
  ru.decompress_add(dev, gz::span<const std::byte>(dp.data, p.size()), acc.view(), 0.5f);
  dev.check();
  const auto got = acc.download();
  CHECK(got == want);
  CHECK(std::count_if(got.begin(), got.end(), beyond_float) == static_cast<std::ptrdiff_t>(n));  // none in float
}


namespace {

/// The reason a format_error gives, without the executor's prefix ("decompress (cuda): ...").
std::string reason(const gz::format_error& e) {
  const std::string w = e.what();
  const auto at = w.find(": ");
  return at == std::string::npos ? w : w.substr(at + 2);
}

/// Decoding `payload` on the device fails with exactly the host's error (code and numbers).
template <class Decode>
void check_same_failure(const std::vector<std::byte>& payload, std::size_t n, Decode decode) {
  gz::host host;
  gz::cuda dev;
  std::vector<float> h(n, 1.0f);
  std::string want;
  gz::wire::format_errc want_code{};
  try {
    decode(host, gz::span<const std::byte>(payload), gz::span<float>(h));
    FAIL("the host accepted the payload");
  } catch (const gz::format_error& e) {
    want = reason(e);
    want_code = e.code();
  }
  device_vector<std::byte> dp(payload);
  device_vector<float> acc(std::vector<float>(n, 1.0f));
  decode(dev, gz::span<const std::byte>(dp.data, payload.size()), acc.view());
  try {
    dev.check();
    FAIL("the device accepted the payload");
  } catch (const gz::format_error& e) {
    CHECK(e.code() == want_code);
    CHECK(reason(e) == want);
  }
  CHECK(acc.download() == std::vector<float>(n, 1.0f));
}

}  // namespace

TEST_CASE("cuda decoding reports the host's first failure whatever the thread order", "[gpu]") {
  REQUIRE_GPU();
  gz::host host;
  const std::size_t n = 200000;
  const auto x = gradzip_tools::synthetic_gradient<float>(n, 81);
  // COO: failures at many elements in many blocks; the host reports the lowest (element 1500).
  const gz::codec<gz::sparsify::topk> coo{gz::sparsify::topk::count(20000)};
  auto p = test::compress(coo, host, x);
  const auto indices = gz::wire::read_header(gz::span<const std::byte>(p)).sections[1].offset;
  for (std::size_t j = 19000; j >= 1500; j -= 500) {
    const std::uint32_t bad = j % 1000 == 0 ? 0xFFFFFFFFu : 0u;  // out of range, or not increasing
    std::memcpy(p.data() + indices + 4 * j, &bad, 4);
  }
  const auto decode = [&](const auto& c) {
    return [&c](auto& exec, gz::span<const std::byte> bytes, gz::span<float> out) { c.decompress_add(exec, bytes, out); };
  };
  check_same_failure(p, n, decode(coo));

  // Delta-varint: several chunks whose base lies past n; the host reports the lowest (chunk 2).
  const gz::codec<gz::sparsify::topk, gz::quantize::none, gz::encode::delta_varint> delta{gz::sparsify::topk::count(20000)};
  p = test::compress(delta, host, x);
  const auto table = gz::wire::read_header(gz::span<const std::byte>(p)).sections[1].offset;
  for (std::size_t c : {17u, 11u, 5u, 2u}) {
    const std::uint64_t past = n + c;
    std::memcpy(p.data() + table + c * gz::encode::delta_varint::entry_bytes, &past, 8);
  }
  check_same_failure(p, n, decode(delta));

  // Dense bucketed codes past max_code (TernGrad: 3 > 2) at positions in several runs, groups
  // and blocks; the device checks runs of 8 from the plane words, and must report the lowest
  // (element 4101) as the host does.
  const gz::codec<gz::sparsify::none, gz::quantize::terngrad<true>, gz::encode::none> tern{{}, gz::quantize::terngrad<true>{3}};
  p = test::compress(tern, host, x);
  const auto header = gz::wire::read_header(gz::span<const std::byte>(p));
  const auto planes = header.sections[header.section_count - 1].offset;
  for (std::size_t j : {std::size_t{190003}, std::size_t{77777}, std::size_t{4106}, std::size_t{4103}, std::size_t{4101}}) {
    for (std::size_t b = 0; b < 2; ++b) {  // both bit planes: code 3
      std::uint32_t w;
      std::memcpy(&w, p.data() + planes + ((j / 32) * 2 + b) * 4, 4);
      w |= 1u << (j % 32);
      std::memcpy(p.data() + planes + ((j / 32) * 2 + b) * 4, &w, 4);
    }
  }
  check_same_failure(p, n, decode(tern));

  // SimHash: several blocks whose scale has its sign bit set; the host reports the lowest (block 3).
  const gz::hash::simhash sh{64, 16, 5};
  std::vector<std::byte> s(sh.max_compressed_bytes<float>(n));
  s.resize(sh.compress(host, gz::span<const float>(x), gz::span<std::byte>(s)));
  const auto scales = gz::wire::read_header(gz::span<const std::byte>(s)).sections[1].offset;
  for (std::size_t b : {3000u, 1200u, 700u, 3u}) s[scales + 4 * b + 3] |= std::byte{0x80};
  check_same_failure(s, n, [&](auto& exec, gz::span<const std::byte> bytes, gz::span<float> out) {
    sh.decompress_add(exec, bytes, out);
  });
}

TEST_CASE("cuda check() clears a failure on the executor's own stream (non-blocking streams)", "[gpu]") {
  REQUIRE_GPU();
  cudaStream_t stream = nullptr;
  GRADZIP_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    gz::cuda dev{stream};
    gz::host host;
    const std::size_t n = 5000;
    const gz::codec<gz::sparsify::topk> c{gz::sparsify::topk::count(50)};
    const auto good = test::compress(c, host, gradzip_tools::synthetic_gradient<float>(n, 90));
    auto bad = good;
    bad[0] = std::byte{'X'};
    device_vector<std::byte> dgood(good), dbad(bad);
    device_vector<float> acc(std::vector<float>(n, 0.0f));
    c.decompress_add(dev, gz::span<const std::byte>(dbad.data, bad.size()), acc.view());
    CHECK_THROWS_AS(dev.check(), gz::format_error);
    // The next decode must see the cleared word: a clear queued on another stream (the legacy
    // one, which a non-blocking stream does not wait for) could land after it, or never before.
    c.decompress_add(dev, gz::span<const std::byte>(dgood.data, good.size()), acc.view());
    dev.check();
    std::vector<float> want(n, 0.0f);
    c.decompress_add(host, gz::span<const std::byte>(good), gz::span<float>(want));
    CHECK(acc.download() == want);
  }
  GRADZIP_CUDA_TRY(cudaStreamDestroy(stream));
}

namespace {

/// One rank whose collectives run on a CUDA stream of their own, as NCCL's do.
class stream_communicator final : public gz::comm::communicator {
 public:
  explicit stream_communicator(cudaStream_t stream) : stream_(stream) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce_sum(void*, std::size_t, gz::element_type) override {}  // one rank: the data is the sum
  void allgather_sizes(std::uint64_t mine, gz::span<std::uint64_t> sizes) override { sizes[0] = mine; }
  void allgatherv_bytes(gz::span<const std::byte> mine, gz::span<std::byte> all,
                        gz::span<const std::uint64_t>) override {
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(all.data(), mine.data(), mine.size(), cudaMemcpyDeviceToDevice, stream_));
  }
  void* cuda_stream() const noexcept override { return stream_; }

 private:
  cudaStream_t stream_;
};

/// Rank 0 of `ranks` whose peers all send its own payload (copies), those of `damaged` with a
/// broken magic. The copies are queued on the legacy stream: the host does not wait for them.
class replicating_communicator final : public gz::comm::communicator {
 public:
  replicating_communicator(int ranks, std::vector<int> damaged) : ranks_(ranks), damaged_(std::move(damaged)) {}
  int rank() const override { return 0; }
  int size() const override { return ranks_; }
  void allreduce_sum(void*, std::size_t, gz::element_type) override { FAIL("not the gather path"); }
  void allgather_sizes(std::uint64_t mine, gz::span<std::uint64_t> sizes) override {
    std::fill(sizes.begin(), sizes.end(), mine);
  }
  void allgatherv_bytes(gz::span<const std::byte> mine, gz::span<std::byte> all,
                        gz::span<const std::uint64_t>) override {
    for (int r = 0; r < ranks_; ++r) {
      GRADZIP_CUDA_TRY(cudaMemcpyAsync(all.data() + r * mine.size(), mine.data(), mine.size(),
                                       cudaMemcpyDeviceToDevice, nullptr));
    }
    for (const int r : damaged_) GRADZIP_CUDA_TRY(cudaMemsetAsync(all.data() + r * mine.size(), 0, 1, nullptr));
  }

 private:
  int ranks_;
  std::vector<int> damaged_;
};

}  // namespace

TEST_CASE("cuda allreducer checks every peer's payload before it decodes any", "[gpu]") {
  REQUIRE_GPU();
  using codec_t = gz::codec<gz::sparsify::topk>;
  const std::size_t n = 30000;
  gz::cuda dev;
  gz::comm::allreducer<codec_t, float, gz::cuda> all(dev, codec_t{gz::sparsify::topk::ratio(0.01)}, n, 3, false);
  const auto g = gradzip_tools::synthetic_gradient<float>(n, 92);
  device_vector<float> grad(g);
  // Ranks 0 and 1 were decoded into grad before rank 2's payload was found bad.
  replicating_communicator last_bad{3, {2}};
  CHECK_THROWS_WITH(all.run(last_bad, dev, grad.view()), Catch::Contains("allreducer: payload from rank 2"));
  CHECK(grad.download() == g);
  // The first bad rank is named.
  replicating_communicator two_bad{3, {1, 2}};
  CHECK_THROWS_WITH(all.run(two_bad, dev, grad.view()), Catch::Contains("allreducer: payload from rank 1"));
  CHECK(grad.download() == g);
  replicating_communicator good{3, {}};
  all.run(good, dev, grad.view());
  dev.check();
  CHECK(grad.download() != g);
}

#if defined(GRADZIP_SIMT)
// SIMT only: the backend counts the host's waits for the device, and kernel launches.
TEST_CASE("cuda allreducer's decode waits for the device as often for 7 ranks as for 2, validating each payload once",
          "[gpu]") {
  REQUIRE_GPU();
  using codec_t = gz::codec<gz::sparsify::topk>;
  const std::size_t n = 30000;
  gz::cuda dev;
  const auto g = gradzip_tools::synthetic_gradient<float>(n, 94);
  const codec_t c{gz::sparsify::topk::ratio(0.01)};
  // A payload's validation kernels when decompress_add decodes it alone.
  device_vector<float> dg(g);
  device_vector<std::byte> payload(c.max_compressed_bytes<float>(n));
  const std::size_t bytes = c.compress(dev, dg.view(), payload.view());
  dev.check();  // launches are counted as the stream runs them
  const std::uint64_t before_one = gradzip_simt::launches_of("validate_kernel<");
  c.decompress_add(dev, gz::span<const std::byte>(payload.data, bytes), dg.view());
  dev.check();
  const std::uint64_t per_payload = gradzip_simt::launches_of("validate_kernel<") - before_one;
  CHECK(per_payload == 1);  // COO: the elements' check
  std::uint64_t waits[2] = {};
  for (const int ranks : {2, 7}) {
    gz::comm::allreducer<codec_t, float, gz::cuda> all(dev, c, n, ranks, false);
    replicating_communicator comm{ranks, {}};
    device_vector<float> grad(g);
    all.run(comm, dev, grad.view());  // first run: buffers grow
    const std::uint64_t before = gradzip_simt::host_waits();
    const std::uint64_t validations = gradzip_simt::launches_of("validate_kernel<");
    all.run(comm, dev, grad.view());
    waits[ranks == 7] = gradzip_simt::host_waits() - before;
    // Every peer's payload validated once (before any is decoded), not again by its decode.
    CHECK(gradzip_simt::launches_of("validate_kernel<") - validations == static_cast<std::uint64_t>(ranks) * per_payload);
  }
  INFO(waits[0] << " waits for 2 ranks, " << waits[1] << " for 7");
  CHECK(waits[1] == waits[0]);
}
#endif

TEST_CASE("cuda allreducer orders compress, the collectives' stream and decode", "[gpu]") {
  REQUIRE_GPU();
  cudaStream_t work = nullptr, network = nullptr;
  GRADZIP_CUDA_TRY(cudaStreamCreateWithFlags(&work, cudaStreamNonBlocking));
  GRADZIP_CUDA_TRY(cudaStreamCreateWithFlags(&network, cudaStreamNonBlocking));
  {
    using codec_t = gz::codec<gz::sparsify::topk>;
    const std::size_t n = 30000;
    const codec_t c{gz::sparsify::topk::ratio(0.01)};
    gz::cuda dev{work};
    stream_communicator comm{network};
    gz::comm::allreducer<codec_t, float, gz::cuda> all(dev, c, n, 1, false);
    const auto g = gradzip_tools::synthetic_gradient<float>(n, 91);
    device_vector<float> grad(g);
    all.run(comm, dev, grad.view());
    dev.check();
    gz::host host;
    std::vector<float> want(n);
    const auto payload = test::compress(c, host, g);
    c.decompress(host, gz::span<const std::byte>(payload), gz::span<float>(want));
    CHECK(grad.download() == want);
  }
  GRADZIP_CUDA_TRY(cudaStreamDestroy(work));
  GRADZIP_CUDA_TRY(cudaStreamDestroy(network));
}

TEST_CASE("cuda sampled top-k keeps non-finite values, and more than its bound fails cleanly", "[gpu]") {
  REQUIRE_GPU();
  gz::cuda dev;
  gz::host host;
  const std::size_t n = 10000;
  const gz::codec<gz::sparsify::sampled_topk> sampled{gz::sparsify::sampled_topk::ratio(0.01)};  // bound floor(1.2 k) = 120
  const gz::codec<gz::sparsify::threshold> threshold{gz::sparsify::threshold{0.5}};
  auto x = gradzip_tools::synthetic_gradient<float>(n, 93);
  // Within the bound: NaN and +-inf are kept by both stages, with the host's bytes, sync and async.
  for (std::size_t i = 0; i < 60; ++i) {
    x[i * 97] = i % 3 == 0 ? std::numeric_limits<float>::quiet_NaN()
                           : (i % 3 == 1 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity());
  }
  check_parity(x, sampled, dev);
  check_parity(x, threshold, dev);
  check_async(x, sampled, dev);
  check_async(x, threshold, dev);
  // 200 non-finite values: more than the payload bound. Every path refuses; nothing is written.
  for (std::size_t i = 0; i < 200; ++i) x[i * 47 + 1] = std::numeric_limits<float>::quiet_NaN();
  const std::size_t bound = sampled.max_compressed_bytes<float>(n);
  std::vector<std::byte> out(bound);
  try {
    sampled.compress(host, gz::span<const float>(x), gz::span<std::byte>(out));
    FAIL("the host compressed more than the bound");
  } catch (const gz::format_error& e) {
    CHECK(e.code() == gz::wire::format_errc::count_over_bound);
  }
  device_vector<float> dx(x);
  device_vector<std::byte> dout(std::vector<std::byte>(bound, std::byte{0x5A}));
  CHECK_THROWS_AS(sampled.compress(dev, gz::span<const float>(dx.data, n), dout.view()), gz::format_error);
  device_vector<std::uint64_t> size(std::vector<std::uint64_t>{77});
  sampled.compress_async(dev, gz::span<const float>(dx.data, n), dout.view(), size.data);
  try {
    dev.check();
    FAIL("compress_async accepted more than the bound");
  } catch (const gz::format_error& e) {
    CHECK(e.code() == gz::wire::format_errc::count_over_bound);
  }
  CHECK(size.download()[0] == 0);
  CHECK(dout.download() == std::vector<std::byte>(bound, std::byte{0x5A}));
}

TEST_CASE("cuda PowerSGD writes the host's payloads, output and state, step for step", "[gpu][powersgd]") {
  REQUIRE_GPU();
  using gz::lowrank::factor;
  // Rows and columns off multiples of 32; rank 5 takes two passes of the 4-wide rank tile.
  const std::vector<std::vector<std::size_t>> shapes{{300, 200}, {300}, {70, 45}, {33, 1000}};
  const std::size_t n = 300 * 200 + 300 + 70 * 45 + 33 * 1000;
  for (const int rank : {1, 5}) {
    for (const bool warm : {true, false}) {
      INFO("rank " << rank << ", warm start " << warm);
      gz::lowrank::powersgd_params params;
      params.rank = rank;
      params.warm_start = warm;
      params.epsilon = 1e-7f;
      params.seed = 8;
      gz::host host;
      gz::cuda dev;
      gz::lowrank::powersgd<float, gz::host> h(host, shapes, params);
      gz::lowrank::powersgd<float, gz::cuda> d(dev, shapes, params);
      std::vector<std::byte> hp(h.payload_bytes(factor::p)), hq(h.payload_bytes(factor::q));
      device_vector<std::byte> dp(hp.size()), dq(hq.size());
      for (std::uint32_t step = 0; step < 3; ++step) {
        INFO("step " << step);
        std::vector<float> g = gradzip_tools::synthetic_gradient<float>(n, 300 + step);
        device_vector<float> dg(g);
        h.compress_p(host, gz::span<const float>(g), gz::span<std::byte>(hp), {step, 2});
        d.compress_p(dev, gz::span<const float>(dg.data, n), dp.view(), {step, 2});
        REQUIRE(dp.download() == hp);
        // Two ranks' worth: the payload summed with itself, on both sides alike.
        for (float& v : h.factors(gz::span<std::byte>(hp), factor::p)) v += v;
        device_vector<std::byte> summed(hp);
        h.compress_q(host, gz::span<const std::byte>(hp), gz::span<std::byte>(hq));
        d.compress_q(dev, gz::span<const std::byte>(summed.data, hp.size()), dq.view());
        dev.check();
        REQUIRE(dq.download() == hq);
        device_vector<std::byte> q_summed(hq);
        h.decompress(host, gz::span<const std::byte>(hq), 2, gz::span<float>(g));
        d.decompress(dev, gz::span<const std::byte>(q_summed.data, hq.size()), 2, gz::span<float>(dg.data, n));
        dev.check();
        REQUIRE(dg.download() == g);
      }
      const auto state = h.save(host);
      CHECK(d.save(dev) == state);
      gz::lowrank::powersgd<float, gz::cuda> restored(dev, shapes, params);
      restored.restore(dev, gz::span<const std::byte>(state));
      CHECK(restored.save(dev) == state);
    }
  }
}

TEST_CASE("cuda PowerSGD takes bf16 gradients and rejects a bad frame at check(), changing nothing", "[gpu][powersgd]") {
  REQUIRE_GPU();
  using gz::lowrank::factor;
  using bf16 = __nv_bfloat16;
  const std::vector<std::vector<std::size_t>> shapes{{64, 96}, {64}};
  const std::size_t n = 64 * 96 + 64;
  gz::lowrank::powersgd_params params;
  params.rank = 2;
  gz::host host;
  gz::cuda dev;
  gz::lowrank::powersgd<bf16, gz::host> h(host, shapes, params);
  gz::lowrank::powersgd<bf16, gz::cuda> d(dev, shapes, params);
  const auto f = gradzip_tools::synthetic_gradient<float>(n, 17);
  std::vector<bf16> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = gz::from_double<bf16>(f[i]);
  device_vector<bf16> dg(g);
  std::vector<std::byte> hp(h.payload_bytes(factor::p)), hq(h.payload_bytes(factor::q));
  device_vector<std::byte> dp(hp.size()), dq(hq.size());
  h.compress_p(host, gz::span<const bf16>(g), gz::span<std::byte>(hp));
  d.compress_p(dev, gz::span<const bf16>(dg.data, n), dp.view());
  h.compress_q(host, gz::span<const std::byte>(hp), gz::span<std::byte>(hq));
  d.compress_q(dev, gz::span<const std::byte>(dp.data, hp.size()), dq.view());
  dev.check();
  REQUIRE(dq.download() == hq);

  auto bad = hq;
  bad[96] = std::byte{0};  // the factor byte says P
  device_vector<std::byte> dbad(bad);
  // check() raises `code`, and neither the gradient nor the state (residual, Q) moved.
  const auto expect_refused = [&](gz::wire::format_errc code) {
    try {
      dev.check();
      FAIL("accepted");
    } catch (const gz::format_error& e) {
      CHECK(e.code() == code);
    }
    const auto untouched = dg.download();
    CHECK(std::memcmp(untouched.data(), g.data(), n * sizeof(bf16)) == 0);
    CHECK(d.save(dev) == h.save(host));
  };
  d.decompress(dev, gz::span<const std::byte>(dbad.data, bad.size()), 1, gz::span<bf16>(dg.data, n));
  expect_refused(gz::wire::format_errc::bad_params);

  // A bad P payload: compress_q's check fails at check(), and the decompress that follows is
  // refused too (step_incomplete) rather than run on a P that was never accepted.
  auto bad_p = hp;
  bad_p[100] = std::byte{7};  // the rank field
  device_vector<std::byte> dbad_p(bad_p);
  d.compress_p(dev, gz::span<const bf16>(dg.data, n), dp.view());
  d.compress_q(dev, gz::span<const std::byte>(dbad_p.data, bad_p.size()), dq.view());
  CHECK_THROWS_AS(dev.check(), gz::format_error);
  device_vector<std::byte> dgood_q(hq);
  d.decompress(dev, gz::span<const std::byte>(dgood_q.data, hq.size()), 1, gz::span<bf16>(dg.data, n));
  expect_refused(gz::wire::format_errc::step_incomplete);

  // The step starts over (compress_p and compress_q change no state), then completes.
  d.compress_p(dev, gz::span<const bf16>(dg.data, n), dp.view());
  d.compress_q(dev, gz::span<const std::byte>(dp.data, hp.size()), dq.view());
  h.decompress(host, gz::span<const std::byte>(hq), 1, gz::span<bf16>(g));
  d.decompress(dev, gz::span<const std::byte>(dq.data, hq.size()), 1, gz::span<bf16>(dg.data, n));
  dev.check();
  const auto out = dg.download();
  CHECK(std::memcmp(out.data(), g.data(), n * sizeof(bf16)) == 0);
}

namespace {

/// A rank of an in-process job whose collectives move device memory on a stream of their own
/// (as NCCL's do): the bytes go through the host to the shared communicator. With a null
/// stream, a host job's rank (host memory). Every byte a collective delivers is kept in `log`,
/// so that two jobs can be compared byte for byte.
class staging_communicator final : public gz::comm::communicator {
 public:
  staging_communicator(gz::comm::communicator& inner, cudaStream_t stream) : inner_(inner), stream_(stream) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void* cuda_stream() const noexcept override { return stream_; }
  void allreduce_sum(void* data, std::size_t count, gz::element_type type) override {
    gradzip_test::harness_expects(type != gz::element_type::f16, "staging_communicator: an f16 allreduce");
    const std::size_t bytes =
        count * (type == gz::element_type::f32 ? 4 : type == gz::element_type::f64 ? 8 : 2);
    std::vector<std::byte> h = fetch(gz::span<const std::byte>(static_cast<const std::byte*>(data), bytes));
    inner_.allreduce_sum(h.data(), count, type);
    deliver(h, gz::span<std::byte>(static_cast<std::byte*>(data), bytes));
  }
  void allgather_sizes(std::uint64_t mine, gz::span<std::uint64_t> sizes) override {
    inner_.allgather_sizes(mine, sizes);
  }
  void alltoall_sizes(gz::span<const std::uint64_t> mine, gz::span<std::uint64_t> theirs) override {
    inner_.alltoall_sizes(mine, theirs);
  }
  void allgatherv_bytes(gz::span<const std::byte> mine, gz::span<std::byte> all,
                        gz::span<const std::uint64_t> sizes) override {
    std::vector<std::byte> send = fetch(mine), got(all.size());
    inner_.allgatherv_bytes(gz::span<const std::byte>(send), gz::span<std::byte>(got), sizes);
    deliver(got, all);
  }
  void alltoallv_bytes(gz::span<const std::byte> send, gz::span<const std::uint64_t> send_sizes,
                       gz::span<std::byte> recv, gz::span<const std::uint64_t> recv_sizes) override {
    std::vector<std::byte> out = fetch(send), got(recv.size());
    inner_.alltoallv_bytes(gz::span<const std::byte>(out), send_sizes, gz::span<std::byte>(got), recv_sizes);
    deliver(got, recv);
  }
  std::vector<std::vector<std::byte>> log;

 private:
  std::vector<std::byte> fetch(gz::span<const std::byte> from) const {
    std::vector<std::byte> h(from.size());
    if (h.empty()) return h;
    if (stream_ != nullptr) {
      GRADZIP_CUDA_TRY(cudaMemcpyAsync(h.data(), from.data(), h.size(), cudaMemcpyDeviceToHost, stream_));
      GRADZIP_CUDA_TRY(cudaStreamSynchronize(stream_));
    } else {
      std::memcpy(h.data(), from.data(), h.size());
    }
    return h;
  }
  void deliver(const std::vector<std::byte>& got, gz::span<std::byte> to) {
    log.push_back(got);
    if (got.empty()) return;
    if (stream_ != nullptr) {
      GRADZIP_CUDA_TRY(cudaMemcpyAsync(to.data(), got.data(), got.size(), cudaMemcpyHostToDevice, stream_));
      GRADZIP_CUDA_TRY(cudaStreamSynchronize(stream_));
    } else {
      std::memcpy(to.data(), got.data(), got.size());
    }
  }
  gz::comm::communicator& inner_;
  cudaStream_t stream_;
};

/// A non-blocking stream for one rank's collectives, destroyed with it.
struct rank_stream {
  cudaStream_t stream = nullptr;
  rank_stream() { GRADZIP_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); }
  ~rank_stream() { cudaStreamDestroy(stream); }
};

/// One sparse_sync step per rank on `ranks` threads, on the host or the device executor: each
/// rank's output, bytes received and error message.
struct zen_job {
  std::vector<std::vector<float>> out;
  std::vector<std::vector<std::vector<std::byte>>> received;
  std::vector<gz::comm::sparse_sync_traffic> traffic;
  std::vector<std::string> errors;
};

zen_job run_zen(bool device, int ranks, std::uint64_t n, double density, gz::comm::sparse_scheme scheme,
                int corrupt_from = -1, bool corrupt_exchange = false) {
  zen_job job;
  job.out.assign(ranks, gradzip_tools::synthetic_gradient<float>(n, 3));
  job.received.resize(ranks);
  job.traffic.resize(ranks);
  job.errors = gradzip_test::on_ranks(
      ranks, corrupt_from,
      [&](int r, gz::comm::communicator& inner) {
        std::vector<std::uint64_t> idx;
        std::vector<float> val;
        // Below 0.001, no hot set: a few entries per part, which COO encodes.
        gradzip_test::sparse_gradient(r, n, density, idx, val, density >= 0.001);
        rank_stream network;
        staging_communicator c(inner, device ? network.stream : nullptr);
        auto& out = job.out[static_cast<std::size_t>(r)];
        if (device) {
          gz::cuda dev;
          gz::comm::basic_sparse_sync<gz::cuda> zen(n, ranks, 17);
          device_vector<std::uint64_t> didx(idx);
          device_vector<float> dval(val), dout(out);
          try {
            zen.run(c, dev, gz::span<const std::uint64_t>(didx.data, idx.size()),
                    gz::span<const float>(dval.data, val.size()), dout.view(), 0.5f, scheme);
          } catch (...) {
            job.received[static_cast<std::size_t>(r)] = c.log;
            out = dout.download();
            throw;
          }
          dev.synchronize();
          out = dout.download();
          job.traffic[static_cast<std::size_t>(r)] = zen.last_traffic();
        } else {
          gz::host exec(1);
          gz::comm::sparse_sync zen(n, ranks, 17);
          zen.run(c, exec, gz::span<const std::uint64_t>(idx), gz::span<const float>(val), gz::span<float>(out),
                  0.5f, scheme);
          job.traffic[static_cast<std::size_t>(r)] = zen.last_traffic();
        }
        job.received[static_cast<std::size_t>(r)] = c.log;
      },
      true, corrupt_exchange);
  return job;
}

}  // namespace

TEST_CASE("cuda sparse_sync (Zen) sends the host's bytes and sums to the host's bits, every scheme", "[gpu]") {
  REQUIRE_GPU();
  using scheme = gz::comm::sparse_scheme;
  for (const int ranks : {1, 3, 4}) {  // 3: a rank folded into the hierarchy
    // COO parts (a few entries each, without the hot set: delta-varint's chunk table costs
    // more), delta-varint and bitmap parts.
    for (const double density : {0.0002, 0.002, 0.03, 0.4}) {
      for (const scheme s : {scheme::balanced_parallelism, scheme::allgather, scheme::hierarchical_centralization}) {
        INFO(ranks << " ranks, density " << density << ", scheme " << static_cast<int>(s));
        const std::uint64_t n = 20011;
        const zen_job want = run_zen(false, ranks, n, density, s), got = run_zen(true, ranks, n, density, s);
        for (int r = 0; r < ranks; ++r) {
          INFO("rank " << r << ": " << got.errors[r]);
          REQUIRE(got.errors[r].empty());
          CHECK(got.received[r] == want.received[r]);  // every part, reduced part and stage
          CHECK(output_difference(got.out[r].data(), want.out[r].data(), n) == "");
          CHECK(got.traffic[r].received() == want.traffic[r].received());
          CHECK(got.traffic[r].sent() == want.traffic[r].sent());
          CHECK(got.traffic[r].union_entries == want.traffic[r].union_entries);
        }
      }
    }
  }
}

TEST_CASE("cuda sparse_sync names the rank whose bytes are bad as the host does, and changes nothing", "[gpu]") {
  REQUIRE_GPU();
  using scheme = gz::comm::sparse_scheme;
  struct damage {
    scheme s;
    bool in_exchange;
  };
  for (const damage d : {damage{scheme::balanced_parallelism, true}, damage{scheme::balanced_parallelism, false},
                         damage{scheme::hierarchical_centralization, true}, damage{scheme::allgather, false}}) {
    for (const double density : {0.002, 0.4}) {
      INFO("scheme " << static_cast<int>(d.s) << (d.in_exchange ? ", exchange" : ", gather") << ", density "
                     << density);
      const std::uint64_t n = 5003;
      const zen_job want = run_zen(false, 4, n, density, d.s, 2, d.in_exchange);
      const zen_job got = run_zen(true, 4, n, density, d.s, 2, d.in_exchange);
      const auto start = gradzip_tools::synthetic_gradient<float>(n, 3);
      for (int r = 0; r < 4; ++r) {
        INFO("rank " << r);
        CHECK(got.errors[r].find("from rank 2") != std::string::npos);
        CHECK(got.errors[r] == want.errors[r]);
        CHECK(got.out[r] == start);
      }
    }
  }
}

TEST_CASE("cuda sparse_sync rejects bad arguments with the host's messages", "[gpu]") {
  REQUIRE_GPU();
  const auto errors = gradzip_test::on_ranks(2, -1, [&](int, gz::comm::communicator& inner) {
    rank_stream network;
    staging_communicator c(inner, network.stream);
    gz::cuda dev;
    gz::comm::basic_sparse_sync<gz::cuda> zen(100, 2);
    device_vector<float> out(100), v(std::vector<float>{1.0f, 2.0f});
    device_vector<std::uint64_t> unsorted(std::vector<std::uint64_t>{5, 3}), past(std::vector<std::uint64_t>{5, 100});
    const auto run = [&](const device_vector<std::uint64_t>& i, std::size_t values) {
      zen.run(c, dev, gz::span<const std::uint64_t>(i.data, 2), gz::span<const float>(v.data, values), out.view());
    };
    RANK_CHECK_THROWS_WITH(run(unsorted, 2), "\"sparse_sync: index 1 (3) is not increasing and below n = 100\"");
    RANK_CHECK_THROWS_WITH(run(past, 2), "\"sparse_sync: index 1 (100) is not increasing and below n = 100\"");
    RANK_CHECK_THROWS_WITH(run(past, 1), "2 indices and 1 values");
  });
  for (const auto& e : errors) CHECK(e.empty());
}

TEST_CASE("cuda auto_sparse_sync profiles and chooses as the host does, dense allreduce included", "[gpu]") {
  REQUIRE_GPU();
  const std::uint64_t n = 20011;
  const gz::comm::link_model bandwidth{0.0, 12.5e9, 0.0};
  std::vector<gz::comm::sync_choice> chosen;
  for (const auto& scenario : std::vector<std::pair<int, double>>{{4, 1.0}, {4, 0.02}, {3, 0.02}}) {
    const int ranks = scenario.first;
    const double density = scenario.second;
    INFO(ranks << " ranks, density " << density);
    struct result {
      std::vector<float> profiled, chosen;
      gz::comm::sync_choice choice;
      std::uint64_t dense_bytes;
      std::vector<std::vector<std::byte>> received;
    };
    std::vector<result> host_side(ranks), device_side(ranks);
    for (const bool device : {false, true}) {
      auto& results = device ? device_side : host_side;
      const auto errors = gradzip_test::on_ranks(ranks, -1, [&](int r, gz::comm::communicator& inner) {
        std::vector<std::uint64_t> idx;
        std::vector<float> val;
        gradzip_test::sparse_gradient(r, n, density, idx, val);
        rank_stream network;
        staging_communicator c(inner, device ? network.stream : nullptr);
        result& mine = results[static_cast<std::size_t>(r)];
        mine.profiled.assign(n, 1.0f);
        mine.chosen.assign(n, 1.0f);
        if (device) {
          gz::cuda dev;
          gz::comm::basic_auto_sparse_sync<gz::cuda> zen(n, ranks, bandwidth, 7);
          device_vector<std::uint64_t> didx(idx);
          device_vector<float> dval(val), profiled(mine.profiled), out(mine.chosen);
          const gz::span<const std::uint64_t> i(didx.data, idx.size());
          const gz::span<const float> v(dval.data, val.size());
          zen.run(c, dev, i, v, profiled.view(), 0.5f);
          zen.run(c, dev, i, v, out.view(), 0.5f);
          dev.synchronize();
          mine.profiled = profiled.download();
          mine.chosen = out.download();
          mine.choice = zen.choice();
          mine.dense_bytes = zen.last_dense_bytes();
        } else {
          gz::host exec(1);
          gz::comm::auto_sparse_sync zen(n, ranks, bandwidth, 7);
          zen.run(c, exec, gz::span<const std::uint64_t>(idx), gz::span<const float>(val),
                  gz::span<float>(mine.profiled), 0.5f);
          zen.run(c, exec, gz::span<const std::uint64_t>(idx), gz::span<const float>(val),
                  gz::span<float>(mine.chosen), 0.5f);
          mine.choice = zen.choice();
          mine.dense_bytes = zen.last_dense_bytes();
        }
        mine.received = c.log;
      });
      for (const auto& e : errors) REQUIRE(e.empty());
    }
    for (int r = 0; r < ranks; ++r) {
      INFO("rank " << r << " chose " << gz::comm::name(device_side[r].choice));
      CHECK(device_side[r].choice == host_side[r].choice);
      CHECK(device_side[r].dense_bytes == host_side[r].dense_bytes);
      CHECK(device_side[r].received == host_side[r].received);
      CHECK(std::memcmp(device_side[r].profiled.data(), host_side[r].profiled.data(), n * sizeof(float)) == 0);
      CHECK(std::memcmp(device_side[r].chosen.data(), host_side[r].chosen.data(), n * sizeof(float)) == 0);
    }
    chosen.push_back(device_side[0].choice);
  }
  CHECK(std::count(chosen.begin(), chosen.end(), gz::comm::sync_choice::dense_allreduce) >= 1);
  CHECK(std::count(chosen.begin(), chosen.end(), gz::comm::sync_choice::dense_allreduce) < 3);
}

TEST_CASE("cuda planned_allreducer runs a plan with a sparse_sync group to the host's bits", "[gpu]") {
  REQUIRE_GPU();
  using gz::schedule::route;
  using topk_t = gz::codec<gz::sparsify::topk, gz::quantize::none, gz::encode::automatic>;
  using bf16_t = gz::codec<gz::sparsify::none, gz::quantize::cast_bf16, gz::encode::none>;
  const topk_t top1{gz::sparsify::topk::ratio(0.01)};
  gz::schedule::cost_model model;
  for (const char* name : {"fp32", "topk1", "bf16"}) {
    gz::schedule::codec_cost c;
    c.name = name;
    model.codecs.push_back(c);
  }
  const int ranks = 3;
  const std::vector<std::size_t> sizes = {1000, 7, 20000, 513, 9000};
  const gz::schedule::plan p{{0, 2, 4}, {{2, route::allreduce}, {1, route::sparse_sync}, {0, route::allreduce}}};
  const gz::fusion::layout l(sizes, p.group_starts);
  struct result {
    std::vector<std::vector<float>> grads;
    std::vector<std::vector<std::byte>> received;
  };
  std::vector<result> host_side(ranks), device_side(ranks);
  for (const bool device : {false, true}) {
    auto& results = device ? device_side : host_side;
    const auto errors = gradzip_test::on_ranks(ranks, -1, [&](int r, gz::comm::communicator& inner) {
      rank_stream network;
      staging_communicator c(inner, device ? network.stream : nullptr);
      result& mine = results[static_cast<std::size_t>(r)];
      for (int step = 0; step < 2; ++step) {
        mine.grads.push_back(gradzip_tools::synthetic_gradient<float>(l.total(), 40 + 10 * step + r));
      }
      auto run = [&](auto& exec, auto& planned, auto& grad_view, int step) {
        planned.run(c, exec, grad_view, {static_cast<std::uint64_t>(step), 0});
      };
      if (device) {
        using entry = gz::comm::plan_codec<float, gz::cuda>;
        gz::cuda dev;
        gz::comm::planned_allreducer<float, gz::cuda> planned(
            dev, sizes, p, model,
            {entry::uncompressed("fp32"), entry::sparse("topk1", top1, gz::comm::feedback_mode::error_feedback, 5),
             entry::of("bf16", bf16_t{})},
            ranks);
        for (int step = 0; step < 2; ++step) {
          device_vector<float> g(mine.grads[step]);
          auto view = g.view();
          run(dev, planned, view, step);
          dev.synchronize();
          mine.grads[step] = g.download();
        }
      } else {
        using entry = gz::comm::plan_codec<float, gz::host>;
        gz::host exec(1);
        gz::comm::planned_allreducer<float, gz::host> planned(
            exec, sizes, p, model,
            {entry::uncompressed("fp32"), entry::sparse("topk1", top1, gz::comm::feedback_mode::error_feedback, 5),
             entry::of("bf16", bf16_t{})},
            ranks);
        for (int step = 0; step < 2; ++step) {
          auto view = gz::span<float>(mine.grads[step]);
          run(exec, planned, view, step);
        }
      }
      mine.received = c.log;
    });
    for (const auto& e : errors) REQUIRE(e.empty());
  }
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    CHECK(device_side[r].received == host_side[r].received);
    for (int step = 0; step < 2; ++step) {
      CHECK(std::memcmp(device_side[r].grads[step].data(), host_side[r].grads[step].data(),
                        l.total() * sizeof(float)) == 0);
    }
  }
}
