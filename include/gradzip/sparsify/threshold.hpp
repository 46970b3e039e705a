/**
 * @file threshold.hpp
 * @brief `sparsify::threshold`: keeps every element with |x| >= tau; the count is data-dependent.
 *
 * Threshold sparsification (Strom 2015, "Scalable distributed DNN training using commodity GPU
 * cloud computing"; GRACE's Threshold). The payload lists the kept indices (an explicit index
 * stage, e.g. `encode::coo`) in increasing order with their values. NaN is kept, as top-k ranks
 * it above +inf, so a diverging gradient stays visible. The comparison is exact: for float and
 * half tensors tau is rounded **up** to the next float, so |x| >= tau holds in float exactly
 * when it holds for the real numbers; double tensors compare in double.
 *
 * How many elements pass is known only after a pass over the data: `max_compressed_bytes`
 * is the bound for all n, and `compress` returns the payload's actual size. On the host the
 * selection reads the input twice (count per chunk, then emit); on CUDA it counts per tile,
 * scans the tile counts on the device, and then synchronizes once to learn the count, because
 * the payload's size and layout depend on it (the only host synchronization of any compress).
 *
 * @code
 * gradzip::codec<gradzip::sparsify::threshold> c{gradzip::sparsify::threshold{1e-3}};
 * std::vector<std::byte> out(c.max_compressed_bytes<float>(n));           // the bound
 * std::size_t bytes = c.compress(exec, gradzip::span<const float>(grad), gradzip::span<std::byte>(out));  // the size
 * @endcode
 */
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "gradzip/core/config.hpp"
#include "gradzip/core/error.hpp"

namespace gradzip::sparsify {

class threshold {
 public:
  static constexpr std::uint8_t id = 3;
  static constexpr bool explicit_indices = true;
  static constexpr bool summable = false;
  /// The selected count is known only after reading the data.
  static constexpr bool data_dependent_count = true;

  /// tau: a finite threshold >= 0 (0 keeps everything).
  explicit threshold(double tau) : tau_(tau) {
    GRADZIP_EXPECTS(std::isfinite(tau) && tau >= 0.0, "threshold: tau must be finite and >= 0, got ", tau);
  }
  threshold() = default;

  double tau() const noexcept { return tau_; }

  /// The bound the payload is sized for: every element.
  std::uint64_t selected_count(std::uint64_t n) const { return n; }

  /// f(t) with t = tau as a double for double tensors, else tau_float().
  template <class T, class F>
  void visit_tau(F&& f) const {
    if constexpr (std::is_same_v<T, double>) {
      f(tau_);
    } else {
      f(tau_float());
    }
  }

  /// tau rounded up to a float, so that `|x| >= tau_float()` in float is the exact comparison.
  float tau_float() const {
    float t = static_cast<float>(tau_);
    if (static_cast<double>(t) < tau_) t = std::nextafter(t, std::numeric_limits<float>::infinity());
    return t;
  }

 private:
  double tau_ = 0.0;
};

namespace detail {
/// Whether x is kept: |x| >= t, or x is NaN (written so that NaN passes).
GRADZIP_HOST_DEVICE inline bool passes(float x, float t) { return !(fabsf(x) < t); }
GRADZIP_HOST_DEVICE inline bool passes(double x, double t) { return !(fabs(x) < t); }

/// The threshold as a selection loop compares against it. A threshold held in device memory
/// (sampled top-k's key, hashed top-k's tau) overloads this to read it once per thread, before
/// the loop, rather than once per element; a value is its own operand.
template <class Tau>
GRADZIP_HOST_DEVICE inline Tau threshold_operand(Tau t) {
  return t;
}
}  // namespace detail

}  // namespace gradzip::sparsify
