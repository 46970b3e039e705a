// Compiled with -Werror, without OpenMP and without the CUDA include path: what a plain C++
// consumer of gradzip::gradzip sees.
#include <catch2/catch.hpp>

#include <vector>

#include "gradzip/gradzip.hpp"

TEST_CASE("gradzip.hpp works in plain C++ without CUDA headers or OpenMP", "[plain]") {
  STATIC_REQUIRE(GRADZIP_HAS_HALF == 0 || GRADZIP_HAS_HALF == 1);
  gradzip::codec<gradzip::sparsify::topk> c{gradzip::sparsify::topk::count(2)};
  gradzip::host exec;
  CHECK(exec.threads() >= 1);
  std::vector<float> x = {1, -8, 3, 9};
  std::vector<std::byte> out(c.max_compressed_bytes<float>(x.size()));
  const auto bytes = c.compress(exec, gradzip::span<const float>(x), gradzip::span<std::byte>(out));
  std::vector<float> back(4);
  c.decompress(exec, gradzip::span<const std::byte>(out.data(), bytes), gradzip::span<float>(back));
  CHECK(back == std::vector<float>{0, -8, 0, 9});
}

TEST_CASE("compress_context takes a training loop's 64-bit step counter", "[plain]") {
  using stochastic = gradzip::quantize::uniform<4, gradzip::quantize::rounding::stochastic>;
  const gradzip::codec<gradzip::sparsify::none, stochastic, gradzip::encode::none> c{{}, stochastic{3}};
  gradzip::host exec;
  std::vector<float> x(1000);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) * 0.1f - 0.3f;  // between levels
  std::vector<std::byte> a(c.max_compressed_bytes<float>(x.size())), b(a.size());
  std::uint64_t step = 41;       // what a training loop counts with
  const std::size_t tensor = 2;  // an index into the model's parameters
  c.compress(exec, gradzip::span<const float>(x), gradzip::span<std::byte>(a), {step, tensor});
  ++step;
  c.compress(exec, gradzip::span<const float>(x), gradzip::span<std::byte>(b), {step, tensor});
  CHECK(a != b);  // a fresh draw each step
  // Both key 32-bit Philox counter words and 4-byte payload fields: larger values are refused.
  CHECK_THROWS_AS(c.compress(exec, gradzip::span<const float>(x), gradzip::span<std::byte>(a), {std::uint64_t{1} << 32, 0}),
                  gradzip::invalid_argument);
}
