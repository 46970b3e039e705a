// The format's canonical order for a sum of many terms, shared by every stage that writes one
// into a payload (SimHash's norms, PowerSGD's products and Gram-Schmidt): lane l of 32 adds
// terms l, l + 32, l + 64, ... in order, each with its own rounding, then the lanes combine in
// the tree lane[l] += lane[l + offset] for offset = 16, 8, 4, 2, 1. That tree is lane 0 of a
// warp's xor (or down) shuffle reduction, so a CUDA warp reproduces the sum bit for bit.
#pragma once

#include <cstdint>

#include "gradzip/core/config.hpp"

namespace gradzip::detail {

/// Combines 32 lane partials in the canonical tree; returns lane 0's (the lanes are consumed).
template <class F>
GRADZIP_HOST_DEVICE inline F lane_tree(F (&lanes)[32]) {
  for (int offset = 16; offset >= 1; offset /= 2) {
    for (int l = 0; l < offset; ++l) lanes[l] = add_rn(lanes[l], lanes[l + offset]);
  }
  return lanes[0];
}

/// The canonical sum of term(0 .. count), in F (float or double), on one host thread.
template <class F, class Term>
F lane_sum(std::uint64_t count, Term term) {
  F lanes[32] = {};
  std::uint64_t base = 0;
  for (; base + 32 <= count; base += 32) {
    for (int l = 0; l < 32; ++l) lanes[l] = add_rn(lanes[l], static_cast<F>(term(base + static_cast<std::uint64_t>(l))));
  }
  for (int l = 0; l < 32 && base + static_cast<std::uint64_t>(l) < count; ++l) {
    lanes[l] = add_rn(lanes[l], static_cast<F>(term(base + static_cast<std::uint64_t>(l))));
  }
  return lane_tree(lanes);
}

}  // namespace gradzip::detail
