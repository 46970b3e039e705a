// Values stages whose encoder and encode disagree, on purpose, so that payloads show which one an
// executor called (quantize::bucket_encoder): uniform 4-bit max-min with an encoder of its own that
// codes every value as the top level L (the encoder must be used), and one with its own encode
// beside uniform's inherited encoder (the encode must be used); and natural compression with an
// encode or a decode of its own beside natural's inherited fast paths (they must not be used).
#pragma once

#include "gradzip/quantize/natural.hpp"
#include "gradzip/quantize/uniform.hpp"

namespace gradzip_test {

struct top_level_uniform : gradzip::quantize::uniform<4> {
  struct encoder_type {
    // It reads v (0 for NaN), so that the kernel loads the values as a real encoder does.
    GRADZIP_HOST_DEVICE unsigned operator()(float v, std::uint32_t) const { return v == v ? levels : 0u; }
  };
  GRADZIP_HOST_DEVICE encoder_type encoder(const record&) const { return {}; }
  // Declared here too: an encoder counts only beside an encode of its own class.
  GRADZIP_HOST_DEVICE unsigned encode(float v, const record& r, std::uint32_t random) const {
    return uniform<4>::encode(v, r, random);
  }
};

/// A user's stage derived from uniform that writes its own encode (every value at level 0) and
/// inherits uniform's encoder: the executors must call the encode it wrote.
struct bottom_level_uniform : gradzip::quantize::uniform<4> {
  GRADZIP_HOST_DEVICE unsigned encode(float v, const record&, std::uint32_t) const { return v == v ? 0u : 1u; }
};

/// A user's stage derived from natural compression that writes its own encode (every value coded
/// as a signed zero) and inherits natural's fast in-range encode: the executors must call the
/// encode it wrote (detail::has_in_range_encode).
struct zero_natural : gradzip::quantize::natural<8> {
  using natural::natural;
  GRADZIP_HOST_DEVICE unsigned encode(float v, const record&, std::uint32_t) const { return v < 0.0f ? 1u : 0u; }
};

/// And one that writes its own decode (half of natural's value) beside natural's inherited fast
/// decode: the executors must decode by the decode it wrote (detail::has_in_range_decode).
struct half_natural : gradzip::quantize::natural<8> {
  using natural::natural;
  GRADZIP_HOST_DEVICE static float decode(unsigned code, const record& r) {
    return 0.5f * gradzip::quantize::natural<8>::decode(code, r);
  }
};

}  // namespace gradzip_test
