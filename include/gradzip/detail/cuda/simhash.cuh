// simhash_backend<cuda>: each thread block takes gradient blocks in turn, in shared memory.
// Every float operation is the host's, in the host's order (the Walsh-Hadamard stages pair the
// same elements, and the two sums use the format's 32-lane order, reproduced by one warp and
// a shuffle-down tree), so the bytes equal the host's. No atomics, no host synchronization.
#pragma once

#include "gradzip/detail/cuda/status_word.cuh"
#include "gradzip/detail/cuda/walsh_hadamard.cuh"
#include "gradzip/hash/simhash.hpp"

namespace gradzip::detail {

/// SimHash: a thread block per projection block (in shared memory); validation one block per
/// thread.
using simhash_policy = launch_policy<256, 1, 8>;

namespace simhash_device {

using sh = hash::simhash;

/// The format's 32-lane sum (simhash::lane_sum) by the calling warp; lane 0 holds the result.
/// Each term is added with its own rounding (add_rn): a term that is a product (the squared
/// norm's) must not be fused into the sum, or the bytes differ from the host's.
template <class Term>
__device__ double warp_lane_sum(std::uint32_t count, Term term) {
  const unsigned lane = threadIdx.x & 31u;
  double acc = 0.0;
  for (std::uint32_t t = lane; t < count; t += 32) acc = add_rn(acc, term(t));
  for (int offset = 16; offset > 0; offset /= 2) acc = add_rn(acc, __shfl_down_sync(0xFFFFFFFFu, acc, offset));
  return acc;
}

/// v <- D_r v factor: the host's flip_and_scale.
__device__ inline void flip_and_scale(float* v, const sh::projection& p, std::uint32_t r, std::uint32_t size,
                                      float factor) {
  for (std::uint32_t k = threadIdx.x; k < size; k += blockDim.x) {
    const std::uint64_t signs = p.sign_word(r, k >> 6);
    const auto flip = static_cast<std::uint32_t>(signs >> (k & 63)) << 31;
    v[k] = bit_cast<float>(bit_cast<std::uint32_t>(v[k] * factor) ^ flip);
  }
  __syncthreads();
}

template <class = void>
__global__ __launch_bounds__(1)
void frame_kernel(std::uint8_t* base, std::uint64_t n, element_type type, std::uint32_t block,
                  std::uint32_t bits, std::uint64_t seed, quantize::compress_context ctx) {
  sh::write_frame(base, n, type, block, bits, seed, ctx);
}

// The compress and apply kernels take gradient blocks b = blockIdx.x, + gridDim.x, ...: a grid
// holds at most 2^31 - 1 thread blocks, a tensor may have more gradient blocks.

template <class T>
__global__ __launch_bounds__(simhash_policy::threads)
void compress_kernel(const T* x, std::uint64_t n, std::uint8_t* base, std::uint64_t scales_at,
                     std::uint64_t codes_at, std::uint32_t block, std::uint32_t bits, std::uint64_t seed,
                     quantize::compress_context ctx, float inverse_sqrt) {
  float* v = dynamic_shared_memory<float>();
  __shared__ double norm2;
  __shared__ std::uint32_t scale;
  const std::uint64_t blocks = (n + block - 1) / block;
  for (std::uint64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const sh::projection p = sh::projection_for(seed, block, ctx, b);
    const std::uint64_t first = b * block;
    const std::uint64_t count = n - first < block ? n - first : block;
    for (std::uint32_t k = threadIdx.x; k < block; k += blockDim.x) {
      v[k] = k < count ? static_cast<float>(to_float(x[first + k])) : 0.0f;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      const double s = warp_lane_sum(block, [&](std::uint32_t k) { return static_cast<double>(v[k]) * v[k]; });
      if (threadIdx.x == 0) norm2 = s;
    }
    __syncthreads();
    for (std::uint32_t r = 0; r < sh::rounds; ++r) {
      flip_and_scale(v, p, r, block, inverse_sqrt);
      walsh_hadamard(v, block);
    }
    if (threadIdx.x < 32) {
      const double sum_abs =
          warp_lane_sum(bits, [&](std::uint32_t i) { return fabs(static_cast<double>(v[p.row(i, block)])); });
      if (threadIdx.x == 0) scale = sh::scale_word(norm2, sum_abs, block, bits);
    }
    __syncthreads();
    std::uint8_t* codes = base + codes_at + b * (bits / 8);
    for (std::uint32_t q = threadIdx.x; q < bits / 8; q += blockDim.x) {
      unsigned byte = 0;
      if (scale != sh::poisoned_scale) {
        for (std::uint32_t t = 0; t < 8; ++t) byte |= (v[p.row(8 * q + t, block)] < 0.0f ? 1u : 0u) << t;
      }
      codes[q] = static_cast<std::uint8_t>(byte);
    }
    if (threadIdx.x == 0) wire::detail::store_le(base + scales_at + 4 * b, scale, 4);
    __syncthreads();  // v, norm2 and scale are rewritten for the next block
  }
}

/// Thread 0 parses and checks the frame into shared memory; false (for the block) on error.
__device__ inline bool parse_frame(const std::uint8_t* bytes, std::uint64_t size, std::uint64_t n, element_type type,
                                   std::uint32_t block, std::uint32_t bits, std::uint64_t seed, sh::frame& f,
                                   wire::status* st) {
  return check_in_block(
      [&] {
        wire::header h;
        wire::status s = wire::parse_header(bytes, size, h);
        if (s.ok()) s = sh::check_frame(h, bytes, n, type, block, bits, seed, f);
        return s;
      },
      blockIdx.x == 0 ? st : nullptr);
}

__device__ inline sh::frame& shared_frame() {
  alignas(sh::frame) __shared__ unsigned char storage[sizeof(sh::frame)];
  return *reinterpret_cast<sh::frame*>(storage);
}

template <class = void>
__global__ __launch_bounds__(simhash_policy::threads)
void validate_kernel(const std::uint8_t* bytes, std::uint64_t size, std::uint64_t n, element_type type,
                     std::uint32_t block, std::uint32_t bits, std::uint64_t seed, wire::status* st,
                     unsigned long long* pending) {
  sh::frame& f = shared_frame();
  if (!parse_frame(bytes, size, n, type, block, bits, seed, f, st)) return;
  const std::uint64_t blocks = (n + block - 1) / block;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t b = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks; b += stride) {
    if (!sh::check_block(bytes + f.scales, bytes + f.codes, b, bits).ok()) note_failure(pending, b);
  }
}

/// validate_kernel's block check, for settle.
struct block_recheck {
  const std::uint8_t* bytes;
  std::uint64_t size, n;
  element_type type;
  std::uint32_t block, bits;
  std::uint64_t seed;
  __device__ wire::status operator()(std::uint64_t b) const {
    wire::header h;
    sh::frame f;
    wire::parse_header(bytes, size, h);  // the frame passed in validate_kernel
    sh::check_frame(h, bytes, n, type, block, bits, seed, f);
    return sh::check_block(bytes + f.scales, bytes + f.codes, b, bits);
  }
};

template <class T>
__global__ __launch_bounds__(simhash_policy::threads)
void apply_kernel(const std::uint8_t* bytes, std::uint64_t size, T* out, std::uint64_t n, std::uint32_t block,
                  std::uint32_t bits, std::uint64_t seed, float alpha, double sqrt_block,
                  const wire::status* st) {
  if (failure_recorded(st)) return;  // validation failed: change nothing
  float* u = dynamic_shared_memory<float>();
  sh::frame& f = shared_frame();
  if (!parse_frame(bytes, size, n, element_traits<T>::type, block, bits, seed, f, nullptr)) return;
  const std::uint64_t blocks = (n + block - 1) / block;
  for (std::uint64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const std::uint64_t first = b * block;
    const std::uint64_t count = n - first < block ? n - first : block;
    const auto scale_bits = static_cast<std::uint32_t>(wire::detail::load_le(bytes + f.scales + 4 * b, 4));
    if (scale_bits == sh::poisoned_scale) {  // the same for the whole thread block
      for (std::uint64_t k = threadIdx.x; k < count; k += blockDim.x) accumulate(out[first + k], nan(""), alpha);
      continue;
    }
    const sh::projection p = sh::projection_for(seed, block, f.ctx, b);
    const float magnitude = sh::decode_magnitude(scale_bits, sqrt_block, bits);  // the host's order: see there
    const float inverse_sqrt = sh::inverse_sqrt_of(sqrt_block);
    for (std::uint32_t k = threadIdx.x; k < block; k += blockDim.x) u[k] = 0.0f;
    __syncthreads();
    const std::uint8_t* codes = bytes + f.codes + b * (bits / 8);
    for (std::uint32_t i = threadIdx.x; i < bits; i += blockDim.x) {  // distinct rows: no two writes meet
      u[p.row(i, block)] = ((codes[i / 8] >> (i % 8)) & 1u) != 0 ? -magnitude : magnitude;
    }
    __syncthreads();
    for (std::uint32_t r = sh::rounds; r-- > 0;) {
      walsh_hadamard(u, block);
      flip_and_scale(u, p, r, block, r > 0 ? inverse_sqrt : 1.0f);
    }
    for (std::uint64_t k = threadIdx.x; k < count; k += blockDim.x) accumulate(out[first + k], u[k], alpha);
    __syncthreads();  // u is rewritten for the next block
  }
}

}  // namespace simhash_device

template <>
struct simhash_backend<cuda> {
  /// Shared memory holds one block of floats: 32 KB at most (the default per-block limit is 48 KB).
  static constexpr std::uint32_t max_block = 8192;

  static void expect_block(const hash::simhash& s, const char* what) {
    GRADZIP_EXPECTS(s.block() <= max_block, what, ": the CUDA backend handles blocks of at most ", max_block,
                    " elements, got ", s.block());
  }

  template <class T>
  static std::size_t compress(const hash::simhash& s, cuda& exec, span<const T> x, span<std::byte> out,
                              quantize::compress_context ctx) {
    expect_block(s, "simhash::compress");
    const wire::payload_layout l = s.layout(x.size());
    GRADZIP_EXPECTS(out.size() >= l.total_bytes(), "simhash::compress: output holds ", out.size(),
                    " bytes, the payload needs ", l.total_bytes());
    require_aligned(out.data(), "simhash::compress");
    auto* base = reinterpret_cast<std::uint8_t*>(out.data());
    launch(simhash_device::frame_kernel<>, 1, 1, 0, exec.stream(), base, x.size(), element_traits<T>::type, s.block(),
           s.bits(), s.seed(), ctx);
    const std::uint64_t blocks = s.block_count(x.size());
    if (blocks > 0) {
      launch_units<simhash_policy>(exec, blocks, s.block() * sizeof(float),
                                   simhash_device::compress_kernel<T>, x.data(), x.size(), base,
                                   l.at(1).offset, l.at(2).offset, s.block(), s.bits(), s.seed(),
                                   ctx, hash::simhash::inverse_sqrt_of(s.sqrt_block()));
    }
    return l.total_bytes();
  }

  template <class T>
  static void decompress_add(const hash::simhash& s, cuda& exec, span<const std::byte> payload, span<T> out, float alpha,
                             bool zero_first) {
    expect_block(s, "simhash::decompress");
    require_aligned(payload.data(), "simhash::decompress");
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(payload.data());
    const std::uint64_t blocks = s.block_count(out.size());
    launch_over<simhash_policy>(exec, blocks, simhash_device::validate_kernel<>, bytes,
                                payload.size(), out.size(), element_traits<T>::type, s.block(),
                                s.bits(), s.seed(), exec.status_word(), exec.pending_failure());
    settle(exec, simhash_device::block_recheck{bytes, payload.size(), out.size(), element_traits<T>::type, s.block(),
                                               s.bits(), s.seed()});
    if (zero_first) {
      launch_over<decode_policy>(exec, out.size(), zero_if_ok_kernel<T>, out.data(), out.size(),
                                 exec.status_word());
    }
    if (blocks > 0) {
      launch_units<simhash_policy>(exec, blocks, s.block() * sizeof(float),
                                   simhash_device::apply_kernel<T>, bytes, payload.size(),
                                   out.data(), out.size(), s.block(), s.bits(), s.seed(), alpha,
                                   s.sqrt_block(), exec.status_word());
    }
  }
};

}  // namespace gradzip::detail
