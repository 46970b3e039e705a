/**
 * @file errc.hpp
 * @brief Why a byte string is not a valid gradzip payload.
 *
 * The validating reader returns one of these codes from host and device code alike; on the host
 * it becomes a `gradzip::format_error` whose `code()` is the value and whose message adds the
 * numbers involved.
 */
#pragma once

#include <cstdint>

namespace gradzip::wire {

enum class format_errc : std::uint32_t {
  ok = 0,
  truncated,              ///< fewer bytes than the header or total_bytes promise
  bad_magic,              ///< the first four bytes are not "GRDZ"
  unsupported_version,    ///< a format version this reader does not know
  unknown_element_type,   ///< the element type code names no type
  unknown_flags,          ///< a flag bit this version does not define is set
  nonzero_reserved,       ///< a reserved field is not zero
  bad_header_size,        ///< header_bytes disagrees with the section count or alignment
  bad_total_size,         ///< total_bytes is smaller than the header or not a multiple of 16
  bad_section_count,      ///< more sections than the format allows, or not what the codec needs
  section_out_of_range,   ///< a section reaches past total_bytes or into the header
  section_misaligned,     ///< a section offset is not a multiple of 16, or not where the codec puts it
  section_overlap,        ///< sections overlap or are not in increasing offset order
  bad_section_tag,        ///< a section's tag is not the one the codec expects there
  codec_mismatch,         ///< the payload was made by another codec (stage ids differ)
  bad_params,             ///< the parameter section has the wrong size or an invalid field
  count_overflow,         ///< a count times an element size overflows, or a count exceeds n
  bad_section_size,       ///< a section's size disagrees with the counts in the parameters
  index_out_of_range,     ///< an index is >= the element count
  index_not_increasing,   ///< indices are not strictly increasing (duplicate or unsorted)
  size_mismatch,          ///< the payload's element count differs from the output tensor's
  checksum_mismatch,      ///< the CRC-32C of the payload disagrees with the stored one
  bad_code,               ///< a value's code is outside the values stage's range
  bitmap_count_mismatch,  ///< a bitmap's set bits disagree with the payload's count
  bitmap_bit_past_end,    ///< a bitmap sets a bit at or past the element count
  non_canonical_varint,   ///< a gap is stored in more bytes than it needs, or an unused slot is set
  varint_overrun,         ///< a chunk's gaps run past its data bytes, or leave some unread
  bad_chunk_table,        ///< a chunk-table entry disagrees with the data it indexes
  count_over_bound,       ///< compress: a data-dependent selection exceeds its payload bound
  element_type_mismatch,  ///< a payload or saved state holds another element type than the reader's
  trailing_bytes,         ///< bytes follow the last payload where none may
  step_incomplete,        ///< a payload of a multi-payload step arrived after an earlier one was rejected
  bad_scale,              ///< a block's scale is negative or not finite, and not the codec's NaN marker
};

/// The last code: a code read from bytes (Zen's part messages carry one) is at most this.
inline constexpr format_errc last_format_errc = format_errc::bad_scale;

/// A short English description of a code.
inline const char* describe(format_errc code) noexcept {
  switch (code) {
    case format_errc::ok: return "ok";
    case format_errc::truncated: return "payload truncated";
    case format_errc::bad_magic: return "bad magic (not a gradzip payload)";
    case format_errc::unsupported_version: return "unsupported format version";
    case format_errc::unknown_element_type: return "unknown element type";
    case format_errc::unknown_flags: return "unknown flag bits";
    case format_errc::nonzero_reserved: return "reserved field is not zero";
    case format_errc::bad_header_size: return "bad header size";
    case format_errc::bad_total_size: return "bad total size";
    case format_errc::bad_section_count: return "bad section count";
    case format_errc::section_out_of_range: return "section out of range";
    case format_errc::section_misaligned: return "section misaligned";
    case format_errc::section_overlap: return "sections overlap or are out of order";
    case format_errc::bad_section_tag: return "unexpected section tag";
    case format_errc::codec_mismatch: return "payload made by a different codec";
    case format_errc::bad_params: return "invalid codec parameters";
    case format_errc::count_overflow: return "count overflow";
    case format_errc::bad_section_size: return "section size disagrees with its count";
    case format_errc::index_out_of_range: return "index out of range";
    case format_errc::index_not_increasing: return "indices not strictly increasing";
    case format_errc::size_mismatch: return "element count differs from the output size";
    case format_errc::checksum_mismatch: return "checksum mismatch";
    case format_errc::bad_code: return "value code out of range";
    case format_errc::bitmap_count_mismatch: return "bitmap's set bits disagree with the count";
    case format_errc::bitmap_bit_past_end: return "bitmap sets a bit past the element count";
    case format_errc::non_canonical_varint: return "non-canonical varint";
    case format_errc::varint_overrun: return "varint data overrun";
    case format_errc::bad_chunk_table: return "chunk table disagrees with the data";
    case format_errc::count_over_bound: return "the selection exceeds the payload bound";
    case format_errc::element_type_mismatch: return "element type differs from the expected one";
    case format_errc::trailing_bytes: return "trailing bytes after the payload";
    case format_errc::step_incomplete: return "an earlier payload of this step was rejected";
    case format_errc::bad_scale: return "bad block scale";
  }
  return "unknown error";
}

}  // namespace gradzip::wire
