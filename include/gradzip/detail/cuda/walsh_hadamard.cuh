// The device's Walsh-Hadamard transform, shared by SimHash and the Hadamard rotation: one
// thread block transforms a block held in shared memory, pairing the same elements in the same
// stage order as the host's transform (transform/hadamard.hpp), so the floats are the host's.
#pragma once

#include <cstdint>

namespace gradzip::detail {

/// In place, unnormalized Walsh-Hadamard transform of `size` (a power of two) floats in shared
/// memory, by the whole thread block; ends with the block synchronized.
__device__ inline void walsh_hadamard(float* v, std::uint32_t size) {
  for (std::uint32_t half = 1; half < size; half *= 2) {
    for (std::uint32_t p = threadIdx.x; p < size / 2; p += blockDim.x) {
      const std::uint32_t j = (p / half) * 2 * half + (p % half);
      const float a = v[j], b = v[j + half];
      v[j] = a + b;
      v[j + half] = a - b;
    }
    __syncthreads();
  }
}

}  // namespace gradzip::detail
