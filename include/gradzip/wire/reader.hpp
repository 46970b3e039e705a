/**
 * @file reader.hpp
 * @brief The validating payload reader.
 *
 * `parse_header` runs in host and device code and never reads outside `[bytes, bytes + size)`.
 * It checks everything the header promises: magic, version, element type, flags, reserved
 * fields, the header and total sizes against the buffer, and that every section is aligned,
 * inside the payload, after the header, and after the previous one. Codec-specific checks (which
 * sections, what sizes, index ranges) come on top, in each codec.
 *
 * `read_header` is the host entry point: it also verifies the checksum when the payload has one,
 * and throws `gradzip::format_error` with a message that names what was wrong.
 *
 * @code
 * gradzip::wire::header h = gradzip::wire::read_header(gradzip::span<const std::byte>(payload));  // throws on bad bytes
 * std::printf("%llu elements, %u sections\n", static_cast<unsigned long long>(h.element_count), h.section_count);
 * @endcode
 */
#pragma once

#include <iterator>
#include <string>

#include "gradzip/core/error.hpp"
#include "gradzip/core/span.hpp"
#include "gradzip/wire/checksum.hpp"
#include "gradzip/wire/format.hpp"

namespace gradzip::wire {

/// Parses and validates the header and section table of the payload in [bytes, bytes + size).
GRADZIP_HOST_DEVICE inline status parse_header(const std::uint8_t* bytes, std::uint64_t size,
                                               header& h) {
  using detail::load_le;
  if (size < fixed_header_bytes) return fail(format_errc::truncated, fixed_header_bytes, size);
  if (load_le(bytes, 4) != magic_word) return fail(format_errc::bad_magic, load_le(bytes, 4));
  const auto version = load_le(bytes + 4, 2);
  if (version != format_version) return fail(format_errc::unsupported_version, version);
  if (!is_known_element_type(bytes[6])) return fail(format_errc::unknown_element_type, bytes[6]);
  h.type = static_cast<element_type>(bytes[6]);
  h.section_count = bytes[7];
  if (h.section_count > max_sections) {
    return fail(format_errc::bad_section_count, h.section_count, max_sections);
  }
  h.codec = codec_id{bytes[8], bytes[9], bytes[10], bytes[11]};
  h.flags = static_cast<std::uint32_t>(load_le(bytes + 12, 4));
  if ((h.flags & ~known_flags) != 0) return fail(format_errc::unknown_flags, h.flags);
  h.element_count = load_le(bytes + 16, 8);
  h.total_bytes = load_le(bytes + 24, 8);
  h.checksum = static_cast<std::uint32_t>(load_le(bytes + 32, 4));
  if ((h.flags & flag_checksum) == 0 && h.checksum != 0) {
    return fail(format_errc::nonzero_reserved, checksum_offset);
  }
  h.header_bytes = static_cast<std::uint32_t>(load_le(bytes + 36, 4));
  if (load_le(bytes + 40, 8) != 0) return fail(format_errc::nonzero_reserved, 40);

  const auto expected_header = header_bytes_for(h.section_count);
  if (h.header_bytes != expected_header) {
    return fail(format_errc::bad_header_size, h.header_bytes, expected_header);
  }
  if (h.total_bytes < h.header_bytes || h.total_bytes % alignment != 0) {
    return fail(format_errc::bad_total_size, h.total_bytes, h.header_bytes);
  }
  if (size < h.header_bytes) return fail(format_errc::truncated, h.header_bytes, size);
  if (size < h.total_bytes) return fail(format_errc::truncated, h.total_bytes, size);

  std::uint64_t previous_end = h.header_bytes;
  for (std::uint32_t i = 0; i < h.section_count; ++i) {
    const std::uint8_t* entry = bytes + fixed_header_bytes + section_entry_bytes * i;
    section& s = h.sections[i];
    s.tag = static_cast<std::uint32_t>(load_le(entry, 4));
    if (load_le(entry + 4, 4) != 0) {
      return fail(format_errc::nonzero_reserved, fixed_header_bytes + section_entry_bytes * i + 4);
    }
    s.offset = load_le(entry + 8, 8);
    s.size = load_le(entry + 16, 8);
    if (s.offset % alignment != 0) return fail(format_errc::section_misaligned, i, s.offset);
    if (s.offset < h.header_bytes || s.offset > h.total_bytes || s.size > h.total_bytes - s.offset) {
      return fail(format_errc::section_out_of_range, i, s.offset, s.size);
    }
    if (s.offset < previous_end) return fail(format_errc::section_overlap, i, s.offset, previous_end);
    previous_end = s.offset + s.size;
  }
  return {};
}

/// Checks that the header has exactly the sections `tags[0 .. count)`, in that order.
GRADZIP_HOST_DEVICE inline status expect_sections(const header& h, const tag* tags,
                                                  std::uint32_t count) {
  if (h.section_count != count) return fail(format_errc::bad_section_count, h.section_count, count);
  for (std::uint32_t i = 0; i < count; ++i) {
    const auto expected = static_cast<std::uint32_t>(tags[i]);
    if (h.sections[i].tag != expected) {
      return fail(format_errc::bad_section_tag, i, h.sections[i].tag, expected);
    }
  }
  return {};
}

/// Checks a parsed header's codec id, that its sections are exactly `tags[0 .. count)` in that
/// order, and that the first one (the params section) holds `params_bytes`: the frame checks
/// every gradzip payload starts with.
GRADZIP_HOST_DEVICE inline status expect_frame(const header& h, std::uint32_t codec, const tag* tags,
                                               std::uint32_t count, std::uint64_t params_bytes) {
  if (h.codec.packed() != codec) return fail(format_errc::codec_mismatch, h.codec.packed(), codec);
  const status sections = expect_sections(h, tags, count);
  if (!sections.ok()) return sections;
  if (h.sections[0].size != params_bytes) {
    return fail(format_errc::bad_section_size, 0, h.sections[0].size, params_bytes);
  }
  return {};
}

/// A parameter the reader's configuration fixes: `width` little-endian bytes at offset `at`.
struct param_field {
  std::uint64_t at;
  int width;
  std::uint64_t expected;
};

/// Checks fields[0 .. count) of the params section at byte `params_at` of the payload at `base`:
/// bad_params names the first field that differs (its payload offset, the value found and the
/// value expected).
GRADZIP_HOST_DEVICE inline status expect_params(const std::uint8_t* base, std::uint64_t params_at,
                                                const param_field* fields, std::uint32_t count) {
  for (std::uint32_t f = 0; f < count; ++f) {
    const std::uint64_t found = detail::load_le(base + params_at + fields[f].at, fields[f].width);
    if (found != fields[f].expected) return fail(format_errc::bad_params, params_at + fields[f].at, found, fields[f].expected);
  }
  return {};
}

/// A packed codec id as its stages' names, "structure/values/indices", with "hadamard+" in front
/// when the payload is rotated: e.g. "topk/none/coo". The ids are those of docs/format.md.
inline std::string codec_name(std::uint32_t packed) {
  static const char* const structures[] = {"none",         "topk",         "randomk",     "threshold", "blockwise_topk",
                                           "sampled_topk", "count_sketch", "hashed_topk", "simhash",     "powersgd",
                                           "zen_part"};
  static const char* const values[] = {"none", "cast", "uniform", "qsgd", "sign", "terngrad", "onebit", "natural"};
  static const char* const indices[] = {"none", "coo", "bitmap", "delta_varint", "automatic"};
  auto name = [](auto& names, unsigned id, const char* kind) {
    return id < std::size(names) ? std::string(names[id]) : ::gradzip::detail::concat("unknown ", kind, " ", id);
  };
  const unsigned t = packed & 0xFFu, st = packed >> 8 & 0xFFu, v = packed >> 16 & 0xFFu, i = packed >> 24;
  const std::string transform = t == 0 ? "" : t == 1 ? "hadamard+" : ::gradzip::detail::concat("unknown transform ", t, "+");
  return ::gradzip::detail::concat(transform, name(structures, st, "structure"), "/", name(values, v, "values"), "/",
                                   name(indices, i, "indices"));
}

/// A host message for a failed status: the description plus the numbers involved.
inline std::string message(const status& s) {
  using ::gradzip::detail::concat;
  const char* what = describe(s.code);
  switch (s.code) {
    case format_errc::ok: return what;
    case format_errc::truncated:
      return concat(what, ": need ", s.a, " bytes, have ", s.b);
    case format_errc::bad_magic: return concat(what, ": first word 0x", std::hex, s.a);
    case format_errc::unsupported_version:
      return concat(what, ": ", s.a, " (this reader knows ", format_version, ")");
    case format_errc::unknown_element_type: return concat(what, ": code ", s.a);
    case format_errc::unknown_flags: return concat(what, ": flags 0x", std::hex, s.a);
    case format_errc::nonzero_reserved: return concat(what, ": at byte ", s.a);
    case format_errc::bad_header_size:
      return concat(what, ": header_bytes ", s.a, ", expected ", s.b);
    case format_errc::bad_total_size:
      return concat(what, ": total_bytes ", s.a, " with header_bytes ", s.b,
                    " (must be >= header and a multiple of 16)");
    case format_errc::bad_section_count:
      return concat(what, ": ", s.a, " sections, expected ", s.b);
    case format_errc::section_out_of_range:
      return concat(what, ": section ", s.a, " at offset ", s.b, " with size ", s.c);
    case format_errc::section_misaligned:
      return concat(what, ": section ", s.a, " at offset ", s.b);
    case format_errc::section_overlap:
      return concat(what, ": section ", s.a, " at offset ", s.b, " starts before byte ", s.c);
    case format_errc::bad_section_tag:
      return concat(what, ": section ", s.a, " has tag ", s.b, ", expected ", s.c);
    case format_errc::codec_mismatch:
      return concat(what, ": expected ", codec_name(static_cast<std::uint32_t>(s.b)), ", got ",
                    codec_name(static_cast<std::uint32_t>(s.a)), " (codec ids 0x", std::hex, s.b, " and 0x", s.a, ")");
    case format_errc::bad_params:
      return s.c == no_expected_value ? concat(what, ": the parameter at payload byte ", s.a, " has value ", s.b)
                                      : concat(what, ": the parameter at payload byte ", s.a, " has value ", s.b,
                                               ", expected ", s.c);
    case format_errc::count_overflow:
      return concat(what, ": count ", s.a, " exceeds the limit ", s.b);
    case format_errc::bad_section_size:
      return concat(what, ": section ", s.a, " has ", s.b, " bytes, expected ", s.c);
    case format_errc::index_out_of_range:
      return concat(what, ": index[", s.a, "] = ", s.b, " >= n = ", s.c);
    case format_errc::index_not_increasing:
      return concat(what, ": index[", s.a, "] = ", s.b, " after ", s.c);
    case format_errc::size_mismatch:
      return concat(what, ": payload has ", s.a, " elements, output has ", s.b);
    case format_errc::checksum_mismatch:
      return concat(what, ": stored 0x", std::hex, s.a, ", computed 0x", s.b);
    case format_errc::bad_code:
      return concat(what, ": value ", s.a, " has code ", s.b, ", the stage's largest is ", s.c);
    case format_errc::bitmap_count_mismatch:
      return concat(what, ": ", s.a, " bits set, the count is ", s.b);
    case format_errc::bitmap_bit_past_end:
      return concat(what, ": bit ", s.a, " is set, n = ", s.b);
    case format_errc::non_canonical_varint:
      return concat(what, ": gap ", s.a, " uses length code ", s.b, ", its value needs code ", s.c);
    case format_errc::varint_overrun:
      return concat(what, ": chunk ", s.a, " decodes ", s.b, " data bytes, its table entries give ", s.c);
    case format_errc::bad_chunk_table:
      return concat(what, ": chunk ", s.a, " entry holds ", s.b, ", the data give ", s.c);
    case format_errc::element_type_mismatch:
      return concat(what, ": it holds ", element_type_name(static_cast<element_type>(s.a)), ", expected ",
                    element_type_name(static_cast<element_type>(s.b)));
    case format_errc::trailing_bytes:
      return concat(what, ": ", s.a, " bytes follow a payload of ", s.b);
    case format_errc::step_incomplete:
      return concat(what, ": payload ", s.a, " of the step was rejected earlier: start the step over");
    case format_errc::bad_scale:
      return concat(what, ": block ", s.a, " has the scale word 0x", std::hex, s.b,
                    ", which is negative or not finite (the one non-finite scale is the NaN marker 0x", s.c, ")");
    case format_errc::count_over_bound:
      return concat(what, ": ", s.a, " elements selected, max_compressed_bytes holds ", s.b,
                    " (non-finite values are always kept: is the gradient diverging?)");
  }
  return what;
}

/// Throws gradzip::format_error for a failed status; `context` prefixes the message.
inline void throw_if_failed(const status& s, const char* context = "gradzip") {
  if (!s.ok()) throw format_error(s.code, ::gradzip::detail::concat(context, ": ", message(s)));
}

/// Host: parses, validates and (if present) checks the checksum of a payload's header; `context`
/// names the caller in the message of the format_error it throws.
inline header read_header(span<const std::byte> bytes, const char* context = "gradzip") {
  header h;
  const auto* p = reinterpret_cast<const std::uint8_t*>(bytes.data());
  throw_if_failed(parse_header(p, bytes.size(), h), context);
  if (h.flags & flag_checksum) {
    const std::uint32_t computed = payload_crc32c(p, h.total_bytes);
    if (computed != h.checksum) {
      throw_if_failed(fail(format_errc::checksum_mismatch, h.checksum, computed), context);
    }
  }
  return h;
}

/// Host: throws a trailing_bytes format_error unless the payload `h` heads is all of `bytes`. A
/// saved state is read back whole: with another's bytes after it (EF21's second state, say), it
/// is not this one's.
inline void expect_whole(const header& h, span<const std::byte> bytes, const char* context) {
  if (h.total_bytes != bytes.size()) {
    throw_if_failed(fail(format_errc::trailing_bytes, bytes.size() - h.total_bytes, h.total_bytes), context);
  }
}

}  // namespace gradzip::wire
