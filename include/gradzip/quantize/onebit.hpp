/**
 * @file onebit.hpp
 * @brief `quantize::onebit<Bucket>`: 1-bit SGD, a sign mask and the two means.
 *
 * Seide, Fu, Droppo, Li, Yu, "1-bit stochastic gradient descent and its application to
 * data-parallel distributed training of speech DNNs" (Interspeech 2014). Per bucket, each value
 * is sent as one bit (1 = negative) and decodes to the mean of the bucket's values on its side:
 *
 *     decoded = mean{ w in bucket : w >= 0 }  if v >= 0,   mean{ w : w < 0 }  otherwise
 *
 * This keeps each side's sum exactly (up to float rounding), unlike scaled sign. Biased: use
 * it with `feedback::error_feedback`, as the paper does. Two fp32 means per bucket; a bucket
 * with NaN or inf decodes to NaN. Sums and counts use the canonical order, so host and device
 * agree bit for bit.
 *
 * @code
 * gradzip::codec<gradzip::sparsify::none, gradzip::quantize::onebit<>, gradzip::encode::none> c;
 * @endcode
 */
#pragma once

#include <cmath>
#include <cstdint>

#include "gradzip/quantize/bucket_stats.hpp"
#include "gradzip/quantize/uniform.hpp"

namespace gradzip::quantize {

struct onebit_record {
  float non_negative_mean;
  float negative_mean;
};

template <std::uint32_t Bucket = 512>
struct onebit : bucketed_stage<1, Bucket, onebit_record> {
  using record = onebit_record;
  static constexpr std::uint8_t id = 6;
  static constexpr bool summable = false;
  static constexpr std::uint64_t param_bytes = 8;  ///< u8 0, 3 zero bytes, u32 bucket

  GRADZIP_HOST_DEVICE static void write_params(std::uint8_t* p) { write_kind_and_bucket(p, 0, Bucket); }
  GRADZIP_HOST_DEVICE static wire::status check_params(const std::uint8_t* p, std::uint64_t at) {
    return check_kind_and_bucket(p, at, 0, Bucket);
  }

  /// Statistics: sum and count of the non-negative values, sum of the negative ones, and 1 if
  /// any value was not finite. Counts are exact in float (buckets hold at most 2^20 values).
  GRADZIP_HOST_DEVICE static bucket_stats empty_stats() { return {{0.0f, 0.0f, 0.0f, 0.0f}}; }
  GRADZIP_HOST_DEVICE static void add(bucket_stats& s, float v) {
    // Arithmetic instead of branches, so the host loop vectorizes. Adding v x 0 (= ±0 for a
    // finite v) leaves a sum unchanged; a non-finite v poisons the bucket anyway. Rounded
    // separately, as the host does: nvcc would otherwise fuse each product into its sum.
    const float negative = v < 0.0f ? 1.0f : 0.0f;
    s.v[2] = gradzip::detail::add_rn(s.v[2], gradzip::detail::mul_rn(v, negative));
    s.v[0] = gradzip::detail::add_rn(s.v[0], gradzip::detail::mul_rn(v, 1.0f - negative));
    s.v[1] += 1.0f - negative;
    s.v[3] = non_finite_flag(s.v[3], v);
  }
  GRADZIP_HOST_DEVICE static bucket_stats merge(bucket_stats a, bucket_stats b) {
    return {{a.v[0] + b.v[0], a.v[1] + b.v[1], a.v[2] + b.v[2], stat_max(a.v[3], b.v[3])}};
  }
  GRADZIP_HOST_DEVICE static record make_record(bucket_stats s, std::uint64_t count) {
    if (s.v[3] != 0.0f) return {NAN, NAN};
    const float negatives = static_cast<float>(count) - s.v[1];
    return {s.v[1] > 0.0f ? gradzip::detail::div_rn(s.v[0], s.v[1]) : 0.0f,
            negatives > 0.0f ? gradzip::detail::div_rn(s.v[2], negatives) : 0.0f};
  }

  GRADZIP_HOST_DEVICE unsigned encode(float v, const record&, std::uint32_t) const {
    return v < 0.0f ? 1u : 0u;
  }
  GRADZIP_HOST_DEVICE static float decode(unsigned code, const record& r) {
    return select_float(code != 0, r.negative_mean, r.non_negative_mean);
  }
};

}  // namespace gradzip::quantize
