// payload_backend<cuda>: the frame of a payload written on the device, and validated decoding
// (validate, then apply, all stream-ordered; errors go to the executor's status word).
#pragma once

#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "gradzip/detail/cuda/status_word.cuh"
#include "gradzip/detail/cuda/vector_load.cuh"
#include "gradzip/detail/values.hpp"
#include "gradzip/quantize/bit_packing.hpp"
#include "gradzip/wire/reader.hpp"
#include "gradzip/wire/writer.hpp"

namespace gradzip::detail {

/// The decode kernels over entries, bitmap words or delta chunks (validation, zeroing, sparse
/// apply): one item per thread and grid-stride step. The dense apply has its own (below).
using decode_policy = launch_policy<256, 1, 8>;

/**
 * The frame's write as a device task: write_frame_kernel's body, or the prologue a select kernel
 * runs (sink_with_prologue) where its structure backend `writes_frame`. Its bytes are computed on
 * the host by the host's function (frame<Codec>::write_head: the same bytes) and travel in the
 * launch's parameters, so that the device only stores them, a 16-byte word per thread: the head
 * (header, section table, parameters), then the zero padding after each later section.
 */
template <class Codec>
struct frame_task {
  static constexpr std::uint32_t head_words = static_cast<std::uint32_t>(frame<Codec>::head_bytes / 16);
  static constexpr std::uint32_t tails = Codec::section_count - 1;  // the sections after the parameters
  static_assert(frame<Codec>::head_bytes % 16 == 0 && tails >= 1, "frame_task: a 16-byte aligned head, then sections");
  std::uint8_t* out;
  uint4 head[head_words];
  std::uint64_t tail_end[tails];  // where each later section ends: zeros up to the next 16-byte boundary

  /// Thread `thread` of `threads` stores its share of the frame (any thread count).
  GRADZIP_HOST_DEVICE void operator()(unsigned thread, unsigned threads) const {
    for (unsigned w = thread; w < head_words + tails; w += threads) {
      if (w < head_words) {
        reinterpret_cast<uint4*>(out)[w] = head[w];
      } else {
        const std::uint64_t end = tail_end[w - head_words];
        for (std::uint64_t b = end; b < wire::align_up(end); ++b) out[b] = 0;
      }
    }
  }
};

template <class Codec>
__global__ __launch_bounds__(32)
void write_frame_kernel(frame_task<Codec> task) {
  task(threadIdx.x, blockDim.x);
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
  if (!failure_recorded(st)) *st = recheck(p);
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

// Decoding parses a payload's frame once, in parse_kernel, into a payload_view in device scratch
// (`view`); every later kernel of the decode returns at once if the status word holds a failure,
// and otherwise reads the view. Each kernel copies the view into a local first: stores into the
// output could alias it for all the compiler knows, which would reload its fields after every
// store.

/// The view's place at the start of decoding's scratch (the rest is 256-byte aligned).
inline constexpr std::size_t view_bytes = (sizeof(payload_view) + 255) / 256 * 256;

/// Validates the frame for an output of out_size elements and writes the view, or records the
/// failure.
template <class Codec>
__global__ __launch_bounds__(1)
void parse_kernel(const std::uint8_t* bytes, std::uint64_t size, std::uint64_t out_size, payload_view* view,
                  wire::status* st) {
  payload_view v;
  wire::status s = frame<Codec>::parse(bytes, size, v);
  if (s.ok() && v.header.element_count != out_size) {
    s = wire::fail(wire::format_errc::size_mismatch, v.header.element_count, out_size);
  }
  if (!s.ok()) {
    record_failure(st, s);
    return;
  }
  *view = v;
}

/// validate_kernel's element check, for settle.
template <class Codec>
struct element_recheck {
  const payload_view* view;
  __device__ wire::status operator()(std::uint64_t j) const { return frame<Codec>::check_index(*view, j); }
};

template <class T>
__global__ __launch_bounds__(decode_policy::threads)
void zero_if_ok_kernel(T* out, std::uint64_t n, const wire::status* st) {
  if (failure_recorded(st)) return;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = from_double<T>(0.0);
  }
}

/// Calls f(type constant) with the payload's wire element type as a compile-time constant, for
/// element-wise values stages (whose `load` takes it), so that the loop inside f does not switch
/// per element; bucketed stages do not read it, and get one instantiation.
template <class Codec, class F>
__device__ void with_value_type(const payload_view& v, F&& f) {
  if constexpr (Codec::bucketed) {
    f(std::integral_constant<element_type, element_type::f32>{});
  } else {
    with_element_type(v.header.type, f);
  }
}

/// The dense apply's launch: a run of 8 consecutive elements per thread and step, y read and
/// written by 16-byte accesses (load_run, store_run).
using dense_apply_policy = launch_policy<256, 8, 8>;

/// Codes first .. first + 7 of a dense bucketed payload: the run lies in one group of 32 codes
/// (runs start at multiples of 8), so it takes the group's `bits` plane words, not `bits` loads
/// per code. Codes past the count are zero (the packing fills whole words). For 3 to 8 bits the
/// run's byte of each plane goes to byte b of two words, and the 8 x 8 bit transpose (its own
/// inverse; the encode's, bit_planes.cuh) makes byte k code k: about 40 instructions per run
/// instead of two or three per code and plane.
template <class Values>
__device__ inline void codes_of_run(const payload_view& v, std::uint64_t first, unsigned (&code)[8]) {
  const auto* planes = reinterpret_cast<const std::uint32_t*>(v.values) + first / 32 * Values::bits;
  const unsigned shift = static_cast<unsigned>(first % 32);
  if constexpr (Values::bits >= 3 && Values::bits <= 8) {
    std::uint32_t bytes[2] = {0, 0};  // byte b % 4 of bytes[b / 4]: plane b's bits of the run
#pragma unroll
    for (int b = 0; b < Values::bits; ++b) bytes[b / 4] |= ((planes[b] >> shift) & 0xFFu) << (8 * (b % 4));
    quantize::transpose_bits_8x8(bytes[0], bytes[1]);
#pragma unroll
    for (int k = 0; k < 8; ++k) code[k] = (bytes[k / 4] >> (8 * (k % 4))) & 0xFFu;
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) code[k] = 0;
#pragma unroll
    for (int b = 0; b < Values::bits; ++b) {
      const std::uint32_t w = planes[b] >> shift;
#pragma unroll
      for (int k = 0; k < 8; ++k) code[k] |= ((w >> k) & 1u) << b;
    }
  }
}

/// Values first .. first + 7 of a dense bucketed payload: its codes and one record (the run lies
/// in one bucket, a multiple of 32): b + 1 loads per 8 elements, not per element.
template <class Values>
__device__ inline void decode_bucketed_run(const payload_view& v, std::uint64_t first, float (&value)[8]) {
  const auto record = Values::load_record(v.scales, first / Values::bucket);
  unsigned code[8];
  codes_of_run<Values>(v, first, code);
  decode_codes<Values>(code, record, value);  // a branch per thread where the stage has a fast decode
}

/// Lanes of a warp's 32 runs (256 elements) that share a bucket: all 32 when buckets are
/// multiples of 256 elements, B / 8 when 256 / B buckets share the warp (runs start at multiples
/// of 32 runs), 0 when a bucket may straddle two warps' spans.
template <class Values>
inline constexpr unsigned bucket_lanes =
    Values::bucket % 256 == 0 ? 32u : 256 % Values::bucket == 0 ? static_cast<unsigned>(Values::bucket / 8) : 0u;

template <class Values, class = void>
struct declares_table_decode : std::false_type {};
template <class Values>
struct declares_table_decode<Values, std::void_t<decltype(Values::decode_by_table)>>
    : std::bool_constant<Values::decode_by_table> {};

/// Whether a dense payload's values are decoded by table: the stage asks for it (its decode is
/// costly: QSGD's divides) and each bucket's lanes can hold one entry per code.
template <class Codec>
inline constexpr bool decodes_by_table = [] {
  if constexpr (Codec::bucketed && Codec::dense) {
    using Values = typename Codec::values_type;
    return declares_table_decode<Values>::value && (1u << Values::bits) <= bucket_lanes<Values>;
  } else {
    return false;
  }
}();

/// Values of lane `lane`'s run r (possibly empty: a lane past the last run) of a dense bucketed
/// payload, by table: lane g L + c (L = bucket_lanes) computes Values::decode(c, record) of its
/// group's bucket once, and each of the run's codes fetches its value by a shuffle, instead of
/// every element calling decode (QSGD 4-bit: a division per element). Every lane of the warp
/// calls it; the floats are decode's own, so they equal the host's.
template <class Values>
__device__ inline void decode_run_by_table(const payload_view& v, const run_of_8& r, unsigned lane, float (&value)[8]) {
  constexpr unsigned L = bucket_lanes<Values>, codes = 1u << Values::bits;
  static_assert(codes <= L, "decode_run_by_table: an entry per code in each bucket's lanes");
  const std::uint64_t bucket = r.first / Values::bucket;
  // A lane past the last bucket makes an entry nobody fetches: a group with a value has a bucket.
  const auto record = bucket < Values::bucket_count(v.count) ? Values::load_record(v.scales, bucket)
                                                             : typename Values::record{};
  const float entry = Values::decode((lane % L) % codes, record);
  unsigned code[8] = {};
  if (r.valid > 0) codes_of_run<Values>(v, r.first, code);
  const unsigned group = lane - lane % L;
#pragma unroll
  for (int k = 0; k < 8; ++k) value[k] = __shfl_sync(0xFFFFFFFFu, entry, static_cast<int>(group + code[k]));
}

/// Whether a codec's element checks take groups of 32 codes (dense bucketed payloads: only codes
/// to check, compared on their plane words) rather than one element per thread.
template <class Codec>
inline constexpr bool checks_groups = Codec::dense && Codec::bucketed;

/// The code check of a dense bucketed payload: a group of 32 codes (its plane words) per thread
/// and step.
using code_check_policy = launch_policy<256, 32, 8>;

/// Notes the lowest failing position of each thread's share: each element's index and code
/// (Codec::check_index), or for dense bucketed payloads each group of 32 codes, compared with
/// the stage's largest on the group's plane words as the host compares them
/// (`quantize::first_code_above`: no unpacking, two or three word operations per plane).
template <class Codec>
__global__ __launch_bounds__(decode_policy::threads)
void validate_kernel(const payload_view* view, const wire::status* st, unsigned long long* pending) {
  if (failure_recorded(st)) return;
  const payload_view v = *view;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint64_t first_thread = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (checks_groups<Codec>) {
    using Values = typename Codec::values_type;
    static_assert(code_check_policy::threads == decode_policy::threads, "validate_kernel: one block size");
    for (std::uint64_t g = first_thread; g < (v.count + 31) / 32; g += stride) {
      const int l = quantize::first_code_above<Values::bits>(v.values + g * Values::bits * 4, Values::max_code,
                                                             v.count - g * 32);
      if (l >= 0) note_failure(pending, g * 32 + static_cast<std::uint64_t>(l));
    }
  } else {
    for (std::uint64_t j = first_thread; j < v.count; j += stride) {
      if (!frame<Codec>::check_index(v, j).ok()) note_failure(pending, j);
    }
  }
}

/// y[k] += alpha x value[k] (the host's `accumulate`) for the run's first `valid` elements.
template <class T, class V>
__device__ inline void accumulate_run(T (&y)[8], const V (&value)[8], unsigned valid, float alpha) {
#pragma unroll
  for (unsigned k = 0; k < 8; ++k) {
    if (k < valid) accumulate(y[k], value[k], alpha);
  }
}

/**
 * A dense payload (every element, in order) into y: y[i] <- (overwrite ? 0 : y[i]) + alpha x
 * value i, the host's `accumulate` per element. With `overwrite` (decompress) y is written
 * without being read, and nothing zeroes it first: 0 + alpha x v is computed in registers, the
 * same rounding as the host's zero-then-add.
 */
template <class Codec, class T>
__global__ __launch_bounds__(dense_apply_policy::threads)
void dense_apply_kernel(const payload_view* view, T* out, std::uint64_t n, float alpha, bool overwrite,
                        const wire::status* st) {
  static_assert(dense_apply_policy::items_per_thread == 8, "dense_apply_kernel: runs of 8 (load_run)");
  if (failure_recorded(st)) return;
  const payload_view v = *view;
  const std::uint64_t runs = (n + 7) / 8, stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint64_t first_run = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (decodes_by_table<Codec>) {
    // Warp-uniform trips, so that every lane reaches the table's shuffles; a lane past the last
    // run (valid 0) makes its entry and touches nothing else.
    const unsigned lane = threadIdx.x % 32;
    for (std::uint64_t base = first_run - lane; base < runs; base += stride) {
      const run_of_8 r = run_at(base + lane, n);
      T y[8] = {};
      if (!overwrite && r.valid > 0) load_run(out, r.first, r.valid, y);
      float value[8];
      decode_run_by_table<typename Codec::values_type>(v, r, lane, value);
      if (r.valid == 0) continue;
      accumulate_run(y, value, r.valid, alpha);
      store_run(out, r.first, r.valid, y);
    }
    return;
  }
  with_value_type<Codec>(v, [&](auto type) {
    for (std::uint64_t run = first_run; run < runs; run += stride) {
      const run_of_8 r = run_at(run, n);
      T y[8] = {};  // from_double<T>(0.0): all-zero bits for every element type
      if (!overwrite) load_run(out, r.first, r.valid, y);
      if constexpr (Codec::bucketed) {
        float value[8];
        decode_bucketed_run<typename Codec::values_type>(v, r.first, value);
        accumulate_run(y, value, r.valid, alpha);
      } else {
        // Eight independent loads of the values in flight, then the arithmetic.
        double value[8];
#pragma unroll
        for (unsigned k = 0; k < 8; ++k) value[k] = k < r.valid ? frame<Codec>::value_at(v, decltype(type)::value, r.first + k) : 0.0;
        accumulate_run(y, value, r.valid, alpha);
      }
      store_run(out, r.first, r.valid, y);
    }
  });
}

/// Sparse payloads with COO or implicit indices: one element per thread and step. Indices are
/// strictly increasing (validated), so no two threads touch one element.
template <class Codec, class T>
__global__ __launch_bounds__(decode_policy::threads)
void sparse_apply_kernel(const payload_view* view, T* out, float alpha, const wire::status* st) {
  if (failure_recorded(st)) return;
  const payload_view v = *view;
  if (Codec::staged && v.index_encoding != encode::coo::id) return;  // the bitmap or delta kernels' work
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  with_value_type<Codec>(v, [&](auto type) {
    for (std::uint64_t j = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < v.count;
         j += stride) {
      accumulate(out[frame<Codec>::index_at(v, j)], frame<Codec>::value_at(v, decltype(type)::value, j), alpha);
    }
  });
}

// Bitmap indices: bits per word (and bits past n, which fail), a device scan of the counts,
// a check of the total against the count, then one thread per word accumulates its elements.
// Every count is written, 0 when the payload has failed or (automatic indices) is no bitmap:
// the scan that follows reads them all, and must not read scratch nothing wrote
// (compute-sanitizer's initcheck found that on the first H100 run).
template <class = void>
__global__ __launch_bounds__(decode_policy::threads)
void bitmap_count_kernel(const payload_view* view, std::uint64_t out_size, std::uint64_t* counts, wire::status* st) {
  const bool bitmap = !failure_recorded(st) && view->index_encoding == encode::bitmap::id;
  const std::uint8_t* indices = bitmap ? view->indices : nullptr;
  const std::uint64_t words = encode::bitmap::words(out_size);
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t w = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < words;
       w += stride) {
    if (!bitmap) {
      counts[w] = 0;
      continue;
    }
    const wire::status s = encode::bitmap::count_bits(indices, out_size, w, w + 1, counts[w]);
    if (!s.ok()) record_failure(st, s);
  }
}

template <class = void>
__global__ __launch_bounds__(1)
void bitmap_total_kernel(const payload_view* view, std::uint64_t out_size, const std::uint64_t* counts,
                         const std::uint64_t* first, wire::status* st) {
  if (failure_recorded(st)) return;
  if (view->index_encoding != encode::bitmap::id) return;
  const std::uint64_t words = encode::bitmap::words(out_size);
  const std::uint64_t total = words == 0 ? 0 : first[words - 1] + counts[words - 1];
  if (total != view->count) record_failure(st, wire::fail(wire::format_errc::bitmap_count_mismatch, total, view->count));
}

template <class Codec, class T>
__global__ __launch_bounds__(decode_policy::threads)
void bitmap_apply_kernel(const payload_view* view, T* out, std::uint64_t out_size, float alpha,
                         const std::uint64_t* first, const wire::status* st) {
  if (failure_recorded(st)) return;
  const payload_view v = *view;
  if (v.index_encoding != encode::bitmap::id) return;
  const std::uint64_t words = encode::bitmap::words(out_size);
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  with_value_type<Codec>(v, [&](auto type) {
    for (std::uint64_t w = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < words;
         w += stride) {
      encode::bitmap::for_each_index(v.indices, w, w + 1, first[w], [&](std::uint64_t j, std::uint64_t i) {
        accumulate(out[i], frame<Codec>::value_at(v, decltype(type)::value, j), alpha);
      });
    }
  });
}

// Delta-varint indices: one thread per 1024-index chunk, once to validate, once to accumulate.
__device__ inline wire::status check_chunk(const payload_view& v, std::uint64_t out_size, std::uint64_t c) {
  return encode::delta_varint::decode_chunk(v.indices, v.index_bytes, v.count, out_size, v.index_width, c,
                                            [](std::uint64_t, std::uint64_t) {});
}

template <class = void>
__global__ __launch_bounds__(decode_policy::threads)
void delta_validate_kernel(const payload_view* view, std::uint64_t out_size, const wire::status* st,
                           unsigned long long* pending) {
  if (failure_recorded(st)) return;
  const payload_view v = *view;
  if (v.index_encoding != encode::delta_varint::id) return;
  const std::uint64_t chunks = encode::delta_varint::chunks(v.count);
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t c = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += stride) {
    if (!check_chunk(v, out_size, c).ok()) note_failure(pending, c);
  }
}

/// delta_validate_kernel's chunk check, for settle.
struct chunk_recheck {
  const payload_view* view;
  std::uint64_t out_size;
  __device__ wire::status operator()(std::uint64_t c) const { return check_chunk(*view, out_size, c); }
};

template <class Codec, class T>
__global__ __launch_bounds__(decode_policy::threads)
void delta_apply_kernel(const payload_view* view, T* out, std::uint64_t out_size, float alpha, const wire::status* st) {
  if (failure_recorded(st)) return;
  const payload_view v = *view;
  if (v.index_encoding != encode::delta_varint::id) return;
  const std::uint64_t chunks = encode::delta_varint::chunks(v.count);
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  with_value_type<Codec>(v, [&](auto type) {
    for (std::uint64_t c = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
         c += stride) {
      encode::delta_varint::decode_chunk(v.indices, v.index_bytes, v.count, out_size, v.index_width, c,
                                         [&](std::uint64_t j, std::uint64_t i) {
        accumulate(out[i], frame<Codec>::value_at(v, decltype(type)::value, j), alpha);
      });
    }
  });
}

template <>
struct payload_backend<cuda> {
  /// Decoding's scratch: the parsed view; for bitmap payloads, the per-word bit counts, their
  /// exclusive sums and the scan's storage.
  template <class Codec>
  static std::size_t decode_workspace_bytes(cuda& exec, std::size_t n) {
    using Indices = typename Codec::indices_type;
    if constexpr (std::is_same_v<Indices, encode::automatic> || std::is_same_v<Indices, encode::bitmap>) {
      const std::uint64_t words = encode::bitmap::words(n);
      return view_bytes + 2 * words * sizeof(std::uint64_t) + 256 + exclusive_sum_bytes(exec, words);
    } else {
      return view_bytes;
    }
  }

  template <class Codec>
  static void write_frame(cuda& exec, const Codec& c, std::uint8_t* out,
                          const wire::payload_layout& l, element_type type, std::uint64_t n,
                          std::uint64_t k, const frame_params& sp) {
    launch(write_frame_kernel<Codec>, 1, 32, 0, exec.stream(), frame_for(c, out, l, type, n, k, sp));
  }

  /// The frame's bytes for a device task (write_frame_kernel, or a select kernel's prologue in
  /// codec compress, where the structure backend `writes_frame`: one launch fewer).
  template <class Codec>
  static frame_task<Codec> frame_for(const Codec&, std::uint8_t* out, const wire::payload_layout& l,
                                     element_type type, std::uint64_t n, std::uint64_t k, const frame_params& sp) {
    require_aligned(out, "compress");
    using task = frame_task<Codec>;
    GRADZIP_EXPECTS(l.section_count() == Codec::section_count && l.at(1).offset == frame<Codec>::head_bytes,
                    "frame_for: the layout (", l.section_count(), " sections, the second at byte ",
                    l.section_count() > 1 ? l.at(1).offset : 0, ") is not the codec's (", Codec::section_count,
                    ", at ", frame<Codec>::head_bytes, ")");
    task t{};
    t.out = out;
    alignas(16) std::uint8_t head[frame<Codec>::head_bytes];
    frame<Codec>::write_head(head, l, type, n, k, sp);
    std::memcpy(t.head, head, sizeof head);
    for (std::uint32_t s = 0; s < task::tails; ++s) t.tail_end[s] = l.at(s + 1).offset + l.at(s + 1).size;
    return t;
  }

  /// What check leaves for the decode's writes, in scratch: the parsed view and, for bitmap
  /// indices, each word's first value.
  struct checked {
    const payload_view* view;
    const std::uint64_t* first;
  };

  /// Every check of a payload for an output of out_size elements, writing nothing but the status
  /// word and scratch: the frame parsed once into the view, then the bitmap's or delta-varint's
  /// indices, then each element's code and COO index: the host's order, so that a payload with
  /// two faults gets the host's error (the status word keeps the first one recorded).
  template <class Codec>
  static checked check(cuda& exec, const Codec&, span<const std::byte> payload, std::uint64_t out_size) {
    const checked c = prepare<Codec>(exec, payload, out_size);
    using Indices = typename Codec::indices_type;
    if constexpr (std::is_same_v<Indices, encode::automatic> || std::is_same_v<Indices, encode::delta_varint>) {
      launch_over<decode_policy>(exec, delta_chunk_bound(payload, out_size),
                                 delta_validate_kernel<>, c.view, out_size, exec.status_word(),
                                 exec.pending_failure());
      settle(exec, chunk_recheck{c.view, out_size});
    }
    if constexpr (Codec::checks_elements) {
      const unsigned grid = checks_groups<Codec> ? grid_for_policy<code_check_policy>(exec, out_size)
                                               : grid_for_policy<decode_policy>(exec, entry_bound<Codec>(payload, out_size));
      launch(validate_kernel<Codec>, grid, decode_policy::threads,
             0, exec.stream(), c.view, exec.status_word(),
             exec.pending_failure());
      settle(exec, element_recheck<Codec>{c.view});
    }
    return c;
  }

  /// What the writes need of a payload, and only the checks that come with it: the frame parsed
  /// into the view; for bitmap indices, each word's first value (and the bit total checked).
  template <class Codec>
  static checked prepare(cuda& exec, span<const std::byte> payload, std::uint64_t out_size) {
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(payload.data());
    require_aligned(bytes, "decompress");
    std::byte* ws = exec.scratch(decode_workspace_bytes<Codec>(exec, out_size));
    auto* view = reinterpret_cast<payload_view*>(ws);
    launch(parse_kernel<Codec>, 1, 1, 0, exec.stream(), bytes, payload.size(), out_size, view, exec.status_word());
    using Indices = typename Codec::indices_type;
    const std::uint64_t* first = nullptr;
    if constexpr (std::is_same_v<Indices, encode::automatic> || std::is_same_v<Indices, encode::bitmap>) {
      const std::uint64_t words = encode::bitmap::words(out_size);
      const std::size_t temp_bytes = exclusive_sum_bytes(exec, words);
      auto* counts = reinterpret_cast<std::uint64_t*>(ws + view_bytes);
      first = counts + words;
      launch_over<decode_policy>(exec, words, bitmap_count_kernel<>, view, out_size, counts,
                                 exec.status_word());
      if (words != 0) {
        std::size_t temp_size = temp_bytes;
        GRADZIP_CUDA_TRY(cub::DeviceScan::ExclusiveSum(reinterpret_cast<std::byte*>(counts + 2 * words) + 256, temp_size,
                                                       counts, counts + words, words, exec.stream()));
      }
      launch(bitmap_total_kernel<>, 1, 1, 0, exec.stream(), view, out_size, counts, first, exec.status_word());
    }
    return {view, first};
  }

  /// At most min(n, payload bytes / 2) entries: each takes at least a 1-byte value and a byte of
  /// indices, or for a dense payload is one of the n elements. The grids cover that bound; the
  /// kernels read the true count from the view.
  template <class Codec>
  static std::uint64_t entry_bound(span<const std::byte> payload, std::uint64_t out_size) {
    return Codec::dense ? out_size : std::min<std::uint64_t>(out_size, payload.size() / 2);
  }

  /// At most min(n, payload bytes) indices: each takes at least a byte of delta-varint data.
  static std::uint64_t delta_chunk_bound(span<const std::byte> payload, std::uint64_t out_size) {
    return encode::delta_varint::chunks(std::min<std::uint64_t>(out_size, payload.size()));
  }

  template <class Codec, class T>
  static void decode(cuda& exec, const Codec& codec, span<const std::byte> payload, span<T> out,
                     float alpha, bool overwrite) {
    apply<Codec>(exec, check(exec, codec, payload, out.size()), payload, out, alpha, overwrite);
  }

  /// decode of a payload that check() has already passed on exec's stream, for an output of
  /// out.size() elements, its bytes unchanged since: the index and code validation passes are
  /// not run again (one read of the payload and four launches fewer). What a caller that checks
  /// every payload before applying any uses (codec::decompress_add_all, comm::allreducer): if a
  /// check failed, the status word makes every kernel here return at once.
  template <class Codec, class T>
  static void decode_checked(cuda& exec, const Codec&, span<const std::byte> payload, span<T> out, float alpha,
                             bool overwrite) {
    apply<Codec>(exec, prepare<Codec>(exec, payload, out.size()), payload, out, alpha, overwrite);
  }

  /// decode's writes, from check's or prepare's view.
  template <class Codec, class T>
  static void apply(cuda& exec, const checked& c, span<const std::byte> payload, span<T> out, float alpha,
                    bool overwrite) {
    static_assert(is_element_v<T>, "decode: output must be a gradzip element type");
    // Only the codec's own path is instantiated: a dense codec's decode has no sparse kernels.
    if constexpr (Codec::dense) {  // every element written: no zeroing for decompress
      launch_over<dense_apply_policy>(exec, out.size(), dense_apply_kernel<Codec, T>, c.view,
                                      out.data(), out.size(), alpha, overwrite, exec.status_word());
    } else {
      apply_sparse<Codec>(exec, c, payload, out, alpha, overwrite);
    }
  }

  /// decode's writes for a sparse codec: zero the output (decompress), then each encoding's
  /// apply kernel, each returning at once unless the payload holds that encoding.
  template <class Codec, class T>
  static void apply_sparse(cuda& exec, const checked& c, span<const std::byte> payload, span<T> out, float alpha,
                           bool overwrite) {
    using Indices = typename Codec::indices_type;
    constexpr bool automatic = std::is_same_v<Indices, encode::automatic>;
    constexpr bool may_bitmap = automatic || std::is_same_v<Indices, encode::bitmap>;
    constexpr bool may_delta = automatic || std::is_same_v<Indices, encode::delta_varint>;
    if (overwrite && !out.empty()) {
      launch_over<decode_policy>(exec, out.size(), zero_if_ok_kernel<T>, out.data(), out.size(),
                                 exec.status_word());
    }
    if constexpr (!Codec::staged || automatic) {
      launch_over<decode_policy>(exec, entry_bound<Codec>(payload, out.size()),
                                 sparse_apply_kernel<Codec, T>, c.view, out.data(), alpha,
                                 exec.status_word());
    }
    if constexpr (may_bitmap) {
      launch_over<decode_policy>(exec, encode::bitmap::words(out.size()),
                                 bitmap_apply_kernel<Codec, T>, c.view, out.data(), out.size(),
                                 alpha, c.first, exec.status_word());
    }
    if constexpr (may_delta) {
      launch_over<decode_policy>(exec, delta_chunk_bound(payload, out.size()),
                                 delta_apply_kernel<Codec, T>, c.view, out.data(), out.size(),
                                 alpha, exec.status_word());
    }
  }
};

}  // namespace gradzip::detail
