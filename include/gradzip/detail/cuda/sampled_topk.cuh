// structure_backend<cuda, sparsify::sampled_topk>: DGC's threshold search without host round
// trips. The sample is gathered and sorted on the device (CUB radix sort), one thread picks the
// bracket, and each refinement round is a histogram kernel (shared-memory bins, integer atomics:
// the counts do not depend on the order) and a one-thread decide kernel; rounds after the search
// is done return at once. The threshold stays in device memory for the threshold stage's count
// and emit kernels; the only copy to the host is the final count, which sizes the payload.
#pragma once

#include <cub/device/device_radix_sort.cuh>

#include "gradzip/detail/cuda/threshold.cuh"
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

template <class T>
__global__ __launch_bounds__(search_policy::threads)
void search_histogram_kernel(const T* x, std::uint64_t n, const sampled_search* state,
                             unsigned long long* hist) {
  __shared__ unsigned int local[sampled_search::bins + 1];
  const sampled_search st = *state;
  if (st.done) return;  // the whole grid alike
  for (unsigned b = threadIdx.x; b <= sampled_search::bins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const std::uint64_t runs = (n + 7) / 8, stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t run = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; run < runs;
       run += stride) {
    const run_of_8 r = run_at(run, n);
    float v[8];
    load_floats(x, r.first, r.valid, v);
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

  /// Scratch: the threshold stage's, the search state, its histogram, the sample's keys twice
  /// (CUB sorts out of place) and CUB's sort storage.
  template <class T>
  static std::size_t workspace_bytes(cuda& exec, std::size_t n) {
    const layout l = layout_of<T>(exec, n);
    return l.sort_temp + l.sort_temp_bytes;
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
    std::byte* scratch = exec.scratch(l.sort_temp + l.sort_temp_bytes);
    auto* state = reinterpret_cast<sampled_search*>(scratch + l.state);
    auto* hist = reinterpret_cast<unsigned long long*>(scratch + l.hist);
    auto* keys = reinterpret_cast<std::uint32_t*>(scratch + l.keys);
    auto* sorted = reinterpret_cast<std::uint32_t*>(scratch + l.sorted);
    const std::uint64_t size = s.sample_size(n);
    cudaStream_t stream = exec.stream();
    launch(sample_keys_kernel<T>, grid_for_policy<sample_policy>(exec, size), sample_policy::threads,
           0, stream, x.data(), n, size, s.seed(), keys);
    std::size_t temp_bytes = l.sort_temp_bytes;
    GRADZIP_CUDA_TRY(cub::DeviceRadixSort::SortKeysDescending(scratch + l.sort_temp, temp_bytes, keys, sorted,
                                                              size, 0, 32, stream));
    GRADZIP_CUDA_TRY(cudaMemsetAsync(hist, 0, (sampled_search::bins + 1) * sizeof(unsigned long long), stream));
    launch(search_start_kernel<>, 1, 1, 0, stream, sorted, size, k, n, state);
    const std::uint64_t cap = sparsify::sampled_topk::upper_count(k, n);
    for (int round = 0; round < sampled_search::max_rounds; ++round) {
      launch(search_histogram_kernel<T>, grid_for_policy<search_policy>(exec, n), search_policy::threads,
             0, stream,
             x.data(), n, state, hist);
      launch(search_decide_kernel<>, 1, sample_policy::threads, 0, stream, state, hist, k, cap);
    }
    return inner::count_on_device_with(exec, x, threshold_of(state));
  }

  template <class T, class Sink>
  static void select(cuda& exec, const sparsify::sampled_topk& s, span<const T> x, std::uint64_t k,
                     const Sink& sink) {
    // k may be the bound (compress_async): the search state exists only when the count ran it.
    if (k == 0 || s.target_count(x.size()) == 0) return;
    const layout l = layout_of<T>(exec, x.size());
    auto* state = reinterpret_cast<sampled_search*>(exec.scratch(l.sort_temp + l.sort_temp_bytes) + l.state);
    inner::select_with(exec, x, threshold_of(state), k, sink);
  }

 private:
  struct layout {
    std::size_t state = 0, hist = 0, keys = 0, sorted = 0, sort_temp = 0, sort_temp_bytes = 0;
  };

  static sparsify::detail::key_threshold threshold_of(const sampled_search* state) {
    return {reinterpret_cast<const std::uint32_t*>(reinterpret_cast<const std::byte*>(state) +
                                                   offsetof(sampled_search, tau_key))};
  }

  template <class T>
  static layout layout_of(cuda& exec, std::size_t n) {
    const std::uint64_t most = sparsify::sampled_topk::sample_size(n, sparsify::sampled_topk::max_sample_rate);
    layout l;
    l.state = scratch_aligned(inner::workspace_bytes<T>(exec, n));
    l.hist = l.state + 256;
    l.keys = scratch_aligned(l.hist + (sampled_search::bins + 1) * sizeof(unsigned long long));
    l.sorted = scratch_aligned(l.keys + most * 4);
    l.sort_temp = scratch_aligned(l.sorted + most * 4);
    GRADZIP_CUDA_TRY(cub::DeviceRadixSort::SortKeysDescending(
        nullptr, l.sort_temp_bytes, static_cast<const std::uint32_t*>(nullptr), static_cast<std::uint32_t*>(nullptr),
        most, 0, 32, exec.stream()));
    return l;
  }
};

}  // namespace gradzip::detail
