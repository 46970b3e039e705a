/**
 * @file format.hpp
 * @brief The gradzip payload format, version 1: constants and the decoded header.
 *
 * Every payload starts with a 48-byte little-endian header, then a table of sections, then the
 * sections, each at a 16-byte aligned offset. `docs/format.md` describes it byte by byte.
 *
 * | offset | size | field                                               |
 * |--------|------|-----------------------------------------------------|
 * | 0      | 4    | magic "GRDZ"                                        |
 * | 4      | 2    | format version (1)                                  |
 * | 6      | 1    | element type (`gradzip::element_type`)              |
 * | 7      | 1    | section count (at most 16)                          |
 * | 8      | 4    | codec id: transform, structure, values, indices ids |
 * | 12     | 4    | flags (bit 0: checksum present)                     |
 * | 16     | 8    | element count n of the dense tensor                 |
 * | 24     | 8    | total bytes of the payload (a multiple of 16)       |
 * | 32     | 4    | CRC-32C of the payload (0 unless bit 0 of flags)    |
 * | 36     | 4    | header bytes: 48 + 24 x sections, rounded up to 16  |
 * | 40     | 8    | reserved, zero                                      |
 * | 48     | 24 s | sections: tag u32, reserved u32, offset u64, size u64 |
 */
#pragma once

#include <cstdint>

#include "gradzip/core/config.hpp"
#include "gradzip/core/element_type.hpp"
#include "gradzip/wire/errc.hpp"

namespace gradzip::wire {

/// "GRDZ" read as a little-endian u32 (a scalar, so device code can use it too).
inline constexpr std::uint32_t magic_word = 0x5A445247u;
inline constexpr std::uint16_t format_version = 1;
inline constexpr std::size_t fixed_header_bytes = 48;
inline constexpr std::size_t section_entry_bytes = 24;
inline constexpr std::size_t max_sections = 16;
inline constexpr std::size_t alignment = 16;
inline constexpr std::uint32_t flag_checksum = 1u;
inline constexpr std::uint32_t known_flags = flag_checksum;
inline constexpr std::size_t checksum_offset = 32;

/// Clears a payload's checksum flag and field: for a decoder that changes a payload in place
/// (count_sketch::merge), whose CRC would no longer match. Seal it again before sending.
GRADZIP_HOST_DEVICE inline void unseal(std::uint8_t* payload) {
  payload[12] = static_cast<std::uint8_t>(payload[12] & ~flag_checksum);  // flags, little-endian
  for (std::size_t b = 0; b < 4; ++b) payload[checksum_offset + b] = 0;
}

/// Section tags.
enum class tag : std::uint32_t { params = 1, indices = 2, values = 3, scales = 4 };

/// Stage ids that make up a codec id; each policy names its own.
struct codec_id {
  std::uint8_t transform = 0;
  std::uint8_t structure = 0;
  std::uint8_t values = 0;
  std::uint8_t indices = 0;

  GRADZIP_HOST_DEVICE constexpr std::uint32_t packed() const {
    return std::uint32_t{transform} | std::uint32_t{structure} << 8 |
           std::uint32_t{values} << 16 | std::uint32_t{indices} << 24;
  }
  GRADZIP_HOST_DEVICE constexpr bool operator==(const codec_id& o) const {
    return packed() == o.packed();
  }
};

struct section {
  std::uint32_t tag = 0;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
};

/// A decoded header; `sections[0 .. section_count)` are valid.
struct header {
  element_type type = element_type::f32;
  codec_id codec{};
  std::uint32_t flags = 0;
  std::uint64_t element_count = 0;
  std::uint64_t total_bytes = 0;
  std::uint32_t checksum = 0;
  std::uint32_t header_bytes = 0;
  std::uint32_t section_count = 0;
  section sections[max_sections]{};
};

/// The outcome of validation: a code and up to three numbers for the message.
struct status {
  format_errc code = format_errc::ok;
  std::uint64_t a = 0, b = 0, c = 0;
  GRADZIP_HOST_DEVICE constexpr bool ok() const { return code == format_errc::ok; }
};

/// bad_params' third number when no single value is the one expected (the message omits it).
inline constexpr std::uint64_t no_expected_value = ~std::uint64_t{0};

GRADZIP_HOST_DEVICE constexpr status fail(format_errc code, std::uint64_t a = 0,
                                          std::uint64_t b = 0, std::uint64_t c = 0) {
  return status{code, a, b, c};
}

GRADZIP_HOST_DEVICE constexpr std::uint64_t align_up(std::uint64_t x) {
  return (x + (alignment - 1)) / alignment * alignment;
}

/// Header bytes for a given number of sections.
GRADZIP_HOST_DEVICE constexpr std::uint64_t header_bytes_for(std::uint64_t sections) {
  return align_up(fixed_header_bytes + section_entry_bytes * sections);
}

namespace detail {

// Little-endian loads and stores, byte by byte: independent of host endianness and alignment.
GRADZIP_HOST_DEVICE inline std::uint64_t load_le(const std::uint8_t* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

GRADZIP_HOST_DEVICE inline void store_le(std::uint8_t* p, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

/// a * b, or false when it overflows 64 bits.
GRADZIP_HOST_DEVICE constexpr bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  if (a != 0 && b > ~std::uint64_t{0} / a) return false;
  out = a * b;
  return true;
}

}  // namespace detail
}  // namespace gradzip::wire
