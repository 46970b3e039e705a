// gradzip quick start (host): top-1 % of a gradient, sent as one payload, accumulated back.
#include <gradzip/gradzip.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  const std::size_t n = 1 << 20;
  std::vector<float> grad(n);
  for (std::size_t i = 0; i < n; ++i) grad[i] = std::sin(0.001f * i) * std::exp(-1e-5f * i);

  // A codec is a value: structure (top-k) x values (sent as-is) x indices (COO).
  using codec_t = gradzip::codec<gradzip::sparsify::topk, gradzip::quantize::none,
                                 gradzip::encode::coo>;
  const codec_t codec{gradzip::sparsify::topk::ratio(0.01)};

  // The executor owns scratch; reserve once and no later call allocates.
  gradzip::host exec;
  exec.reserve(codec.workspace_bytes<float>(exec, n));

  // Error feedback keeps what top-k drops and sends it in a later step.
  gradzip::feedback::error_feedback<codec_t, float, gradzip::host> ef(exec, codec, n);
  std::vector<std::byte> payload(ef.max_compressed_bytes<float>());
  const std::size_t bytes =
      ef.compress(exec, gradzip::span<const float>(grad), gradzip::span<std::byte>(payload));

  // ... send `bytes` bytes with MPI, NCCL, Gloo ...; the receiver validates and accumulates.
  std::vector<float> accum(n, 0.0f);
  codec.decompress_add(exec, gradzip::span<const std::byte>(payload.data(), bytes),
                       gradzip::span<float>(accum));

  const auto header = gradzip::wire::read_header(gradzip::span<const std::byte>(payload.data(), bytes));
  std::printf("%zu floats -> %zu bytes (%.1fx smaller), %llu elements in the payload header\n", n,
              bytes, double(n * sizeof(float)) / bytes,
              static_cast<unsigned long long>(header.element_count));
  return 0;
}
