// values_backend<cuda>: bucketed values stages, one warp per bucket (per 256 / B buckets for a
// dense input in buckets that divide 256), in one pass over the input. Lane l reads values l,
// l + 32, ... of the bucket (coalesced) into its statistics, and the lanes merge them in the
// canonical butterfly (a lane of a shared warp plays several of the canonical lanes). Codes need
// no order: a dense bucket is encoded eight consecutive elements per lane, so that one Philox
// block serves them (the RNG contract, random/philox.hpp), and gathered values 32 at a time;
// both pack the layout of quantize/bit_packing.hpp.
#pragma once

#include <type_traits>

#include "gradzip/detail/cuda/bit_planes.cuh"
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
/// bytes of plane b, gathered by `store_bit_planes`. The same codes and words as `encode_strided`.
template <class Values, class T>
__device__ void encode_blocked(const Values& values, const T* x, std::uint64_t begin, std::uint64_t end,
                               const typename Values::record& record, std::uint32_t* codes,
                               quantize::compress_context ctx, unsigned lane) {
  constexpr unsigned run = encode_policy::items_per_thread;
  const auto encoder = quantize::bucket_encoder(values, record);  // the bucket's constants, once
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
    unsigned code[8];
    const auto encode_run = [&](auto encode) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const std::uint32_t random = Values::stochastic ? half_word(block, static_cast<unsigned>(i)) : 0u;
        code[i] = static_cast<unsigned>(i) < valid ? encode(v[i], random) : 0u;
      }
    };
    if constexpr (has_in_range_encode<Values>) {
      // The fast encode where the whole warp's step qualifies: a warp-uniform branch.
      const std::uint32_t floor = Values::in_range_floor(record);
      std::uint32_t outside = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) outside |= static_cast<unsigned>(i) < valid ? outside_encode_range(v[i], floor) : 0u;
      if (__all_sync(0xFFFFFFFFu, outside == 0)) {
        encode_run([&](float value, std::uint32_t random) { return values.encode_in_range(value, record, random); });
      } else {
        encode_run(encoder);
      }
    } else {
      encode_run(encoder);
    }
    const std::uint64_t group = s + 32 * (lane / 4);  // the group of 32 this lane's codes are in
    store_bit_planes<Values::bits>(code, codes, group / 32, group < end, lane);
  }
}

/// Codes of a bucket of gathered values (top-k, random-k: tensor index `index_of(j)`), 32 at a
/// time, lane l encoding value g + l; one __ballot_sync per bit plane.
template <class Values, class T, class IndexOf>
__device__ void encode_strided(const Values& values, const T* x, std::uint64_t begin, std::uint64_t end,
                               const typename Values::record& record, std::uint32_t* codes, IndexOf index_of,
                               quantize::compress_context ctx, unsigned lane) {
  const auto encoder = quantize::bucket_encoder(values, record);
  for (std::uint64_t g = begin; g < end; g += 32) {  // warp-uniform: every lane iterates alike
    const std::uint64_t j = g + lane;
    const unsigned code =
        j < end ? encoder(static_cast<float>(to_float(x[j])), quantize::element_random(values, index_of(j), ctx)) : 0u;
    std::uint32_t* words = codes + (g / 32) * Values::bits;
    for (int bit = 0; bit < Values::bits; ++bit) {
      const std::uint32_t plane = __ballot_sync(0xFFFFFFFFu, (code >> bit) & 1u);
      if (lane == static_cast<unsigned>(bit)) words[bit] = plane;
    }
  }
}

/// add_strided's step: lane l adds values s + l, s + l + 32, ..., s + l + 224 that lie below end,
/// all 8 loaded before the first add. Whole: the span lies below end, so none is tested.
template <class Values, bool Whole, class T>
__device__ inline void add_span(quantize::bucket_stats& stats, const T* x, std::uint64_t s, std::uint64_t end,
                                unsigned lane) {
  const auto present = [&](unsigned m) { return Whole || s + 32 * m + lane < end; };
  float v[8];
#pragma unroll
  for (unsigned m = 0; m < 8; ++m) v[m] = present(m) ? static_cast<float>(to_float(x[s + 32 * m + lane])) : 0.0f;
#pragma unroll
  for (unsigned m = 0; m < 8; ++m) {
    if (present(m)) Values::add(stats, v[m]);
  }
}

/// Lane l's statistics of a bucket's values [begin, end): values l, l + 32, ... added in that
/// order (the canonical order, quantize/bucket_stats.hpp), 256 at a time with the lane's 8
/// loads issued before its first add, so that 8 are in flight (each load instruction of the warp
/// reads 128 consecutive bytes).
template <class Values, class T>
__device__ inline void add_strided(quantize::bucket_stats& stats, const T* x, std::uint64_t begin, std::uint64_t end,
                                   unsigned lane) {
  std::uint64_t s = begin;
  // Whole spans first, with no bound to test per element: the tests and their predicated adds
  // were most of this loop's instructions (17 per element for uniform 4-bit in sm_90's SASS).
  for (; s + 256 <= end; s += 256) add_span<Values, true>(stats, x, s, end, lane);
  if (s < end) add_span<Values, false>(stats, x, s, end, lane);  // the bucket's last, partial span
}

/// Buckets a warp takes per step: one, or for a dense input in buckets of 32, 64 or 128 elements,
/// 256 / B of them, so that `encode_blocked`'s span of 256 (8 per lane) is all theirs: with one
/// bucket of 128 (QSGD's) per warp, half the lanes idled through the encode, the Philox block
/// included, and every bucket paid a five-step butterfly of its own. B must divide 256: a lane's
/// eight elements must fall in the bucket whose record it holds (with 96, lanes 12-15 would
/// encode the next bucket's).
template <class Values, class IndexOf>
inline constexpr unsigned buckets_per_warp =
    std::is_same_v<IndexOf, identity_index> && Values::bucket < 256 && 256 % Values::bucket == 0
        ? 256 / Values::bucket : 1;

/// shared_warp_stats' first part: lane r's partials s[j] of the canonical lanes (r mod L) + L j
/// of its bucket [begin, end), all its values loaded before the first add. Whole: the bucket
/// has all its values, so none is tested against end.
template <class Values, unsigned P, unsigned L, unsigned per_lane, bool Whole, class T>
__device__ inline void lane_partials(quantize::bucket_stats (&s)[P], const T* x, std::uint64_t begin,
                                     std::uint64_t end, unsigned lane) {
  const auto present = [&](unsigned j, unsigned m) { return Whole || begin + lane % L + L * j + 32 * m < end; };
  float v[P][per_lane];
#pragma unroll
  for (unsigned j = 0; j < P; ++j) {
#pragma unroll
    for (unsigned m = 0; m < per_lane; ++m) {
      v[j][m] = present(j, m) ? static_cast<float>(to_float(x[begin + lane % L + L * j + 32 * m])) : 0.0f;
    }
  }
#pragma unroll
  for (unsigned j = 0; j < P; ++j) {
    s[j] = Values::empty_stats();
#pragma unroll
    for (unsigned m = 0; m < per_lane; ++m) {
      if (present(j, m)) Values::add(s[j], v[j][m]);
    }
  }
}

/// The statistics of P buckets per warp in the canonical order. Bucket g of the step has the
/// L = 32 / P lanes g L .. g L + L - 1, and lane r plays the canonical order's lanes
/// (r mod L) + L j, j < P, of its bucket: it adds their values v, v + 32, ... in order (8 in
/// all, loaded first), merges them locally where the butterfly's offset is L or more (merge is
/// commutative bit for bit, so both partners of a pair hold the same result), and by shuffles
/// within its L lanes below that. Every lane returns its bucket's statistics.
template <class Values, unsigned P, class T>
__device__ quantize::bucket_stats shared_warp_stats(const T* x, std::uint64_t begin, std::uint64_t end, unsigned lane) {
  constexpr unsigned L = 32 / P, per_lane = Values::bucket / 32;
  static_assert(P * per_lane == 8 && L * 8 == Values::bucket, "shared_warp_stats: P buckets of 8 L elements fill 256");
  quantize::bucket_stats s[P];
  // A whole bucket (the rule) is read and added with no bound to test per element, as in
  // add_strided. Past the last bucket end - begin is 0 or wraps (begin > count): not a bucket.
  if (end - begin == Values::bucket) {
    lane_partials<Values, P, L, per_lane, true>(s, x, begin, end, lane);
  } else {
    lane_partials<Values, P, L, per_lane, false>(s, x, begin, end, lane);
  }
#pragma unroll
  for (unsigned offset = 16; offset >= L; offset /= 2) {  // lanes j and j ^ (offset / L) are both here
#pragma unroll
    for (unsigned j = 0; j < P; ++j) {
      const unsigned partner = j ^ (offset / L);
      if (j < partner) s[j] = s[partner] = Values::merge(s[j], s[partner]);
    }
  }
  quantize::bucket_stats stats = s[0];
#pragma unroll
  for (unsigned offset = L / 2; offset > 0; offset /= 2) {  // within the bucket's L lanes
    quantize::bucket_stats other;
    for (int i = 0; i < 4; ++i) other.v[i] = __shfl_xor_sync(0xFFFFFFFFu, stats.v[i], offset);
    stats = Values::merge(stats, other);
  }
  return stats;
}

template <class Values, class T, class IndexOf>
__global__ __launch_bounds__(encode_policy::threads)
void encode_buckets_kernel(Values values, const T* x, std::uint64_t count,
                           std::uint8_t* scales, std::uint32_t* codes, IndexOf index_of,
                           quantize::compress_context ctx) {
  constexpr unsigned P = buckets_per_warp<Values, IndexOf>, L = 32 / P;
  const unsigned lane = threadIdx.x % 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * (blockDim.x / 32);
  const std::uint64_t buckets = Values::bucket_count(count);
  for (std::uint64_t first = (static_cast<std::uint64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32) * P;
       first < buckets; first += warps * P) {
    const std::uint64_t b = first + lane / L;  // this lane's bucket
    const std::uint64_t begin = b * Values::bucket;
    const std::uint64_t end = begin + Values::bucket < count ? begin + Values::bucket : count;  // empty past the last
    // Canonical order (quantize/bucket_stats.hpp): lane l adds values l, l + 32, ... in order,
    // then an xor butterfly merges the lanes.
    quantize::bucket_stats stats = Values::empty_stats();
    if constexpr (P == 1) {
      add_strided<Values>(stats, x, begin, end, lane);
      for (int offset = 16; offset > 0; offset /= 2) {
        quantize::bucket_stats other;
        for (int i = 0; i < 4; ++i) other.v[i] = __shfl_xor_sync(0xFFFFFFFFu, stats.v[i], offset);
        stats = Values::merge(stats, other);
      }
    } else {
      stats = shared_warp_stats<Values, P>(x, begin, end, lane);
    }
    // Lanes past the last bucket (a shared warp's last step) hold an empty one: no record is
    // made for it (a stage may divide by the count), none stored, and they encode nothing.
    const auto record = b < buckets ? Values::make_record(stats, end - begin) : typename Values::record{};
    if (lane % L == 0 && b < buckets) Values::store_record(scales, b, record);
    if constexpr (std::is_same_v<IndexOf, identity_index>) {
      // The step's span: P buckets, lane l's eight elements in its own bucket (8 l / B = l / L).
      const std::uint64_t span = first * Values::bucket;
      encode_blocked(values, x, span, span + P * Values::bucket < count ? span + P * Values::bucket : count, record,
                     codes, ctx, lane);
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
    constexpr unsigned per_warp = buckets_per_warp<Values, IndexOf>;
    const std::uint64_t steps = (Values::bucket_count(count) + per_warp - 1) / per_warp;
    // A warp per step of per_warp buckets: 32 threads each, a run of items_per_thread per thread.
    const unsigned blocks = grid_for_policy<encode_policy>(exec, steps * 32 * encode_policy::items_per_thread);
    launch(encode_buckets_kernel<Values, T, IndexOf>, blocks, encode_policy::threads, 0, exec.stream(), values, x, count,
           scales, reinterpret_cast<std::uint32_t*>(codes), index_of, ctx);
  }
};

}  // namespace gradzip::detail
