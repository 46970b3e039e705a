// Shared pieces of the CUDA benchmarks: GPU detection, the size axis, CUDA-event timing, a
// device copy roofline measured in the same run, and the synthetic gradient on the device.
#pragma once

#include <benchmark/benchmark.h>

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

/// 2^16, 2^18, ..., 2^28 elements.
inline void device_axis(benchmark::internal::Benchmark* b) {
  for (int log2 = 16; log2 <= 28; log2 += 2) b->Arg(std::int64_t{1} << log2);
}

/// Runs `body` once per iteration between two CUDA events and reports input GB/s.
template <class Body>
void time_events(benchmark::State& state, cudaStream_t stream, std::size_t input_bytes, Body&& body) {
  cudaEvent_t start, stop;
  GRADZIP_CUDA_TRY(cudaEventCreate(&start));
  GRADZIP_CUDA_TRY(cudaEventCreate(&stop));
  body();  // warm-up
  double total = 0.0;
  for (auto _ : state) {
    GRADZIP_CUDA_TRY(cudaEventRecord(start, stream));
    body();
    GRADZIP_CUDA_TRY(cudaEventRecord(stop, stream));
    GRADZIP_CUDA_TRY(cudaEventSynchronize(stop));
    float ms = 0;
    GRADZIP_CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(ms / 1e3);
    total += ms / 1e3;
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * input_bytes));
  state.counters["input_GBps"] = input_bytes / (total / state.iterations()) / 1e9;
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

template <class T>
T* upload_gradient(std::size_t n) {
  const auto g = gradzip_tools::synthetic_gradient<float>(n, 2024);
  std::vector<T> h(n);
  for (std::size_t i = 0; i < n; ++i) h[i] = gradzip::from_double<T>(g[i]);
  T* d = nullptr;
  GRADZIP_CUDA_TRY(cudaMalloc(&d, n * sizeof(T)));
  GRADZIP_CUDA_TRY(cudaMemcpy(d, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

/// Bytes/s of a device-to-device copy of `bytes` (the roofline), measured in this run.
inline double copy_roofline(std::size_t bytes, cudaStream_t stream) {
  void *a = nullptr, *b = nullptr;
  GRADZIP_CUDA_TRY(cudaMalloc(&a, bytes));
  GRADZIP_CUDA_TRY(cudaMalloc(&b, bytes));
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  float best = 1e30f;
  for (int i = 0; i < 10; ++i) {
    cudaEventRecord(start, stream);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream);
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    best = ms < best ? ms : best;
  }
  cudaFree(a);
  cudaFree(b);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return bytes / (best / 1e3);
}

}  // namespace gradzip_bench
