/**
 * @file natural.hpp
 * @brief `quantize::natural<Bits, Bucket>`: natural compression, stochastic rounding to a power
 * of two, in 8- or 9-bit codes.
 *
 * Horváth, Ho, Horváth, Sahu, Canini, Richtárik, "Natural compression for distributed deep
 * learning" (MSML 2022, arXiv:1905.10988). For v with 2^e <= |v| < 2^(e+1):
 *
 *     C(v) = sign(v) 2^(e+1)  with probability p = |v| / 2^e − 1,
 *            sign(v) 2^e      otherwise,
 *
 * unbiased, E[C(v)] = v, with variance (|v| − 2^e)(2^(e+1) − |v|) <= v² / 8 (the paper's
 * ω = 1/8). Only the sign and the exponent are sent.
 *
 * The paper's 9-bit code is the sign plus float's 8 exponent bits. gradzip makes the exponent
 * relative to the bucket: each bucket stores `top`, the exponent of its largest magnitude
 * rounded up to a power of two, and a code holds the sign in bit 0 and c in the bits above,
 * with L = 2^(Bits−1) − 1:
 *
 *     c = 0       -> 0
 *     c in 1..L   -> 2^(top − L + c)
 *
 * `natural<9>` (L = 255) covers every float exponent under the bucket's maximum, as the
 * paper's code does; `natural<8>` (L = 127) covers 2^126 below it, which is more dynamic range
 * than a gradient bucket has in practice. A value below the smallest magnitude m = 2^(top−L+1)
 * is rounded stochastically between 0 and m (still unbiased, variance <= m² / 4). Values above
 * 2^127 have no power of two above them in float and round down (the only bias, documented).
 *
 * Randomness: Philox keyed by (seed, step, tensor id, element index), compared as integers, so
 * host and device agree bit for bit. Zero buckets decode to zeros; a bucket holding NaN or inf
 * decodes to NaN throughout. Wire: `top` as one i32 per bucket (the scales section), codes
 * bit-plane packed. Bytes per value: Bits / 8 + 4 / Bucket.
 *
 * @code
 * using nat = gradzip::quantize::natural<8>;
 * gradzip::codec<gradzip::sparsify::none, nat, gradzip::encode::none> c{{}, nat{seed}};
 * @endcode
 */
#pragma once

#include <cmath>
#include <cstdint>

#include "gradzip/quantize/bucket_stats.hpp"
#include "gradzip/quantize/uniform.hpp"
#include "gradzip/random/philox.hpp"

namespace gradzip::quantize {

struct natural_record {
  std::int32_t top;  ///< exponent of code c = L; `poisoned` when the bucket held NaN or inf
};

}  // namespace gradzip::quantize

namespace gradzip::detail {

/// a = mantissa x 2^exponent exactly, for a finite float magnitude a > 0 (subnormals included).
struct float_parts {
  std::uint32_t mantissa;  // 24 significant bits for normals, fewer for subnormals
  int exponent;
};
GRADZIP_HOST_DEVICE inline float_parts split_float(float a) {
  const std::uint32_t bits = gradzip::detail::bit_cast<std::uint32_t>(a);
  const int biased = static_cast<int>(bits >> 23);
  if (biased == 0) return {bits, -149};
  return {(bits & 0x7FFFFFu) | 0x800000u, biased - 150};
}

/// floor(log2 m) for m > 0 (one count-leading-zeros instruction).
GRADZIP_HOST_DEVICE inline int floor_log2(std::uint32_t m) {
#if defined(__CUDA_ARCH__)
  return 31 - __clz(static_cast<int>(m));
#elif defined(__GNUC__) || defined(__clang__)
  return 31 - __builtin_clz(m);
#else
  int e = 0;
  while (m >>= 1) ++e;
  return e;
#endif
}

/// 2^e as a float: subnormal below 2^-126, 0 below 2^-149, inf above 2^127 (selects only, in
/// 32-bit integers so that the host's decode loop vectorizes).
GRADZIP_HOST_DEVICE inline float exact_pow2(std::int32_t e) {
  const std::int32_t c = e < -160 ? -160 : (e > 128 ? 128 : e);
  const std::uint32_t normal = static_cast<std::uint32_t>(c + 127) << 23;
  const std::uint32_t shift = static_cast<std::uint32_t>(c + 149 < 0 ? 0 : c + 149) & 31u;
  const std::uint32_t subnormal = select_bits(c >= -149, std::uint32_t{1} << shift, 0u);
  std::uint32_t bits = select_bits(c >= -126, normal, subnormal);
  bits = select_bits(c > 127, 0x7F800000u, bits);
  return bit_cast<float>(bits);
}

}  // namespace gradzip::detail

namespace gradzip::quantize {

template <int Bits = 8, std::uint32_t Bucket = 512>
struct natural : bucketed_stage<Bits, Bucket, natural_record> {
  static_assert(Bits == 8 || Bits == 9, "quantize::natural: codes are 8 or 9 bits");
  using record = natural_record;
  static constexpr std::uint8_t id = 7;
  static constexpr bool stochastic = true;
  static constexpr bool summable = false;
  /// The largest exponent code: magnitudes span 2^(top − L + 1) .. 2^top.
  static constexpr int exponent_codes = (1 << (Bits - 1)) - 1;
  static constexpr std::int32_t poisoned = INT32_MAX;
  /// Params: u8 bits, 3 zero bytes, u32 bucket.
  static constexpr std::uint64_t param_bytes = 8;
  /// The class whose fast paths (encode_in_range, decode_in_range) these are: a derived stage
  /// that writes its own encode or decode does not take them (detail::has_in_range_encode).
  using in_range_class = natural;

  std::uint64_t seed = 0;

  constexpr natural() = default;
  explicit constexpr natural(std::uint64_t seed_value) : seed(seed_value) {}

  GRADZIP_HOST_DEVICE static void write_params(std::uint8_t* p) { write_kind_and_bucket(p, Bits, Bucket); }
  GRADZIP_HOST_DEVICE static wire::status check_params(const std::uint8_t* p, std::uint64_t at) {
    return check_kind_and_bucket(p, at, Bits, Bucket);
  }

  /// Statistics: max |v| and 1 if any value was not finite (exact in any order).
  GRADZIP_HOST_DEVICE static bucket_stats empty_stats() { return sum_and_flag::empty_stats(); }
  GRADZIP_HOST_DEVICE static void add(bucket_stats& s, float v) {
    s.v[0] = stat_max(s.v[0], fabsf(v));
    sum_and_flag::flag_non_finite(s, v);
  }
  GRADZIP_HOST_DEVICE static bucket_stats merge(bucket_stats a, bucket_stats b) {
    return {{stat_max(a.v[0], b.v[0]), stat_max(a.v[1], b.v[1]), 0.0f, 0.0f}};
  }
  GRADZIP_HOST_DEVICE static record make_record(bucket_stats s, std::uint64_t) {
    if (s.v[1] != 0.0f) return {poisoned};
    if (!(s.v[0] > 0.0f)) return {0};  // zero bucket: every code is 0
    const detail::float_parts p = detail::split_float(s.v[0]);
    const int e = p.exponent + detail::floor_log2(p.mantissa);
    const bool power_of_two = (p.mantissa & (p.mantissa - 1u)) == 0;
    return {power_of_two || e == 127 ? e : e + 1};  // 2^128 is not a float: stay at 2^127
  }

  /// Both rounding paths are computed in 32-bit integers and one is selected, so the host's
  /// loop vectorizes; every comparison is exact (u < p as draw < p x 2^24 in integers).
  GRADZIP_HOST_DEVICE unsigned encode(float v, const record& r, std::uint32_t random) const {
    using gradzip::detail::select_bits;
    const std::uint32_t sign = gradzip::detail::bit_cast<std::uint32_t>(v) >> 31;
    const std::uint32_t a = gradzip::detail::bit_cast<std::uint32_t>(v) & 0x7FFFFFFFu;
    const std::uint32_t draw = random >> 8;  // u x 2^24
    // a = m x 2^E exactly (subnormals: no implicit bit), m < 2^24.
    const bool subnormal = (a >> 23) == 0;
    const std::uint32_t m = select_bits(subnormal, a, (a & 0x7FFFFFu) | 0x800000u);
    const auto E = static_cast<std::int32_t>(select_bits(subnormal, static_cast<std::uint32_t>(-149),
                                                         (a >> 23) - 150u));
    // floor(log2 m) from float(m)'s exponent (exact: m < 2^24); m = 0 is handled at the end.
    const std::int32_t width =
        static_cast<std::int32_t>(gradzip::detail::bit_cast<std::uint32_t>(static_cast<float>(static_cast<std::int32_t>(m))) >> 23) - 127;
    // A poisoned bucket's top would overflow the arithmetic below: use 0, its codes are zeroed.
    const auto top = static_cast<std::int32_t>(select_bits(r.top == poisoned, 0u, static_cast<std::uint32_t>(r.top)));
    const std::int32_t lowest = top - exponent_codes + 1;  // the exponent of code c = 1
    const std::int32_t e = E + width;                        // floor(log2 a)
    // In range: between 2^e and 2^(e+1), up with probability frac / 2^width.
    const std::uint32_t frac = m - (std::uint32_t{1} << (width & 31));
    const std::uint32_t up = static_cast<std::uint32_t>(draw < (frac << ((24 - width) & 31)));
    const std::uint32_t in_range = static_cast<std::uint32_t>(e - lowest + 1) + up;
    const std::uint32_t c_in_range = select_bits(in_range > static_cast<std::uint32_t>(exponent_codes),
                                                 static_cast<std::uint32_t>(exponent_codes), in_range);
    // Below range: 2^lowest with probability a / 2^lowest = m / 2^(shift + 24), else 0:
    // draw < ceil(m / 2^shift) (shift >= 0) or draw < m x 2^-shift (shift < 0).
    const std::int32_t shift = lowest - E - 24;
    const std::uint32_t right = static_cast<std::uint32_t>(shift) & 31;
    const std::uint32_t rounded_up = (m + ((std::uint32_t{1} << right) - 1u)) >> right;
    const std::uint32_t scaled = select_bits(shift >= 0, rounded_up, m << (static_cast<std::uint32_t>(-shift) & 31));
    const std::uint32_t bound = select_bits(shift >= 24, static_cast<std::uint32_t>(m != 0), scaled);
    const std::uint32_t c_below = static_cast<std::uint32_t>(draw < bound);
    const std::uint32_t c = select_bits(e >= lowest, c_in_range, c_below);
    // Zero (either sign) is sent as +0; a poisoned bucket's codes are zero too.
    const bool zero = (r.top == poisoned) | (a == 0) | (a >= 0x7F800000u);  // | not ||: no branch
    return select_bits(zero, 0u, (c << 1) | sign);
  }

  /// The bits of the smallest nonzero |v| that `encode_in_range` takes: 2^lowest, or the
  /// smallest normal float if that is larger. A poisoned bucket holds a NaN or an inf, which
  /// `encode_in_range` does not take: its floor is inf's bits.
  GRADZIP_HOST_DEVICE static std::uint32_t in_range_floor(const record& r) {
    if (r.top == poisoned) return 0x7F800000u;
    const std::int32_t lowest = r.top - exponent_codes + 1;
    return static_cast<std::uint32_t>((lowest < -126 ? -126 : lowest) + 127) << 23;
  }

  /// `encode`'s code for a v that is 0, or finite with |v|'s bits at least `in_range_floor(r)`
  /// (a poisoned bucket's only such values are zeros, which give 0 here as in `encode`):
  /// a normal float 2^e (1 + f) with e >= lowest goes up a power with probability f, and f x 2^24
  /// is its 23 mantissa bits shifted up once (encode's `frac << (24 - width)` at width 23).
  /// About a quarter of encode's instructions: the host takes it for blocks where every value
  /// qualifies, the GPU for warp steps.
  GRADZIP_HOST_DEVICE unsigned encode_in_range(float v, const record& r, std::uint32_t random) const {
    using gradzip::detail::select_bits;
    const std::uint32_t bits = gradzip::detail::bit_cast<std::uint32_t>(v);
    const std::uint32_t a = bits & 0x7FFFFFFFu;
    const std::uint32_t up = static_cast<std::uint32_t>((random >> 8) < ((a << 9) >> 8));
    // c = e - lowest + 1 + up with e = (a >> 23) - 127 and lowest = top - L + 1.
    // In 32-bit unsigned arithmetic, so that any top (a poisoned one too) wraps instead of overflowing.
    const std::uint32_t c =
        (a >> 23) + static_cast<std::uint32_t>(exponent_codes - 127) - static_cast<std::uint32_t>(r.top) + up;
    const std::uint32_t capped = select_bits(c > static_cast<std::uint32_t>(exponent_codes),
                                             static_cast<std::uint32_t>(exponent_codes), c);
    return select_bits(a == 0, 0u, (capped << 1) | (bits >> 31));
  }

  /// The smallest exponent code c >= 1 that `decode_in_range` takes (c = 0 too): the first whose
  /// power of two is a normal float. 1 for a poisoned bucket (every code is NaN); L + 1, above
  /// every code, where every nonzero code would be subnormal or zero, or where some would be
  /// above 2^127 (a hostile top).
  GRADZIP_HOST_DEVICE static unsigned in_range_code_floor(const record& r) {
    if (r.top == poisoned) return 1;
    if (r.top > 127) return exponent_codes + 1;
    // 2^(top - L + c) is normal from c = L - 126 - top on (in 64 bits: no overflow for any top).
    const std::int64_t first = std::int64_t{exponent_codes} - 126 - r.top;
    return first < 1 ? 1u : (first > exponent_codes ? exponent_codes + 1u : static_cast<unsigned>(first));
  }

  /// `decode`'s value for a code whose c is 0 or at least `in_range_code_floor(r)`: a normal
  /// power of two, whose bits are c x 2^23 plus a bucket constant (no clamps).
  GRADZIP_HOST_DEVICE static float decode_in_range(unsigned code, const record& r) {
    const std::uint32_t c = code >> 1;
    // (top - L + c + 127) << 23, in 32-bit unsigned arithmetic (it wraps for a poisoned top).
    const std::uint32_t offset = (static_cast<std::uint32_t>(r.top) - static_cast<std::uint32_t>(exponent_codes) + 127u) << 23;
    std::uint32_t bits = gradzip::detail::select_bits(c == 0, 0u, (c << 23) + offset);
    bits = gradzip::detail::select_bits(r.top == poisoned, 0x7FC00000u, bits);
    return gradzip::detail::bit_cast<float>(bits | ((code & 1u) << 31));
  }

  GRADZIP_HOST_DEVICE static float decode(unsigned code, const record& r) {
    const auto c = static_cast<std::int32_t>(code >> 1);
    // An encoder's top is in [-149, 127] (or poisoned: NaN below), a hostile payload's anything.
    // Clamped to [-1000, 1000], top - L + c stays far from int32 overflow, and exact_pow2 still
    // saturates exactly where the unclamped exponent would (0 below 2^-160, inf above 2^128).
    const bool bad = r.top == poisoned;
    const std::int32_t top = r.top < -1000 ? -1000 : (r.top > 1000 ? 1000 : r.top);
    std::uint32_t bits = gradzip::detail::bit_cast<std::uint32_t>(detail::exact_pow2(top - exponent_codes + c));
    bits = gradzip::detail::select_bits(c == 0, 0u, bits);
    bits = gradzip::detail::select_bits(bad, 0x7FC00000u, bits);
    return gradzip::detail::bit_cast<float>(bits | ((code & 1u) << 31));
  }
};

}  // namespace gradzip::quantize
