// detail::frame<Codec>: a codec's payload frame (header, parameters, section table) and the
// per-element reads of a parsed payload, in HOST_DEVICE code both executors share, so that the
// host and CUDA write and validate the same bytes. docs/format.md describes the bytes.
#pragma once

#include <cstdint>
#include <type_traits>

#include "gradzip/core/element_type.hpp"
#include "gradzip/detail/codec_traits.hpp"
#include "gradzip/encode/automatic.hpp"
#include "gradzip/quantize/bit_packing.hpp"
#include "gradzip/wire/format.hpp"
#include "gradzip/wire/reader.hpp"
#include "gradzip/wire/writer.hpp"

namespace gradzip::detail {

template <class Codec>
struct frame {
  using Structure = typename Codec::structure_type;
  using Values = typename Codec::values_type;
  using Indices = typename Codec::indices_type;
  static constexpr bool has_indices = Codec::has_indices;
  static constexpr bool implicit_indices = Codec::implicit_indices;
  static constexpr bool bucketed = Codec::bucketed;
  static constexpr std::uint32_t section_count = Codec::section_count;
  static constexpr bool dense = Codec::dense;
  static constexpr wire::codec_id id = Codec::id;
  static constexpr std::uint64_t params_bytes = Codec::params_bytes;
  static constexpr std::uint64_t structure_params_bytes = Codec::structure_params_bytes;
  static constexpr std::uint64_t values_params_at = Codec::values_params_at;
  static constexpr std::uint64_t indices_params_at = Codec::indices_params_at;

  /// The frame's head: header, section table and parameters with their padding, up to the
  /// first section after the parameters (every layout starts with the parameters, params_bytes).
  static constexpr std::uint64_t head_bytes = wire::header_bytes_for(section_count) + wire::align_up(params_bytes);

  /// Writes the head: bytes [0, head_bytes) of the payload (host or device code).
  GRADZIP_HOST_DEVICE static void write_head(std::uint8_t* out, const wire::payload_layout& l, element_type type,
                                             std::uint64_t n, std::uint64_t k, const frame_params& sp) {
    wire::write_header(out, l, type, id, n);
    std::uint8_t* params = out + l.at(0).offset;
    for (std::uint64_t i = 0; i < wire::align_up(params_bytes); ++i) params[i] = 0;
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
  }

  /// Writes the header, the parameters and all padding of a payload (host or device code).
  GRADZIP_HOST_DEVICE static void write_frame(std::uint8_t* out, const wire::payload_layout& l,
                                              element_type type, std::uint64_t n, std::uint64_t k,
                                              const frame_params& sp) {
    write_head(out, l, type, n, k, sp);
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
                                                payload_view& v) {
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
      return wire::fail(wire::format_errc::bad_params, params_at, v.count, h.element_count);
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
  GRADZIP_HOST_DEVICE static double value_at(const payload_view& v, element_type type,
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
  GRADZIP_HOST_DEVICE static double implicit_scale(const payload_view& v, std::uint64_t j) {
    return Structure::value_scale(v.structure_params, v.header.element_count, v.count, j);
  }

  /// The tensor index of payload element j (its own position for a dense structure).
  GRADZIP_HOST_DEVICE static std::uint64_t index_at(const payload_view& v, std::uint64_t j) {
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
  GRADZIP_HOST_DEVICE static wire::status check_index(const payload_view& v,
                                                      std::uint64_t j) {
    if constexpr (detail::needs_code_check<Values>::value) {
      const unsigned code = quantize::unpack_code(v.values, Values::bits, j);
      if (code > Values::max_code) return wire::fail(wire::format_errc::bad_code, j, code, Values::max_code);
    }
    return check_position(v, j);
  }

  /// The index half of `check_index`: element j's index is below n and above index j - 1 (COO;
  /// the bitmap and delta-varint decoders check their own indices as they read them).
  GRADZIP_HOST_DEVICE static wire::status check_position(const payload_view& v,
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
};

}  // namespace gradzip::detail
