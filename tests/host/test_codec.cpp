#include <catch2/catch.hpp>

#include <cmath>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"

using namespace gradzip;

TEST_CASE("compress then decompress keeps exactly the top-k values", "[codec]") {
  const auto g = gradzip_tools::synthetic_gradient<float>(100003, 1);
  codec<sparsify::topk> c{sparsify::topk::ratio(0.05)};
  host exec;
  const auto payload = test::compress(c, exec, g);
  std::vector<float> dense(g.size(), 123.0f);
  c.decompress(exec, span<const std::byte>(payload), span<float>(dense));
  const auto idx = test::reference_topk(g, c.structure().selected_count(g.size()));
  std::vector<bool> chosen(g.size());
  for (auto i : idx) chosen[i] = true;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (chosen[i]) {
      REQUIRE(std::memcmp(&dense[i], &g[i], 4) == 0);
    } else {
      REQUIRE(dense[i] == 0.0f);
    }
  }
}

TEST_CASE("payload size is exact and matches max_compressed_bytes", "[codec]") {
  codec<sparsify::topk> c{sparsify::topk::count(3)};
  host exec;
  std::vector<float> x(10, 1.0f);
  CHECK(c.max_compressed_bytes<float>(10) == 176);
  CHECK(test::compress(c, exec, x).size() == 176);
  CHECK(c.max_compressed_bytes<double>(10) == 192);  // 24 value bytes: 160 + 24, rounded up
  CHECK(c.max_compressed_bytes<double>(100) == 192);
  // n >= 2^32 switches to 8-byte indices (computed without allocating such a tensor).
  CHECK(codec<sparsify::topk>::layout(element_type::f32, std::uint64_t{1} << 32, 10).at(1).size == 80);
  CHECK(codec<sparsify::topk>::layout(element_type::f32, (std::uint64_t{1} << 32) - 1, 10).at(1).size == 40);
}

TEST_CASE("compress rejects an output buffer that is too small", "[codec]") {
  codec<sparsify::topk> c{sparsify::topk::count(3)};
  host exec;
  std::vector<float> x(10, 1.0f);
  std::vector<std::byte> out(175);
  CHECK_THROWS_WITH(c.compress(exec, span<const float>(x), span<std::byte>(out)),
                    "compress: output buffer holds 175 bytes, the payload needs 176");
}

TEST_CASE("decompress_add scatters and adds with a scale", "[codec]") {
  codec<sparsify::topk> c{sparsify::topk::count(2)};
  host exec;
  std::vector<float> x = {0.5f, -4.0f, 1.0f, 3.0f};
  const auto p = test::compress(c, exec, x);
  std::vector<float> acc = {1, 1, 1, 1};
  c.decompress_add(exec, span<const std::byte>(p), span<float>(acc));
  CHECK(acc == std::vector<float>{1, -3, 1, 4});
  c.decompress_add(exec, span<const std::byte>(p), span<float>(acc), 0.5f);
  CHECK(acc == std::vector<float>{1, -5, 1, 5.5f});
  c.decompress_add(exec, span<const std::byte>(p), span<float>(acc), -1.5f);
  CHECK(acc == std::vector<float>{1, 1, 1, 1});
}

TEST_CASE("payloads decode into other accumulator types", "[codec]") {
  codec<sparsify::topk> c{sparsify::topk::count(2)};
  host exec;
  std::vector<double> x = {0.1, -4.25, 1.0, 3.0};
  const auto p = test::compress(c, exec, x);
  std::vector<float> f(4);
  c.decompress(exec, span<const std::byte>(p), span<float>(f));
  CHECK(f == std::vector<float>{0, -4.25f, 0, 3.0f});
#if GRADZIP_HAS_HALF
  std::vector<__half> h(4, __float2half(1.0f));
  c.decompress_add(exec, span<const std::byte>(p), span<__half>(h));
  CHECK(__half2float(h[1]) == -3.25f);
  CHECK(__half2float(h[3]) == 4.0f);
  // And the other way: a half payload into a float accumulator (host decodes halves without
  // CUDA's headers, so check that decoder against CUDA's conversion on every half value).
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    const auto hv = detail::bit_cast<__half>(static_cast<std::uint16_t>(bits));
    const float expected = __half2float(hv);
    const float got = detail::half_bits_to_float(static_cast<std::uint16_t>(bits));
    if (std::isnan(expected)) {
      REQUIRE(std::isnan(got));
    } else {
      REQUIRE(detail::bit_cast<std::uint32_t>(got) == detail::bit_cast<std::uint32_t>(expected));
    }
  }
#endif
}

TEST_CASE("payloads are identical for identical input and differ in the header's n", "[codec]") {
  const auto g = gradzip_tools::synthetic_gradient<float>(5000, 3);
  codec<sparsify::topk> c{sparsify::topk::count(50)};
  host exec;
  CHECK(test::compress(c, exec, g) == test::compress(c, exec, g));
  const auto payload = test::compress(c, exec, g);
  const auto h = wire::read_header(span<const std::byte>(payload));
  CHECK(h.element_count == 5000);
  CHECK(h.codec == codec<sparsify::topk>::id);
}

TEST_CASE("a moved-from host executor is empty and still works", "[host]") {
  const gradzip::codec<gradzip::sparsify::topk> c{gradzip::sparsify::topk::ratio(0.1)};
  const std::vector<float> x{1, -5, 2, 8, -3, 0.5f, 7, -9, 4, 6};
  gradzip::host a{1};
  a.reserve(4096);
  gradzip::host b = std::move(a);
  CHECK(b.scratch_capacity() >= 4096);
  CHECK(a.scratch_capacity() == 0);  // NOLINT(bugprone-use-after-move): the state is defined
  CHECK(a.threads() == 1);
  std::vector<std::byte> out(c.max_compressed_bytes<float>(x.size()));
  const std::size_t bytes = c.compress(a, gradzip::span<const float>(x), gradzip::span<std::byte>(out));
  std::vector<float> dense(x.size());
  c.decompress(a, gradzip::span<const std::byte>(out.data(), bytes), gradzip::span<float>(dense));
  CHECK(dense[7] == -9.0f);
  gradzip::host d;
  d = std::move(b);
  CHECK(b.scratch_capacity() == 0);  // NOLINT(bugprone-use-after-move)
  CHECK(d.scratch_capacity() >= 4096);
}
