#include <gradzip/gradzip.hpp>

#include <cstdio>
#include <vector>

#if defined(CONSUMER_EXPECTS_OPENMP) && !defined(_OPENMP)
#error "linking gradzip::gradzip did not bring OpenMP: gradzip::host would run on one thread"
#endif

int main() {
  gradzip::codec<gradzip::sparsify::topk> c{gradzip::sparsify::topk::count(1)};
  gradzip::host exec;
  std::vector<float> x = {1, -5, 2};
  std::vector<std::byte> out(c.max_compressed_bytes<float>(x.size()));
  const auto bytes = c.compress(exec, gradzip::span<const float>(x), gradzip::span<std::byte>(out));
  std::vector<float> y(3);
  c.decompress(exec, gradzip::span<const std::byte>(out.data(), bytes), gradzip::span<float>(y));
  std::printf("consumer: %zu bytes, y[1] = %g, %d host threads\n", bytes, y[1], exec.threads());
  return y[1] == -5.0f ? 0 : 1;
}
