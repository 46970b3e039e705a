// 16-byte global loads and stores of consecutive elements, for kernels whose lanes each take a
// run of 8: `load_run` gives the run's values bit for bit, `load_floats` widened to float, and
// `store_run` writes a run back.
//
// A lane that reads its 8 values with 8 scalar loads keeps 4 bytes in flight per load
// instruction; HBM3 needs about 2.3 MB in flight across an H100 (docs/performance.md), which
// 4-byte loads reach only with every warp slot busy. These read the run with 16-byte
// loads (2 for fp32, 1 for fp16/bf16, 4 for fp64) when all 8 are there and the run is
// 16-byte aligned, and falls back to scalar loads for a tensor's tail or an unaligned pointer
// (a user's span may start anywhere). Both paths give the same floats.
#pragma once

#include <cstdint>

#include "gradzip/core/element_type.hpp"

namespace gradzip::detail {

namespace vector_load_detail {

/// 16 bytes as 4 words.
struct words4 {
  std::uint32_t w[4];
};

template <class T>
__device__ inline words4 load16(const T* p) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  return {{u.x, u.y, u.z, u.w}};
}

/// Element k of the 16-byte groups g of 8 values of T, bit for bit.
template <class T>
__device__ inline T element(const words4* g, int k) {
  if constexpr (sizeof(T) == 4) {
    return bit_cast<T>(g[k / 4].w[k % 4]);
  } else if constexpr (sizeof(T) == 2) {
    const std::uint32_t word = g[k / 8].w[(k % 8) / 2];
    return bit_cast<T>(static_cast<std::uint16_t>((k % 2) == 0 ? word : word >> 16));
  } else {
    const std::uint64_t low = g[k / 2].w[2 * (k % 2)], high = g[k / 2].w[2 * (k % 2) + 1];
    return bit_cast<T>(low | (high << 32));
  }
}

template <class T>
__device__ inline void store16(T* p, const words4& g) {
  *reinterpret_cast<uint4*>(p) = make_uint4(g.w[0], g.w[1], g.w[2], g.w[3]);
}

/// The bits of element k of a run of 8 T into its place in the 16-byte groups g (element's
/// inverse; g starts zeroed).
template <class T>
__device__ inline void place(words4* g, int k, T value) {
  if constexpr (sizeof(T) == 4) {
    g[k / 4].w[k % 4] = bit_cast<std::uint32_t>(value);
  } else if constexpr (sizeof(T) == 2) {
    g[k / 8].w[(k % 8) / 2] |= static_cast<std::uint32_t>(bit_cast<std::uint16_t>(value)) << (16 * (k % 2));
  } else {
    const std::uint64_t bits = bit_cast<std::uint64_t>(value);
    g[k / 2].w[2 * (k % 2)] = static_cast<std::uint32_t>(bits);
    g[k / 2].w[2 * (k % 2) + 1] = static_cast<std::uint32_t>(bits >> 32);
  }
}

}  // namespace vector_load_detail

/// Tells nvcc that p points to global memory. A pointer chosen at run time between two arrays
/// (x or a scratch list) otherwise makes its loads generic (ld.v4), not ld.global.v4.
template <class T>
__device__ inline void assume_global(const T* p) {
#if defined(__CUDA_ARCH__)
  __builtin_assume(__isGlobal(p));
#else
  static_cast<void>(p);
#endif
}

/// How many of the 8 elements of the run starting at `first` lie below `end`: 0 to 8.
GRADZIP_HOST_DEVICE inline unsigned run_length(std::uint64_t first, std::uint64_t end) {
  return first < end ? static_cast<unsigned>(end - first < 8 ? end - first : 8) : 0u;
}

/// Run `run` of 8 consecutive elements of an n-element tensor: its first element and how many
/// of its 8 exist. Kernels that take one run per lane and step index their loop by run.
struct run_of_8 {
  std::uint64_t first;
  unsigned valid;
};
GRADZIP_HOST_DEVICE inline run_of_8 run_at(std::uint64_t run, std::uint64_t n) {
  return {8 * run, run_length(8 * run, n)};
}

/// v[i] <- x[first + i] for i < valid (at most 8); the rest are left as they were.
template <class T>
__device__ inline void load_run(const T* x, std::uint64_t first, unsigned valid, T (&v)[8]) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "load_run: 2-, 4- or 8-byte elements");
  constexpr int groups = 8 * static_cast<int>(sizeof(T)) / 16;
  const T* p = x + first;
  if (valid == 8 && reinterpret_cast<std::uintptr_t>(p) % 16 == 0) {
    vector_load_detail::words4 g[groups];
#pragma unroll
    for (int j = 0; j < groups; ++j) g[j] = vector_load_detail::load16(p + j * (16 / static_cast<int>(sizeof(T))));
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = vector_load_detail::element<T>(g, i);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (static_cast<unsigned>(i) < valid) v[i] = p[i];
    }
  }
}

/// Thread t's Runs runs of tile `tile` in a compaction of Threads-thread blocks: runs
/// (tile Runs + j) Threads + t for j < Runs (the tile's first part, then the next), every load
/// issued before any is used.
template <unsigned Threads, class T, unsigned Runs>
__device__ inline void load_tile_runs(const T* x, std::uint64_t n, std::uint64_t tile, run_of_8 (&r)[Runs],
                                      T (&v)[Runs][8]) {
#pragma unroll
  for (unsigned j = 0; j < Runs; ++j) {
    r[j] = run_at((tile * Runs + j) * Threads + threadIdx.x, n);
    load_run(x, r[j].first, r[j].valid, v[j]);
  }
}

/// x[first + i] <- v[i] for i < valid (at most 8): 16-byte stores when the run is whole and
/// 16-byte aligned, scalar stores otherwise.
template <class T>
__device__ inline void store_run(T* x, std::uint64_t first, unsigned valid, const T (&v)[8]) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "store_run: 2-, 4- or 8-byte elements");
  constexpr int groups = 8 * static_cast<int>(sizeof(T)) / 16;
  T* p = x + first;
  if (valid == 8 && reinterpret_cast<std::uintptr_t>(p) % 16 == 0) {
    vector_load_detail::words4 g[groups] = {};
#pragma unroll
    for (int i = 0; i < 8; ++i) vector_load_detail::place(g, i, v[i]);
#pragma unroll
    for (int j = 0; j < groups; ++j) vector_load_detail::store16(p + j * (16 / static_cast<int>(sizeof(T))), g[j]);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (static_cast<unsigned>(i) < valid) p[i] = v[i];
    }
  }
}

/// v[i] <- float(x[first + i]) for i < valid (at most 8), 0 for the rest.
template <class T>
__device__ inline void load_floats(const T* x, std::uint64_t first, unsigned valid, float (&v)[8]) {
  T raw[8] = {};  // load_run leaves raw[valid..8) alone; they are not read, but keep them defined
  load_run(x, first, valid, raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = static_cast<unsigned>(i) < valid ? static_cast<float>(to_float(raw[i])) : 0.0f;
}

}  // namespace gradzip::detail
