// A stochastic element-wise values stage written outside the library (docs/extending.md):
// values sent as bf16 with stochastic rounding. Rounding up happens with probability equal to
// the fraction of a bf16 step the value lies above the lower neighbour (its low 16 bits over
// 2^16), so the decoded value is unbiased: E[decode] = v for every finite float v whose rounding
// stays finite. Each element's random word comes from gradzip's Philox, keyed by the seed and
// compress_context, so host and CUDA write the same bytes and every rank can reproduce them.
// Its values section is an array of bf16 that a communicator can sum (summed_as), so with a
// summable structure (sparsify::none) comm::allreducer sums payloads in one allreduce.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>

#include <gradzip/gradzip.hpp>

namespace example {

struct stochastic_bf16 {
  static constexpr std::uint8_t id = gradzip::stage::first_user_id + 1;
  static constexpr bool summable = true;
  static constexpr bool stochastic = true;  // store gets each element's random word
  static constexpr std::uint64_t param_bytes = 0;

  std::uint64_t seed = 0;  ///< the key of the random words, with compress_context

  GRADZIP_HOST_DEVICE static void write_params(std::uint8_t*) {}
  GRADZIP_HOST_DEVICE static gradzip::wire::status check_params(const std::uint8_t*, std::uint64_t) { return {}; }
  GRADZIP_HOST_DEVICE static std::uint64_t value_size(gradzip::element_type) { return 2; }
  static constexpr std::optional<gradzip::element_type> summed_as(gradzip::element_type) {
    return gradzip::element_type::bf16;
  }

  /// bf16 bits of v rounded up or down at random: add the 16 random bits (the top half of
  /// `random`) to the 16 bits that bf16 drops, keep the high half.
  GRADZIP_HOST_DEVICE static std::uint16_t round(float v, std::uint32_t random) {
    std::uint32_t bits;
    std::memcpy(&bits, &v, 4);
    if ((bits & 0x7F800000u) == 0x7F800000u) return static_cast<std::uint16_t>((bits >> 16) | ((bits & 0xFFFFu) ? 0x40u : 0u));
    const std::uint32_t up = bits + (random >> 16);
    // A finite value that would round to infinity is truncated instead.
    return static_cast<std::uint16_t>(((up & 0x7F800000u) == 0x7F800000u ? bits : up) >> 16);
  }

  template <class T>
  GRADZIP_HOST_DEVICE void store(std::uint8_t* section, std::uint64_t pos, T value, std::uint32_t random) const {
    const std::uint16_t b = round(static_cast<float>(gradzip::to_float(value)), random);
    std::memcpy(section + pos * 2, &b, 2);
  }

  GRADZIP_HOST_DEVICE static double load(const std::uint8_t* section, gradzip::element_type, std::uint64_t pos) {
    std::uint16_t b;
    std::memcpy(&b, section + pos * 2, 2);
    const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
};

}  // namespace example
