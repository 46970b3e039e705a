// PowerSGD on the host: one rank's step (compress_p, compress_q, decompress, with error
// feedback and warm start) and its two products alone, on matrix shapes from real models, at
// ranks 1, 2 and 4. Input bytes are the matrix's (rows x cols x 4); a step reads and writes M
// about eight times (docs/performance.md), so a roofline fraction near 1/8 is the memory bound.
#include <vector>

#include "common.hpp"
#include "gradzip/lowrank/powersgd.hpp"

namespace {

using gradzip::lowrank::factor;

/// rows x cols: a ResNet-50 3x3 conv (512 x 4608), a transformer MLP weight (1024 x 4096) and
/// the MLP of examples/mpi_train (128 x 784).
void shapes(benchmark::internal::Benchmark* b) {
  for (const auto& s : std::vector<std::pair<int, int>>{{512, 4608}, {1024, 4096}, {128, 784}}) {
    for (int rank : {1, 2, 4}) b->Args({s.first, s.second, rank});
  }
}

void BM_powersgd_step(benchmark::State& state) {
  const auto rows = static_cast<std::size_t>(state.range(0)), cols = static_cast<std::size_t>(state.range(1));
  gradzip::host exec;
  gradzip::lowrank::powersgd_params params;
  params.rank = static_cast<int>(state.range(2));
  gradzip::lowrank::powersgd<float, gradzip::host> ps(exec, {{rows, cols}}, params);
  const std::vector<float>& g = gradzip_bench::gradient(rows * cols);
  std::vector<float> out(g.size());
  std::vector<std::byte> p(ps.payload_bytes(factor::p)), q(ps.payload_bytes(factor::q));
  std::uint32_t step = 0;
  gradzip_bench::run_timed(state, exec, g.size() * sizeof(float), [&] {
    ps.compress_p(exec, gradzip::span<const float>(g), gradzip::span<std::byte>(p), {step++, 0});
    ps.compress_q(exec, gradzip::span<const std::byte>(p), gradzip::span<std::byte>(q));
    ps.decompress(exec, gradzip::span<const std::byte>(q), 1, gradzip::span<float>(out));
    benchmark::DoNotOptimize(out.data());
  });
}

/// P = M Q and Q = M^T P alone: each reads M once.
template <bool Transposed>
void BM_powersgd_product(benchmark::State& state) {
  const auto rows = static_cast<std::size_t>(state.range(0)), cols = static_cast<std::size_t>(state.range(1));
  const int rank = static_cast<int>(state.range(2));
  gradzip::host exec;
  const std::vector<float>& m = gradzip_bench::gradient(rows * cols);
  std::vector<float> p(rows * rank, 0.5f), q(cols * rank, 0.25f);
  using backend = gradzip::detail::lowrank_backend<gradzip::host>;
  gradzip_bench::run_timed(state, exec, m.size() * sizeof(float), [&] {
    if constexpr (Transposed) {
      backend::project_transposed(exec, m.data(), rows, cols, p.data(), rank, q.data(), nullptr);
      benchmark::DoNotOptimize(q.data());
    } else {
      backend::project(exec, m.data(), rows, cols, q.data(), rank, p.data());
      benchmark::DoNotOptimize(p.data());
    }
  });
}

}  // namespace

BENCHMARK(BM_powersgd_step)->Apply(shapes)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_powersgd_product, false)->Apply(shapes)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_powersgd_product, true)->Apply(shapes)->UseRealTime()->Unit(benchmark::kMillisecond);
