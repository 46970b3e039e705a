// CUDA sketching, 2^16 .. 2^28 fp32 elements, timed with CUDA events beside a device copy of
// the same bytes measured in the same run (roofline = input GB/s / copy GB/s):
// - Count Sketch compress, 5 rows of n/500 columns (input GB/s counts rows x n x 4 bytes: each
//   row reads the input once, as on the host), and unsketch to k = n/1000;
// - one FetchSGD step on a summed sketch (the cell update, unsketch, the sent cells zeroed);
// - SimHash, B = 1024, m = 128 bits per block;
// - hashed top-k at 1 %, and the same through compress_async (no host synchronization);
// - Zen's split of n/100 sorted indices over 64 parts;
// - one step of Zen's sparse synchronization (Balanced Parallelism) of n/100 nonzeros on one
//   rank: every kernel and host synchronization of a step, without a network (input GB/s
//   counts the nonzeros' 12 bytes each).
// Without a GPU every benchmark reports "no CUDA device" and skips.
#include <random>

#include "cuda_common.cuh"

namespace {

using namespace gradzip_bench;
namespace gz = gradzip;

constexpr std::uint32_t rows = 5;

/// A device allocation freed at scope exit.
template <class T>
struct device_array {
  T* data = nullptr;
  std::size_t size = 0;
  explicit device_array(std::size_t n) : size(n) { GRADZIP_CUDA_TRY(cudaMalloc(&data, n * sizeof(T) + 16)); }
  ~device_array() { cudaFree(data); }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  gz::span<T> view() const { return gz::span<T>(data, size); }
};

void report_roofline(benchmark::State& state, std::size_t copy_bytes, cudaStream_t stream) {
  state.counters["copy_GBps"] = copy_roofline(copy_bytes, stream) / 1e9;
  state.counters["roofline"] = state.counters["input_GBps"] / state.counters["copy_GBps"];
}

gz::sketch::count_sketch sketch_for(std::size_t n) { return {rows, std::max<std::size_t>(1, n / 500), 7}; }

void BM_cuda_count_sketch(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  gz::cuda exec;
  const auto cs = sketch_for(n);
  float* x = upload_gradient<float>(n);
  device_array<std::byte> table(cs.payload_bytes(n));
  exec.reserve(cs.workspace_bytes<float>(exec, n));
  time_events(state, exec.stream(), rows * n * sizeof(float),
              [&] { cs.compress(exec, gz::span<const float>(x, n), table.view()); });
  report_roofline(state, n * sizeof(float), exec.stream());
  cudaFree(x);
}

void BM_cuda_count_sketch_unsketch(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  gz::cuda exec;
  const auto cs = sketch_for(n);
  float* x = upload_gradient<float>(n);
  device_array<std::byte> table(cs.payload_bytes(n)), top(cs.max_unsketch_bytes(n, n / 1000 + 1));
  cs.compress(exec, gz::span<const float>(x, n), table.view());
  time_events(state, exec.stream(), n * sizeof(float), [&] {
    cs.unsketch(exec, gz::span<const std::byte>(table.data, table.size), n, n / 1000 + 1, top.view());
  });
  exec.check();
  report_roofline(state, n * sizeof(float), exec.stream());
  cudaFree(x);
}

void BM_cuda_fetchsgd_step(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  gz::cuda exec;
  const auto cs = sketch_for(n);
  gz::sketch::fetchsgd fs{exec, cs, n, n / 1000 + 1, 0.9f};
  float* x = upload_gradient<float>(n);
  device_array<std::byte> table(cs.payload_bytes(n)), update(fs.max_update_bytes());
  cs.compress(exec, gz::span<const float>(x, n), table.view());
  time_events(state, exec.stream(), n * sizeof(float),
              [&] { fs.step(exec, gz::span<const std::byte>(table.data, table.size), update.view(), 0.25f, 0.1f); });
  exec.check();
  report_roofline(state, n * sizeof(float), exec.stream());
  cudaFree(x);
}

void BM_cuda_simhash(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  gz::cuda exec;
  const gz::hash::simhash sh{1024, 128, 3};
  float* x = upload_gradient<float>(n);
  device_array<std::byte> out(sh.max_compressed_bytes<float>(n));
  time_events(state, exec.stream(), n * sizeof(float),
              [&] { sh.compress(exec, gz::span<const float>(x, n), out.view()); });
  report_roofline(state, n * sizeof(float), exec.stream());
  cudaFree(x);
}

template <bool Async>
void BM_cuda_hashed_topk(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  gz::cuda exec;
  const gz::codec<gz::hash::hashed_topk> c{gz::hash::hashed_topk::ratio(0.01)};
  float* x = upload_gradient<float>(n);
  device_array<std::byte> out(c.max_compressed_bytes<float>(n));
  device_array<std::uint64_t> size(1);
  exec.reserve(c.workspace_bytes<float>(exec, n) + 4096);
  time_events(state, exec.stream(), n * sizeof(float), [&] {
    if constexpr (Async) {
      c.compress_async(exec, gz::span<const float>(x, n), out.view(), size.data);
    } else {
      c.compress(exec, gz::span<const float>(x, n), out.view());
    }
  });
  report_roofline(state, n * sizeof(float), exec.stream());
  cudaFree(x);
}

void BM_cuda_partition_split(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  gz::cuda exec;
  const gz::hash::partition zen{64, 5};
  std::vector<std::uint64_t> sorted;
  std::mt19937_64 rng(9);
  for (std::uint64_t i = 0; i < n; ++i) {
    if (rng() % 100 == 0) sorted.push_back(i);
  }
  const std::uint64_t capacity = sorted.size() / 64 + sorted.size() / 640 + 1, overflow = sorted.size() / 100 + 1;
  device_array<std::uint64_t> indices(sorted.size()), slots(64 * capacity), counts(64), spill(overflow);
  device_array<std::uint32_t> spill_parts(overflow);
  GRADZIP_CUDA_TRY(cudaMemcpy(indices.data, sorted.data(), sorted.size() * 8, cudaMemcpyHostToDevice));
  std::uint64_t unplaced = 0;
  time_events(state, exec.stream(), sorted.size() * sizeof(std::uint64_t), [&] {
    unplaced = zen.split_fixed(exec, gz::span<const std::uint64_t>(indices.data, indices.size), n, capacity, overflow,
                               slots.view(), counts.view(), spill.view(), spill_parts.view())
                   .unplaced;
  });
  state.counters["indices"] = static_cast<double>(sorted.size());
  state.counters["unplaced"] = static_cast<double>(unplaced);
  report_roofline(state, sorted.size() * sizeof(std::uint64_t), exec.stream());
}

void BM_cuda_sparse_sync(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  gz::cuda exec;
  std::vector<std::uint64_t> nonzero;
  std::mt19937_64 rng(11);
  for (std::uint64_t i = 0; i < n; ++i) {
    if (rng() % 100 == 0) nonzero.push_back(i);
  }
  const auto g = gradzip_tools::synthetic_gradient<float>(nonzero.size(), 5);
  device_array<std::uint64_t> indices(nonzero.size());
  device_array<float> values(nonzero.size()), out(n);
  GRADZIP_CUDA_TRY(cudaMemcpy(indices.data, nonzero.data(), nonzero.size() * 8, cudaMemcpyHostToDevice));
  GRADZIP_CUDA_TRY(cudaMemcpy(values.data, g.data(), g.size() * 4, cudaMemcpyHostToDevice));
  GRADZIP_CUDA_TRY(cudaMemset(out.data, 0, n * sizeof(float)));
  single_rank_device one;
  gz::comm::basic_sparse_sync<gz::cuda> zen(n, 1, 3);
  time_events(state, exec.stream(), nonzero.size() * 12, [&] {
    zen.run(one, exec, gz::span<const std::uint64_t>(indices.data, indices.size),
            gz::span<const float>(values.data, values.size), out.view());
  });
  state.counters["nonzeros"] = static_cast<double>(nonzero.size());
  report_roofline(state, nonzero.size() * 12, exec.stream());
}

}  // namespace

BENCHMARK(BM_cuda_count_sketch)->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_count_sketch_unsketch)->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_fetchsgd_step)->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_simhash)->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_hashed_topk<false>)->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_hashed_topk<true>)->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_partition_split)->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_sparse_sync)->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);
