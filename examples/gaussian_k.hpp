// A structure stage written outside the library (docs/extending.md): Gaussian-k. It keeps the
// elements with |x| >= tau, where tau = mu + z * sigma of |x| over the tensor, estimated in one
// pass (Shi et al., "Understanding Top-k Sparsification in Distributed Deep Learning", 2019,
// model gradients as near-Gaussian so that a threshold from the mean and deviation stands in
// for an exact top-k). The count depends on the data. Non-finite values always pass, as with
// the library's own thresholds: nothing is dropped silently. Host executor only (a user
// structure stage has no CUDA path yet); uses only public gradzip names.
#pragma once

#include <cmath>
#include <cstdint>

#include <gradzip/gradzip.hpp>

namespace example {

struct gaussian_k {
  static constexpr std::uint8_t id = gradzip::stage::first_user_id;  // structure ids: their own byte
  static constexpr bool summable = false;         // each worker keeps other indices
  static constexpr bool explicit_indices = true;  // the indices stage writes them
  static constexpr bool data_dependent_count = true;

  float z = 2.0f;  ///< tau = mean + z * deviation of |x| (z = 2: about 5 % of a Gaussian's mass)

  /// The bound compress sizes its output for: every element.
  std::uint64_t selected_count(std::uint64_t n) const { return n; }

  /// tau for x, from the mean and variance of |x| (double sums, finite values only).
  template <class T>
  float tau(gradzip::span<const T> x) const {
    double sum = 0.0, squares = 0.0;
    std::uint64_t finite = 0;
    for (const T& v : x) {
      const double a = std::fabs(static_cast<double>(gradzip::to_float(v)));
      if (!std::isfinite(a)) continue;
      sum += a;
      squares += a * a;
      ++finite;
    }
    if (finite == 0) return INFINITY;
    const double mean = sum / static_cast<double>(finite);
    const double variance = std::fmax(squares / static_cast<double>(finite) - mean * mean, 0.0);
    return static_cast<float>(mean + static_cast<double>(z) * std::sqrt(variance));
  }

  /// Whether v is kept at threshold t: |v| >= t, or v not finite.
  static bool keep(float v, float t) { return !(std::fabs(v) < t); }

  template <class T>
  std::uint64_t count(gradzip::span<const T> x) const {
    const float t = tau(x);
    std::uint64_t k = 0;
    for (const T& v : x) k += keep(gradzip::to_float(v), t) ? 1 : 0;
    return k;
  }

  /// sink(pos, index, value) for the kept elements in index order; tau is recomputed exactly as
  /// count computed it, so exactly `k` are kept.
  template <class T, class Sink>
  void select(gradzip::span<const T> x, std::uint64_t k, const Sink& sink) const {
    const float t = tau(x);
    std::uint64_t pos = 0;
    for (std::uint64_t i = 0; i < x.size() && pos < k; ++i) {
      if (keep(gradzip::to_float(x[i]), t)) sink(pos++, i, x[i]);
    }
  }
};

}  // namespace example
