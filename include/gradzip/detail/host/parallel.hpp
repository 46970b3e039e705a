// Host loops over fixed chunks: the chunking depends on n and the thread count only, and every
// algorithm combines per-chunk results in chunk order, so results never depend on scheduling.
#pragma once

#include <algorithm>
#include <cstdint>

#include "gradzip/core/executor.hpp"

namespace gradzip::detail {

struct index_range {
  std::size_t begin;
  std::size_t end;
};

/// Chunk c of `chunks` near-equal contiguous chunks of [0, n).
inline index_range chunk_of(std::size_t n, std::size_t chunks, std::size_t c) {
  const std::size_t base = n / chunks;
  const std::size_t extra = n % chunks;
  const std::size_t begin = c * base + std::min(c, extra);
  return {begin, begin + base + (c < extra ? 1 : 0)};
}

/// How many chunks to split n elements into: one per thread, none smaller than `min_chunk`.
inline std::size_t chunk_count(host& exec, std::size_t n, std::size_t min_chunk = 1 << 16) {
  const std::size_t by_size = std::max<std::size_t>(1, n / min_chunk);
  return std::min<std::size_t>(static_cast<std::size_t>(exec.threads()), by_size);
}

/// Runs f(c) for every chunk c in [0, chunks), in parallel under OpenMP.
template <class F>
void for_each_chunk(host& exec, std::size_t chunks, F&& f) {
#if defined(_OPENMP)
  const int threads = std::min<int>(exec.threads(), static_cast<int>(chunks));
#pragma omp parallel for schedule(static, 1) num_threads(threads)
  for (std::int64_t c = 0; c < static_cast<std::int64_t>(chunks); ++c) f(static_cast<std::size_t>(c));
#else
  (void)exec;
  for (std::size_t c = 0; c < chunks; ++c) f(c);
#endif
}

/// Carves aligned sub-buffers out of one scratch block. With a null base it only measures
/// (every pointer it hands out is null: an offset from a null pointer is undefined behaviour).
class scratch_carver {
 public:
  explicit scratch_carver(std::byte* base) : base_(base) {}
  template <class T>
  T* take(std::size_t count) {
    T* p = base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + used_);
    used_ += (count * sizeof(T) + 63) / 64 * 64;
    return p;
  }
  std::size_t used() const { return used_; }

 private:
  std::byte* base_;
  std::size_t used_ = 0;
};

}  // namespace gradzip::detail
