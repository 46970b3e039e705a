/**
 * @file sign.hpp
 * @brief `quantize::sign<Scaled, Bucket>`: one bit per value, the sign.
 *
 * - `sign<false>` (signSGD, Bernstein et al. 2018): decoded = +1 or −1.
 * - `sign<true>` (scaled sign: EF-SignSGD, Karimireddy et al. 2019; DeepSpeed's 1-bit Adam and
 *   1-bit LAMB): decoded = ±(mean |v| of the bucket), so the bucket keeps its L1 norm.
 *
 * Zero is sent as positive. Both are biased; use them inside `feedback::error_feedback`
 * (EF-SignSGD), without which training degrades. The bucket's scale (1 for plain sign) is one
 * fp32 in the scales section; the mean |v| is summed in the canonical order, so host and device
 * agree bit for bit. A bucket with NaN or inf decodes to NaN.
 *
 * @code
 * gradzip::codec<gradzip::sparsify::none, gradzip::quantize::sign<true>, gradzip::encode::none> c;
 * @endcode
 */
#pragma once

#include <cstdint>

#include "gradzip/quantize/bucket_stats.hpp"
#include "gradzip/quantize/uniform.hpp"
#include "gradzip/wire/format.hpp"

namespace gradzip::quantize {

struct sign_record {
  float scale;
};

template <bool Scaled, std::uint32_t Bucket = 512>
struct sign : bucketed_stage<1, Bucket, sign_record> {
  using record = sign_record;
  static constexpr std::uint8_t id = 4;
  static constexpr bool summable = false;
  /// Params: u8 scaled (0 or 1), 3 zero bytes, u32 bucket.
  static constexpr std::uint64_t param_bytes = 8;

  GRADZIP_HOST_DEVICE static void write_params(std::uint8_t* p) {
    write_kind_and_bucket(p, Scaled ? 1 : 0, Bucket);
  }
  GRADZIP_HOST_DEVICE static wire::status check_params(const std::uint8_t* p, std::uint64_t at) {
    return check_kind_and_bucket(p, at, Scaled ? 1 : 0, Bucket);
  }

  GRADZIP_HOST_DEVICE static bucket_stats empty_stats() { return sum_and_flag::empty_stats(); }
  GRADZIP_HOST_DEVICE static void add(bucket_stats& s, float v) {
    s.v[0] += fabsf(v);
    sum_and_flag::flag_non_finite(s, v);
  }
  GRADZIP_HOST_DEVICE static bucket_stats merge(bucket_stats a, bucket_stats b) {
    return sum_and_flag::merge(a, b);
  }
  GRADZIP_HOST_DEVICE static record make_record(bucket_stats s, std::uint64_t count) {
    if (s.v[1] != 0.0f) return {NAN};
    return {Scaled ? gradzip::detail::div_rn(s.v[0], static_cast<float>(count)) : 1.0f};
  }

  GRADZIP_HOST_DEVICE unsigned encode(float v, const record&, std::uint32_t) const {
    return v < 0.0f ? 1u : 0u;
  }
  GRADZIP_HOST_DEVICE static float decode(unsigned code, const record& r) {
    return code ? -r.scale : r.scale;
  }
};

using scaled_sign = sign<true>;

}  // namespace gradzip::quantize
