// partition_backend<cuda>: Zen's hash partitioning on the GPU, with the host's results.
//
// - loads: a per-block shared-memory histogram (integer atomics, so the counts are exact).
// - split_fixed: each index's part, a stable radix sort by part (CUB keeps equal parts in index
//   order), a part's rank = its position minus the part's first position; ranks below
//   `capacity` go to the part's slots, the others are flagged, and an exclusive scan of the
//   flags in index order gives each one its place in the overflow area: the host's loop,
//   exactly. Scratch: 24 bytes per index, 16 per part, plus CUB's. One host wait: the total
//   and the first bad index are read together at the end, and the kernels that write the
//   caller's spans return at once when an index was bad, so a refused input changes nothing.
// - the hash bitmap: member flags over [0, n), an exclusive scan gives each member its rank
//   (bit position); encode sets bits with atomicOr, decode selects set members in index order.
//   Scratch: 16 bytes per element of [0, n); n below 2^32.
// Every call is synchronous: each returns counts the host needs (and reports bad input as the
// host executor does, by throwing).
#pragma once

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <vector>

#include "gradzip/hash/partition.hpp"

namespace gradzip::detail {

/// Zen's hash partition: one index per thread and grid-stride step.
using partition_policy = launch_policy<256, 1, 8>;

namespace partition_device {

using hash::partition;

/// Flags a caller's index list may raise (bits of one word).
enum : unsigned { not_increasing_or_out_of_range = 1, not_a_member = 2, too_few_words = 4, bit_past_end = 8 };

inline constexpr std::uint32_t shared_parts = 4096;

template <class = void>
__global__ __launch_bounds__(partition_policy::threads)
void loads_kernel(std::uint64_t n, std::uint64_t seed, std::uint32_t parts, unsigned long long* load) {
  __shared__ unsigned long long local[shared_parts];
  const bool in_shared = parts <= shared_parts;
  if (in_shared) {
    for (std::uint32_t p = threadIdx.x; p < parts; p += blockDim.x) local[p] = 0;
    __syncthreads();
  }
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    atomicAdd(in_shared ? local + partition::part_of(seed, i, parts) : load + partition::part_of(seed, i, parts), 1ull);
  }
  if (in_shared) {
    __syncthreads();
    for (std::uint32_t p = threadIdx.x; p < parts; p += blockDim.x) {
      if (local[p] != 0) atomicAdd(load + p, local[p]);
    }
  }
}

/// Whether sorted[j] breaks the caller's promise: every index below n, strictly increasing.
__device__ inline bool out_of_order(const std::uint64_t* sorted, std::uint64_t j, std::uint64_t n) {
  return sorted[j] >= n || (j > 0 && sorted[j] <= sorted[j - 1]);
}

/// part[j] and position[j] = j for each index; first_bad: the least j not increasing or < n
/// (it starts at ~0).
template <class = void>
__global__ __launch_bounds__(partition_policy::threads)
void prepare_kernel(const std::uint64_t* sorted, std::uint64_t m, std::uint64_t n, std::uint64_t seed,
                    std::uint32_t parts, std::uint32_t* part, std::uint32_t* position,
                    unsigned long long* first_bad) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t j = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < m; j += stride) {
    const std::uint64_t i = sorted[j];
    if (out_of_order(sorted, j, n)) atomicMin(first_bad, static_cast<unsigned long long>(j));
    part[j] = partition::part_of(seed, i, parts);
    position[j] = static_cast<std::uint32_t>(j);
  }
}

/// first[p] and end[p]: the run of part p in the sorted order (both 0 for an empty part).
template <class = void>
__global__ __launch_bounds__(partition_policy::threads)
void runs_kernel(const std::uint32_t* sorted_part, std::uint64_t m, std::uint64_t* first,
                 std::uint64_t* end) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t s = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; s < m; s += stride) {
    const std::uint32_t p = sorted_part[s];
    if (s == 0 || sorted_part[s - 1] != p) first[p] = s;
    if (s + 1 == m || sorted_part[s + 1] != p) end[p] = s + 1;
  }
}

/// Whether prepare_kernel found an index out of order: split_fixed's writes into the caller's
/// spans are then skipped, so that a refused input changes nothing (the host's contract).
__device__ inline bool refused(const unsigned long long* first_bad) { return *first_bad != ~0ull; }

template <class = void>
__global__ __launch_bounds__(partition_policy::threads)
void place_kernel(const std::uint64_t* sorted, const std::uint32_t* sorted_part,
                  const std::uint32_t* sorted_position, std::uint64_t m, const std::uint64_t* first,
                  std::uint64_t capacity, std::uint64_t* slots, std::uint32_t* overflowing,
                  const unsigned long long* first_bad) {
  if (refused(first_bad)) return;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t s = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; s < m; s += stride) {
    const std::uint32_t p = sorted_part[s];
    const std::uint64_t rank = s - first[p];
    const std::uint32_t j = sorted_position[s];
    if (rank < capacity) {
      slots[p * capacity + rank] = sorted[j];
      overflowing[j] = 0;
    } else {
      overflowing[j] = 1;
    }
  }
}

template <class = void>
__global__ __launch_bounds__(partition_policy::threads)
void counts_kernel(const std::uint64_t* first, const std::uint64_t* end, std::uint32_t parts,
                   std::uint64_t capacity, std::uint64_t* counts, const unsigned long long* first_bad) {
  if (refused(first_bad)) return;
  for (std::uint32_t p = blockIdx.x * blockDim.x + threadIdx.x; p < parts; p += gridDim.x * blockDim.x) {
    const std::uint64_t size = end[p] - first[p];
    counts[p] = size < capacity ? size : capacity;
  }
}

/// Overflowing index j goes to spill[at[j]] while the area lasts; the last thread totals.
template <class = void>
__global__ __launch_bounds__(partition_policy::threads)
void spill_kernel(const std::uint64_t* sorted, const std::uint32_t* part, const std::uint32_t* flag,
                  const std::uint32_t* at, std::uint64_t m, std::uint64_t overflow, std::uint64_t* spill,
                  std::uint32_t* spill_parts, std::uint64_t* total, const unsigned long long* first_bad) {
  if (refused(first_bad)) return;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t j = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < m; j += stride) {
    if (flag[j] != 0 && at[j] < overflow) {
      spill[at[j]] = sorted[j];
      spill_parts[at[j]] = part[j];
    }
    if (j + 1 == m) *total = static_cast<std::uint64_t>(at[j]) + flag[j];
  }
}

template <class = void>
__global__ __launch_bounds__(partition_policy::threads)
void member_kernel(std::uint64_t n, std::uint64_t seed, std::uint32_t parts, std::uint32_t p,
                   std::uint32_t* member) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    member[i] = partition::part_of(seed, i, parts) == p ? 1u : 0u;
  }
}

/// The member count of p: the last rank plus the last flag.
template <class = void>
__global__ __launch_bounds__(1)
void count_members_kernel(const std::uint32_t* member, const std::uint32_t* rank, std::uint64_t n,
                          std::uint64_t* members) {
  *members = static_cast<std::uint64_t>(rank[n - 1]) + member[n - 1];
}

template <class = void>
__global__ __launch_bounds__(partition_policy::threads)
void set_bits_kernel(const std::uint64_t* sorted, std::uint64_t m, std::uint64_t n, std::uint64_t seed,
                     std::uint32_t parts, std::uint32_t p, const std::uint32_t* rank,
                     unsigned long long* bits, std::uint64_t words, unsigned* bad) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t j = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < m; j += stride) {
    const std::uint64_t i = sorted[j];
    if (out_of_order(sorted, j, n)) {
      atomicOr(bad, not_increasing_or_out_of_range);
    } else if (partition::part_of(seed, i, parts) != p) {
      atomicOr(bad, not_a_member);
    } else if (rank[i] / 64 >= words) {
      atomicOr(bad, too_few_words);
    } else {
      atomicOr(bits + rank[i] / 64, 1ull << (rank[i] % 64));
    }
  }
}

/// selected[i]: member i of p whose bit is set; a set bit at or past the member count flags.
template <class = void>
__global__ __launch_bounds__(partition_policy::threads)
void selected_kernel(std::uint64_t n, const std::uint32_t* member, const std::uint32_t* rank,
                     const std::uint64_t* bits, std::uint64_t words, std::uint32_t* selected,
                     unsigned* bad) {
  const std::uint64_t members = n == 0 ? 0 : static_cast<std::uint64_t>(rank[n - 1]) + member[n - 1];
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::uint32_t r = rank[i];
    selected[i] = member[i] != 0 && r / 64 < words && ((bits[r / 64] >> (r % 64)) & 1) != 0 ? 1u : 0u;
  }
  for (std::uint64_t w = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < words; w += stride) {
    // Bits of word w at positions >= members must be clear.
    const std::uint64_t first_bit = w * 64;
    const std::uint64_t keep = members <= first_bit ? 0 : (members - first_bit >= 64 ? ~0ull : (1ull << (members - first_bit)) - 1);
    if ((bits[w] & ~keep) != 0) atomicOr(bad, bit_past_end);
  }
}

template <class = void>
__global__ __launch_bounds__(partition_policy::threads)
void gather_kernel(std::uint64_t n, const std::uint32_t* selected, const std::uint32_t* at,
                   std::uint64_t* out, std::uint64_t out_size, std::uint64_t* total) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (selected[i] != 0 && at[i] < out_size) out[at[i]] = i;
    if (i + 1 == n) *total = static_cast<std::uint64_t>(at[i]) + selected[i];
  }
}

}  // namespace partition_device

template <>
struct partition_backend<cuda> {

  static std::vector<std::uint64_t> loads(const hash::partition& z, cuda& exec, std::uint64_t n) {
    auto* load = reinterpret_cast<unsigned long long*>(exec.scratch(z.parts() * sizeof(std::uint64_t)));
    GRADZIP_CUDA_TRY(cudaMemsetAsync(load, 0, z.parts() * sizeof(std::uint64_t), exec.stream()));
    if (n != 0) {
      launch_over<partition_policy>(exec, n, partition_device::loads_kernel<>, n, z.seed(),
                                    z.parts(), load);
    }
    std::vector<std::uint64_t> out(z.parts());
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(out.data(), load, out.size() * sizeof(std::uint64_t), cudaMemcpyDeviceToHost,
                                     exec.stream()));
    exec.synchronize();
    return out;
  }

  static hash::partition::split_result split_fixed(const hash::partition& z, cuda& exec, span<const std::uint64_t> sorted,
                                                   std::uint64_t n, std::uint64_t capacity, std::uint64_t overflow,
                                                   span<std::uint64_t> slots, span<std::uint64_t> counts,
                                                   span<std::uint64_t> spill, span<std::uint32_t> spill_parts) {
    const std::uint64_t m = sorted.size();
    GRADZIP_EXPECTS(m < (std::uint64_t{1} << 32), "partition::split_fixed (cuda): at most 2^32 - 1 indices, got ", m);
    const std::uint32_t parts = z.parts();
    std::size_t sort_bytes = 0, scan_bytes = 0;
    GRADZIP_CUDA_TRY(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const std::uint32_t*>(nullptr),
                                                     static_cast<std::uint32_t*>(nullptr),
                                                     static_cast<const std::uint32_t*>(nullptr),
                                                     static_cast<std::uint32_t*>(nullptr), m, 0, radix_bits(parts),
                                                     exec.stream()));
    GRADZIP_CUDA_TRY(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, static_cast<const std::uint32_t*>(nullptr),
                                                   static_cast<std::uint32_t*>(nullptr), m, exec.stream()));
    // Scratch: part, position, sorted part, sorted position, flag, spill place (m words each);
    // first, end (parts each); total and the first bad index; CUB's.
    const std::size_t words = scratch_aligned(m * 4), runs = scratch_aligned(parts * 8);
    const std::size_t at_runs = 6 * words, at_scalars = at_runs + 2 * runs, at_temp = at_scalars + 256;
    std::byte* scratch = exec.scratch(at_temp + scratch_aligned(std::max(sort_bytes, scan_bytes)));
    auto word_array = [&](int k) { return reinterpret_cast<std::uint32_t*>(scratch + k * words); };
    std::uint32_t *part = word_array(0), *position = word_array(1), *sorted_part = word_array(2),
                  *sorted_position = word_array(3), *flag = word_array(4), *place = word_array(5);
    auto* first = reinterpret_cast<std::uint64_t*>(scratch + at_runs);
    auto* end = reinterpret_cast<std::uint64_t*>(scratch + at_runs + runs);
    auto* total = reinterpret_cast<std::uint64_t*>(scratch + at_scalars);
    auto* first_bad = reinterpret_cast<unsigned long long*>(scratch + at_scalars + 8);
    GRADZIP_CUDA_TRY(cudaMemsetAsync(scratch + at_runs, 0, 2 * runs + 8, exec.stream()));
    GRADZIP_CUDA_TRY(cudaMemsetAsync(first_bad, 0xFF, 8, exec.stream()));
    if (m != 0) {
      const unsigned grid = grid_for_policy<partition_policy>(exec, m);
      launch(partition_device::prepare_kernel<>, grid, partition_policy::threads,
             0, exec.stream(), sorted.data(), m, n, z.seed(), parts,
             part, position, first_bad);
      GRADZIP_CUDA_TRY(cub::DeviceRadixSort::SortPairs(scratch + at_temp, sort_bytes, part, sorted_part, position,
                                                       sorted_position, m, 0, radix_bits(parts), exec.stream()));
      launch(partition_device::runs_kernel<>, grid, partition_policy::threads,
             0, exec.stream(), sorted_part, m, first, end);
      launch(partition_device::place_kernel<>, grid, partition_policy::threads,
             0, exec.stream(), sorted.data(), sorted_part,
             sorted_position, m, first, capacity, slots.data(), flag, first_bad);
      GRADZIP_CUDA_TRY(cub::DeviceScan::ExclusiveSum(scratch + at_temp, scan_bytes, flag, place, m, exec.stream()));
      launch(partition_device::spill_kernel<>, grid, partition_policy::threads,
             0, exec.stream(), sorted.data(), part, flag, place, m,
             overflow, spill.data(), spill_parts.data(), total, first_bad);
    }
    launch_over<partition_policy>(exec, parts, partition_device::counts_kernel<>, first, end, parts,
                                  capacity, counts.data(), first_bad);
    // One wait for the total and the first bad index together; a refused input was not written
    // (the writing kernels returned at once), as on the host.
    std::uint64_t scalars[2] = {};
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(scalars, total, sizeof scalars, cudaMemcpyDeviceToHost, exec.stream()));
    exec.synchronize();
    refuse_bad_index(exec, sorted, n, scalars[1]);
    const std::uint64_t spilled = scalars[0];
    hash::partition::split_result r;
    r.overflowed = spilled < overflow ? spilled : overflow;
    r.unplaced = spilled - r.overflowed;
    return r;
  }

  static std::uint64_t encode_bitmap(const hash::partition& z, cuda& exec, std::uint32_t p, std::uint64_t n,
                                     span<const std::uint64_t> sorted, span<std::uint64_t> bits) {
    const bitmap_scratch s = ranks(z, exec, p, n);
    if (!bits.empty()) GRADZIP_CUDA_TRY(cudaMemsetAsync(bits.data(), 0, bits.size() * 8, exec.stream()));
    if (!sorted.empty()) {
      launch_over<partition_policy>(exec, sorted.size(), partition_device::set_bits_kernel<>,
                                    sorted.data(), sorted.size(), n, z.seed(), z.parts(), p, s.rank,
                                    reinterpret_cast<unsigned long long*>(bits.data()), bits.size(),
                                    s.bad);
    }
    const auto [members, flags] = read_scalars(exec, s.members, s.bad);
    GRADZIP_EXPECTS((flags & partition_device::too_few_words) == 0, "partition::encode_bitmap: ", bits.size(),
                    " words are too few");
    GRADZIP_EXPECTS(flags == 0, "partition::encode_bitmap: an index is not a member of part ", p,
                    " (or not increasing, or not < n)");
    return members;
  }

  static std::uint64_t decode_bitmap(const hash::partition& z, cuda& exec, std::uint32_t p, std::uint64_t n,
                                     span<const std::uint64_t> bits, span<std::uint64_t> out) {
    const bitmap_scratch s = ranks(z, exec, p, n);
    // Always: with n = 0 every set bit is past the end.
    const unsigned grid = grid_for_policy<partition_policy>(exec, std::max<std::uint64_t>(n, bits.size()));
    launch(partition_device::selected_kernel<>, grid, partition_policy::threads,
           0, exec.stream(), n, s.member, s.rank, bits.data(),
           bits.size(), s.selected, s.bad);
    if (n != 0) {
      std::size_t temp = s.temp_bytes;
      GRADZIP_CUDA_TRY(cub::DeviceScan::ExclusiveSum(s.temp, temp, s.selected, s.at, n, exec.stream()));
      launch_over<partition_policy>(exec, n, partition_device::gather_kernel<>, n, s.selected, s.at,
                                    out.data(), out.size(), s.total);
    }
    const auto [selected, flags] = read_scalars(exec, s.total, s.bad);
    if ((flags & partition_device::bit_past_end) != 0) {
      throw format_error(wire::format_errc::bitmap_bit_past_end,
                         concat("partition::decode_bitmap: a bit is set past part ", p, "'s members"));
    }
    GRADZIP_EXPECTS(selected <= out.size(), "partition::decode_bitmap: the output holds ", out.size(), " indices, ",
                    selected, " are set");
    return selected;
  }

 private:

  struct scalars {
    std::uint64_t value;
    unsigned flags;
  };
  /// One word of device memory, after the stream's work so far.
  template <class T>
  static T read_word(cuda& exec, const T* word) {
    T value{};
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(&value, word, sizeof(T), cudaMemcpyDeviceToHost, exec.stream()));
    exec.synchronize();
    return value;
  }

  /// Throws the host's error for split_fixed's first bad index j, if prepare_kernel found one
  /// (j is ~0 where not).
  static void refuse_bad_index(cuda& exec, span<const std::uint64_t> sorted, std::uint64_t n, std::uint64_t j) {
    if (j == ~std::uint64_t{0}) return;
    const std::uint64_t value = read_word(exec, sorted.data() + j);
    const std::uint64_t previous = j == 0 ? 0 : read_word(exec, sorted.data() + j - 1);
    hash::partition::refuse_split_index(j, value, previous, n);
  }

  static scalars read_scalars(cuda& exec, const std::uint64_t* value, const unsigned* flags) {
    scalars s{};
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(&s.value, value, 8, cudaMemcpyDeviceToHost, exec.stream()));
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(&s.flags, flags, 4, cudaMemcpyDeviceToHost, exec.stream()));
    exec.synchronize();
    return s;
  }

  struct bitmap_scratch {
    std::uint32_t *member, *rank, *selected, *at;
    std::uint64_t *members, *total;
    unsigned* bad;
    std::byte* temp;
    std::size_t temp_bytes;
  };

  /// Member flags and ranks over [0, n) for part p, in fresh scratch; `members` is p's count.
  static bitmap_scratch ranks(const hash::partition& z, cuda& exec, std::uint32_t p, std::uint64_t n) {
    GRADZIP_EXPECTS(p < z.parts(), "partition: part ", p, " of ", z.parts());
    GRADZIP_EXPECTS(n < (std::uint64_t{1} << 32), "partition: the CUDA hash bitmap handles n below 2^32, got ", n);
    std::size_t temp_bytes = 0;
    GRADZIP_CUDA_TRY(cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes, static_cast<const std::uint32_t*>(nullptr),
                                                   static_cast<std::uint32_t*>(nullptr), n, exec.stream()));
    const std::size_t words = scratch_aligned(n * 4), at_scalars = 4 * words, at_temp = at_scalars + 256;
    std::byte* scratch = exec.scratch(at_temp + scratch_aligned(temp_bytes));
    bitmap_scratch s{};
    s.member = reinterpret_cast<std::uint32_t*>(scratch);
    s.rank = reinterpret_cast<std::uint32_t*>(scratch + words);
    s.selected = reinterpret_cast<std::uint32_t*>(scratch + 2 * words);
    s.at = reinterpret_cast<std::uint32_t*>(scratch + 3 * words);
    s.members = reinterpret_cast<std::uint64_t*>(scratch + at_scalars);
    s.total = reinterpret_cast<std::uint64_t*>(scratch + at_scalars + 8);
    s.bad = reinterpret_cast<unsigned*>(scratch + at_scalars + 16);
    s.temp = scratch + at_temp;
    s.temp_bytes = temp_bytes;
    GRADZIP_CUDA_TRY(cudaMemsetAsync(scratch + at_scalars, 0, 256, exec.stream()));
    if (n != 0) {
      launch_over<partition_policy>(exec, n, partition_device::member_kernel<>, n, z.seed(),
                                    z.parts(), p, s.member);
      std::size_t temp = temp_bytes;
      GRADZIP_CUDA_TRY(cub::DeviceScan::ExclusiveSum(s.temp, temp, s.member, s.rank, n, exec.stream()));
      launch(partition_device::count_members_kernel<>, 1, 1, 0, exec.stream(), s.member, s.rank, n, s.members);
    }
    return s;
  }
};

}  // namespace gradzip::detail
