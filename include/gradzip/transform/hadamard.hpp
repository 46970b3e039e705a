/**
 * @file hadamard.hpp
 * @brief `transform::hadamard`, the randomized Hadamard rotation of blocks, and
 * `transform::rotated<Codec>`, any codec applied to the rotated gradient.
 *
 * Each block of B elements (B a power of two) is rotated by R = H D / sqrt(B): D flips the sign
 * of element i when bit 0 of hash64(seed, i) is set, H is the B x B Walsh-Hadamard matrix
 * (a fast transform: B log2 B additions, nothing stored). R is orthogonal, so R^-1 = D H /
 * sqrt(B). A trailing partial block is zero-padded to B. Rotating spreads a block's energy over
 * all its coordinates, so the max-min range of uniform quantization and the norm-relative levels
 * of QSGD fit heavy-tailed gradients far better (Suresh et al., "Distributed mean estimation with
 * limited communication", ICML 2017; THC, NSDI 2024).
 *
 * `rotated<Codec>` compresses R x with `Codec` (over the padded length, as fp32) and decodes by
 * decoding, rotating back and accumulating. Its payload nests the inner payload: codec id
 * 01 00 00 00 (transform 1: Hadamard), the header's element count n and type, a params section
 * (u32 block, u32 0, u64 seed) and a values section holding the inner codec's whole payload for
 * the padded length. Host executor, and CUDA for blocks up to 8192 (detail/cuda/hadamard.cuh).
 *
 * @code
 * using q4 = gradzip::codec<gradzip::sparsify::none, gradzip::quantize::uniform<4>, gradzip::encode::none>;
 * gradzip::transform::rotated<q4> c{q4{}, gradzip::transform::hadamard{1024, seed}};
 * std::vector<std::byte> out(c.max_compressed_bytes<float>(n));
 * out.resize(c.compress(exec, gradzip::span<const float>(grad), out));
 * c.decompress_add(exec, gradzip::span<const std::byte>(out), gradzip::span<float>(accum));
 * @endcode
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gradzip/codec.hpp"
#include "gradzip/core/error.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/detail/host/parallel.hpp"
#include "gradzip/detail/values.hpp"
#include "gradzip/random/hash.hpp"
#include "gradzip/wire/reader.hpp"
#include "gradzip/wire/writer.hpp"

namespace gradzip::detail {
/// `rotated<Codec>` on executors other than the host's (detail/cuda/hadamard.cuh for `cuda`).
template <class Exec>
struct rotation_backend;
}  // namespace gradzip::detail

namespace gradzip::transform {

class hadamard {
 public:
  static constexpr std::uint8_t id = 1;

  explicit hadamard(std::uint32_t block = 1024, std::uint64_t seed = 0x4ad) : block_(block), seed_(seed) {
    GRADZIP_EXPECTS(block >= 2 && block <= (1u << 16) && (block & (block - 1)) == 0,
                    "hadamard: block must be a power of two in [2, 65536], got ", block);
  }

  std::uint32_t block() const noexcept { return block_; }
  std::uint64_t seed() const noexcept { return seed_; }
  /// n rounded up to whole blocks.
  std::uint64_t padded(std::uint64_t n) const { return (n + block_ - 1) / block_ * block_; }

  /// In place, unnormalized: v <- H v for B = `size` (a power of two). H H = B I.
  static void walsh_hadamard(float* v, std::uint32_t size) {
    std::uint32_t half = 1;
    if (size >= 8) {  // the first three stages as 8-point transforms in registers (short loops are slow)
      for (std::uint32_t start = 0; start < size; start += 8) eight_points(v + start);
      half = 8;
    }
    for (; half < size; half *= 2) {  // the rest: long inner loops, which vectorize
      for (std::uint32_t start = 0; start < size; start += 2 * half) {
        float* __restrict__ low = v + start;  // the two halves never overlap
        float* __restrict__ high = v + start + half;
        for (std::uint32_t j = 0; j < half; ++j) {
          const float a = low[j], b = high[j];
          low[j] = a + b;
          high[j] = a - b;
        }
      }
    }
  }

  /// An 8-point Walsh-Hadamard transform (three radix-2 stages) in place.
  static void eight_points(float* v) {
    const float a0 = v[0] + v[1], a1 = v[0] - v[1], a2 = v[2] + v[3], a3 = v[2] - v[3];
    const float a4 = v[4] + v[5], a5 = v[4] - v[5], a6 = v[6] + v[7], a7 = v[6] - v[7];
    const float b0 = a0 + a2, b1 = a1 + a3, b2 = a0 - a2, b3 = a1 - a3;
    const float b4 = a4 + a6, b5 = a5 + a7, b6 = a4 - a6, b7 = a5 - a7;
    v[0] = b0 + b4;
    v[1] = b1 + b5;
    v[2] = b2 + b6;
    v[3] = b3 + b7;
    v[4] = b0 - b4;
    v[5] = b1 - b5;
    v[6] = b2 - b6;
    v[7] = b3 - b7;
  }

  /// y <- R x: y has padded(n) elements, x's n are read and the rest taken as zero.
  template <class T>
  void forward(host& exec, span<const T> x, span<float> y) const {
    GRADZIP_EXPECTS(y.size() == padded(x.size()), "hadamard::forward: output has ", y.size(), " elements, expected ",
                    padded(x.size()));
    const float scale = 1.0f / std::sqrt(static_cast<float>(block_));
    each_block(exec, y.size(), [&](std::uint64_t b) {
      float* v = y.data() + b * block_;
      const T* data = x.data();  // a local: stores into v cannot change it
      const std::uint64_t n = x.size();
      for (std::uint32_t j = 0; j < block_; ++j) {
        const std::uint64_t i = b * block_ + j;
        v[j] = i < n ? with_sign(static_cast<float>(to_float(data[i])), i) : 0.0f;
      }
      walsh_hadamard(v, block_);
      for (std::uint32_t j = 0; j < block_; ++j) v[j] *= scale;
    });
  }

  /// y <- R^-1 y in place (padded(n) elements): the padding comes back as (near) zero.
  void inverse(host& exec, span<float> y) const {
    GRADZIP_EXPECTS(y.size() % block_ == 0, "hadamard::inverse: ", y.size(), " elements is not whole blocks of ", block_);
    const float scale = 1.0f / std::sqrt(static_cast<float>(block_));
    each_block(exec, y.size(), [&](std::uint64_t b) {
      float* v = y.data() + b * block_;
      walsh_hadamard(v, block_);
      for (std::uint32_t j = 0; j < block_; ++j) v[j] = with_sign(v[j] * scale, b * block_ + j);
    });
  }

 private:
  /// v with its sign flipped when D's entry i is -1: a flip of the sign bit, since a multiply by
  /// +-1 compiles into a branch that mispredicts on every other element.
  float with_sign(float v, std::uint64_t i) const { return signed_by(seed_, v, i); }

 public:
  /// v with D's sign for element i applied (shared by every executor).
  GRADZIP_HOST_DEVICE static float signed_by(std::uint64_t seed, float v, std::uint64_t i) {
    const auto bits = gradzip::detail::bit_cast<std::uint32_t>(v) ^ (static_cast<std::uint32_t>(hash64(seed, i) & 1) << 31);
    return gradzip::detail::bit_cast<float>(bits);
  }

 private:

  template <class F>
  void each_block(host& exec, std::uint64_t size, F f) const {
    const std::uint64_t blocks = size / block_;
    const std::size_t chunks = gradzip::detail::chunk_count(exec, size);
    gradzip::detail::for_each_chunk(exec, chunks, [&](std::size_t c) {
      const auto r = gradzip::detail::chunk_of(blocks, chunks, c);
      for (std::uint64_t b = r.begin; b < r.end; ++b) f(b);
    });
  }

  std::uint32_t block_;
  std::uint64_t seed_;
};

template <class Codec>
class rotated {
 public:
  static constexpr wire::codec_id id{hadamard::id, 0, 0, 0};
  static constexpr std::uint64_t params_bytes = 16;

  rotated(Codec inner, hadamard rotation) : inner_(inner), rotation_(rotation) {}

  const Codec& inner() const noexcept { return inner_; }
  const hadamard& rotation() const noexcept { return rotation_; }

  template <class T>
  std::size_t max_compressed_bytes(std::size_t n) const {
    return layout(inner_.template max_compressed_bytes<float>(rotation_.padded(n))).total_bytes();
  }

  /// Scratch `compress` and `decompress_add` need for n elements of T (reserve it up front).
  template <class T>
  std::size_t workspace_bytes(host& exec, std::size_t n) const {
    const std::uint64_t padded = rotation_.padded(n);
    return scratch_offset(exec, padded) + padded * sizeof(float);
  }

  /// Header and params of a payload whose inner payload has `inner_bytes` bytes.
  GRADZIP_HOST_DEVICE static void write_frame(std::uint8_t* base, std::uint64_t inner_bytes, element_type type,
                                              std::uint64_t n, std::uint32_t block, std::uint64_t seed) {
    const wire::payload_layout l = layout(inner_bytes);
    wire::write_header(base, l, type, id, n);
    std::uint8_t* params = base + l.at(0).offset;
    for (std::uint64_t b = 0; b < params_bytes; ++b) params[b] = 0;
    wire::detail::store_le(params, block, 4);
    wire::detail::store_le(params + 8, seed, 8);
    wire::zero_section_padding(base, l);
  }

  /// Checks a parsed outer header for n elements against (block, seed); `inner` receives the
  /// inner payload's offset and size.
  GRADZIP_HOST_DEVICE static wire::status check_frame(const wire::header& h, const std::uint8_t* base, std::uint64_t n,
                                                      std::uint32_t block, std::uint64_t seed, std::uint64_t& inner_at,
                                                      std::uint64_t& inner_size) {
    const wire::tag tags[2] = {wire::tag::params, wire::tag::values};
    const wire::status frame_ok = wire::expect_frame(h, id.packed(), tags, 2, params_bytes);
    if (!frame_ok.ok()) return frame_ok;
    const std::uint8_t* p = base + h.sections[0].offset;
    const wire::param_field fields[2] = {{0, 4, block}, {8, 8, seed}};
    const wire::status params_ok = wire::expect_params(base, h.sections[0].offset, fields, 2);
    if (!params_ok.ok()) return params_ok;
    if (wire::detail::load_le(p + 4, 4) != 0) {
      return wire::fail(wire::format_errc::nonzero_reserved, h.sections[0].offset + 4);
    }
    if (h.element_count != n) return wire::fail(wire::format_errc::size_mismatch, h.element_count, n);
    inner_at = h.sections[1].offset;
    inner_size = h.sections[1].size;
    // Where compress puts it, right after the fixed params: the CUDA decoder reads it there.
    if (inner_at != inner_offset()) return wire::fail(wire::format_errc::section_misaligned, 1, inner_at);
    // The values section is exactly the inner payload (its own checks follow in its decoder).
    wire::header inner;
    const wire::status nested = wire::parse_header(base + inner_at, inner_size, inner);
    if (!nested.ok()) return nested;
    if (inner.total_bytes != inner_size) return wire::fail(wire::format_errc::bad_section_size, 1, inner_size, inner.total_bytes);
    return wire::status{};
  }

  /// The offset of the inner payload in every rotated payload (the params section is fixed).
  GRADZIP_HOST_DEVICE static std::uint64_t inner_offset() { return layout(0).at(1).offset; }

  /// On another executor (CUDA: device buffers; detail/cuda/hadamard.cuh).
  template <class T, class Exec, std::enable_if_t<!std::is_same_v<Exec, host>, int> = 0>
  std::size_t workspace_bytes(Exec& exec, std::size_t n) const {
    return gradzip::detail::rotation_backend<Exec>::template workspace_bytes<T>(*this, exec, n);
  }
  template <class Exec, class T, std::enable_if_t<!std::is_same_v<Exec, host>, int> = 0>
  std::size_t compress(Exec& exec, span<const T> input, span<std::byte> out, quantize::compress_context ctx = {}) const {
    return gradzip::detail::rotation_backend<Exec>::compress(*this, exec, input, out, ctx);
  }
  template <class Exec, class T, std::enable_if_t<!std::is_same_v<Exec, host>, int> = 0>
  void decompress_add(Exec& exec, span<const std::byte> payload, span<T> accum, float alpha = 1.0f) const {
    gradzip::detail::rotation_backend<Exec>::decompress_add(*this, exec, payload, accum, alpha, false);
  }
  template <class Exec, class T, std::enable_if_t<!std::is_same_v<Exec, host>, int> = 0>
  void decompress(Exec& exec, span<const std::byte> payload, span<T> out) const {
    gradzip::detail::rotation_backend<Exec>::decompress_add(*this, exec, payload, out, 1.0f, true);
  }

  /// Rotates `input` (into scratch), compresses it with the inner codec, returns the size.
  template <class T>
  std::size_t compress(host& exec, span<const T> input, span<std::byte> out, quantize::compress_context ctx = {}) const {
    const std::uint64_t n = input.size(), padded = rotation_.padded(n);
    GRADZIP_EXPECTS(out.size() >= layout(0).total_bytes(), "rotated::compress: output holds ", out.size(), " bytes");
    float* y = rotated_scratch(exec, padded);
    rotation_.forward(exec, input, span<float>(y, padded));
    // The inner payload goes where the values section starts; its size sets the section's.
    const std::uint64_t inner_at = layout(0).at(1).offset;
    GRADZIP_EXPECTS(out.size() >= inner_at, "rotated::compress: output too small");
    const std::size_t inner_bytes = inner_.compress(exec, span<const float>(y, padded),
                                                    span<std::byte>(out.data() + inner_at, out.size() - inner_at), ctx);
    write_frame(reinterpret_cast<std::uint8_t*>(out.data()), inner_bytes, element_traits<T>::type, n, rotation_.block(),
                rotation_.seed());
    return layout(inner_bytes).total_bytes();
  }

  /// accum <- accum + alpha * R^-1 decode(inner payload); validated before anything is written.
  template <class T>
  void decompress_add(host& exec, span<const std::byte> payload, span<T> accum, float alpha = 1.0f) const {
    apply(exec, parse(payload, accum.size()), accum, alpha, false);
  }

  /// out <- R^-1 decode(inner payload); a bad payload (outer or inner) leaves `out` as it was.
  template <class T>
  void decompress(host& exec, span<const std::byte> payload, span<T> out) const {
    apply(exec, parse(payload, out.size()), out, 1.0f, true);
  }

 private:
  GRADZIP_HOST_DEVICE static wire::payload_layout layout(std::uint64_t inner_bytes) {
    wire::payload_layout l;
    l.add(wire::tag::params, params_bytes);
    l.add(wire::tag::values, inner_bytes);
    return l;
  }

  /// Decodes the (outer-validated) inner payload into scratch, which validates it, rotates it
  /// back, and only then writes `out`: added to it, or over it as 0 + y (decompress's bytes).
  template <class T>
  void apply(host& exec, span<const std::byte> inner, span<T> out, float alpha, bool overwrite) const {
    const std::uint64_t padded = rotation_.padded(out.size());
    float* y = rotated_scratch(exec, padded);
    inner_.decompress(exec, inner, span<float>(y, padded));
    rotation_.inverse(exec, span<float>(y, padded));
    // As every codec accumulates (detail::accumulate): in double into a double output.
    const T zero = from_double<T>(0.0);
    for (std::size_t i = 0; i < out.size(); ++i) {
      T sum = overwrite ? zero : out[i];
      gradzip::detail::accumulate(sum, y[i], alpha);
      out[i] = sum;
    }
  }

  /// Scratch for the rotated vector, placed after what the inner codec uses: its compress
  /// workspace, and its decoder's per-chunk records (at most one chunk per thread, each well
  /// under 64 bytes), which must not overlap the vector it decodes into.
  float* rotated_scratch(host& exec, std::uint64_t padded) const {
    const std::size_t at = scratch_offset(exec, padded);
    return reinterpret_cast<float*>(exec.scratch(at + padded * sizeof(float)) + at);
  }

  std::size_t scratch_offset(host& exec, std::uint64_t padded) const {
    const std::size_t inner = std::max<std::size_t>(inner_.template workspace_bytes<float>(exec, padded),
                                                    4096 + static_cast<std::size_t>(exec.threads()) * 64);
    return gradzip::detail::scratch_aligned(inner);
  }

  /// The inner payload of a validated outer frame for n elements.
  span<const std::byte> parse(span<const std::byte> payload, std::uint64_t n) const {
    const wire::header h = wire::read_header(payload, "rotated");
    std::uint64_t at = 0, size = 0;
    wire::throw_if_failed(check_frame(h, reinterpret_cast<const std::uint8_t*>(payload.data()), n, rotation_.block(),
                                      rotation_.seed(), at, size),
                          "rotated");
    return payload.subspan(at, size);
  }

  Codec inner_;
  hadamard rotation_;
};

}  // namespace gradzip::transform
