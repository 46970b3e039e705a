// How the host executor runs the dense and top-k structure stages, random-k's implicit
// selection, and any structure stage written outside the library (through its own count and
// select). The other built-in stages' host backends are in this directory, one per stage.
#pragma once

#include <cstdint>
#include <type_traits>

#include "gradzip/core/executor.hpp"
#include "gradzip/core/span.hpp"
#include "gradzip/detail/codec_traits.hpp"
#include "gradzip/detail/host/cast.hpp"
#include "gradzip/detail/host/parallel.hpp"
#include "gradzip/detail/host/topk.hpp"
#include "gradzip/quantize/cast.hpp"
#include "gradzip/sparsify/none.hpp"
#include "gradzip/sparsify/topk.hpp"

namespace gradzip::detail {

/// A structure stage written outside the library runs on the host through its own members
/// (gradzip/stage.hpp, docs/extending.md): `select(x, k, sink)`, and `count(x)` when its count
/// depends on the data. The built-in stages have backends of their own (below, and in
/// detail/host/), which take precedence.
template <class Structure>
struct structure_backend<host, Structure> {
  template <class T>
  static std::size_t workspace_bytes(host&, std::size_t) { return 0; }
  template <class T>
  static std::uint64_t count(host&, const Structure& s, span<const T> x) {
    return s.count(x);
  }
  template <class T, class Sink>
  static void select(host&, const Structure& s, span<const T> x, std::uint64_t k, const Sink& sink) {
    s.select(x, k, sink);
  }
};

template <>
struct structure_backend<host, sparsify::none> {
  template <class T>
  static std::size_t workspace_bytes(host&, std::size_t) { return 0; }
  template <class T, class Sink>
  static void select(host& exec, const sparsify::none&, span<const T> x, std::uint64_t,
                     const Sink& sink) {
    const std::size_t chunks = chunk_count(exec, x.size());
    for_each_chunk(exec, chunks, [&](std::size_t c) {
      const index_range r = chunk_of(x.size(), chunks, c);
      // Local copies: the payload's bytes may alias anything, and the loop only vectorizes
      // once the compiler knows its stores cannot change the input pointer or the sink.
      const T* data = x.data();
      const Sink local = sink;
      if constexpr (dense_cast<T, Sink>::format != 0) {  // fp16 / bf16 of floats: whole vectors
        constexpr auto run = dense_cast<T, Sink>::format == 3 ? cast_run_f16 : cast_run_bf16;
        run(data + r.begin, r.end - r.begin, local.values + 2 * r.begin);
      } else {
        for (std::size_t i = r.begin; i < r.end; ++i) local(i, i, data[i]);
      }
    });
  }

 private:
  /// Which cast a dense payload sink writes (the cast_format code: 3 fp16, 4 bf16), 0 when not
  /// an fp16 or bf16 cast (or a stage derived from one) of floats without indices.
  template <class T, class Sink>
  struct dense_cast {
    static constexpr int format = 0;
  };
  template <class Values, class Indices>
  struct dense_cast<float, payload_sink<float, Values, Indices>> {
    static constexpr int format = Indices::id != 0                                        ? 0
                                  : std::is_base_of_v<quantize::cast_fp16, Values> ? 3
                                  : std::is_base_of_v<quantize::cast_bf16, Values> ? 4
                                                                                    : 0;
  };
};

template <>
struct structure_backend<host, sparsify::topk> {
  template <class T>
  static std::size_t workspace_bytes(host& exec, std::size_t n) {
    return host_topk_workspace_bytes<T>(exec, n);
  }
  template <class T, class Sink>
  static void select(host& exec, const sparsify::topk&, span<const T> x, std::uint64_t k,
                     const Sink& sink) {
    host_topk(exec, x, k, sink);
  }
};

template <>
struct implicit_backend<host> {
  /// sink(j, index_of(j), x[index_of(j)]) for j < k, in parallel chunks.
  template <class Structure, class T, class Sink>
  static void select(host& exec, const frame_params& sp, span<const T> x, std::uint64_t k,
                     const Sink& sink) {
    const std::size_t chunks = chunk_count(exec, k);
    for_each_chunk(exec, chunks, [&](std::size_t c) {
      const index_range r = chunk_of(k, chunks, c);
      for (std::uint64_t j = r.begin; j < r.end; ++j) {
        const std::uint64_t i = Structure::index_of(sp.structure, x.size(), k, j);
        sink(j, i, x[i]);
      }
    });
  }
};

}  // namespace gradzip::detail
