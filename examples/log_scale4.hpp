// A values stage written outside the library (docs/extending.md): 4-bit log-scale quantization.
// Each bucket of 128 values keeps s = max |v|; each value is sent as a sign and a level l in
// 0..7, where level l > 0 stands for s * 2^(l - 7) (2^-6 s .. s) and level 0 for zero. Values
// round to the nearest level by magnitude (midpoints 0.75 * 2^(l - 7) s: exact in float), so a
// value of magnitude at least 2^-6 s comes back within a third of itself, and a smaller one
// within 2^-7 s of itself. Biased; use it inside error feedback. Uses only public gradzip names,
// and every function is GRADZIP_HOST_DEVICE, so the CUDA executor runs it too.
#pragma once

#include <cmath>
#include <cstdint>

#include <gradzip/gradzip.hpp>

namespace example {

namespace gq = gradzip::quantize;

/// Bucket records are whole 32-bit words (bucketed_stage stores them in the scales section).
struct log_scale_record {
  float scale;  ///< max |v| of the bucket; NaN when a value was not finite
};

struct log_scale4 : gq::bucketed_stage<4, 128, log_scale_record> {
  using record = log_scale_record;
  static constexpr std::uint8_t id = gradzip::stage::first_user_id;  // the first id of the user range
  static constexpr bool summable = false;                             // each worker has its own scales
  static constexpr std::uint64_t param_bytes = 8;                     // one format byte, then zeros
  static constexpr std::uint8_t format = 1;

  GRADZIP_HOST_DEVICE static void write_params(std::uint8_t* p) { p[0] = format; }
  GRADZIP_HOST_DEVICE static gradzip::wire::status check_params(const std::uint8_t* p, std::uint64_t at) {
    if (p[0] != format) return gradzip::wire::fail(gradzip::wire::format_errc::bad_params, at, p[0], format);
    for (int i = 1; i < 8; ++i) {
      if (p[i] != 0) return gradzip::wire::fail(gradzip::wire::format_errc::nonzero_reserved, at + i);
    }
    return {};
  }

  // Statistics: v[0] = max |v|, v[1] = 1 if a value was not finite. Both merge exactly.
  GRADZIP_HOST_DEVICE static gq::bucket_stats empty_stats() { return {{0.0f, 0.0f, 0.0f, 0.0f}}; }
  GRADZIP_HOST_DEVICE static void add(gq::bucket_stats& s, float v) {
    s.v[0] = gq::stat_max(s.v[0], v < 0.0f ? -v : v);
    s.v[1] = gq::non_finite_flag(s.v[1], v);
  }
  GRADZIP_HOST_DEVICE static gq::bucket_stats merge(gq::bucket_stats a, gq::bucket_stats b) {
    return {{gq::stat_max(a.v[0], b.v[0]), gq::stat_max(a.v[1], b.v[1]), 0.0f, 0.0f}};
  }
  GRADZIP_HOST_DEVICE static record make_record(gq::bucket_stats s, std::uint64_t) {
    return {s.v[1] == 0.0f ? s.v[0] : NAN};  // a non-finite value poisons its bucket
  }

  /// Code: bit 3 the sign, bits 0-2 the level. Comparisons against the midpoints between levels
  /// (exact in float), no log2: host and device give the same code.
  GRADZIP_HOST_DEVICE unsigned encode(float v, const record& r, std::uint32_t) const {
    if (!(r.scale > 0.0f)) return 0;  // an all-zero bucket, or a poisoned one
    const float m = (v < 0.0f ? -v : v) / r.scale;
    unsigned level = m >= 0.0078125f ? 1u : 0u;  // 2^-7: halfway between 0 and level 1's 2^-6
    float midpoint = 0.0234375f;                 // 0.75 * 2^-5: halfway between 2^-6 and 2^-5
    for (unsigned l = 2; l <= 7; ++l, midpoint *= 2.0f) {
      if (m >= midpoint) level = l;
    }
    return (v < 0.0f ? 8u : 0u) | level;
  }

  /// s * 2^(level - 7): one multiplication by an exact power of two.
  GRADZIP_HOST_DEVICE static float decode(unsigned code, const record& r) {
    const unsigned level = code & 7u;
    const float factor = level == 0 ? 0.0f : static_cast<float>(1u << (level - 1)) * 0.015625f;
    const float magnitude = r.scale * factor;
    return code & 8u ? -magnitude : magnitude;
  }
};

}  // namespace example
