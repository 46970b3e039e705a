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
#include <algorithm>
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
  std::printf("| %-48s | %9s | %11s | %17s | %19s |\n", "codec", "ratio", "rel. L2 err",
              "compress GB/s", "decompress GB/s");
  std::printf("|%s|%s|%s|%s|%s|\n", std::string(50, '-').c_str(), std::string(11, '-').c_str(),
              std::string(13, '-').c_str(), std::string(19, '-').c_str(), std::string(21, '-').c_str());
  for (const auto& r : rows) {
    std::printf("| %-48s | %8.1fx | %11.4f | %17.2f | %19.2f |\n", r.codec.c_str(), r.ratio, r.rel_l2,
                r.compress_gbps, r.decompress_gbps);
  }
  std::printf("\nratio = dense fp32 bytes / payload bytes; GB/s = dense input bytes / time (best of 3);\n"
              "decompress = validated decode + scatter into a dense fp32 tensor; count sketch: ratio of\n"
              "the table, decompress = unsketch (estimates + top-k).\n");
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

/// DGC's momentum correction over `steps` gradients: the error is that of the sum of what was
/// sent against the sum of the updates momentum SGD (momentum 0.9) would have applied.
template <class Codec>
row measure_momentum_correction(const std::string& name, const Codec& codec, gradzip::host& exec,
                                std::size_t n, std::uint64_t seed, int steps) {
  const float m = 0.9f;
  gradzip::feedback::momentum_correction<Codec, float, gradzip::host> mc(exec, codec, n, m);
  std::vector<std::byte> payload(mc.template max_compressed_bytes<float>());
  std::vector<float> velocity(n, 0.0f), sum_true(n, 0.0f), sum_sent(n, 0.0f);
  std::size_t bytes = 0;
  double tc = 1e30;
  for (int s = 0; s < steps; ++s) {
    const auto g = gradzip_tools::synthetic_gradient<float>(n, seed + 3000 + s);
    for (std::size_t i = 0; i < n; ++i) {
      velocity[i] = m * velocity[i] + g[i];
      sum_true[i] += velocity[i];
    }
    const auto start = clock_type::now();
    bytes = mc.compress(exec, gradzip::span<const float>(g), gradzip::span<std::byte>(payload));
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

/// Rows for a sparsifier under each index encoding: the same error, different sizes and speeds.
template <class Structure>
void every_encoding(std::vector<row>& rows, const std::string& name, Structure s, gradzip::host& exec,
                    const std::vector<float>& g) {
  namespace gz = gradzip;
  rows.push_back(measure(name + " + coo", gz::codec<Structure, gz::quantize::none, gz::encode::coo>{s}, exec, g));
  rows.push_back(measure(name + " + bitmap", gz::codec<Structure, gz::quantize::none, gz::encode::bitmap>{s}, exec, g));
  rows.push_back(measure(name + " + delta-varint",
                         gz::codec<Structure, gz::quantize::none, gz::encode::delta_varint>{s}, exec, g));
  rows.push_back(measure(name + " + automatic", gz::codec<Structure, gz::quantize::none, gz::encode::automatic>{s}, exec, g));
}

/// Rows for a values stage on its own (dense) and over top-k 1 % values.
template <class Values>
void both(std::vector<row>& rows, const std::string& name, Values values, gradzip::host& exec,
          const std::vector<float>& g) {
  namespace gz = gradzip;
  rows.push_back(measure("dense " + name, gz::codec<gz::sparsify::none, Values, gz::encode::none>{{}, values}, exec, g));
  rows.push_back(measure("topk 1% + " + name,
                         gz::codec<gz::sparsify::topk, Values, gz::encode::coo>{gz::sparsify::topk::ratio(0.01), values},
                         exec, g));
}

/// Signum over `steps` gradients on 4 workers (each its own gradient stream), aggregated by
/// majority vote; the error is that of the summed votes, scaled by the mean |g|, against the
/// summed mean gradient: how well the vote's direction follows the true one.
template <class Codec>
row measure_signum(const std::string& name, const Codec& codec, gradzip::host& exec, std::size_t n,
                   std::uint64_t seed, int steps) {
  constexpr int workers = 4;
  std::vector<gradzip::feedback::signum<Codec, float, gradzip::host>> states;
  for (int w = 0; w < workers; ++w) states.emplace_back(exec, codec, n, 0.9f);
  std::vector<std::vector<std::byte>> payloads(workers, std::vector<std::byte>(codec.template max_compressed_bytes<float>(n)));
  std::vector<float> mean_true(n, 0.0f), votes(n), sum_votes(n, 0.0f);
  std::size_t bytes = 0;
  double tc = 1e30, scale = 0.0;
  for (int s = 0; s < steps; ++s) {
    std::vector<gradzip::span<const std::byte>> views;
    for (int w = 0; w < workers; ++w) {
      const auto g = gradzip_tools::synthetic_gradient<float>(n, seed + 2000 + 100 * w + s);
      for (std::size_t i = 0; i < n; ++i) {
        mean_true[i] += g[i] / workers;
        scale += std::abs(g[i]) / (static_cast<double>(n) * workers * steps);
      }
      const auto start = clock_type::now();
      bytes = states[w].compress(exec, gradzip::span<const float>(g), gradzip::span<std::byte>(payloads[w]), {static_cast<std::uint32_t>(s), 0});
      tc = std::min(tc, seconds_since(start));
      views.emplace_back(payloads[w].data(), bytes);
    }
    gradzip::quantize::majority_vote(exec, codec, gradzip::span<const gradzip::span<const std::byte>>(views),
                                     gradzip::span<float>(votes));
    for (std::size_t i = 0; i < n; ++i) sum_votes[i] += votes[i];
  }
  for (auto& v : sum_votes) v = static_cast<float>(v * scale);
  std::vector<float> dense(n);
  const double td = best_seconds(3, [&] {
    codec.decompress(exec, gradzip::span<const std::byte>(payloads[0].data(), bytes), gradzip::span<float>(dense));
  });
  const double input = n * sizeof(float);
  return {name, input / bytes, relative_l2(mean_true, sum_votes), input / tc / 1e9, input / td / 1e9};
}

/// A count sketch of 10 % of n cells (5 rows), unsketched to the top 0.1 %: the ratio counts
/// the table (what an allreduce moves), the error is that of the unsketched heavy hitters.
row measure_count_sketch(const std::string& name, gradzip::host& exec, const std::vector<float>& g, std::uint64_t seed) {
  const std::size_t n = g.size();
  const std::uint64_t k = std::max<std::size_t>(1, n / 1000);
  const gradzip::sketch::count_sketch cs{5, std::max<std::size_t>(1, n / 10 / 5), seed};
  std::vector<std::byte> table(cs.payload_bytes(n)), top(cs.max_unsketch_bytes(n, k));
  const double tc = best_seconds(3, [&] { cs.compress(exec, gradzip::span<const float>(g), gradzip::span<std::byte>(table)); });
  std::size_t top_bytes = 0;
  const double tu = best_seconds(3, [&] {
    top_bytes = cs.unsketch(exec, gradzip::span<const std::byte>(table), n, k, gradzip::span<std::byte>(top));
  });
  std::vector<float> dense(n);
  gradzip::codec<gradzip::sparsify::topk>{gradzip::sparsify::topk::count(k)}.decompress(
      exec, gradzip::span<const std::byte>(top.data(), top_bytes), gradzip::span<float>(dense));
  const double input = n * sizeof(float);
  return {name, input / table.size(), relative_l2(g, dense), input / tc / 1e9, input / tu / 1e9};
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
  // Every values stage, alone (dense) and over the values of top-k 1 %.
  both(rows, "cast fp16", gz::quantize::cast_fp16{}, exec, g);
  both(rows, "cast bf16", gz::quantize::cast_bf16{}, exec, g);
  both(rows, "cast fp8 e4m3", gz::quantize::cast_fp8_e4m3{}, exec, g);
  both(rows, "cast fp8 e5m2", gz::quantize::cast_fp8_e5m2{}, exec, g);
  both(rows, "uniform 8-bit (bucket 512)", gz::quantize::uniform<8>{}, exec, g);
  both(rows, "uniform 4-bit (bucket 512)", gz::quantize::uniform<4>{}, exec, g);
  both(rows, "uniform 2-bit stochastic", gz::quantize::uniform<2, gz::quantize::rounding::stochastic>{seed}, exec, g);
  both(rows, "qsgd 4-bit (7 levels, bucket 128)", gz::quantize::qsgd<7>{seed}, exec, g);
  both(rows, "qsgd 8-bit (127 levels, bucket 128)", gz::quantize::qsgd<127>{seed}, exec, g);
  both(rows, "terngrad", gz::quantize::terngrad<>{seed}, exec, g);
  both(rows, "terngrad, 2.5 sigma clipping", gz::quantize::terngrad<true>{seed}, exec, g);
  both(rows, "sign (signSGD)", gz::quantize::sign<false>{}, exec, g);
  both(rows, "scaled sign (EF-SignSGD)", gz::quantize::scaled_sign{}, exec, g);
  both(rows, "1-bit SGD (two means)", gz::quantize::onebit<>{}, exec, g);
  both(rows, "natural 8-bit", gz::quantize::natural<8>{seed}, exec, g);
  both(rows, "natural 9-bit", gz::quantize::natural<9>{seed}, exec, g);
  {
    using u4 = gz::codec<gz::sparsify::none, gz::quantize::uniform<4>, gz::encode::none>;
    using q4 = gz::codec<gz::sparsify::none, gz::quantize::qsgd<7>, gz::encode::none>;
    const gz::transform::hadamard rotation{1024, seed};
    rows.push_back(measure("hadamard-rotated uniform 4-bit", gz::transform::rotated<u4>{u4{}, rotation}, exec, g));
    rows.push_back(measure("hadamard-rotated qsgd 4-bit",
                           gz::transform::rotated<q4>{q4{{}, gz::quantize::qsgd<7>{seed}}, rotation}, exec, g));
  }
  for (double ratio : {0.001, 0.01, 0.1}) {
    char name[64];
    std::snprintf(name, sizeof name, "topk %g%%", ratio * 100);
    every_encoding(rows, name, gz::sparsify::topk::ratio(ratio), exec, g);
  }
  every_encoding(rows, "sampled topk (DGC) 1%", gz::sparsify::sampled_topk::ratio(0.01), exec, g);
  {
    std::vector<float> magnitudes(n);
    for (std::size_t i = 0; i < n; ++i) magnitudes[i] = std::abs(g[i]);
    std::nth_element(magnitudes.begin(), magnitudes.begin() + n / 100, magnitudes.end(), std::greater<>());
    const gz::sparsify::threshold cut{magnitudes[n / 100]};  // keeps about 1 %
    every_encoding(rows, "threshold (tau at the top 1 %)", cut, exec, g);
    rows.push_back(measure("threshold (tau at the top 1 %) + uniform 8-bit",
                           gz::codec<gz::sparsify::threshold, gz::quantize::uniform<8>>{cut}, exec, g));
  }
  every_encoding(rows, "blockwise topk 10 of every 1024", gz::sparsify::blockwise_topk{1024, 10}, exec, g);
  rows.push_back(measure("hashed topk 1% into 3% slots + automatic",
                         gz::codec<gz::hash::hashed_topk, gz::quantize::none, gz::encode::automatic>{
                             gz::hash::hashed_topk::ratio(0.01, 0.03)},
                         exec, g));
  rows.push_back(measure_count_sketch("count sketch 5 x n/50, unsketch top 0.1%", exec, g, seed));
  rows.push_back(measure("simhash B 1024, 128 bits (0.16 bit/elem)", gz::hash::simhash{1024, 128, seed}, exec, g));
  rows.push_back(measure("simhash B 1024, 1024 bits (1 bit/elem)", gz::hash::simhash{1024, 1024, seed}, exec, g));
  rows.push_back(measure("randomk 1% (no indices on the wire)",
                         gz::codec<gz::sparsify::randomk, gz::quantize::none, gz::encode::none>{
                             gz::sparsify::randomk::ratio(0.01, seed)},
                         exec, g));
  rows.push_back(measure("randomk 1% + cast bf16",
                         gz::codec<gz::sparsify::randomk, gz::quantize::cast_bf16, gz::encode::none>{
                             gz::sparsify::randomk::ratio(0.01, seed)},
                         exec, g));
  const int steps = 10;
  rows.push_back(measure_feedback("topk 1% + coo + error feedback x10",
                                  topk_codec{gradzip::sparsify::topk::ratio(0.01)}, exec, n, seed, steps));
  rows.push_back(measure_momentum_correction("sampled topk 1% + auto + DGC momentum x10",
                                             gz::codec<gz::sparsify::sampled_topk, gz::quantize::none, gz::encode::automatic>{
                                                 gz::sparsify::sampled_topk::ratio(0.01)},
                                             exec, n, seed, steps));
  rows.push_back(measure_feedback("scaled sign + error feedback x10",
                                  gz::codec<gz::sparsify::none, gz::quantize::scaled_sign, gz::encode::none>{},
                                  exec, n, seed, steps));
  using sign_codec = gz::codec<gz::sparsify::none, gz::quantize::sign<false>, gz::encode::none>;
  rows.push_back(measure_signum("signum (beta 0.9) x10, 4 workers' majority vote", sign_codec{}, exec, n, seed, steps));
  print(rows, n, exec.threads());
  return 0;
}
