// CUDA sparsifiers beside an SM copy kernel over the same bytes, 2^16 .. 2^28 elements,
// timed with CUDA events (manual time): exact top-k at 1 % (fp32 and bf16), DGC's sampled
// top-k at 1 % (issue 4's target: >= 1.2 TB/s at 2^28 on H100; `_async` through
// compress_async, with no host synchronization), threshold selection with a
// known tau, and top-k under the staged index encodings. Beside exact top-k, where the installed
// CCCL has it (3.3 and later), cub::DeviceTopK selects the same 1 % by magnitude (unsorted, ties
// unspecified: less than gradzip promises). Without a GPU every benchmark reports "no CUDA
// device" and skips.
#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "common/topk_pairs.cuh"
#include "cuda_common.cuh"

#if __has_include(<cub/device/device_topk.cuh>)
#include <cub/device/device_topk.cuh>
#include <cuda/stream_ref>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#define GRADZIP_BENCH_CUB_TOPK 1
#endif

namespace {

using namespace gradzip_bench;
namespace gz = gradzip;

/// `Async`: codec::compress_async, which leaves the size on the device (no host synchronization
/// inside the timed call); otherwise compress, which copies a data-dependent count to the host.
template <class T, bool Async = false, class Codec>
void sparsify_bench(benchmark::State& state, const Codec& c) {
  if (skip_without_gpu(state)) return;
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  gz::cuda exec;
  T* x = upload_gradient<T>(n);
  std::byte* out = nullptr;
  const std::size_t out_bytes = c.template max_compressed_bytes<T>(n);
  GRADZIP_CUDA_TRY(cudaMalloc(&out, out_bytes));
  exec.reserve(c.template workspace_bytes<T>(exec, n));
  std::size_t bytes = 0;
  std::uint64_t* device_bytes = nullptr;
  GRADZIP_CUDA_TRY(cudaMalloc(&device_bytes, sizeof(std::uint64_t)));
  const double median = time_events(state, exec.stream(), n * sizeof(T), [&] {
    if constexpr (Async) {
      c.compress_async(exec, gz::span<const T>(x, n), gz::span<std::byte>(out, out_bytes), device_bytes);
    } else {
      bytes = c.compress(exec, gz::span<const T>(x, n), gz::span<std::byte>(out, out_bytes));
    }
  });
  if constexpr (Async) {
    std::uint64_t b = 0;
    GRADZIP_CUDA_TRY(cudaMemcpy(&b, device_bytes, sizeof b, cudaMemcpyDeviceToHost));
    bytes = static_cast<std::size_t>(b);
  }
  cudaFree(device_bytes);
  // The copy reads and writes the bytes; a sparsifier reads them (two or three times) and
  // writes a few percent.
  state.counters["copy_GBps"] = copy_roofline(n * sizeof(T), exec.stream()) / 1e9;
  state.counters["roofline"] = state.counters["input_GBps"] / state.counters["copy_GBps"];
  state.counters["out_bytes_per_elem"] = static_cast<double>(bytes) / static_cast<double>(n);
  state.counters["total_IO_GBps"] = static_cast<double>(n * sizeof(T) + bytes) / median / 1e9;  // the least any selection moves: x once, the payload
  cudaFree(x);
  cudaFree(out);
}

template <class T>
void BM_cuda_topk(benchmark::State& state) {
  sparsify_bench<T>(state, gz::codec<gz::sparsify::topk>{gz::sparsify::topk::ratio(0.01)});
}

void BM_cuda_sampled_topk(benchmark::State& state) {
  sparsify_bench<float>(state, gz::codec<gz::sparsify::sampled_topk>{gz::sparsify::sampled_topk::ratio(0.01)});
}

void BM_cuda_sampled_topk_async(benchmark::State& state) {
  sparsify_bench<float, true>(state, gz::codec<gz::sparsify::sampled_topk>{gz::sparsify::sampled_topk::ratio(0.01)});
}

/// tau cutting at about the top 1 % of the synthetic gradient (its magnitudes' 99th percentile).
double one_percent_tau(std::size_t n) {
  const std::vector<float>& all = synthetic_prefix(n);
  std::vector<float> g(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n));
  for (auto& v : g) v = std::abs(v);
  std::nth_element(g.begin(), g.begin() + n / 100, g.end(), std::greater<>());
  return g[n / 100];
}

void BM_cuda_threshold(benchmark::State& state) {
  const gz::sparsify::threshold cut{one_percent_tau(static_cast<std::size_t>(state.range(0)))};
  sparsify_bench<float>(state, gz::codec<gz::sparsify::threshold>{cut});
}

void BM_cuda_threshold_bitmap(benchmark::State& state) {
  const gz::sparsify::threshold cut{one_percent_tau(static_cast<std::size_t>(state.range(0)))};
  sparsify_bench<float>(state, gz::codec<gz::sparsify::threshold, gz::quantize::none, gz::encode::bitmap>{cut});
}

void BM_cuda_topk_automatic(benchmark::State& state) {
  sparsify_bench<float>(state, gz::codec<gz::sparsify::topk, gz::quantize::none, gz::encode::automatic>{
                                   gz::sparsify::topk::ratio(0.01)});
}

/// Events recorded between launches, created once (creating one between two launches would put
/// host time between them), each named by its launch and occurrence ("histogram1": the second).
class phase_timeline {
 public:
  explicit phase_timeline(cudaStream_t stream) : stream_(stream), events_(32) {
    for (auto& e : events_) GRADZIP_CUDA_TRY(cudaEventCreate(&e));
  }
  ~phase_timeline() {
    for (auto& e : events_) cudaEventDestroy(e);
  }
  phase_timeline(const phase_timeline&) = delete;
  phase_timeline& operator=(const phase_timeline&) = delete;

  void restart() { names_.clear(); }
  void mark(const char* name) {
    if (names_.size() == events_.size()) throw std::runtime_error("phase_timeline: more than 32 launches");
    const auto seen =
        std::count_if(names_.begin(), names_.end(), [&](const std::string& s) { return s.rfind(name, 0) == 0; });
    GRADZIP_CUDA_TRY(cudaEventRecord(events_[names_.size()], stream_));
    names_.push_back(name + std::to_string(seen));
  }
  /// Seconds from mark `from` to mark `to`, once the last mark's event has completed.
  double seconds(std::size_t from, std::size_t to) const {
    float ms = 0;
    GRADZIP_CUDA_TRY(cudaEventElapsedTime(&ms, events_[from], events_[to]));
    return ms / 1e3;
  }
  void wait() const { GRADZIP_CUDA_TRY(cudaEventSynchronize(events_[names_.size() - 1])); }
  const std::vector<std::string>& names() const { return names_; }

 private:
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
  std::vector<std::string> names_;
};

/**
 * Exact top-k at 1 % (fp32), each kernel timed between events: a counter `<launch>_us` per
 * launch (median over runs), under both ways of counting digits (topk_counting), on the
 * synthetic gradient and on keys crowded into one binade. The H100 ran the whole select at 0.32
 * TB/s against a model of 1.1 (docs/performance.md): this says which kernel holds the time, and
 * whether __match_any_sync pays for itself. A launch's time includes any wait for the host to
 * issue it.
 */
enum class topk_input { synthetic, one_binade };

/// Magnitudes uniform in [1, 2), random signs: every key's first digit is one of 8 bins (3
/// mantissa bits under one exponent), so a warp's lanes share bins: the case that serializes
/// per-element atomics, beside the synthetic gradient's spread of scales.
float* upload_one_binade(std::size_t n) {
  std::vector<float> h(n);
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(n); ++i) {
    const auto r = gradzip::philox_for(7, 0, 0, static_cast<std::uint64_t>(i));
    const float m = 1.0f + static_cast<float>(r[0] >> 8) * 0x1p-24f;
    h[i] = (r[1] & 1u) != 0 ? -m : m;
  }
  return upload(h);
}

/// How the select runs: as cuda_topk chooses (one launch up to cuda_topk_resident_max, the
/// sample's bound from cuda_topk_sample_from elements); always by launches from the radix
/// histogram of x (the A/B baseline); by launches from the sample at every size where it fits
/// (what the threshold cuda_topk_sample_from is chosen from); or in one cooperative launch at
/// every size whose grid fits the device (what cuda_topk_resident_max is chosen from).
enum class topk_start { as_chosen, radix, sampled, resident };
std::uint64_t sample_from(topk_start s) {
  switch (s) {
    case topk_start::radix:
    case topk_start::resident: return ~std::uint64_t{0};
    case topk_start::sampled: return 0;
    case topk_start::as_chosen: return gz::detail::cuda_topk_sample_from;
  }
  return gz::detail::cuda_topk_sample_from;
}
std::uint64_t resident_up_to(topk_start s) {
  switch (s) {
    case topk_start::radix:
    case topk_start::sampled: return 0;
    case topk_start::resident: return ~std::uint64_t{0};
    case topk_start::as_chosen: return gz::detail::cuda_topk_resident_max;
  }
  return gz::detail::cuda_topk_resident_max;
}

/// What a direct cuda_topk call over n fp32 values at 1 % needs: the input on the device, room for
/// the k (index, value) pairs, and the executor's scratch reserved.
struct topk_call {
  std::size_t n, k;
  gz::cuda exec;
  float* x;
  std::uint64_t* index = nullptr;
  float* values = nullptr;
  topk_call(std::size_t n_, topk_input input)
      : n(n_), k(std::max<std::size_t>(1, n_ / 100)),
        x(input == topk_input::synthetic ? upload_gradient<float>(n_) : upload_one_binade(n_)) {
    GRADZIP_CUDA_TRY(cudaMalloc(&index, k * sizeof(std::uint64_t)));
    GRADZIP_CUDA_TRY(cudaMalloc(&values, k * sizeof(float)));
    exec.reserve(gz::codec<gz::sparsify::topk>{}.workspace_bytes<float>(exec, n));
  }
  ~topk_call() {
    cudaFree(values);
    cudaFree(index);
    cudaFree(x);
  }
  topk_call(const topk_call&) = delete;
  topk_call& operator=(const topk_call&) = delete;
  template <gz::detail::topk_counting Counting, class Marks>
  void run(Marks marks, topk_start start) {
    gz::detail::cuda_topk<Counting>(exec, gz::span<const float>(x, n), k, gradzip_tools::topk_pair_sink{index, values},
                                    marks, sample_from(start), resident_up_to(start));
  }
};

template <gz::detail::topk_counting Counting, topk_input Input = topk_input::synthetic,
          topk_start Start = topk_start::as_chosen>
void BM_cuda_topk_phases(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  topk_call call(static_cast<std::size_t>(state.range(0)), Input);
  const std::size_t n = call.n;
  phase_timeline timeline(call.exec.stream());
  const auto run = [&] {
    timeline.restart();
    timeline.mark("start");
    call.run<Counting>([&](const char* name) { timeline.mark(name); }, Start);
    timeline.wait();
  };
  run();  // warm-up
  std::map<std::string, std::vector<double>> phases;
  std::vector<double> totals;
  for (auto _ : state) {
    flush_l2(call.exec.stream());
    run();
    const auto& names = timeline.names();
    for (std::size_t p = 1; p < names.size(); ++p) phases[names[p]].push_back(timeline.seconds(p - 1, p) * 1e6);
    totals.push_back(timeline.seconds(0, names.size() - 1));
    state.SetIterationTime(totals.back());
  }
  const double median = median_of(totals);
  for (const auto& [name, us] : phases) state.counters[name + "_us"] = median_of(us);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * sizeof(float)));
  state.counters["median_us"] = median * 1e6;
  state.counters["input_GBps"] = static_cast<double>(n * sizeof(float)) / median / 1e9;
}

/// The whole select with the start forced (fp32, 1 %, per-element counting) and no events between
/// its launches: the phases' events cost the sampled path's 8 launches more than the radix path's
/// 5, and the threshold cuda_topk_sample_from is where these two cross (2^22 to 2^24).
/// Counter `launches`: how many the select took (1: the cooperative one ran; a forced resident
/// select whose grid does not fit the device runs by launches).
template <topk_start Start>
void BM_cuda_topk_start(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  topk_call call(static_cast<std::size_t>(state.range(0)), topk_input::synthetic);
  int launches = 0;
  call.run<gz::detail::topk_counting::per_element>([&](const char*) { ++launches; }, Start);
  time_events(state, call.exec.stream(), call.n * sizeof(float),
              [&] { call.run<gz::detail::topk_counting::per_element>(gz::detail::no_phase_marks{}, Start); });
  state.counters["launches"] = launches;
}

#if defined(GRADZIP_BENCH_CUB_TOPK)
struct magnitude_of {
  __device__ float operator()(float v) const { return fabsf(v); }
};

/// The peer: cub::DeviceTopK::MaxPairs over |x| with the indices as values, k = 1 %.
void BM_cub_device_topk(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const std::size_t n = static_cast<std::size_t>(state.range(0)), k = std::max<std::size_t>(1, n / 100);
  gz::cuda exec;
  float* x = upload_gradient<float>(n);
  float* keys_out = nullptr;
  std::uint32_t* index_out = nullptr;
  GRADZIP_CUDA_TRY(cudaMalloc(&keys_out, k * sizeof(float)));
  GRADZIP_CUDA_TRY(cudaMalloc(&index_out, k * sizeof(std::uint32_t)));
  const auto keys = thrust::make_transform_iterator(x, magnitude_of{});
  const auto indices = thrust::counting_iterator<std::uint32_t>(0);
  const auto env = cuda::std::execution::env{
      cuda::stream_ref{exec.stream()},
      cuda::execution::require(cuda::execution::determinism::not_guaranteed, cuda::execution::output_ordering::unsorted)};
  std::size_t temp_bytes = 0;
  GRADZIP_CUDA_TRY(cub::DeviceTopK::MaxPairs(nullptr, temp_bytes, keys, keys_out, indices, index_out, n, k, env));
  void* temp = nullptr;
  GRADZIP_CUDA_TRY(cudaMalloc(&temp, temp_bytes));
  time_events(state, exec.stream(), n * sizeof(float), [&] {
    GRADZIP_CUDA_TRY(cub::DeviceTopK::MaxPairs(temp, temp_bytes, keys, keys_out, indices, index_out, n, k, env));
  });
  state.counters["copy_GBps"] = copy_roofline(n * sizeof(float), exec.stream()) / 1e9;
  state.counters["roofline"] = state.counters["input_GBps"] / state.counters["copy_GBps"];
  cudaFree(temp);
  cudaFree(index_out);
  cudaFree(keys_out);
  cudaFree(x);
}
#endif

}  // namespace

#if defined(GRADZIP_BENCH_CUB_TOPK)
BENCHMARK(BM_cub_device_topk)->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);
#endif
BENCHMARK_TEMPLATE(BM_cuda_topk, float)->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_cuda_topk, __nv_bfloat16)->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_cuda_topk_phases, gz::detail::topk_counting::match_any)
    ->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_cuda_topk_phases, gz::detail::topk_counting::per_element)
    ->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_cuda_topk_phases, gz::detail::topk_counting::per_element, topk_input::synthetic, topk_start::radix)
    ->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_cuda_topk_phases, gz::detail::topk_counting::per_element, topk_input::synthetic, topk_start::sampled)
    ->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_cuda_topk_start, topk_start::radix)
    ->Arg(1 << 22)->Arg(3 << 21)->Arg(1 << 23)->Arg(3 << 22)->Arg(1 << 24)->Iterations(timed_runs)->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_cuda_topk_start, topk_start::sampled)
    ->Arg(1 << 22)->Arg(3 << 21)->Arg(1 << 23)->Arg(3 << 22)->Arg(1 << 24)->Iterations(timed_runs)->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_cuda_topk_start, topk_start::radix)
    ->Arg(1 << 14)->Arg(1 << 16)->Arg(1 << 18)->Arg(1 << 20)->Arg(3 << 19)->Arg(1 << 21)->Iterations(timed_runs)
    ->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_cuda_topk_start, topk_start::resident)
    ->Arg(1 << 14)->Arg(1 << 16)->Arg(1 << 18)->Arg(1 << 20)->Arg(3 << 19)->Arg(1 << 21)->Arg(3 << 20)->Arg(1 << 22)
    ->Iterations(timed_runs)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_cuda_topk_phases, gz::detail::topk_counting::match_any, topk_input::one_binade)
    ->Arg(1 << 24)->Arg(1 << 28)->Iterations(timed_runs)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_cuda_topk_phases, gz::detail::topk_counting::per_element, topk_input::one_binade)
    ->Arg(1 << 24)->Arg(1 << 28)->Iterations(timed_runs)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_sampled_topk)->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_sampled_topk_async)->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_threshold)->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_threshold_bitmap)->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cuda_topk_automatic)->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
