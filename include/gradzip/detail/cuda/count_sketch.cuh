// count_sketch_backend<cuda>: a deterministic Count Sketch on the GPU, with no float atomics.
//
// The format sums each column over each half of the elements in increasing element order, then
// adds the two (`count_sketch::half_point`, the host's loops). Per row, one pass writes every
// element's (2 column + half, signed value); a stable radix sort by that key (CUB's LSD sort
// keeps equal keys in input order, that is in element order); then one thread per column adds
// its two runs of sorted values from 0.0f, in order, and the two sums: the host's float
// operations exactly, so the bytes are the host's. Cost per row: the input read once, the sort
// (about three passes over 8 n bytes for up to 2^23 columns) and a read of the sorted values;
// scratch 16 bytes per element plus CUB's. The alternative the issue mentions, a bucket ->
// elements layout computed once and reused every step, would skip the sort at the price of
// 4 n bytes per row kept alive.
#pragma once

#include <cub/device/device_radix_sort.cuh>

#include "gradzip/sketch/count_sketch.hpp"

namespace gradzip::detail {

namespace count_sketch_device {

using cs = sketch::count_sketch;

template <class = void>
__global__ __launch_bounds__(1)
void frame_kernel(std::uint8_t* base, std::uint64_t n, std::uint32_t rows, std::uint64_t columns,
                  std::uint64_t seed) {
  cs::write_frame(base, n, rows, columns, seed);
}

template <class T>
__global__ __launch_bounds__(block_threads)
void column_and_value_kernel(const T* x, std::uint64_t n, multiply_shift f, std::uint64_t columns,
                             std::uint32_t* key, float* value) {
  const std::uint64_t middle = cs::half_point(n);
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::uint32_t h = f(i);
    key[i] = static_cast<std::uint32_t>(2 * cs::bucket_of(h, columns) + (i >= middle ? 1 : 0));
    value[i] = cs::apply_sign(static_cast<float>(to_float(x[i])), h);
  }
}

/// First position in sorted[0, n) whose key is >= c.
__device__ inline std::uint64_t lower_bound(const std::uint32_t* sorted, std::uint64_t n, std::uint64_t c) {
  std::uint64_t lo = 0, hi = n;
  while (lo < hi) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    if (sorted[mid] < c) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

/// The sum from 0.0f, in order, of the sorted values whose key is `key`.
__device__ inline float run_sum(const std::uint32_t* sorted_key, const float* sorted_value, std::uint64_t n,
                                std::uint64_t key) {
  const std::uint64_t end = lower_bound(sorted_key, n, key + 1);
  float sum = 0.0f;
  for (std::uint64_t j = lower_bound(sorted_key, n, key); j < end; ++j) sum += sorted_value[j];
  return sum;
}

template <class = void>
__global__ __launch_bounds__(block_threads)
void column_sums_kernel(const std::uint32_t* sorted_key, const float* sorted_value, std::uint64_t n,
                        std::uint64_t columns, float* row) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t c = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < columns; c += stride) {
    const float first = run_sum(sorted_key, sorted_value, n, 2 * c);
    row[c] = first + run_sum(sorted_key, sorted_value, n, 2 * c + 1);
  }
}

/// Parses and checks a sketch of (rows, columns, seed) and, unless `n` is null, n elements;
/// `table` receives the table's offset and `count` the element count.
__device__ inline wire::status check_sketch(const std::uint8_t* bytes, std::uint64_t size, const std::uint64_t* n,
                                            std::uint32_t rows, std::uint64_t columns, std::uint64_t seed,
                                            std::uint64_t& table, std::uint64_t& count) {
  wire::header h;
  wire::status s = wire::parse_header(bytes, size, h);
  if (s.ok()) s = cs::check_frame(h, bytes, n, rows, columns, seed, table);
  count = h.element_count;
  return s;
}

/// Thread 0 of each block parses and checks the sketch; failures go to `st` unless it is null.
__device__ inline bool parse_table(const std::uint8_t* bytes, std::uint64_t size, std::uint64_t n, std::uint32_t rows,
                                   std::uint64_t columns, std::uint64_t seed, std::uint64_t& table, wire::status* st) {
  __shared__ std::uint64_t offset;
  const bool ok = check_in_block(
      [&] {
        std::uint64_t count = 0;
        return check_sketch(bytes, size, &n, rows, columns, seed, offset, count);
      },
      st);
  table = offset;
  return ok;
}

template <class = void>
__global__ __launch_bounds__(32)
void validate_kernel(const std::uint8_t* bytes, std::uint64_t size, std::uint64_t n, std::uint32_t rows,
                     std::uint64_t columns, std::uint64_t seed, wire::status* st) {
  std::uint64_t table = 0;
  parse_table(bytes, size, n, rows, columns, seed, table, st);
}

/// Both sketches of a merge: this configuration, and the same n (that of `into`).
__device__ inline bool parse_pair(const std::uint8_t* into, std::uint64_t into_size, const std::uint8_t* other,
                                  std::uint64_t other_size, std::uint32_t rows, std::uint64_t columns, std::uint64_t seed,
                                  std::uint64_t& into_table, std::uint64_t& other_table, wire::status* st) {
  __shared__ std::uint64_t offsets[2];
  const bool ok = check_in_block(
      [&] {
        std::uint64_t n = 0, other_n = 0;
        wire::status s = check_sketch(into, into_size, nullptr, rows, columns, seed, offsets[0], n);
        if (s.ok()) s = check_sketch(other, other_size, &n, rows, columns, seed, offsets[1], other_n);
        return s;
      },
      st);
  into_table = offsets[0];
  other_table = offsets[1];
  return ok;
}

template <class = void>
__global__ __launch_bounds__(32)
void validate_pair_kernel(const std::uint8_t* into, std::uint64_t into_size, const std::uint8_t* other,
                          std::uint64_t other_size, std::uint32_t rows, std::uint64_t columns,
                          std::uint64_t seed, wire::status* st) {
  std::uint64_t a = 0, b = 0;
  parse_pair(into, into_size, other, other_size, rows, columns, seed, a, b, st);
}

/// into's table += other's, cell by cell (after validate_pair_kernel; nothing on a failure).
template <class = void>
__global__ __launch_bounds__(block_threads)
void merge_kernel(std::uint8_t* into, std::uint64_t into_size, const std::uint8_t* other,
                  std::uint64_t other_size, std::uint32_t rows, std::uint64_t columns, std::uint64_t seed,
                  const wire::status* st) {
  if (st->code != wire::format_errc::ok) return;
  std::uint64_t a = 0, b = 0;
  if (!parse_pair(into, into_size, other, other_size, rows, columns, seed, a, b, nullptr)) return;
  auto* to = reinterpret_cast<float*>(into + a);
  const auto* from = reinterpret_cast<const float*>(other + b);
  const std::uint64_t cells = static_cast<std::uint64_t>(rows) * columns;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t j = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < cells; j += stride) {
    to[j] += from[j];
  }
}

template <class T>
__global__ __launch_bounds__(block_threads)
void estimate_kernel(const std::uint8_t* bytes, std::uint64_t size, T* out, std::uint64_t n, std::uint32_t rows,
                     std::uint64_t columns, std::uint64_t seed, const wire::status* st) {
  if (st->code != wire::format_errc::ok) return;  // validation (or an earlier decode) failed: change nothing
  std::uint64_t table = 0;
  if (!parse_table(bytes, size, n, rows, columns, seed, table, nullptr)) return;
  const auto* cells = reinterpret_cast<const float*>(bytes + table);
  multiply_shift f[cs::max_rows];
  cs::row_hashes(seed, rows, f);
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float row_values[cs::max_rows];
    for (std::uint32_t r = 0; r < rows; ++r) {
      const std::uint32_t h = f[r](i);
      row_values[r] = cs::apply_sign(cells[r * columns + cs::bucket_of(h, columns)], h);
    }
    out[i] = from_double<T>(cs::median(row_values, rows));
  }
}

}  // namespace count_sketch_device

template <>
struct count_sketch_backend<cuda> {

  struct scratch_layout {
    std::size_t key, sorted_key, value, sorted_value, sort_temp, sort_temp_bytes, total;
  };
  static scratch_layout layout_for(const sketch::count_sketch& s, cuda& exec, std::uint64_t n) {
    std::size_t temp = 0;
    GRADZIP_CUDA_TRY(cub::DeviceRadixSort::SortPairs(nullptr, temp, static_cast<const std::uint32_t*>(nullptr),
                                                     static_cast<std::uint32_t*>(nullptr), static_cast<const float*>(nullptr),
                                                     static_cast<float*>(nullptr), n, 0, radix_bits(2 * s.columns()),
                                                     exec.stream()));
    scratch_layout l{};
    const std::size_t words = scratch_aligned(n * 4);
    l.key = 0;
    l.sorted_key = words;
    l.value = 2 * words;
    l.sorted_value = 3 * words;
    l.sort_temp = 4 * words;
    l.sort_temp_bytes = temp;
    l.total = l.sort_temp + scratch_aligned(temp);
    return l;
  }

  template <class T>
  static std::size_t workspace_bytes(const sketch::count_sketch& s, cuda& exec, std::size_t n) {
    return layout_for(s, exec, n).total;
  }

  template <class T>
  static std::size_t compress(const sketch::count_sketch& s, cuda& exec, span<const T> x, span<std::byte> out) {
    const wire::payload_layout l = s.layout();
    GRADZIP_EXPECTS(out.size() >= l.total_bytes(), "count_sketch::compress: output holds ", out.size(),
                    " bytes, the sketch needs ", l.total_bytes());
    require_aligned(out.data(), "count_sketch::compress");
    auto* base = reinterpret_cast<std::uint8_t*>(out.data());
    const std::uint64_t n = x.size();
    launch(count_sketch_device::frame_kernel<>, 1, 1, 0, exec.stream(), base, n, s.rows(), s.columns(), s.seed());
    const scratch_layout sl = layout_for(s, exec, n);
    std::byte* scratch = exec.scratch(sl.total);
    auto* key = reinterpret_cast<std::uint32_t*>(scratch + sl.key);
    auto* sorted_key = reinterpret_cast<std::uint32_t*>(scratch + sl.sorted_key);
    auto* value = reinterpret_cast<float*>(scratch + sl.value);
    auto* sorted_value = reinterpret_cast<float*>(scratch + sl.sorted_value);
    auto* table = reinterpret_cast<float*>(base + l.at(1).offset);
    for (std::uint32_t r = 0; r < s.rows(); ++r) {
      if (n > 0) {
        launch(count_sketch_device::column_and_value_kernel<T>, grid_for(exec, n), block_threads, 0, exec.stream(), x.data(),
               n, sketch::count_sketch::row_hash(s.seed(), r), s.columns(), key, value);
        std::size_t temp = sl.sort_temp_bytes;
        GRADZIP_CUDA_TRY(cub::DeviceRadixSort::SortPairs(scratch + sl.sort_temp, temp, key, sorted_key, value,
                                                         sorted_value, n, 0, radix_bits(2 * s.columns()), exec.stream()));
      }
      launch(count_sketch_device::column_sums_kernel<>, grid_for(exec, s.columns()), block_threads, 0, exec.stream(),
             sorted_key, sorted_value, n, s.columns(), table + static_cast<std::uint64_t>(r) * s.columns());
    }
    return l.total_bytes();
  }

  static void merge(const sketch::count_sketch& s, cuda& exec, span<std::byte> into, span<const std::byte> other) {
    require_aligned(into.data(), "count_sketch::merge");
    require_aligned(other.data(), "count_sketch::merge");
    auto* a = reinterpret_cast<std::uint8_t*>(into.data());
    const auto* b = reinterpret_cast<const std::uint8_t*>(other.data());
    launch(count_sketch_device::validate_pair_kernel<>, 1, 32, 0, exec.stream(), a, into.size(), b, other.size(),
           s.rows(), s.columns(), s.seed(), exec.status_word());
    const std::uint64_t cells = static_cast<std::uint64_t>(s.rows()) * s.columns();
    launch(count_sketch_device::merge_kernel<>, grid_for(exec, cells), block_threads, 0, exec.stream(), a, into.size(), b,
           other.size(), s.rows(), s.columns(), s.seed(), exec.status_word());
  }

  /// estimate into scratch (zeroed first, so a bad sketch gives a well-formed payload of zeros
  /// beside the status word's failure), then the CUDA top-k of the estimates.
  static std::size_t unsketch(const sketch::count_sketch& s, cuda& exec, span<const std::byte> sketch, std::uint64_t n,
                              std::uint64_t k, span<std::byte> out) {
    sketch::count_sketch::expect_unsketch_size(n);  // n is the caller's; the device checks the payload's
    const codec<sparsify::topk> top{sparsify::topk::count(k)};
    // Scratch: top-k's own, then the n estimates (sized together: growing discards contents).
    const std::size_t at = scratch_aligned(top.workspace_bytes<float>(exec, n));
    auto* estimates = reinterpret_cast<float*>(exec.scratch(at + n * sizeof(float)) + at);
    if (n != 0) GRADZIP_CUDA_TRY(cudaMemsetAsync(estimates, 0, n * sizeof(float), exec.stream()));
    estimate(s, exec, sketch, span<float>(estimates, n));
    return top.compress(exec, span<const float>(estimates, n), out);
  }

  template <class T>
  static void estimate(const sketch::count_sketch& s, cuda& exec, span<const std::byte> sketch, span<T> estimates) {
    require_aligned(sketch.data(), "count_sketch::estimate");
    launch(count_sketch_device::validate_kernel<>, 1, 32, 0, exec.stream(),
           reinterpret_cast<const std::uint8_t*>(sketch.data()), sketch.size(), estimates.size(), s.rows(), s.columns(),
           s.seed(), exec.status_word());
    launch(count_sketch_device::estimate_kernel<T>, grid_for(exec, estimates.size()), block_threads, 0, exec.stream(),
           reinterpret_cast<const std::uint8_t*>(sketch.data()), sketch.size(), estimates.data(), estimates.size(),
           s.rows(), s.columns(), s.seed(), exec.status_word());
  }
};

}  // namespace gradzip::detail
