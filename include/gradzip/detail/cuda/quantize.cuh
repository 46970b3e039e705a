// values_backend<cuda>: bucketed values stages, one warp per bucket, in one pass over the input.
// Lane l reads values l, l + 32, ... of the bucket (coalesced) into its statistics, the lanes
// merge them in the canonical butterfly, and each group of 32 codes is packed with one
// __ballot_sync per bit plane, the layout of quantize/bit_packing.hpp.
#pragma once

#include "gradzip/quantize/bit_packing.hpp"

namespace gradzip::detail {

template <class Values, class T, class IndexOf>
__global__ __launch_bounds__(block_threads)
void encode_buckets_kernel(Values values, const T* x, std::uint64_t count,
                           std::uint8_t* scales, std::uint32_t* codes, IndexOf index_of,
                           quantize::compress_context ctx) {
  const unsigned lane = threadIdx.x % 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * (blockDim.x / 32);
  const std::uint64_t buckets = Values::bucket_count(count);
  for (std::uint64_t b = static_cast<std::uint64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
       b < buckets; b += warps) {
    const std::uint64_t begin = b * Values::bucket;
    const std::uint64_t end = begin + Values::bucket < count ? begin + Values::bucket : count;
    // Canonical order (quantize/bucket_stats.hpp): lane l adds values l, l + 32, ... in order,
    // then an xor butterfly merges the lanes.
    quantize::bucket_stats stats = Values::empty_stats();
    for (std::uint64_t j = begin + lane; j < end; j += 32) Values::add(stats, static_cast<float>(to_float(x[j])));
    for (int offset = 16; offset > 0; offset /= 2) {
      quantize::bucket_stats other;
      for (int i = 0; i < 4; ++i) other.v[i] = __shfl_xor_sync(0xFFFFFFFFu, stats.v[i], offset);
      stats = Values::merge(stats, other);
    }
    const auto record = Values::make_record(stats, end - begin);
    if (lane == 0) Values::store_record(scales, b, record);
    for (std::uint64_t g = begin; g < end; g += 32) {  // warp-uniform: every lane iterates alike
      const std::uint64_t j = g + lane;
      const unsigned code =
          j < end ? values.encode(static_cast<float>(to_float(x[j])), record,
                                  quantize::element_random(values, index_of(j), ctx)) : 0u;
      std::uint32_t* words = codes + (g / 32) * Values::bits;
      for (int bit = 0; bit < Values::bits; ++bit) {
        const std::uint32_t plane = __ballot_sync(0xFFFFFFFFu, (code >> bit) & 1u);
        if (lane == static_cast<unsigned>(bit)) words[bit] = plane;
      }
    }
  }
}

template <>
struct values_backend<cuda> {
  template <class Values, class T, class IndexOf>
  static void encode_buckets(cuda& exec, const Values& values, const T* x, std::uint64_t count,
                             std::uint8_t* scales, std::uint8_t* codes, IndexOf index_of,
                             quantize::compress_context ctx) {
    if (count == 0) return;
    const std::uint64_t buckets = Values::bucket_count(count);
    const unsigned blocks = grid_for(exec, buckets * 32, block_threads, 16);  // a warp per bucket
    launch(encode_buckets_kernel<Values, T, IndexOf>, blocks, block_threads, 0, exec.stream(), values, x, count,
           scales, reinterpret_cast<std::uint32_t*>(codes), index_of, ctx);
  }
};

}  // namespace gradzip::detail
