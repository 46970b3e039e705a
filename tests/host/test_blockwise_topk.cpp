#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"

using namespace gradzip;

namespace {
using bw = codec<sparsify::blockwise_topk>;

/// Per block: (key descending, index ascending), the first kept, indices ascending.
template <class T>
std::vector<std::uint64_t> reference(const std::vector<T>& x, std::uint64_t block, std::uint64_t per_block) {
  std::vector<std::uint64_t> out;
  for (std::uint64_t begin = 0; begin < x.size(); begin += block) {
    const std::uint64_t end = std::min<std::uint64_t>(x.size(), begin + block);
    std::vector<std::uint64_t> idx(end - begin);
    for (std::uint64_t i = 0; i < idx.size(); ++i) idx[i] = begin + i;
    std::stable_sort(idx.begin(), idx.end(), [&](auto a, auto b) { return magnitude_key(x[a]) > magnitude_key(x[b]); });
    idx.resize(std::min<std::uint64_t>(idx.size(), per_block));
    std::sort(idx.begin(), idx.end());
    out.insert(out.end(), idx.begin(), idx.end());
  }
  return out;
}
}  // namespace

TEST_CASE("block-wise top-k keeps each block's largest magnitudes with top-k's tie rule", "[blockwise]") {
  for (std::size_t n : {std::size_t{1}, std::size_t{100}, std::size_t{4096}, std::size_t{100003}}) {
    auto x = gradzip_tools::synthetic_gradient<float>(n, 70 + n);
    for (std::size_t i = 0; i < n; i += 7) x[i] = 0.5f;  // ties
    if (n > 50) x[50] = std::numeric_limits<float>::quiet_NaN();
    for (auto [block, per_block] : {std::pair<std::uint64_t, std::uint64_t>{1, 1}, {64, 1}, {256, 7},
                                    {1000, 10}, {4096, 4096}}) {
      const bw c{sparsify::blockwise_topk{block, per_block}};
      for (int threads : {1, 2}) {
        host exec(threads);
        const auto p = test::compress(c, exec, x);
        const auto expected = reference(x, block, per_block);
        REQUIRE(expected.size() == c.structure().selected_count(n));
        REQUIRE(test::payload_indices(p) == expected);
      }
    }
  }
  const auto xd = gradzip_tools::synthetic_gradient<double>(5000, 3);
  host exec;
  CHECK(test::payload_indices(test::compress(bw{sparsify::blockwise_topk{512, 5}}, exec, xd)) ==
        reference(xd, 512, 5));
}

TEST_CASE("block-wise top-k validates its parameters and composes with values stages", "[blockwise]") {
  CHECK_THROWS_AS(sparsify::blockwise_topk(0, 1), invalid_argument);
  CHECK_THROWS_AS(sparsify::blockwise_topk(8192, 1), invalid_argument);
  CHECK_THROWS_AS(sparsify::blockwise_topk(64, 65), invalid_argument);
  CHECK_THROWS_AS(sparsify::blockwise_topk(64, 0), invalid_argument);
  CHECK(sparsify::blockwise_topk(100, 10).selected_count(1050) == 10 * 10 + 10);
  CHECK(sparsify::blockwise_topk(100, 10).selected_count(1005) == 10 * 10 + 5);
  const auto x = gradzip_tools::synthetic_gradient<float>(3000, 9);
  const auto out = test::round_trip(codec<sparsify::blockwise_topk, quantize::cast_bf16>{sparsify::blockwise_topk{300, 3}}, x);
  const auto kept = reference(x, 300, 3);
  std::size_t nonzero = 0;
  for (float v : out) nonzero += v != 0.0f;
  CHECK(nonzero == kept.size());
  for (auto i : kept) REQUIRE(out[i] == detail::bf16_bits_to_float(quantize::float_to_bf16_bits(x[i])));
}
