// structure_backend<host, sparsify::threshold>: count per chunk, then emit in index order.
#pragma once

#include <cstdint>

#include "gradzip/core/executor.hpp"
#include "gradzip/detail/codec_traits.hpp"
#include "gradzip/detail/host/match_scan.hpp"
#include "gradzip/detail/host/parallel.hpp"
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
        for_each_match(data, r.begin, r.end, [t](const T& v) { return sparsify::detail::passes(to_float(v), t); },
                       [&](std::uint64_t i) { local(pos++, i, data[i]); });
      });
    });
  }

};

}  // namespace gradzip::detail
