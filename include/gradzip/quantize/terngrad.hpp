/**
 * @file terngrad.hpp
 * @brief `quantize::terngrad<Clip, Bucket>`: stochastic ternary values {−s, 0, +s} per bucket.
 *
 * Wen, Xu, Yan, Wu, Wang, Chen, Li, "TernGrad: ternary gradients to reduce communication in
 * distributed deep learning" (NeurIPS 2017). For a bucket with scaler s = max |v|:
 *
 *     b ~ Bernoulli(|v| / s),   decoded = sign(v) x s x b
 *
 * Unbiased: E[decoded] = v, with variance |v| (s − |v|) per value. With `Clip = true`, values
 * are first clipped to ±c σ with c = 2.5 (the paper's gradient clipping, Section 3.3; σ is the
 * bucket's standard deviation), so s = min(max |v|, 2.5 σ): lower variance, biased on the
 * clipped outliers. The Bernoulli draw uses Philox keyed by (seed, step, tensor id, index).
 *
 * Codes (2 bits): 0 = zero, 1 = +s, 2 = −s; code 3 is never written and decoders reject it.
 * The scaler is one fp32 per bucket. A zero bucket decodes to zeros; a bucket with NaN or inf
 * decodes to NaN.
 *
 * @code
 * using tern = gradzip::quantize::terngrad<>;
 * gradzip::codec<gradzip::sparsify::none, tern, gradzip::encode::none> c{{}, tern{seed}};
 * @endcode
 */
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "gradzip/quantize/bucket_stats.hpp"
#include "gradzip/quantize/uniform.hpp"
#include "gradzip/random/philox.hpp"

namespace gradzip::quantize {

struct terngrad_record {
  float scaler;
};

template <bool Clip = false, std::uint32_t Bucket = 512>
struct terngrad : bucketed_stage<2, Bucket, terngrad_record> {
  using record = terngrad_record;
  static constexpr std::uint8_t id = 5;
  static constexpr bool stochastic = true;
  static constexpr bool summable = false;
  static constexpr bool codes_need_check = true;
  static constexpr unsigned max_code = 2;
  /// TernGrad's clipping threshold in standard deviations (Wen et al. 2017, Section 3.3).
  static constexpr float clip_sigmas = 2.5f;
  static constexpr std::uint64_t param_bytes = 8;  ///< u8 clip (0/1), 3 zero bytes, u32 bucket

  std::uint64_t seed = 0;

  constexpr terngrad() = default;
  explicit constexpr terngrad(std::uint64_t seed_value) : seed(seed_value) {}

  GRADZIP_HOST_DEVICE static void write_params(std::uint8_t* p) {
    write_kind_and_bucket(p, Clip ? 1 : 0, Bucket);
  }
  GRADZIP_HOST_DEVICE static wire::status check_params(const std::uint8_t* p, std::uint64_t at) {
    return check_kind_and_bucket(p, at, Clip ? 1 : 0, Bucket);
  }

  /// Statistics: max |v|, sum of v, sum of v² (fma), and 1 if any value was not finite. The two
  /// sums feed only the clipping's σ: without `Clip` they stay 0, two adds per value fewer.
  GRADZIP_HOST_DEVICE static bucket_stats empty_stats() { return {{0.0f, 0.0f, 0.0f, 0.0f}}; }
  GRADZIP_HOST_DEVICE static void add(bucket_stats& s, float v) {
    s.v[0] = stat_max(s.v[0], fabsf(v));
    if constexpr (Clip) {
      s.v[1] += v;
      s.v[2] = fmaf(v, v, s.v[2]);
    }
    s.v[3] = non_finite_flag(s.v[3], v);
  }
  GRADZIP_HOST_DEVICE static bucket_stats merge(bucket_stats a, bucket_stats b) {
    if constexpr (Clip) {
      return {{stat_max(a.v[0], b.v[0]), a.v[1] + b.v[1], a.v[2] + b.v[2], stat_max(a.v[3], b.v[3])}};
    } else {
      return {{stat_max(a.v[0], b.v[0]), 0.0f, 0.0f, stat_max(a.v[3], b.v[3])}};
    }
  }
  /// Without clipping the statistics are the extrema's (detail::has_extrema_stats): max |v| is
  /// the larger of |lo| and |hi|. With it they hold sums too, which need the canonical order.
  using extrema_class = std::conditional_t<Clip, void, terngrad>;
  GRADZIP_HOST_DEVICE static bucket_stats stats_of_extrema(float lo, float hi, bool finite) {
    return {{stat_max(fabsf(lo), fabsf(hi)), 0.0f, 0.0f, finite ? 0.0f : 1.0f}};
  }
  GRADZIP_HOST_DEVICE static record make_record(bucket_stats s, std::uint64_t count) {
    if (s.v[3] != 0.0f) return {NAN};
    float scaler = s.v[0];
    if constexpr (Clip) {
      const float n = static_cast<float>(count);
      const float mean = gradzip::detail::div_rn(s.v[1], n);
      const float variance = fmaxf(0.0f, fmaf(-mean, mean, gradzip::detail::div_rn(s.v[2], n)));  // explicit fma: no contraction choice left to the compiler
      scaler = fminf(scaler, clip_sigmas * gradzip::detail::sqrt_rn(variance));
    }
    return {scaler};
  }

  GRADZIP_HOST_DEVICE unsigned encode(float v, const record& r, std::uint32_t random) const {
    if (!(r.scaler > 0.0f)) return 0;
    const float a = fabsf(v);
    const float magnitude = a < r.scaler ? a : r.scaler;  // clipping (a no-op without Clip)
    const float u = uniform_float(random);
    // Bernoulli(magnitude / scaler) as u >= 1 - magnitude / scaler, without a division per value
    // (about ten instructions and a branch on a GPU): 1 - u is exact (u is a multiple of 2^-16),
    // so the largest magnitude (scaler itself) is always kept. add_rn: u's scaling product is not
    // fused in (the result would be the same, but every contraction is explicit). A subnormal
    // scaler is scaled by 2^100 first (bucket_ratio::scale_for), with the magnitude, exactly:
    // (1 - u) s would lose its bits there, and keep zeros.
    const float pre = bucket_ratio::scale_for(r.scaler);
    if (magnitude * pre < gradzip::detail::add_rn(1.0f, -u) * (r.scaler * pre)) return 0;
    return v < 0.0f ? 2u : 1u;
  }
  GRADZIP_HOST_DEVICE static float decode(unsigned code, const record& r) {
    // 0 -> 0 x scaler (NaN for a poisoned bucket), 1 -> scaler, 2 -> -scaler (sign bit flipped)
    const float magnitude = select_float(code != 0, r.scaler, 0.0f * r.scaler);
    return gradzip::detail::bit_cast<float>(gradzip::detail::bit_cast<std::uint32_t>(magnitude) ^ ((code & 2u) << 30));
  }
};

}  // namespace gradzip::quantize
