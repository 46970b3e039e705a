// payload_backend<cuda>: the frame of a payload written on the device, and validated decoding
// (validate, then apply, all stream-ordered; errors go to the executor's status word).
#pragma once

#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <type_traits>

#include "gradzip/detail/values.hpp"
#include "gradzip/wire/reader.hpp"
#include "gradzip/wire/writer.hpp"

namespace gradzip::detail {

template <class Codec>
__global__ __launch_bounds__(1)
void write_frame_kernel(std::uint8_t* out, wire::payload_layout layout, element_type type,
                        std::uint64_t n, std::uint64_t k, frame_params sp) {
  frame<Codec>::write_frame(out, layout, type, n, k, sp);  // the host's function: the same bytes
}

/// Records the first failure: only the thread that claims the empty word writes the numbers. For
/// failures only one thread can meet (a frame checked by one thread); where many threads check
/// many positions, note_failure and settle pick the one the host reports.
__device__ inline void record_failure(wire::status* st, const wire::status& s) {
  auto* code = reinterpret_cast<unsigned int*>(&st->code);
  if (atomicCAS(code, 0u, static_cast<unsigned int>(s.code)) == 0u) {
    st->a = s.a;
    st->b = s.b;
    st->c = s.c;
  }
}

/// Notes that position p failed the validation pass in flight. The lowest position wins whatever
/// order the threads run in; settle() then reports that position's failure, as the host does.
__device__ inline void note_failure(unsigned long long* pending, std::uint64_t p) { atomicMin(pending, p); }

/// One thread, after a validation pass: `recheck(p)` (the pass's own check) at the lowest failing
/// position becomes the executor's failure, unless an earlier one is recorded; the note clears.
template <class Recheck>
__global__ __launch_bounds__(1)
void settle_kernel(Recheck recheck, wire::status* st, unsigned long long* pending) {
  const unsigned long long p = *pending;
  if (p == cuda::no_failure) return;
  if (st->ok()) *st = recheck(p);
  *pending = cuda::no_failure;
}

template <class Recheck>
void settle(cuda& exec, const Recheck& recheck) {
  launch(settle_kernel<Recheck>, 1, 1, 0, exec.stream(), recheck, exec.status_word(), exec.pending_failure());
}

/// Thread 0 runs `check` (a wire::status; it may fill shared memory for the block); returns,
/// to the whole block, whether it passed. A failure is recorded in `st` unless st is null.
template <class Check>
__device__ bool check_in_block(Check check, wire::status* st) {
  __shared__ bool ok;
  if (threadIdx.x == 0) {
    const wire::status s = check();
    ok = s.ok();
    if (!ok && st != nullptr) record_failure(st, s);
  }
  __syncthreads();
  return ok;
}

/// Thread 0 parses the payload into shared memory; returns false (for the whole block) on error.
template <class Codec>
__device__ bool parse_in_block(const std::uint8_t* bytes, std::uint64_t size, std::uint64_t out_size,
                               payload_view& v, wire::status* st, bool report) {
  return check_in_block(
      [&] {
        wire::status s = frame<Codec>::parse(bytes, size, v);
        if (s.ok() && v.header.element_count != out_size) {
          s = wire::fail(wire::format_errc::size_mismatch, v.header.element_count, out_size);
        }
        return s;
      },
      report ? st : nullptr);
}

/// Shared-memory home of a parsed view (shared variables cannot have constructors).
__device__ inline payload_view& shared_view() {
  alignas(payload_view) __shared__ unsigned char storage[sizeof(payload_view)];
  return *reinterpret_cast<payload_view*>(storage);
}

template <class Codec>
__global__ __launch_bounds__(block_threads)
void validate_kernel(const std::uint8_t* bytes, std::uint64_t size, std::uint64_t out_size,
                     wire::status* st, unsigned long long* pending) {
  payload_view& v = shared_view();
  if (!parse_in_block<Codec>(bytes, size, out_size, v, st, blockIdx.x == 0)) return;
  if constexpr (!Codec::checks_elements) return;  // nothing beyond the frame to check
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t j = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       j < v.count; j += stride) {
    if (!frame<Codec>::check_index(v, j).ok()) note_failure(pending, j);
  }
}

/// validate_kernel's element check, for settle.
template <class Codec>
struct element_recheck {
  const std::uint8_t* bytes;
  std::uint64_t size;
  __device__ wire::status operator()(std::uint64_t j) const {
    payload_view v;
    frame<Codec>::parse(bytes, size, v);  // it passed in validate_kernel
    return frame<Codec>::check_index(v, j);
  }
};

template <class T>
__global__ __launch_bounds__(block_threads)
void zero_if_ok_kernel(T* out, std::uint64_t n, const wire::status* st) {
  if (st->code != wire::format_errc::ok) return;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = from_double<T>(0.0);
  }
}

template <class Codec, class T>
__global__ __launch_bounds__(block_threads)
void apply_kernel(const std::uint8_t* bytes, std::uint64_t size, T* out,
                  std::uint64_t out_size, float alpha, const wire::status* st) {
  if (st->code != wire::format_errc::ok) return;  // validation failed: change nothing
  payload_view& v = shared_view();
  if (!parse_in_block<Codec>(bytes, size, out_size, v, nullptr, false)) return;
  if (Codec::staged && v.index_encoding != encode::coo::id) return;  // the bitmap or delta kernels' work
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t j = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       j < v.count; j += stride) {
    // Indices are strictly increasing (validated), so no two threads touch one element.
    accumulate(out[frame<Codec>::index_at(v, j)], frame<Codec>::value_at(v, v.header.type, j), alpha);
  }
}

// Bitmap indices: bits per word (and bits past n, which fail), a device scan of the counts,
// a check of the total against the count, then one thread per word accumulates its elements.
template <class Codec>
__global__ __launch_bounds__(block_threads)
void bitmap_count_kernel(const std::uint8_t* bytes, std::uint64_t size, std::uint64_t out_size,
                         std::uint64_t* counts, wire::status* st) {
  payload_view& v = shared_view();
  if (!parse_in_block<Codec>(bytes, size, out_size, v, nullptr, false)) return;  // validate_kernel reports
  if (v.index_encoding != encode::bitmap::id) return;
  const std::uint64_t words = encode::bitmap::words(out_size);
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t w = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < words;
       w += stride) {
    const wire::status s = encode::bitmap::count_bits(v.indices, out_size, w, w + 1, counts[w]);
    if (!s.ok()) record_failure(st, s);
  }
}

template <class Codec>
__global__ __launch_bounds__(1)
void bitmap_total_kernel(const std::uint8_t* bytes, std::uint64_t size, std::uint64_t out_size,
                         const std::uint64_t* counts, const std::uint64_t* first, wire::status* st) {
  payload_view& v = shared_view();
  if (!parse_in_block<Codec>(bytes, size, out_size, v, nullptr, false)) return;
  if (v.index_encoding != encode::bitmap::id) return;
  const std::uint64_t words = encode::bitmap::words(out_size);
  const std::uint64_t total = words == 0 ? 0 : first[words - 1] + counts[words - 1];
  if (total != v.count) record_failure(st, wire::fail(wire::format_errc::bitmap_count_mismatch, total, v.count));
}

template <class Codec, class T>
__global__ __launch_bounds__(block_threads)
void bitmap_apply_kernel(const std::uint8_t* bytes, std::uint64_t size, T* out, std::uint64_t out_size,
                         float alpha, const std::uint64_t* first, const wire::status* st) {
  if (st->code != wire::format_errc::ok) return;
  payload_view& v = shared_view();
  if (!parse_in_block<Codec>(bytes, size, out_size, v, nullptr, false)) return;
  if (v.index_encoding != encode::bitmap::id) return;
  const std::uint64_t words = encode::bitmap::words(out_size);
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t w = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < words;
       w += stride) {
    encode::bitmap::for_each_index(v.indices, w, w + 1, first[w], [&](std::uint64_t j, std::uint64_t i) {
      accumulate(out[i], frame<Codec>::value_at(v, v.header.type, j), alpha);
    });
  }
}

// Delta-varint indices: one thread per 1024-index chunk, once to validate, once to accumulate.
__device__ inline wire::status check_chunk(const payload_view& v, std::uint64_t out_size, std::uint64_t c) {
  return encode::delta_varint::decode_chunk(v.indices, v.index_bytes, v.count, out_size, v.index_width, c,
                                            [](std::uint64_t, std::uint64_t) {});
}

template <class Codec>
__global__ __launch_bounds__(block_threads)
void delta_validate_kernel(const std::uint8_t* bytes, std::uint64_t size, std::uint64_t out_size,
                           unsigned long long* pending) {
  payload_view& v = shared_view();
  if (!parse_in_block<Codec>(bytes, size, out_size, v, nullptr, false)) return;
  if (v.index_encoding != encode::delta_varint::id) return;
  const std::uint64_t chunks = encode::delta_varint::chunks(v.count);
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t c = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += stride) {
    if (!check_chunk(v, out_size, c).ok()) note_failure(pending, c);
  }
}

/// delta_validate_kernel's chunk check, for settle.
template <class Codec>
struct chunk_recheck {
  const std::uint8_t* bytes;
  std::uint64_t size, out_size;
  __device__ wire::status operator()(std::uint64_t c) const {
    payload_view v;
    frame<Codec>::parse(bytes, size, v);
    return check_chunk(v, out_size, c);
  }
};

template <class Codec, class T>
__global__ __launch_bounds__(block_threads)
void delta_apply_kernel(const std::uint8_t* bytes, std::uint64_t size, T* out, std::uint64_t out_size,
                        float alpha, const wire::status* st) {
  if (st->code != wire::format_errc::ok) return;
  payload_view& v = shared_view();
  if (!parse_in_block<Codec>(bytes, size, out_size, v, nullptr, false)) return;
  if (v.index_encoding != encode::delta_varint::id) return;
  const std::uint64_t chunks = encode::delta_varint::chunks(v.count);
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t c = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += stride) {
    encode::delta_varint::decode_chunk(v.indices, v.index_bytes, v.count, out_size, v.index_width, c,
                                       [&](std::uint64_t j, std::uint64_t i) {
      accumulate(out[i], frame<Codec>::value_at(v, v.header.type, j), alpha);
    });
  }
}

template <>
struct payload_backend<cuda> {
  /// Decoding's scratch: a bitmap payload's per-word bit counts, their exclusive sums, and the
  /// scan's storage (the other encodings need none).
  template <class Codec>
  static std::size_t decode_workspace_bytes(cuda& exec, std::size_t n) {
    using Indices = typename Codec::indices_type;
    if constexpr (std::is_same_v<Indices, encode::automatic> || std::is_same_v<Indices, encode::bitmap>) {
      const std::uint64_t words = encode::bitmap::words(n);
      return 2 * words * sizeof(std::uint64_t) + 256 + exclusive_sum_bytes(exec, words);
    } else {
      return 0;
    }
  }

  template <class Codec>
  static void write_frame(cuda& exec, const Codec&, std::uint8_t* out,
                          const wire::payload_layout& l, element_type type, std::uint64_t n,
                          std::uint64_t k, const frame_params& sp) {
    require_aligned(out, "compress");
    launch(write_frame_kernel<Codec>, 1, 1, 0, exec.stream(), out, l, type, n, k, sp);
  }

  /// Every check of a payload for an output of out_size elements, writing nothing but the status
  /// word (and, for bitmap indices, the per-word counts in scratch, which it returns).
  template <class Codec>
  static std::uint64_t* check(cuda& exec, const Codec&, span<const std::byte> payload, std::uint64_t out_size) {
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(payload.data());
    require_aligned(bytes, "decompress");
    // At most payload.size() / 4 entries can fit (a 2-byte value needs a 4-byte index): the
    // grid covers that bound; the kernels read the true count from the validated header.
    const unsigned grid = grid_for(exec, payload.size() / 4);
    launch(validate_kernel<Codec>, grid, block_threads, 0, exec.stream(), bytes, payload.size(), out_size,
           exec.status_word(), exec.pending_failure());
    if constexpr (Codec::checks_elements) settle(exec, element_recheck<Codec>{bytes, payload.size()});
    using Indices = typename Codec::indices_type;
    constexpr bool automatic = std::is_same_v<Indices, encode::automatic>;
    constexpr bool may_bitmap = automatic || std::is_same_v<Indices, encode::bitmap>;
    constexpr bool may_delta = automatic || std::is_same_v<Indices, encode::delta_varint>;
    const std::uint64_t words = encode::bitmap::words(out_size);
    std::uint64_t* counts = nullptr;
    if constexpr (may_bitmap) {
      const std::size_t temp_bytes = exclusive_sum_bytes(exec, words);
      counts = reinterpret_cast<std::uint64_t*>(exec.scratch(decode_workspace_bytes<Codec>(exec, out_size)));
      std::uint64_t* first = counts + words;
      launch(bitmap_count_kernel<Codec>, grid_for(exec, words), block_threads, 0, exec.stream(), bytes, payload.size(), out_size,
             counts, exec.status_word());
      if (words != 0) {
        std::size_t temp_size = temp_bytes;
        GRADZIP_CUDA_TRY(cub::DeviceScan::ExclusiveSum(reinterpret_cast<std::byte*>(first + words) + 256, temp_size,
                                                       counts, first, words, exec.stream()));
      }
      launch(bitmap_total_kernel<Codec>, 1, 1, 0, exec.stream(), bytes, payload.size(), out_size, counts, first,
             exec.status_word());
    }
    if constexpr (may_delta) {
      const std::uint64_t chunk_bound = delta_chunk_bound(payload, out_size);
      launch(delta_validate_kernel<Codec>, grid_for(exec, chunk_bound), block_threads, 0, exec.stream(), bytes,
             payload.size(), out_size, exec.pending_failure());
      settle(exec, chunk_recheck<Codec>{bytes, payload.size(), out_size});
    }
    return counts;
  }

  /// At most min(n, payload bytes) indices: each takes at least a byte of delta-varint data.
  static std::uint64_t delta_chunk_bound(span<const std::byte> payload, std::uint64_t out_size) {
    return encode::delta_varint::chunks(std::min<std::uint64_t>(out_size, payload.size()));
  }

  template <class Codec, class T>
  static void decode(cuda& exec, const Codec& codec, span<const std::byte> payload, span<T> out,
                     float alpha, bool overwrite) {
    static_assert(is_element_v<T>, "decode: output must be a gradzip element type");
    std::uint64_t* counts = check(exec, codec, payload, out.size());
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(payload.data());
    const unsigned grid = grid_for(exec, payload.size() / 4);
    using Indices = typename Codec::indices_type;
    constexpr bool automatic = std::is_same_v<Indices, encode::automatic>;
    constexpr bool may_bitmap = automatic || std::is_same_v<Indices, encode::bitmap>;
    constexpr bool may_delta = automatic || std::is_same_v<Indices, encode::delta_varint>;
    const std::uint64_t words = encode::bitmap::words(out.size());
    if (overwrite && !out.empty()) {
      launch(zero_if_ok_kernel<T>, grid_for(exec, out.size()), block_threads, 0, exec.stream(), out.data(), out.size(),
             exec.status_word());
    }
    if constexpr (!Codec::staged || automatic) {
      launch(apply_kernel<Codec, T>, grid, block_threads, 0, exec.stream(), bytes, payload.size(), out.data(), out.size(), alpha,
             exec.status_word());
    }
    if constexpr (may_bitmap) {
      launch(bitmap_apply_kernel<Codec, T>, grid_for(exec, words), block_threads, 0, exec.stream(), bytes, payload.size(),
             out.data(), out.size(), alpha, counts + words, exec.status_word());
    }
    if constexpr (may_delta) {
      launch(delta_apply_kernel<Codec, T>, grid_for(exec, delta_chunk_bound(payload, out.size())), block_threads, 0, exec.stream(), bytes, payload.size(),
             out.data(), out.size(), alpha, exec.status_word());
    }
  }
};

}  // namespace gradzip::detail
