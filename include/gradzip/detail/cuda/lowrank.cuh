// PowerSGD's kernels (lowrank/powersgd.hpp has the math; detail/host/lowrank.hpp the host's loops,
// which these match bit for bit).
//
// Every factor entry is a canonical sum: term t to lane t mod 32, lanes in order, then the xor
// butterfly. A warp does that natively (P = M Q: one warp per row of M; the orthogonalization:
// one warp per matrix), and Q = M^T P keeps 32 row lanes in the 32 warps of a 1024-thread block,
// combined in shared memory in the same butterfly. Products are tall and skinny (rank 1 to a few
// dozen), so they are bound by reading M: docs/performance.md has the traffic model.
//
// Kernels that consume a received payload take the status word its frame check wrote and do
// nothing after a failure: a bad payload changes no state, and exec.check() reports it.
#pragma once

#include "gradzip/detail/cuda/status_word.cuh"
#include "gradzip/lowrank/powersgd.hpp"

namespace gradzip::detail {

/// PowerSGD's kernels: one element per thread and grid-stride step; a warp per row in the
/// products.
using lowrank_policy = launch_policy<256, 1, 8>;

__device__ inline bool lowrank_failed(const wire::status* st) { return st != nullptr && failure_recorded(st); }

/// The sum over the warp in the canonical butterfly: every lane gets lane 0's value.
__device__ inline float warp_butterfly(float v) {
  for (int offset = 16; offset >= 1; offset /= 2) v = add_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
  return v;
}

template <class = void>
__global__ __launch_bounds__(32) void lowrank_write_frame_kernel(std::uint8_t* out, lowrank::frame f) {
  if (threadIdx.x == 0) f.write(out);  // the host's function: the same bytes
}

template <class = void>
__global__ __launch_bounds__(32) void lowrank_check_frame_kernel(const std::uint8_t* bytes, std::uint64_t size,
                                                                 lowrank::frame f, wire::status* st) {
  if (threadIdx.x != 0) return;
  const wire::status s = f.check(bytes, size);
  if (!s.ok()) record_failure(st, s);
}

/// p <- the summed P, and flags[1] <- 1 (the step's P accepted), unless its frame check failed.
template <class = void>
__global__ __launch_bounds__(lowrank_policy::threads)
void lowrank_take_p_kernel(const float* from, float* to, std::uint64_t n,
                           std::uint32_t* flags, const wire::status* st) {
  if (lowrank_failed(st)) return;
  if (blockIdx.x == 0 && threadIdx.x == 0) flags[1] = 1;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    to[i] = from[i];
  }
}

/// The step's starting Q (the last step's when warm and valid, else a fresh draw), and
/// flags[1] <- 0: the step's P is not accepted yet.
template <class = void>
__global__ __launch_bounds__(lowrank_policy::threads)
void lowrank_start_q_kernel(float* q, const float* last,
                            std::uint32_t* flags, std::uint64_t n,
                            std::uint64_t seed, std::uint32_t step,
                            std::uint32_t tensor_id) {
  const bool warm = last != nullptr && flags[0] != 0;
  if (blockIdx.x == 0 && threadIdx.x == 0) flags[1] = 0;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t k = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += stride) {
    q[k] = warm ? last[k] : lowrank::initial_q(seed, step, tensor_id, k);
  }
}

template <class T>
__global__ __launch_bounds__(lowrank_policy::threads)
void lowrank_load_kernel(const T* x, const float* residual, float* m,
                         std::uint64_t n) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = static_cast<float>(to_float(x[i]));
    m[i] = residual ? add_rn(v, residual[i]) : v;
  }
}

/// Gram-Schmidt on one matrix by one warp. Lane l owns the entries i = l mod 32 of every column:
/// it alone reads and writes them, so the warp needs no barrier beyond its shuffles.
template <class = void>
__global__ __launch_bounds__(32) void lowrank_orthogonalize_kernel(float* a, std::uint64_t length, int rank,
                                                                   float epsilon, const wire::status* st) {
  if (lowrank_failed(st)) return;
  const unsigned lane = threadIdx.x;
  for (int k = 0; k < rank; ++k) {
    float* col = a + static_cast<std::uint64_t>(k) * length;
    float squares = 0.0f;
    for (std::uint64_t i = lane; i < length; i += 32) squares = add_rn(squares, mul_rn(col[i], col[i]));
    const float d = lowrank::normalizer(warp_butterfly(squares), epsilon);
    for (std::uint64_t i = lane; i < length; i += 32) col[i] = d == 0.0f ? 0.0f : div_rn(col[i], d);
    for (int o = k + 1; o < rank; ++o) {
      float* rest = a + static_cast<std::uint64_t>(o) * length;
      float dot = 0.0f;
      for (std::uint64_t i = lane; i < length; i += 32) dot = add_rn(dot, mul_rn(col[i], rest[i]));
      dot = warp_butterfly(dot);
      for (std::uint64_t i = lane; i < length; i += 32) rest[i] = add_rn(rest[i], -mul_rn(dot, col[i]));
    }
  }
}

/// Ranks per pass over M (registers per lane).
inline constexpr int lowrank_rank_tile = 4;

/// P = M Q: warp w of the grid takes rows w, w + warps, ...; lane l adds columns l, l + 32, ....
template <class = void>
__global__ __launch_bounds__(lowrank_policy::threads)
void lowrank_project_kernel(const float* m, std::uint64_t rows,
                            std::uint64_t cols, const float* q, int rank,
                            float* p) {
  constexpr unsigned warps_per_block = lowrank_policy::threads / 32;
  const unsigned lane = threadIdx.x % 32;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * warps_per_block;
  for (std::uint64_t row = static_cast<std::uint64_t>(blockIdx.x) * warps_per_block + threadIdx.x / 32; row < rows;
       row += warps) {
    const float* r = m + row * cols;
    for (int c0 = 0; c0 < rank; c0 += lowrank_rank_tile) {
      const int width = rank - c0 < lowrank_rank_tile ? rank - c0 : lowrank_rank_tile;
      float acc[lowrank_rank_tile] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (std::uint64_t j = lane; j < cols; j += 32) {
        const float v = r[j];
#pragma unroll
        for (int t = 0; t < lowrank_rank_tile; ++t) {
          if (t < width) acc[t] = add_rn(acc[t], mul_rn(v, q[static_cast<std::uint64_t>(c0 + t) * cols + j]));
        }
      }
#pragma unroll
      for (int t = 0; t < lowrank_rank_tile; ++t) {
        const float s = warp_butterfly(acc[t]);
        if (t < width && lane == 0) p[static_cast<std::uint64_t>(c0 + t) * rows + row] = s;
      }
    }
  }
}

/// Q = M^T P's launch: 1,024 threads (32 columns x 32 row lanes), at most 2 blocks per SM.
using lowrank_transposed_policy = launch_policy<1024, 1, 2>;

/// Q = M^T P: a block takes 32 columns at a time; thread (x, y) = (threadIdx % 32, threadIdx / 32)
/// adds rows y, y + 32, ... of column x, and the 32 row lanes combine in shared memory.
template <class = void>
__global__ __launch_bounds__(lowrank_transposed_policy::threads)
void lowrank_project_transposed_kernel(
    const float* m, std::uint64_t rows, std::uint64_t cols, const float* p, int rank, float* q,
    const wire::status* st) {
  if (lowrank_failed(st)) return;
  __shared__ float lanes[lowrank_rank_tile][32][33];  // +1: column reads across y hit distinct banks
  const unsigned x = threadIdx.x % 32, y = threadIdx.x / 32;
  const std::uint64_t blocks = (cols + 31) / 32;
  for (std::uint64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const std::uint64_t j = b * 32 + x;
    for (int c0 = 0; c0 < rank; c0 += lowrank_rank_tile) {
      const int width = rank - c0 < lowrank_rank_tile ? rank - c0 : lowrank_rank_tile;
      float acc[lowrank_rank_tile] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (j < cols) {
        for (std::uint64_t i = y; i < rows; i += 32) {
          const float v = m[i * cols + j];
#pragma unroll
          for (int t = 0; t < lowrank_rank_tile; ++t) {
            if (t < width) acc[t] = add_rn(acc[t], mul_rn(v, p[static_cast<std::uint64_t>(c0 + t) * rows + i]));
          }
        }
      }
#pragma unroll
      for (int t = 0; t < lowrank_rank_tile; ++t) lanes[t][y][x] = acc[t];
      __syncthreads();
      for (unsigned offset = 16; offset >= 1; offset /= 2) {
        if (y < offset) {
#pragma unroll
          for (int t = 0; t < lowrank_rank_tile; ++t) lanes[t][y][x] = add_rn(lanes[t][y][x], lanes[t][y + offset][x]);
        }
        __syncthreads();
      }
      if (y == 0 && j < cols) {
        for (int t = 0; t < width; ++t) q[static_cast<std::uint64_t>(c0 + t) * cols + j] = lanes[t][0][x];
      }
      __syncthreads();  // lanes is rewritten by the next tile
    }
  }
}

/// q <- sum / ranks and flags[0] <- 1 (q holds a step's Q), if the Q frame passed its check and
/// the step's P was accepted; a rejected P (whose error check() already reported) fails the
/// step here again, so that nothing after it runs.
template <class = void>
__global__ __launch_bounds__(lowrank_policy::threads)
void lowrank_average_kernel(const float* sum, float* q, std::uint32_t* flags,
                            std::uint64_t n, float ranks,
                            wire::status* st) {
  if (lowrank_failed(st)) return;
  if (flags[1] == 0) {
    if (blockIdx.x == 0 && threadIdx.x == 0) record_failure(st, wire::fail(wire::format_errc::step_incomplete, 1));
    return;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) flags[0] = 1;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t k = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += stride) {
    q[k] = div_rn(sum[k], ranks);
  }
}

template <class T>
__global__ __launch_bounds__(lowrank_policy::threads)
void lowrank_reconstruct_kernel(const float* p, const float* q,
                                std::uint64_t rows, std::uint64_t cols,
                                int rank, const float* m, float* residual,
                                T* out, const wire::status* st) {
  if (lowrank_failed(st)) return;
  const std::uint64_t n = rows * cols;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t at = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; at < n; at += stride) {
    const std::uint64_t i = at / cols, j = at % cols;
    float v = 0.0f;
    for (int k = 0; k < rank; ++k) {
      v = add_rn(v, mul_rn(p[static_cast<std::uint64_t>(k) * rows + i], q[static_cast<std::uint64_t>(k) * cols + j]));
    }
    if (residual) residual[at] = add_rn(m[at], -v);
    out[at] = from_double<T>(v);
  }
}

template <class T>
__global__ __launch_bounds__(lowrank_policy::threads)
void lowrank_divide_kernel(T* x, std::uint64_t n, float ranks) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    x[i] = lowrank::averaged(x[i], ranks);
  }
}

template <>
struct lowrank_backend<cuda> {
  static void write_frame(cuda& exec, std::uint8_t* out, const lowrank::frame& f) {
    launch(lowrank_write_frame_kernel<>, 1, 32, 0, exec.stream(), out, f);
  }

  /// Queues the frame check; its failure lands in the executor's status word (exec.check()).
  static const wire::status* check_frame(cuda& exec, span<const std::byte> bytes, const lowrank::frame& f,
                                         const char*) {
    launch(lowrank_check_frame_kernel<>, 1, 32, 0, exec.stream(), reinterpret_cast<const std::uint8_t*>(bytes.data()),
           static_cast<std::uint64_t>(bytes.size()), f, exec.status_word());
    return exec.status_word();
  }

  static void take_p(cuda& exec, const float* from, float* to, std::size_t n, std::uint32_t* flags,
                     const wire::status* st) {
    launch_over<lowrank_policy>(exec, n, lowrank_take_p_kernel<>, from, to, n, flags, st);
  }

  static void start_q(cuda& exec, float* q, const float* last, std::uint32_t* flags, std::size_t n,
                      std::uint64_t seed, std::uint32_t step, std::uint32_t tensor_id) {
    launch_over<lowrank_policy>(exec, n, lowrank_start_q_kernel<>, q, last, flags, n, seed, step,
                                tensor_id);
  }

  template <class T>
  static void load(cuda& exec, const T* x, const float* residual, float* m, std::size_t n) {
    if (n != 0) launch_over<lowrank_policy>(exec, n, lowrank_load_kernel<T>, x, residual, m, n);
  }

  static void orthogonalize(cuda& exec, float* a, std::size_t length, int rank, float epsilon, const wire::status* st) {
    launch(lowrank_orthogonalize_kernel<>, 1, 32, 0, exec.stream(), a, static_cast<std::uint64_t>(length), rank,
           epsilon, st);
  }

  static void project(cuda& exec, const float* m, std::size_t rows, std::size_t cols, const float* q, int rank,
                      float* p) {
    launch_units<lowrank_policy>(exec,
                                 (rows + lowrank_policy::threads / 32 - 1) / (lowrank_policy::threads / 32),
                                 0, lowrank_project_kernel<>, m, static_cast<std::uint64_t>(rows),
                                 static_cast<std::uint64_t>(cols), q, rank, p);
  }

  static void project_transposed(cuda& exec, const float* m, std::size_t rows, std::size_t cols, const float* p,
                                 int rank, float* q, const wire::status* st) {
    launch_units<lowrank_transposed_policy>(exec, (cols + 31) / 32, 0,
                                            lowrank_project_transposed_kernel<>, m,
                                            static_cast<std::uint64_t>(rows),
                                            static_cast<std::uint64_t>(cols), p, rank, q, st);
  }

  static void average(cuda& exec, const float* sum, float* q, std::uint32_t* flags, std::size_t n, float ranks,
                      const wire::status*) {
    launch_over<lowrank_policy>(exec, n, lowrank_average_kernel<>, sum, q, flags, n, ranks,
                                exec.status_word());
  }

  template <class T>
  static void reconstruct(cuda& exec, const float* p, const float* q, std::size_t rows, std::size_t cols, int rank,
                          const float* m, float* residual, T* out, const wire::status* st) {
    launch_over<lowrank_policy>(exec, rows * cols, lowrank_reconstruct_kernel<T>, p, q,
                                static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols),
                                rank, m, residual, out, st);
  }

  template <class T>
  static void copy_elements(cuda& exec, const T* from, T* to, std::size_t n) {
    if (n != 0) GRADZIP_CUDA_TRY(cudaMemcpyAsync(to, from, n * sizeof(T), cudaMemcpyDeviceToDevice, exec.stream()));
  }
  template <class T>
  static void divide(cuda& exec, T* x, std::size_t n, float ranks) {
    if (n != 0) launch_over<lowrank_policy>(exec, n, lowrank_divide_kernel<T>, x, n, ranks);
  }
};

}  // namespace gradzip::detail
