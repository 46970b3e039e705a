// Bit planes of a lane's run of 8 codes, written in quantize/bit_packing.hpp's layout by the four
// lanes that share a group of 32 codes.
//
// A lane of `encode_blocked` holds the codes of elements 8 l .. 8 l + 7. Plane b of their group
// of 32 is one word whose byte r is plane b's byte of lane 4 (l / 4) + r. Built one bit at a
// time, a 4-bit plane set cost about 12 instructions per element (two per code and plane, then
// three shuffles and their shifts per plane, sm_90 SASS). Here codes of 3 to 8 bits are packed a
// byte each into two words, whose 8 x 8 bit matrix is transposed so that byte b is plane b's
// byte (`quantize::transpose_bits_8x8`), and the four lanes then exchange bytes in a 4 x 4 byte
// transpose (two shuffles and two byte permutes) after which lane 4 q + r holds plane r's word
// (and plane 4 + r's). Each lane stores its own word: for 3 and 4 bits a warp's store covers
// consecutive words.
#pragma once

#include <cstdint>

#include "gradzip/quantize/bit_packing.hpp"

namespace gradzip::detail {

/// A 4 x 4 byte transpose across lanes 4 q .. 4 q + 3: lane 4 q + r returns the word whose byte
/// j is byte r of lane 4 q + j's w. Two exchanges, with the lane one and two apart, each taking
/// the partner's bytes where the byte's and the lane's bit differ. Every lane of the warp calls it.
__device__ inline std::uint32_t transpose_bytes_4_lanes(std::uint32_t w, unsigned lane) {
  // (Not `near` and `far`: <windows.h> defines both as empty macros.)
  const std::uint32_t one_apart = __shfl_xor_sync(0xFFFFFFFFu, w, 1);
  // Even lanes: own 0, partner's 0, own 2, partner's 2.
  // Odd lanes: partner's 1, own 1, partner's 3, own 3.
  w = __byte_perm(w, one_apart, lane & 1u ? 0x3715u : 0x6240u);
  const std::uint32_t two_apart = __shfl_xor_sync(0xFFFFFFFFu, w, 2);
  // Lanes 0, 1 of four: own 0, 1, partner's 0, 1. Lanes 2, 3: partner's 2, 3, own 2, 3.
  return __byte_perm(w, two_apart, lane & 2u ? 0x3276u : 0x5410u);
}

/// Writes the bit planes of this lane's 8 codes (code[i]: element 8 l + i of the warp's span)
/// into words group x Bits .. group x Bits + Bits - 1 of `codes`, its group of 32, when `store`
/// (the group exists). Every code must be below 2^Bits, as every stage's encode returns at most
/// its max_code: a higher bit would land in another code's byte. Every lane of the warp calls it.
template <int Bits>
__device__ inline void store_bit_planes(const unsigned (&code)[8], std::uint32_t* codes, std::uint64_t group,
                                        bool store, unsigned lane) {
  const unsigned r = lane % 4;
  const std::uint64_t word = group * Bits;
  if constexpr (Bits >= 3 && Bits <= 8) {
    std::uint32_t lo = code[0] | code[1] << 8 | code[2] << 16 | code[3] << 24;
    std::uint32_t hi = code[4] | code[5] << 8 | code[6] << 16 | code[7] << 24;
    quantize::transpose_bits_8x8(lo, hi);  // byte b of (lo, hi): plane b's bits of the 8 codes
    const std::uint32_t low_plane = transpose_bytes_4_lanes(lo, lane);  // plane r
    if (store && r < Bits) codes[word + r] = low_plane;
    if constexpr (Bits > 4) {
      const std::uint32_t high_plane = transpose_bytes_4_lanes(hi, lane);  // plane 4 + r
      if (store && 4 + r < Bits) codes[word + 4 + r] = high_plane;
    }
  } else {  // plane by plane, each byte gathered by three shuffles: fewer instructions for 1 and
            // 2 bits than the transposes (about 35 per 8 codes for 3 or 4 bits, a byte
            // transpose and a store more for 5 to 8); 9 to 16 bits do not fit a byte per code.
#pragma unroll
    for (int bit = 0; bit < Bits; ++bit) {
      unsigned byte = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) byte |= ((code[i] >> bit) & 1u) << i;
      const unsigned plane = byte | (__shfl_down_sync(0xFFFFFFFFu, byte, 1) << 8) |
                             (__shfl_down_sync(0xFFFFFFFFu, byte, 2) << 16) |
                             (__shfl_down_sync(0xFFFFFFFFu, byte, 3) << 24);
      if (store && r == 0) codes[word + bit] = plane;
    }
  }
}

}  // namespace gradzip::detail
