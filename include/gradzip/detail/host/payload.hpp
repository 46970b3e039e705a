// payload_backend<host> (writing a payload's frame; validating and decoding payloads, one or
// many, in parallel chunks) and async_compress_backend<host> (compress_async on the host: the
// size written through the pointer). The CUDA ones are in detail/cuda/.
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "gradzip/core/error.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/detail/codec_frame.hpp"
#include "gradzip/detail/codec_traits.hpp"
#include "gradzip/detail/host/encode.hpp"
#include "gradzip/detail/host/parallel.hpp"
#include "gradzip/detail/host/quantize.hpp"
#include "gradzip/detail/values.hpp"
#include "gradzip/wire/reader.hpp"

namespace gradzip::detail {

template <>
struct async_compress_backend<host> {
  template <class Codec, class T>
  static void compress(host& exec, const Codec& c, span<const T> input, span<std::byte> out, std::uint64_t* size,
                       quantize::compress_context ctx) {
    *size = c.compress(exec, input, out, ctx);
  }
};

template <>
struct payload_backend<host> {
  /// Decoding's scratch: a status and a count per chunk, at most one chunk per thread.
  template <class Codec>
  static std::size_t decode_workspace_bytes(host& exec, std::size_t) {
    return static_cast<std::size_t>(std::max(1, exec.threads())) * (sizeof(wire::status) + sizeof(std::uint64_t));
  }

  template <class Codec>
  static void write_frame(host&, const Codec&, std::uint8_t* out, const wire::payload_layout& l,
                          element_type type, std::uint64_t n, std::uint64_t k, const frame_params& sp) {
    frame<Codec>::write_frame(out, l, type, n, k, sp);
  }

  template <class Codec, class T>
  static void decode(host& exec, const Codec&, span<const std::byte> payload, span<T> out,
                     float alpha, bool overwrite) {
    static_assert(is_element_v<T>, "decode: output must be a gradzip element type");
    const payload_view v = parse_for<Codec>(payload, out.size());
    validate<Codec>(exec, v);  // before anything is written: a bad payload changes nothing
    apply<Codec>(exec, v, out, alpha, overwrite);
  }

  /**
   * out <- (overwrite ? 0 : out) + alpha * sum over p of decode(payloads[p]). Every payload is
   * validated before any is applied; on a bad one this throws its format_error and sets `bad` to
   * its position. Bucketed dense payloads are then accumulated in one pass over `out`: each
   * chunk of the output takes every payload's part of it while it is in cache. Element-wise
   * dense payloads and sparse ones are applied one after another.
   */
  template <class Codec, class T>
  static void decode_all(host& exec, const Codec&, span<const span<const std::byte>> payloads, span<T> out,
                         float alpha, bool overwrite, std::size_t& bad) {
    static_assert(is_element_v<T>, "decode: output must be a gradzip element type");
    constexpr std::size_t on_stack = 64;  // more peers than this: one small allocation per call
    payload_view stack_views[on_stack];
    std::vector<payload_view> heap_views(payloads.size() > on_stack ? payloads.size() : 0);
    payload_view* views = payloads.size() > on_stack ? heap_views.data() : stack_views;
    for (bad = 0; bad < payloads.size(); ++bad) {
      views[bad] = parse_for<Codec>(payloads[bad], out.size());
      validate<Codec>(exec, views[bad]);
    }
    if constexpr (Codec::dense) {
      if (overwrite) std::fill(out.begin(), out.end(), from_double<T>(0.0));
      accumulate_dense<Codec>(exec, views, payloads.size(), out, alpha);
    } else {
      for (std::size_t p = 0; p < payloads.size(); ++p) apply<Codec>(exec, views[p], out, alpha, overwrite && p == 0);
    }
  }

 private:
  /// Parses a payload for an output of `size` elements, throwing on any frame error.
  template <class Codec>
  static payload_view parse_for(span<const std::byte> payload, std::size_t size) {
    payload_view v;
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(payload.data());
    wire::throw_if_failed(frame<Codec>::parse(bytes, payload.size(), v), "decompress");
    if (v.header.flags & wire::flag_checksum) wire::read_header(payload);  // verifies the CRC
    if (v.header.element_count != size) {
      wire::throw_if_failed(wire::fail(wire::format_errc::size_mismatch, v.header.element_count, size), "decompress");
    }
    return v;
  }

  /// Every check beyond the frame, writing nothing: each index (COO: in range and increasing;
  /// bitmap: no bit past n, as many bits as the count; delta-varint: every chunk decodes
  /// cleanly) and each value's code. Throws the first failure, in order.
  template <class Codec>
  static void validate(host& exec, const payload_view& v) {
    if constexpr (Codec::staged) {
      if (v.index_encoding == encode::bitmap::id) return validate_bitmap<Codec>(exec, v);
      if (v.index_encoding == encode::delta_varint::id) return validate_delta_varint<Codec>(exec, v);
    }
    if constexpr (Codec::bucketed) {
      validate_buckets<Codec>(exec, v);
    } else if constexpr (Codec::checks_elements) {
      check_every_element<Codec>(exec, v);
    }
  }

  /// The writes of a validated payload: out <- (overwrite ? 0 : out) + alpha * decode(v).
  template <class Codec, class T>
  static void apply(host& exec, const payload_view& v, span<T> out, float alpha, bool overwrite) {
    if constexpr (Codec::staged) {  // bitmap and delta-varint read their indices in order
      if (v.index_encoding == encode::bitmap::id) return apply_bitmap<Codec>(exec, v, out, alpha, overwrite);
      if (v.index_encoding == encode::delta_varint::id) return apply_delta_varint<Codec>(exec, v, out, alpha, overwrite);
    }
    if constexpr (Codec::bucketed) {
      apply_buckets<Codec>(exec, v, out, alpha, overwrite);
    } else {
      apply_values<Codec>(exec, v, out, alpha, overwrite);
    }
  }

  /// Selected entries per chunk below which a decode stays on one thread. An entry is a random
  /// read-modify-write of the output (a cache miss, ~100 x a streamed element), so chunks of
  /// sparse entries pay for a thread far sooner than chunk_count's default of 2^16 elements:
  /// top-k 1 % of a 6.5 M-element fusion group (65 k entries) decoded at 0.66x the speed of one
  /// 25.6 M-element call with 2 threads before this (benchmarks/host_fusion.cpp).
  static constexpr std::size_t entries_per_chunk = 1 << 12;

  /// Codec::check_index for every element, in parallel chunks; throws the first failure.
  template <class Codec>
  static void check_every_element(host& exec, const payload_view& v) {
    const std::size_t chunks = chunk_count(exec, v.count, entries_per_chunk);
    validate_chunks(exec, chunks, [&](std::size_t c) {
      const index_range r = chunk_of(v.count, chunks, c);
      for (std::uint64_t j = r.begin; j < r.end; ++j) {
        const wire::status s = frame<Codec>::check_index(v, j);
        if (!s.ok()) return s;
      }
      return wire::status{};
    });
  }

  /// The dense half of decode_all: bucketed values chunk by chunk over `out`, every payload's
  /// part of the chunk; element-wise values payload by payload.
  template <class Codec, class T>
  static void accumulate_dense(host& exec, const payload_view* views, std::size_t count, span<T> out, float alpha) {
    if constexpr (Codec::bucketed) {
      using Values = typename Codec::values_type;
      const std::uint64_t groups = (out.size() + 31) / 32;
      const std::size_t chunks = std::max<std::size_t>(1, chunk_count(exec, out.size()));
      for_each_chunk(exec, chunks, [&](std::size_t c) {
        const index_range g = chunk_of(groups, chunks, c);
        for (std::size_t p = 0; p < count; ++p) {
          values_backend<host>::decode_groups<Values>(views[p].scales, views[p].values, views[p].count, g.begin, g.end,
                                                      identity_index{}, out.data(), alpha);
        }
      });
    } else {
      // Element-wise values (casts, fp32): payload after payload through apply_values's loop,
      // which vectorizes. A fused loop over the payloads, chunk by chunk, read each value through
      // value_at and ran 10x slower for fp16 (11.4 ms against 1.1 ms for 4 x 2^20, one thread).
      // Each element still sums its payloads in order, so the bits are the same.
      for (std::size_t p = 0; p < count; ++p) apply_values<Codec>(exec, views[p], out, alpha, false);
    }
  }

  /// Runs check(c) for every chunk in parallel, its status into found[c], and throws the first
  /// failure in order, so the error names the first bad position.
  template <class Check>
  static void validate_into(host& exec, wire::status* found, std::size_t chunks, Check check) {
    std::fill(found, found + chunks, wire::status{});
    for_each_chunk(exec, chunks, [&](std::size_t c) { found[c] = check(c); });
    for (std::size_t c = 0; c < chunks; ++c) wire::throw_if_failed(found[c], "decompress");
  }

  template <class Check>
  static void validate_chunks(host& exec, std::size_t chunks, Check check) {
    validate_into(exec, reinterpret_cast<wire::status*>(exec.scratch(chunks * sizeof(wire::status))),
                  chunks, check);
  }

  /// Every value's code is one the values stage writes (bitmap and delta-varint payloads).
  template <class Codec>
  static void validate_codes(host& exec, const payload_view& v) {
    // The code half of check_index: there are no COO indices in these payloads.
    if constexpr (needs_code_check<typename Codec::values_type>::value) check_every_element<Codec>(exec, v);
  }

  /// Calls apply(local view, element type tag) with the view copied into a local (stores into
  /// `out` could alias it, and the loops vectorize only once the compiler knows they cannot).
  template <class Codec, class T, class Apply>
  static void prepare_output(const payload_view& v, span<T> out, bool overwrite, Apply apply) {
    if (overwrite) std::fill(out.begin(), out.end(), from_double<T>(0.0));
    with_element_type(v.header.type, [&](auto type) { apply(type); });
  }

  /// Bitmap indices: the chunks of words, one per thread, in both passes.
  static std::size_t bitmap_chunks(host& exec, std::uint64_t n) { return std::max<std::size_t>(1, chunk_count(exec, n)); }

  /// No bit at or past n, and as many set bits as the payload's count.
  template <class Codec>
  static void validate_bitmap(host& exec, const payload_view& v) {
    const std::uint64_t n = v.header.element_count;
    const std::uint64_t words = encode::bitmap::words(n);
    const std::size_t chunks = bitmap_chunks(exec, n);
    std::byte* s = exec.scratch(chunks * (sizeof(wire::status) + sizeof(std::uint64_t)));
    auto* bits = reinterpret_cast<std::uint64_t*>(s + chunks * sizeof(wire::status));
    validate_into(exec, reinterpret_cast<wire::status*>(s), chunks, [&](std::size_t c) {
      const index_range r = chunk_of(words, chunks, c);
      return encode::bitmap::count_bits(v.indices, n, r.begin, r.end, bits[c]);
    });
    std::uint64_t total = 0;
    for (std::size_t c = 0; c < chunks; ++c) total += bits[c];
    if (total != v.count) {
      wire::throw_if_failed(wire::fail(wire::format_errc::bitmap_count_mismatch, total, v.count), "decompress");
    }
    validate_codes<Codec>(exec, v);
  }

  /// Each chunk of words finds its first value from the bits of the chunks before it (one
  /// popcount per word), then walks its set bits.
  template <class Codec, class T>
  static void apply_bitmap(host& exec, const payload_view& v, span<T> out, float alpha, bool overwrite) {
    const std::uint64_t n = v.header.element_count;
    const std::uint64_t words = encode::bitmap::words(n);
    const std::size_t chunks = bitmap_chunks(exec, n);
    auto* first = reinterpret_cast<std::uint64_t*>(exec.scratch(chunks * sizeof(std::uint64_t)));
    for_each_chunk(exec, chunks, [&](std::size_t c) {
      const index_range r = chunk_of(words, chunks, c);
      (void)encode::bitmap::count_bits(v.indices, n, r.begin, r.end, first[c]);  // validated already
    });
    std::uint64_t total = 0;  // exclusive prefix sum: chunk c's first value
    for (std::size_t c = 0; c < chunks; ++c) total += std::exchange(first[c], total);
    prepare_output<Codec>(v, out, overwrite, [&](auto type) {
      for_each_chunk(exec, chunks, [&](std::size_t c) {
        const index_range r = chunk_of(words, chunks, c);
        const payload_view local = v;
        T* y = out.data();
        encode::bitmap::for_each_index(local.indices, r.begin, r.end, first[c],
                                       [&](std::uint64_t j, std::uint64_t i) {
          accumulate(y[i], frame<Codec>::value_at(local, decltype(type)::value, j), alpha);
        });
      });
    });
  }

  /// Delta-varint indices: its chunks decode independently, a thread's share of them at a time;
  /// f(j, index) for each element of task t's chunks, stopping at the first failure.
  template <class F>
  static wire::status each_delta_chunk(const payload_view& v, std::size_t tasks, std::size_t t, F&& f) {
    const index_range r = chunk_of(encode::delta_varint::chunks(v.count), tasks, t);
    for (std::uint64_t c = r.begin; c < r.end; ++c) {
      const wire::status s = encode::delta_varint::decode_chunk(v.indices, v.index_bytes, v.count, v.header.element_count,
                                                                v.index_width, c, f);
      if (!s.ok()) return s;
    }
    return wire::status{};
  }

  static std::size_t delta_tasks(host& exec, std::uint64_t count) { return std::max<std::size_t>(1, chunk_count(exec, count)); }

  template <class Codec>
  static void validate_delta_varint(host& exec, const payload_view& v) {
    const std::size_t tasks = delta_tasks(exec, v.count);
    validate_chunks(exec, tasks, [&](std::size_t t) { return each_delta_chunk(v, tasks, t, [](std::uint64_t, std::uint64_t) {}); });
    validate_codes<Codec>(exec, v);
  }

  template <class Codec, class T>
  static void apply_delta_varint(host& exec, const payload_view& v, span<T> out, float alpha, bool overwrite) {
    const std::size_t tasks = delta_tasks(exec, v.count);
    prepare_output<Codec>(v, out, overwrite, [&](auto type) {
      for_each_chunk(exec, tasks, [&](std::size_t t) {
        const payload_view local = v;
        T* y = out.data();
        (void)each_delta_chunk(local, tasks, t, [&](std::uint64_t j, std::uint64_t i) {  // validated already
          accumulate(y[i], frame<Codec>::value_at(local, decltype(type)::value, j), alpha);
        });
      });
    });
  }

  template <class Codec, class T>
  static void apply_values(host& exec, const payload_view& v, span<T> out, float alpha, bool overwrite) {
    const std::size_t chunks = chunk_count(exec, v.count, entries_per_chunk);
    if (overwrite) std::fill(out.begin(), out.end(), from_double<T>(0.0));
    with_element_type(v.header.type, [&](auto type) {
      for_each_chunk(exec, chunks, [&](std::size_t c) {  // indices are increasing: chunks never overlap
        const index_range r = chunk_of(v.count, chunks, c);
        // Local copies: stores into `out` could alias the view, and the loop only vectorizes
        // once the compiler knows they cannot.
        const payload_view local = v;
        const float scale = alpha;
        T* y = out.data();
        for (std::uint64_t j = r.begin; j < r.end; ++j) {
          accumulate(y[frame<Codec>::index_at(local, j)], frame<Codec>::value_at(local, decltype(type)::value, j), scale);
        }
      });
    });
  }

  /// Bucketed values: chunks of whole 32-code groups, in both passes.
  static std::size_t bucket_chunks(host& exec, std::uint64_t count) {
    return std::max<std::size_t>(1, chunk_count(exec, count));
  }

  /// Every code one the stage writes (a group at a time), every COO index in place. The first
  /// failing element is reported, its code before its index (check_index's order, which the
  /// CUDA decoder follows element by element).
  template <class Codec>
  static void validate_buckets(host& exec, const payload_view& v) {
    using Values = typename Codec::values_type;
    if constexpr (Codec::checks_elements) {
      const std::uint64_t groups = (v.count + 31) / 32;
      const std::size_t chunks = bucket_chunks(exec, v.count);
      validate_chunks(exec, chunks, [&](std::size_t c) {
        const index_range g = chunk_of(groups, chunks, c);
        std::uint64_t end = std::min<std::uint64_t>(v.count, g.end * 32);
        wire::status code_failure{};
        if constexpr (needs_code_check<Values>::value) {
          std::uint64_t bad = 0;
          if (!values_backend<host>::codes_valid<Values>(v.values, g.begin, g.end, v.count, bad)) {
            code_failure = wire::fail(wire::format_errc::bad_code, bad, quantize::unpack_code(v.values, Values::bits, bad),
                                      Values::max_code);
            end = bad;  // an index failure counts only before it
          }
        }
        for (std::uint64_t j = g.begin * 32; j < end; ++j) {
          const wire::status s = frame<Codec>::check_position(v, j);
          if (!s.ok()) return s;
        }
        return code_failure;
      });
    }
  }

  /// Each group of 32 codes unpacked at once.
  template <class Codec, class T>
  static void apply_buckets(host& exec, const payload_view& v, span<T> out, float alpha, bool overwrite) {
    using Values = typename Codec::values_type;
    const std::uint64_t groups = (v.count + 31) / 32;
    const std::size_t chunks = bucket_chunks(exec, v.count);
    if (overwrite) std::fill(out.begin(), out.end(), from_double<T>(0.0));
    for_each_chunk(exec, chunks, [&](std::size_t c) {
      const index_range g = chunk_of(groups, chunks, c);
      if constexpr (Codec::has_indices) {
        values_backend<host>::decode_groups<Values>(v.scales, v.values, v.count, g.begin, g.end,
                                                    stored_index<encode::coo>{v.indices, v.index_width},
                                                    out.data(), alpha);
      } else if constexpr (Codec::implicit_indices) {
        values_backend<host>::decode_groups<Values>(
            v.scales, v.values, v.count, g.begin, g.end, [&](std::uint64_t j) { return frame<Codec>::index_at(v, j); },
            out.data(), alpha, [&](std::uint64_t j) { return frame<Codec>::implicit_scale(v, j); });
      } else {
        values_backend<host>::decode_groups<Values>(v.scales, v.values, v.count, g.begin, g.end,
                                                    identity_index{}, out.data(), alpha);
      }
    });
  }
};

}  // namespace gradzip::detail
