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

/// The 8 x 8 bit matrix whose row i is byte i of (lo, hi), lo holding bytes 0-3, transposed in
/// place: afterwards bit i of byte b is what bit b of byte i was. Eight codes of up to 8 bits, a
/// byte each, become the bytes of their 8 bit planes (a CUDA lane's run, detail/cuda/bit_planes.cuh),
/// and back: the transpose is its own inverse (a CUDA decode's run, detail/cuda/payload.cuh).
/// Three exchanges of off-diagonal blocks, of 1 x 1, 2 x 2 and 4 x 4 bits (Warren, Hacker's
/// Delight, 2nd ed., section 7-3); the first two stay within each word.
GRADZIP_HOST_DEVICE inline void transpose_bits_8x8(std::uint32_t& lo, std::uint32_t& hi) {
  std::uint32_t t = (lo ^ (lo >> 7)) & 0x00AA00AAu;
  lo ^= t ^ (t << 7);
  t = (hi ^ (hi >> 7)) & 0x00AA00AAu;
  hi ^= t ^ (t << 7);
  t = (lo ^ (lo >> 14)) & 0x0000CCCCu;
  lo ^= t ^ (t << 14);
  t = (hi ^ (hi >> 14)) & 0x0000CCCCu;
  hi ^= t ^ (t << 14);
  t = (lo ^ (hi << 4)) & 0xF0F0F0F0u;  // the 4 x 4 blocks: high nibbles of lo, low ones of hi
  lo ^= t;
  hi ^= t >> 4;
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

/// Bit l set where code l of a group of 32 (its `Bits` plane words at `words`: any address on
/// the host, 4-byte aligned on a device) is above `max`: compared from the top plane down on all
/// 32 codes at once, as a bit-serial comparator does, so a decoder checks codes without unpacking
/// them (two or three word operations per plane). The lowest set bit is the group's first bad code.
template <int Bits>
GRADZIP_HOST_DEVICE inline std::uint32_t codes_above(const std::uint8_t* words, unsigned max) {
  std::uint32_t above = 0;
  std::uint32_t equal = 0xFFFFFFFFu;  // codes whose planes so far equal max's bits
  for (int b = Bits - 1; b >= 0; --b) {
    std::uint32_t plane;
    if (GRADZIP_DEVICE_CODE()) {
      plane = reinterpret_cast<const std::uint32_t*>(words)[b];
    } else {
      std::memcpy(&plane, words + 4 * b, 4);
    }
    if ((max >> b) & 1u) {
      equal &= plane;
    } else {
      above |= equal & plane;
      equal &= ~plane;
    }
  }
  return above;
}

/// The position of the first code above `max` among a group's first `valid` codes (the rest
/// are the last group's padding, never checked), or -1 when there is none: what both executors'
/// decoders report as a payload's first bad code.
template <int Bits>
GRADZIP_HOST_DEVICE inline int first_code_above(const std::uint8_t* words, unsigned max, std::uint64_t valid) {
  std::uint32_t above = codes_above<Bits>(words, max);
  if (valid < 32) above &= (std::uint32_t{1} << valid) - 1u;
  return above == 0 ? -1 : detail::lowest_bit64(above);
}

}  // namespace gradzip::quantize
