/**
 * @file zen_part.hpp
 * @brief The wire frame of Zen's part payloads (`comm::sparse_sync`'s messages) and their
 * checks, shared by every executor's engine: the frame (header and params) is checked on the
 * host, the positions where the bytes live.
 */
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include <vector>

#include "gradzip/core/error.hpp"
#include "gradzip/encode/automatic.hpp"
#include "gradzip/hash/partition.hpp"
#include "gradzip/wire/reader.hpp"
#include "gradzip/wire/writer.hpp"

namespace gradzip::comm {

/// Structure id of Zen's part payloads (docs/format.md).
inline constexpr std::uint8_t zen_part_id = 10;

namespace detail {

/// y += alpha * v: exactly y + v when alpha is 1, else one fused multiply-add (every scheme,
/// auto_sparse_sync's dense one included, applies its sums so).
GRADZIP_HOST_DEVICE inline void add_scaled(float& y, float v, float alpha) { y = alpha == 1.0f ? y + v : fmaf(alpha, v, y); }

/**
 * A part payload: element type f32, element count |I_p| (the member space), codec id
 * {0, 10, 0, encoding}, sections params (32 bytes), indices (positions in I_p, increasing),
 * values (k floats).
 *
 * | params byte | field |
 * | 0 | u32 part p (P for a whole payload) |
 * | 4 | u32 sender rank |
 * | 8 | u8 phase: 0 a part for its owner, 1 a reduced part, 2 a whole payload (allgather), 3 a
 *   stage of the hierarchy (part = the stage) |
 * | 9 | u8 failed: 1 when the owner could not merge a part (then k = 0), else 0 |
 * | 10 | u16 the format_errc of that part (failed = 1), else 0 |
 * | 12 | u32 the rank that sent that part (failed = 1), else 0 |
 * | 16 | u64 k |
 * | 24 | the encoding's 8 parameter bytes |
 */
struct zen_part {
  static constexpr std::uint64_t params_bytes = 32;

  std::uint32_t part = 0;
  std::uint32_t sender = 0;
  std::uint8_t phase = 0;
  std::uint8_t failed = 0;
  std::uint16_t code = 0;
  std::uint32_t culprit = 0;
  std::uint64_t members = 0;  ///< |I_p|
  std::uint64_t k = 0;
  std::uint8_t encoding = encode::coo::id;
  std::uint64_t index_bytes = 0;

  GRADZIP_HOST_DEVICE wire::payload_layout layout() const {
    wire::payload_layout l;
    l.add(wire::tag::params, params_bytes);
    l.add(wire::tag::indices, index_bytes);
    l.add(wire::tag::values, k * sizeof(float));
    return l;
  }

  /// The header and params, and the padding after every section (the CUDA engine writes the
  /// frame with a one-thread kernel, and the index and value sections after it).
  GRADZIP_HOST_DEVICE void write_frame(std::uint8_t* out) const {
    const wire::payload_layout l = layout();
    wire::write_header(out, l, element_type::f32, wire::codec_id{0, zen_part_id, 0, encoding}, members);
    wire::zero_section_padding(out, l);
    std::uint8_t* p = out + l.at(0).offset;
    for (std::uint64_t b = 0; b < params_bytes; ++b) p[b] = 0;
    wire::detail::store_le(p, part, 4);
    wire::detail::store_le(p + 4, sender, 4);
    p[8] = phase;
    p[9] = failed;
    wire::detail::store_le(p + 10, code, 2);
    wire::detail::store_le(p + 12, culprit, 4);
    wire::detail::store_le(p + 16, k, 8);
    if (encoding == encode::coo::id) encode::coo::write_params(p + 24, members);
    if (encoding == encode::delta_varint::id) encode::delta_varint::write_params(p + 24, members);
  }
};

/// A validated part: its frame fields and where its sections are.
struct zen_part_view {
  zen_part frame;
  const std::uint8_t* indices = nullptr;
  const std::uint8_t* value_bytes = nullptr;  // may be unaligned on the host: read with memcpy
};

/// f(j, position) for the positions of a part, in order, checking them as it goes: increasing,
/// below |I_p|, and as many as k.
template <class F>
wire::status for_each_position(const zen_part_view& v, F&& f) {
  using wire::format_errc;
  const zen_part& z = v.frame;
  if (z.encoding == encode::coo::id) {
    const int width = encode::coo::index_width(z.members);
    std::uint64_t previous = 0;
    for (std::uint64_t j = 0; j < z.k; ++j) {
      const std::uint64_t i = encode::coo::load(v.indices, width, j);
      if (i >= z.members) return wire::fail(format_errc::index_out_of_range, j, i, z.members);
      if (j != 0 && i <= previous) return wire::fail(format_errc::index_not_increasing, j, i, previous);
      previous = i;
      f(j, i);
    }
    return {};
  }
  if (z.encoding == encode::bitmap::id) {
    std::uint64_t bits = 0;
    const std::uint64_t words = encode::bitmap::words(z.members);
    const wire::status s = encode::bitmap::count_bits(v.indices, z.members, 0, words, bits);
    if (!s.ok()) return s;
    if (bits != z.k) return wire::fail(format_errc::bitmap_count_mismatch, bits, z.k);
    encode::bitmap::for_each_index(v.indices, 0, words, 0, f);
    return {};
  }
  const int width = encode::delta_varint::gap_width(z.members);
  for (std::uint64_t c = 0; c < encode::delta_varint::chunks(z.k); ++c) {
    const wire::status s = encode::delta_varint::decode_chunk(v.indices, z.index_bytes, z.k, z.members, width, c, f);
    if (!s.ok()) return s;
  }
  return {};
}

/// Checks the frame of `bytes` (one payload of `size` bytes, of which the first `avail` are
/// readable) as a part of `phase` for part `part` (|I_part| = members) sent by `sender`: header,
/// params, section sizes. Fills v, without checking positions (for_each_position does). When the
/// header or params lie past `avail`, fails with `truncated` (the caller then reads the whole
/// payload).
inline wire::status check_zen_frame(const std::uint8_t* bytes, std::uint64_t size, std::uint64_t avail,
                                    std::uint32_t part, std::uint32_t sender, std::uint8_t phase,
                                    std::uint64_t members, std::uint32_t ranks, zen_part_view& v) {
  using wire::format_errc;
  if (avail < wire::header_bytes_for(wire::max_sections) && avail < size) {
    return wire::fail(format_errc::truncated, wire::header_bytes_for(wire::max_sections), avail);
  }
  wire::header h;
  wire::status s = wire::parse_header(bytes, size, h);
  if (!s.ok()) return s;
  if (h.total_bytes != size) return wire::fail(format_errc::trailing_bytes, size - h.total_bytes, h.total_bytes);
  if (h.flags != 0) return wire::fail(format_errc::unknown_flags, h.flags);  // parts are never sealed
  const std::uint8_t encoding = h.codec.indices;
  if (h.codec.transform != 0 || h.codec.structure != zen_part_id || h.codec.values != 0 ||
      (encoding != encode::coo::id && encoding != encode::bitmap::id && encoding != encode::delta_varint::id)) {
    return wire::fail(format_errc::codec_mismatch, h.codec.packed(),
                      wire::codec_id{0, zen_part_id, 0, encode::coo::id}.packed());
  }
  const wire::tag tags[3] = {wire::tag::params, wire::tag::indices, wire::tag::values};
  s = wire::expect_sections(h, tags, 3);
  if (!s.ok()) return s;
  if (h.sections[0].size != zen_part::params_bytes) {
    return wire::fail(format_errc::bad_section_size, 0, h.sections[0].size, zen_part::params_bytes);
  }
  if (h.type != element_type::f32) {
    return wire::fail(format_errc::element_type_mismatch, static_cast<std::uint64_t>(h.type),
                      static_cast<std::uint64_t>(element_type::f32));
  }
  if (h.element_count != members) return wire::fail(format_errc::size_mismatch, h.element_count, members);
  const std::uint64_t at = h.sections[0].offset;
  if (at + zen_part::params_bytes > avail) return wire::fail(format_errc::truncated, at + zen_part::params_bytes, avail);
  const std::uint8_t* p = bytes + at;
  const wire::param_field fields[3] = {{0, 4, part}, {4, 4, sender}, {8, 1, phase}};
  s = wire::expect_params(bytes, at, fields, 3);
  if (!s.ok()) return s;
  zen_part z;
  z.part = part;
  z.sender = sender;
  z.phase = phase;
  z.failed = p[9];
  z.code = static_cast<std::uint16_t>(wire::detail::load_le(p + 10, 2));
  z.culprit = static_cast<std::uint32_t>(wire::detail::load_le(p + 12, 4));
  z.members = members;
  z.k = wire::detail::load_le(p + 16, 8);
  z.encoding = encoding;
  z.index_bytes = h.sections[1].size;
  // Only reduced parts and stages report failures, with a code that exists.
  if (z.failed > 1 || (z.failed == 1 && phase != 1 && phase != 3)) {
    return wire::fail(format_errc::bad_params, at + 9, z.failed, wire::no_expected_value);
  }
  if (z.code > static_cast<std::uint16_t>(wire::last_format_errc)) {
    return wire::fail(format_errc::bad_params, at + 10, z.code, wire::no_expected_value);
  }
  if (z.failed == 0 && (z.code != 0 || z.culprit != 0)) return wire::fail(format_errc::nonzero_reserved, at + 10);
  if (z.failed == 1 && (z.code == 0 || z.culprit >= ranks)) {
    return wire::fail(format_errc::bad_params, at + (z.code == 0 ? 10 : 12), z.code == 0 ? z.code : z.culprit,
                      wire::no_expected_value);
  }
  if (z.k > members || (z.failed == 1 && z.k != 0)) return wire::fail(format_errc::count_overflow, z.k, members);
  if (encoding == encode::coo::id) s = encode::coo::check_params(p + 24, members, at + 24);
  if (encoding == encode::bitmap::id) s = encode::bitmap::check_params(p + 24, members, at + 24);
  if (encoding == encode::delta_varint::id) s = encode::delta_varint::check_params(p + 24, members, at + 24);
  if (!s.ok()) return s;
  s = encode::check_section_size(encoding, z.k, members, z.index_bytes, 1);
  if (!s.ok()) return s;
  if (h.sections[2].size != z.k * sizeof(float)) {
    return wire::fail(format_errc::bad_section_size, 2, h.sections[2].size, z.k * sizeof(float));
  }
  v.frame = z;
  v.indices = bytes + h.sections[1].offset;
  v.value_bytes = bytes + h.sections[2].offset;
  return {};
}

/// What a receiver expects of one payload in a buffer of several: where it is, and the frame
/// fields check_zen_frame compares.
struct zen_expect {
  std::uint64_t at = 0, size = 0;
  std::uint32_t part = 0, sender = 0;
  std::uint8_t phase = 0;
  std::uint64_t members = 0;
};

/// Parses `bytes` (exactly one payload, all readable) as check_zen_frame does, and checks every
/// position.
inline wire::status check_zen_part(const std::uint8_t* bytes, std::uint64_t size, std::uint32_t part,
                                   std::uint32_t sender, std::uint8_t phase, std::uint64_t members,
                                   std::uint32_t ranks, zen_part_view& v) {
  const wire::status s = check_zen_frame(bytes, size, size, part, sender, phase, members, ranks, v);
  if (!s.ok()) return s;
  return for_each_position(v, [](std::uint64_t, std::uint64_t) {});
}

inline float zen_value(const zen_part_view& v, std::uint64_t j) {
  float x;
  std::memcpy(&x, v.value_bytes + j * sizeof(float), sizeof(float));
  return x;
}

/// The positions Zen's parts address: index i belongs to part p = h0(i) and travels as its
/// position among I_p's members (in index order). Built once, O(n) hashes, 12 bytes per index.
struct zen_tables {
  zen_tables(std::uint64_t n, int ranks, std::uint64_t seed)
      : partition(static_cast<std::uint32_t>(ranks >= 1 ? ranks : 1), seed) {
    GRADZIP_EXPECTS(ranks >= 1, "sparse_sync: ranks must be >= 1, got ", ranks);
    GRADZIP_EXPECTS(n <= 0xFFFFFFFFull * static_cast<std::uint64_t>(ranks),
                    "sparse_sync: n = ", n, " is too large for 32-bit member positions");
    const auto parts = static_cast<std::size_t>(ranks);
    start.assign(parts + 1, 0);
    position.resize(static_cast<std::size_t>(n));
    std::vector<std::uint64_t> count(parts, 0);
    for (std::uint64_t i = 0; i < n; ++i) position[i] = static_cast<std::uint32_t>(count[partition.part_of(i)]++);
    for (std::size_t p = 0; p < parts; ++p) {
      GRADZIP_EXPECTS(count[p] <= 0x100000000ull, "sparse_sync: part ", p, " has ", count[p],
                      " members, more than 32-bit positions address (n = ", n, ", ranks = ", ranks, ")");
      start[p + 1] = start[p] + count[p];
    }
    members.resize(static_cast<std::size_t>(n));
    for (std::uint64_t i = 0; i < n; ++i) members[start[partition.part_of(i)] + position[i]] = i;
  }

  std::uint64_t size() const noexcept { return members.size(); }
  /// |I_p|: how many indices part p owns.
  std::uint64_t members_of(std::uint32_t p) const { return start[p + 1] - start[p]; }

  hash::partition partition;
  std::vector<std::uint32_t> position;  ///< i's position among its part's members
  std::vector<std::uint64_t> start;     ///< part p's members are members[start[p] .. start[p + 1])
  std::vector<std::uint64_t> members;
};

}  // namespace detail

}  // namespace gradzip::comm
