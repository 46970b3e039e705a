// A seeded, heavy-tailed synthetic gradient, the same on every machine.
//
// Real gradients are heavy-tailed (a few large entries carry most of the norm), vary in scale
// by orders of magnitude between layers, and hold exact zeros (dead ReLUs, unused embedding
// rows). This generator reproduces all three, deterministically from (seed, index):
//
//   layer   = index / 65536                      (layers of 2^16 parameters)
//   scale   = 1e-3 * exp(0.8 * N_layer)          (log-normal per-layer scale)
//   x_index = 0                      with probability 5 %
//           = scale * t_3            otherwise   (Student's t with 3 degrees of freedom)
//
// All randomness comes from Philox4x32-10 (gradzip::philox_for), normals from Box-Muller.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "gradzip/random/philox.hpp"

namespace gradzip_tools {

inline double normal_from(std::uint32_t a, std::uint32_t b) {
  const double u1 = (static_cast<double>(a) + 1.0) / 4294967297.0;  // (0, 1]
  const double u2 = static_cast<double>(b) / 4294967296.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

/// Element i of the synthetic gradient with the given seed.
inline double synthetic_gradient_at(std::uint64_t seed, std::uint64_t i) {
  const auto layer = gradzip::philox_for(seed, 0xFFFFFFFFu, 1, i / 65536);
  const double scale = 1e-3 * std::exp(0.8 * normal_from(layer[0], layer[1]));
  const auto r = gradzip::philox_for(seed, 0, 0, i);
  if (r[0] % 100 < 5) return 0.0;
  const auto r2 = gradzip::philox_for(seed, 1, 0, i);
  const double z = normal_from(r[1], r[2]);
  const double c1 = normal_from(r[3], r2[0]);
  const double c2 = normal_from(r2[1], r2[2]);
  const double c3 = normal_from(r2[3], r[0]);
  return scale * z / std::sqrt((c1 * c1 + c2 * c2 + c3 * c3) / 3.0);
}

template <class T = float>
std::vector<T> synthetic_gradient(std::size_t n, std::uint64_t seed) {
  std::vector<T> g(n);
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(n); ++i) {
    g[i] = static_cast<T>(synthetic_gradient_at(seed, static_cast<std::uint64_t>(i)));
  }
  return g;
}

}  // namespace gradzip_tools
