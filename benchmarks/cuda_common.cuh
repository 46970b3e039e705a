// Shared pieces of the CUDA benchmarks: GPU detection, the size axis, CUDA-event timing (the L2
// flushed before each run, the median of at least 50 warm runs), an SM copy kernel measured in
// the same run as the roofline, and the synthetic gradient on the device.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <vector>

#include "common/synthetic_gradient.hpp"
#include "gradzip/gradzip.cuh"

namespace gradzip_bench {

inline bool has_gpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

/// True, after marking the benchmark skipped, where no GPU is found.
inline bool skip_without_gpu(benchmark::State& state) {
  if (has_gpu()) return false;
  state.SkipWithError("no CUDA device");
  return true;
}

/// Timed runs per benchmark (after one warm-up): the median of these is reported.
inline constexpr int timed_runs = 60;

/// 2^16, 2^18, ..., 2^28 elements, each timed `timed_runs` times.
inline void device_axis(benchmark::internal::Benchmark* b) {
  for (int log2 = 16; log2 <= 28; log2 += 2) b->Arg(std::int64_t{1} << log2);
  b->Iterations(timed_runs);
}

/// Writes a buffer twice the L2's size, so the next run reads its input from HBM, not the L2.
inline void flush_l2(cudaStream_t stream) {
  static void* buffer = nullptr;
  static std::size_t bytes = 0;
  if (buffer == nullptr) {
    int device = 0, l2 = 0;
    GRADZIP_CUDA_TRY(cudaGetDevice(&device));
    GRADZIP_CUDA_TRY(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
    bytes = 2 * static_cast<std::size_t>(l2 > 0 ? l2 : 64 << 20);
    GRADZIP_CUDA_TRY(cudaMalloc(&buffer, bytes));
  }
  GRADZIP_CUDA_TRY(cudaMemsetAsync(buffer, 0, bytes, stream));
}

/// Seconds of one run of `body` between two CUDA events, the L2 flushed before it.
template <class Body>
double time_once(cudaStream_t stream, Body&& body) {
  cudaEvent_t start, stop;
  GRADZIP_CUDA_TRY(cudaEventCreate(&start));
  GRADZIP_CUDA_TRY(cudaEventCreate(&stop));
  flush_l2(stream);
  GRADZIP_CUDA_TRY(cudaEventRecord(start, stream));
  body();
  GRADZIP_CUDA_TRY(cudaEventRecord(stop, stream));
  GRADZIP_CUDA_TRY(cudaEventSynchronize(stop));
  float ms = 0;
  GRADZIP_CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / 1e3;
}

inline double median_of(std::vector<double> s) {
  if (s.empty()) return 0.0;
  std::nth_element(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(s.size() / 2), s.end());
  return s[s.size() / 2];
}

/**
 * Times `body` once per benchmark iteration (one warm-up first), the L2 flushed before each, and
 * reports input GB/s and median_us from the median run. Returns the median in seconds.
 */
template <class Body>
double time_events(benchmark::State& state, cudaStream_t stream, std::size_t input_bytes, Body&& body) {
  body();  // warm-up
  std::vector<double> each;
  for (auto _ : state) {
    each.push_back(time_once(stream, body));
    state.SetIterationTime(each.back());
  }
  const double median = median_of(each);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * input_bytes));
  state.counters["median_us"] = median * 1e6;
  state.counters["input_GBps"] = median > 0 ? input_bytes / median / 1e9 : 0.0;
  return median;
}

/// The first n elements of the synthetic gradient (seed 2024). Element i depends on i alone, so
/// one generation at the largest size asked for so far serves every smaller one: generating 2^28
/// elements takes seconds, which a run of every benchmark at that size would pay each time.
inline const std::vector<float>& synthetic_prefix(std::size_t n) {
  static std::vector<float> g;
  if (g.size() < n) g = gradzip_tools::synthetic_gradient<float>(n, 2024);
  return g;
}

/// A device copy of h (cudaMalloc'd; benchmarks keep their inputs to the end).
template <class T>
T* upload(const std::vector<T>& h) {
  T* d = nullptr;
  GRADZIP_CUDA_TRY(cudaMalloc(&d, h.size() * sizeof(T)));
  GRADZIP_CUDA_TRY(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <class T>
T* upload_gradient(std::size_t n) {
  const auto& g = synthetic_prefix(n);
  std::vector<T> h(n);
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(n); ++i) h[i] = gradzip::from_double<T>(g[i]);
  return upload(h);
}

/// The roofline kernel: a grid-stride copy of 16-byte words, four loads in flight per thread.
template <class Word = uint4>  // a template: this header is included by several translation units
__global__ __launch_bounds__(256) void copy_roofline_kernel(const Word* from, Word* to, std::size_t words) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < words; i += 4 * stride) {
    const Word a = from[i], b = from[i + stride], c = from[i + 2 * stride], d = from[i + 3 * stride];
    to[i] = a;
    to[i + stride] = b;
    to[i + 2 * stride] = c;
    to[i + 3 * stride] = d;
  }
  for (; i < words; i += stride) to[i] = from[i];
}

/// Bytes/s of input that an SM copy kernel moves (reading and writing `bytes`), the median of
/// 50 runs with the L2 flushed, measured in this run.
inline double copy_roofline(std::size_t bytes, cudaStream_t stream) {
  const std::size_t words = (bytes + 15) / 16;
  uint4 *a = nullptr, *b = nullptr;
  GRADZIP_CUDA_TRY(cudaMalloc(&a, words * 16));
  GRADZIP_CUDA_TRY(cudaMalloc(&b, words * 16));
  GRADZIP_CUDA_TRY(cudaMemsetAsync(a, 0, words * 16, stream));
  int device = 0, sms = 0;
  GRADZIP_CUDA_TRY(cudaGetDevice(&device));
  GRADZIP_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const std::size_t wanted = (words + 255) / 256, cap = static_cast<std::size_t>(sms) * 8;
  const unsigned grid = static_cast<unsigned>(std::max<std::size_t>(1, std::min(wanted, cap)));
  const auto copy = [&] { copy_roofline_kernel<uint4><<<grid, 256, 0, stream>>>(a, b, words); };
  copy();
  std::vector<double> runs;
  for (int r = 0; r < 50; ++r) runs.push_back(time_once(stream, copy));
  const double seconds = median_of(runs);
  cudaFree(a);
  cudaFree(b);
  return bytes / seconds;
}

/// A communicator of one rank over device memory: every collective leaves this rank's data
/// where it is (copied where the caller's buffers differ), before returning.
struct single_rank_device final : gradzip::comm::communicator {
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce_sum(void*, std::size_t, gradzip::element_type) override {}
  void allgather_sizes(std::uint64_t mine, gradzip::span<std::uint64_t> sizes) override { sizes[0] = mine; }
  void alltoall_sizes(gradzip::span<const std::uint64_t> mine, gradzip::span<std::uint64_t> theirs) override {
    theirs[0] = mine[0];
  }
  void allgatherv_bytes(gradzip::span<const std::byte> mine, gradzip::span<std::byte> all, gradzip::span<const std::uint64_t>) override {
    copy(all.data(), mine.data(), mine.size());
  }
  void alltoallv_bytes(gradzip::span<const std::byte> send, gradzip::span<const std::uint64_t>, gradzip::span<std::byte> recv,
                       gradzip::span<const std::uint64_t>) override {
    copy(recv.data(), send.data(), send.size());
  }

 private:
  static void copy(std::byte* to, const std::byte* from, std::size_t bytes) {
    if (bytes != 0) GRADZIP_CUDA_TRY(cudaMemcpy(to, from, bytes, cudaMemcpyDeviceToDevice));
  }
};

}  // namespace gradzip_bench
