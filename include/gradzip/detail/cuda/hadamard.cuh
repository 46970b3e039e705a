// rotation_backend<cuda>: transform::rotated<Codec> on the GPU. Each thread block takes rotation
// blocks in turn (each in shared memory, at most 8192 elements) and applies D, the Walsh-Hadamard
// stages the host applies (the same pairs, the same float operations) and the scale; the inner codec runs on
// the device as usual. Decoding validates the outer frame on the device first, so the inner
// decoder and the inverse rotation change nothing when it fails (the executor's status word).
#pragma once

#include "gradzip/detail/cuda/status_word.cuh"
#include "gradzip/detail/cuda/walsh_hadamard.cuh"
#include "gradzip/transform/hadamard.hpp"

namespace gradzip::detail {

/// The randomized Hadamard rotation: a thread block per rotation block (in shared memory).
using rotation_policy = launch_policy<256, 1, 8>;

namespace rotation_device {

using transform::hadamard;

// Each thread block takes rotation blocks b = blockIdx.x, + gridDim.x, ...: any number of them
// fits one grid (a grid has at most 2^31 - 1 blocks; a tensor may have more rotation blocks).

template <class T>
__global__ __launch_bounds__(rotation_policy::threads)
void forward_kernel(const T* x, std::uint64_t n, float* y, std::uint32_t block, std::uint64_t blocks,
                    std::uint64_t seed, float scale) {
  float* v = dynamic_shared_memory<float>();
  for (std::uint64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const std::uint64_t first = b * block;
    for (std::uint32_t k = threadIdx.x; k < block; k += blockDim.x) {
      const std::uint64_t i = first + k;
      v[k] = i < n ? hadamard::signed_by(seed, static_cast<float>(to_float(x[i])), i) : 0.0f;
    }
    __syncthreads();
    walsh_hadamard(v, block);
    for (std::uint32_t k = threadIdx.x; k < block; k += blockDim.x) y[first + k] = v[k] * scale;
    __syncthreads();  // v is refilled for the next block
  }
}

template <class T>
__global__ __launch_bounds__(rotation_policy::threads)
void inverse_add_kernel(const float* y, T* accum, std::uint64_t n, std::uint32_t block, std::uint64_t blocks,
                        std::uint64_t seed, float scale, float alpha, const wire::status* st) {
  if (failure_recorded(st)) return;  // a bad payload: change nothing
  float* v = dynamic_shared_memory<float>();
  for (std::uint64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const std::uint64_t first = b * block;
    for (std::uint32_t k = threadIdx.x; k < block; k += blockDim.x) v[k] = y[first + k];
    __syncthreads();
    walsh_hadamard(v, block);
    for (std::uint32_t k = threadIdx.x; k < block; k += blockDim.x) {
      const std::uint64_t i = first + k;
      if (i < n) {
        const float value = hadamard::signed_by(seed, v[k] * scale, i);
        T sum = accum[i];
        accumulate(sum, value, alpha);  // as the host's rotated::apply, and every codec
        accum[i] = sum;
      }
    }
    __syncthreads();
  }
}

template <class Codec>
__global__ __launch_bounds__(1)
void frame_kernel(std::uint8_t* base, std::uint64_t inner_bytes, element_type type, std::uint64_t n,
                  std::uint32_t block, std::uint64_t seed) {
  transform::rotated<Codec>::write_frame(base, inner_bytes, type, n, block, seed);
}

template <class Codec>
__global__ __launch_bounds__(1)
void validate_kernel(const std::uint8_t* bytes, std::uint64_t size, std::uint64_t n, std::uint32_t block,
                     std::uint64_t seed, wire::status* st) {
  wire::header h;
  wire::status s = wire::parse_header(bytes, size, h);
  std::uint64_t at = 0, inner_size = 0;  // at: inner_offset(), which check_frame requires
  if (s.ok()) s = transform::rotated<Codec>::check_frame(h, bytes, n, block, seed, at, inner_size);
  if (!s.ok()) record_failure(st, s);
}

}  // namespace rotation_device

template <>
struct rotation_backend<cuda> {
  static constexpr std::uint32_t max_block = 8192;

  template <class Codec>
  static void expect_block(const transform::rotated<Codec>& r, const char* what) {
    GRADZIP_EXPECTS(r.rotation().block() <= max_block, what, ": the CUDA backend rotates blocks of at most ", max_block,
                    " elements, got ", r.rotation().block());
  }

  /// Scratch: what the inner codec uses (its compress workspace, or its decoder's: the bitmap
  /// decoder's per-word counts and scan), then the rotated (padded) vector, which must survive
  /// the inner decode.
  template <class Codec>
  static std::size_t vector_offset(const transform::rotated<Codec>& r, cuda& exec, std::uint64_t padded) {
    const std::uint64_t words = padded / 64 + 2;
    const std::size_t decoder = 2 * words * sizeof(std::uint64_t) + 256 + exclusive_sum_bytes(exec, words);
    const std::size_t inner = r.inner().template workspace_bytes<float>(exec, padded);
    return scratch_aligned(inner > decoder ? inner : decoder);
  }

  template <class T, class Codec>
  static std::size_t workspace_bytes(const transform::rotated<Codec>& r, cuda& exec, std::size_t n) {
    const std::uint64_t padded = r.rotation().padded(n);
    return vector_offset(r, exec, padded) + padded * sizeof(float);
  }

  static float scale_of(std::uint32_t block) { return 1.0f / std::sqrt(static_cast<float>(block)); }

  template <class Codec, class T>
  static std::size_t compress(const transform::rotated<Codec>& r, cuda& exec, span<const T> input, span<std::byte> out,
                              quantize::compress_context ctx) {
    expect_block(r, "rotated::compress");
    require_aligned(out.data(), "rotated::compress");
    const std::uint64_t n = input.size(), padded = r.rotation().padded(n);
    const std::uint64_t inner_at = transform::rotated<Codec>::inner_offset();
    GRADZIP_EXPECTS(out.size() >= inner_at, "rotated::compress: output holds ", out.size(), " bytes");
    const std::size_t at = vector_offset(r, exec, padded);
    auto* y = reinterpret_cast<float*>(exec.scratch(at + padded * sizeof(float)) + at);
    const std::uint32_t block = r.rotation().block();
    if (padded > 0) {
      launch_units<rotation_policy>(exec, padded / block, block * sizeof(float),
                                    rotation_device::forward_kernel<T>, input.data(), n, y, block,
                                    padded / block, r.rotation().seed(), scale_of(block));
    }
    const std::size_t inner_bytes = r.inner().compress(
        exec, span<const float>(y, padded), span<std::byte>(out.data() + inner_at, out.size() - inner_at), ctx);
    launch(rotation_device::frame_kernel<Codec>, 1, 1, 0, exec.stream(), reinterpret_cast<std::uint8_t*>(out.data()),
           inner_bytes, element_traits<T>::type, n, block, r.rotation().seed());
    return inner_at + inner_bytes;
  }

  template <class Codec, class T>
  static void decompress_add(const transform::rotated<Codec>& r, cuda& exec, span<const std::byte> payload, span<T> accum,
                             float alpha, bool zero_first) {
    expect_block(r, "rotated::decompress");
    require_aligned(payload.data(), "rotated::decompress");
    const std::uint64_t n = accum.size(), padded = r.rotation().padded(n);
    const std::uint64_t inner_at = transform::rotated<Codec>::inner_offset();
    const std::uint32_t block = r.rotation().block();
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(payload.data());
    launch(rotation_device::validate_kernel<Codec>, 1, 1, 0, exec.stream(), bytes, payload.size(), n, block,
           r.rotation().seed(), exec.status_word());
    if (payload.size() < inner_at) return;  // the validation above has recorded it
    const std::size_t at = vector_offset(r, exec, padded);
    auto* y = reinterpret_cast<float*>(exec.scratch(at + padded * sizeof(float)) + at);
    // The inner decoder validates its payload (and skips its work after a failed outer check).
    r.inner().decompress(exec, payload.subspan(inner_at, payload.size() - inner_at), span<float>(y, padded));
    if (zero_first) {
      launch_over<decode_policy>(exec, n, zero_if_ok_kernel<T>, accum.data(), n,
                                 exec.status_word());
    }
    if (padded > 0) {
      launch_units<rotation_policy>(exec, padded / block, block * sizeof(float),
                                    rotation_device::inverse_add_kernel<T>, y, accum.data(), n,
                                    block, padded / block, r.rotation().seed(), scale_of(block),
                                    alpha, exec.status_word());
    }
  }
};

}  // namespace gradzip::detail
