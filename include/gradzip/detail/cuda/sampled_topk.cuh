// structure_backend<cuda, sparsify::sampled_topk>: DGC's threshold search without host round
// trips. The sample is gathered and sorted on the device (CUB radix sort), one thread picks the
// bracket, and each refinement round is a histogram kernel (shared-memory bins, integer atomics:
// the counts do not depend on the order) and a one-thread decide kernel; rounds after the search
// is done return at once. The threshold stays in device memory for the threshold stage's count
// and emit kernels; the only copy to the host is the final count, which sizes the payload.
//
// One read of x where the candidates fit (as the host's, detail/host/sampled_topk.hpp): the first
// round, which bins every key at or above the bracket's low end (the floor), also compacts those
// elements in index order into a list of n / 8 (decoupled look-back, lookback.cuh). Later rounds
// whose bracket stays at or above the floor, and the count and the emit at a threshold at or above
// it, read the list; they read x when it overflowed or the search left the floor. The device
// decides (`list_holds`, `listed_source`), so `compress_async` still never waits.
#pragma once

#include <cub/device/device_radix_sort.cuh>

#include "gradzip/detail/cuda/lookback.cuh"
#include "gradzip/detail/cuda/threshold.cuh"
#include "gradzip/detail/topk_select.hpp"
#include "gradzip/sparsify/sampled_topk.hpp"

namespace gradzip::detail {

/// The strided sample of sampled and hashed top-k, and the search's one-block verdict.
using sample_policy = launch_policy<256, 1, 8>;

using sampled_search = sparsify::detail::threshold_search;

template <class T>
__global__ __launch_bounds__(sample_policy::threads)
void sample_keys_kernel(const T* x, std::uint64_t n, std::uint64_t s, std::uint64_t seed,
                        std::uint32_t* keys) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t j = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < s; j += stride) {
    const std::uint64_t i = sparsify::sampled_topk::sample_position(seed, n, s, j);
    keys[j] = sparsify::detail::magnitude_key(static_cast<float>(to_float(x[i])));
  }
}

template <class = void>
__global__ __launch_bounds__(1)
void search_start_kernel(const std::uint32_t* sorted, std::uint64_t s, std::uint64_t k,
                         std::uint64_t n, sampled_search* state) {
  std::uint64_t high_rank = 1, low_rank = 1;
  sampled_search::bracket_ranks(k, n, s, high_rank, low_rank);
  sampled_search st;
  st.start(sorted[high_rank - 1], sorted[low_rank - 1], k, n);
  *state = st;
}

/// The refinement rounds' launch: a run of 8 consecutive elements per thread and step
/// (`load_floats`: 16-byte loads), <= 8 blocks per SM.
using search_policy = launch_policy<256, 8, 8>;

/// The candidate list: the elements whose keys are at least the first round's floor, in index
/// order, while they fit in `capacity`.
template <class T>
struct dgc_list {
  std::uint64_t* index;
  T* values;
  std::uint64_t capacity;
};

/// What the first round leaves for the later passes: how many keys reached the floor (all ones
/// until the round's last tile writes it, so a search that never gathered reads x; more than the
/// capacity: the list overflowed) and the floor itself.
struct dgc_list_control {
  std::uint64_t gathered;
  std::uint32_t floor;
};

/// Whether the list holds every key at or above `low`.
__device__ inline bool list_holds(const dgc_list_control& c, std::uint64_t capacity, std::uint32_t low) {
  return c.gathered <= capacity && low >= c.floor;
}

/// The first round's gather: 256 threads, runs of 8, 4 blocks per SM, so that ptxas has 64
/// registers (it takes 48-64: 2 runs, the keys' bins and the scan) and the grid is what stays
/// resident (a block past that finds no tile left by the time it starts).
using gather_policy = launch_policy<256, 8, 4>;

/// A gather tile: two runs of 8 per thread (4,096 elements) for 2- and 4-byte elements, both
/// loaded before the block waits on its look-back; one for doubles (as topk_compact_kernel).
template <class T>
inline constexpr unsigned gather_runs = sizeof(T) <= 4 ? 2 : 1;
template <class T>
GRADZIP_HOST_DEVICE inline std::uint64_t gather_tiles(std::uint64_t n) {
  constexpr std::uint64_t tile = gather_runs<T> * gather_policy::threads * gather_policy::items_per_thread;
  return n == 0 ? 1 : (n + tile - 1) / tile;
}

/**
 * The first round with a list: bins the keys in [lo, hi] (and above hi) as search_histogram_kernel
 * does, and writes every element whose key is at least lo (the floor) to the list at its rank in
 * index order, while it fits. Tiles come by ticket (`ticket`, then `status`, zeroed before the
 * launch); the last tile writes the list's count and the floor. With two runs per tile, thread t's
 * runs are runs (2 tile + j) threads + t: one scan of (run 1's count << 32 | run 0's) ranks both.
 */
template <class T>
__global__ __launch_bounds__(gather_policy::threads, gather_policy::blocks_per_sm)
void search_gather_kernel(const T* x, std::uint64_t n, const sampled_search* state, unsigned long long* hist,
                          dgc_list<T> list, dgc_list_control* control, unsigned long long* ticket,
                          std::uint64_t* status) {
  constexpr unsigned runs = gather_runs<T>;
  using scan_t = cub::BlockScan<std::uint64_t, gather_policy::threads>;
  __shared__ unsigned local[sampled_search::bins + 1];
  __shared__ typename scan_t::TempStorage scan_storage;
  __shared__ std::uint64_t tile_id, tile_base;
  const sampled_search st = *state;
  if (st.done) return;  // the whole grid alike; the count stays all ones: the later passes read x
  for (unsigned b = threadIdx.x; b <= sampled_search::bins; b += blockDim.x) local[b] = 0;
  const std::uint64_t tiles = gather_tiles<T>(n);
  for (;;) {
    const std::uint64_t tile = claim_tile(ticket, &tile_id);  // its barrier also orders the zeroing
    if (tile >= tiles) break;
    run_of_8 r[runs];
    T v[runs][8] = {};
    load_tile_runs<gather_policy::threads>(x, n, tile, r, v);
    unsigned kept[2] = {};
#pragma unroll
    for (unsigned j = 0; j < runs; ++j) {
#pragma unroll
      for (unsigned k = 0; k < 8; ++k) {
        // bin_of is -1 exactly below lo: every binned key is a candidate
        const int b = k < r[j].valid ? st.bin_of(sparsify::detail::magnitude_key(static_cast<float>(to_float(v[j][k])))) : -1;
        if (b >= 0) {
          atomicAdd(&local[b], 1u);
          kept[j] |= 1u << k;
        }
      }
    }
    const tile_ranks ranks = rank_tile<gather_policy::threads>(
        scan_storage, tile_base, status, tile, tiles, kept,
        [&](std::uint64_t count) { *control = dgc_list_control{count, st.lo}; });
#pragma unroll
    for (unsigned j = 0; j < runs; ++j) {
      std::uint64_t at = ranks.first(j);
#pragma unroll
      for (unsigned k = 0; k < 8; ++k) {
        if ((kept[j] >> k) & 1u) {
          if (at < list.capacity) {
            list.index[at] = r[j].first + k;
            list.values[at] = v[j][k];
          }
          ++at;
        }
      }
    }
    __syncthreads();  // the scan's storage and the base are reused for the next tile
  }
  __syncthreads();
  for (unsigned b = threadIdx.x; b <= sampled_search::bins; b += blockDim.x) {
    if (local[b] != 0) atomicAdd(&hist[b], static_cast<unsigned long long>(local[b]));
  }
}

/// A round's histogram, from the list where it holds the bracket's keys (list_holds), else from x.
template <class T>
__global__ __launch_bounds__(search_policy::threads)
void search_histogram_kernel(const T* x, std::uint64_t n, const sampled_search* state, unsigned long long* hist,
                             dgc_list<T> list, const dgc_list_control* control) {
  __shared__ unsigned local[sampled_search::bins + 1];
  const sampled_search st = *state;
  if (st.done) return;  // the whole grid alike
  const dgc_list_control c = *control;
  const bool listed = list_holds(c, list.capacity, st.lo);
  const T* source = listed ? list.values : x;
  assume_global(source);
  const std::uint64_t size = listed ? c.gathered : n;
  const std::uint64_t runs = (size + 7) / 8, stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  if (static_cast<std::uint64_t>(blockIdx.x) * blockDim.x >= runs) return;  // a short list: no run here
  for (unsigned b = threadIdx.x; b <= sampled_search::bins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  for (std::uint64_t run = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; run < runs;
       run += stride) {
    const run_of_8 r = run_at(run, size);
    float v[8];
    load_floats(source, r.first, r.valid, v);
#pragma unroll
    for (unsigned k = 0; k < 8; ++k) {
      const int b = k < r.valid ? st.bin_of(sparsify::detail::magnitude_key(v[k])) : -1;
      if (b >= 0) atomicAdd(&local[b], 1u);
    }
  }
  __syncthreads();
  for (unsigned b = threadIdx.x; b <= sampled_search::bins; b += blockDim.x) {
    if (local[b] != 0) atomicAdd(&hist[b], static_cast<unsigned long long>(local[b]));
  }
}

/// The count's and the emit's source: the list where it holds every key at or above the
/// threshold, else x (decided by each block from device memory).
template <class T>
struct listed_source {
  const T* x;
  std::uint64_t n;
  dgc_list<T> list;
  const dgc_list_control* control;
  const sampled_search* state;
  __device__ threshold_view<T> view() const {
    const dgc_list_control c = *control;
    // A subnormal threshold is left to x: where the kernel flushes subnormals (-ftz), its compare
    // keeps subnormal values below the floor, which the list lacks.
    const std::uint32_t tau_key = state->tau_key;
    const bool listed = tau_key >= sparsify::detail::smallest_normal_key && list_holds(c, list.capacity, tau_key);
    const T* values = listed ? list.values : x;
    assume_global(values);  // else nvcc loads it through generic addresses
    return {values, listed ? list.index : nullptr, listed ? c.gathered : n};
  }
};

/// The round's verdict; the histogram is cleared for the next round.
template <class = void>
__global__ __launch_bounds__(sample_policy::threads)
void search_decide_kernel(sampled_search* state, unsigned long long* hist, std::uint64_t k,
                          std::uint64_t cap) {
  if (threadIdx.x == 0 && !state->done) {
    sampled_search st = *state;
    st.decide(reinterpret_cast<const std::uint64_t*>(hist), k, cap);
    *state = st;
  }
  __syncthreads();
  for (unsigned b = threadIdx.x; b <= sampled_search::bins; b += blockDim.x) hist[b] = 0;
}

template <>
struct structure_backend<cuda, sparsify::sampled_topk> {
  using inner = structure_backend<cuda, sparsify::threshold>;

  /// Scratch: the threshold stage's, the search state and the list's control words, its
  /// histogram, the sample's keys twice (CUB sorts out of place), CUB's sort storage, then the
  /// list: a ticket, a status word per gather tile, and n / 8 indices and values.
  template <class T>
  static std::size_t workspace_bytes(cuda& exec, std::size_t n) {
    return layout_of<T>(exec, n).end;
  }

  template <class T>
  static std::uint64_t count(cuda& exec, const sparsify::sampled_topk& s, span<const T> x) {
    return inner::copy_count(exec, count_on_device(exec, s, x));
  }

  /// The threshold search and the count, all on the device; the count stays there.
  template <class T>
  static const std::uint64_t* count_on_device(cuda& exec, const sparsify::sampled_topk& s, span<const T> x) {
    const std::uint64_t n = x.size();
    const std::uint64_t k = s.target_count(n);
    if (k == 0) return inner::zero_count<T>(exec, n);
    const layout l = layout_of<T>(exec, n);
    std::byte* scratch = exec.scratch(l.end);
    auto* state = reinterpret_cast<sampled_search*>(scratch + l.state);
    auto* control = reinterpret_cast<dgc_list_control*>(scratch + l.control);
    auto* hist = reinterpret_cast<unsigned long long*>(scratch + l.hist);
    auto* keys = reinterpret_cast<std::uint32_t*>(scratch + l.keys);
    auto* sorted = reinterpret_cast<std::uint32_t*>(scratch + l.sorted);
    const dgc_list<T> list = list_in<T>(scratch, l);
    const std::uint64_t size = s.sample_size(n);
    cudaStream_t stream = exec.stream();
    launch(sample_keys_kernel<T>, grid_for_policy<sample_policy>(exec, size), sample_policy::threads,
           0, stream, x.data(), n, size, s.seed(), keys);
    std::size_t temp_bytes = l.sort_temp_bytes;
    GRADZIP_CUDA_TRY(cub::DeviceRadixSort::SortKeysDescending(scratch + l.sort_temp, temp_bytes, keys, sorted,
                                                              size, 0, 32, stream));
    GRADZIP_CUDA_TRY(cudaMemsetAsync(hist, 0, (sampled_search::bins + 1) * sizeof(unsigned long long), stream));
    // All ones: no list, until the gather's last tile writes its count.
    GRADZIP_CUDA_TRY(cudaMemsetAsync(control, 0xFF, sizeof(dgc_list_control), stream));
    launch(search_start_kernel<>, 1, 1, 0, stream, sorted, size, k, n, state);
    const bool gather = sampled_search::gather_pays(k, n, size, list.capacity);
    if (gather) GRADZIP_CUDA_TRY(cudaMemsetAsync(scratch + l.ticket, 0, l.index - l.ticket, stream));
    const std::uint64_t cap = sparsify::sampled_topk::upper_count(k, n);
    for (int round = 0; round < sampled_search::max_rounds; ++round) {
      if (round == 0 && gather) {
        launch(search_gather_kernel<T>, grid_for_units(exec, gather_tiles<T>(n), gather_policy::blocks_per_sm),
               gather_policy::threads, 0, stream, x.data(), n, state, hist, list, control,
               reinterpret_cast<unsigned long long*>(scratch + l.ticket),
               reinterpret_cast<std::uint64_t*>(scratch + l.status));
      } else {
        launch(search_histogram_kernel<T>, grid_for_policy<search_policy>(exec, n), search_policy::threads, 0,
               stream, x.data(), n, state, hist, list, control);
      }
      launch(search_decide_kernel<>, 1, sample_policy::threads, 0, stream, state, hist, k, cap);
    }
    return inner::count_on_device_from<T>(exec, n, source_of(x, list, control, state), threshold_of(state));
  }

  template <class T, class Sink>
  static void select(cuda& exec, const sparsify::sampled_topk& s, span<const T> x, std::uint64_t k,
                     const Sink& sink) {
    // k may be the bound (compress_async): the search state exists only when the count ran it.
    if (k == 0 || s.target_count(x.size()) == 0) return;
    const layout l = layout_of<T>(exec, x.size());
    std::byte* scratch = exec.scratch(l.end);
    const auto* state = reinterpret_cast<const sampled_search*>(scratch + l.state);
    const auto* control = reinterpret_cast<const dgc_list_control*>(scratch + l.control);
    inner::select_from<T>(exec, x.size(), source_of(x, list_in<T>(scratch, l), control, state), threshold_of(state),
                          k, sink);
  }

  /// Where the last count over n elements of T left the list's control words (device memory):
  /// tests read which source served the count and the emit. Asked for a larger layout than the
  /// scratch holds (no such count ran), it throws rather than grow the scratch and lose the words.
  template <class T>
  static const dgc_list_control* list_control(cuda& exec, std::size_t n) {
    const layout l = layout_of<T>(exec, n);
    GRADZIP_EXPECTS(l.end <= exec.scratch_capacity(), "sampled_topk list_control: no count over ", n,
                    " elements ran on this executor (its scratch holds ", exec.scratch_capacity(),
                    " bytes, the layout needs ", l.end, ")");
    return reinterpret_cast<const dgc_list_control*>(exec.scratch(l.end) + l.control);
  }

  /// The list's capacity for n elements.
  static std::uint64_t list_capacity(std::size_t n) { return topk_candidate_capacity(n, 4096); }

 private:
  struct layout {
    std::size_t state = 0, control = 0, hist = 0, keys = 0, sorted = 0, sort_temp = 0, sort_temp_bytes = 0;
    std::size_t ticket = 0, status = 0, index = 0, values = 0, end = 0;
    std::uint64_t capacity = 0;
  };

  static sparsify::detail::key_threshold threshold_of(const sampled_search* state) {
    return {reinterpret_cast<const std::uint32_t*>(reinterpret_cast<const std::byte*>(state) +
                                                   offsetof(sampled_search, tau_key))};
  }

  template <class T>
  static listed_source<T> source_of(span<const T> x, const dgc_list<T>& list, const dgc_list_control* control,
                                    const sampled_search* state) {
    return {x.data(), x.size(), list, control, state};
  }

  template <class T>
  static dgc_list<T> list_in(std::byte* scratch, const layout& l) {
    return {reinterpret_cast<std::uint64_t*>(scratch + l.index), reinterpret_cast<T*>(scratch + l.values), l.capacity};
  }

  template <class T>
  static layout layout_of(cuda& exec, std::size_t n) {
    const std::uint64_t most = sparsify::sampled_topk::sample_size(n, sparsify::sampled_topk::max_sample_rate);
    layout l;
    l.state = scratch_aligned(inner::workspace_bytes<T>(exec, n));
    l.control = l.state + 128;
    l.hist = l.state + 256;
    l.keys = scratch_aligned(l.hist + (sampled_search::bins + 1) * sizeof(unsigned long long));
    l.sorted = scratch_aligned(l.keys + most * 4);
    l.sort_temp = scratch_aligned(l.sorted + most * 4);
    GRADZIP_CUDA_TRY(cub::DeviceRadixSort::SortKeysDescending(
        nullptr, l.sort_temp_bytes, static_cast<const std::uint32_t*>(nullptr), static_cast<std::uint32_t*>(nullptr),
        most, 0, 32, exec.stream()));
    l.capacity = list_capacity(n);
    l.ticket = scratch_aligned(l.sort_temp + l.sort_temp_bytes);
    l.status = l.ticket + 256;
    l.index = scratch_aligned(l.status + gather_tiles<T>(n) * sizeof(std::uint64_t));
    l.values = scratch_aligned(l.index + l.capacity * sizeof(std::uint64_t));
    l.end = scratch_aligned(l.values + l.capacity * sizeof(T));
    return l;
  }
};

}  // namespace gradzip::detail
