// The number of elements a k-keeping sparsifier (top-k, random-k) keeps: a count, or a ratio of n.
#pragma once

#include <cmath>
#include <cstdint>

#include "gradzip/core/error.hpp"

namespace gradzip::sparsify::detail {

/// Checks a ratio r in (0, 1]; `who` names the sparsifier in the message.
inline double checked_ratio(double r, const char* who) {
  GRADZIP_EXPECTS(r > 0.0 && r <= 1.0, who, ": ratio must be in (0, 1], got ", r);
  return r;
}

/// With ratio > 0: min(n, max(1, ceil(ratio n))) (0 for n = 0), where a product below 2^40 that
/// is within 2^-50 of itself above a whole number counts as that number: the double nearest a
/// decimal ratio is often a little above it (0.07 is 0.07000000000000000666), and 0.07 of 100
/// keeps 7, not 8. Else `count`, which must not exceed n.
inline std::uint64_t kept_count(std::uint64_t count, double ratio, std::uint64_t n, const char* who) {
  if (ratio > 0.0) {
    if (n == 0) return 0;
    const double product = ratio * static_cast<double>(n);
    const double k = std::ceil(product < 0x1p40 ? product - product * 0x1p-50 : product);
    return k >= static_cast<double>(n) ? n : (k < 1.0 ? 1 : static_cast<std::uint64_t>(k));
  }
  GRADZIP_EXPECTS(count <= n, who, ": k = ", count, " exceeds the tensor's element count ", n);
  return count;
}

}  // namespace gradzip::sparsify::detail
