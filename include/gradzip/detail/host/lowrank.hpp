// PowerSGD's loops on the host (lowrank/powersgd.hpp has the math and the order of every sum,
// and includes this after it).
//
// Each factor entry is a sum over a matrix row or column in the canonical order: term t goes
// to lane t mod 32, each lane adds its terms in order, and the lanes combine in detail::lane_tree
// (detail/lane_sum.hpp).
// The loops below keep 32 lanes per output side by side so that the compiler vectorizes them;
// the threads split rows (P, and the reconstruction) or column blocks (Q), never one sum.
#pragma once

#include <algorithm>
#include <cstring>

#include "gradzip/core/executor.hpp"
#include "gradzip/detail/host/parallel.hpp"
#include "gradzip/detail/lane_sum.hpp"

namespace gradzip::detail {

template <>
struct lowrank_backend<host> {
  /// Columns of M a thread handles at once in project_transposed: 32 lanes x this many partial
  /// sums per rank: 64 KiB of stack at the rank tile of 4.
  static constexpr std::size_t column_block = 128;
  /// Ranks handled per pass over M (the lanes of larger ranks would not stay in L1).
  static constexpr int rank_tile = 4;
  /// Entries of a row of P Q^T built at once (on the stack).
  static constexpr std::size_t reconstruct_tile = 1024;

  static void write_frame(host&, std::uint8_t* out, const lowrank::frame& f) { f.write(out); }

  /// Throws format_error naming `what` unless `bytes` holds a payload with frame `f`.
  static const wire::status* check_frame(host&, span<const std::byte> bytes, const lowrank::frame& f,
                                         const char* what) {
    wire::throw_if_failed(f.check(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()), what);
    return nullptr;
  }

  /// p <- the summed P (its frame checked already: the host throws first), and flags[1] <- 1.
  static void take_p(host&, const float* from, float* to, std::size_t n, std::uint32_t* flags, const wire::status*) {
    if (n != 0) std::memcpy(to, from, n * sizeof(float));
    flags[1] = 1;
  }

  /// The step's starting Q: the last step's (`last`, when given and valid), else a fresh draw.
  /// (flags[1] <- 0: the step's P is not accepted yet.)
  static void start_q(host&, float* q, const float* last, std::uint32_t* flags, std::size_t n, std::uint64_t seed,
                      std::uint32_t step, std::uint32_t tensor_id) {
    flags[1] = 0;
    if (last != nullptr && flags[0] != 0) {
      if (n != 0) std::memcpy(q, last, n * sizeof(float));
      return;
    }
    for (std::size_t k = 0; k < n; ++k) q[k] = lowrank::initial_q(seed, step, tensor_id, k);
  }

  /// m <- x (+ residual), as floats.
  template <class T>
  static void load(host& exec, const T* x, const float* residual, float* m, std::size_t n) {
    const std::size_t chunks = chunk_count(exec, n);
    for_each_chunk(exec, chunks, [&](std::size_t c) {
      const index_range r = chunk_of(n, chunks, c);
      if (residual) {
        for (std::size_t i = r.begin; i < r.end; ++i) m[i] = add_rn(static_cast<float>(to_float(x[i])), residual[i]);
      } else {
        for (std::size_t i = r.begin; i < r.end; ++i) m[i] = static_cast<float>(to_float(x[i]));
      }
    });
  }

  /// Gram-Schmidt on the `rank` columns (each `length` floats, back to back) of a, in place.
  static void orthogonalize(host&, float* a, std::size_t length, int rank, float epsilon, const wire::status*) {
    for (int k = 0; k < rank; ++k) {
      float* col = a + static_cast<std::size_t>(k) * length;
      const float d = lowrank::normalizer(lane_sum<float>(length, [&](std::size_t i) { return mul_rn(col[i], col[i]); }),
                                          epsilon);
      for (std::size_t i = 0; i < length; ++i) col[i] = d == 0.0f ? 0.0f : div_rn(col[i], d);
      for (int o = k + 1; o < rank; ++o) {
        float* rest = a + static_cast<std::size_t>(o) * length;
        const float dot = lane_sum<float>(length, [&](std::size_t i) { return mul_rn(col[i], rest[i]); });
        for (std::size_t i = 0; i < length; ++i) rest[i] = add_rn(rest[i], -mul_rn(dot, col[i]));
      }
    }
  }

  /// p[c rows + i] <- sum_j m[i cols + j] q[c cols + j]: P = M Q, columns of P and Q contiguous.
  static void project(host& exec, const float* m, std::size_t rows, std::size_t cols, const float* q, int rank,
                      float* p) {
    const std::size_t chunks = std::min(rows, chunk_count(exec, rows * cols));
    for_each_chunk(exec, chunks, [&](std::size_t c) {
      const index_range r = chunk_of(rows, chunks, c);
      for (int c0 = 0; c0 < rank; c0 += rank_tile) {
        const int width = std::min(rank_tile, rank - c0);
        for (std::size_t i = r.begin; i < r.end; ++i) {
          const float* row = m + i * cols;
          float lanes[rank_tile][32] = {};
          std::size_t base = 0;
          for (; base + 32 <= cols; base += 32) {
            for (int t = 0; t < width; ++t) {
              const float* qc = q + static_cast<std::size_t>(c0 + t) * cols + base;
              for (int l = 0; l < 32; ++l) lanes[t][l] = add_rn(lanes[t][l], mul_rn(row[base + l], qc[l]));
            }
          }
          for (int t = 0; t < width; ++t) {
            const float* qc = q + static_cast<std::size_t>(c0 + t) * cols;
            for (int l = 0; l < 32 && base + l < cols; ++l) {
              lanes[t][l] = add_rn(lanes[t][l], mul_rn(row[base + l], qc[base + l]));
            }
            p[static_cast<std::size_t>(c0 + t) * rows + i] = lane_tree(lanes[t]);
          }
        }
      }
    });
  }

  /// q[c cols + j] <- sum_i m[i cols + j] p[c rows + i]: Q = M^T P.
  static void project_transposed(host& exec, const float* m, std::size_t rows, std::size_t cols, const float* p,
                                 int rank, float* q, const wire::status*) {
    const std::size_t blocks = (cols + column_block - 1) / column_block;
    const std::size_t chunks = std::min(blocks, chunk_count(exec, rows * cols));
    for_each_chunk(exec, chunks, [&](std::size_t c) {
      const index_range r = chunk_of(blocks, chunks, c);
      for (std::size_t b = r.begin; b < r.end; ++b) {
        const std::size_t j0 = b * column_block, width = std::min(column_block, cols - j0);
        for (int c0 = 0; c0 < rank; c0 += rank_tile) {
          const int tile = std::min(rank_tile, rank - c0);
          alignas(64) float lanes[rank_tile][32][column_block] = {};
          for (std::size_t i = 0; i < rows; ++i) {
            const float* row = m + i * cols + j0;
            for (int t = 0; t < tile; ++t) {
              const float pi = p[static_cast<std::size_t>(c0 + t) * rows + i];
              float* lane = lanes[t][i & 31];
              for (std::size_t x = 0; x < width; ++x) lane[x] = add_rn(lane[x], mul_rn(row[x], pi));
            }
          }
          for (int t = 0; t < tile; ++t) {
            for (std::size_t x = 0; x < width; ++x) {
              float column[32];
              for (int l = 0; l < 32; ++l) column[l] = lanes[t][l][x];
              q[static_cast<std::size_t>(c0 + t) * cols + j0 + x] = lane_tree(column);
            }
          }
        }
      }
    });
  }

  /// q <- sum / ranks (PyTorch divides the summed Q by the world size).
  /// (The host's decompress runs only after compress_q accepted P, so flags[1] is set.)
  static void average(host&, const float* sum, float* q, std::uint32_t* flags, std::size_t n, float ranks,
                      const wire::status*) {
    if (n != 0) std::memcpy(q, sum, n * sizeof(float));  // a received payload may sit at any address
    for (std::size_t k = 0; k < n; ++k) q[k] = div_rn(q[k], ranks);
    flags[0] = 1;
  }

  /// out[i cols + j] <- sum_c p[c rows + i] q[c cols + j] (c in order), and, with a residual,
  /// residual <- m - that.
  template <class T>
  static void reconstruct(host& exec, const float* p, const float* q, std::size_t rows, std::size_t cols, int rank,
                          const float* m, float* residual, T* out, const wire::status*) {
    const std::size_t chunks = std::min(rows, chunk_count(exec, rows * cols));
    for_each_chunk(exec, chunks, [&](std::size_t c) {
      const index_range r = chunk_of(rows, chunks, c);
      float v[reconstruct_tile];  // a tile of one row, each entry's sum over k in order
      for (std::size_t i = r.begin; i < r.end; ++i) {
        for (std::size_t j0 = 0; j0 < cols; j0 += reconstruct_tile) {
          const std::size_t width = std::min(reconstruct_tile, cols - j0);
          std::fill(v, v + width, 0.0f);
          for (int k = 0; k < rank; ++k) {
            const float pk = p[static_cast<std::size_t>(k) * rows + i];
            const float* qk = q + static_cast<std::size_t>(k) * cols + j0;
            for (std::size_t x = 0; x < width; ++x) v[x] = add_rn(v[x], mul_rn(pk, qk[x]));
          }
          const std::size_t at = i * cols + j0;
          const float* __restrict mi = m + at;
          T* __restrict oi = out + at;
          if (residual) {
            float* __restrict ri = residual + at;
            for (std::size_t x = 0; x < width; ++x) {
              ri[x] = add_rn(mi[x], -v[x]);
              oi[x] = from_double<T>(v[x]);
            }
          } else {
            for (std::size_t x = 0; x < width; ++x) oi[x] = from_double<T>(v[x]);
          }
        }
      }
    });
  }

  /// The uncompressed tensors' elements: copied out of and back into the bucket, and averaged.
  template <class T>
  static void copy_elements(host&, const T* from, T* to, std::size_t n) {
    if (n != 0) std::memcpy(static_cast<void*>(to), static_cast<const void*>(from), n * sizeof(T));
  }
  template <class T>
  static void divide(host&, T* x, std::size_t n, float ranks) {
    for (std::size_t i = 0; i < n; ++i) x[i] = lowrank::averaged(x[i], ranks);
  }
};

}  // namespace gradzip::detail
