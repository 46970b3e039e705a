/**
 * @file codec.hpp
 * @brief `gradzip::codec<Structure, Values, Indices>`: stage policies composed into one codec.
 *
 * A codec turns a dense gradient into one self-describing payload (see docs/format.md) and
 * back. The stages run in order: the structure stage chooses what to send (`sparsify::topk`,
 * or `sparsify::none` for every element), the values stage encodes the chosen values
 * (`quantize::none` sends them unchanged, `quantize::cast<f16/bf16>` rounds them), and the
 * indices stage encodes the chosen indices (`encode::coo`, or `encode::none` for a dense
 * structure). Each stage's interface is stated in gradzip/stage.hpp; stages written outside the
 * library compose the same way (docs/extending.md).
 *
 * What a codec does:
 * - `compress` writes one payload of at most `max_compressed_bytes<T>(n)` bytes and returns its
 *   size; `compress_async` leaves the size in the executor's memory instead.
 * - `decompress_add`, `decompress`, `decompress_add_all` and `decompress_all` validate a payload
 *   (or every payload) completely before writing anything: a bad payload raises
 *   `format_error` (CUDA: at `exec.check()`) and leaves the output unchanged.
 * - The same codec and inputs give the same bytes on every executor and thread count.
 * - Scratch memory belongs to the executor: after `exec.reserve(workspace_bytes<T>(exec, n))`
 *   nothing allocates.
 *
 * A codec is a small trivially copyable value. `codec::summable` says whether payloads may be
 * summed (allreduced). Every call takes an executor first: `gradzip::host` (this header) or
 * `gradzip::cuda` (`gradzip/core/cuda.cuh`, which adds the CUDA backends). How a payload is laid
 * out and filled lives in detail/codec_frame.hpp and detail/codec_compress.hpp, shared by both
 * executors; the loops live in detail/host/ and detail/cuda/.
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

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "gradzip/core/element_type.hpp"
#include "gradzip/core/error.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/core/span.hpp"
#include "gradzip/detail/codec_compress.hpp"
#include "gradzip/detail/codec_traits.hpp"
#include "gradzip/encode/automatic.hpp"
#include "gradzip/encode/none.hpp"
#include "gradzip/hash/hashed_topk.hpp"
#include "gradzip/quantize/cast.hpp"
#include "gradzip/quantize/natural.hpp"
#include "gradzip/quantize/none.hpp"
#include "gradzip/quantize/onebit.hpp"
#include "gradzip/quantize/qsgd.hpp"
#include "gradzip/quantize/sign.hpp"
#include "gradzip/quantize/terngrad.hpp"
#include "gradzip/quantize/uniform.hpp"
#include "gradzip/sparsify/blockwise_topk.hpp"
#include "gradzip/sparsify/none.hpp"
#include "gradzip/sparsify/randomk.hpp"
#include "gradzip/sparsify/sampled_topk.hpp"
#include "gradzip/sparsify/threshold.hpp"
#include "gradzip/sparsify/topk.hpp"
#include "gradzip/stage.hpp"
#include "gradzip/wire/reader.hpp"
#include "gradzip/wire/writer.hpp"

namespace gradzip {

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
  const Indices& indices() const noexcept { return indices_; }

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
    const std::size_t compress = detail::compressor<codec>::template workspace_bytes<T>(*this, exec, n);
    const std::size_t decode = detail::payload_backend<Exec>::template decode_workspace_bytes<codec>(exec, n);
    return compress > decode ? compress : decode;
  }


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
      return detail::compressor<codec>::compress_staged(*this, exec, input, out, ctx, k);
    } else {
      return detail::compressor<codec>::compress_direct(*this, exec, input, out, ctx, k);
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
   * accum <- accum + alpha * (the sum of every payload's decode), every payload validated
   * before any is applied. What a gather-based allreduce does with its peers' payloads
   * (comm::allreducer). Host: a bad payload throws format_error naming its position, and dense
   * payloads are accumulated in one pass over `accum`. CUDA: the payloads are added one after
   * another (each addition rounded, as decompress_add rounds it), and a failure reaches
   * `exec.check()`; either way `accum` is then unchanged.
   */
  template <class Exec, class T>
  void decompress_add_all(Exec& exec, span<const span<const std::byte>> payloads, span<T> accum,
                          float alpha = 1.0f) const {
    if constexpr (std::is_same_v<Exec, host>) {
      std::size_t bad = 0;
      try {
        detail::payload_backend<Exec>::decode_all(exec, *this, payloads, accum, alpha, false, bad);
      } catch (const format_error& e) {
        throw format_error(e.code(), detail::concat("payload ", bad, " of ", payloads.size(), ": ", e.what()));
      }
    } else {
      // Every check first: a failure in the status word makes each later apply kernel skip, and
      // the applies do not validate again.
      for (const auto& p : payloads) detail::payload_backend<Exec>::check(exec, *this, p, accum.size());
      for (const auto& p : payloads) detail::payload_backend<Exec>::decode_checked(exec, *this, p, accum, alpha, false);
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
      // Every check first: a failure in the status word makes each later apply kernel skip, and
      // the applies do not validate again.
      for (const auto& p : payloads) detail::payload_backend<Exec>::check(exec, *this, p, dense_out.size());
      for (std::size_t m = 0; m < payloads.size(); ++m) {
        detail::payload_backend<Exec>::decode_checked(exec, *this, payloads[m], dense_out, 1.0f, m == 0);
      }
    }
  }

  /// dense_out <- decode(payload): every element written (zeros where a sparsifier sent none).
  template <class Exec, class T>
  void decompress(Exec& exec, span<const std::byte> payload, span<T> dense_out) const {
    detail::payload_backend<Exec>::decode(exec, *this, payload, dense_out, 1.0f, true);
  }

 private:
  Structure structure_{};
  Values values_{};
  Indices indices_{};
};

}  // namespace gradzip

// The host executor's backends (the CUDA ones come with gradzip/core/cuda.cuh).
#include "gradzip/detail/host/structure.hpp"
#include "gradzip/detail/host/quantize.hpp"
#include "gradzip/detail/host/threshold.hpp"
#include "gradzip/detail/host/sampled_topk.hpp"
#include "gradzip/detail/host/hashed_topk.hpp"
#include "gradzip/detail/host/blockwise_topk.hpp"
#include "gradzip/detail/host/encode.hpp"
#include "gradzip/detail/host/payload.hpp"
