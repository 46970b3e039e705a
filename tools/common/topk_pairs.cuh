// A sink for gradzip::detail::cuda_topk that writes the selection as (index, value) pairs, what a
// COO payload holds: for the tests and benchmarks that call the select without a codec.
#pragma once

#include <cstdint>

#include "gradzip/gradzip.cuh"

namespace gradzip_tools {

struct topk_pair_sink {
  std::uint64_t* index;
  float* values;
  __device__ void operator()(std::uint64_t at, std::uint64_t i, float v) const {
    index[at] = i;
    values[at] = v;
  }
};

}  // namespace gradzip_tools
