/**
 * @file philox.hpp
 * @brief Philox4x32-10, the counter-based generator gradzip takes all randomness from.
 *
 * Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3" (SC'11). A pure
 * function of a 128-bit counter and a 64-bit key: the same (key, counter) gives the same four
 * words on any executor, in any launch order. gradzip keys it by the seed and puts
 * (step, tensor id, element index) in the counter, see `philox_for`.
 *
 * @code
 * const std::uint32_t i = 7, tensor = 2, seed_lo = 42, seed_hi = 0, step32 = 1;
 * auto r = gradzip::philox4x32_10({i, 0, step32, tensor}, {seed_lo, seed_hi});  // 4 x uint32
 * float u = gradzip::uniform_float(r[0]);                                      // in [0, 1)
 * @endcode
 */
#pragma once

#include <cstdint>

#include "gradzip/core/config.hpp"

namespace gradzip {

struct philox_words {
  std::uint32_t w[4];
  GRADZIP_HOST_DEVICE constexpr std::uint32_t operator[](int i) const { return w[i]; }
};

struct philox_key {
  std::uint32_t k[2];
};

namespace detail {

// Round multipliers and Weyl key increments of Philox4x32 (Salmon et al., SC'11, Table 2 and
// the Random123 reference implementation's PHILOX_M4x32_0/1 and PHILOX_W32_0/1).
inline constexpr std::uint32_t philox_m0 = 0xD2511F53u;
inline constexpr std::uint32_t philox_m1 = 0xCD9E8D57u;
inline constexpr std::uint32_t philox_w0 = 0x9E3779B9u;
inline constexpr std::uint32_t philox_w1 = 0xBB67AE85u;

GRADZIP_HOST_DEVICE constexpr void mul_hi_lo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi,
                                             std::uint32_t& lo) {
  const std::uint64_t product = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(product >> 32);
  lo = static_cast<std::uint32_t>(product);
}

GRADZIP_HOST_DEVICE constexpr philox_words philox_round(philox_words c, philox_key k) {
  std::uint32_t hi0 = 0, lo0 = 0, hi1 = 0, lo1 = 0;
  mul_hi_lo(philox_m0, c.w[0], hi0, lo0);
  mul_hi_lo(philox_m1, c.w[2], hi1, lo1);
  return {{hi1 ^ c.w[1] ^ k.k[0], lo1, hi0 ^ c.w[3] ^ k.k[1], lo0}};
}

}  // namespace detail

/// Ten rounds of Philox4x32 on `counter` with `key`.
GRADZIP_HOST_DEVICE constexpr philox_words philox4x32_10(philox_words counter, philox_key key) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key.k[0] += detail::philox_w0;
      key.k[1] += detail::philox_w1;
    }
    counter = detail::philox_round(counter, key);
  }
  return counter;
}

/**
 * The four words for element `index` of tensor `tensor_id` at training step `step` under `seed`.
 * Counter = (index low, index high, step, tensor id); key = (seed low, seed high).
 */
GRADZIP_HOST_DEVICE constexpr philox_words philox_for(std::uint64_t seed, std::uint32_t step,
                                                      std::uint32_t tensor_id,
                                                      std::uint64_t index) {
  return philox4x32_10({{static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32),
                         step, tensor_id}},
                       {{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}});
}

/**
 * A random 32-bit word for element `index`: word index mod 4 of the Philox block whose counter
 * holds index / 4. PowerSGD's starting Q draws through this; the stochastic values stages draw
 * 16 bits per element through `random_half_word`.
 */
GRADZIP_HOST_DEVICE constexpr std::uint32_t random_word(std::uint64_t seed, std::uint32_t step,
                                                        std::uint32_t tensor_id, std::uint64_t index) {
  return philox_for(seed, step, tensor_id, index >> 2)[static_cast<int>(index & 3)];
}

/**
 * Half-word h (0..7) of a Philox block, the random bits of the element that draws it. A
 * stochastic values stage's element `index` draws 16 bits: half-word index mod 8 of the block
 * whose counter holds index / 8, so one Philox evaluation serves eight consecutive elements.
 * Half-word h is bits 16 (h mod 2) .. 16 (h mod 2) + 15 of word h / 2. They are returned in the top half of a word whose low half is 0, so that
 * `uniform_float` of it is exactly h / 2^16 and `word >> 8` is u x 2^24 as before.
 *
 * With 16 bits, a probability p is realized to a resolution of 2^-16. Uniform, QSGD and TernGrad
 * round t to floor(t + u): up with probability floor(frac(t) x 2^16) / 2^16, so their expected
 * code is below t by less than 2^-16 of a step. Natural compression rounds up iff
 * u x 2^24 < p x 2^24 in integers: ceil(p x 2^16) / 2^16, above by less than 2^-16.
 * tests/host/test_uniform.cpp checks the bound over all 65,536 draws.
 */
GRADZIP_HOST_DEVICE constexpr std::uint32_t half_word(const philox_words& block, unsigned h) {
  // Word h / 2 by selects, not by indexing: an index known only at run time (a gathered
  // element's h) put the block in local memory on the GPU.
  const std::uint32_t low = (h & 2) != 0 ? block[1] : block[0];
  const std::uint32_t high = (h & 2) != 0 ? block[3] : block[2];
  const std::uint32_t word = (h & 4) != 0 ? high : low;
  return (h & 1) != 0 ? (word & 0xFFFF0000u) : (word << 16);
}

/// Element `index`'s bits as above: `half_word` h = index mod 8 of block index / 8. A loop over
/// eight consecutive elements evaluates the block once and takes `half_word(block, h)`.
GRADZIP_HOST_DEVICE constexpr std::uint32_t random_half_word(std::uint64_t seed, std::uint32_t step,
                                                             std::uint32_t tensor_id, std::uint64_t index) {
  return half_word(philox_for(seed, step, tensor_id, index >> 3), static_cast<unsigned>(index & 7));
}

/// A uniform float in [0, 1) from the top 24 bits of a word (exact, no rounding up to 1).
GRADZIP_HOST_DEVICE constexpr float uniform_float(std::uint32_t word) {
  return static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
}

}  // namespace gradzip
