/**
 * @file bucket_stats.hpp
 * @brief Per-bucket statistics in one canonical order, the same on host and device.
 *
 * A bucketed values stage describes its statistics as up to four floats (`bucket_stats`), how a
 * value adds to them (`Values::add`) and how two partial statistics merge (`Values::merge`,
 * commutative bit for bit: sums, minima, maxima). The order is fixed by the format, not by the
 * launch: lane j of 32 accumulates values j, j + 32, j + 64, ... of the bucket in order, then
 * the 32 partials merge in an xor butterfly (offsets 16, 8, 4, 2, 1). A CUDA warp does exactly
 * this with `__shfl_xor_sync`; the host's `detail::bucket_statistics`
 * (detail/host/quantize.hpp) replays the same tree, so
 * sums (norms, means) agree bit for bit.
 */
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "gradzip/core/element_type.hpp"
#include "gradzip/core/error.hpp"
#include "gradzip/quantize/bit_packing.hpp"
#include "gradzip/random/philox.hpp"
#include "gradzip/wire/format.hpp"

namespace gradzip::quantize {

/// Where in a run a compression happens: stochastic stages key their randomness by it, and
/// random-k and SimHash store it in their payloads. 64-bit, as a training loop counts, e.g.
/// `codec.compress(exec, grad, out, {step, tensor_index})`; each must be below 2^32 (they key
/// Philox's 32-bit counter words and fill 4-byte payload fields), which compress checks.
struct compress_context {
  std::uint64_t step = 0;
  std::uint64_t tensor_id = 0;
};

/// Throws invalid_argument naming `what` unless both fields fit their 32 bits.
inline void check_context(const compress_context& ctx, const char* what) {
  GRADZIP_EXPECTS(ctx.step <= 0xFFFFFFFFu && ctx.tensor_id <= 0xFFFFFFFFu, what,
                  ": compress_context step and tensor_id must be below 2^32, got step ", ctx.step,
                  " and tensor_id ", ctx.tensor_id);
}

struct bucket_stats {
  float v[4];
};

/// Minimum and maximum as compare-and-select (one `minps`/`maxps` each, vectorizable), not
/// fminf/fmaxf (library calls on the host). They differ only for NaN, and every stage flags
/// non-finite values separately and poisons the bucket, so the record never depends on it.
GRADZIP_HOST_DEVICE inline float stat_min(float a, float b) { return b < a ? b : a; }
GRADZIP_HOST_DEVICE inline float stat_max(float a, float b) { return a < b ? b : a; }

/// `pick ? a : b` through bit masks: decoders use it so that the host's decode loop compiles
/// to vector instructions (compilers keep a float `?:` as a branch).
GRADZIP_HOST_DEVICE inline float select_float(bool pick, float a, float b) {
  const std::uint32_t mask = 0u - static_cast<std::uint32_t>(pick);
  return gradzip::detail::bit_cast<float>((gradzip::detail::bit_cast<std::uint32_t>(a) & mask) |
                                          (gradzip::detail::bit_cast<std::uint32_t>(b) & ~mask));
}

/// x / d for the values x of one bucket, as x·(c / d) with c / d the same for the whole bucket
/// (GRACE's QSGD multiplies by s / ‖v‖ likewise, one scalar per tensor). The stage computes it in
/// its `encoder` (`bucket_encoder` below), once per bucket: nvcc does not hoist `div_rn` out of a
/// per-value `encode`. On a GPU an IEEE division is a subroutine of about ten instructions and a
/// branch per value; this is two multiplications. c / d itself is `div_rn`, correctly rounded on
/// the device under nvcc's --use_fast_math too (host flags such as -ffast-math are the user's to
/// avoid). The
/// quotient differs from x / d by at most a few ulps, so codes near a rounding boundary may differ
/// from a division's (the format does not fix the division). Where c / d could overflow (d below
/// 2^-100: subnormal buckets) x and d are both scaled by 2^100 first, exactly: x is at most about
/// 1.5 c d there (uniform's v - lo <= L step), so x 2^100 stays below 2^17.
struct bucket_ratio {
  float pre;     ///< 1, or 2^100 where d < 2^-100
  float factor;  ///< c / (d x pre)

  GRADZIP_HOST_DEVICE static bucket_ratio of(float c, float d) {
    const float pre = scale_for(d);
    return {pre, gradzip::detail::div_rn(c, d * pre)};
  }
  /// 2^100 for d below 2^-100, else 1: scaling d and the x compared with it by this is exact and
  /// keeps products of d (and c / d) out of the subnormal (and overflow) range.
  GRADZIP_HOST_DEVICE static float scale_for(float d) { return d < 0x1p-100f ? 0x1p100f : 1.0f; }
  /// x, scaled as d was: `scaled(x) * factor` is x x c / d.
  GRADZIP_HOST_DEVICE float scaled(float x) const { return x * pre; }
  GRADZIP_HOST_DEVICE float operator()(float x) const { return scaled(x) * factor; }
};

/// The class that declares a const member function (the base's, for an inherited one).
template <class C, class R, class... A>
C declaring_class(R (C::*)(A...) const);
template <class Values>
using encoder_class_t = decltype(declaring_class(&Values::encoder));
template <class Values>
using encode_class_t = decltype(declaring_class(&Values::encode));

/// Whether a stage has an encoder that speaks for its `encode`: both declared by the same class.
/// A stage derived from uniform that writes its own `encode` inherits uniform's encoder, which
/// would code its values as uniform's; it is encoded by its `encode` instead.
template <class Values, class = void>
struct has_encoder : std::false_type {};
template <class Values>
struct has_encoder<Values, std::void_t<encoder_class_t<Values>, encode_class_t<Values>>>
    : std::is_same<encoder_class_t<Values>, encode_class_t<Values>> {};

/// A stage's `encode` with the bucket's record bound: `encode(v, r, random)` per value.
template <class Values>
struct record_encoder {
  const Values* values;
  typename Values::record record;
  GRADZIP_HOST_DEVICE unsigned operator()(float v, std::uint32_t random) const {
    return values->encode(v, record, random);
  }
};

/**
 * What the executors encode a bucket's values with, made once per bucket (the GPU) or per block of
 * 256 values (the host): the stage's `encoder(record)` where it has one (`has_encoder`), a
 * callable `(float v, std::uint32_t random) -> unsigned` that holds the bucket's constants
 * (uniform's 1 / step, QSGD's s / norm), otherwise `encode` with the record bound. A stage with
 * an encoder defines `encode(v, r, random)` as `encoder(r)(v, random)`, so the two give the same
 * codes. A bucket constant computed here is computed once, whatever the compiler proves (nvcc
 * does not hoist a `div_rn` out of each value's encode). The GPU also makes one for the
 * value-initialized record of a lane past the last bucket, and never calls it.
 */
template <class Values>
GRADZIP_HOST_DEVICE auto bucket_encoder(const Values& values, const typename Values::record& r) {
  if constexpr (has_encoder<Values>::value) {
    return values.encoder(r);
  } else {
    return record_encoder<Values>{&values, r};
  }
}

/// flag <- 1 when v is inf or NaN (a select, no branch).
GRADZIP_HOST_DEVICE inline float non_finite_flag(float flag, float v) { return is_finite(v) ? flag : 1.0f; }

/// What every bucketed values stage shares: its sizes and how its per-bucket record (a
/// trivially copyable struct of `Record` type) is stored in the scales section.
template <int Bits, std::uint32_t Bucket, class Record>
struct bucketed_stage {
  static_assert(Bits >= 1 && Bits <= 16, "bucketed stage: codes must be 1..16 bits");
  static_assert(Bucket >= 32 && Bucket % 32 == 0 && Bucket <= (1u << 20),
                "bucketed stage: Bucket must be a multiple of 32 in [32, 2^20]");
  static_assert(sizeof(Record) % 4 == 0, "bucketed stage: records are whole 32-bit words");
  using record = Record;
  static constexpr bool bucketed = true;
  static constexpr int bits = Bits;
  /// The narrowest unsigned type that holds a code.
  using code_type = std::conditional_t<(Bits <= 8), std::uint8_t, std::uint16_t>;
  static constexpr std::uint32_t bucket = Bucket;

  /// Stochastic stages set this and have a `seed`: each element then gets its Philox word.
  static constexpr bool stochastic = false;
  /// Stages whose codes do not fill all 2^Bits values set this and define max_code.
  static constexpr bool codes_need_check = false;
  static constexpr unsigned max_code = (1u << Bits) - 1;

  GRADZIP_HOST_DEVICE static std::uint64_t bucket_count(std::uint64_t count) {
    return (count + Bucket - 1) / Bucket;
  }
  GRADZIP_HOST_DEVICE static std::uint64_t scales_bytes(std::uint64_t count) {
    return bucket_count(count) * sizeof(Record);
  }
  GRADZIP_HOST_DEVICE static std::uint64_t codes_bytes(std::uint64_t count) {
    return packed_bytes(count, Bits);
  }
  GRADZIP_HOST_DEVICE static void store_record(std::uint8_t* scales, std::uint64_t b, const Record& r) {
    if (GRADZIP_DEVICE_CODE()) {  // the scales section of a device payload is 16-byte aligned
      reinterpret_cast<Record*>(scales)[b] = r;
    } else {
      std::memcpy(scales + b * sizeof(Record), &r, sizeof(Record));
    }
  }
  GRADZIP_HOST_DEVICE static Record load_record(const std::uint8_t* scales, std::uint64_t b) {
    if (GRADZIP_DEVICE_CODE()) return reinterpret_cast<const Record*>(scales)[b];
    Record r;
    std::memcpy(&r, scales + b * sizeof(Record), sizeof(Record));
    return r;
  }
};

/// The random word a values stage gets for the element at tensor index `index`: 16 random bits
/// in its top half (`random_half_word`), 0 for deterministic stages.
template <class Values>
GRADZIP_HOST_DEVICE std::uint32_t element_random(const Values& values, std::uint64_t index,
                                                 compress_context ctx) {
  if constexpr (Values::stochastic) {
    return random_half_word(values.seed, static_cast<std::uint32_t>(ctx.step), static_cast<std::uint32_t>(ctx.tensor_id),
                       index);  // both below 2^32: check_context
  } else {
    return 0;
  }
}

/// Parameters of a stage described by one byte and its bucket: u8 kind, 3 zero bytes, u32
/// bucket (qsgd: the levels; sign: whether it is scaled).
GRADZIP_HOST_DEVICE inline void write_kind_and_bucket(std::uint8_t* p, std::uint8_t kind,
                                                      std::uint32_t bucket) {
  p[0] = kind;
  wire::detail::store_le(p + 4, bucket, 4);
}

/// Checks such parameters against the decoder's; `at` is their offset in the payload.
GRADZIP_HOST_DEVICE inline wire::status check_kind_and_bucket(const std::uint8_t* p, std::uint64_t at,
                                                              std::uint8_t kind, std::uint32_t bucket) {
  if (p[0] != kind) return wire::fail(wire::format_errc::bad_params, at, p[0], kind);
  for (int i = 1; i < 4; ++i) {
    if (p[i] != 0) return wire::fail(wire::format_errc::nonzero_reserved, at + i);
  }
  const auto b = wire::detail::load_le(p + 4, 4);
  if (b != bucket) return wire::fail(wire::format_errc::bad_params, at + 4, b, bucket);
  return {};
}

/// Statistics made of one sum (v[0]) and a flag set when any value was not finite (v[1]).
struct sum_and_flag {
  GRADZIP_HOST_DEVICE static bucket_stats empty_stats() { return {{0.0f, 0.0f, 0.0f, 0.0f}}; }
  GRADZIP_HOST_DEVICE static bucket_stats merge(bucket_stats a, bucket_stats b) {
    return {{a.v[0] + b.v[0], stat_max(a.v[1], b.v[1]), 0.0f, 0.0f}};
  }
  GRADZIP_HOST_DEVICE static void flag_non_finite(bucket_stats& s, float v) {
    s.v[1] = non_finite_flag(s.v[1], v);
  }
};

}  // namespace gradzip::quantize
