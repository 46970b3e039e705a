/**
 * @file writer.hpp
 * @brief Lays out a payload's sections and writes its header.
 *
 * A codec lists its sections (tag and size in bytes); `payload_layout` places them after the
 * header at 16-byte aligned offsets and computes total_bytes. `write_header` then writes the
 * header, the section table and zero padding; the codec fills the sections. Layouts depend only
 * on sizes known before any data is read, so the host can write the header of a payload the GPU
 * fills.
 *
 * @code
 * gradzip::wire::payload_layout layout;
 * layout.add(gradzip::wire::tag::params, 16);
 * layout.add(gradzip::wire::tag::values, n * 4);
 * std::vector<std::uint8_t> out(layout.total_bytes());
 * const gradzip::wire::codec_id id{0, 0, 0, 0};             // your stages' ids
 * gradzip::wire::write_header(out.data(), layout, gradzip::element_type::f32, id, n);
 * @endcode
 */
#pragma once

#include <cstring>

#include "gradzip/wire/format.hpp"

namespace gradzip::wire {

class payload_layout {
 public:
  /// Appends a section of `size` bytes; returns its position in the table.
  GRADZIP_HOST_DEVICE std::uint32_t add(tag t, std::uint64_t size) {
    sections_[count_] = section{static_cast<std::uint32_t>(t), 0, size};
    return count_++;
  }

  GRADZIP_HOST_DEVICE std::uint32_t section_count() const { return count_; }
  GRADZIP_HOST_DEVICE std::uint64_t header_bytes() const { return header_bytes_for(count_); }

  /// Offset of section i (valid once all sections are added).
  GRADZIP_HOST_DEVICE std::uint64_t offset(std::uint32_t i) const {
    std::uint64_t at = header_bytes();
    for (std::uint32_t j = 0; j < i; ++j) at = align_up(at + sections_[j].size);
    return at;
  }

  GRADZIP_HOST_DEVICE std::uint64_t total_bytes() const {
    return count_ == 0 ? header_bytes()
                       : align_up(offset(count_ - 1) + sections_[count_ - 1].size);
  }

  GRADZIP_HOST_DEVICE section at(std::uint32_t i) const {
    return section{sections_[i].tag, offset(i), sections_[i].size};
  }

 private:
  section sections_[max_sections]{};
  std::uint32_t count_ = 0;
};

/**
 * Writes the header, the section table and the zero padding up to the first section, and zeroes
 * the padding after each section, into `out` (at least layout.total_bytes() bytes).
 */
GRADZIP_HOST_DEVICE inline void write_header(std::uint8_t* out, const payload_layout& layout,
                                             element_type type, codec_id codec,
                                             std::uint64_t element_count) {
  using detail::store_le;
  const std::uint64_t header_bytes = layout.header_bytes();
  for (std::uint64_t i = 0; i < header_bytes; ++i) out[i] = 0;
  store_le(out, magic_word, 4);
  store_le(out + 4, format_version, 2);
  out[6] = static_cast<std::uint8_t>(type);
  out[7] = static_cast<std::uint8_t>(layout.section_count());
  out[8] = codec.transform;
  out[9] = codec.structure;
  out[10] = codec.values;
  out[11] = codec.indices;
  store_le(out + 16, element_count, 8);
  store_le(out + 24, layout.total_bytes(), 8);
  store_le(out + 36, header_bytes, 4);
  for (std::uint32_t i = 0; i < layout.section_count(); ++i) {
    const section s = layout.at(i);
    std::uint8_t* entry = out + fixed_header_bytes + section_entry_bytes * i;
    store_le(entry, s.tag, 4);
    store_le(entry + 8, s.offset, 8);
    store_le(entry + 16, s.size, 8);
  }
}

/// Zeroes the alignment padding that follows each section (so payload bytes are deterministic).
GRADZIP_HOST_DEVICE inline void zero_section_padding(std::uint8_t* out, const payload_layout& layout) {
  for (std::uint32_t i = 0; i < layout.section_count(); ++i) {
    const section s = layout.at(i);
    const std::uint64_t end = s.offset + s.size;
    for (std::uint64_t b = end; b < align_up(end); ++b) out[b] = 0;
  }
}

}  // namespace gradzip::wire
