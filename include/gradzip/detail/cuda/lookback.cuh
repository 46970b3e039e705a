// Single-pass tile prefixes: decoupled look-back (Merrill & Garland, "Single-pass Parallel Prefix
// Scan with Decoupled Look-back", NVIDIA 2016) over dynamic tile ids.
//
// A kernel that compacts in index order needs, for each tile, the count of kept elements in all
// earlier tiles. With look-back it reads its input once: a tile publishes its own count (an
// aggregate) as soon as it has it, then walks back over earlier tiles' words, summing aggregates
// until it meets an inclusive prefix, and publishes its own inclusive prefix.
//
// Tiles are numbered by a ticket counter (`claim_tile`), not by blockIdx: a block waits only on
// tiles claimed before its own, whose blocks are already running, so it never waits on a block
// the GPU has not scheduled. The same rule makes the wait free on an executor that runs one block
// at a time in any order (the SIMT backend): every earlier ticket has then been completed.
#pragma once

#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "gradzip/core/config.hpp"

namespace gradzip::detail {

/// A tile's status word: 2 flag bits over a 62-bit count. Zero (no flag) means not yet published.
struct tile_status {
  static constexpr std::uint64_t aggregate = 1ull << 62;  ///< the tile's own count
  static constexpr std::uint64_t inclusive = 2ull << 62;  ///< the count of this tile and every earlier one
  static constexpr std::uint64_t value_mask = (1ull << 62) - 1;
};

/// Thread 0 of the block: the next tile id (one atomic on the counter), for the whole block.
__device__ inline std::uint64_t claim_tile(unsigned long long* ticket, std::uint64_t* shared_id) {
  if (threadIdx.x == 0) *shared_id = atomicAdd(ticket, 1ull);
  __syncthreads();
  const std::uint64_t id = *shared_id;
  __syncthreads();  // every thread has read it before thread 0 may claim the next
  return id;
}

/// Publishes `word` (a flag and a count) for the tiles that will read it.
__device__ inline void publish_status(std::uint64_t* status, std::uint64_t word) {
  atomicExch(reinterpret_cast<unsigned long long*>(status), static_cast<unsigned long long>(word));
}

/// The status word as it is now, read past the caches of this SM (other blocks write it).
__device__ inline std::uint64_t observe_status(const std::uint64_t* status) {
  return *static_cast<const volatile std::uint64_t*>(status);
}

/// The sum of a 64-bit value over the warp, in every lane.
__device__ inline std::uint64_t warp_sum(std::uint64_t v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  return v;
}

/**
 * One whole warp (all 32 lanes). Publishes `aggregate` as tile `tile`'s count in words[tile],
 * waits for and sums the earlier tiles' words back to the nearest inclusive prefix, publishes
 * this tile's inclusive prefix, and returns the exclusive one (the count in all earlier tiles) in
 * every lane. words[0 .. tiles) are zeroed before the launch. A kernel with two counts gives each
 * its own words, so one count's look-back never reads the other's.
 *
 * The walk reads 32 earlier words per step, lane i the (i + 1)-th nearest, as CUB's
 * TilePrefixCallbackOp does. One lane reading one word per step walked, on an H200, far enough
 * back that a compaction tile took 12 ns of the whole GPU whatever n was (1.6 ms at 2^28 where
 * the histogram over the same x took 0.32): each step is a round trip to L2.
 */
__device__ inline std::uint64_t tile_lookback(std::uint64_t* words, std::uint64_t tile, std::uint64_t aggregate) {
  const unsigned lane = threadIdx.x % 32;
  if (tile == 0) {
    if (lane == 0) publish_status(words, tile_status::inclusive | aggregate);
    return 0;
  }
  if (lane == 0) publish_status(words + tile, tile_status::aggregate | aggregate);
  std::uint64_t sum = 0;
  for (std::uint64_t end = tile;; end -= 32) {  // this step reads tiles end - 1 - lane
    // Lanes before tile 0 read an inclusive 0: tile 0's word is inclusive, so the walk stops there.
    const bool before_zero = end < lane + 1;
    std::uint64_t w = before_zero ? tile_status::inclusive : 0;
    while (!__all_sync(0xFFFFFFFFu, w != 0)) {
      if (w == 0) w = observe_status(words + (end - 1 - lane));
    }
    const unsigned inclusive = __ballot_sync(0xFFFFFFFFu, (w & ~tile_status::value_mask) == tile_status::inclusive);
    const unsigned nearest = inclusive == 0 ? 31 : static_cast<unsigned>(__ffs(static_cast<int>(inclusive)) - 1);
    sum += warp_sum(lane <= nearest ? w & tile_status::value_mask : 0);
    if (inclusive != 0) break;
  }
  if (lane == 0) publish_status(words + tile, tile_status::inclusive | (sum + aggregate));
  return sum;
}

/// Where a compaction tile's kept elements go (`rank_tile`): `first(j)` is the position of the
/// calling thread's first kept element of its run j, in index order over all tiles.
struct tile_ranks {
  std::uint64_t base;  // the count kept in all earlier tiles
  std::uint64_t rank;  // the thread's exclusive (run 1 << 32 | run 0) pair in the tile
  std::uint64_t half;  // the count kept in the tile's first half

  __device__ std::uint64_t first(unsigned j) const { return base + (j == 0 ? rank & 0xFFFFFFFFu : half + (rank >> 32)); }
};

/**
 * Ranks a compaction tile of up to two runs of 8 per thread, thread t's runs being the tile's
 * runs t (first half) and Threads + t (second half): `kept[j]` marks the kept elements of run j,
 * so a half keeps at most 8 Threads (far below the 2^32 its half of the pair holds). One block
 * scan of the pairs (run 1's count << 32 | run 0's) ranks both halves in index order, and warp
 * 0's look-back (`tile_lookback`) publishes the tile's count in `status` and returns the count
 * kept in all earlier tiles, which thread 0 passes through `base` (shared). On the last tile
 * (`tiles - 1`), thread 0 calls `on_last(count)` with the count kept in every tile.
 *
 * Every thread of the block calls it, with blockDim.x == Threads (at least 32), `tile` from
 * `claim_tile` and status[0 .. tiles) zeroed before the launch. It ends with a barrier, after
 * which the returned ranks hold; the caller needs another before it reuses `scan` or `base`.
 */
template <unsigned Threads, class OnLast>
__device__ inline tile_ranks rank_tile(typename cub::BlockScan<std::uint64_t, Threads>::TempStorage& scan,
                                       std::uint64_t& base, std::uint64_t* status, std::uint64_t tile,
                                       std::uint64_t tiles, const unsigned (&kept)[2], OnLast on_last) {
  std::uint64_t rank = 0, total = 0;
  cub::BlockScan<std::uint64_t, Threads>(scan).ExclusiveSum(
      (std::uint64_t(__popc(kept[1])) << 32) | std::uint64_t(__popc(kept[0])), rank, total);
  const std::uint64_t half = total & 0xFFFFFFFFu, all = half + (total >> 32);
  if (threadIdx.x < 32) {  // warp 0 walks back
    const std::uint64_t before = tile_lookback(status, tile, all);
    if (threadIdx.x == 0) {
      base = before;
      if (tile == tiles - 1) on_last(before + all);
    }
  }
  __syncthreads();
  return {base, rank, half};
}

}  // namespace gradzip::detail
