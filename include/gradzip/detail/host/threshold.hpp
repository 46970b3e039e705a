// structure_backend<host, sparsify::threshold>: count per chunk, then emit in index order.
#pragma once

#include <cstdint>

#include "gradzip/core/executor.hpp"
#include "gradzip/detail/codec_traits.hpp"
#include "gradzip/detail/host/parallel.hpp"
#include "gradzip/detail/host/quantize.hpp"
#include "gradzip/sparsify/threshold.hpp"

namespace gradzip::detail {

template <>
struct structure_backend<host, sparsify::threshold> {
  template <class T>
  static std::size_t workspace_bytes(host& exec, std::size_t n) {
    return chunk_count(exec, n) * sizeof(std::uint64_t);
  }

  /// Elements that pass, counted per chunk into scratch (read by `select`).
  template <class T>
  static std::uint64_t count(host& exec, const sparsify::threshold& s, span<const T> x) {
    const std::size_t chunks = chunk_count(exec, x.size());
    auto* counts = reinterpret_cast<std::uint64_t*>(exec.scratch(chunks * sizeof(std::uint64_t)));
    s.template visit_tau<T>([&](auto t) {
      for_each_chunk(exec, chunks, [&](std::size_t c) {
        const index_range r = chunk_of(x.size(), chunks, c);
        const T* data = x.data();
        std::uint64_t kept = 0;
        for (std::size_t i = r.begin; i < r.end; ++i) kept += sparsify::detail::passes(to_float(data[i]), t) ? 1 : 0;
        counts[c] = kept;
      });
    });
    std::uint64_t total = 0;
    for (std::size_t c = 0; c < chunks; ++c) total += counts[c];
    return total;
  }

  /// Emits the passing elements in index order; chunk c starts after the counts of chunks < c.
  template <class T, class Sink>
  static void select(host& exec, const sparsify::threshold& s, span<const T> x, std::uint64_t,
                     const Sink& sink) {
    const std::size_t chunks = chunk_count(exec, x.size());
    const auto* counts = reinterpret_cast<const std::uint64_t*>(exec.scratch(chunks * sizeof(std::uint64_t)));
    s.template visit_tau<T>([&](auto t) {
      for_each_chunk(exec, chunks, [&](std::size_t c) {
        std::uint64_t pos = 0;
        for (std::size_t d = 0; d < c; ++d) pos += counts[d];
        const index_range r = chunk_of(x.size(), chunks, c);
        const T* data = x.data();
        const Sink local = sink;
        std::size_t i = r.begin;
        // 64 elements at a time: a vectorized compare into a bit mask, so the common case (none
        // pass) costs no branch per element; the set bits are then visited in order.
        for (; i + 64 <= r.end; i += 64) {
          std::uint8_t flag[64];
          for (int l = 0; l < 64; ++l) flag[l] = sparsify::detail::passes(to_float(data[i + l]), t) ? 1 : 0;
          std::uint32_t low = 0, high = 0;
          pack_32(flag, 1, &low);
          pack_32(flag + 32, 1, &high);
          std::uint64_t mask = low | (static_cast<std::uint64_t>(high) << 32);
          while (mask != 0) {
            const int l = __builtin_ctzll(mask);
            local(pos++, i + l, data[i + l]);
            mask &= mask - 1;
          }
        }
        for (; i < r.end; ++i) {
          if (sparsify::detail::passes(to_float(data[i]), t)) local(pos++, i, data[i]);
        }
      });
    });
  }

};

}  // namespace gradzip::detail
