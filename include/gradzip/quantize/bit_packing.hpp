/**
 * @file bit_packing.hpp
 * @brief Bit-plane packing of 1..16-bit codes, shared by every quantizer, host and device.
 *
 * Codes are packed in groups of 32. Group g (codes 32g .. 32g+31) occupies `bits` consecutive
 * little-endian u32 words; word b of the group holds bit b of the group's 32 codes, code 32g+l in
 * bit l. Codes past the end of the last group are zero. This is the layout a CUDA warp writes
 * with one `__ballot_sync` per bit (lane l holds code 32g+l), and the host reads and writes it
 * with shifts. Bytes for `count` codes: ceil(count / 32) x bits x 4.
 *
 * @code
 * std::uint8_t codes[32] = {5, 1, 7};            // 32 codes of 3 bits
 * std::uint32_t words[3];                       // one group: 3 bit planes
 * gradzip::quantize::pack_group(codes, 32, 3, words);
 * unsigned c = gradzip::quantize::unpack_code(reinterpret_cast<const std::uint8_t*>(words), 3, 2);  // 7
 * @endcode
 */
#pragma once

#include <cstdint>
#include <cstring>

#include "gradzip/core/config.hpp"

namespace gradzip::quantize {

GRADZIP_HOST_DEVICE constexpr std::uint64_t packed_bytes(std::uint64_t count, int bits) {
  return (count + 31) / 32 * static_cast<std::uint64_t>(bits) * 4;
}

/// Packs codes[0 .. n) (n <= 32, codes < 2^bits) as one group into words[0 .. bits).
template <class Code>
GRADZIP_HOST_DEVICE inline void pack_group(const Code* codes, int n, int bits, std::uint32_t* words) {
  for (int b = 0; b < bits; ++b) {
    std::uint32_t w = 0;
    for (int l = 0; l < n; ++l) w |= static_cast<std::uint32_t>((codes[l] >> b) & 1u) << l;
    words[b] = w;
  }
}

/// Code j of a packed stream (words may sit at any address on the host).
GRADZIP_HOST_DEVICE inline unsigned unpack_code(const std::uint8_t* words, int bits, std::uint64_t j) {
  const std::uint64_t group_word = (j / 32) * static_cast<std::uint64_t>(bits);
  const unsigned lane = static_cast<unsigned>(j % 32);
  unsigned code = 0;
  for (int b = 0; b < bits; ++b) {
    std::uint32_t w;
    if (GRADZIP_DEVICE_CODE()) {  // device payloads are 16-byte aligned
      w = reinterpret_cast<const std::uint32_t*>(words)[group_word + b];
    } else {
      std::memcpy(&w, words + (group_word + b) * 4, 4);
    }
    code |= ((w >> lane) & 1u) << b;
  }
  return code;
}

}  // namespace gradzip::quantize
