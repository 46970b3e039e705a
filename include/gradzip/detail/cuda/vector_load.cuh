// 16-byte global loads of consecutive elements, for kernels whose lanes each take a run of 8:
// `load_run` gives the run's values bit for bit, `load_floats` widened to float.
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

}  // namespace vector_load_detail

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

/// v[i] <- float(x[first + i]) for i < valid (at most 8), 0 for the rest.
template <class T>
__device__ inline void load_floats(const T* x, std::uint64_t first, unsigned valid, float (&v)[8]) {
  T raw[8];
  load_run(x, first, valid, raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = static_cast<unsigned>(i) < valid ? static_cast<float>(to_float(raw[i])) : 0.0f;
}

}  // namespace gradzip::detail
