/**
 * @file codec.hpp
 * @brief `gradzip::codec<Structure, Values, Indices>`: stage policies composed into one codec.
 *
 * A codec turns a dense gradient into one self-describing payload (see docs/format.md) and
 * back. The stages run in order: the structure stage chooses what to send (`sparsify::topk`,
 * or `sparsify::none` for every element), the values stage encodes the chosen values
 * (`quantize::none` sends them unchanged, `quantize::cast<f16/bf16>` rounds them), and the
 * indices stage encodes the chosen indices (`encode::coo`, or `encode::none` for a dense
 * structure). A codec is a small trivially copyable value; the executor it is called with owns
 * the scratch memory. `codec::summable` says whether payloads may be summed (allreduced).
 *
 * Every call takes an executor first: `gradzip::host` (this header) or `gradzip::cuda`
 * (`gradzip/core/cuda.cuh`, which adds the CUDA backends). Both produce the same bytes.
 *
 * @code
 * gradzip::codec<gradzip::sparsify::topk> c{gradzip::sparsify::topk::ratio(0.01)};
 * gradzip::host exec;
 * std::vector<std::byte> out(c.max_compressed_bytes<float>(grad.size()));
 * std::size_t bytes = c.compress(exec, gradzip::span<const float>(grad), gradzip::span<std::byte>(out));
 * c.decompress_add(exec, gradzip::span<const std::byte>(out.data(), bytes), gradzip::span<float>(accum));
 * @endcode
 */
#pragma once

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>

#include "gradzip/core/element_type.hpp"
#include "gradzip/core/error.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/core/span.hpp"
#include "gradzip/detail/host/topk.hpp"
#include "gradzip/detail/values.hpp"
#include "gradzip/detail/host/parallel.hpp"
#include "gradzip/encode/automatic.hpp"
#include "gradzip/encode/none.hpp"
#include "gradzip/quantize/cast.hpp"
#include "gradzip/quantize/natural.hpp"
#include "gradzip/quantize/none.hpp"
#include "gradzip/quantize/qsgd.hpp"
#include "gradzip/quantize/onebit.hpp"
#include "gradzip/quantize/sign.hpp"
#include "gradzip/quantize/terngrad.hpp"
#include "gradzip/quantize/uniform.hpp"
#include "gradzip/sparsify/blockwise_topk.hpp"
#include "gradzip/sparsify/none.hpp"
#include "gradzip/sparsify/randomk.hpp"
#include "gradzip/sparsify/sampled_topk.hpp"
#include "gradzip/hash/hashed_topk.hpp"
#include "gradzip/sparsify/threshold.hpp"
#include "gradzip/sparsify/topk.hpp"
#include "gradzip/stage.hpp"
#include "gradzip/wire/reader.hpp"
#include "gradzip/wire/writer.hpp"

namespace gradzip {

namespace detail {

/// What a validated payload holds: its count and where its indices (if any) and values are.
struct payload_view {
  wire::header header;
  std::uint64_t count = 0;  // elements sent: k for a sparsifier, n for a dense structure
  int index_width = 0;      // COO's index width or delta-varint's gap width (encode::width_of)
  std::uint8_t index_encoding = 0;  // concrete encoding: encode::coo/bitmap/delta_varint::id, 0 for none
  std::uint64_t index_bytes = 0;    // size of the indices section
  const std::uint8_t* structure_params = nullptr;  // implicit-index structures (random-k)
  const std::uint8_t* indices = nullptr;
  const std::uint8_t* scales = nullptr;  // bucketed values stages only
  const std::uint8_t* values = nullptr;
};

/// Structures whose indices are recomputed from their parameters (random-k) set
/// `implicit_indices`; they also have `param_bytes` of parameters in the payload.
template <class Structure, class = void>
struct has_implicit_indices : std::false_type {};
template <class Structure>
struct has_implicit_indices<Structure, std::void_t<decltype(Structure::implicit_indices)>>
    : std::bool_constant<Structure::implicit_indices> {};

template <class Structure>
constexpr std::uint64_t structure_param_bytes() {
  if constexpr (has_implicit_indices<Structure>::value) {
    return Structure::param_bytes;
  } else {
    return 0;
  }
}

/// What compress decides on the host before the frame is written, passed by value to the
/// device: the structure stage's parameter bytes (random-k) and the concrete index encoding
/// (encode::automatic's choice).
struct frame_params {
  std::uint8_t structure[24] = {};
  std::uint8_t index_encoding = 0;
};

/// implicit_backend<Exec>: runs an implicit-index structure's selection on an executor.
template <class Exec>
struct implicit_backend;

/// async_compress_backend<Exec>: codec::compress_async (host below; CUDA in
/// detail/cuda/compress_async.cuh).
template <class Exec>
struct async_compress_backend;

/// Structures whose selected count depends on the data (threshold) set `data_dependent_count`:
/// the codec asks their backend to `count` before it lays out the payload.
template <class Structure, class = void>
struct has_data_dependent_count : std::false_type {};
template <class Structure>
struct has_data_dependent_count<Structure, std::void_t<decltype(Structure::data_dependent_count)>>
    : std::bool_constant<Structure::data_dependent_count> {};

template <class Values, class = void>
struct is_bucketed : std::false_type {};
template <class Values>
struct is_bucketed<Values, std::void_t<decltype(Values::bucketed)>> : std::bool_constant<Values::bucketed> {};

/// Writes indices into the payload and values, widened to float, into scratch: for values stages
/// that need every value of a bucket before they can encode any.
template <class T, class Indices>
struct split_sink {
  std::uint8_t* indices;
  int index_width;
  float* values;
  GRADZIP_HOST_DEVICE void operator()(std::uint64_t pos, std::uint64_t index, T value) const {
    Indices::store(indices, index_width, pos, index);
    values[pos] = static_cast<float>(to_float(value));
  }
};

/// The tensor index of value j: j itself for a dense structure.
struct identity_index {
  GRADZIP_HOST_DEVICE std::uint64_t operator()(std::uint64_t j) const { return j; }
};

/// Writes only the kept values (as floats), for a bucketed stage over an implicit selection.
template <class T>
struct values_sink {
  float* values;
  GRADZIP_HOST_DEVICE void operator()(std::uint64_t pos, std::uint64_t, T value) const {
    values[pos] = static_cast<float>(to_float(value));
  }
};

/// The tensor index of value j of an implicit selection (random-k), from its parameters.
template <class Structure>
struct implicit_index {
  frame_params params;
  std::uint64_t n, k;
  GRADZIP_HOST_DEVICE std::uint64_t operator()(std::uint64_t j) const {
    return Structure::index_of(params.structure, n, k, j);
  }
};

/// The tensor index of value j, read back from the payload's indices section.
template <class Indices>
struct stored_index {
  const std::uint8_t* indices;
  int index_width;
  GRADZIP_HOST_DEVICE std::uint64_t operator()(std::uint64_t j) const {
    return Indices::load(indices, index_width, j);
  }
};

template <class Values, class = void>
struct needs_code_check : std::false_type {};
template <class Values>
struct needs_code_check<Values, std::void_t<decltype(Values::codes_need_check)>>
    : std::bool_constant<Values::codes_need_check> {};

/// values_backend<Exec>: bucketed values stages on an executor (host below, CUDA in cuda.cuh).
template <class Exec>
struct values_backend;

/// Writes each chosen element straight into the payload: its index through the indices stage
/// (when there is one), its value through the values stage. A stochastic element-wise stage
/// gets the element's random word, keyed by its seed, `ctx` and the element's tensor index.
template <class T, class Values, class Indices>
struct payload_sink {
  std::uint8_t* indices;
  int index_width;
  std::uint8_t* values;
  Values values_stage;
  quantize::compress_context ctx;

  GRADZIP_HOST_DEVICE void operator()(std::uint64_t pos, std::uint64_t index, T value) const {
    if constexpr (Indices::id != 0) Indices::store(indices, index_width, pos, index);
    if constexpr (stage::is_stochastic<Values>) {
      values_stage.store(values, pos, value, quantize::element_random(values_stage, index, ctx));
    } else {
      Values::store(values, pos, value);
    }
  }
};

/// structure_backend<Exec, Structure>: how an executor runs a structure stage. Specialized for
/// the host below and for CUDA in gradzip/core/cuda.cuh.
template <class Exec, class Structure>
struct structure_backend;

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
      for (std::size_t i = r.begin; i < r.end; ++i) local(i, i, data[i]);
    });
  }
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

/// Scratch a structure stage needs for n elements of T: its backend's
/// `workspace_bytes<T>(exec, structure, n)` when it has one (when the amount depends on the
/// stage's parameters, e.g. hashed top-k's slots), else `workspace_bytes<T>(exec, n)`.
template <class Backend, class T, class Exec, class Structure, class = void>
struct has_parameter_workspace : std::false_type {};
template <class Backend, class T, class Exec, class Structure>
struct has_parameter_workspace<Backend, T, Exec, Structure,
                               std::void_t<decltype(Backend::template workspace_bytes<T>(
                                   std::declval<Exec&>(), std::declval<const Structure&>(), std::size_t{}))>>
    : std::true_type {};

template <class T, class Exec, class Structure>
std::size_t structure_workspace(Exec& exec, const Structure& s, std::size_t n) {
  using backend = structure_backend<Exec, Structure>;
  if constexpr (has_parameter_workspace<backend, T, Exec, Structure>::value) {
    return backend::template workspace_bytes<T>(exec, s, n);
  } else {
    return backend::template workspace_bytes<T>(exec, n);
  }
}

/// payload_backend<Exec>: writing a payload's frame and decoding payloads on an executor.
template <class Exec>
struct payload_backend;

/// index_encoder<Exec>: choosing, sizing and writing a staged index encoding from sorted
/// indices in scratch (host: detail/host/encode.hpp, CUDA: detail/cuda/encode.cuh).
template <class Exec>
struct index_encoder;

}  // namespace detail

template <class Structure, class Values = quantize::none, class Indices = encode::coo>
class codec {
  // Each stage's interface (gradzip/stage.hpp), checked first so a missing member is named.
  static_assert(stage::check_structure<Structure>() && stage::check_values<Values>() &&
                stage::check_indices<Indices>());
  static_assert(!Structure::explicit_indices || Indices::id != 0,
                "codec: the structure stage sends explicit indices, so the indices stage must "
                "encode them (e.g. encode::coo)");
  static_assert(Structure::explicit_indices || std::is_same_v<Indices, encode::none>,
                "codec: the structure stage sends no indices, so the indices stage must be "
                "encode::none");

 public:
  using structure_type = Structure;
  using values_type = Values;
  using indices_type = Indices;

  static constexpr wire::codec_id id{0, Structure::id, Values::id, Indices::id};
  /// Whether the payloads of several workers may be summed (allreduced) instead of gathered.
  static constexpr bool summable = Structure::summable && Values::summable;
  static constexpr bool has_indices = Structure::explicit_indices;
  /// Indices recomputed from the structure's parameters (random-k): none on the wire.
  static constexpr bool implicit_indices = detail::has_implicit_indices<Structure>::value;
  /// Every element, in order (sparsify::none).
  static constexpr bool dense = !has_indices && !implicit_indices;
  static constexpr std::uint64_t structure_params_bytes = detail::structure_param_bytes<Structure>();
  /// The selected count depends on the data (threshold): max_compressed_bytes is a bound and
  /// compress returns the actual size.
  static constexpr bool data_dependent_count = detail::has_data_dependent_count<Structure>::value;
  static constexpr bool bucketed = detail::is_bucketed<Values>::value;
  /// Parameters section: the selected count (u64), then each stage's parameter bytes.
  static constexpr std::uint64_t params_bytes =
      8 + structure_params_bytes + Values::param_bytes + Indices::param_bytes;
  static constexpr std::uint64_t values_params_at = 8 + structure_params_bytes;
  static constexpr std::uint64_t indices_params_at = values_params_at + Values::param_bytes;
  static constexpr std::uint32_t section_count = 2 + (has_indices ? 1 : 0) + (bucketed ? 1 : 0);
  /// Whether decoding must check each element (its index, or its value's code) before writing.
  static constexpr bool checks_elements = has_indices || detail::needs_code_check<Values>::value;
  /// Compress collects indices (and values) in scratch before encoding them: every indices
  /// stage but COO, whose indices go straight into the payload.
  static constexpr bool staged = has_indices && Indices::staged;

  constexpr codec() = default;
  explicit constexpr codec(Structure s, Values v = {}, Indices i = {})
      : structure_(s), values_(v), indices_(i) {}

  const Structure& structure() const noexcept { return structure_; }
  const Values& values() const noexcept { return values_; }

  /// The payload layout for n elements of type `type` with k selected, its indices section
  /// (if any) the largest the indices stage writes (exact but for delta-varint and automatic).
  GRADZIP_HOST_DEVICE static wire::payload_layout layout(element_type type, std::uint64_t n, std::uint64_t k) {
    if constexpr (has_indices) {
      return layout(type, n, k, encode::max_section_bytes<Indices>(k, n));
    } else {
      return layout(type, n, k, 0);
    }
  }

  /// The payload layout with an indices section of `index_bytes` bytes.
  GRADZIP_HOST_DEVICE static wire::payload_layout layout(element_type type, std::uint64_t /*n*/, std::uint64_t k,
                                                         std::uint64_t index_bytes) {
    wire::payload_layout l;
    l.add(wire::tag::params, params_bytes);
    if constexpr (has_indices) l.add(wire::tag::indices, index_bytes);
    if constexpr (bucketed) {
      l.add(wire::tag::scales, Values::scales_bytes(k));
      l.add(wire::tag::values, Values::codes_bytes(k));
    } else {
      l.add(wire::tag::values, k * Values::value_size(type));
    }
    return l;
  }

  /// The payload bytes for n elements of type T: exact, except for a data-dependent count
  /// (threshold: the bound for all n elements) or a data-dependent index encoding
  /// (delta-varint, automatic: the bound for the worst gaps); compress returns the size.
  template <class T>
  std::size_t max_compressed_bytes(std::size_t n) const {
    return layout(element_traits<T>::type, n, structure_.selected_count(n)).total_bytes();
  }

  /// Scratch bytes `compress` and `decompress_add` need on `exec` for n elements of T;
  /// `exec.reserve` it up front and neither allocates (tests/alloc counts the host's calls).
  template <class T, class Exec>
  std::size_t workspace_bytes(Exec& exec, std::size_t n) const {
    const std::size_t compress = compress_workspace_bytes<T>(exec, n);
    const std::size_t decode = detail::payload_backend<Exec>::template decode_workspace_bytes<codec>(exec, n);
    return compress > decode ? compress : decode;
  }

 private:
  template <class T, class Exec>
  std::size_t compress_workspace_bytes(Exec& exec, std::size_t n) const {
    if constexpr (implicit_indices) {
      // The selection needs no scratch; a bucketed stage keeps the k values there first.
      return bucketed ? value_scratch_offset(0) + structure_.selected_count(n) * sizeof(float) : 0;
    } else {
      const std::size_t structure = detail::structure_workspace<T>(exec, structure_, n);
      if constexpr (staged) {
        return staging_of<T>(exec, structure, structure_.selected_count(n)).total;
      } else if constexpr (has_indices && bucketed) {
        return value_scratch_offset(structure) + structure_.selected_count(n) * sizeof(float);
      } else {
        return structure;
      }
    }
  }

 public:

  /**
   * Compresses `input` into `out` and returns the payload's size in bytes. `out` must hold
   * max_compressed_bytes<T>(input.size()) bytes and, for the CUDA executor, be 16-byte aligned
   * device memory. Asynchronous on a CUDA stream; allocates nothing once the executor's scratch
   * has grown to workspace_bytes. `ctx` (training step, tensor id) keys stochastic stages'
   * randomness, with the values stage's seed.
   */
  template <class Exec, class T>
  std::size_t compress(Exec& exec, span<const T> input, span<std::byte> out,
                       quantize::compress_context ctx = {}) const {
    static_assert(is_element_v<T>, "codec::compress: input must be float, double, __half or "
                                   "__nv_bfloat16");
    quantize::check_context(ctx, "compress");
    const std::uint64_t n = input.size();
    std::uint64_t k = structure_.selected_count(n);
    if constexpr (data_dependent_count) {
      // Size the scratch for the whole call first: the count pass leaves per-chunk (per-tile)
      // counts there for the selection, and a later growth would discard them.
      exec.scratch(workspace_bytes<T>(exec, n));
      GRADZIP_EXPECTS(out.size() >= layout(element_traits<T>::type, n, 0).total_bytes(),
                      "compress: output buffer holds ", out.size(), " bytes, fewer than an empty payload");
      k = detail::structure_backend<Exec, Structure>::count(exec, structure_, input);
      // NaN and +-inf pass every threshold (they are never dropped silently), so a count can
      // exceed the bound max_compressed_bytes was sized for (sampled top-k's 1.2 k): refused.
      if (k > structure_.selected_count(n)) {
        wire::throw_if_failed(wire::fail(wire::format_errc::count_over_bound, k, structure_.selected_count(n)),
                              "compress");
      }
    }
    if constexpr (staged) {
      return compress_staged(exec, input, out, ctx, k);
    } else {
      return compress_direct(exec, input, out, ctx, k);
    }
  }

  template <class Exec, class T>
  std::size_t compress(Exec& exec, span<T> input, span<std::byte> out,
                       quantize::compress_context ctx = {}) const {
    return compress(exec, span<const T>(input), out, ctx);
  }

  /// Whether compress_async can leave a data-dependent count on the device: the selection
  /// writes straight into the payload (COO indices) and the values are element-wise.
  static constexpr bool async_count = data_dependent_count && !staged && !bucketed;

  /**
   * Compresses like `compress`, but writes the payload's size to `*size` in the executor's
   * memory (device memory on CUDA) instead of returning it. On CUDA a data-dependent count
   * (threshold, sampled top-k, hashed top-k) then never reaches the host: the frame is written
   * on the device from the device's count, and the whole call is stream-ordered with no host
   * synchronization. `out` must hold max_compressed_bytes<T>(n) bytes. Codecs whose count is
   * data-independent work too. Not available (a compile-time error) for data-dependent counts
   * with staged index encodings (delta-varint, automatic) or bucketed values, whose layout is
   * planned on the host.
   */
  template <class Exec, class T>
  void compress_async(Exec& exec, span<const T> input, span<std::byte> out, std::uint64_t* size,
                      quantize::compress_context ctx = {}) const {
    static_assert(!data_dependent_count || async_count,
                  "compress_async: a data-dependent count needs COO indices and element-wise values "
                  "(delta-varint, automatic and bucketed stages plan the layout on the host); use compress");
    GRADZIP_EXPECTS(out.size() >= max_compressed_bytes<T>(input.size()), "compress_async: output buffer holds ",
                    out.size(), " bytes, the bound is ", max_compressed_bytes<T>(input.size()));
    quantize::check_context(ctx, "compress_async");
    detail::async_compress_backend<Exec>::compress(exec, *this, input, out, size, ctx);
  }

  /// The data-dependent count pass and the selection of compress_async, for its backends.
  template <class Exec, class T>
  const std::uint64_t* count_on_device(Exec& exec, span<const T> input) const {
    exec.scratch(workspace_bytes<T>(exec, input.size()));  // before the pass: growth discards
    return detail::structure_backend<Exec, Structure>::count_on_device(exec, structure_, input);
  }
  template <class Exec, class T, class Sink>
  void select_into(Exec& exec, span<const T> input, const Sink& sink) const {
    detail::structure_backend<Exec, Structure>::select(exec, structure_, input, structure_.selected_count(input.size()),
                                                       sink);
  }

  /**
   * accum <- accum + alpha * decode(payload), in one pass over the payload. The payload is
   * validated first (header, sections, parameters, every index in range and strictly
   * increasing, every code one the values stage writes), so a bad payload changes nothing. Payloads of any element type decode into any
   * accumulator type. On CUDA, errors surface through `exec.check()`.
   */
  template <class Exec, class T>
  void decompress_add(Exec& exec, span<const std::byte> payload, span<T> accum,
                      float alpha = 1.0f) const {
    detail::payload_backend<Exec>::decode(exec, *this, payload, accum, alpha, false);
  }

  /**
   * accum <- accum + alpha * (the sum of every payload's decode), host executor: all payloads
   * are validated before any is applied (a bad one throws format_error naming its position),
   * and dense payloads are accumulated in one pass over `accum`. What a gather-based allreduce
   * does with its peers' payloads (comm::allreducer).
   */
  template <class Exec, class T>
  void decompress_add_all(Exec& exec, span<const span<const std::byte>> payloads, span<T> accum,
                          float alpha = 1.0f) const {
    static_assert(std::is_same_v<Exec, host>, "decompress_add_all: host executor only (CUDA: decompress_add each)");
    std::size_t bad = 0;
    try {
      detail::payload_backend<Exec>::decode_all(exec, *this, payloads, accum, alpha, false, bad);
    } catch (const format_error& e) {
      throw format_error(e.code(), detail::concat("payload ", bad, " of ", payloads.size(), ": ", e.what()));
    }
  }

  /**
   * dense_out <- the sum of every payload's decode, every payload validated before anything is
   * written. Host: a bad payload throws format_error naming its position. CUDA: the failure
   * reaches `exec.check()`. Either way `dense_out` is then unchanged. What a vote or an average
   * of peers' payloads needs (quantize::majority_vote).
   */
  template <class Exec, class T>
  void decompress_all(Exec& exec, span<const span<const std::byte>> payloads, span<T> dense_out) const {
    GRADZIP_EXPECTS(!payloads.empty(), "decompress_all: no payloads");
    if constexpr (std::is_same_v<Exec, host>) {
      std::size_t bad = 0;
      try {
        detail::payload_backend<Exec>::decode_all(exec, *this, payloads, dense_out, 1.0f, true, bad);
      } catch (const format_error& e) {
        throw format_error(e.code(), detail::concat("payload ", bad, " of ", payloads.size(), ": ", e.what()));
      }
    } else {
      // Every check first: a failure in the status word makes each later apply kernel skip.
      for (const auto& p : payloads) detail::payload_backend<Exec>::check(exec, *this, p, dense_out.size());
      for (std::size_t m = 0; m < payloads.size(); ++m) {
        detail::payload_backend<Exec>::decode(exec, *this, payloads[m], dense_out, 1.0f, m == 0);
      }
    }
  }

  /// dense_out <- decode(payload): every element written (zeros where a sparsifier sent none).
  template <class Exec, class T>
  void decompress(Exec& exec, span<const std::byte> payload, span<T> dense_out) const {
    detail::payload_backend<Exec>::decode(exec, *this, payload, dense_out, 1.0f, true);
  }

 private:
  /// Compress when the selection writes straight into the payload (no staged index encoding).
  template <class Exec, class T>
  std::size_t compress_direct(Exec& exec, span<const T> input, span<std::byte> out,
                              quantize::compress_context ctx, std::uint64_t k) const {
    const std::uint64_t n = input.size();
    const wire::payload_layout l = layout(element_traits<T>::type, n, k);
    GRADZIP_EXPECTS(out.size() >= l.total_bytes(), "compress: output buffer holds ", out.size(),
                    " bytes, the payload needs ", l.total_bytes());
    auto* base = reinterpret_cast<std::uint8_t*>(out.data());
    detail::frame_params sp;
    if constexpr (implicit_indices) structure_.write_params(sp.structure, ctx);
    detail::payload_backend<Exec>::write_frame(exec, *this, base, l, element_traits<T>::type, n, k, sp);
    std::uint8_t* indices = has_indices ? base + l.at(1).offset : nullptr;
    std::uint8_t* values = base + l.at(section_count - 1).offset;
    using structure_run = detail::structure_backend<Exec, Structure>;
    if constexpr (implicit_indices && bucketed) {  // values into scratch, then buckets over them
      const std::size_t at = value_scratch_offset(0);
      auto* kept = reinterpret_cast<float*>(exec.scratch(at + k * sizeof(float)) + at);
      detail::implicit_backend<Exec>::template select<Structure>(exec, sp, input, k, detail::values_sink<T>{kept});
      detail::values_backend<Exec>::encode_buckets(exec, values_, static_cast<const float*>(kept), k,
                                                   base + l.at(1).offset, values,
                                                   detail::implicit_index<Structure>{sp, n, k}, ctx);
    } else if constexpr (implicit_indices) {
      const detail::payload_sink<T, Values, Indices> sink{indices, index_width(n), values, values_, ctx};
      detail::implicit_backend<Exec>::template select<Structure>(exec, sp, input, k, sink);
    } else if constexpr (!bucketed) {
      const detail::payload_sink<T, Values, Indices> sink{indices, index_width(n), values, values_, ctx};
      structure_run::select(exec, structure_, input, k, sink);
    } else if constexpr (!has_indices) {  // dense: buckets straight from the input
      detail::values_backend<Exec>::encode_buckets(exec, values_, input.data(), k,
                                                   base + l.at(1).offset, values,
                                                   detail::identity_index{}, ctx);
    } else {  // indices into the payload, values into scratch, then buckets over the k values
      const std::size_t structure_bytes = detail::structure_workspace<T>(exec, structure_, n);
      const std::size_t offset = value_scratch_offset(structure_bytes);
      auto* kept = reinterpret_cast<float*>(exec.scratch(offset + k * sizeof(float)) + offset);
      structure_run::select(exec, structure_, input, k,
                            detail::split_sink<T, Indices>{indices, index_width(n), kept});
      detail::values_backend<Exec>::encode_buckets(
          exec, values_, static_cast<const float*>(kept), k, base + l.at(2).offset, values,
          detail::stored_index<Indices>{indices, index_width(n)}, ctx);
    }
    return l.total_bytes();
  }

 public:
  /// Writes the header, the parameters and all padding of a payload (host or device code).
  GRADZIP_HOST_DEVICE static void write_frame(std::uint8_t* out, const wire::payload_layout& l,
                                              element_type type, std::uint64_t n, std::uint64_t k,
                                              const detail::frame_params& sp) {
    wire::write_header(out, l, type, id, n);
    std::uint8_t* params = out + l.at(0).offset;
    for (std::uint64_t i = 0; i < params_bytes; ++i) params[i] = 0;
    wire::detail::store_le(params, k, 8);
    if constexpr (implicit_indices) {
      for (std::uint64_t i = 0; i < structure_params_bytes; ++i) params[8 + i] = sp.structure[i];
    }
    Values::write_params(params + values_params_at);
    if constexpr (std::is_same_v<Indices, encode::automatic>) {
      encode::automatic::write_params(params + indices_params_at, n, sp.index_encoding);
    } else {
      Indices::write_params(params + indices_params_at, n);
    }
    wire::zero_section_padding(out, l);
  }

  /// Width in bytes of the indices compress's selection writes for n elements: COO's width
  /// into the payload, 8 into scratch for a staged encoding, 0 without indices.
  GRADZIP_HOST_DEVICE static int index_width(std::uint64_t n) {
    if constexpr (!has_indices) {
      return 0;
    } else if constexpr (Indices::staged) {
      return 8;
    } else {
      return Indices::index_width(n);
    }
  }

  /// Validates a payload's frame: header, codec, sections, parameters and section sizes.
  GRADZIP_HOST_DEVICE static wire::status parse(const std::uint8_t* bytes, std::uint64_t size,
                                                detail::payload_view& v) {
    wire::status s = wire::parse_header(bytes, size, v.header);
    if (!s.ok()) return s;
    const wire::header& h = v.header;
    constexpr std::uint32_t expected_id = id.packed();  // a constant: no device-side ODR use
    wire::tag tags[4] = {wire::tag::params};
    std::uint32_t listed = 1;
    if (has_indices) tags[listed++] = wire::tag::indices;
    if (bucketed) tags[listed++] = wire::tag::scales;
    tags[listed] = wire::tag::values;
    s = wire::expect_frame(h, expected_id, tags, section_count, params_bytes);
    if (!s.ok()) return s;
    const std::uint64_t params_at = h.sections[0].offset;
    const std::uint8_t* params = bytes + params_at;
    v.count = wire::detail::load_le(params, 8);
    if (v.count > h.element_count) {
      return wire::fail(wire::format_errc::count_overflow, v.count, h.element_count);
    }
    if (dense && v.count != h.element_count) {  // a dense payload sends every element
      return wire::fail(wire::format_errc::bad_params, 0, v.count);
    }
    if constexpr (implicit_indices) {
      s = Structure::check_params(params + 8, params_at + 8);
      if (!s.ok()) return s;
      v.structure_params = params + 8;
    }
    s = Values::check_params(params + values_params_at, params_at + values_params_at);
    if (!s.ok()) return s;
    s = Indices::check_params(params + indices_params_at, h.element_count, params_at + indices_params_at);
    if (!s.ok()) return s;
    std::uint64_t value_bytes = 0;
    if (!value_section_bytes(v.count, h.type, value_bytes)) {
      return wire::fail(wire::format_errc::count_overflow, v.count, h.element_count);
    }
    if constexpr (has_indices) {
      v.index_encoding = encode::encoding_of<Indices>(params + indices_params_at);
      v.index_width = encode::width_of(v.index_encoding, h.element_count);
      v.index_bytes = h.sections[1].size;
      s = encode::check_section_size(v.index_encoding, v.count, h.element_count, v.index_bytes, 1);
      if (!s.ok()) return s;
    }
    if constexpr (bucketed) {  // count <= n < 2^64 / 8 after the checks above: no overflow here
      const std::uint32_t scales_at = section_count - 2;
      if (h.sections[scales_at].size != Values::scales_bytes(v.count)) {
        return wire::fail(wire::format_errc::bad_section_size, scales_at, h.sections[scales_at].size,
                          Values::scales_bytes(v.count));
      }
      v.scales = bytes + h.sections[scales_at].offset;
    }
    const std::uint32_t values_at = section_count - 1;
    if (h.sections[values_at].size != value_bytes) {
      return wire::fail(wire::format_errc::bad_section_size, values_at, h.sections[values_at].size,
                        value_bytes);
    }
    v.indices = has_indices ? bytes + h.sections[1].offset : nullptr;
    v.values = bytes + h.sections[values_at].offset;
    return {};
  }

  /// Value j of a parsed payload, widened to double.
  GRADZIP_HOST_DEVICE static double value_at(const detail::payload_view& v, element_type type,
                                             std::uint64_t j) {
    double value = 0.0;
    if constexpr (bucketed) {
      value = Values::decode(quantize::unpack_code(v.values, Values::bits, j),
                             Values::load_record(v.scales, j / Values::bucket));
    } else {
      value = Values::load(v.values, type, j);
    }
    if constexpr (implicit_indices) value *= implicit_scale(v, j);
    return value;
  }

  /// Random-k's unbiasing factor for value j of a parsed payload, applied on decode.
  GRADZIP_HOST_DEVICE static double implicit_scale(const detail::payload_view& v, std::uint64_t j) {
    return static_cast<double>(Structure::value_scale(v.structure_params, v.header.element_count, v.count, j));
  }

  /// The tensor index of payload element j (its own position for a dense structure).
  GRADZIP_HOST_DEVICE static std::uint64_t index_at(const detail::payload_view& v, std::uint64_t j) {
    if constexpr (has_indices) {  // COO only: the other encodings are read by their decoders
      return encode::coo::load(v.indices, v.index_width, j);
    } else if constexpr (implicit_indices) {
      return Structure::index_of(v.structure_params, v.header.element_count, v.count, j);
    } else {
      return j;
    }
  }

  /// Checks element j of a parsed payload: its index is below n and above index j - 1, and its
  /// value's code is one the values stage can write.
  GRADZIP_HOST_DEVICE static wire::status check_index(const detail::payload_view& v,
                                                      std::uint64_t j) {
    if constexpr (detail::needs_code_check<Values>::value) {
      const unsigned code = quantize::unpack_code(v.values, Values::bits, j);
      if (code > Values::max_code) return wire::fail(wire::format_errc::bad_code, j, code, Values::max_code);
    }
    return check_position(v, j);
  }

  /// The index half of `check_index`: element j's index is below n and above index j - 1 (COO;
  /// the bitmap and delta-varint decoders check their own indices as they read them).
  GRADZIP_HOST_DEVICE static wire::status check_position(const detail::payload_view& v,
                                                         std::uint64_t j) {
    if constexpr (!has_indices) return {};
    if (v.index_encoding != encode::coo::id) return {};
    const std::uint64_t index = index_at(v, j);
    if (index >= v.header.element_count) {
      return wire::fail(wire::format_errc::index_out_of_range, j, index, v.header.element_count);
    }
    if (j > 0) {
      const std::uint64_t previous = index_at(v, j - 1);
      if (index <= previous) return wire::fail(wire::format_errc::index_not_increasing, j, index, previous);
    }
    return {};
  }

 private:
  /// Where compress_staged keeps things in scratch, after the structure stage's own scratch:
  /// k indices (u64), k staged values, and the index encoder's scratch.
  struct staging {
    std::size_t indices = 0, values = 0, encoder = 0, total = 0;
  };

  template <class T, class Exec>
  static staging staging_of(Exec& exec, std::size_t structure_bytes, std::uint64_t k) {
    staging s;
    s.indices = detail::scratch_aligned(structure_bytes);
    s.values = detail::scratch_aligned(s.indices + k * 8);
    std::size_t value_bytes = k * sizeof(float);  // floats for a bucketed stage to encode
    if constexpr (!bucketed) value_bytes = k * Values::value_size(element_traits<T>::type);
    s.encoder = detail::scratch_aligned(s.values + value_bytes);
    s.total = s.encoder + detail::index_encoder<Exec>::workspace_bytes(exec, k);
    return s;
  }

  /// Compress for a staged index encoding: the selection writes indices and values into
  /// scratch, the encoding is chosen and sized, then the frame, indices and values are written.
  template <class Exec, class T>
  std::size_t compress_staged(Exec& exec, span<const T> input, span<std::byte> out,
                              quantize::compress_context ctx, std::uint64_t k) const {
    using structure_run = detail::structure_backend<Exec, Structure>;
    using encoder = detail::index_encoder<Exec>;
    const std::uint64_t n = input.size();
    const element_type type = element_traits<T>::type;
    const staging at = staging_of<T>(exec, detail::structure_workspace<T>(exec, structure_, n), k);
    std::byte* scratch = exec.scratch(at.total);
    auto* idx = reinterpret_cast<std::uint8_t*>(scratch + at.indices);
    auto* staged_values = reinterpret_cast<std::uint8_t*>(scratch + at.values);
    if constexpr (bucketed) {
      structure_run::select(exec, structure_, input, k,
                            detail::split_sink<T, encode::coo>{idx, 8, reinterpret_cast<float*>(staged_values)});
    } else {
      structure_run::select(exec, structure_, input, k,
                            detail::payload_sink<T, Values, encode::coo>{idx, 8, staged_values, values_, ctx});
    }
    const auto* sorted = reinterpret_cast<const std::uint64_t*>(idx);
    detail::frame_params fp;
    const std::uint64_t index_bytes =
        encoder::template plan<Indices>(exec, sorted, k, n, scratch + at.encoder, fp.index_encoding);
    const wire::payload_layout l = layout(type, n, k, index_bytes);
    GRADZIP_EXPECTS(out.size() >= l.total_bytes(), "compress: output buffer holds ", out.size(),
                    " bytes, the payload needs ", l.total_bytes());
    auto* base = reinterpret_cast<std::uint8_t*>(out.data());
    detail::payload_backend<Exec>::write_frame(exec, *this, base, l, type, n, k, fp);
    encoder::encode(exec, fp.index_encoding, sorted, k, n, scratch + at.encoder, base + l.at(1).offset);
    if constexpr (bucketed) {
      detail::values_backend<Exec>::encode_buckets(
          exec, values_, reinterpret_cast<const float*>(staged_values), k, base + l.at(2).offset,
          base + l.at(3).offset, detail::stored_index<encode::coo>{idx, 8}, ctx);
    } else {
      encoder::copy(exec, base + l.at(2).offset, staged_values, k * Values::value_size(type));
    }
    return l.total_bytes();
  }

  /// Bytes of the values section for `count` values, false on overflow.
  GRADZIP_HOST_DEVICE static bool value_section_bytes(std::uint64_t count, element_type type,
                                                      std::uint64_t& out) {
    if constexpr (bucketed) {
      if (count > (~std::uint64_t{0} >> 4)) return false;
      out = Values::codes_bytes(count);
      return true;
    } else {
      return wire::detail::checked_mul(count, Values::value_size(type), out);
    }
  }

  /// Where the kept values start in scratch, after the structure stage's own scratch.
  static std::size_t value_scratch_offset(std::size_t structure_bytes) {
    return detail::scratch_aligned(structure_bytes);
  }

  Structure structure_{};
  Values values_{};
  Indices indices_{};
};

}  // namespace gradzip

#include "gradzip/detail/host/quantize.hpp"
#include "gradzip/detail/host/threshold.hpp"
#include "gradzip/detail/host/sampled_topk.hpp"
#include "gradzip/detail/host/hashed_topk.hpp"
#include "gradzip/detail/host/blockwise_topk.hpp"
#include "gradzip/detail/host/encode.hpp"

namespace gradzip {
namespace detail {

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
    Codec::write_frame(out, l, type, n, k, sp);
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
   * its position. Dense payloads are then accumulated in one pass over `out`: each chunk of the
   * output takes every payload's part of it while it is in cache. Sparse payloads scatter one
   * after another (each touches only its k elements).
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
    wire::throw_if_failed(Codec::parse(bytes, payload.size(), v), "decompress");
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

  /// Codec::check_index for every element, in parallel chunks; throws the first failure.
  template <class Codec>
  static void check_every_element(host& exec, const payload_view& v) {
    const std::size_t chunks = chunk_count(exec, v.count);
    validate_chunks(exec, chunks, [&](std::size_t c) {
      const index_range r = chunk_of(v.count, chunks, c);
      for (std::uint64_t j = r.begin; j < r.end; ++j) {
        const wire::status s = Codec::check_index(v, j);
        if (!s.ok()) return s;
      }
      return wire::status{};
    });
  }

  /// The dense half of decode_all: chunk by chunk over `out`, every payload's part of the chunk.
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
      const std::size_t chunks = chunk_count(exec, out.size());
      for_each_chunk(exec, chunks, [&](std::size_t c) {
        const index_range r = chunk_of(out.size(), chunks, c);
        T* y = out.data();
        for (std::size_t p = 0; p < count; ++p) {
          const payload_view local = views[p];
          with_element_type(local.header.type, [&](auto type) {
            for (std::uint64_t j = r.begin; j < r.end; ++j) {
              accumulate(y[j], Codec::value_at(local, decltype(type)::value, j), alpha);
            }
          });
        }
      });
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
          accumulate(y[i], Codec::value_at(local, decltype(type)::value, j), alpha);
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
          accumulate(y[i], Codec::value_at(local, decltype(type)::value, j), alpha);
        });
      });
    });
  }

  template <class Codec, class T>
  static void apply_values(host& exec, const payload_view& v, span<T> out, float alpha, bool overwrite) {
    const std::size_t chunks = chunk_count(exec, v.count);
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
          accumulate(y[Codec::index_at(local, j)], Codec::value_at(local, decltype(type)::value, j), scale);
        }
      });
    });
  }

  /// Bucketed values: chunks of whole 32-code groups, in both passes.
  static std::size_t bucket_chunks(host& exec, std::uint64_t count) {
    return std::max<std::size_t>(1, chunk_count(exec, count));
  }

  /// Every code one the stage writes (a group at a time), every COO index in place.
  template <class Codec>
  static void validate_buckets(host& exec, const payload_view& v) {
    using Values = typename Codec::values_type;
    if constexpr (Codec::checks_elements) {
      const std::uint64_t groups = (v.count + 31) / 32;
      const std::size_t chunks = bucket_chunks(exec, v.count);
      validate_chunks(exec, chunks, [&](std::size_t c) {
        const index_range g = chunk_of(groups, chunks, c);
        if constexpr (needs_code_check<Values>::value) {
          std::uint64_t bad = 0;
          if (!values_backend<host>::codes_valid<Values>(v.values, g.begin, g.end, v.count, bad)) {
            return wire::fail(wire::format_errc::bad_code, bad, quantize::unpack_code(v.values, Values::bits, bad),
                              Values::max_code);
          }
        }
        const std::uint64_t end = std::min<std::uint64_t>(v.count, g.end * 32);
        for (std::uint64_t j = g.begin * 32; j < end; ++j) {
          const wire::status s = Codec::check_position(v, j);
          if (!s.ok()) return s;
        }
        return wire::status{};
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
            v.scales, v.values, v.count, g.begin, g.end, [&](std::uint64_t j) { return Codec::index_at(v, j); },
            out.data(), alpha, [&](std::uint64_t j) { return Codec::implicit_scale(v, j); });
      } else {
        values_backend<host>::decode_groups<Values>(v.scales, v.values, v.count, g.begin, g.end,
                                                    identity_index{}, out.data(), alpha);
      }
    });
  }
};

}  // namespace detail
}  // namespace gradzip
