// count_sketch_backend<cuda>: the Count Sketch on the GPU, exact and order-free.
//
// Cells are fixed-point sums (detail/fixed_point.hpp, count_sketch.hpp): integers add in any
// order, so one pass of 64-bit integer atomics gives the host's cells whatever the schedule.
// Per sketch: a magnitude pass (the largest finite |value|, one atomicMax per block), one pass
// that adds each element's fixed point into its cell of every row (one atomic per row, none
// for a zero; a non-finite element sets its cells' poison bits instead), and one pass over the
// cells that rounds them to fp32 into the payload. The input is read twice whatever the row
// count; scratch is 8 bytes per cell plus a bit per cell. docs/performance.md has the model.
#pragma once

#include <cub/block/block_reduce.cuh>
#include <utility>

#include "gradzip/detail/cuda/status_word.cuh"
#include "gradzip/detail/cuda/vector_load.cuh"
#include "gradzip/sketch/count_sketch.hpp"

namespace gradzip::detail {

namespace count_sketch_device {

using cs = sketch::count_sketch;
using gradzip::detail::fixed_point;

/// The passes over x: a run of 8 consecutive elements per thread and step (load_floats).
using input_policy = launch_policy<256, 8, 8>;
/// The passes over the cells (rounding, merge) and over the estimates: one per thread and step.
using cell_policy = launch_policy<256, 1, 8>;

template <class = void>
__global__ __launch_bounds__(1)
void frame_kernel(std::uint8_t* base, std::uint64_t n, std::uint32_t rows, std::uint64_t columns,
                  std::uint64_t seed) {
  cs::write_frame(base, n, rows, columns, seed);
}

/// Every row's multiply-shift function, in shared memory: each thread of the block reads row r's
/// words at the same address (a broadcast). A per-thread array indexed by a run-time row would
/// sit in local memory, stored per thread and loaded per element and row.
struct row_hash_table {
  std::uint64_t words[3 * cs::max_rows];  // row r's (a0, a1, b)

  /// Every thread of the block calls it (it synchronizes); blockDim.x >= rows.
  __device__ void load(std::uint64_t seed, std::uint32_t rows) {
    if (threadIdx.x < rows) {
      const multiply_shift f = cs::row_hash(seed, threadIdx.x);
      words[3 * threadIdx.x] = f.a0;
      words[3 * threadIdx.x + 1] = f.a1;
      words[3 * threadIdx.x + 2] = f.b;
    }
    __syncthreads();
  }
  __device__ multiply_shift operator[](std::uint32_t r) const { return {words[3 * r], words[3 * r + 1], words[3 * r + 2]}; }
};
static_assert(cell_policy::threads >= cs::max_rows && input_policy::threads >= cs::max_rows,
              "row_hash_table::load: a thread per row");

/// max(a, b) for cub::BlockReduce.
struct max_op {
  __device__ std::uint32_t operator()(std::uint32_t a, std::uint32_t b) const { return a > b ? a : b; }
};

static_assert(input_policy::items_per_thread == 8, "the input passes take runs of 8 (run_at, load_floats)");

/// *max_bits <- max(*max_bits, the largest finite |value|'s bits in x): one atomic per block.
template <class T>
__global__ __launch_bounds__(input_policy::threads)
void magnitude_kernel(const T* x, std::uint64_t n, std::uint32_t* max_bits) {
  using reduce = cub::BlockReduce<std::uint32_t, input_policy::threads>;
  __shared__ typename reduce::TempStorage storage;
  std::uint32_t largest = 0;
  const std::uint64_t runs = (n + 7) / 8, stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t run = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; run < runs; run += stride) {
    const run_of_8 r = run_at(run, n);
    float v[8];
    load_floats(x, r.first, r.valid, v);  // 0 past the end: no effect on the max
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const std::uint32_t a = fixed_point::finite_magnitude(v[i]);
      largest = a > largest ? a : largest;
    }
  }
  const std::uint32_t block_largest = reduce(storage).Reduce(largest, max_op{});
  if (threadIdx.x == 0 && block_largest != 0) atomicMax(max_bits, block_largest);
}

/// cells[r][h_r(i)] += s_r(i) q_i for every row r and element i (64-bit two's complement in
/// unsigned atomics); a non-finite element sets its cells' bits in `poison` instead.
template <class T>
__global__ __launch_bounds__(input_policy::threads)
void accumulate_kernel(const T* x, std::uint64_t n, const std::uint32_t* max_bits, std::uint64_t seed,
                       std::uint32_t rows, std::uint64_t columns, unsigned long long* cells, std::uint32_t* poison) {
  __shared__ row_hash_table hashes;
  hashes.load(seed, rows);
  const fixed_point fp = fixed_point::for_values(*max_bits, n);
  const std::uint64_t runs = (n + 7) / 8, stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t run = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; run < runs; run += stride) {
    const run_of_8 e = run_at(run, n);
    float v[8];
    load_floats(x, e.first, e.valid, v);
    // Unrolled, so that v[k] is a register: a loop to e.valid indexed v at run time, which put it
    // in local memory on sm_100 (a 32-byte stack frame).
#pragma unroll
    for (unsigned k = 0; k < 8; ++k) {
      if (k >= e.valid) break;
      const bool finite = gradzip::is_finite(v[k]);
      const std::int32_t q = finite ? fp.to_fixed(v[k]) : 0;
      if (finite && q == 0) continue;  // adds nothing
      const std::uint64_t i = e.first + k;
      for (std::uint32_t r = 0; r < rows; ++r) {
        const std::uint32_t h = hashes[r](i);
        const std::uint64_t cell = r * columns + cs::bucket_of(h, columns);
        if (finite) {
          atomicAdd(cells + cell, static_cast<unsigned long long>(cs::signed_fixed(q, h)));
        } else {
          atomicOr(poison + cell / 32, 1u << (cell % 32));
        }
      }
    }
  }
}

/// The payload's fp32 table from the integer cells: each rounded once, poisoned ones NaN.
template <class = void>
__global__ __launch_bounds__(cell_policy::threads)
void round_cells_kernel(const unsigned long long* cells, const std::uint32_t* poison, const std::uint32_t* max_bits,
                        std::uint64_t n, std::uint64_t count, float* table) {
  const fixed_point fp = fixed_point::for_values(*max_bits, n);
  const std::uint32_t nan_bits = cs::poisoned_cell;  // a copy: device code cannot bind the member
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t j = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < count; j += stride) {
    const bool poisoned = ((poison[j / 32] >> (j % 32)) & 1u) != 0;
    table[j] = poisoned ? bit_cast<float>(nan_bits) : fp.to_float(static_cast<std::int64_t>(cells[j]));
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

/// Validates a merge's pair; when the merge will run, unseals `into` (the host's merge does too:
/// its CRC would be stale). merge_kernel's blocks parse the header after this kernel, unsealed.
template <class = void>
__global__ __launch_bounds__(32)
void validate_pair_kernel(std::uint8_t* into, std::uint64_t into_size, const std::uint8_t* other,
                          std::uint64_t other_size, std::uint32_t rows, std::uint64_t columns,
                          std::uint64_t seed, wire::status* st) {
  std::uint64_t a = 0, b = 0;
  if (parse_pair(into, into_size, other, other_size, rows, columns, seed, a, b, st) && threadIdx.x == 0 && !failure_recorded(st)) {
    wire::unseal(into);
  }
}

/// into's table += other's, cell by cell (after validate_pair_kernel; nothing on a failure).
template <class = void>
__global__ __launch_bounds__(cell_policy::threads)
void merge_kernel(std::uint8_t* into, std::uint64_t into_size, const std::uint8_t* other,
                  std::uint64_t other_size, std::uint32_t rows, std::uint64_t columns, std::uint64_t seed,
                  const wire::status* st) {
  if (failure_recorded(st)) return;
  std::uint64_t a = 0, b = 0;
  if (!parse_pair(into, into_size, other, other_size, rows, columns, seed, a, b, nullptr)) return;
  auto* to = reinterpret_cast<float*>(into + a);
  const auto* from = reinterpret_cast<const float*>(other + b);
  const std::uint64_t cells = static_cast<std::uint64_t>(rows) * columns;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t j = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < cells; j += stride) {
    to[j] = cs::sum_cells(to[j], from[j]);  // a NaN as the host writes it
  }
}

/// Row counts up to this one get an estimate kernel of their own, whose row values and median
/// network are registers; more rows (up to cs::max_rows) share one whose values are in local
/// memory, the row count being a run-time value there.
inline constexpr std::uint32_t unrolled_rows = 7;

/// The median over `rows` (R when R != 0) of s_r(i) table[r][h_r(i)]: the host's network of
/// compare-exchanges (count_sketch::median), so the same float, NaN included.
template <std::uint32_t R>
__device__ inline float median_estimate(const float* cells, const row_hash_table& hashes, std::uint32_t rows,
                                        std::uint64_t columns, std::uint64_t i) {
  const auto value = [&](std::uint32_t r) {
    const std::uint32_t h = hashes[r](i);
    return cs::apply_sign(cells[r * columns + cs::bucket_of(h, columns)], h);
  };
  if constexpr (R != 0) {
    float v[R];
#pragma unroll
    for (std::uint32_t r = 0; r < R; ++r) v[r] = value(r);
    return cs::median(v, R);
  } else {
    float v[cs::max_rows];
    for (std::uint32_t r = 0; r < rows; ++r) v[r] = value(r);
    return cs::median(v, rows);
  }
}

/// The estimate kernels' register budget: 64 per thread at 256 threads (4 blocks per SM, 50 %
/// occupancy). Without it, ptxas gave 7 rows 64 registers and 8 rows 74 (3 blocks; 8 rows spill
/// under the budget, so they take the run-time kernel).
inline constexpr unsigned estimate_min_blocks_per_sm = 4;

/// out[i] <- element i's estimate; R: the row count when it is at most unrolled_rows, else 0.
template <class T, std::uint32_t R>
__global__ __launch_bounds__(cell_policy::threads, estimate_min_blocks_per_sm)
void estimate_kernel(const std::uint8_t* bytes, std::uint64_t size, T* out, std::uint64_t n, std::uint32_t rows,
                     std::uint64_t columns, std::uint64_t seed, const wire::status* st) {
  static_assert(R <= unrolled_rows, "estimate_kernel: R is 0 or a row count up to unrolled_rows");
  if (failure_recorded(st)) return;  // validation (or an earlier decode) failed: change nothing
  std::uint64_t table = 0;
  if (!parse_table(bytes, size, n, rows, columns, seed, table, nullptr)) return;
  const auto* cells = reinterpret_cast<const float*>(bytes + table);
  __shared__ row_hash_table hashes;
  hashes.load(seed, rows);
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = from_double<T>(median_estimate<R>(cells, hashes, rows, columns, i));
  }
}

/// The estimate kernel for this many rows.
template <class T, std::uint32_t... R>
constexpr auto estimate_kernel_for(std::uint32_t rows, std::integer_sequence<std::uint32_t, R...>) {
  using kernel = void (*)(const std::uint8_t*, std::uint64_t, T*, std::uint64_t, std::uint32_t, std::uint64_t,
                          std::uint64_t, const wire::status*);
  kernel k = estimate_kernel<T, 0>;
  ((rows == R + 1 ? (k = estimate_kernel<T, R + 1>, 0) : 0), ...);
  return k;
}

}  // namespace count_sketch_device

template <>
struct count_sketch_backend<cuda> {
  using input = count_sketch_device::input_policy;
  using cells_policy = count_sketch_device::cell_policy;

  /// Scratch: the 64-bit cells, the poison bits, then the magnitude word; zeroed together.
  struct scratch_layout {
    std::size_t cells, poison, max_bits, total;
  };
  static scratch_layout layout_for(const sketch::count_sketch& s) {
    const std::uint64_t count = static_cast<std::uint64_t>(s.rows()) * s.columns();
    scratch_layout l{};
    l.cells = 0;
    l.poison = scratch_aligned(count * sizeof(unsigned long long));
    l.max_bits = l.poison + scratch_aligned((count + 31) / 32 * sizeof(std::uint32_t));
    l.total = l.max_bits + scratch_aligned(sizeof(std::uint32_t));
    return l;
  }

  template <class T>
  static std::size_t workspace_bytes(const sketch::count_sketch& s, cuda&, std::size_t) {
    return layout_for(s).total;
  }

  template <class T>
  static std::size_t compress(const sketch::count_sketch& s, cuda& exec, span<const T> x, span<std::byte> out) {
    const wire::payload_layout l = s.layout();
    GRADZIP_EXPECTS(out.size() >= l.total_bytes(), "count_sketch::compress: output holds ", out.size(),
                    " bytes, the sketch needs ", l.total_bytes());
    require_aligned(out.data(), "count_sketch::compress");
    sketch::count_sketch::expect_sketch_size(x.size());
    auto* base = reinterpret_cast<std::uint8_t*>(out.data());
    const std::uint64_t n = x.size(), count = static_cast<std::uint64_t>(s.rows()) * s.columns();
    launch(count_sketch_device::frame_kernel<>, 1, 1, 0, exec.stream(), base, n, s.rows(), s.columns(), s.seed());
    const scratch_layout sl = layout_for(s);
    std::byte* scratch = exec.scratch(sl.total);
    GRADZIP_CUDA_TRY(cudaMemsetAsync(scratch, 0, sl.total, exec.stream()));
    auto* cells = reinterpret_cast<unsigned long long*>(scratch + sl.cells);
    auto* poison = reinterpret_cast<std::uint32_t*>(scratch + sl.poison);
    auto* max_bits = reinterpret_cast<std::uint32_t*>(scratch + sl.max_bits);
    if (n > 0) {
      launch_over<input>(exec, n, count_sketch_device::magnitude_kernel<T>, x.data(), n, max_bits);
      launch_over<input>(exec, n, count_sketch_device::accumulate_kernel<T>, x.data(), n,
                         static_cast<const std::uint32_t*>(max_bits), s.seed(), s.rows(),
                         s.columns(), cells, poison);
    }
    launch_over<cells_policy>(exec, count, count_sketch_device::round_cells_kernel<>,
                              static_cast<const unsigned long long*>(cells),
                              static_cast<const std::uint32_t*>(poison),
                              static_cast<const std::uint32_t*>(max_bits), n, count,
                              reinterpret_cast<float*>(base + l.at(1).offset));
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
    launch_over<cells_policy>(exec, cells, count_sketch_device::merge_kernel<>, a, into.size(), b,
                              other.size(), s.rows(), s.columns(), s.seed(), exec.status_word());
  }

  /// estimate into scratch (zeroed first, so a bad sketch gives a well-formed payload of zeros
  /// beside the status word's failure), then the CUDA top-k of the estimates.
  static std::size_t unsketch(const sketch::count_sketch& s, cuda& exec, span<const std::byte> sketch, std::uint64_t n,
                              std::uint64_t k, span<std::byte> out) {
    sketch::count_sketch::expect_unsketch_size(n);  // n is the caller's; the device checks the payload's
    sketch::count_sketch::expect_unsketch_count(n, k);
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
    const auto kernel = count_sketch_device::estimate_kernel_for<T>(
        s.rows(), std::make_integer_sequence<std::uint32_t, count_sketch_device::unrolled_rows>{});
    launch_over<cells_policy>(exec, estimates.size(), kernel,
                              reinterpret_cast<const std::uint8_t*>(sketch.data()), sketch.size(),
                              estimates.data(), estimates.size(), s.rows(), s.columns(), s.seed(),
                              exec.status_word());
  }
};

}  // namespace gradzip::detail
