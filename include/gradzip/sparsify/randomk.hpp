/**
 * @file randomk.hpp
 * @brief `sparsify::randomk`: k elements chosen from (seed, step, tensor id) alone; no indices
 * on the wire, and payloads of different workers for the same step are summable.
 *
 * Random-k (Stich, Cordonnier, Jaggi, "Sparsified SGD with memory", NeurIPS 2018; GRACE's
 * RandomK). gradzip samples **stratified**: the n elements are cut into k strata
 * [s_j, s_{j+1}) with s_j = floor(j n / k), and stratum j contributes exactly one element,
 * chosen uniformly from Philox keyed by the seed (XOR a domain constant, so a stochastic values
 * stage with the same seed draws unrelated numbers) with counter (j, step, tensor id):
 *
 *     index_j = s_j + floor(r_j x (s_{j+1} − s_j) / 2^64),   r_j = the block's first two words
 *
 * So the selection is exactly k, without replacement, and already in increasing order: one O(k)
 * pass with no shuffle and no sort. Element i of stratum j is chosen with probability
 * 1 / len_j (len_j = s_{j+1} − s_j, n / k rounded down or up); with `scaled` (the default) the
 * decoder multiplies value j by len_j, so E[decoded] = x exactly (n / k when k divides n). The
 * scaling happens at decode time, which keeps the payload values themselves summable: the sum
 * of several workers' payloads (same seed, step and tensor id) is the payload of the summed
 * gradients. The mapping's bias from r_j's finite range is below len_j / 2^64.
 *
 * Wire: the structure's parameters (after the count) are u64 seed, u32 step, u32 tensor id,
 * u8 scaled (0 or 1), 7 zero bytes; then the values section with k values. No indices section.
 *
 * @code
 * using rk = gradzip::codec<gradzip::sparsify::randomk, gradzip::quantize::none, gradzip::encode::none>;
 * rk c{gradzip::sparsify::randomk::ratio(0.01, seed)};
 * c.compress(exec, gradzip::span<const float>(grad), out, {step, tensor_id});   // same seed, step, tensor id everywhere
 * @endcode
 */
#pragma once

#include <cmath>
#include <cstdint>

#include "gradzip/core/config.hpp"
#include "gradzip/core/error.hpp"
#include "gradzip/quantize/bucket_stats.hpp"
#include "gradzip/sparsify/kept_count.hpp"
#include "gradzip/random/philox.hpp"
#include "gradzip/wire/errc.hpp"
#include "gradzip/wire/format.hpp"

namespace gradzip::sparsify {

class randomk {
 public:
  static constexpr std::uint8_t id = 2;
  static constexpr bool explicit_indices = false;
  /// The indices are recomputed from the parameters: none travel.
  static constexpr bool implicit_indices = true;
  /// Same seed, step and tensor id select the same indices on every worker.
  static constexpr bool summable = true;
  static constexpr std::uint64_t param_bytes = 24;
  /// XORed into the seed so that random-k and a stochastic values stage never share a stream.
  static constexpr std::uint64_t seed_domain = 0x52414E444F4D4B31ull;  // "RANDOMK1"

  constexpr randomk() = default;

  /// Exactly k elements (compressing fewer than k elements is an error).
  static randomk count(std::uint64_t k, std::uint64_t seed, bool scaled = true) {
    return randomk(k, 0.0, seed, scaled);
  }
  /// k = min(n, ceil(r n)) elements, r in (0, 1].
  static randomk ratio(double r, std::uint64_t seed, bool scaled = true) {
    return randomk(0, detail::checked_ratio(r, "randomk"), seed, scaled);
  }

  std::uint64_t seed() const noexcept { return seed_; }
  bool scaled() const noexcept { return scaled_; }

  std::uint64_t selected_count(std::uint64_t n) const {
    return detail::kept_count(count_, ratio_, n, "randomk");
  }

  /// The parameters of a compression at `ctx` (step, tensor id).
  void write_params(std::uint8_t* p, quantize::compress_context ctx) const {
    wire::detail::store_le(p, seed_, 8);
    wire::detail::store_le(p + 8, ctx.step, 4);
    wire::detail::store_le(p + 12, ctx.tensor_id, 4);
    p[16] = scaled_ ? 1 : 0;
    for (int i = 17; i < 24; ++i) p[i] = 0;
  }

  GRADZIP_HOST_DEVICE static wire::status check_params(const std::uint8_t* p, std::uint64_t at) {
    if (p[16] > 1) return wire::fail(wire::format_errc::bad_params, at + 16, p[16], wire::no_expected_value);  // 0 or 1
    for (int i = 17; i < 24; ++i) {
      if (p[i] != 0) return wire::fail(wire::format_errc::nonzero_reserved, at + i);
    }
    return {};
  }

  /// s_j = floor(j n / k) = j q + floor(j r / k) with n = q k + r, exact for j <= k; j r fits
  /// 64 bits while k < 2^32, and 128-bit arithmetic covers larger k.
  GRADZIP_HOST_DEVICE static std::uint64_t stratum_begin(std::uint64_t n, std::uint64_t k, std::uint64_t j) {
    const std::uint64_t q = n / k, r = n % k;
    if (k < (std::uint64_t{1} << 32)) return j * q + j * r / k;
    return j * q + static_cast<std::uint64_t>(static_cast<gradzip::detail::uint128>(j) * r / k);
  }

  /// The tensor index of payload element j (0 <= j < k <= n).
  GRADZIP_HOST_DEVICE static std::uint64_t index_of(const std::uint8_t* p, std::uint64_t n,
                                                    std::uint64_t k, std::uint64_t j) {
    const std::uint64_t begin = stratum_begin(n, k, j);
    const std::uint64_t length = stratum_begin(n, k, j + 1) - begin;
    const philox_words w = philox_for(wire::detail::load_le(p, 8) ^ seed_domain,
                                      static_cast<std::uint32_t>(wire::detail::load_le(p + 8, 4)),
                                      static_cast<std::uint32_t>(wire::detail::load_le(p + 12, 4)), j);
    const std::uint64_t r = (static_cast<std::uint64_t>(w[1]) << 32) | w[0];
    return begin + gradzip::detail::mul_hi64(r, length);
  }

  /// The factor value j is multiplied by on decode: its stratum's length when scaled, else 1.
  /// In double: a length above 2^24 is not a float.
  GRADZIP_HOST_DEVICE static double value_scale(const std::uint8_t* p, std::uint64_t n, std::uint64_t k,
                                                std::uint64_t j) {
    if (p[16] == 0) return 1.0;
    return static_cast<double>(stratum_begin(n, k, j + 1) - stratum_begin(n, k, j));
  }

 private:
  constexpr randomk(std::uint64_t k, double r, std::uint64_t seed, bool scaled)
      : count_(k), ratio_(r), seed_(seed), scaled_(scaled) {}
  std::uint64_t count_ = 0;
  double ratio_ = 0.01;  // > 0: k is a ratio of n (the default, 1 %); else count_
  std::uint64_t seed_ = 0;
  bool scaled_ = true;
};

}  // namespace gradzip::sparsify
