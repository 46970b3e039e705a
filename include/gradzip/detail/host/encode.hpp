// index_encoder<host>: staged index encodings (bitmap, delta-varint, automatic) written from the
// sorted indices compress leaves in scratch, in parallel chunks; and their chunked decoders.
#pragma once

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>

#include "gradzip/core/executor.hpp"
#include "gradzip/detail/codec_traits.hpp"
#include "gradzip/detail/host/parallel.hpp"
#include "gradzip/encode/automatic.hpp"

namespace gradzip::detail {

template <>
struct index_encoder<host> {
  /// Scratch for delta-varint's per-chunk data offsets.
  static std::size_t workspace_bytes(host&, std::uint64_t k) {
    return (encode::delta_varint::chunks(k) + 1) * sizeof(std::uint64_t);
  }

  /// Picks the concrete encoding (`Indices`' own, or automatic's choice) and returns its section
  /// size; for delta-varint it leaves each chunk's data offset in `ws`.
  template <class Indices>
  static std::uint64_t plan(host& exec, const std::uint64_t* idx, std::uint64_t k, std::uint64_t n,
                            std::byte* ws, std::uint8_t& encoding) {
    return encode::plan_section<Indices>(k, n, [&] { return measure_delta(exec, idx, k, n, ws); }, encoding);
  }

  /// Writes the indices section in the planned encoding.
  static void encode(host& exec, std::uint8_t encoding, const std::uint64_t* idx, std::uint64_t k,
                     std::uint64_t n, std::byte* ws, std::uint8_t* section) {
    if (encoding == encode::coo::id) {
      const int width = encode::coo::index_width(n);
      const std::size_t chunks = chunk_count(exec, k);
      for_each_chunk(exec, chunks, [&](std::size_t c) {
        const index_range r = chunk_of(k, chunks, c);
        for (std::uint64_t j = r.begin; j < r.end; ++j) encode::coo::store(section, width, j, idx[j]);
      });
    } else if (encoding == encode::bitmap::id) {
      const std::uint64_t words = encode::bitmap::words(n);
      const std::size_t chunks = chunk_count(exec, words * 64);
      for_each_chunk(exec, chunks, [&](std::size_t c) {
        const index_range r = chunk_of(words, chunks, c);
        std::uint64_t j = static_cast<std::uint64_t>(std::lower_bound(idx, idx + k, r.begin * 64) - idx);
        for (std::uint64_t w = r.begin; w < r.end; ++w) {
          wire::detail::store_le(section + w * 8, encode::bitmap::build_word(idx, k, j, w), 8);
        }
      });
    } else {
      const auto* offsets = reinterpret_cast<const std::uint64_t*>(ws);
      const int width = encode::delta_varint::gap_width(n);
      const std::uint64_t chunk_total = encode::delta_varint::chunks(k);
      const std::size_t chunks = chunk_count(exec, k);
      for_each_chunk(exec, chunks, [&](std::size_t t) {
        const index_range r = chunk_of(chunk_total, chunks, t);
        for (std::uint64_t c = r.begin; c < r.end; ++c) {
          encode::delta_varint::write_chunk(section, idx, k, width, c, offsets[c]);
        }
      });
    }
  }

  static void copy(host&, std::uint8_t* to, const std::uint8_t* from, std::size_t bytes) {
    if (bytes != 0) std::memcpy(to, from, bytes);
  }

 private:
  /// delta-varint's section size for idx[0..k); each chunk's data offset goes to `ws`.
  static std::uint64_t measure_delta(host& exec, const std::uint64_t* idx, std::uint64_t k,
                                     std::uint64_t n, std::byte* ws) {
    auto* offsets = reinterpret_cast<std::uint64_t*>(ws);
    const int width = encode::delta_varint::gap_width(n);
    const std::uint64_t chunk_total = encode::delta_varint::chunks(k);
    const std::size_t chunks = chunk_count(exec, k);
    for_each_chunk(exec, chunks, [&](std::size_t t) {
      const index_range r = chunk_of(chunk_total, chunks, t);
      for (std::uint64_t c = r.begin; c < r.end; ++c) {
        offsets[c] = encode::delta_varint::chunk_data_bytes(idx, k, width, c);
      }
    });
    std::uint64_t total = 0;  // exclusive prefix sum: chunk c's data starts after chunks < c
    for (std::uint64_t c = 0; c < chunk_total; ++c) total += std::exchange(offsets[c], total);
    return encode::delta_varint::data_at(k) + total;
  }
};

}  // namespace gradzip::detail
