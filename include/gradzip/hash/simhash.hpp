/**
 * @file simhash.hpp
 * @brief `hash::simhash`: locality-sensitive hashing of a gradient by sign random projections
 * (Charikar 2002), m sign bits and one scale per block of B elements, decoded by an estimator
 * that is exact along the block and unbiased over the projection.
 *
 * Block b of x (B elements, a power of two; the last block zero-padded) is projected by
 * P = S R: R = H D / sqrt(B) is the randomized Hadamard rotation (D random signs, H the
 * Walsh-Hadamard matrix, O(B log B), nothing stored; as `transform::hadamard`), and S keeps m of
 * its B coordinates, rows j_i = (a i + c) mod B for i < m with a odd and c uniform: m distinct
 * rows, each kept with probability m / B. D, a and c are regenerated from
 * (seed, step, tensor id, block) on both sides, so only the bits and a scale travel:
 *
 *     z = R x,   bit i = [z_{j_i} < 0],   scale = |x|^2 m / (B sum_i |z_{j_i}|)
 *     x^ = scale (B / m) R^T S^T sign          (sign_i = +1 or -1 from bit i)
 *
 * Exact along x: <x^, x> = scale (B / m) sum_i |z_{j_i}| = |x|^2 for every draw, so the
 * estimate's error is orthogonal to the block. Over the draw of S, E[(B / m) S^T S] = I, and
 * when R's coordinates are Gaussian (a spread block: each is a sum of B randomly signed terms)
 * scale is |x| sqrt(pi B / 2) / B up to the sampling noise of sum |z|, and x^ is the classic
 * unbiased estimator E[sign(<g, x>) g] = sqrt(2 / pi) x / |x| (Gaussian g) rescaled. For a
 * 1-sparse block z is flat and x^ is unbiased exactly. tests/host/test_simhash.cpp measures the
 * bias of the mean of 4,000 draws against the noise, on Gaussian, heavy-tailed and sparse blocks.
 *
 * Error: E|x^ - x|^2 = |x|^2 (pi B / (2 m) - 1) for Gaussian coordinates. Bits per element
 * m / B + 32 / B: the one way to send fewer than 1 bit per element from the sign family
 * (docs/sketching.md compares it with scaled sign at equal bits).
 *
 * Payload: codec id 00 08 00 00; params (u32 block, u32 bits m, u64 seed, u32 step,
 * u32 tensor id), scales (one fp32 per block), values (m bits per block, bit i of a block in
 * byte i / 8 at bit i % 8). A block holding NaN or inf (or whose scale overflows fp32) is sent
 * with the scale 0x7FC00000 and zero bits, and decodes to NaN: loud, never silently zero. The
 * decoder rejects every other scale that is negative or not finite (`bad_scale`), and bits set
 * in a NaN block (`bad_code`).
 * Host executor, and CUDA (detail/cuda/simhash.cuh: blocks up to 8192, one thread block each,
 * the host's bytes; run where a GPU is lent).
 *
 * @code
 * gradzip::hash::simhash sh{1024, 128, seed};         // 1/8 bit + 1/32 bit of scale per element
 * std::vector<std::byte> out(sh.max_compressed_bytes<float>(n));
 * out.resize(sh.compress(exec, gradzip::span<const float>(grad), out, {step, tensor_id}));
 * sh.decompress_add(exec, gradzip::span<const std::byte>(out), gradzip::span<float>(accum));
 * @endcode
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gradzip/core/element_type.hpp"
#include "gradzip/core/error.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/detail/host/parallel.hpp"
#include "gradzip/detail/lane_sum.hpp"
#include "gradzip/detail/values.hpp"
#include "gradzip/quantize/bucket_stats.hpp"
#include "gradzip/random/hash.hpp"
#include "gradzip/transform/hadamard.hpp"
#include "gradzip/wire/reader.hpp"
#include "gradzip/wire/writer.hpp"

namespace gradzip::detail {
/// Executors other than the host's (detail/cuda/simhash.cuh for `cuda`).
template <class Exec>
struct simhash_backend;
}  // namespace gradzip::detail

namespace gradzip::hash {

class simhash {
 public:
  static constexpr std::uint8_t structure_id = 8;
  static constexpr wire::codec_id id{0, structure_id, 0, 0};
  static constexpr bool summable = false;
  static constexpr std::uint64_t params_bytes = 24;
  static constexpr std::uint32_t poisoned_scale = 0x7FC00000u;

  /// block: a power of two in [8, 65536]; bits: a multiple of 8 in [8, block].
  simhash(std::uint32_t block, std::uint32_t bits, std::uint64_t seed) : block_(block), bits_(bits), seed_(seed) {
    GRADZIP_EXPECTS(block >= 8 && block <= (1u << 16) && (block & (block - 1)) == 0,
                    "simhash: block must be a power of two in [8, 65536], got ", block);
    GRADZIP_EXPECTS(bits >= 8 && bits <= block && bits % 8 == 0,
                    "simhash: bits per block must be a multiple of 8 in [8, block = ", block, "], got ", bits);
  }

  std::uint32_t block() const noexcept { return block_; }
  std::uint32_t bits() const noexcept { return bits_; }
  std::uint64_t seed() const noexcept { return seed_; }
  std::uint64_t block_count(std::uint64_t n) const { return (n + block_ - 1) / block_; }

  /// Rotation rounds: one H D round leaves a sparse block's projections far from Gaussian (one
  /// dominant element fixes every sign, and the estimate loses the others), three make them
  /// Gaussian enough for the estimator (the HD3 HD2 HD1 pseudo-random rotation of Andoni et al.,
  /// "Practical and optimal LSH for angular distance", NeurIPS 2015).
  static constexpr std::uint32_t rounds = 3;

  /// The projection of one block: its sign words' key and the sampled rows' stride and offset.
  struct projection {
    std::uint64_t key;
    std::uint32_t stride;  // odd
    std::uint32_t offset;
    /// Bit k % 64 of word k / 64 is set when D_round's entry k is -1.
    GRADZIP_HOST_DEVICE std::uint64_t sign_word(std::uint32_t round, std::uint32_t word) const {
      return hash64(key, (std::uint64_t{round} << 12) | word);
    }
    GRADZIP_HOST_DEVICE std::uint32_t row(std::uint32_t i, std::uint32_t block) const {
      return (stride * i + offset) & (block - 1);
    }
  };
  GRADZIP_HOST_DEVICE static projection projection_for(std::uint64_t seed, std::uint32_t block,
                                                       quantize::compress_context ctx, std::uint64_t b) {
    const std::uint64_t key = hash64(hash64(hash64(seed, ctx.step), ctx.tensor_id), b);
    // Indices past any sign word's (below 2^14) keep the row draws independent of the signs.
    const auto stride = static_cast<std::uint32_t>(hash64(key, std::uint64_t{1} << 40)) | 1u;
    const auto offset = static_cast<std::uint32_t>(hash64(key, (std::uint64_t{1} << 40) + 1));
    return {key, stride & (block - 1), offset & (block - 1)};
  }
  projection projection_of(quantize::compress_context ctx, std::uint64_t b) const {
    return projection_for(seed_, block_, ctx, b);
  }

  /// The fp32 scale |x|^2 m / (B sum |z|) as stored, or `poisoned_scale` when the block held a
  /// non-finite value or the scale does not fit fp32 (shared by every executor).
  GRADZIP_HOST_DEVICE static std::uint32_t scale_word(double norm2, double sum_abs, std::uint32_t block,
                                                      std::uint32_t bits) {
    const double scale = sum_abs > 0.0 ? norm2 * bits / (static_cast<double>(block) * sum_abs) : 0.0;
    const auto word = gradzip::detail::bit_cast<std::uint32_t>(static_cast<float>(scale));
    const auto norm_word = gradzip::detail::bit_cast<std::uint64_t>(norm2);
    const auto sum_word = gradzip::detail::bit_cast<std::uint64_t>(sum_abs);
    constexpr std::uint64_t double_exponent = 0x7FF0000000000000ull;
    const bool finite = (norm_word & double_exponent) != double_exponent &&
                        (sum_word & double_exponent) != double_exponent && (word & 0x7F800000u) != 0x7F800000u;
    return finite ? word : poisoned_scale;
  }

  /// Where a validated payload's scales and codes are, and the step and tensor it was made for.
  struct frame {
    std::uint64_t scales = 0, codes = 0;  // byte offsets in the payload
    quantize::compress_context ctx{};
  };

  GRADZIP_HOST_DEVICE static wire::payload_layout layout_for(std::uint64_t n, std::uint32_t block, std::uint32_t bits) {
    const std::uint64_t blocks = (n + block - 1) / block;
    wire::payload_layout l;
    l.add(wire::tag::params, params_bytes);
    l.add(wire::tag::scales, blocks * 4);
    l.add(wire::tag::values, blocks * (bits / 8));
    return l;
  }

  /// Header, params and padding of a payload for n elements of `type` (scales and codes follow).
  GRADZIP_HOST_DEVICE static void write_frame(std::uint8_t* base, std::uint64_t n, element_type type, std::uint32_t block,
                                              std::uint32_t bits, std::uint64_t seed, quantize::compress_context ctx) {
    const wire::payload_layout l = layout_for(n, block, bits);
    wire::write_header(base, l, type, id, n);
    std::uint8_t* params = base + l.at(0).offset;
    wire::detail::store_le(params, block, 4);
    wire::detail::store_le(params + 4, bits, 4);
    wire::detail::store_le(params + 8, seed, 8);
    wire::detail::store_le(params + 16, ctx.step, 4);
    wire::detail::store_le(params + 20, ctx.tensor_id, 4);
    wire::zero_section_padding(base, l);
  }

  /// Checks a parsed header against this configuration (block, bits, seed), n and type.
  GRADZIP_HOST_DEVICE static wire::status check_frame(const wire::header& h, const std::uint8_t* base, std::uint64_t n,
                                                      element_type type, std::uint32_t block, std::uint32_t bits,
                                                      std::uint64_t seed, frame& f) {
    const wire::tag tags[3] = {wire::tag::params, wire::tag::scales, wire::tag::values};
    const wire::status frame_ok = wire::expect_frame(h, id.packed(), tags, 3, params_bytes);
    if (!frame_ok.ok()) return frame_ok;
    if (h.type != type) {
      return wire::fail(wire::format_errc::element_type_mismatch, static_cast<std::uint64_t>(h.type),
                        static_cast<std::uint64_t>(type));
    }
    if (h.element_count != n) return wire::fail(wire::format_errc::size_mismatch, h.element_count, n);
    const std::uint8_t* p = base + h.sections[0].offset;
    const wire::param_field fields[3] = {{0, 4, block}, {4, 4, bits}, {8, 8, seed}};
    const wire::status params_ok = wire::expect_params(base, h.sections[0].offset, fields, 3);
    if (!params_ok.ok()) return params_ok;
    const wire::payload_layout l = layout_for(n, block, bits);
    for (std::uint32_t k = 1; k < 3; ++k) {
      if (h.sections[k].size != l.at(k).size) {
        return wire::fail(wire::format_errc::bad_section_size, k, h.sections[k].size, l.at(k).size);
      }
    }
    f.scales = h.sections[1].offset;
    f.codes = h.sections[2].offset;
    f.ctx = {static_cast<std::uint32_t>(wire::detail::load_le(p + 16, 4)),
             static_cast<std::uint32_t>(wire::detail::load_le(p + 20, 4))};
    return wire::status{};
  }

  /// Block b's scale is finite and non-negative (`bad_scale`), or the canonical NaN with all
  /// bits zero (a set bit i is `bad_code` for bit b m + i: its code 1 above the largest, 0).
  GRADZIP_HOST_DEVICE static wire::status check_block(const std::uint8_t* scales, const std::uint8_t* codes,
                                                      std::uint64_t b, std::uint32_t bits) {
    const auto s = static_cast<std::uint32_t>(wire::detail::load_le(scales + 4 * b, 4));
    const bool finite_non_negative = (s >> 31) == 0 && (s & 0x7F800000u) != 0x7F800000u;
    if (finite_non_negative) return wire::status{};
    if (s != poisoned_scale) return wire::fail(wire::format_errc::bad_scale, b, s, poisoned_scale);
    for (std::uint32_t i = 0; i < bits; ++i) {
      if (((codes[b * (bits / 8) + i / 8] >> (i % 8)) & 1u) != 0) {
        return wire::fail(wire::format_errc::bad_code, b * bits + i, 1, 0);
      }
    }
    return wire::status{};
  }

  /// The value every sampled row starts the decode with: scale (B / m) / sqrt(B), rounded once.
  /// The decode applies each round's 1 / sqrt(B) before its H (this one the last round's), so no
  /// partial sum of H exceeds the estimate's norm: with H first, |x| near 1e37 overflowed fp32.
  GRADZIP_HOST_DEVICE static float decode_magnitude(std::uint32_t scale_bits, double sqrt_block, std::uint32_t bits) {
    return static_cast<float>(static_cast<double>(gradzip::detail::bit_cast<float>(scale_bits)) * sqrt_block / bits);
  }
  /// 1 / sqrt(B) in fp32 from sqrt(B) in double, as every executor computes them.
  GRADZIP_HOST_DEVICE static float inverse_sqrt_of(double sqrt_block) { return static_cast<float>(1.0 / sqrt_block); }
  double sqrt_block() const { return std::sqrt(static_cast<double>(block_)); }

  wire::payload_layout layout(std::uint64_t n) const { return layout_for(n, block_, bits_); }
  template <class T>
  std::size_t max_compressed_bytes(std::size_t n) const {
    return layout(n).total_bytes();
  }
  /// Scratch: one block of floats per host thread.
  template <class T>
  std::size_t workspace_bytes(host& exec, std::size_t /*n*/) const {
    return static_cast<std::size_t>(std::max(1, exec.threads())) * block_ * sizeof(float) + 64;
  }

  /// Hashes x into `out` (max_compressed_bytes bytes); returns the payload's size.
  template <class T>
  std::size_t compress(host& exec, span<const T> x, span<std::byte> out, quantize::compress_context ctx = {}) const {
    quantize::check_context(ctx, "simhash::compress");
    const wire::payload_layout l = layout(x.size());
    GRADZIP_EXPECTS(out.size() >= l.total_bytes(), "simhash::compress: output holds ", out.size(),
                    " bytes, the payload needs ", l.total_bytes());
    auto* base = reinterpret_cast<std::uint8_t*>(out.data());
    write_frame(base, x.size(), element_traits<T>::type, block_, bits_, seed_, ctx);
    std::uint8_t* scales = base + l.at(1).offset;
    std::uint8_t* codes = base + l.at(2).offset;
    each_block(exec, x.size(), [&](std::uint64_t b, float* v) { hash_block(x, b, ctx, v, scales, codes); });
    return l.total_bytes();
  }

  /// On another executor (CUDA: device buffers, asynchronous; bad bytes reach exec.check()).
  template <class T, class Exec, std::enable_if_t<!std::is_same_v<Exec, host>, int> = 0>
  std::size_t workspace_bytes(Exec& /*exec*/, std::size_t /*n*/) const {
    return 0;
  }
  template <class Exec, class T, std::enable_if_t<!std::is_same_v<Exec, host>, int> = 0>
  std::size_t compress(Exec& exec, span<const T> x, span<std::byte> out, quantize::compress_context ctx = {}) const {
    quantize::check_context(ctx, "simhash::compress");
    return gradzip::detail::simhash_backend<Exec>::compress(*this, exec, x, out, ctx);
  }
  template <class Exec, class T, std::enable_if_t<!std::is_same_v<Exec, host>, int> = 0>
  void decompress(Exec& exec, span<const std::byte> payload, span<T> out) const {
    gradzip::detail::simhash_backend<Exec>::decompress_add(*this, exec, payload, out, 1.0f, true);
  }
  template <class Exec, class T, std::enable_if_t<!std::is_same_v<Exec, host>, int> = 0>
  void decompress_add(Exec& exec, span<const std::byte> payload, span<T> out, float alpha = 1.0f) const {
    gradzip::detail::simhash_backend<Exec>::decompress_add(*this, exec, payload, out, alpha, false);
  }

  /// out <- 0, then decompress_add.
  template <class T>
  void decompress(host& exec, span<const std::byte> payload, span<T> out) const {
    const view v = parse<T>(payload, out.size());  // nothing written before it is known good
    std::fill(out.begin(), out.end(), from_double<T>(0.0));
    each_block(exec, out.size(), [&](std::uint64_t b, float* u) { unhash_block(v, b, u, out, 1.0f); });
  }

  /// out <- out + alpha x^, after validating the whole payload (nothing is written on error).
  template <class T>
  void decompress_add(host& exec, span<const std::byte> payload, span<T> out, float alpha = 1.0f) const {
    const view v = parse<T>(payload, out.size());
    each_block(exec, out.size(), [&](std::uint64_t b, float* u) { unhash_block(v, b, u, out, alpha); });
  }

 private:
  struct view {
    const std::uint8_t* scales;
    const std::uint8_t* codes;
    quantize::compress_context ctx;
  };

  template <class T>
  void hash_block(span<const T> x, std::uint64_t b, quantize::compress_context ctx, float* v, std::uint8_t* scales,
                  std::uint8_t* codes) const {
    const projection p = projection_of(ctx, b);
    const std::uint64_t first = b * block_;
    const std::uint64_t count = std::min<std::uint64_t>(block_, x.size() - first);
    for (std::uint32_t k = 0; k < block_; ++k) v[k] = k < count ? static_cast<float>(to_float(x[first + k])) : 0.0f;
    const double norm2 = lane_sum(block_, [&](std::uint32_t k) { return static_cast<double>(v[k]) * v[k]; });
    const float inverse_sqrt = inverse_sqrt_of(sqrt_block());
    for (std::uint32_t r = 0; r < rounds; ++r) {  // v <- (H D_r / sqrt(B)) v
      flip_and_scale(v, p, r, inverse_sqrt);
      transform::hadamard::walsh_hadamard(v, block_);
    }
    std::uint8_t* bits = codes + b * (bits_ / 8);
    std::memset(bits, 0, bits_ / 8);
    for (std::uint32_t i = 0; i < bits_; ++i) {
      bits[i / 8] |= static_cast<std::uint8_t>((v[p.row(i, block_)] < 0.0f ? 1u : 0u) << (i % 8));
    }
    // The sum of |z| over the sampled rows.
    const double sum_abs = lane_sum(bits_, [&](std::uint32_t i) { return std::fabs(static_cast<double>(v[p.row(i, block_)])); });
    const std::uint32_t scale_bits = scale_word(norm2, sum_abs, block_, bits_);
    if (scale_bits == poisoned_scale) std::memset(bits, 0, bits_ / 8);
    wire::detail::store_le(scales + 4 * b, scale_bits, 4);
  }

  template <class T>
  void unhash_block(const view& v, std::uint64_t b, float* u, span<T> out, float alpha) const {
    const std::uint64_t first = b * block_;
    const std::uint64_t count = std::min<std::uint64_t>(block_, out.size() - first);
    const auto scale_bits = static_cast<std::uint32_t>(wire::detail::load_le(v.scales + 4 * b, 4));
    if (scale_bits == poisoned_scale) {
      for (std::uint64_t k = 0; k < count; ++k) gradzip::detail::accumulate(out[first + k], std::nan(""), alpha);
      return;
    }
    const projection p = projection_of(v.ctx, b);
    // x^ = R^T (scale B / m) S^T sign, R^T = product over rounds, last first, of D_r H / sqrt(B),
    // computed as D_r H (u / sqrt(B)): the first 1 / sqrt(B) is in the magnitude, each next one
    // joins the previous round's D_r (a sign flip commutes with the rounding of a product).
    const float magnitude = decode_magnitude(scale_bits, sqrt_block(), bits_);
    const float inverse_sqrt = inverse_sqrt_of(sqrt_block());
    std::fill(u, u + block_, 0.0f);
    const std::uint8_t* bits = v.codes + b * (bits_ / 8);
    for (std::uint32_t i = 0; i < bits_; ++i) {
      u[p.row(i, block_)] = ((bits[i / 8] >> (i % 8)) & 1u) != 0 ? -magnitude : magnitude;
    }
    for (std::uint32_t r = rounds; r-- > 0;) {
      transform::hadamard::walsh_hadamard(u, block_);
      flip_and_scale(u, p, r, r > 0 ? inverse_sqrt : 1.0f);
    }
    for (std::uint64_t k = 0; k < count; ++k) gradzip::detail::accumulate(out[first + k], u[k], alpha);
  }

  /// The format's summation order for the block's |x|^2 and the sampled rows' sum of |z|, so a
  /// GPU warp reproduces them bit for bit: lane l (of 32) adds terms l, l + 32, ... in order, in
  /// double, then lanes l and l + offset are added for offset = 16, 8, 4, 2, 1 (a shuffle-down
  /// tree); the result is lane 0's.
  template <class Term>
  static double lane_sum(std::uint32_t count, Term term) {
    return gradzip::detail::lane_sum<double>(count, term);
  }

  /// v <- D_r v factor, 64 elements per sign word; the sign as a flip of the sign bit (a
  /// multiply by +-1 would compile into a branch that mispredicts on every other element).
  void flip_and_scale(float* v, const projection& p, std::uint32_t r, float factor) const {
    for (std::uint32_t w = 0; w < block_ / 64 + (block_ % 64 != 0 ? 1 : 0); ++w) {
      const std::uint64_t signs = p.sign_word(r, w);
      const std::uint32_t end = std::min<std::uint32_t>(block_, 64 * w + 64);
      for (std::uint32_t k = 64 * w; k < end; ++k) {
        const auto flip = static_cast<std::uint32_t>(signs >> (k & 63)) << 31;
        v[k] = gradzip::detail::bit_cast<float>(gradzip::detail::bit_cast<std::uint32_t>(v[k] * factor) ^ flip);
      }
    }
  }

  /// Validates a payload of this configuration for n elements of T.
  template <class T>
  view parse(span<const std::byte> bytes, std::uint64_t n) const {
    const wire::header h = wire::read_header(bytes, "simhash");  // also verifies a CRC-32C, if sealed
    const auto* base = reinterpret_cast<const std::uint8_t*>(bytes.data());
    frame f;
    wire::throw_if_failed(check_frame(h, base, n, element_traits<T>::type, block_, bits_, seed_, f), "simhash");
    const view v{base + f.scales, base + f.codes, f.ctx};
    for (std::uint64_t b = 0; b < block_count(n); ++b) wire::throw_if_failed(check_block(v.scales, v.codes, b, bits_), "simhash");
    return v;
  }

  /// f(b, v) for every block b of an n-element tensor, v a block of float scratch per thread.
  template <class F>
  void each_block(host& exec, std::uint64_t n, F f) const {
    const std::uint64_t blocks = block_count(n);
    const std::size_t chunks = std::min<std::size_t>(static_cast<std::size_t>(std::max(1, exec.threads())),
                                                     std::max<std::size_t>(1, gradzip::detail::chunk_count(exec, n)));
    auto* scratch = reinterpret_cast<float*>(exec.scratch(chunks * block_ * sizeof(float)));
    gradzip::detail::for_each_chunk(exec, chunks, [&](std::size_t c) {
      const auto r = gradzip::detail::chunk_of(blocks, chunks, c);
      for (std::uint64_t b = r.begin; b < r.end; ++b) f(b, scratch + c * block_);
    });
  }

  std::uint32_t block_;
  std::uint32_t bits_;
  std::uint64_t seed_;
};

}  // namespace gradzip::hash
