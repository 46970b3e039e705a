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
