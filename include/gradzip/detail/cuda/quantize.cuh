// values_backend<cuda>: bucketed values stages, one warp per bucket, in one pass over the input.
// Lane l reads values l, l + 32, ... of the bucket (coalesced) into its statistics, and the
// lanes merge them in the canonical butterfly. Codes need no order: a dense bucket is encoded
// eight consecutive elements per lane, so that one Philox block serves them (the RNG contract,
// random/philox.hpp), and gathered values 32 at a time; both pack the layout of
// quantize/bit_packing.hpp.
#pragma once

#include <type_traits>

#include "gradzip/detail/cuda/vector_load.cuh"
#include "gradzip/quantize/bit_packing.hpp"

namespace gradzip::detail {

/// The bucketed encode's launch: 256 threads (8 warps, a bucket per warp and step), a run of 8
/// values per lane (`encode_blocked`: one Philox block, `load_floats`), up to 16 blocks per SM.
using encode_policy = launch_policy<256, 8, 16>;
static_assert(encode_policy::items_per_thread == 8, "encode_blocked: one Philox block (8 half-words) per run");

/// Codes of a dense bucket's values [begin, end), 256 at a time: lane l encodes the eight
/// consecutive elements s + 8l .. s + 8l + 7 (loaded by `load_floats`), drawing their
/// random bits from one Philox block (their counter is (s + 8l) / 8: begin is a multiple of the
/// bucket, hence of 8). Bit plane b of the group of 32 codes at s + 32q is then lanes 4q .. 4q + 3's
/// bytes of plane b, gathered by three shuffles. The same codes and words as `encode_strided`.
template <class Values, class T>
__device__ void encode_blocked(const Values& values, const T* x, std::uint64_t begin, std::uint64_t end,
                               const typename Values::record& record, std::uint32_t* codes,
                               quantize::compress_context ctx, unsigned lane) {
  constexpr unsigned run = encode_policy::items_per_thread;
  for (std::uint64_t s = begin; s < end; s += 32 * run) {  // warp-uniform: every lane iterates alike
    const std::uint64_t first = s + run * lane;
    philox_words block{};
    if constexpr (Values::stochastic) {
      if (first < end) {
        block = philox_for(values.seed, static_cast<std::uint32_t>(ctx.step), static_cast<std::uint32_t>(ctx.tensor_id),
                           first >> 3);  // both below 2^32: check_context
      }
    }
    // The eight values first, by 16-byte loads where the run is whole and aligned (so that they
    // are in flight together); lanes past the end read none.
    const unsigned valid = run_length(first, end);
    float v[8];
    load_floats(x, first, valid, v);
    unsigned plane[Values::bits] = {};  // bit i of plane[b]: bit b of element first + i's code
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const std::uint32_t random = Values::stochastic ? half_word(block, static_cast<unsigned>(i)) : 0u;
      const unsigned code = static_cast<unsigned>(i) < valid ? values.encode(v[i], record, random) : 0u;
#pragma unroll
      for (int bit = 0; bit < Values::bits; ++bit) plane[bit] |= ((code >> bit) & 1u) << i;
    }
    const std::uint64_t group = s + 32 * (lane / 4);  // the group of 32 this lane's byte is in
#pragma unroll
    for (int bit = 0; bit < Values::bits; ++bit) {
      const unsigned byte = plane[bit];
      const unsigned word = byte | (__shfl_down_sync(0xFFFFFFFFu, byte, 1) << 8) |
                            (__shfl_down_sync(0xFFFFFFFFu, byte, 2) << 16) |
                            (__shfl_down_sync(0xFFFFFFFFu, byte, 3) << 24);
      if (lane % 4 == 0 && group < end) codes[(group / 32) * Values::bits + bit] = word;
    }
  }
}

/// Codes of a bucket of gathered values (top-k, random-k: tensor index `index_of(j)`), 32 at a
/// time, lane l encoding value g + l; one __ballot_sync per bit plane.
template <class Values, class T, class IndexOf>
__device__ void encode_strided(const Values& values, const T* x, std::uint64_t begin, std::uint64_t end,
                               const typename Values::record& record, std::uint32_t* codes, IndexOf index_of,
                               quantize::compress_context ctx, unsigned lane) {
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

/// Lane l's statistics of a bucket's values [begin, end): values l, l + 32, ... added in that
/// order (the canonical order, quantize/bucket_stats.hpp), 256 at a time with the lane's 8
/// loads issued before its first add, so that 8 are in flight (each load instruction of the warp
/// reads 128 consecutive bytes).
template <class Values, class T>
__device__ inline void add_strided(quantize::bucket_stats& stats, const T* x, std::uint64_t begin, std::uint64_t end,
                                   unsigned lane) {
  for (std::uint64_t s = begin; s < end; s += 256) {
    float v[8];
#pragma unroll
    for (unsigned m = 0; m < 8; ++m) {
      const std::uint64_t j = s + 32 * m + lane;
      v[m] = j < end ? static_cast<float>(to_float(x[j])) : 0.0f;
    }
#pragma unroll
    for (unsigned m = 0; m < 8; ++m) {
      if (s + 32 * m + lane < end) Values::add(stats, v[m]);
    }
  }
}

template <class Values, class T, class IndexOf>
__global__ __launch_bounds__(encode_policy::threads)
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
    add_strided<Values>(stats, x, begin, end, lane);
    for (int offset = 16; offset > 0; offset /= 2) {
      quantize::bucket_stats other;
      for (int i = 0; i < 4; ++i) other.v[i] = __shfl_xor_sync(0xFFFFFFFFu, stats.v[i], offset);
      stats = Values::merge(stats, other);
    }
    const auto record = Values::make_record(stats, end - begin);
    if (lane == 0) Values::store_record(scales, b, record);
    if constexpr (std::is_same_v<IndexOf, identity_index>) {
      encode_blocked(values, x, begin, end, record, codes, ctx, lane);
    } else {
      encode_strided(values, x, begin, end, record, codes, index_of, ctx, lane);
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
    // A warp per bucket: buckets x 32 threads, each taking a run of items_per_thread per step.
    const unsigned blocks = grid_for_policy<encode_policy>(exec, buckets * 32 * encode_policy::items_per_thread);
    launch(encode_buckets_kernel<Values, T, IndexOf>, blocks, encode_policy::threads, 0, exec.stream(), values, x, count,
           scales, reinterpret_cast<std::uint32_t*>(codes), index_of, ctx);
  }
};

}  // namespace gradzip::detail
