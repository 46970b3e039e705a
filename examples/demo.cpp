// gradzip-demo: compresses one realistic gradient with every codec gradzip has and prints, per
// codec, the compression ratio, the relative L2 error and the host throughput.
//
// The gradient is the documented, seeded, heavy-tailed generator of
// tools/common/synthetic_gradient.hpp (Student-t(3) entries, log-normal per-layer scales, 5 %
// exact zeros). Usage: gradzip-demo [elements (default 2^24)] [seed (default 1)]
#include <gradzip/gradzip.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "common/synthetic_gradient.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

/// Best time of `runs` calls of f.
double best_seconds(int runs, const std::function<void()>& f) {
  double best = 1e30;
  for (int r = 0; r < runs; ++r) {
    const auto start = clock_type::now();
    f();
    best = std::min(best, seconds_since(start));
  }
  return best;
}

double relative_l2(const std::vector<float>& truth, const std::vector<float>& approx) {
  double err = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < truth.size(); ++i) {
    const double d = static_cast<double>(truth[i]) - approx[i];
    err += d * d;
    norm += static_cast<double>(truth[i]) * truth[i];
  }
  return norm > 0 ? std::sqrt(err / norm) : 0.0;
}

struct row {
  std::string codec;
  double ratio;
  double rel_l2;
  double compress_gbps;
  double decompress_gbps;
};

void print(const std::vector<row>& rows, std::size_t n, int threads) {
  std::printf("gradient: %zu float32 (%.1f MiB), heavy-tailed synthetic, host threads: %d\n\n", n,
              n * 4.0 / (1 << 20), threads);
  std::printf("| %-40s | %9s | %11s | %17s | %19s |\n", "codec", "ratio", "rel. L2 err",
              "compress GB/s", "decompress GB/s");
  std::printf("|%s|%s|%s|%s|%s|\n", std::string(42, '-').c_str(), std::string(11, '-').c_str(),
              std::string(13, '-').c_str(), std::string(19, '-').c_str(), std::string(21, '-').c_str());
  for (const auto& r : rows) {
    std::printf("| %-40s | %8.1fx | %11.4f | %17.2f | %19.2f |\n", r.codec.c_str(), r.ratio, r.rel_l2,
                r.compress_gbps, r.decompress_gbps);
  }
  std::printf("\nratio = dense fp32 bytes / payload bytes; GB/s = dense input bytes / time (best of 3);\n"
              "decompress = validated decode + scatter into a dense fp32 tensor.\n");
}

/// One codec on one gradient: ratio, error, and throughput of compress and decompress.
template <class Codec>
row measure(const std::string& name, const Codec& codec, gradzip::host& exec, const std::vector<float>& g) {
  const std::size_t n = g.size();
  exec.reserve(codec.template workspace_bytes<float>(exec, n));
  std::vector<std::byte> payload(codec.template max_compressed_bytes<float>(n));
  std::size_t bytes = 0;
  const double tc = best_seconds(3, [&] {
    bytes = codec.compress(exec, gradzip::span<const float>(g), gradzip::span<std::byte>(payload));
  });
  std::vector<float> dense(n);
  const double td = best_seconds(3, [&] {
    codec.decompress(exec, gradzip::span<const std::byte>(payload.data(), bytes), gradzip::span<float>(dense));
  });
  const double input = n * sizeof(float);
  return {name, input / bytes, relative_l2(g, dense), input / tc / 1e9, input / td / 1e9};
}

/// The codec inside error feedback over `steps` gradients: the error is that of the sum of what
/// was sent against the sum of the gradients, the figure that matters for training.
template <class Codec>
row measure_feedback(const std::string& name, const Codec& codec, gradzip::host& exec,
                     std::size_t n, std::uint64_t seed, int steps) {
  gradzip::feedback::error_feedback<Codec, float, gradzip::host> ef(exec, codec, n);
  std::vector<std::byte> payload(ef.template max_compressed_bytes<float>());
  std::vector<float> sum_true(n, 0.0f), sum_sent(n, 0.0f);
  std::size_t bytes = 0;
  double tc = 1e30;
  for (int s = 0; s < steps; ++s) {
    const auto g = gradzip_tools::synthetic_gradient<float>(n, seed + 1000 + s);
    for (std::size_t i = 0; i < n; ++i) sum_true[i] += g[i];
    const auto start = clock_type::now();
    bytes = ef.compress(exec, gradzip::span<const float>(g), gradzip::span<std::byte>(payload));
    tc = std::min(tc, seconds_since(start));
    codec.decompress_add(exec, gradzip::span<const std::byte>(payload.data(), bytes), gradzip::span<float>(sum_sent));
  }
  std::vector<float> dense(n);
  const double td = best_seconds(3, [&] {
    codec.decompress(exec, gradzip::span<const std::byte>(payload.data(), bytes), gradzip::span<float>(dense));
  });
  const double input = n * sizeof(float);
  return {name, input / bytes, relative_l2(sum_true, sum_sent), input / tc / 1e9, input / td / 1e9};
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (std::size_t{1} << 24);
  const std::uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1;
  if (n == 0) {
    std::fprintf(stderr, "gradzip-demo: elements must be a positive number, got '%s'\n", argv[1]);
    return 2;
  }
  const auto g = gradzip_tools::synthetic_gradient<float>(n, seed);
  gradzip::host exec;
  using topk_codec = gradzip::codec<gradzip::sparsify::topk, gradzip::quantize::none, gradzip::encode::coo>;

  namespace gz = gradzip;
  std::vector<row> rows;
  rows.push_back(measure("dense fp32 (none + none + none)",
                         gz::codec<gz::sparsify::none, gz::quantize::none, gz::encode::none>{}, exec, g));
  rows.push_back(measure("dense cast fp16",
                         gz::codec<gz::sparsify::none, gz::quantize::cast_fp16, gz::encode::none>{}, exec, g));
  rows.push_back(measure("dense cast bf16",
                         gz::codec<gz::sparsify::none, gz::quantize::cast_bf16, gz::encode::none>{}, exec, g));
  rows.push_back(measure("dense uniform 8-bit (bucket 512)",
                         gz::codec<gz::sparsify::none, gz::quantize::uniform<8>, gz::encode::none>{}, exec, g));
  rows.push_back(measure("dense uniform 4-bit (bucket 512)",
                         gz::codec<gz::sparsify::none, gz::quantize::uniform<4>, gz::encode::none>{}, exec, g));
  using stochastic2 = gz::quantize::uniform<2, gz::quantize::rounding::stochastic>;
  rows.push_back(measure("dense uniform 2-bit stochastic",
                         gz::codec<gz::sparsify::none, stochastic2, gz::encode::none>{{}, stochastic2{seed}},
                         exec, g));
  using qsgd4 = gz::quantize::qsgd<7>;
  rows.push_back(measure("dense qsgd 4-bit (7 levels, bucket 128)",
                         gz::codec<gz::sparsify::none, qsgd4, gz::encode::none>{{}, qsgd4{seed}}, exec, g));
  rows.push_back(measure("dense sign (signSGD)",
                         gz::codec<gz::sparsify::none, gz::quantize::sign<false>, gz::encode::none>{}, exec, g));
  rows.push_back(measure("dense scaled sign (EF-SignSGD)",
                         gz::codec<gz::sparsify::none, gz::quantize::scaled_sign, gz::encode::none>{}, exec, g));
  using tern = gz::quantize::terngrad<>;
  rows.push_back(measure("dense terngrad",
                         gz::codec<gz::sparsify::none, tern, gz::encode::none>{{}, tern{seed}}, exec, g));
  rows.push_back(measure("dense 1-bit SGD (two means)",
                         gz::codec<gz::sparsify::none, gz::quantize::onebit<>, gz::encode::none>{}, exec, g));
  for (double ratio : {0.001, 0.01, 0.1}) {
    char name[64];
    std::snprintf(name, sizeof name, "topk %g%% + none + coo", ratio * 100);
    rows.push_back(measure(name, topk_codec{gradzip::sparsify::topk::ratio(ratio)}, exec, g));
  }
  rows.push_back(measure("topk 1% + cast fp16 + coo",
                         gz::codec<gz::sparsify::topk, gz::quantize::cast_fp16, gz::encode::coo>{
                             gz::sparsify::topk::ratio(0.01)},
                         exec, g));
  rows.push_back(measure("topk 1% + uniform 4-bit + coo",
                         gz::codec<gz::sparsify::topk, gz::quantize::uniform<4>, gz::encode::coo>{
                             gz::sparsify::topk::ratio(0.01)},
                         exec, g));
  const int steps = 10;
  rows.push_back(measure_feedback("topk 1% + coo + error feedback x10",
                                  topk_codec{gradzip::sparsify::topk::ratio(0.01)}, exec, n, seed, steps));
  rows.push_back(measure_feedback("scaled sign + error feedback x10",
                                  gz::codec<gz::sparsify::none, gz::quantize::scaled_sign, gz::encode::none>{},
                                  exec, n, seed, steps));
  print(rows, n, exec.threads());
  return 0;
}
