// detail::compressor<Codec>: how codec::compress lays out and fills a payload on any executor:
// straight from the selection (COO or no indices), through scratch for a staged index encoding
// (delta-varint, automatic), and through scratch for a bucketed values stage; and the scratch
// each needs. The executors' backends do the loops (detail/host/, detail/cuda/).
#pragma once

#include <cstddef>
#include <cstdint>

#include "gradzip/core/element_type.hpp"
#include "gradzip/core/error.hpp"
#include "gradzip/core/span.hpp"
#include "gradzip/detail/codec_frame.hpp"
#include "gradzip/detail/codec_traits.hpp"
#include "gradzip/wire/writer.hpp"

namespace gradzip::detail {

template <class Codec>
struct compressor {
  using Structure = typename Codec::structure_type;
  using Values = typename Codec::values_type;
  using Indices = typename Codec::indices_type;

  /// Where the kept values start in scratch, after the structure stage's own scratch.
  static std::size_t value_scratch_offset(std::size_t structure_bytes) {
    return detail::scratch_aligned(structure_bytes);
  }

  /// Scratch compress needs for n elements of T.
  template <class T, class Exec>
  static std::size_t workspace_bytes(const Codec& c, Exec& exec, std::size_t n) {
    if constexpr (Codec::implicit_indices) {
      // The selection needs no scratch; a bucketed stage keeps the k values there first.
      return Codec::bucketed ? value_scratch_offset(0) + c.structure().selected_count(n) * sizeof(float) : 0;
    } else {
      const std::size_t structure = detail::structure_workspace<T>(exec, c.structure(), n);
      if constexpr (Codec::staged) {
        return staging_of<T>(exec, structure, c.structure().selected_count(n)).total;
      } else if constexpr (Codec::has_indices && Codec::bucketed) {
        return value_scratch_offset(structure) + c.structure().selected_count(n) * sizeof(float);
      } else {
        return structure;
      }
    }
  }

  /// The data-dependent count pass and the selection of compress_async, for its backends.
  template <class Exec, class T>
  static const std::uint64_t* count_on_device(const Codec& c, Exec& exec, span<const T> input) {
    exec.scratch(c.template workspace_bytes<T>(exec, input.size()));  // before the pass: growth discards
    return detail::structure_backend<Exec, Structure>::count_on_device(exec, c.structure(), input);
  }
  template <class Exec, class T, class Sink>
  static void select_into(const Codec& c, Exec& exec, span<const T> input, const Sink& sink) {
    detail::structure_backend<Exec, Structure>::select(exec, c.structure(), input, c.structure().selected_count(input.size()),
                                                       sink);
  }

  /// Compress when the selection writes straight into the payload (no staged index encoding).
  template <class Exec, class T>
  static std::size_t compress_direct(const Codec& c, Exec& exec, span<const T> input, span<std::byte> out,
                                     quantize::compress_context ctx, std::uint64_t k) {
    const std::uint64_t n = input.size();
    const wire::payload_layout l = Codec::layout(element_traits<T>::type, n, k);
    GRADZIP_EXPECTS(out.size() >= l.total_bytes(), "compress: output buffer holds ", out.size(),
                    " bytes, the payload needs ", l.total_bytes());
    auto* base = reinterpret_cast<std::uint8_t*>(out.data());
    frame_params sp;
    if constexpr (Codec::implicit_indices) c.structure().write_params(sp.structure, ctx);
    using structure_run = detail::structure_backend<Exec, Structure>;
    // A select that writes the frame itself (CUDA exact top-k) saves the frame's own launch.
    constexpr bool select_frames = !Codec::implicit_indices && !Codec::bucketed && writes_frame_v<structure_run>;
    if constexpr (!select_frames) {
      detail::payload_backend<Exec>::write_frame(exec, c, base, l, element_traits<T>::type, n, k, sp);
    }
    std::uint8_t* indices = Codec::has_indices ? base + l.at(1).offset : nullptr;
    std::uint8_t* values = base + l.at(Codec::section_count - 1).offset;
    if constexpr (Codec::implicit_indices && Codec::bucketed) {  // values into scratch, then buckets over them
      const std::size_t at = value_scratch_offset(0);
      auto* kept = reinterpret_cast<float*>(exec.scratch(at + k * sizeof(float)) + at);
      detail::implicit_backend<Exec>::template select<Structure>(exec, sp, input, k, values_sink<T>{kept});
      detail::values_backend<Exec>::encode_buckets(exec, c.values(), static_cast<const float*>(kept), k,
                                                   base + l.at(1).offset, values,
                                                   implicit_index<Structure>{sp, n, k}, ctx);
    } else if constexpr (Codec::implicit_indices) {
      const payload_sink<T, Values, Indices> sink{indices, frame<Codec>::index_width(n), values, c.values(), ctx};
      detail::implicit_backend<Exec>::template select<Structure>(exec, sp, input, k, sink);
    } else if constexpr (!Codec::bucketed) {
      const payload_sink<T, Values, Indices> sink{indices, frame<Codec>::index_width(n), values, c.values(), ctx};
      if constexpr (select_frames) {
        const auto frame_write = detail::payload_backend<Exec>::frame_for(c, base, l, element_traits<T>::type, n, k, sp);
        using framed = sink_with_prologue<payload_sink<T, Values, Indices>, std::remove_const_t<decltype(frame_write)>>;
        structure_run::select(exec, c.structure(), input, k, framed{sink, frame_write});
      } else {
        structure_run::select(exec, c.structure(), input, k, sink);
      }
    } else if constexpr (!Codec::has_indices) {  // dense: buckets straight from the input
      detail::values_backend<Exec>::encode_buckets(exec, c.values(), input.data(), k,
                                                   base + l.at(1).offset, values,
                                                   identity_index{}, ctx);
    } else {  // indices into the payload, values into scratch, then buckets over the k values
      const std::size_t structure_bytes = detail::structure_workspace<T>(exec, c.structure(), n);
      const std::size_t offset = value_scratch_offset(structure_bytes);
      auto* kept = reinterpret_cast<float*>(exec.scratch(offset + k * sizeof(float)) + offset);
      structure_run::select(exec, c.structure(), input, k,
                            split_sink<T, Indices>{indices, frame<Codec>::index_width(n), kept});
      detail::values_backend<Exec>::encode_buckets(
          exec, c.values(), static_cast<const float*>(kept), k, base + l.at(2).offset, values,
          stored_index<Indices>{indices, frame<Codec>::index_width(n)}, ctx);
    }
    return l.total_bytes();
  }

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
    if constexpr (!Codec::bucketed) value_bytes = k * Values::value_size(element_traits<T>::type);
    s.encoder = detail::scratch_aligned(s.values + value_bytes);
    s.total = s.encoder + detail::index_encoder<Exec>::workspace_bytes(exec, k);
    return s;
  }

  /// Compress for a staged index encoding: the selection writes indices and values into
  /// scratch, the encoding is chosen and sized, then the frame, indices and values are written.
  template <class Exec, class T>
  static std::size_t compress_staged(const Codec& c, Exec& exec, span<const T> input, span<std::byte> out,
                                     quantize::compress_context ctx, std::uint64_t k) {
    using structure_run = detail::structure_backend<Exec, Structure>;
    using encoder = detail::index_encoder<Exec>;
    const std::uint64_t n = input.size();
    const element_type type = element_traits<T>::type;
    const staging at = staging_of<T>(exec, detail::structure_workspace<T>(exec, c.structure(), n), k);
    std::byte* scratch = exec.scratch(at.total);
    auto* idx = reinterpret_cast<std::uint8_t*>(scratch + at.indices);
    auto* staged_values = reinterpret_cast<std::uint8_t*>(scratch + at.values);
    if constexpr (Codec::bucketed) {
      structure_run::select(exec, c.structure(), input, k,
                            split_sink<T, encode::coo>{idx, 8, reinterpret_cast<float*>(staged_values)});
    } else {
      structure_run::select(exec, c.structure(), input, k,
                            payload_sink<T, Values, encode::coo>{idx, 8, staged_values, c.values(), ctx});
    }
    const auto* sorted = reinterpret_cast<const std::uint64_t*>(idx);
    frame_params fp;
    const std::uint64_t index_bytes =
        encoder::template plan<Indices>(exec, sorted, k, n, scratch + at.encoder, fp.index_encoding);
    const wire::payload_layout l = Codec::layout(type, n, k, index_bytes);
    GRADZIP_EXPECTS(out.size() >= l.total_bytes(), "compress: output buffer holds ", out.size(),
                    " bytes, the payload needs ", l.total_bytes());
    auto* base = reinterpret_cast<std::uint8_t*>(out.data());
    detail::payload_backend<Exec>::write_frame(exec, c, base, l, type, n, k, fp);
    encoder::encode(exec, fp.index_encoding, sorted, k, n, scratch + at.encoder, base + l.at(1).offset);
    if constexpr (Codec::bucketed) {
      detail::values_backend<Exec>::encode_buckets(
          exec, c.values(), reinterpret_cast<const float*>(staged_values), k, base + l.at(2).offset,
          base + l.at(3).offset, stored_index<encode::coo>{idx, 8}, ctx);
    } else {
      encoder::copy(exec, base + l.at(2).offset, staged_values, k * Values::value_size(type));
    }
    return l.total_bytes();
  }
};

}  // namespace gradzip::detail
