// fetchsgd_backend<cuda>: FetchSGD's per-step cell update and the zeroing of sent cells on the
// GPU, both stream-ordered. The summed sketch is validated on the device first (a failure goes
// to the status word, and neither kernel changes the state after one). The cell update is
// fetchsgd::accumulate, the host's fmaf sequence, so the state stays the host's bit for bit.
#pragma once

#include "gradzip/detail/cuda/status_word.cuh"
#include "gradzip/detail/cuda/count_sketch.cuh"
#include "gradzip/sketch/fetchsgd.hpp"

namespace gradzip::detail {

/// FetchSGD's sketch-space updates: one cell or element per thread and grid-stride step.
using fetchsgd_policy = launch_policy<256, 1, 8>;
static_assert(fetchsgd_policy::threads >= sketch::count_sketch::max_rows, "row_hash_table::load: a thread per row");

namespace fetchsgd_device {

using cs = sketch::count_sketch;

template <class = void>
__global__ __launch_bounds__(fetchsgd_policy::threads)
void accumulate_kernel(const std::uint8_t* summed, std::uint64_t size, std::uint64_t n,
                       std::uint32_t rows, std::uint64_t columns, std::uint64_t seed, float* velocity,
                       float* error, float momentum, float scale, float lr, const wire::status* st) {
  if (failure_recorded(st)) return;
  std::uint64_t table = 0;
  if (!count_sketch_device::parse_table(summed, size, n, rows, columns, seed, table, nullptr)) return;
  const auto* incoming = reinterpret_cast<const float*>(summed + table);
  const std::uint64_t cells = static_cast<std::uint64_t>(rows) * columns;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t j = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < cells; j += stride) {
    const auto c = sketch::fetchsgd<cuda>::accumulate({velocity[j], error[j]}, incoming[j], momentum, scale, lr);
    velocity[j] = c.velocity;
    error[j] = c.error;
  }
}

/// Zeroes the cells of every nonzero coordinate of delta. Coordinates that share a cell write
/// the same zero; atomicExch keeps that free of data races.
template <class = void>
__global__ __launch_bounds__(fetchsgd_policy::threads)
void forget_sent_kernel(const float* delta, std::uint64_t n, std::uint32_t rows, std::uint64_t columns,
                        std::uint64_t seed, float* velocity, float* error, const wire::status* st) {
  if (failure_recorded(st)) return;
  __shared__ count_sketch_device::row_hash_table hashes;
  hashes.load(seed, rows);
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (delta[i] == 0.0f) continue;
    for (std::uint32_t r = 0; r < rows; ++r) {
      const std::uint64_t j = r * columns + cs::bucket_of(hashes[r](i), columns);
      atomicExch(velocity + j, 0.0f);
      atomicExch(error + j, 0.0f);
    }
  }
}

}  // namespace fetchsgd_device

template <>
struct fetchsgd_backend<cuda> {

  static void accumulate(cuda& exec, const sketch::count_sketch& s, std::uint64_t n, span<const std::byte> summed,
                         span<float> velocity, std::uint8_t* error, float momentum, float scale, float lr) {
    require_aligned(summed.data(), "fetchsgd::step");
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(summed.data());
    launch(count_sketch_device::validate_kernel<>, 1, 32, 0, exec.stream(), bytes, summed.size(), n, s.rows(),
           s.columns(), s.seed(), exec.status_word());
    if (!velocity.empty()) {
      launch_over<fetchsgd_policy>(exec, velocity.size(), fetchsgd_device::accumulate_kernel<>,
                                   bytes, summed.size(), n, s.rows(), s.columns(), s.seed(),
                                   velocity.data(), reinterpret_cast<float*>(error), momentum,
                                   scale, lr, exec.status_word());
    }
  }

  static void forget_sent(cuda& exec, const sketch::count_sketch& s, span<const float> delta, span<float> velocity,
                          std::uint8_t* error) {
    if (delta.empty()) return;
    launch_over<fetchsgd_policy>(exec, delta.size(), fetchsgd_device::forget_sent_kernel<>,
                                 delta.data(), delta.size(), s.rows(), s.columns(), s.seed(),
                                 velocity.data(), reinterpret_cast<float*>(error),
                                 exec.status_word());
  }
};

}  // namespace gradzip::detail
