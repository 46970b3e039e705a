// structure_backend<cuda, hash::hashed_topk>: DRAGONN's hashed sparsification on the GPU with
// the host's bytes. The sample's keys are gathered and sorted on the device (as sampled top-k),
// one thread takes the threshold key at rank ceil(k s / n), every survivor posts its slot word
// with one 64-bit atomicMax (larger magnitude, then lower index: the winner does not depend on
// the order of the atomics), and the threshold stage's tiled count and ordered emit select the
// slots' winners in index order. One copy of the count to the host, as every data-dependent
// structure on CUDA.
#pragma once

#include <cub/device/device_radix_sort.cuh>

#include "gradzip/detail/cuda/sampled_topk.cuh"
#include "gradzip/detail/cuda/threshold.cuh"
#include "gradzip/hash/hashed_topk.hpp"

namespace gradzip::detail {

/// Hashed top-k's slot pass: one element per thread and grid-stride step.
using hashed_policy = launch_policy<256, 1, 8>;

/// The survivors that won their slot: the per-index predicate of hashed top-k's emit.
struct hashed_winners {
  const std::uint32_t* tau;  // device memory, written by hashed_tau_kernel
  const unsigned long long* slots;
  std::uint64_t m;
  std::uint64_t seed;
};

/// hashed_winners with tau read (threshold_operand): what the selection loops compare against.
struct hashed_winners_operand {
  std::uint32_t tau;
  const unsigned long long* slots;
  std::uint64_t m;
  std::uint64_t seed;
};

__device__ inline hashed_winners_operand threshold_operand(hashed_winners w) { return {*w.tau, w.slots, w.m, w.seed}; }

template <class V>
__device__ inline bool passes_at(V v, std::uint64_t i, hashed_winners_operand w) {
  const std::uint32_t key = sparsify::detail::magnitude_key(static_cast<float>(v));
  if (key < w.tau) return false;
  return w.slots[hash::hashed_topk::slot_of(w.seed, i, w.m)] == hash::hashed_topk::slot_word(key, i);
}

/// tau: the sorted (descending) sample's key at rank ceil(k s / n), 0 when k >= n.
template <class = void>
__global__ __launch_bounds__(1)
void hashed_tau_kernel(const std::uint32_t* sorted, std::uint64_t size, std::uint64_t k, std::uint64_t n,
                       std::uint32_t* tau) {
  if (k >= n) {
    *tau = 0;
    return;
  }
  std::uint64_t rank = static_cast<std::uint64_t>((static_cast<uint128>(k) * size + n - 1) / n);
  rank = rank < 1 ? 1 : (rank > size ? size : rank);
  *tau = sorted[rank - 1];
}

template <class T>
__global__ __launch_bounds__(hashed_policy::threads)
void hashed_slots_kernel(const T* x, std::uint64_t n, const std::uint32_t* tau, std::uint64_t m,
                         std::uint64_t seed, unsigned long long* slots) {
  const std::uint32_t t = *tau;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::uint32_t key = sparsify::detail::magnitude_key(static_cast<float>(to_float(x[i])));
    if (key >= t) atomicMax(&slots[hash::hashed_topk::slot_of(seed, i, m)], hash::hashed_topk::slot_word(key, i));
  }
}

template <>
struct structure_backend<cuda, hash::hashed_topk> {
  using inner = structure_backend<cuda, sparsify::threshold>;

  template <class T>
  static std::size_t workspace_bytes(cuda& exec, const hash::hashed_topk& s, std::size_t n) {
    const layout l = layout_of<T>(exec, s, n);
    return l.sort_temp + l.sort_temp_bytes;
  }

  template <class T>
  static std::uint64_t count(cuda& exec, const hash::hashed_topk& s, span<const T> x) {
    return inner::copy_count(exec, count_on_device(exec, s, x));
  }

  /// The sample, the slots and the count, all on the device; the count stays there.
  template <class T>
  static const std::uint64_t* count_on_device(cuda& exec, const hash::hashed_topk& s, span<const T> x) {
    const std::uint64_t n = x.size();
    GRADZIP_EXPECTS(n <= hash::hashed_topk::max_elements, "hashed_topk: n = ", n, " exceeds 2^33 - 1");
    const std::uint64_t k = s.target_count(n), m = s.slots(n);
    if (k == 0 || m == 0) return inner::zero_count<T>(exec, n);
    const layout l = layout_of<T>(exec, s, n);
    std::byte* scratch = exec.scratch(l.sort_temp + l.sort_temp_bytes);
    auto* tau = reinterpret_cast<std::uint32_t*>(scratch + l.tau);
    auto* slots = reinterpret_cast<unsigned long long*>(scratch + l.slots);
    auto* keys = reinterpret_cast<std::uint32_t*>(scratch + l.keys);
    auto* sorted = reinterpret_cast<std::uint32_t*>(scratch + l.sorted);
    const std::uint64_t size = sparsify::sampled_topk::sample_size(n, s.sample_rate());
    cudaStream_t stream = exec.stream();
    launch(sample_keys_kernel<T>, grid_for_policy<sample_policy>(exec, size), sample_policy::threads,
           0, stream, x.data(), n, size, s.seed(), keys);
    std::size_t temp_bytes = l.sort_temp_bytes;
    GRADZIP_CUDA_TRY(cub::DeviceRadixSort::SortKeysDescending(scratch + l.sort_temp, temp_bytes, keys, sorted, size, 0, 32,
                                                              stream));
    launch(hashed_tau_kernel<>, 1, 1, 0, stream, sorted, size, k, n, tau);
    GRADZIP_CUDA_TRY(cudaMemsetAsync(slots, 0, m * sizeof(unsigned long long), stream));
    launch(hashed_slots_kernel<T>, grid_for_policy<hashed_policy>(exec, n), hashed_policy::threads,
           0, stream, x.data(), n, tau, m, s.seed(), slots);
    return inner::count_on_device_with(exec, x, winners(s, scratch, l, n));
  }

  template <class T, class Sink>
  static void select(cuda& exec, const hash::hashed_topk& s, span<const T> x, std::uint64_t k, const Sink& sink) {
    // k may be the bound (compress_async): the slots exist only when the count pass built them.
    if (k == 0 || s.target_count(x.size()) == 0 || s.slots(x.size()) == 0) return;
    const layout l = layout_of<T>(exec, s, x.size());
    std::byte* scratch = exec.scratch(l.sort_temp + l.sort_temp_bytes);
    inner::select_with(exec, x, winners(s, scratch, l, x.size()), k, sink);
  }

 private:
  struct layout {
    std::size_t tau = 0, slots = 0, keys = 0, sorted = 0, sort_temp = 0, sort_temp_bytes = 0;
  };

  static hashed_winners winners(const hash::hashed_topk& s, std::byte* scratch, const layout& l, std::uint64_t n) {
    return {reinterpret_cast<const std::uint32_t*>(scratch + l.tau),
            reinterpret_cast<const unsigned long long*>(scratch + l.slots), s.slots(n), s.seed()};
  }

  /// After the threshold stage's scratch (its counts and offsets): tau, the m slots, the sample's
  /// keys twice (CUB sorts out of place) and CUB's sort storage.
  template <class T>
  static layout layout_of(cuda& exec, const hash::hashed_topk& s, std::size_t n) {
    const std::uint64_t size = sparsify::sampled_topk::sample_size(n, s.sample_rate());
    layout l;
    l.tau = scratch_aligned(inner::workspace_bytes<T>(exec, n));
    l.slots = l.tau + 256;
    l.keys = scratch_aligned(l.slots + s.slots(n) * sizeof(unsigned long long));
    l.sorted = scratch_aligned(l.keys + size * 4);
    l.sort_temp = scratch_aligned(l.sorted + size * 4);
    GRADZIP_CUDA_TRY(cub::DeviceRadixSort::SortKeysDescending(nullptr, l.sort_temp_bytes,
                                                              static_cast<const std::uint32_t*>(nullptr),
                                                              static_cast<std::uint32_t*>(nullptr), size, 0, 32,
                                                              exec.stream()));
    return l;
  }
};

}  // namespace gradzip::detail
