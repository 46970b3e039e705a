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

/// With ratio > 0: min(n, max(1, ceil(ratio n))) (0 for n = 0). Else `count`, which must not
/// exceed n.
inline std::uint64_t kept_count(std::uint64_t count, double ratio, std::uint64_t n, const char* who) {
  if (ratio > 0.0) {
    if (n == 0) return 0;
    const double k = std::ceil(ratio * static_cast<double>(n));
    return k >= static_cast<double>(n) ? n : (k < 1.0 ? 1 : static_cast<std::uint64_t>(k));
  }
  GRADZIP_EXPECTS(count <= n, who, ": k = ", count, " exceeds the tensor's element count ", n);
  return count;
}

}  // namespace gradzip::sparsify::detail
