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
    return count_by_chunk<T>(exec, s, chunks, counts, [&](std::size_t c, auto t) {
      const index_range r = chunk_of(x.size(), chunks, c);
      const T* data = x.data();
      std::uint64_t kept = 0;
      for (std::size_t i = r.begin; i < r.end; ++i) kept += sparsify::detail::passes(to_float(data[i]), t) ? 1 : 0;
      return kept;
    });
  }

  /// Emits the passing elements in index order; chunk c starts after the counts of chunks < c.
  template <class T, class Sink>
  static void select(host& exec, const sparsify::threshold& s, span<const T> x, std::uint64_t,
                     const Sink& sink) {
    const std::size_t chunks = chunk_count(exec, x.size());
    const auto* counts = reinterpret_cast<const std::uint64_t*>(exec.scratch(chunks * sizeof(std::uint64_t)));
    emit_by_chunk<T>(exec, s, chunks, counts, [&](std::size_t c, auto t, std::uint64_t pos) {
      const index_range r = chunk_of(x.size(), chunks, c);
      const T* data = x.data();
      const Sink local = sink;
      for_each_match(data, r.begin, r.end, [t](const T& v) { return sparsify::detail::passes(to_float(v), t); },
                     [&](std::uint64_t i) { local(pos++, i, data[i]); });
    });
  }

  /// The count's skeleton for any source split into `chunks` (x here; sampled top-k's candidate
  /// list): counts[c] = kept_in(c, t) for each chunk, with t the threshold as `visit_tau` gives
  /// it; returns their sum.
  template <class T, class KeptIn>
  static std::uint64_t count_by_chunk(host& exec, const sparsify::threshold& s, std::size_t chunks,
                                      std::uint64_t* counts, const KeptIn& kept_in) {
    s.template visit_tau<T>([&](auto t) { for_each_chunk(exec, chunks, [&](std::size_t c) { counts[c] = kept_in(c, t); }); });
    std::uint64_t total = 0;
    for (std::size_t c = 0; c < chunks; ++c) total += counts[c];
    return total;
  }

  /// The emit's skeleton after count_by_chunk: emit_chunk(c, t, pos) writes chunk c's passing
  /// elements from position pos, the sum of the counts of chunks < c.
  template <class T, class EmitChunk>
  static void emit_by_chunk(host& exec, const sparsify::threshold& s, std::size_t chunks, const std::uint64_t* counts,
                            const EmitChunk& emit_chunk) {
    s.template visit_tau<T>([&](auto t) {
      for_each_chunk(exec, chunks, [&](std::size_t c) {
        std::uint64_t pos = 0;
        for (std::size_t d = 0; d < c; ++d) pos += counts[d];
        emit_chunk(c, t, pos);
      });
    });
  }
};

}  // namespace gradzip::detail
