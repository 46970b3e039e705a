// A sink for gradzip::detail::cuda_topk that writes the selection as (index, value) pairs, what a
// COO payload holds: for the tests and benchmarks that call the select without a codec.
#pragma once

#include <cstdint>

#include "gradzip/gradzip.cuh"

namespace gradzip_tools {

template <class T = float>
struct topk_pair_sink {
  std::uint64_t* index;
  T* values;
  __device__ void operator()(std::uint64_t at, std::uint64_t i, T v) const {
    index[at] = i;
    values[at] = v;
  }
};
template <class T>
topk_pair_sink(std::uint64_t*, T*) -> topk_pair_sink<T>;

}  // namespace gradzip_tools
