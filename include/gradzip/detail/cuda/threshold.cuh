// structure_backend<cuda, sparsify::threshold>: known-threshold selection with compaction.
//
// Tiles of 4,096 elements: one kernel counts each tile's passing elements, a device scan turns
// the counts into tile offsets (and the total), and the emit kernel writes each tile's elements
// in index order, so the bytes equal the host's. A tile is two rounds of 2,048: thread t takes
// the run of 8 consecutive elements at 8t of each round (load_run: 16-byte loads), and one
// block-wide exclusive scan of the threads' counts per round gives each thread where its kept
// elements go. The codec learns the count with one copy to the host: the payload's size depends
// on it. Each thread block takes tiles in turn (blockIdx.x, + gridDim.x, ...), so a tensor of
// any size fits one grid.
#pragma once

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include "gradzip/detail/cuda/vector_load.cuh"

namespace gradzip::detail {

/// The count and emit kernels' launch: 256 threads, a run of 8 per thread and round, 2 rounds
/// per tile of 4,096 (both loads of a thread's tile in flight in the count), <= 8 blocks per SM.
using threshold_policy = launch_policy<256, 8, 8>;

struct threshold_tiles {
  static constexpr unsigned threads = threshold_policy::threads;
  static constexpr unsigned run = threshold_policy::items_per_thread;
  static constexpr std::uint64_t round = static_cast<std::uint64_t>(threads) * run;
  static constexpr unsigned rounds = 2;
  static constexpr std::uint64_t tile = round * rounds;
  static_assert(run == 8, "threshold tiles: runs of 8 (load_run)");
  static std::uint64_t count(std::uint64_t n) { return n == 0 ? 1 : (n + tile - 1) / tile; }
  /// Thread t's run in round r of the tile at `base`.
  __device__ static run_of_8 run_of(std::uint64_t base, unsigned r, unsigned t, std::uint64_t n) {
    const std::uint64_t first = base + r * round + static_cast<std::uint64_t>(t) * run;
    return {first, run_length(first, n)};
  }
};

/// Whether element i (value v) passes `t`: a threshold on the value, unless Tau decides per index
/// (hashed top-k's slot winners overload this).
template <class V, class Tau>
__device__ inline bool passes_at(V v, std::uint64_t, Tau t) {
  return sparsify::detail::passes(v, t);
}

/// The operand a kernel compares against, read once per thread (sparsify::detail::threshold_operand).
template <class Tau>
__device__ inline auto operand_of(Tau t) {
  using sparsify::detail::threshold_operand;
  return threshold_operand(t);
}

/// What the count and emit kernels read: `values` [0, n), element e being element index_of(e) of
/// the tensor. x itself has no index array; sampled top-k's candidate list (index order) has one.
template <class T>
struct threshold_view {
  const T* values;
  const std::uint64_t* index;
  std::uint64_t n;
  __device__ std::uint64_t index_of(std::uint64_t e) const { return index == nullptr ? e : index[e]; }
};

/// x as a source: its view, with no index array (so index_of folds to e).
template <class T>
struct dense_source {
  const T* x;
  std::uint64_t n;
  __device__ threshold_view<T> view() const { return {x, nullptr, n}; }
};

/// Bit k of the result: whether element first + k of the run (values v) passes `t` (an operand).
template <class T, class Operand>
__device__ inline unsigned passing_bits(const threshold_view<T>& src, const T (&v)[8], run_of_8 r, Operand t) {
  unsigned bits = 0;
#pragma unroll
  for (unsigned k = 0; k < 8; ++k) {
    if (k < r.valid && passes_at(to_float(v[k]), src.index_of(r.first + k), t)) bits |= 1u << k;
  }
  return bits;
}

/// Tile counts over a source's view. `tiles` covers the largest view the source can give (x's);
/// tiles past the view's end count 0 without a load.
template <class T, class Tau, class Source>
__global__ __launch_bounds__(threshold_tiles::threads)
void threshold_count_kernel(Source source, Tau t, std::uint64_t tiles, std::uint64_t* tile_counts) {
  using reduce = cub::BlockReduce<unsigned, threshold_tiles::threads>;
  __shared__ typename reduce::TempStorage storage;
  const auto operand = operand_of(t);
  const threshold_view<T> src = source.view();
  for (std::uint64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const std::uint64_t base = tile * threshold_tiles::tile;
    if (base >= src.n) {  // the whole block alike
      if (threadIdx.x == 0) tile_counts[tile] = 0;
      continue;
    }
    T v[threshold_tiles::rounds][8] = {};
    run_of_8 runs[threshold_tiles::rounds];
#pragma unroll
    for (unsigned r = 0; r < threshold_tiles::rounds; ++r) {  // every load first: all in flight
      runs[r] = threshold_tiles::run_of(base, r, threadIdx.x, src.n);
      load_run(src.values, runs[r].first, runs[r].valid, v[r]);
    }
    unsigned kept = 0;
#pragma unroll
    for (unsigned r = 0; r < threshold_tiles::rounds; ++r) kept += __popc(passing_bits(src, v[r], runs[r], operand));
    const unsigned total = reduce(storage).Sum(kept);
    if (threadIdx.x == 0) tile_counts[tile] = total;
    __syncthreads();  // the reduction's storage is reused for the next tile
  }
}

/// total = offset + count of the last tile.
template <class = void>
__global__ __launch_bounds__(1)
void threshold_total_kernel(const std::uint64_t* offsets, const std::uint64_t* counts,
                            std::uint64_t tiles, std::uint64_t* total) {
  *total = offsets[tiles - 1] + counts[tiles - 1];
}

template <class T, class Tau, class Source, class Sink>
__global__ __launch_bounds__(threshold_tiles::threads)
void threshold_emit_kernel(Source source, Tau t, std::uint64_t tiles, const std::uint64_t* tile_offsets, Sink sink) {
  using scan = cub::BlockScan<unsigned, threshold_tiles::threads>;
  __shared__ typename scan::TempStorage storage;
  const auto operand = operand_of(t);  // once: the sink's stores could alias a threshold in memory
  const threshold_view<T> src = source.view();
  for (std::uint64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const std::uint64_t base = tile * threshold_tiles::tile;
    if (base >= src.n) continue;  // the whole block alike: nothing to emit
    std::uint64_t pos = tile_offsets[tile];
    for (unsigned r = 0; r < threshold_tiles::rounds; ++r) {
      const run_of_8 run = threshold_tiles::run_of(base, r, threadIdx.x, src.n);
      T v[8] = {};
      load_run(src.values, run.first, run.valid, v);
      const unsigned bits = passing_bits(src, v, run, operand);
      unsigned rank = 0, round_total = 0;
      scan(storage).ExclusiveSum(static_cast<unsigned>(__popc(bits)), rank, round_total);
      std::uint64_t at = pos + rank;  // threads' runs are in index order, so are their ranks
#pragma unroll
      for (unsigned k = 0; k < 8; ++k) {
        if ((bits >> k) & 1u) sink(at++, src.index_of(run.first + k), v[k]);
      }
      pos += round_total;
      __syncthreads();  // the scan's storage is reused next round
    }
  }
}

template <>
struct structure_backend<cuda, sparsify::threshold> {
  /// Scratch: tile counts, tile offsets, the total, then CUB's scan storage.
  template <class T>
  static std::size_t workspace_bytes(cuda& exec, std::size_t n) {
    const std::uint64_t tiles = threshold_tiles::count(n);
    return (2 * tiles + 1) * sizeof(std::uint64_t) + 256 + exclusive_sum_bytes(exec, tiles);
  }

  template <class T>
  static std::uint64_t count(cuda& exec, const sparsify::threshold& s, span<const T> x) {
    return copy_count(exec, count_on_device(exec, s, x));
  }

  /// The count left in device memory (codec::compress_async's path: no host synchronization).
  template <class T>
  static const std::uint64_t* count_on_device(cuda& exec, const sparsify::threshold& s, span<const T> x) {
    const std::uint64_t* k = nullptr;
    s.template visit_tau<T>([&](auto t) { k = count_on_device_with(exec, x, t); });
    return k;
  }

  template <class T, class Sink>
  static void select(cuda& exec, const sparsify::threshold& s, span<const T> x, std::uint64_t k,
                     const Sink& sink) {
    s.template visit_tau<T>([&](auto t) { select_with(exec, x, t, k, sink); });
  }

  /// The count pass for any threshold `t` that sparsify::detail::passes accepts (a value, or a
  /// threshold in device memory), its total left in scratch (device memory).
  template <class T, class Tau>
  static const std::uint64_t* count_on_device_with(cuda& exec, span<const T> x, Tau t) {
    return count_on_device_from<T>(exec, x.size(), dense_source<T>{x.data(), x.size()}, t);
  }

  /// count_on_device_with over any source whose view holds at most n elements (x's size: the
  /// tiles and their scratch are n's).
  template <class T, class Source, class Tau>
  static const std::uint64_t* count_on_device_from(cuda& exec, std::size_t n, Source source, Tau t) {
    const count_scratch c = count_scratch_of<T>(exec, n);
    launch(threshold_count_kernel<T, Tau, Source>, grid_for_units(exec, c.tiles, threshold_policy::blocks_per_sm),
           threshold_tiles::threads, 0, exec.stream(), source, t, c.tiles, c.counts);
    void* temp = reinterpret_cast<std::byte*>(c.total) + 256;
    std::size_t temp_bytes = exclusive_sum_bytes(exec, c.tiles);
    GRADZIP_CUDA_TRY(cub::DeviceScan::ExclusiveSum(temp, temp_bytes, c.counts, c.offsets, c.tiles, exec.stream()));
    launch(threshold_total_kernel<>, 1, 1, 0, exec.stream(), c.offsets, c.counts, c.tiles, c.total);
    return c.total;
  }

  /// A count of zero in the same place, for stages that select nothing without a pass.
  template <class T>
  static const std::uint64_t* zero_count(cuda& exec, std::size_t n) {
    std::uint64_t* total = count_scratch_of<T>(exec, n).total;
    GRADZIP_CUDA_TRY(cudaMemsetAsync(total, 0, sizeof(std::uint64_t), exec.stream()));
    return total;
  }

  /// Copies a device count to the host: the one synchronization of a data-dependent compress.
  static std::uint64_t copy_count(cuda& exec, const std::uint64_t* count) {
    std::uint64_t k = 0;
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(&k, count, sizeof k, cudaMemcpyDeviceToHost, exec.stream()));
    exec.synchronize();  // the payload's layout depends on k
    return k;
  }

  /// The emit pass after count_on_device_with(t), with the same t.
  template <class T, class Tau, class Sink>
  static void select_with(cuda& exec, span<const T> x, Tau t, std::uint64_t k, const Sink& sink) {
    select_from<T>(exec, x.size(), dense_source<T>{x.data(), x.size()}, t, k, sink);
  }

  /// The emit pass after count_on_device_from(n, source, t), with the same arguments.
  template <class T, class Source, class Tau, class Sink>
  static void select_from(cuda& exec, std::size_t n, Source source, Tau t, std::uint64_t, const Sink& sink) {
    if (n == 0) return;
    const count_scratch c = count_scratch_of<T>(exec, n);
    launch(threshold_emit_kernel<T, Tau, Source, Sink>, grid_for_units(exec, c.tiles, threshold_policy::blocks_per_sm),
           threshold_tiles::threads, 0, exec.stream(), source, t, c.tiles, c.offsets, sink);
  }

 private:
  /// The count pass's scratch, in order: per-tile counts, their exclusive sums (the emit's
  /// offsets), the total, then CUB's scan storage 256 bytes on.
  struct count_scratch {
    std::uint64_t tiles;
    std::uint64_t *counts, *offsets, *total;
  };
  template <class T>
  static count_scratch count_scratch_of(cuda& exec, std::size_t n) {
    const std::uint64_t tiles = threshold_tiles::count(n);
    auto* counts = reinterpret_cast<std::uint64_t*>(exec.scratch(workspace_bytes<T>(exec, n)));
    return {tiles, counts, counts + tiles, counts + 2 * tiles};
  }
};

}  // namespace gradzip::detail
