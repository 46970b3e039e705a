// A values stage whose encoder disagrees with its encode, on purpose: uniform 4-bit max-min with
// an encoder (quantize::bucket_encoder) that codes every value as the top level L. Its payloads
// show which of the two an executor called: the executors must encode through the encoder.
#pragma once

#include "gradzip/quantize/uniform.hpp"

namespace gradzip_test {

struct top_level_uniform : gradzip::quantize::uniform<4> {
  struct encoder_type {
    // It reads v (0 for NaN), so that the kernel loads the values as a real encoder does.
    GRADZIP_HOST_DEVICE unsigned operator()(float v, std::uint32_t) const { return v == v ? levels : 0u; }
  };
  GRADZIP_HOST_DEVICE encoder_type encoder(const record&) const { return {}; }
};

}  // namespace gradzip_test
