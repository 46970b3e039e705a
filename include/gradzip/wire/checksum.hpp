/**
 * @file checksum.hpp
 * @brief The optional payload checksum: CRC-32C (Castagnoli), computed on the host.
 *
 * The checksum covers the whole payload, [0, total_bytes), with its own four bytes (offset 32)
 * read as zero. `seal` adds it to a finished payload and sets flag bit 0; the host reader then
 * verifies it. It guards against transport corruption, not against an attacker: memory safety on
 * hostile bytes comes from the structural validation, which runs whether or not a checksum is
 * present. The CUDA decoder validates the structure but does not recompute the checksum; verify
 * sealed payloads with `read_header` on the host if your transport can corrupt bytes.
 *
 * @code
 * std::size_t bytes = codec.compress(exec, gradzip::span<const float>(grad), out);
 * gradzip::wire::seal(gradzip::span<std::byte>(out.data(), bytes));
 * @endcode
 */
#pragma once

#include <array>
#include <cstdint>

#include "gradzip/core/error.hpp"
#include "gradzip/core/span.hpp"
#include "gradzip/wire/format.hpp"

namespace gradzip::wire {

namespace detail {

// CRC-32C, reflected polynomial 0x82F63B78 (Castagnoli et al. 1993; RFC 3720 appendix B.4).
inline constexpr std::uint32_t crc32c_poly = 0x82F63B78u;

constexpr std::array<std::uint32_t, 256> make_crc32c_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1u) ? (c >> 1) ^ crc32c_poly : c >> 1;
    table[i] = c;
  }
  return table;
}

inline constexpr std::array<std::uint32_t, 256> crc32c_table = make_crc32c_table();

inline std::uint32_t crc32c_update(std::uint32_t crc, const std::uint8_t* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) crc = crc32c_table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return crc;
}

}  // namespace detail

/// CRC-32C of bytes [0, n) (check value of "123456789" is 0xE3069283).
inline std::uint32_t crc32c(const std::uint8_t* p, std::size_t n) {
  return ~detail::crc32c_update(~0u, p, n);
}

/// CRC-32C of a payload of `total` bytes with the checksum field read as zero.
inline std::uint32_t payload_crc32c(const std::uint8_t* p, std::uint64_t total) {
  const std::uint8_t zeros[4] = {0, 0, 0, 0};
  std::uint32_t crc = ~0u;
  crc = detail::crc32c_update(crc, p, checksum_offset);
  crc = detail::crc32c_update(crc, zeros, 4);
  crc = detail::crc32c_update(crc, p + checksum_offset + 4, total - checksum_offset - 4);
  return ~crc;
}

/// Adds a CRC-32C to a finished payload (host memory) and sets its checksum flag.
inline void seal(span<std::byte> payload) {
  auto* p = reinterpret_cast<std::uint8_t*>(payload.data());
  GRADZIP_EXPECTS(payload.size() >= fixed_header_bytes,
                  "seal: payload must hold at least the 48-byte header, got ", payload.size(),
                  " bytes");
  const std::uint64_t total = wire::detail::load_le(p + 24, 8);
  GRADZIP_EXPECTS(total >= fixed_header_bytes && total <= payload.size(),
                  "seal: header says total_bytes = ", total, " but the span holds ",
                  payload.size(), " bytes");
  const auto flags = static_cast<std::uint32_t>(wire::detail::load_le(p + 12, 4)) | flag_checksum;
  wire::detail::store_le(p + 12, flags, 4);
  wire::detail::store_le(p + checksum_offset, payload_crc32c(p, total), 4);
}

}  // namespace gradzip::wire
