// Shared benchmark pieces: the size axis, cached synthetic gradients, and the memory-bandwidth
// rooflines (a plain copy of the same bytes and a vectorized sum of them, with the same threads)
// measured in the same run, so every result reads as input GB/s and as a fraction of what the
// machine can move.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <vector>

#include "common/synthetic_gradient.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/detail/host/parallel.hpp"

namespace gradzip_bench {

/// 2^16, 2^18, ..., 2^26 elements.
inline void size_axis(benchmark::internal::Benchmark* b) {
  for (int log2 = 16; log2 <= 26; log2 += 2) b->Arg(std::int64_t{1} << log2);
}

/// The heavy-tailed synthetic gradient (tools/common/synthetic_gradient.hpp), made once per size.
inline const std::vector<float>& gradient(std::size_t n) {
  static std::map<std::size_t, std::vector<float>> cache;
  auto it = cache.find(n);
  if (it == cache.end()) it = cache.emplace(n, gradzip_tools::synthetic_gradient<float>(n, 2024)).first;
  return it->second;
}

/// Bytes per second of `pass` over `bytes` bytes: the best of 15 runs of at least 30 ms
/// (shared machines are noisy, and the best is the conservative roofline).
template <class Pass>
double best_bytes_per_second(std::size_t bytes, Pass&& pass) {
  double best = 0.0;
  for (int run = 0; run < 15; ++run) {
    std::size_t reps = 0;
    const auto start = std::chrono::steady_clock::now();
    double seconds = 0.0;
    do {
      pass();
      benchmark::ClobberMemory();
      ++reps;
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } while (seconds < 0.03);
    best = std::max(best, static_cast<double>(bytes) * reps / seconds);
  }
  return best;
}

/// Bytes per second of a parallel memcpy of `bytes` bytes with `exec`'s threads, measured once
/// per size and reused by every benchmark of that size.
inline double copy_bytes_per_second(gradzip::host& exec, std::size_t bytes) {
  static std::map<std::size_t, double> cache;
  auto it = cache.find(bytes);
  if (it != cache.end()) return it->second;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const std::size_t chunks = gradzip::detail::chunk_count(exec, bytes, 1 << 16);
  return cache[bytes] = best_bytes_per_second(bytes, [&] {
           gradzip::detail::for_each_chunk(exec, chunks, [&](std::size_t c) {
             const auto r = gradzip::detail::chunk_of(bytes, chunks, c);
             std::memcpy(dst.data() + r.begin, src.data() + r.begin, r.end - r.begin);
           });
         });
}

/// Bytes per second of a vectorized read of `bytes` bytes with `exec`'s threads: the read
/// roofline (nothing written), measured like `copy_bytes_per_second`. A compress reads its input
/// once and writes a fraction of it, so this, not the copy, is its ceiling. The reduction is an
/// integer OR (vectorized with no reassociation question and no add latency chain), so the loop
/// is bound by loads alone.
inline double read_bytes_per_second(gradzip::host& exec, std::size_t bytes) {
  static std::map<std::size_t, double> cache;
  auto it = cache.find(bytes);
  if (it != cache.end()) return it->second;
  const std::size_t n = bytes / sizeof(std::uint32_t);
  std::vector<std::uint32_t> src(n, 1u);
  const std::size_t chunks = gradzip::detail::chunk_count(exec, n, 1 << 14);
  std::vector<std::uint32_t> folded(chunks);
  return cache[bytes] = best_bytes_per_second(n * sizeof(std::uint32_t), [&] {
           gradzip::detail::for_each_chunk(exec, chunks, [&](std::size_t c) {
             const auto r = gradzip::detail::chunk_of(n, chunks, c);
             const std::uint32_t* p = src.data();
             std::uint32_t acc = 0;
             for (std::size_t i = r.begin; i < r.end; ++i) acc |= p[i];
             folded[c] = acc;
           });
           benchmark::DoNotOptimize(folded.data());
         });
}

/// Sets input bytes/s and the fractions of the copy roofline ("roofline") and of the read
/// roofline ("read_roofline") on a finished state.
inline void report(benchmark::State& state, gradzip::host& exec, std::size_t input_bytes,
                   double seconds_per_iteration) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * input_bytes));
  const double copy = copy_bytes_per_second(exec, input_bytes);
  state.counters["input_GBps"] = input_bytes / seconds_per_iteration / 1e9;
  state.counters["copy_GBps"] = copy / 1e9;
  state.counters["roofline"] = (input_bytes / seconds_per_iteration) / copy;
  const double read = read_bytes_per_second(exec, input_bytes);
  state.counters["read_GBps"] = read / 1e9;
  state.counters["read_roofline"] = (input_bytes / seconds_per_iteration) / read;
}

/// Times the body of a benchmark loop with a steady clock and reports like `report`.
template <class Body>
void run_timed(benchmark::State& state, gradzip::host& exec, std::size_t input_bytes, Body&& body) {
  double total = 0.0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    body();
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  report(state, exec, input_bytes, total / static_cast<double>(state.iterations()));
}

}  // namespace gradzip_bench
