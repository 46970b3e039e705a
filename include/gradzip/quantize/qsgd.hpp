/**
 * @file qsgd.hpp
 * @brief `quantize::qsgd<Levels, Bucket>`: QSGD, stochastic levels of the bucket's L2 norm.
 *
 * Alistarh, Grubic, Li, Tomioka, Vojnovic, "QSGD: communication-efficient SGD via gradient
 * quantization and encoding" (NeurIPS 2017). For a bucket with L2 norm N and s = Levels:
 *
 *     l = |v| / N x s  in [0, s],     level = min(s, floor(l + u)),  u ~ U[0, 1)
 *     decoded = sign(v) x N x level / s
 *
 * Unbiased (E[decoded] = v); per value the variance is p(1 − p)(N / s)², p = l − floor(l), and
 * per bucket of d values E||Q(v) − v||² <= min(d / s², sqrt(d) / s) ||v||² (the paper's
 * Lemma 3.1). The default bucket is 128 values, as in GRACE. u comes from Philox keyed by
 * (seed, step, tensor id, element index).
 *
 * Code: the sign in bit 0 (1 = negative; zero counts as positive), the level in the bits
 * above, so Levels = 7 gives 4-bit codes (as "QSGD 4-bit"), Levels = 127 gives 8. Codes are
 * bit-plane packed; each bucket's norm is one fp32 in the scales section.
 * A zero bucket decodes to zeros; a bucket holding NaN or inf (or whose sum of squares
 * overflows float) decodes to NaN throughout.
 *
 * @code
 * using qsgd4 = gradzip::quantize::qsgd<7>;   // 4-bit codes, bucket 128
 * gradzip::codec<gradzip::sparsify::none, qsgd4, gradzip::encode::none> c{{}, qsgd4{seed}};
 * @endcode
 */
#pragma once

#include <cmath>
#include <cstdint>

#include "gradzip/quantize/bucket_stats.hpp"
#include "gradzip/quantize/uniform.hpp"
#include "gradzip/random/philox.hpp"
#include "gradzip/wire/format.hpp"

namespace gradzip::detail {
/// Bits needed to write v (0 for 0).
constexpr int bit_width(unsigned v) { return v == 0 ? 0 : 1 + bit_width(v >> 1); }
}  // namespace gradzip::detail

namespace gradzip::quantize {

struct qsgd_record {
  float norm;
};

template <unsigned Levels, std::uint32_t Bucket = 128>
struct qsgd : bucketed_stage<1 + gradzip::detail::bit_width(Levels), Bucket, qsgd_record> {
  static_assert(Levels >= 1 && Levels <= 127, "quantize::qsgd: Levels must be in 1..127 (codes of at most 8 bits)");
  using record = qsgd_record;
  static constexpr std::uint8_t id = 3;
  static constexpr bool stochastic = true;
  static constexpr bool summable = false;
  /// Levels above s are not codes a compressor writes: decoders reject them (unless s = 2^m - 1,
  /// where every code is valid).
  static constexpr bool codes_need_check = (Levels & (Levels + 1)) != 0;
  static constexpr unsigned max_code = (Levels << 1) | 1u;
  /// decode divides per value (norm x level / s): a GPU decodes each bucket's 2^Bits codes once
  /// and looks its values up (detail/cuda/payload.cuh, where the bucket's lanes allow it).
  static constexpr bool decode_by_table = true;
  /// Params: u8 levels, 3 zero bytes, u32 bucket.
  static constexpr std::uint64_t param_bytes = 8;

  std::uint64_t seed = 0;

  constexpr qsgd() = default;
  explicit constexpr qsgd(std::uint64_t seed_value) : seed(seed_value) {}

  GRADZIP_HOST_DEVICE static void write_params(std::uint8_t* p) {
    write_kind_and_bucket(p, static_cast<std::uint8_t>(Levels), Bucket);
  }
  GRADZIP_HOST_DEVICE static wire::status check_params(const std::uint8_t* p, std::uint64_t at) {
    return check_kind_and_bucket(p, at, static_cast<std::uint8_t>(Levels), Bucket);
  }

  GRADZIP_HOST_DEVICE static bucket_stats empty_stats() { return sum_and_flag::empty_stats(); }
  GRADZIP_HOST_DEVICE static void add(bucket_stats& s, float v) {
    s.v[0] = fmaf(v, v, s.v[0]);  // explicit fma: the same rounding on every executor
    sum_and_flag::flag_non_finite(s, v);
  }
  GRADZIP_HOST_DEVICE static bucket_stats merge(bucket_stats a, bucket_stats b) {
    return sum_and_flag::merge(a, b);
  }
  GRADZIP_HOST_DEVICE static record make_record(bucket_stats s, std::uint64_t) {
    if (s.v[1] != 0.0f || !is_finite(s.v[0])) return {NAN};
    return {gradzip::detail::sqrt_rn(s.v[0])};
  }

  /// A bucket's encoder (`bucket_encoder`): the factor s / norm, computed once.
  struct encoder_type {
    bucket_ratio levels_per_norm;  // s |v| / norm as a product
    bool coded;                    // norm > 0: not a zero bucket or a poisoned one (NaN)

    /// The code of value v (level << 1 | sign); `random` is the element's 16 random bits in the
    /// top half of a word (`random_half_word`).
    GRADZIP_HOST_DEVICE unsigned operator()(float v, std::uint32_t random) const {
      if (!coded) return 0;
      const float u = uniform_float(random);
      // s |v| / norm + u, >= 0: truncation floors
      const float level = fmaf(levels_per_norm.scaled(fabsf(v)), levels_per_norm.factor, u);
      // Through int (one vector instruction; float -> unsigned has none before AVX-512).
      const int truncated = static_cast<int>(stat_min(level, static_cast<float>(Levels)));
      const unsigned l = static_cast<unsigned>(truncated);
      return (l << 1) | (v < 0.0f ? 1u : 0u);
    }
  };
  GRADZIP_HOST_DEVICE encoder_type encoder(const record& r) const {
    return {bucket_ratio::of(static_cast<float>(Levels), r.norm), r.norm > 0.0f};
  }

  /// The code of value v in a bucket with record r.
  GRADZIP_HOST_DEVICE unsigned encode(float v, const record& r, std::uint32_t random) const {
    return encoder(r)(v, random);
  }

  GRADZIP_HOST_DEVICE static float decode(unsigned code, const record& r) {
    const float magnitude = gradzip::detail::div_rn(r.norm * static_cast<float>(code >> 1), static_cast<float>(Levels));
    return (code & 1u) ? -magnitude : magnitude;
  }
};

}  // namespace gradzip::quantize
