/**
 * @file uniform.hpp
 * @brief `quantize::uniform<Bits, Rounding, Bucket>`: max-min uniform quantization per bucket.
 *
 * The values are cut into buckets of `Bucket` consecutive values (default 512, as CGX). For a
 * bucket with minimum lo and maximum hi, and L = 2^Bits − 1 levels:
 *
 *     step = (hi − lo) / L,    t = (v − lo) / step  in [0, L]
 *     nearest:     code = min(L, floor(t + 1/2))
 *     stochastic:  code = min(L, floor(t + u)),  u ~ U[0, 1) from Philox(seed, step, tensor, index)
 *     decode:      v' = fma(code, step, lo)
 *
 * Nearest rounding has |v' − v| <= step / 2. Stochastic rounding is unbiased, E[v'] = v up to
 * float rounding, with variance (t − floor t)(1 − (t − floor t)) step² <= step² / 4 per value
 * (Alistarh et al. 2017; CGX, Markov et al. 2023, use max-min buckets). A constant bucket
 * (hi = lo) has step 0: every value decodes to lo exactly, no division by zero. A bucket holding
 * NaN or ±inf stores a NaN step and decodes to NaN throughout, so divergence stays visible.
 *
 * Wire: a scales section with (lo, step) as two fp32 per bucket, and a values section with the
 * codes bit-plane packed (`bit_packing.hpp`). Bytes per value: Bits/8 + 8/Bucket.
 * Min and max are exact in any order, so host and device agree bit for bit with no reduction
 * order to fix.
 *
 * @code
 * gradzip::codec<gradzip::sparsify::none, gradzip::quantize::uniform<4>, gradzip::encode::none> c;
 * using stochastic4 = gradzip::quantize::uniform<4, gradzip::quantize::rounding::stochastic>;
 * gradzip::codec<gradzip::sparsify::none, stochastic4, gradzip::encode::none> s{{}, stochastic4{seed}};
 * @endcode
 */
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "gradzip/core/element_type.hpp"
#include "gradzip/quantize/bit_packing.hpp"
#include "gradzip/quantize/bucket_stats.hpp"
#include "gradzip/random/philox.hpp"
#include "gradzip/wire/format.hpp"

namespace gradzip::quantize {

enum class rounding : std::uint8_t { nearest = 0, stochastic = 1 };

/// A uniform bucket's scale record: its minimum and its step.
struct uniform_record {
  float lo;
  float step;
};

template <int Bits, rounding Rounding = rounding::nearest, std::uint32_t Bucket = 512>
struct uniform : bucketed_stage<Bits, Bucket, uniform_record> {
  using record = uniform_record;
  static constexpr std::uint8_t id = 2;
  static constexpr bool summable = false;  // each worker has its own scales
  static constexpr unsigned levels = (1u << Bits) - 1;
  static constexpr bool stochastic = Rounding == rounding::stochastic;
  /// Params: bits u8, rounding u8, 2 zero bytes, bucket u32.
  static constexpr std::uint64_t param_bytes = 8;

  std::uint64_t seed = 0;  ///< stochastic rounding's key (ignored by nearest rounding)

  constexpr uniform() = default;
  /// seed: the key of stochastic rounding's random numbers.
  explicit constexpr uniform(std::uint64_t seed_value) : seed(seed_value) {}

  GRADZIP_HOST_DEVICE static void write_params(std::uint8_t* p) {
    p[0] = static_cast<std::uint8_t>(Bits);
    p[1] = static_cast<std::uint8_t>(Rounding);
    wire::detail::store_le(p + 4, Bucket, 4);
  }

  GRADZIP_HOST_DEVICE static wire::status check_params(const std::uint8_t* p, std::uint64_t at) {
    if (p[0] != Bits) return wire::fail(wire::format_errc::bad_params, at, p[0], Bits);
    if (p[1] != static_cast<std::uint8_t>(Rounding)) {
      return wire::fail(wire::format_errc::bad_params, at + 1, p[1], static_cast<std::uint8_t>(Rounding));
    }
    if (p[2] != 0 || p[3] != 0) return wire::fail(wire::format_errc::nonzero_reserved, at + (p[2] != 0 ? 2 : 3));
    const auto b = wire::detail::load_le(p + 4, 4);
    if (b != Bucket) return wire::fail(wire::format_errc::bad_params, at + 4, b, Bucket);
    return {};
  }


  /// Statistics: minimum, maximum, and 1 if any value was not finite.
  GRADZIP_HOST_DEVICE static bucket_stats empty_stats() { return {{INFINITY, -INFINITY, 0.0f, 0.0f}}; }
  GRADZIP_HOST_DEVICE static void add(bucket_stats& s, float v) {
    s.v[0] = stat_min(s.v[0], v);
    s.v[1] = stat_max(s.v[1], v);
    s.v[2] = non_finite_flag(s.v[2], v);
  }
  GRADZIP_HOST_DEVICE static bucket_stats merge(bucket_stats a, bucket_stats b) {
    return {{stat_min(a.v[0], b.v[0]), stat_max(a.v[1], b.v[1]), stat_max(a.v[2], b.v[2]), 0.0f}};
  }
  GRADZIP_HOST_DEVICE static record make_record(bucket_stats s, std::uint64_t) {
    return make_record(s.v[0], s.v[1], s.v[2] == 0.0f);
  }
  /// The statistics are the extrema (detail::has_extrema_stats): lo and hi themselves.
  using extrema_class = uniform;
  GRADZIP_HOST_DEVICE static bucket_stats stats_of_extrema(float lo, float hi, bool finite) {
    return {{lo, hi, finite ? 0.0f : 1.0f, 0.0f}};
  }

  /// The record of a bucket with minimum lo, maximum hi, and whether all values were finite.
  /// A range hi - lo beyond float's (finite values of both signs near ±1.7e38) has no finite
  /// step: the bucket is poisoned as a non-finite one is, as QSGD's is when its norm overflows.
  GRADZIP_HOST_DEVICE static record make_record(float lo, float hi, bool finite) {
    if (!finite || !is_finite(hi - lo)) return {NAN, NAN};
    lo = lo + 0.0f;  // -0 -> +0: min/max may return either zero, the record must not differ
    hi = hi + 0.0f;
    return {lo, gradzip::detail::div_rn(hi - lo, static_cast<float>(levels))};
  }

  /// A bucket's encoder (`bucket_encoder`): its lo and 1 / step, computed once.
  struct encoder_type {
    float lo;
    bucket_ratio inverse_step;  // (v - lo) / step as a product
    bool coded;                 // step > 0: not a constant bucket (step 0) or a poisoned one (NaN)

    /// The code of value v; `random` is the element's 16 random bits in the top half of a word
    /// (`random_half_word`), read by stochastic rounding only.
    GRADZIP_HOST_DEVICE unsigned operator()(float v, std::uint32_t random) const {
      if (!coded) return 0;
      const float t = inverse_step(v - lo);  // (v - lo) / step, >= 0: v >= lo
      const float offset = Rounding == rounding::stochastic ? uniform_float(random) : 0.5f;
      // Truncation below is floor (rounded >= 0). add_rn: the offset's scaling product (stochastic
      // rounding) must not be fused into this sum.
      const float rounded = gradzip::detail::add_rn(t, offset);
      // Through int (one vector instruction; float -> unsigned has none before AVX-512).
      return static_cast<unsigned>(static_cast<int>(stat_min(rounded, static_cast<float>(levels))));
    }
  };
  GRADZIP_HOST_DEVICE encoder_type encoder(const record& r) const {
    return {r.lo, bucket_ratio::of(1.0f, r.step), r.step > 0.0f};
  }

  /// The code of value v in a bucket with record r.
  GRADZIP_HOST_DEVICE unsigned encode(float v, const record& r, std::uint32_t random) const {
    return encoder(r)(v, random);
  }

  GRADZIP_HOST_DEVICE static float decode(unsigned code, const record& r) {
    return fmaf(static_cast<float>(code), r.step, r.lo);
  }

};

}  // namespace gradzip::quantize
