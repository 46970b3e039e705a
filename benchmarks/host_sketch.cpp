// Host count sketch: sketching 2^16 .. 2^26 floats with 5 rows (each row reads the input once:
// input_GBps counts rows x n x 4 bytes, so "roofline" is per-row read bandwidth against a
// memcpy), and the recall of the true top-k (k = n / 1000) after unsketching, for sketches of
// 1 %, 5 % and 10 % of n cells (columns = cells / 5) on the heavy-tailed synthetic gradient.
// The median-of-rows estimate of every element (unsketch's first step) from the same sketch.
// SimHash (B = 1024, m = 32 .. 1024 bits per block) and scaled sign on the same 2^22-element
// gradient: compress GB/s, payload bits per element and the relative L2 error of one decode,
// the error-against-bits comparison docs/sketching.md tabulates.
#include <algorithm>
#include <cmath>

#include "common.hpp"
#include "gradzip/gradzip.hpp"
#include "gradzip/sketch/count_sketch.hpp"

namespace {

constexpr std::uint32_t rows = 5;

void BM_count_sketch(benchmark::State& state) {
  gradzip::host exec;
  const auto& g = gradzip_bench::gradient(static_cast<std::size_t>(state.range(0)));
  const gradzip::sketch::count_sketch cs{rows, std::max<std::size_t>(1, g.size() / 100 / rows), 7};
  std::vector<std::byte> out(cs.payload_bytes(g.size()));
  gradzip_bench::run_timed(state, exec, rows * g.size() * sizeof(float), [&] {
    benchmark::DoNotOptimize(cs.compress(exec, gradzip::span<const float>(g), gradzip::span<std::byte>(out)));
  });
  state.counters["out_bytes_per_elem"] = static_cast<double>(out.size()) / static_cast<double>(g.size());
}

/// Every element's median-of-rows estimate from a sketch (unsketch's first step, and each
/// FetchSGD step's): input GB/s counts the n estimates written (4 bytes each) once.
void BM_count_sketch_estimate(benchmark::State& state) {
  gradzip::host exec;
  const auto& g = gradzip_bench::gradient(static_cast<std::size_t>(state.range(0)));
  const gradzip::sketch::count_sketch cs{rows, std::max<std::size_t>(1, g.size() / 100 / rows), 7};
  std::vector<std::byte> table(cs.payload_bytes(g.size()));
  cs.compress(exec, gradzip::span<const float>(g), gradzip::span<std::byte>(table));
  std::vector<float> estimates(g.size());
  gradzip_bench::run_timed(state, exec, g.size() * sizeof(float), [&] {
    cs.estimate(exec, gradzip::span<const std::byte>(table), gradzip::span<float>(estimates));
    benchmark::DoNotOptimize(estimates.data());
  });
}

/// Recall of the true top-k among the unsketched top-k, for a sketch of `percent` % of n cells.
void BM_count_sketch_recall(benchmark::State& state) {
  gradzip::host exec;
  const std::size_t n = std::size_t{1} << 22;
  const auto& g = gradzip_bench::gradient(n);
  const std::uint64_t k = n / 1000;
  const gradzip::sketch::count_sketch cs{rows, n * static_cast<std::size_t>(state.range(0)) / 100 / rows, 11};
  const gradzip::codec<gradzip::sparsify::topk> exact{gradzip::sparsify::topk::count(k)};
  std::vector<std::byte> table(cs.payload_bytes(n)), top(cs.max_unsketch_bytes(n, k)), truth(exact.max_compressed_bytes<float>(n));
  truth.resize(exact.compress(exec, gradzip::span<const float>(g), gradzip::span<std::byte>(truth)));
  const auto truth_h = gradzip::wire::read_header(gradzip::span<const std::byte>(truth));
  std::vector<std::uint32_t> want(k), got(k);
  std::memcpy(want.data(), truth.data() + truth_h.sections[1].offset, k * 4);
  double recall = 0.0;
  for (auto _ : state) {
    cs.compress(exec, gradzip::span<const float>(g), gradzip::span<std::byte>(table));
    const std::size_t bytes = cs.unsketch(exec, gradzip::span<const std::byte>(table), n, k, gradzip::span<std::byte>(top));
    const auto h = gradzip::wire::read_header(gradzip::span<const std::byte>(top.data(), bytes));
    std::memcpy(got.data(), top.data() + h.sections[1].offset, k * 4);
    std::size_t hits = 0;
    for (auto i : got) hits += std::binary_search(want.begin(), want.end(), i) ? 1 : 0;
    recall = static_cast<double>(hits) / static_cast<double>(k);
  }
  state.counters["recall"] = recall;
  state.counters["sketch_percent_of_n"] = static_cast<double>(state.range(0));
}

/// ||x^ - x|| / ||x|| of one compress and decode.
template <class Compressor>
double relative_error(gradzip::host& exec, const Compressor& c, const std::vector<float>& g, std::vector<std::byte>& out,
                      std::size_t bytes) {
  std::vector<float> decoded(g.size());
  c.decompress(exec, gradzip::span<const std::byte>(out.data(), bytes), gradzip::span<float>(decoded));
  double err = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    err += (decoded[i] - static_cast<double>(g[i])) * (decoded[i] - static_cast<double>(g[i]));
    norm += static_cast<double>(g[i]) * g[i];
  }
  return std::sqrt(err / norm);
}

template <class Compressor>
void error_and_speed(benchmark::State& state, const Compressor& c) {
  gradzip::host exec;
  const auto& g = gradzip_bench::gradient(std::size_t{1} << 22);
  exec.reserve(c.template workspace_bytes<float>(exec, g.size()));
  std::vector<std::byte> out(c.template max_compressed_bytes<float>(g.size()));
  std::size_t bytes = 0;
  gradzip_bench::run_timed(state, exec, g.size() * sizeof(float), [&] {
    bytes = c.compress(exec, gradzip::span<const float>(g), gradzip::span<std::byte>(out));
  });
  state.counters["bits_per_element"] = 8.0 * static_cast<double>(bytes) / static_cast<double>(g.size());
  state.counters["rel_l2_error"] = relative_error(exec, c, g, out, bytes);
}

void BM_simhash(benchmark::State& state) {
  error_and_speed(state, gradzip::hash::simhash{1024, static_cast<std::uint32_t>(state.range(0)), 3});
}

void BM_scaled_sign(benchmark::State& state) {
  error_and_speed(state, gradzip::codec<gradzip::sparsify::none, gradzip::quantize::scaled_sign, gradzip::encode::none>{});
}

}  // namespace

BENCHMARK(BM_count_sketch)->Apply(gradzip_bench::size_axis)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_count_sketch_estimate)->Apply(gradzip_bench::size_axis)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_count_sketch_recall)->Arg(1)->Arg(5)->Arg(10)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_simhash)->RangeMultiplier(2)->Range(32, 1024)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_scaled_sign)->UseRealTime()->Unit(benchmark::kMillisecond);
