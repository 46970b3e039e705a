// CUDA top-k: radix select on magnitude keys with no host synchronization.
//
// For 32-bit keys (float, half, bf16), the input is read three times:
//   1. histogram of the top 11 key bits (shared-memory counters), then one block picks the bin
//      holding the k-th largest and narrows the prefix;
//   2. histogram of the remaining 20 bits among keys with that prefix (global counters,
//      warp-aggregated, plus a 1024-bin coarse histogram in shared memory), then one block
//      resolves the exact threshold key T and how many ties at T to take;
//   3. one cub::DeviceScan pass over (key > T, key == T) counts that writes each selected
//      element straight to its position in the payload: indices come out sorted, ties go to the
//      lower index, and no atomics decide any output.
// 64-bit keys (double) take two more 20/12-bit histogram passes (five reads).
// Every count is an integer, so the result is exact and equals the host's byte for byte.
#pragma once

#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include "gradzip/detail/cuda/vector_load.cuh"
#include "gradzip/detail/topk_scan.hpp"

namespace gradzip::detail {

template <class Key>
__global__ __launch_bounds__(1)
void topk_init_kernel(cuda_topk_state<Key>* st, std::uint64_t k) {
  *st = cuda_topk_state<Key>{0, 0, k, 0};
}

/// Histogram of a narrow digit (at most 12 bits) in shared memory, flushed once per block.
template <class T, class Key, int MaxBins>
__global__ __launch_bounds__(block_threads)
void narrow_histogram_kernel(const T* x, std::uint64_t n,
                             const cuda_topk_state<Key>* st, radix_digit d,
                             std::uint64_t* hist) {
  __shared__ unsigned int local[MaxBins];
  const int bins = 1 << d.width;
  for (int b = threadIdx.x; b < bins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const Key prefix = st->prefix, mask = st->mask;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const Key key = magnitude_key(x[i]);
    if ((key & mask) == prefix) atomicAdd(&local[(key >> d.shift) & (bins - 1)], 1u);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < bins; b += blockDim.x) {
    if (local[b] != 0) atomicAdd(reinterpret_cast<unsigned long long*>(hist + b), local[b]);
  }
}

/// Histogram of a wide digit: global fine counters (warp-aggregated) and shared coarse ones.
template <class T, class Key>
__global__ __launch_bounds__(block_threads)
void wide_histogram_kernel(const T* x, std::uint64_t n, const cuda_topk_state<Key>* st,
                           radix_digit d, std::uint64_t* fine, std::uint64_t* coarse) {
  constexpr int coarse_bins = 1 << cuda_topk_coarse_bits;
  __shared__ unsigned int local[coarse_bins];
  for (int b = threadIdx.x; b < coarse_bins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const Key prefix = st->prefix, mask = st->mask;
  const int coarse_shift = d.width - cuda_topk_coarse_bits;
  const unsigned lane = threadIdx.x % 32;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  // Warp-uniform trip count (the loop runs while the warp's first lane is in range), so every
  // lane reaches __match_any_sync together.
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i - lane < n; i += stride) {
    unsigned int digit = 0xFFFFFFFFu;  // no digit has this value: lanes without a match
    if (i < n) {
      const Key key = magnitude_key(x[i]);
      if ((key & mask) == prefix) digit = static_cast<unsigned int>((key >> d.shift) & ((Key{1} << d.width) - 1));
    }
    const unsigned peers = __match_any_sync(0xFFFFFFFFu, digit);
    if (digit != 0xFFFFFFFFu) {
      if (lane == static_cast<unsigned>(__ffs(peers) - 1)) {
        atomicAdd(reinterpret_cast<unsigned long long*>(fine + digit),
                  static_cast<unsigned long long>(__popc(peers)));
      }
      atomicAdd(&local[digit >> coarse_shift], 1u);
    }
  }
  __syncthreads();
  for (int b = threadIdx.x; b < coarse_bins; b += blockDim.x) {
    if (local[b] != 0) atomicAdd(reinterpret_cast<unsigned long long*>(coarse + b), local[b]);
  }
}

/**
 * One block finds, in hist[0 .. bins) (bins <= 4 x 1024), the bin holding the rank-th largest,
 * and the count of elements in higher bins. Every thread gets the answer.
 */
__device__ inline void block_find_rank(const std::uint64_t* hist, int bins, std::uint64_t rank,
                                       int& bin, std::uint64_t& above) {
  using scan_t = cub::BlockScan<std::uint64_t, cuda_topk_select_threads>;
  __shared__ typename scan_t::TempStorage temp;
  __shared__ int found_bin;
  __shared__ std::uint64_t found_above;
  const int per = (bins + cuda_topk_select_threads - 1) / cuda_topk_select_threads;
  const int first = static_cast<int>(threadIdx.x) * per;
  // Thread t owns descending positions [t * per, (t + 1) * per): bins from the top down.
  std::uint64_t mine = 0;
  for (int p = first; p < first + per && p < bins; ++p) mine += hist[bins - 1 - p];
  std::uint64_t before = 0;
  scan_t(temp).ExclusiveSum(mine, before);
  if (before < rank && before + mine >= rank) {  // exactly one thread holds the rank
    std::uint64_t acc = before;
    for (int p = first; p < bins; ++p) {
      const std::uint64_t c = hist[bins - 1 - p];
      if (acc + c >= rank) {
        found_bin = bins - 1 - p;
        found_above = acc;
        break;
      }
      acc += c;
    }
  }
  __syncthreads();
  bin = found_bin;
  above = found_above;
}

template <class Key>
__global__ __launch_bounds__(cuda_topk_select_threads)
void narrow_select_kernel(const std::uint64_t* hist, radix_digit d, cuda_topk_state<Key>* st) {
  int bin = 0;
  std::uint64_t above = 0;
  block_find_rank(hist, 1 << d.width, st->rank, bin, above);
  if (threadIdx.x == 0) narrow_state(st, d, bin, above);
}

template <class Key>
__global__ __launch_bounds__(cuda_topk_select_threads)
void wide_select_kernel(const std::uint64_t* fine, const std::uint64_t* coarse,
                        radix_digit d, cuda_topk_state<Key>* st) {
  const int window = 1 << (d.width - cuda_topk_coarse_bits);
  int c = 0, f = 0;
  std::uint64_t above_coarse = 0, above_fine = 0;
  const std::uint64_t rank = st->rank;
  block_find_rank(coarse, 1 << cuda_topk_coarse_bits, rank, c, above_coarse);
  __syncthreads();
  block_find_rank(fine + static_cast<std::uint64_t>(c) * window, window, rank - above_coarse, f,
                  above_fine);
  if (threadIdx.x == 0) narrow_state(st, d, c * window + f, above_coarse + above_fine);
}

/// Scratch layout of the device top-k.
template <class Key>
struct cuda_topk_scratch {
  std::uint64_t* narrow;  // 4096 bins
  std::uint64_t* fine;    // 2^20 bins
  std::uint64_t* coarse;  // 1024 bins
  cuda_topk_state<Key>* state;
  void* scan_temp;
  std::size_t scan_bytes;

  static constexpr std::size_t narrow_bins = 4096;
  static constexpr std::size_t fine_bins = std::size_t{1} << cuda_topk_wide_bits;
  static constexpr std::size_t coarse_bins = std::size_t{1} << cuda_topk_coarse_bits;
  static constexpr std::size_t counters_bytes = (narrow_bins + fine_bins + coarse_bins) * 8;

  cuda_topk_scratch(std::byte* base, std::size_t scan)
      : narrow(reinterpret_cast<std::uint64_t*>(base)),
        fine(narrow + narrow_bins),
        coarse(fine + fine_bins),
        state(reinterpret_cast<cuda_topk_state<Key>*>(base + counters_bytes)),
        scan_temp(base + counters_bytes + 256),
        scan_bytes(scan) {}
};

template <class T, class Sink>
std::size_t cuda_topk_scan_bytes(cudaStream_t stream, std::uint64_t n) {
  using Key = key_type_t<T>;
  std::size_t bytes = 0;
  auto its = topk_scan_iterators<T, Key>(nullptr, nullptr, Sink{});
  GRADZIP_CUDA_TRY(cub::DeviceScan::InclusiveScan(nullptr, bytes, its.first, its.second,
                                                  topk_scan_op<T>{}, n, stream));
  return bytes;
}

/// Scratch of the device top-k. The scan's size is queried with one canonical sink type here
/// and in cuda_topk, so the codec's sizing and the select's request always agree (a codec that
/// keeps values in scratch after this block relies on it); CUB's storage does not depend on the
/// output iterator, and would fail loudly, not silently, if it ever did.
template <class T>
std::size_t cuda_topk_workspace_bytes(cudaStream_t stream, std::uint64_t n) {
  return cuda_topk_scratch<key_type_t<T>>::counters_bytes + 256 +
         cuda_topk_scan_bytes<T, payload_sink<T, quantize::none, encode::coo>>(stream, n);
}

/**
 * Selects the k largest-magnitude elements of device array x (ties to the lower index) and calls
 * sink(position, index, value) on the device for each, positions in ascending index order.
 * Stream-ordered on exec.stream(); no host synchronization.
 */
template <class T, class Sink>
void cuda_topk(cuda& exec, span<const T> x, std::uint64_t k, const Sink& sink) {
  using Key = key_type_t<T>;
  const std::uint64_t n = x.size();
  if (k == 0 || n == 0) return;
  const cudaStream_t stream = exec.stream();
  const std::size_t total = cuda_topk_workspace_bytes<T>(stream, n);
  const std::size_t scan_bytes = total - cuda_topk_scratch<Key>::counters_bytes - 256;
  cuda_topk_scratch<Key> s(exec.scratch(total), scan_bytes);

  launch(topk_init_kernel<Key>, 1, 1, 0, stream, s.state, k);
  radix_digit digits[8];
  const int levels = cuda_topk_digits(magnitude_key_bits<Key>, digits);
  const unsigned grid = grid_for(exec, n, block_threads, 4);
  for (int level = 0; level < levels; ++level) {
    const radix_digit d = digits[level];
    if (d.width <= 12) {
      GRADZIP_CUDA_TRY(cudaMemsetAsync(s.narrow, 0, (std::size_t{1} << d.width) * 8, stream));
      launch(narrow_histogram_kernel<T, Key, 4096>, grid, block_threads, 0, stream, x.data(), n, s.state, d, s.narrow);
      launch(narrow_select_kernel<Key>, 1, cuda_topk_select_threads, 0, stream, s.narrow, d, s.state);
    } else {
      GRADZIP_CUDA_TRY(cudaMemsetAsync(s.fine, 0, (s.fine_bins + s.coarse_bins) * 8, stream));
      launch(wide_histogram_kernel<T, Key>, grid, block_threads, 0, stream, x.data(), n, s.state, d, s.fine, s.coarse);
      launch(wide_select_kernel<Key>, 1, cuda_topk_select_threads, 0, stream, s.fine, s.coarse, d, s.state);
    }
  }
  auto its = topk_scan_iterators<T, Key>(x.data(), s.state, sink);
  std::size_t bytes = s.scan_bytes;
  GRADZIP_CUDA_TRY(cub::DeviceScan::InclusiveScan(s.scan_temp, bytes, its.first, its.second,
                                                  topk_scan_op<T>{}, n, stream));
}

/// The dense emit's launch: a run of 8 consecutive elements per thread and step (`load_run`).
using dense_emit_policy = launch_policy<256, 8, 8>;

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
#pragma unroll
    for (unsigned k = 0; k < 8; ++k) {
      if (k < r.valid) sink(r.first + k, r.first + k, v[k]);
    }
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
    launch(dense_emit_kernel<T, Sink>, grid_for_policy<dense_emit_policy>(exec, x.size()), dense_emit_policy::threads, 0,
           exec.stream(), x.data(), x.size(), sink);
  }
};

template <class Structure, class T, class Sink>
__global__ __launch_bounds__(block_threads)
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
    launch(implicit_emit_kernel<Structure, T, Sink>, grid_for(exec, k), block_threads, 0, exec.stream(), sp, x.data(), x.size(),
           k, sink);
  }
};

template <>
struct structure_backend<cuda, sparsify::topk> {
  template <class T>
  static std::size_t workspace_bytes(cuda& exec, std::size_t n) {
    return cuda_topk_workspace_bytes<T>(exec.stream(), n);
  }
  template <class T, class Sink>
  static void select(cuda& exec, const sparsify::topk&, span<const T> x, std::uint64_t k,
                     const Sink& sink) {
    cuda_topk(exec, x, k, sink);
  }
};

}  // namespace gradzip::detail
