// CUDA top-k: radix select on magnitude keys (AIR top-k's plan: Zhang et al., "Parallel Top-K
// Algorithms on GPU: A Comprehensive Study and New Methods", SC '23), with sorted output and no
// host synchronization.
//
// Digits of 11 bits (31 = 11 + 11 + 9 for float, half and bf16 keys; 63 = 5 x 11 + 8 for double):
//   1. histogram of the first digit over x; the pass's last block picks the bin holding the k-th
//      largest (select_if_last: no launch of its own);
//   2. one pass over x compacts, in index order, every element whose key is at least that bin's
//      lowest (the k largest plus the rest of the bin) into a candidate list, and counts the
//      second digit of the bin's elements on the way: filter and next histogram fused;
//   3. the remaining digits count the list, not x (x again if the list outgrew its capacity);
//      a select that takes its whole bin resolves T early and the later passes return at once;
//   4. the emit compacts the list (or x) once more: keys above T, and the first ties_to_take keys
//      equal to T, each at its rank, so indices come out sorted and ties go to the lower index.
// From cuda_topk_sample_from elements on, a strided sample's bound replaces step 1 (as the
// host's one-read select): the first launch gathers the m sampled keys, one block picks the key
// that k m / n + 4 sigma + 9 of them reach, one compaction keeps the keys at or above it and
// counts their first digit, and the later digits count the list. If the list misses some of the
// k largest or overflows, its last block hands over to steps 1-2, launched after it either way,
// which otherwise return at once.
// The compactions are single passes with decoupled look-back (lookback.cuh). Every count is an
// integer and every position a rank in index order, so the payload equals the host's byte for
// byte. x is read twice (once when the sample holds; plus the list); a float's top-k is 5
// launches (8 from the sample), the first zeroing 16 KB of bins and the tile words (and
// gathering the sample).
// Up to cuda_topk_resident_max elements, when a block per 4,096 of them fits the device at once,
// the same passes run in one cooperative launch instead (topk_resident_kernel): x is read once
// into registers, and a grid_sync replaces each launch boundary.
#pragma once

#include <algorithm>
#include <atomic>
#include <cub/block/block_scan.cuh>
#include <type_traits>

#include "gradzip/detail/codec_traits.hpp"
#include "gradzip/detail/cuda/lookback.cuh"
#include "gradzip/detail/cuda/vector_load.cuh"
#include "gradzip/detail/topk_plan.hpp"
#include "gradzip/encode/none.hpp"
#include "gradzip/quantize/cast.hpp"
#include "gradzip/quantize/none.hpp"

namespace gradzip::detail {

/// The emit of structures with implicit indices (random-k): one kept element per thread and
/// grid-stride step.
using implicit_emit_policy = launch_policy<256, 1, 8>;

/// The passes over x and the list: 256 threads, a run of 8 consecutive elements per thread
/// (load_run: 16-byte loads), <= 8 blocks per SM. An emit tile is one run per thread (the
/// compaction's, topk_compact_runs).
using topk_policy = launch_policy<256, 8, 8>;
inline constexpr std::uint64_t topk_tile = std::uint64_t{topk_policy::threads} * topk_policy::items_per_thread;
GRADZIP_HOST_DEVICE inline std::uint64_t topk_tiles(std::uint64_t n) { return n == 0 ? 1 : (n + topk_tile - 1) / topk_tile; }
static_assert(topk_policy::items_per_thread == 8, "topk_policy: runs of 8 (load_run)");
static_assert(topk_policy::threads >= 64, "topk_policy: the emit's two look-backs take a warp each");
/// The compaction's and the emit's register budget: 64 per thread at 256 threads (4 blocks, 50 %
/// occupancy). Without it, ptxas for sm_100 held the compaction to 48 registers and spilled.
inline constexpr unsigned topk_min_blocks_per_sm = 4;

/// The candidate list: indices and values, in index order; `capacity` entries.
template <class T>
struct topk_list {
  std::uint64_t* index;
  T* values;
  std::uint64_t capacity;
};

/// What a pass after the compaction reads: the list when it holds every candidate, else x.
template <class T>
struct topk_source {
  const T* values;
  const std::uint64_t* index;  // nullptr: element j is x[j]
  std::uint64_t count;
  __device__ std::uint64_t index_of(std::uint64_t j) const { return index == nullptr ? j : index[j]; }
};

template <class T, class Key>
__device__ inline topk_source<T> source_of(const T* x, std::uint64_t n, const topk_list<T>& list,
                                           const cuda_topk_state<Key>* st) {
  const std::uint64_t m = st->candidates;
  const bool listed = m != cuda_topk_no_list && m <= list.capacity;
  const topk_source<T> s = listed ? topk_source<T>{list.values, list.index, m} : topk_source<T>{x, nullptr, n};
  assume_global(s.values);  // chosen at run time: without it, nvcc's loads are generic, not ld.global
  return s;
}

/// v[k] for a k known only at run time, by selects (an indexed array would go to local memory).
template <class T>
__device__ inline T pick(const T (&v)[8], unsigned k) {
  T r = v[0];
#pragma unroll
  for (unsigned j = 1; j < 8; ++j) {
    if (k == j) r = v[j];
  }
  return r;
}

/// The digit a key adds to the histogram, or no_digit when it does not match the prefix.
inline constexpr unsigned topk_no_digit = 0xFFFFFFFFu;
template <class Key>
__device__ inline unsigned digit_of(Key key, Key prefix, Key mask, radix_digit d) {
  return (key & mask) == prefix ? static_cast<unsigned>((key >> d.shift) & ((Key{1} << d.width) - 1)) : topk_no_digit;
}

/**
 * How the histogram passes count a warp's digits into the shared bins:
 * - `match_any`: `__match_any_sync` groups the lanes holding one digit, and one of them adds the
 *   group's count: one atomic per distinct digit, at the cost of a match per warp and element;
 * - `per_element`: each lane adds 1 to its digit's bin (AIR top-k's and CUB's histograms): one
 *   atomic per element, lanes of one digit serialized.
 * The counts are the same integers either way. `per_element` is the default: on an H200
 * (2026-11-26, `gradzip_bench_cuda`'s `BM_cuda_topk_phases`) the first histogram over 2^28
 * synthetic fp32 took 334 µs by it and 1,583 µs by `match_any`; 13.2 against 18.1 at 2^20
 * (docs/performance.md, "Measured on an H200"). On keys crowded into 8 bins, where per-element
 * atomics collide most, 333 against 683 at 2^28.
 */
enum class topk_counting { match_any, per_element };
inline constexpr topk_counting topk_default_counting = topk_counting::per_element;

/// Adds a lane's digit (topk_no_digit: none) to the shared bins. Every lane of the warp calls it
/// together (the callers' loops are block-uniform).
template <topk_counting Counting>
__device__ inline void add_digit(unsigned* bins, unsigned digit) {
  if constexpr (Counting == topk_counting::match_any) {
    const unsigned peers = __match_any_sync(0xFFFFFFFFu, digit);
    if (digit != topk_no_digit && threadIdx.x % 32 == static_cast<unsigned>(__ffs(static_cast<int>(peers)) - 1)) {
      atomicAdd(&bins[digit], static_cast<unsigned>(__popc(peers)));
    }
  } else {
    if (digit != topk_no_digit) atomicAdd(&bins[digit], 1u);
  }
}

__device__ inline void zero_bins(unsigned* bins) {
  for (int b = threadIdx.x; b < topk_digit_bins; b += blockDim.x) bins[b] = 0;
  __syncthreads();
}

/// Adds the block's shared bins to a digit's global counts, once every thread has counted.
template <class Count>
__device__ inline void flush_bins(const unsigned* bins, Count* hist) {
  static_assert(std::is_same_v<Count, unsigned long long> || std::is_same_v<Count, unsigned>,
                "flush_bins: 64-bit counts (the launches) or 32-bit ones (the one-launch select: n < 2^32)");
  __syncthreads();
  for (int b = threadIdx.x; b < topk_digit_bins; b += blockDim.x) {
    if (bins[b] != 0) atomicAdd(hist + b, static_cast<Count>(bins[b]));
  }
}

/// Sampled keys per thread of the sample's block: topk_sample_max over its threads.
inline constexpr unsigned topk_sample_keys_per_thread = 64;
inline constexpr std::uint64_t topk_sample_slots =
    std::uint64_t{topk_sample_keys_per_thread} * cuda_topk_select_threads;
static_assert(topk_sample_max <= topk_sample_slots, "topk_sample_kernel: every sample in a register of the block");

/// The strided sample behind the sampled select: m keys at positions j * n / m of x, gathered by
/// topk_init_kernel into keys[0 .. m), and zeros in keys[m .. topk_sample_slots) so that the
/// sample kernel's loads need no bounds (m = 0: no sample).
template <class T, class Key>
struct topk_sample_gather {
  const T* x;
  std::uint64_t n, m;
  Key* keys;
};

/// The state, and zeros over `words` u64 words (the bins and the tile words): one launch, not a
/// kernel and a memset. It also gathers the sample, a key per thread (grid-stride): spread over
/// the grid's SMs, the scattered reads take about one memory latency; from the sample kernel's
/// one block they took 25 us on an H200 (one SM's outstanding misses are few).
template <class T, class Key>
__global__ __launch_bounds__(topk_policy::threads)
void topk_init_kernel(cuda_topk_state<Key>* st, std::uint64_t k, std::uint64_t* zeros, std::uint64_t words,
                      topk_sample_gather<T, Key> sample) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *st = cuda_topk_state<Key>{};
    st->rank = k;
    st->candidates = cuda_topk_no_list;
  }
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  const std::uint64_t first = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (sample.m != 0) {
    const std::uint64_t q = sample.n / sample.m;
    const auto r = static_cast<std::uint32_t>(sample.n % sample.m), m32 = static_cast<std::uint32_t>(sample.m);
    for (std::uint64_t j = first; j < topk_sample_slots; j += stride) {
      sample.keys[j] = j < sample.m ? magnitude_key(sample.x[topk_sample_position(j, q, r, m32)]) : Key{0};
    }
  }
  for (std::uint64_t i = first; i < words; i += stride) zeros[i] = 0;
}

/**
 * One block finds, in hist[0 .. bins), the bin holding the rank-th largest, the count of
 * elements in higher bins and the count in the bin. Every thread gets the answer. Thread t owns
 * descending positions [8t, 8t + 8) (bins <= 8 * threads): it sums them (8 loads at once), and
 * the one thread whose sum holds the rank reads its 8 again to find the bin, so that no thread
 * keeps 8 counts across the scan (the histogram's 32 registers). Volatile: other blocks' atomics
 * wrote the bins in this kernel.
 */
__device__ inline void block_find_rank(const unsigned long long* hist, int bins, std::uint64_t rank, int& bin,
                                       std::uint64_t& above, std::uint64_t& in_bin) {
  static_assert(topk_digit_bins <= 8 * cuda_topk_select_threads, "block_find_rank: at most 8 bins per thread");
  using scan_t = cub::BlockScan<std::uint64_t, cuda_topk_select_threads>;
  __shared__ typename scan_t::TempStorage temp;
  __shared__ int found_bin;
  __shared__ std::uint64_t found_above, found_count;
  const auto* counts = static_cast<const volatile unsigned long long*>(hist);
  const int first = static_cast<int>(threadIdx.x) * 8;
  const auto count_at = [&](int p) -> std::uint64_t { return first + p < bins ? counts[bins - 1 - (first + p)] : 0; };
  std::uint64_t mine = 0;
#pragma unroll
  for (int p = 0; p < 8; ++p) mine += count_at(p);
  std::uint64_t before = 0;
  scan_t(temp).ExclusiveSum(mine, before);
  if (before < rank && before + mine >= rank) {  // exactly one thread holds the rank, in its own bins
    std::uint64_t acc = before;
#pragma unroll 1
    for (int p = 0; p < 8; ++p) {
      const std::uint64_t c = count_at(p);
      if (acc + c >= rank) {
        found_bin = bins - 1 - (first + p);
        found_above = acc;
        found_count = c;
        break;
      }
      acc += c;
    }
  }
  __syncthreads();
  bin = found_bin;
  above = found_above;
  in_bin = found_count;
}

/**
 * The end of a counting pass, in every block after its flush_bins: whether this block is the
 * last to finish, which then sees every block's bins and state writes and selects (select_digit),
 * so the select costs no launch of its own (a one-block launch took about 5 us at every n on an
 * H200, three of them in a float's top-k). Every block read the state before it counted, so the
 * last one may change it.
 */
template <class Key>
__device__ inline bool last_block_of_pass(cuda_topk_state<Key>* st) {
  static_assert(topk_policy::threads == cuda_topk_select_threads, "last_block_of_pass: a pass's block selects");
  __shared__ bool last;
  __threadfence();  // this block's bins (flush_bins) before its count of finished blocks
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&st->blocks_done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (last) __threadfence();  // every other block's bins before the last block reads them
  return last;
}

/// The last block's select of digit d: its bin, the narrowed state, and zeroed bins and
/// `blocks_done` for the next pass.
template <class Key>
__device__ inline void select_digit(unsigned long long* hist, radix_digit d, cuda_topk_state<Key>* st) {
  const int bins = 1 << d.width;
  int bin = 0;
  std::uint64_t above = 0, in_bin = 0;
  block_find_rank(hist, bins, st->rank, bin, above, in_bin);
  for (int b = threadIdx.x; b < bins; b += blockDim.x) hist[b] = 0;
  if (threadIdx.x == 0) {
    narrow_state(st, d, bin, above, in_bin);
    st->blocks_done = 0;
  }
}

template <class Key>
__device__ inline void select_if_last(unsigned long long* hist, radix_digit d, cuda_topk_state<Key>* st) {
  if (last_block_of_pass(st)) select_digit(hist, d, st);
}

/// Histogram of digit d over the keys that match the prefix: x at the first digit, the list (or
/// x) after the compaction. Returns at once once T is resolved, or when `pass` serves the other
/// select (topk_pass_runs). Its launch bounds hold it to 32
/// registers, 8 blocks per SM, as it had before the select joined it: unbounded, the select's
/// 48 (sm_90) left room for 5 of the grid's 8 blocks per SM, and the first histogram over 2^28
/// took 334 µs on an H200 instead of 315. The select spills a few words under 32 (sm_90,
/// sm_100), once per pass in one block; the counting loop keeps to registers
/// (tests/device/spills.txt).
/// Doubles' 64-bit keys need more in the loop: 4 blocks per SM (64 registers) for them.
template <class T>
inline constexpr unsigned topk_histogram_min_blocks = sizeof(T) <= 4 ? topk_policy::blocks_per_sm : topk_min_blocks_per_sm;
template <class T, class Key, topk_counting Counting>
__global__ __launch_bounds__(topk_policy::threads, topk_histogram_min_blocks<T>)
void topk_histogram_kernel(const T* x, std::uint64_t n, topk_list<T> list, cuda_topk_state<Key>* st,
                           radix_digit d, unsigned long long* hist, topk_pass pass) {
  if (!topk_pass_runs(st, pass)) return;
  __shared__ unsigned bins[topk_digit_bins];
  zero_bins(bins);
  const topk_source<T> src = source_of(x, n, list, st);
  const Key prefix = st->prefix, mask = st->mask;
  const std::uint64_t runs = (src.count + 7) / 8;
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  // Block-uniform trip count: every lane reaches add_digit's __match_any_sync together.
  for (std::uint64_t base = std::uint64_t{blockIdx.x} * blockDim.x; base < runs; base += stride) {
    const run_of_8 r = run_at(base + threadIdx.x, src.count);
    T v[8] = {};
    load_run(src.values, r.first, r.valid, v);
#pragma unroll
    for (unsigned k = 0; k < 8; ++k) {
      add_digit<Counting>(bins, k < r.valid ? digit_of(magnitude_key(v[k]), prefix, mask, d) : topk_no_digit);
    }
  }
  flush_bins(bins, hist);
  select_if_last(hist, d, st);
}

/// The sampled compaction's list missed some of the k largest (the sample misled: fewer than k
/// keys reached its bound) or outgrew its capacity: the last block zeroes the bins it counted and
/// hands the select over to the radix passes over x, which start from the state init left.
template <class Key>
__device__ inline void abandon_sample(unsigned long long* hist, radix_digit counted, cuda_topk_state<Key>* st) {
  for (int b = threadIdx.x; b < (1 << counted.width); b += blockDim.x) hist[b] = 0;
  if (threadIdx.x == 0) {
    st->sampled = 0;
    st->candidates = cuda_topk_no_list;
    st->blocks_done = 0;
  }
}

/**
 * The sample's bound, in one block: the rank-th largest of the m keys topk_init_kernel gathered
 * (positions j * n / m: the host's one-read sample, topk_sample_size), by a radix select over
 * them digit by digit. Each thread reads its 64 keys (j = thread + 256 u: coalesced) once, every
 * load issued before any is used, and keeps them in registers for all the digits. Sets st->bound
 * and st->sampled; the rank stays k and the prefix empty, so the sampled compaction counts the
 * first digit of every key it keeps.
 */
template <class Key>
__global__ __launch_bounds__(cuda_topk_select_threads)
void topk_sample_kernel(const Key* keys, std::uint64_t rank, cuda_topk_state<Key>* st) {
  constexpr std::uint32_t step = cuda_topk_select_threads;
  __shared__ unsigned bins[topk_digit_bins];
  __shared__ unsigned long long counts[topk_digit_bins];
  // No bounds anywhere: behind a branch, each load waited for the one before. The slots past m
  // hold key 0, the least, which only bin 0 counts: it is never above the chosen bin, so `above`
  // and the rank-th largest (rank <= m, topk_sample_rank) are those of the m sampled keys.
  Key key[topk_sample_keys_per_thread];
#pragma unroll
  for (unsigned u = 0; u < topk_sample_keys_per_thread; ++u) key[u] = keys[u * step + threadIdx.x];
  Key prefix = 0, mask = 0;
  // cuda_topk_digits' digits, one at a time (an array indexed by the level would be a stack frame)
  for (int high = magnitude_key_bits<Key>; high > 0;) {
    const radix_digit d = topk_digit_below(high);
    high = d.shift;
    zero_bins(bins);
#pragma unroll
    for (unsigned u = 0; u < topk_sample_keys_per_thread; ++u) {
      const unsigned digit = digit_of(key[u], prefix, mask, d);
      if (digit != topk_no_digit) atomicAdd(&bins[digit], 1u);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < (1 << d.width); b += blockDim.x) counts[b] = bins[b];
    __syncthreads();
    int bin = 0;
    std::uint64_t above = 0, in_bin = 0;
    block_find_rank(counts, 1 << d.width, rank, bin, above, in_bin);
    rank -= above;
    append_digit(prefix, mask, d, bin);
  }
  if (threadIdx.x == 0) {
    st->bound = prefix;
    st->sampled = 1;
  }
}

/// Shared storage of a compaction tile: the block scan, the tile id and the tile's base. Measured
/// on an H200 at 2^28 and left out: two of them alternated tile by tile (three barriers per tile,
/// not five) ran no faster, since the warps' barrier stalls are their wait for warp 0's
/// look-back; claiming the next tile during that look-back ran 2.9 times slower, since the tiles
/// after a claimed one then waited a whole tile longer for its count.
struct topk_tile_storage {
  cub::BlockScan<std::uint64_t, topk_policy::threads>::TempStorage scan;
  std::uint64_t id;
  std::uint64_t base[2];
};

/// The compaction's tile: two runs of 8 per thread (4,096 elements) for 2- and 4-byte elements,
/// both loads issued before the block waits on anything, so each claim, scan and look-back serves
/// 16 KB of fp32. One run for doubles: two spilled under the 64-register budget.
template <class T>
inline constexpr unsigned topk_compact_runs = sizeof(T) <= 4 ? 2 : 1;
template <class T>
GRADZIP_HOST_DEVICE inline std::uint64_t topk_compact_tiles(std::uint64_t n) {
  constexpr std::uint64_t tile = topk_compact_runs<T> * topk_tile;
  return n == 0 ? 1 : (n + tile - 1) / tile;
}

/**
 * The candidate list: every element of x whose key is at least `low`, in index order, written
 * while it fits; st->candidates gets their count. On the way, digit `next` of the kept keys that
 * match the prefix goes to hist (unless T is resolved).
 * - The radix select's compaction (`Sampled` false) keeps the first digit's chosen bin and every
 *   higher one (low = st->prefix, that bin's lowest key), and counts the second digit of the
 *   bin's keys. It returns at once when the sampled list already holds the candidates.
 * - The sampled one keeps the keys at or above the sample's bound (low = st->bound) and counts
 *   the first digit of all of them (prefix and mask 0). Its last block selects only if the list
 *   holds at least k keys and fits (then the k-th largest and its ties are in it); otherwise it
 *   zeroes the bins and hands over to the radix select (`abandon_sample`).
 * With two runs per tile, thread t's runs in tile i are runs (2i + j) * threads + t for j = 0, 1:
 * a tile's first half, then its second, so one scan of (count in run 1, count in run 0) pairs
 * ranks both in index order.
 */
template <class T, class Key, topk_counting Counting, bool Sampled = false>
__global__ __launch_bounds__(topk_policy::threads, topk_min_blocks_per_sm)
void topk_compact_kernel(const T* x, std::uint64_t n, topk_list<T> list, cuda_topk_state<Key>* st,
                         radix_digit next, unsigned long long* hist, std::uint64_t* status) {
  constexpr unsigned runs = topk_compact_runs<T>;
  static_assert(runs == 1 || runs == 2, "topk_compact_kernel: a pair of 32-bit counts per thread");
  if (!Sampled && st->sampled != 0) return;
  __shared__ unsigned bins[topk_digit_bins];
  __shared__ topk_tile_storage s;
  zero_bins(bins);
  // The sampled pass counts every key it keeps: no prefix (and no second live key for doubles)
  const Key low = Sampled ? st->bound : st->prefix, prefix = Sampled ? Key{0} : st->prefix;
  const Key mask = Sampled ? Key{0} : st->mask;
  const bool count_next = st->resolved == 0;
  const std::uint64_t tiles = topk_compact_tiles<T>(n);
  for (;;) {
    const std::uint64_t tile = claim_tile(&st->tickets[Sampled ? 2 : 0], &s.id);
    if (tile >= tiles) break;
    run_of_8 r[runs];
    T v[runs][8] = {};
    load_tile_runs<topk_policy::threads>(x, n, tile, r, v);
    unsigned kept[2] = {};
#pragma unroll
    for (unsigned j = 0; j < runs; ++j) {
#pragma unroll
      for (unsigned k = 0; k < 8; ++k) {
        const Key key = magnitude_key(v[j][k]);
        const bool keep = k < r[j].valid && key >= low;
        if (keep) kept[j] |= 1u << k;
        add_digit<Counting>(bins, keep && count_next ? digit_of(key, prefix, mask, next) : topk_no_digit);
      }
    }
    const tile_ranks ranks = rank_tile<topk_policy::threads>(s.scan, s.base[0], status, tile, tiles, kept,
                                                              [&](std::uint64_t count) { st->candidates = count; });
#pragma unroll
    for (unsigned j = 0; j < runs; ++j) {
      const std::uint64_t at_run = ranks.first(j);
#pragma unroll 1
      for (unsigned bits = kept[j]; bits != 0; bits &= bits - 1) {  // about 1.1 k / n of the elements
        const unsigned k = static_cast<unsigned>(__ffs(static_cast<int>(bits)) - 1);
        const std::uint64_t at = at_run + __popc(kept[j] & ((1u << k) - 1));
        if (at < list.capacity) {
          list.index[at] = r[j].first + k;
          list.values[at] = pick(v[j], k);
        }
      }
    }
    __syncthreads();  // the scan's storage and the base are reused for the next tile
  }
  flush_bins(bins, hist);
  if (!count_next || !last_block_of_pass(st)) return;
  if constexpr (Sampled) {
    // One thread decides for the block: abandon_sample rewrites the count it reads. Volatile:
    // another block's thread 0 wrote it in this kernel.
    __shared__ bool holds;
    if (threadIdx.x == 0) {
      const std::uint64_t listed = *static_cast<volatile std::uint64_t*>(&st->candidates);
      holds = listed >= st->rank && listed <= list.capacity;
    }
    __syncthreads();
    if (!holds) {
      abandon_sample(hist, next, st);
      return;
    }
  }
  select_digit(hist, next, st);
}

/// A run's keys above T and equal to T, as bit masks over its `valid` elements.
struct run_marks {
  unsigned above = 0, tie = 0;
};
template <class T, class Key>
__device__ inline run_marks mark_run(const T (&v)[8], unsigned valid, Key threshold) {
  run_marks m;
#pragma unroll
  for (unsigned e = 0; e < 8; ++e) {
    const Key key = magnitude_key(v[e]);
    if (e < valid && key > threshold) m.above |= 1u << e;
    if (e < valid && key == threshold) m.tie |= 1u << e;
  }
  return m;
}

/// The emit's rank rule, for one run: with a0 keys above T and t0 ties before the run (in index
/// order), its element e goes to (keys above T before it) + min(ties before it, take) when above
/// T, and a tie goes only while ties before it < take. One sink call site, in a loop over the
/// run's set bits: unrolling it 8 times costs registers that the sink's quantizer needs.
template <class T, class Sink, class IndexOf>
__device__ inline void emit_run(const Sink& sink, const T (&v)[8], run_marks m, std::uint64_t a0, std::uint64_t t0,
                                std::uint64_t take, IndexOf index_of) {
#pragma unroll 1
  for (unsigned bits = m.above | m.tie; bits != 0; bits &= bits - 1) {
    const unsigned e = static_cast<unsigned>(__ffs(static_cast<int>(bits)) - 1), lower = (1u << e) - 1;
    const std::uint64_t a = a0 + __popc(m.above & lower), t = t0 + __popc(m.tie & lower);
    if ((m.above >> e) & 1u) {
      sink(a + (t < take ? t : take), index_of(e), pick(v, e));
    } else if (t < take) {
      sink(a + t, index_of(e), pick(v, e));
    }
  }
}

/// A sink's prologue (sink_with_prologue: the payload's frame), by the threads of block 0: once
/// per select, in its first kernel that takes the sink.
template <class Sink>
__device__ inline void run_prologue(const Sink& sink) {
  if constexpr (has_prologue<Sink>) {
    if (blockIdx.x == 0) sink.prologue(threadIdx.x, blockDim.x);
  }
}

/// A select with nothing to select (k or n 0) still runs its sink's prologue.
template <class Sink>
__global__ __launch_bounds__(32)
void topk_prologue_kernel(Sink sink) {
  run_prologue(sink);
}

/**
 * Emits the selection from the list (or x): keys above T, then the first ties_to_take keys equal
 * to T, each at its rank in index order: (keys above T before it) + min(ties before it,
 * ties_to_take). Two counts, so two look-backs; a thread's pair travels as one u64 (32-bit halves:
 * a tile has at most 2,048 of each).
 */
template <class T, class Key, class Sink>
__global__ __launch_bounds__(topk_policy::threads, topk_min_blocks_per_sm)
void topk_emit_kernel(const T* x, std::uint64_t n, topk_list<T> list, cuda_topk_state<Key>* st,
                      std::uint64_t* status, Sink sink) {
  using scan_t = cub::BlockScan<std::uint64_t, topk_policy::threads>;
  __shared__ topk_tile_storage s;
  run_prologue(sink);
  const topk_source<T> src = source_of(x, n, list, st);
  const Key threshold = st->threshold;
  const std::uint64_t take = st->ties_to_take;
  const std::uint64_t tiles = topk_tiles(src.count), stride = topk_tiles(n);  // the words are laid out for x
  for (;;) {
    const std::uint64_t tile = claim_tile(&st->tickets[1], &s.id);
    if (tile >= tiles) break;
    const run_of_8 r = run_at(tile * topk_policy::threads + threadIdx.x, src.count);
    T v[8] = {};
    load_run(src.values, r.first, r.valid, v);
    const run_marks m = mark_run(v, r.valid, threshold);
    std::uint64_t rank = 0, total = 0;
    const std::uint64_t pair = (std::uint64_t(__popc(m.above)) << 32) | std::uint64_t(__popc(m.tie));
    scan_t(s.scan).ExclusiveSum(pair, rank, total);
    if (threadIdx.x < 64) {  // warp c walks back count c, whose tile t is word c * stride + t (tiles <= stride)
      const unsigned c = threadIdx.x / 32;
      const std::uint64_t before = tile_lookback(status + c * stride, tile, c == 0 ? total >> 32 : total & 0xFFFFFFFFu);
      if (threadIdx.x % 32 == 0) s.base[c] = before;
    }
    __syncthreads();
    emit_run(sink, v, m, s.base[0] + (rank >> 32), s.base[1] + (rank & 0xFFFFFFFFu), take,
             [&](unsigned e) { return src.index_of(r.first + e); });
    __syncthreads();
  }
}

/// The one-launch select's tile: two runs of 8 per thread (4,096 elements per block), held in
/// registers from the first read to the emit.
inline constexpr unsigned topk_resident_runs = 2;
inline constexpr std::uint64_t topk_resident_tile = topk_resident_runs * topk_tile;
GRADZIP_HOST_DEVICE inline std::uint64_t topk_resident_blocks_for(std::uint64_t n) {
  return n == 0 ? 1 : (n + topk_resident_tile - 1) / topk_resident_tile;
}
/// The one-launch select's bins: a row of topk_digit_bins 32-bit counts per digit.
template <class Key>
inline constexpr int topk_resident_levels = (magnitude_key_bits<Key> + topk_digit_bits - 1) / topk_digit_bits;

/// What resident_find_rank found, in the caller's shared memory: the bin, the keys above it, its count.
struct topk_found {
  int bin;
  std::uint64_t above, count;
};
/**
 * block_find_rank for the one-launch select, over 32-bit counts that a grid_sync made visible (so
 * plain loads from L2, not volatile ones): thread t loads its 8 descending bins [8t, 8t + 8) with
 * two 16-byte loads and parks them in the block's shared bins (free until the next digit's
 * zero_bins), so the thread whose sum holds the rank finds the bin there, not by a second read
 * of global memory. An H100 put 37 % of the kernel's warp samples in block_find_rank's 8 volatile
 * 64-bit loads per thread and that second read (docs/performance.md).
 *
 * `found` is the caller's shared memory: a static local here would carry CUB's arch-tagged
 * namespace (ScanStorage) in its name, which then differs between one-arch and fat builds.
 */
template <class ScanStorage>
__device__ inline void resident_find_rank(const unsigned* row, int bins, std::uint64_t rank, unsigned* shared_bins,
                                          ScanStorage& scan, topk_found& found, int& bin, std::uint64_t& above,
                                          std::uint64_t& in_bin) {
  static_assert(topk_digit_bins <= 8 * topk_policy::threads, "resident_find_rank: at most 8 bins per thread");
  const int top = bins - 8 * static_cast<int>(threadIdx.x);  // this thread's bins are [top - 8, top)
  std::uint64_t mine = 0, before = 0;
  if (top >= 8) {  // bins is a power of two >= 8 (digits of 8 to 11 bits; 3 at least): whole groups of 8
    const uint4 hi = __ldcg(reinterpret_cast<const uint4*>(row + top - 4));
    const uint4 lo = __ldcg(reinterpret_cast<const uint4*>(row + top - 8));
    reinterpret_cast<uint4*>(shared_bins + top - 4)[0] = hi;
    reinterpret_cast<uint4*>(shared_bins + top - 8)[0] = lo;
    mine = std::uint64_t{hi.x} + hi.y + hi.z + hi.w + lo.x + lo.y + lo.z + lo.w;
  }
  __syncthreads();  // the scan's storage, last used before the caller's grid_sync
  cub::BlockScan<std::uint64_t, topk_policy::threads>(scan).ExclusiveSum(mine, before);
  if (before < rank && before + mine >= rank) {  // exactly one thread holds the rank, in its own bins
    std::uint64_t acc = before;
#pragma unroll 1
    for (int b = top - 1; b >= top - 8; --b) {
      const unsigned c = shared_bins[b];
      if (acc + c >= rank) {
        found = topk_found{b, acc, c};
        break;
      }
      acc += c;
    }
  }
  __syncthreads();
  bin = found.bin;
  above = found.above;
  in_bin = found.count;
}

/// The field f (0 to 3) of four 16-bit counts packed in a u64.
__device__ inline std::uint64_t count16(std::uint64_t packed, unsigned f) { return (packed >> (16 * f)) & 0xFFFFu; }

/**
 * The whole select of a small input in one cooperative launch (docs/performance.md): block b
 * holds elements [4,096 b, 4,096 (b + 1)) in registers, two runs of 8 per thread, and every
 * pass counts them there, with grid_sync between the passes instead of a launch:
 *   0. load the runs, and zero every digit's row of `hist` (the grid's threads); grid_sync;
 *   1. per digit: count the keys that match the prefix into the block's shared bins, add them to
 *      the digit's row (flush_bins), grid_sync, and narrow the state in every block alike from
 *      the row (resident_find_rank, narrow_state), until T is resolved;
 *   2. the emit: each block counts its keys above T and equal to T, publishes the two counts,
 *      grid_sync, sums the counts of the blocks before it, and calls the sink for its keys at
 *      their ranks in index order (ties to the lower index), as topk_emit_kernel does.
 * Nothing stays in shared memory across a grid_sync: the state is in registers, the counts in
 * global memory. The same integers as the multi-launch select, so the same payload.
 */
template <class T, class Key, topk_counting Counting, class Sink>
__global__ __launch_bounds__(topk_policy::threads, topk_min_blocks_per_sm)
void topk_resident_kernel(const T* x, std::uint64_t n, std::uint64_t k, unsigned* hist,
                          unsigned long long* block_counts, Sink sink) {
  constexpr unsigned runs = topk_resident_runs;
  static_assert(runs == 2, "topk_resident_kernel: four 16-bit counts per thread (two runs, above and ties)");
  static_assert(magnitude_key_bits<Key> % topk_digit_bits == 0 || magnitude_key_bits<Key> % topk_digit_bits >= 3,
                "topk_resident_kernel: every digit has at least 8 bins (resident_find_rank's groups of 8)");
  using scan_t = cub::BlockScan<std::uint64_t, topk_policy::threads>;
  alignas(16) __shared__ unsigned bins[topk_digit_bins];  // resident_find_rank parks 16-byte groups here
  __shared__ typename scan_t::TempStorage scan;
  __shared__ topk_found found;
  run_prologue(sink);
  run_of_8 r[runs];
  T v[runs][8] = {};
#pragma unroll
  for (unsigned j = 0; j < runs; ++j) {
    r[j] = run_at((std::uint64_t{blockIdx.x} * runs + j) * topk_policy::threads + threadIdx.x, n);
    load_run(x, r[j].first, r[j].valid, v[j]);
  }
  const std::uint64_t words = std::uint64_t{topk_resident_levels<Key>} * topk_digit_bins;
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < words;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    hist[i] = 0;
  }
  grid_sync();
  cuda_topk_state<Key> st{};  // every block's copy narrows alike
  st.rank = k;
  unsigned* row = hist;
  for (int high = magnitude_key_bits<Key>; high > 0 && st.resolved == 0; row += topk_digit_bins) {
    const radix_digit d = topk_digit_below(high);
    high = d.shift;
    zero_bins(bins);
#pragma unroll
    for (unsigned j = 0; j < runs; ++j) {
#pragma unroll
      for (unsigned e = 0; e < 8; ++e) {
        add_digit<Counting>(bins, e < r[j].valid ? digit_of(magnitude_key(v[j][e]), st.prefix, st.mask, d) : topk_no_digit);
      }
    }
    flush_bins(bins, row);
    grid_sync();
    int bin = 0;
    std::uint64_t above = 0, in_bin = 0;
    resident_find_rank(row, 1 << d.width, st.rank, bins, scan, found, bin, above, in_bin);
    narrow_state(&st, d, bin, above, in_bin);
  }
  run_marks m[runs];
#pragma unroll
  for (unsigned j = 0; j < runs; ++j) m[j] = mark_run(v[j], r[j].valid, st.threshold);
  // One scan of (run 1 above, run 1 ties, run 0 above, run 0 ties): at most 2,048 each per block.
  // (resident_find_rank ended with a barrier since its scan, and at least one digit ran.)
  std::uint64_t rank = 0, total = 0;
  scan_t(scan).ExclusiveSum((std::uint64_t(__popc(m[1].above)) << 48) | (std::uint64_t(__popc(m[1].tie)) << 32) |
                                (std::uint64_t(__popc(m[0].above)) << 16) | std::uint64_t(__popc(m[0].tie)),
                            rank, total);
  const std::uint64_t block_above = count16(total, 3) + count16(total, 1), block_ties = count16(total, 2) + count16(total, 0);
  if (threadIdx.x == 0) block_counts[blockIdx.x] = (block_above << 32) | block_ties;
  grid_sync();
  std::uint64_t mine = 0, unused = 0, before = 0;  // (above << 32) | ties of the blocks before this one: n < 2^32
  for (unsigned b = threadIdx.x; b < blockIdx.x; b += blockDim.x) mine += block_counts[b];
  __syncthreads();  // the scan's storage, reused
  scan_t(scan).ExclusiveSum(mine, unused, before);
  const std::uint64_t take = st.ties_to_take;
#pragma unroll
  for (unsigned j = 0; j < runs; ++j) {
    const std::uint64_t a0 = (before >> 32) + (j == 0 ? count16(rank, 1) : count16(total, 1) + count16(rank, 3));
    const std::uint64_t t0 = (before & 0xFFFFFFFFu) + (j == 0 ? count16(rank, 0) : count16(total, 0) + count16(rank, 2));
    emit_run(sink, v[j], m[j], a0, t0, take, [&](unsigned e) { return r[j].first + e; });
  }
}

/// Byte offsets of the device top-k's scratch, each part 256-byte aligned: the state, the bins
/// and the tile words (contiguous, so topk_init_kernel zeroes both; 1 count for the compaction,
/// 2 for the emit, 1 for the sampled compaction), the list's indices and values, then the
/// sample's keys. The one-launch select uses the same bytes otherwise: a row of bins per digit
/// from `hist`, then a word per block (`block_counts`).
template <class T>
struct cuda_topk_layout {
  std::uint64_t capacity;  // list entries
  std::size_t hist = 256, words, index, values, sample, block_counts, total;
  explicit cuda_topk_layout(std::uint64_t n)
      : capacity(cuda_topk_list_capacity(n)),
        words(hist + topk_digit_bins * sizeof(unsigned long long)),
        index(scratch_aligned(words + 4 * topk_tiles(n) * sizeof(std::uint64_t))),
        values(scratch_aligned(index + capacity * sizeof(std::uint64_t))),
        sample(scratch_aligned(values + capacity * sizeof(T))),
        block_counts(scratch_aligned(hist + std::size_t{topk_resident_levels<key_type_t<T>>} * topk_digit_bins *
                                                sizeof(unsigned))),
        total(std::max(scratch_aligned(sample + sample_slots(n) * sizeof(key_type_t<T>)),
                       scratch_aligned(block_counts + topk_resident_blocks_for(n) * sizeof(unsigned long long)))) {}
  /// The sample's keys, where a sample may be taken (topk_one_read_fits).
  static std::uint64_t sample_slots(std::uint64_t n) {
    return topk_sample_size(n) >= topk_sample_least ? topk_sample_slots : 0;
  }
};

/// cuda_topk's default `marks`: nothing between the launches.
struct no_phase_marks {
  void operator()(const char*) const {}
};

/// Blocks per SM of topk_resident_kernel<T, ..., Sink> (registers and shared memory as
/// compiled): asked once per device (devices 0-63) and kept, since it depends only on the
/// compiled kernel and the device (the select alone did not time faster with the cache on an
/// H100, so the query is off the GPU's critical path there; it is host time on every call).
/// The answer is kept under the current device, the one the query measures (and the launch
/// runs on), not under exec.device(): a call made while another device is current must not
/// leave that device's answer for the executor's.
template <class T, topk_counting Counting, class Sink>
int cuda_topk_resident_per_sm() {
  static std::atomic<int> known[64];  // blocks per SM + 1 once asked; 0 before
  int device = -1;
  GRADZIP_CUDA_TRY(cudaGetDevice(&device));
  int per_sm = device >= 0 && device < 64 ? known[device].load(std::memory_order_relaxed) - 1 : -1;
  if (per_sm < 0) {
    GRADZIP_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, topk_resident_kernel<T, key_type_t<T>, Counting, Sink>, topk_policy::threads, 0));
    if (device >= 0 && device < 64) known[device].store(per_sm + 1, std::memory_order_relaxed);
  }
  return per_sm;
}

/// The most blocks of topk_resident_kernel<T, ..., Sink> the device holds at once: its blocks per
/// SM times the SMs a cooperative launch may fill (`cuda::cooperative_sms`: 0 on a device
/// without cooperative launches, fewer after a decline), within a grid.
template <class T, topk_counting Counting, class Sink>
std::uint64_t cuda_topk_resident_blocks(const cuda& exec) {
  const std::uint64_t blocks = static_cast<std::uint64_t>(cuda_topk_resident_per_sm<T, Counting, Sink>()) *
                               static_cast<std::uint64_t>(exec.cooperative_sms());
  return std::min(blocks, static_cast<std::uint64_t>(exec.max_grid()));
}

/**
 * Selects the k largest-magnitude elements of device array x (ties to the lower index) and calls
 * sink(position, index, value) on the device for each, positions in ascending index order.
 * Stream-ordered on exec.stream(); no host synchronization. Up to `resident_up_to` elements
 * (when the grid fits the device at once) it is one cooperative launch, topk_resident_kernel.
 * `marks(name)` is called on the host after each kernel's launch ("resident"; or "init",
 * "histogram", "compact", "histogram", ..., "emit"; from the sample: "init", "sample",
 * "compact_sampled", "histogram", "compact", "histogram_sampled", ...): a benchmark records an
 * event there to time each kernel.
 */
template <topk_counting Counting = topk_default_counting, class T, class Sink, class Marks = no_phase_marks>
void cuda_topk(cuda& exec, span<const T> x, std::uint64_t k, const Sink& sink, Marks marks = {},
               std::uint64_t sample_from = cuda_topk_sample_from, std::uint64_t resident_up_to = cuda_topk_resident_max) {
  using Key = key_type_t<T>;
  const std::uint64_t n = x.size();
  const cudaStream_t stream = exec.stream();
  if (k == 0 || n == 0) {
    if constexpr (has_prologue<Sink>) launch(topk_prologue_kernel<Sink>, 1, 32, 0, stream, sink);
    return;
  }
  const cuda_topk_layout<T> l(n);
  std::byte* base = exec.scratch(l.total);
  const std::uint64_t resident = topk_resident_blocks_for(n);
  // One launch where the grid fits; if the device holds fewer blocks than the occupancy says (an
  // MPS client), the cooperative launch declines, the executor remembers it, and the launches
  // below run instead.
  if (n <= resident_up_to && resident <= cuda_topk_resident_blocks<T, Counting, Sink>(exec)) {
    const cudaError_t declined =
        launch_cooperative(topk_resident_kernel<T, Key, Counting, Sink>, resident, topk_policy::threads, 0, stream,
                           x.data(), n, k, reinterpret_cast<unsigned*>(base + l.hist),
                           reinterpret_cast<unsigned long long*>(base + l.block_counts), sink);
    if (declined == cudaSuccess) {
      marks("resident");
      return;
    }
    exec.cooperative_declined(resident, cuda_topk_resident_per_sm<T, Counting, Sink>(), declined);
  }
  auto* state = reinterpret_cast<cuda_topk_state<Key>*>(base);
  auto* hist = reinterpret_cast<unsigned long long*>(base + l.hist);
  auto* words = reinterpret_cast<std::uint64_t*>(base + l.words);
  const topk_list<T> list{reinterpret_cast<std::uint64_t*>(base + l.index), reinterpret_cast<T*>(base + l.values),
                          l.capacity};
  const unsigned grid = grid_for_policy<topk_policy>(exec, n);
  const auto threads = topk_policy::threads;
  radix_digit digits[8];
  const int levels = cuda_topk_digits(magnitude_key_bits<Key>, digits);
  // The sampled select, where it may pay and its expected list leaves room (as the host's
  // one read); whether it held is known on the device only, so the radix passes over x are
  // launched after it either way and return at once when it did.
  const std::uint64_t m = topk_sample_size(n), rank = topk_sample_rank(n, k, m);
  const bool sampled = n >= sample_from && topk_one_read_fits(n, m, rank, l.capacity);
  auto* sample_keys = reinterpret_cast<Key*>(base + l.sample);
  const std::uint64_t zeros = (l.index - l.hist) / sizeof(std::uint64_t);  // the bins and the tile words
  const std::uint64_t init_work = std::max(zeros, sampled ? topk_sample_slots : 0);
  const topk_sample_gather<T, Key> gather{x.data(), n, sampled ? m : 0, sample_keys};
  launch(topk_init_kernel<T, Key>, std::min<std::uint64_t>(grid, (init_work + threads - 1) / threads), threads, 0,
         stream, state, k, reinterpret_cast<std::uint64_t*>(hist), zeros, gather);
  marks("init");
  const auto histogram = [&](radix_digit d, topk_pass pass) {
    launch(topk_histogram_kernel<T, Key, Counting>, grid, threads, 0, stream, x.data(), n, list, state, d, hist, pass);
    marks(pass == topk_pass::sampled ? "histogram_sampled" : "histogram");
  };
  if (sampled) {
    launch(topk_sample_kernel<Key>, 1, cuda_topk_select_threads, 0, stream, sample_keys, rank, state);
    marks("sample");
    launch(topk_compact_kernel<T, Key, Counting, true>, grid, threads, 0, stream, x.data(), n, list, state, digits[0],
           hist, words + 3 * topk_tiles(n));
    marks("compact_sampled");
  }
  // Each counting pass ends with its last block's select (select_if_last): no launch between.
  histogram(digits[0], sampled ? topk_pass::radix : topk_pass::both);
  launch(topk_compact_kernel<T, Key, Counting>, grid, threads, 0, stream, x.data(), n, list, state, digits[1], hist,
         words);
  marks("compact");
  if (sampled) histogram(digits[1], topk_pass::sampled);
  for (int level = 2; level < levels; ++level) histogram(digits[level], topk_pass::both);
  launch(topk_emit_kernel<T, Key, Sink>, grid, threads, 0, stream, x.data(), n, list, state,
         words + topk_tiles(n), sink);
  marks("emit");
}

/// The dense emit's launch: a run of 8 consecutive elements per thread and step (`load_run`).
using dense_emit_policy = launch_policy<256, 8, 8>;

/// A dense run through the sink, one call (one store) per element.
template <class Sink, class T>
__device__ inline void emit_each(const Sink& sink, const run_of_8& r, const T (&v)[8]) {
#pragma unroll
  for (unsigned k = 0; k < 8; ++k) {
    if (k < r.valid) sink(r.first + k, r.first + k, v[k]);
  }
}

/// The cast a values stage is, or derives from (as on the host, detail/host/structure.hpp); 0
/// when it is no cast.
template <class Values>
inline constexpr int cast_format_of =
    std::is_base_of_v<quantize::cast_fp16, Values>       ? static_cast<int>(quantize::cast_format::f16)
    : std::is_base_of_v<quantize::cast_bf16, Values>     ? static_cast<int>(quantize::cast_format::bf16)
    : std::is_base_of_v<quantize::cast_fp8_e4m3, Values> ? static_cast<int>(quantize::cast_format::fp8_e4m3)
    : std::is_base_of_v<quantize::cast_fp8_e5m2, Values> ? static_cast<int>(quantize::cast_format::fp8_e5m2)
                                                         : 0;

/// A run's codes, packed: one store per 16 bytes (`store_run`) for fp16 and bf16, one 8-byte
/// store for fp8, where the run is whole and aligned.
template <class Stage, class T>
__device__ inline void store_codes(std::uint8_t* section, const run_of_8& r, const T (&v)[8]) {
  using code_type = typename Stage::code_type;
  code_type codes[8] = {};
#pragma unroll
  for (unsigned k = 0; k < 8; ++k) {
    if (k < r.valid) codes[k] = Stage::code(v[k]);
  }
  if constexpr (sizeof(code_type) == 2) {
    store_run(reinterpret_cast<code_type*>(section), r.first, r.valid, codes);
  } else {
    std::uint8_t* p = section + r.first;
    if (r.valid == 8 && reinterpret_cast<std::uintptr_t>(p) % 8 == 0) {
      std::uint64_t word = 0;
#pragma unroll
      for (unsigned k = 0; k < 8; ++k) word |= static_cast<std::uint64_t>(codes[k]) << (8 * k);
      *reinterpret_cast<std::uint64_t*>(p) = word;
    } else {
#pragma unroll
      for (unsigned k = 0; k < 8; ++k) {
        if (k < r.valid) p[k] = codes[k];
      }
    }
  }
}

/// A dense run into a payload's values section. Casts (and stages derived from them, as the
/// host's fast path takes them) and raw values write the run packed; one store per element
/// made fp16 compress 3x slower than torch's `.half()` on an H100 (docs/performance.md: each
/// warp store wrote 2 bytes at a 16-byte stride). Other stages store each value.
template <class Sink, class T>
__device__ inline void emit_run(const Sink& sink, const run_of_8& r, const T (&v)[8]) {
  emit_each(sink, r, v);
}

template <class T, class Values>
__device__ inline void emit_run(const payload_sink<T, Values, encode::none>& sink, const run_of_8& r,
                                const T (&v)[8]) {
  constexpr int format = cast_format_of<Values>;
  if constexpr (format != 0) {
    store_codes<quantize::cast<static_cast<quantize::cast_format>(format)>>(sink.values, r, v);
  } else if constexpr (std::is_same_v<Values, quantize::none>) {  // a derived stage may store otherwise
    store_run(reinterpret_cast<T*>(sink.values), r.first, r.valid, v);
  } else {
    emit_each(sink, r, v);
  }
}

template <class T, class Sink>
__global__ __launch_bounds__(dense_emit_policy::threads)
void dense_emit_kernel(const T* x, std::uint64_t n, Sink sink) {
  static_assert(dense_emit_policy::items_per_thread == 8, "dense_emit_kernel: runs of 8 (load_run)");
  const std::uint64_t runs = (n + 7) / 8, stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t run = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; run < runs;
       run += stride) {
    const run_of_8 r = run_at(run, n);
    T v[8] = {};  // load_run leaves v[valid..8) alone; they are not read
    load_run(x, r.first, r.valid, v);
    emit_run(sink, r, v);
  }
}

template <>
struct structure_backend<cuda, sparsify::none> {
  template <class T>
  static std::size_t workspace_bytes(cuda&, std::size_t) { return 0; }
  template <class T, class Sink>
  static void select(cuda& exec, const sparsify::none&, span<const T> x, std::uint64_t,
                     const Sink& sink) {
    if (x.empty()) return;
    launch_over<dense_emit_policy>(exec, x.size(), dense_emit_kernel<T, Sink>, x.data(), x.size(),
                                   sink);
  }
};

template <class Structure, class T, class Sink>
__global__ __launch_bounds__(implicit_emit_policy::threads)
void implicit_emit_kernel(frame_params sp, const T* x, std::uint64_t n, std::uint64_t k,
                          Sink sink) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t j = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < k;
       j += stride) {
    const std::uint64_t i = Structure::index_of(sp.structure, n, k, j);
    sink(j, i, x[i]);
  }
}

/// Implicit-index structures (random-k): one thread per selected element, no scratch.
template <>
struct implicit_backend<cuda> {
  template <class Structure, class T, class Sink>
  static void select(cuda& exec, const frame_params& sp, span<const T> x, std::uint64_t k,
                     const Sink& sink) {
    if (k == 0) return;
    launch_over<implicit_emit_policy>(exec, k, implicit_emit_kernel<Structure, T, Sink>, sp,
                                      x.data(), x.size(), k, sink);
  }
};

template <>
struct structure_backend<cuda, sparsify::topk> {
  /// cuda_topk runs a sink's prologue (the payload's frame) in its first kernel that takes the
  /// sink: codec compress then launches no frame kernel (one launch of 2 at 2^20).
  static constexpr bool writes_frame = true;
  template <class T>
  static std::size_t workspace_bytes(cuda&, std::size_t n) {
    return cuda_topk_layout<T>(n).total;
  }
  template <class T, class Sink>
  static void select(cuda& exec, const sparsify::topk&, span<const T> x, std::uint64_t k,
                     const Sink& sink) {
    cuda_topk(exec, x, k, sink);
  }
};

}  // namespace gradzip::detail
