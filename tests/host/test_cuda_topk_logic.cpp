// The CUDA top-k's logic, checked on the host: the kernels' sequence (digit plan, histograms,
// state narrowing, coarse-then-fine bin search, scan-and-emit) replayed with plain loops and the
// very functors the device uses, through Thrust's CPP backend. Without a GPU this is what
// guards the device algorithm; with one, tests/device compares the real kernels byte for byte.
#include <catch2/catch.hpp>

#include <thrust/execution_policy.h>
#include <thrust/scan.h>

#include <random>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"
#include "gradzip/detail/topk_scan.hpp"

using namespace gradzip;
using namespace gradzip::detail;

namespace {

/// Replays cuda_topk's kernels in order on the host.
template <class T, class Sink>
void emulated_cuda_topk(const std::vector<T>& x, std::uint64_t k, const Sink& sink) {
  using Key = key_type_t<T>;
  const std::uint64_t n = x.size();
  if (k == 0 || n == 0) return;
  cuda_topk_state<Key> st{0, 0, k, 0};  // topk_init_kernel
  radix_digit digits[8];
  const int levels = cuda_topk_digits(magnitude_key_bits<Key>, digits);
  for (int level = 0; level < levels; ++level) {
    const radix_digit d = digits[level];
    const Key digit_mask = (Key{1} << d.width) - 1;
    if (d.width <= 12) {  // narrow_histogram_kernel + narrow_select_kernel
      std::vector<std::uint64_t> hist(std::size_t{1} << d.width);
      for (const T& v : x) {
        const Key key = magnitude_key(v);
        if ((key & st.mask) == st.prefix) ++hist[(key >> d.shift) & digit_mask];
      }
      std::uint64_t above = 0;
      const int bin = find_rank_bin(hist.data(), static_cast<int>(hist.size()), st.rank, above);
      narrow_state(&st, d, bin, above);
    } else {  // wide_histogram_kernel + wide_select_kernel
      std::vector<std::uint64_t> fine(std::size_t{1} << d.width), coarse(1 << cuda_topk_coarse_bits);
      const int coarse_shift = d.width - cuda_topk_coarse_bits;
      for (const T& v : x) {
        const Key key = magnitude_key(v);
        if ((key & st.mask) != st.prefix) continue;
        const auto digit = static_cast<std::size_t>((key >> d.shift) & digit_mask);
        ++fine[digit];
        ++coarse[digit >> coarse_shift];
      }
      const int window = 1 << coarse_shift;
      std::uint64_t above_coarse = 0, above_fine = 0;
      const int c = find_rank_bin(coarse.data(), static_cast<int>(coarse.size()), st.rank, above_coarse);
      const int f = find_rank_bin(fine.data() + static_cast<std::size_t>(c) * window, window,
                                  st.rank - above_coarse, above_fine);
      narrow_state(&st, d, c * window + f, above_coarse + above_fine);
    }
  }
  auto its = topk_scan_iterators<T, Key>(x.data(), &st, sink);
  thrust::inclusive_scan(thrust::cpp::par, its.first, its.first + n, its.second, topk_scan_op<T>{});
}

template <class T>
void check_emulation(const std::vector<T>& x, std::uint64_t k) {
  host exec;
  const codec<sparsify::topk> c{sparsify::topk::count(k)};
  const auto expected = test::compress(c, exec, x);
  std::vector<std::byte> got(expected.size());
  const std::uint64_t n = x.size();
  const auto l = codec<sparsify::topk>::layout(element_traits<T>::type, n, k);
  auto* base = reinterpret_cast<std::uint8_t*>(got.data());
  codec<sparsify::topk>::write_frame(base, l, element_traits<T>::type, n, k, detail::frame_params{});
  const payload_sink<T, quantize::none, encode::coo> sink{base + l.at(1).offset, encode::coo::index_width(n),
                                           base + l.at(2).offset};
  emulated_cuda_topk(x, k, sink);
  INFO("n = " << n << ", k = " << k);
  CHECK(got == expected);
}

}  // namespace

TEST_CASE("cuda topk digit plans cover every key bit", "[cuda-logic]") {
  radix_digit d[8];
  REQUIRE(cuda_topk_digits(31, d) == 2);
  CHECK((d[0].shift == 20 && d[0].width == 11 && d[1].shift == 0 && d[1].width == 20));
  REQUIRE(cuda_topk_digits(63, d) == 4);
  CHECK((d[0].width == 11 && d[1].width == 20 && d[2].width == 20 && d[3].width == 12 && d[3].shift == 0));
}

TEST_CASE("the cuda topk algorithm selects what the host selects", "[cuda-logic]") {
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{65537}, std::size_t{400001}}) {
    const auto g = gradzip_tools::synthetic_gradient<float>(n, n);
    for (std::uint64_t k : {std::uint64_t{1}, n / 100 + 1, n / 3 + 1, std::uint64_t{n}}) check_emulation(g, k);
  }
  check_emulation(gradzip_tools::synthetic_gradient<double>(50000, 3), 500);
}

TEST_CASE("the cuda topk algorithm handles ties NaN and single-bin inputs", "[cuda-logic]") {
  check_emulation(std::vector<float>(100000, 0.5f), 1000);
  std::vector<float> mixed(200000, 1.0f);
  for (std::size_t i = 0; i < mixed.size(); i += 7) mixed[i] = 2.0f;
  check_emulation(mixed, 50000);
  std::vector<float> one_bin(100000);
  std::mt19937 rng(3);
  for (auto& v : one_bin) {
    const std::uint32_t bits = 0x3F800000u | (rng() & 0xFFFFu);
    std::memcpy(&v, &bits, 4);
  }
  check_emulation(one_bin, 777);
  auto with_nan = gradzip_tools::synthetic_gradient<float>(10000, 4);
  with_nan[5] = std::numeric_limits<float>::quiet_NaN();
  with_nan[99] = -std::numeric_limits<float>::infinity();
  check_emulation(with_nan, 100);
  std::vector<double> near = {1.0, 1.0 + 1e-15, 1.0 + 2e-15, -1.0};
  check_emulation(near, 2);
}
