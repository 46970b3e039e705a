// Host top-k at 1 % beside std::nth_element and the copy roofline, 2^16 .. 2^26 floats.
// Each reports input GB/s (input_GBps) and its fraction of a plain copy (roofline).
#include <cmath>
#include <functional>
#include <numeric>

#include "common.hpp"
#include "gradzip/gradzip.hpp"

namespace {

using topk_codec = gradzip::codec<gradzip::sparsify::topk>;

void BM_copy_roofline(benchmark::State& state) {
  gradzip::host exec;
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) * sizeof(float);
  std::vector<char> src(bytes, 1), dst(bytes);
  const std::size_t chunks = gradzip::detail::chunk_count(exec, bytes, 1 << 16);
  gradzip_bench::run_timed(state, exec, bytes, [&] {
    gradzip::detail::for_each_chunk(exec, chunks, [&](std::size_t c) {
      const auto r = gradzip::detail::chunk_of(bytes, chunks, c);
      std::memcpy(dst.data() + r.begin, src.data() + r.begin, r.end - r.begin);
    });
    benchmark::ClobberMemory();
  });
}

void BM_topk_gradzip(benchmark::State& state) {
  gradzip::host exec;
  const auto& g = gradzip_bench::gradient(static_cast<std::size_t>(state.range(0)));
  const topk_codec c{gradzip::sparsify::topk::ratio(0.01)};
  std::vector<std::byte> out(c.max_compressed_bytes<float>(g.size()));
  exec.reserve(c.workspace_bytes<float>(exec, g.size()));
  gradzip_bench::run_timed(state, exec, g.size() * sizeof(float), [&] {
    benchmark::DoNotOptimize(c.compress(exec, gradzip::span<const float>(g), gradzip::span<std::byte>(out)));
  });
  state.counters["threads"] = exec.threads();
}

// Threshold selection keeping about 1 % (tau = the magnitude top-k 1 % would cut at): two reads
// of the input (count per chunk, then emit), COO indices and fp32 values.
void BM_threshold(benchmark::State& state) {
  gradzip::host exec;
  const auto& g = gradzip_bench::gradient(static_cast<std::size_t>(state.range(0)));
  std::vector<float> magnitudes(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) magnitudes[i] = std::abs(g[i]);
  std::nth_element(magnitudes.begin(), magnitudes.begin() + g.size() / 100, magnitudes.end(), std::greater<>());
  const gradzip::codec<gradzip::sparsify::threshold> c{gradzip::sparsify::threshold{magnitudes[g.size() / 100]}};
  std::vector<std::byte> out(c.max_compressed_bytes<float>(g.size()));
  exec.reserve(c.workspace_bytes<float>(exec, g.size()));
  gradzip_bench::run_timed(state, exec, g.size() * sizeof(float), [&] {
    benchmark::DoNotOptimize(c.compress(exec, gradzip::span<const float>(g), gradzip::span<std::byte>(out)));
  });
}

// DGC's sampled top-k at 1 %: a 1 % sample, a histogram round, then the threshold passes.
void BM_sampled_topk(benchmark::State& state) {
  gradzip::host exec;
  const auto& g = gradzip_bench::gradient(static_cast<std::size_t>(state.range(0)));
  const gradzip::codec<gradzip::sparsify::sampled_topk> c{gradzip::sparsify::sampled_topk::ratio(0.01)};
  std::vector<std::byte> out(c.max_compressed_bytes<float>(g.size()));
  exec.reserve(c.workspace_bytes<float>(exec, g.size()));
  std::size_t bytes = 0;
  gradzip_bench::run_timed(state, exec, g.size() * sizeof(float), [&] {
    bytes = c.compress(exec, gradzip::span<const float>(g), gradzip::span<std::byte>(out));
    benchmark::DoNotOptimize(bytes);
  });
  const auto h = gradzip::wire::read_header(gradzip::span<const std::byte>(out.data(), bytes));
  const auto kept = gradzip::wire::detail::load_le(reinterpret_cast<const std::uint8_t*>(out.data()) + h.sections[0].offset, 8);
  state.counters["kept_over_k"] = static_cast<double>(kept) / static_cast<double>(c.structure().target_count(g.size()));
}

// The baseline: the same selection (|x| descending, lower index first, indices sorted) by
// std::nth_element over (key, index) pairs, then a sort of the k chosen indices.
void BM_topk_nth_element(benchmark::State& state) {
  gradzip::host exec;
  const auto& g = gradzip_bench::gradient(static_cast<std::size_t>(state.range(0)));
  const std::size_t k = gradzip::sparsify::topk::ratio(0.01).selected_count(g.size());
  std::vector<std::pair<std::uint32_t, std::uint32_t>> keyed(g.size());
  std::vector<std::uint32_t> indices(k);
  std::vector<float> values(k);
  gradzip_bench::run_timed(state, exec, g.size() * sizeof(float), [&] {
    for (std::size_t i = 0; i < g.size(); ++i) {
      keyed[i] = {gradzip::magnitude_key(g[i]), static_cast<std::uint32_t>(i)};
    }
    std::nth_element(keyed.begin(), keyed.begin() + (k - 1), keyed.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    for (std::size_t j = 0; j < k; ++j) indices[j] = keyed[j].second;
    std::sort(indices.begin(), indices.end());
    for (std::size_t j = 0; j < k; ++j) values[j] = g[indices[j]];
    benchmark::DoNotOptimize(values.data());
  });
}

void BM_decompress_add(benchmark::State& state) {
  gradzip::host exec;
  const auto& g = gradzip_bench::gradient(static_cast<std::size_t>(state.range(0)));
  const topk_codec c{gradzip::sparsify::topk::ratio(0.01)};
  std::vector<std::byte> out(c.max_compressed_bytes<float>(g.size()));
  const std::size_t bytes = c.compress(exec, gradzip::span<const float>(g), gradzip::span<std::byte>(out));
  std::vector<float> accum(g.size());
  gradzip_bench::run_timed(state, exec, bytes, [&] {
    c.decompress_add(exec, gradzip::span<const std::byte>(out.data(), bytes), gradzip::span<float>(accum));
    benchmark::ClobberMemory();
  });
  state.counters["payload_bytes"] = static_cast<double>(bytes);
}

}  // namespace

BENCHMARK(BM_copy_roofline)->Apply(gradzip_bench::size_axis)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_topk_gradzip)->Apply(gradzip_bench::size_axis)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_threshold)->Apply(gradzip_bench::size_axis)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_sampled_topk)->Apply(gradzip_bench::size_axis)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_topk_nth_element)->Apply(gradzip_bench::size_axis)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_decompress_add)->Apply(gradzip_bench::size_axis)->UseRealTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
