// Host loops over fixed chunks: the chunking depends on n and the thread count only, and every
// algorithm combines per-chunk results in chunk order, so results never depend on scheduling.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "gradzip/core/executor.hpp"
#if defined(_OPENMP)
#include "gradzip/detail/host/chunk_pool.hpp"
#endif

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

/// Runs f(c) for every chunk c in [0, chunks), on exec.threads() threads: the caller and the
/// pool's helpers (chunk_pool.hpp says why not an OpenMP region). f must not throw.
template <class F>
void for_each_chunk(host& exec, std::size_t chunks, F&& f) {
#if defined(_OPENMP)
  using body = std::remove_reference_t<F>;
  chunk_pool::instance().run(exec.threads(), chunks,
                             [](void* context, std::size_t c) noexcept { (*static_cast<body*>(context))(c); },
                             const_cast<void*>(static_cast<const void*>(std::addressof(f))));
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
