/**
 * @file sparse_cost.hpp
 * @brief Zen's cost model for synchronizing sparse gradients, and the choice it implies among
 * dense allreduce, sparse allgather, Balanced Parallelism and Hierarchical Centralization.
 *
 * Zen (OSDI 2025, section 2.3) models communication time as bytes received over bandwidth:
 * Balanced Parallelism receives (P - 1) / P (nnz + u_P) entries per rank, Hierarchical
 * Centralization receives u_1 + u_2 + u_4 + ... + u_{P/2}, where u_k is the size of the union of
 * k ranks' nonzeros (Zen's densification gamma_k = u_k / nnz). gradzip's model adds what its
 * wire adds: each message's bytes come from the encoding `encode::automatic` would pick (COO,
 * bitmap or delta-varint, over the message's universe: n, or n / P for a part), 4 bytes per
 * value and a 160-byte frame per part. It also adds a latency per round of messages and a cost
 * per message (Zen's model has neither; they decide between the schemes when nonzeros are few
 * and ranks many). With those, `estimate` reproduces the bytes `sparse_sync`
 * measures (docs/sparse_sync.md), and extrapolates them to other rank counts from a profile.
 *
 * @code
 * gradzip::comm::sparsity_profile profile{n, 8, 40000.0, {40000.0, 70000.0, 110000.0, 150000.0}};
 * gradzip::comm::link_model link{5e-6, 12.5e9, 5e-7};   // 5 us a round, 100 Gb/s, 0.5 us a message
 * gradzip::comm::scheme_costs costs = gradzip::comm::estimate(profile, link);
 * std::printf("best: %s\n", gradzip::comm::name(costs.best));
 * @endcode
 */
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "gradzip/core/error.hpp"

namespace gradzip::comm {

/// A network's cost: a round of concurrent messages costs `latency_s`, each message a rank
/// sends costs `message_s` more (injection, matching), and every byte 1 / `bytes_per_s`.
struct link_model {
  double latency_s = 5e-6;
  double bytes_per_s = 12.5e9;
  double message_s = 5e-7;
};

/// What the model needs to know of a step's sparsity. unions[k] is the size of the union of the
/// nonzeros of 2^k ranks (unions[0] = nnz, the mean per rank), for 2^k <= ranks, and the last
/// entry is the union over all `ranks` ranks when `ranks` is not a power of two. `sparse_sync`
/// measures it (sparse_sync::profile).
struct sparsity_profile {
  std::uint64_t n = 0;
  int ranks = 1;
  double nnz = 0.0;
  std::vector<double> unions;
};

enum class sync_choice { dense_allreduce, allgather, balanced_parallelism, hierarchical_centralization };

inline const char* name(sync_choice c) {
  switch (c) {
    case sync_choice::dense_allreduce: return "dense allreduce";
    case sync_choice::allgather: return "sparse allgather";
    case sync_choice::balanced_parallelism: return "Zen Balanced Parallelism";
    case sync_choice::hierarchical_centralization: return "Zen Hierarchical Centralization";
  }
  return "?";
}

/// Bytes received per rank and time per step of each scheme.
struct scheme_costs {
  double bytes[4] = {0, 0, 0, 0};    ///< indexed by sync_choice
  double seconds[4] = {0, 0, 0, 0};  ///< indexed by sync_choice
  sync_choice best = sync_choice::dense_allreduce;
};

namespace detail {

/// Bytes of one gradzip sparse message of k entries over a universe of u indices: the smallest
/// index encoding (COO u32 or u64, the bitmap, or delta-varint at its expected gap), the values,
/// and the frame.
inline double message_bytes(double k, double u) {
  if (k <= 0.0) return 160.0;
  const double coo = k * (u < 4294967296.0 ? 4.0 : 8.0);
  const double bitmap = std::ceil(u / 64.0) * 8.0;
  const double gap = u / k;  // mean gap: its length class decides delta-varint's bytes
  const double delta = k * (gap < 256.0 ? 1.25 : gap < 65536.0 ? 2.25 : gap < 16777216.0 ? 3.25 : 4.25) +
                       std::ceil(k / 1024.0) * 16.0;
  return std::fmin(coo, std::fmin(bitmap, delta)) + 4.0 * k + 160.0;
}

/// The union of 2^s ranks' nonzeros, from the profile (the last entry past its end).
inline double union_of(const sparsity_profile& p, int s) {
  return static_cast<std::size_t>(s) < p.unions.size() ? p.unions[static_cast<std::size_t>(s)] : p.unions.back();
}

}  // namespace detail

/**
 * The model's bytes received per rank and time of each scheme for `p`, on `link`:
 * - dense: an allreduce of 4n bytes at the bandwidth optimum, 2 (P - 1) / P x 4n, in 2 log2 P
 *   rounds of one message (Rabenseifner's reduce-scatter and allgather);
 * - allgather: the other ranks' sparse messages over n, P - 1 messages in log2 P rounds;
 * - Balanced Parallelism: P - 1 parts of nnz / P and P - 1 reduced parts of u_P / P, over n / P,
 *   2 (P - 1) messages in 2 rounds (the alltoallv, the allgather);
 * - Hierarchical Centralization: one message per stage, of u_{2^{s-1}} over n (log2 q stages,
 *   q the largest power of two <= P, plus a fold and an unfold stage when P is not one).
 */
inline scheme_costs estimate(const sparsity_profile& p, const link_model& link) {
  GRADZIP_EXPECTS(p.ranks >= 1, "estimate: ranks must be >= 1, got ", p.ranks);
  GRADZIP_EXPECTS(!p.unions.empty(), "estimate: the profile has no unions");
  GRADZIP_EXPECTS(link.bytes_per_s > 0 && link.latency_s >= 0, "estimate: bad link (", link.latency_s, " s, ",
                  link.bytes_per_s, " B/s)");
  const double P = p.ranks, n = static_cast<double>(p.n);
  std::uint64_t q = 1;
  while (q * 2 <= static_cast<std::uint64_t>(p.ranks)) q *= 2;
  const double stages = std::log2(static_cast<double>(q));
  const double u_all = p.unions.back();
  scheme_costs c;
  auto set = [&](sync_choice s, double bytes, double rounds, double messages) {
    c.bytes[static_cast<int>(s)] = bytes;
    c.seconds[static_cast<int>(s)] = rounds * link.latency_s + messages * link.message_s + bytes / link.bytes_per_s;
  };
  const double log_p = std::ceil(std::log2(P));
  set(sync_choice::dense_allreduce, 2.0 * (P - 1.0) / P * 4.0 * n, 2.0 * log_p, 2.0 * log_p);
  set(sync_choice::allgather, (P - 1.0) * detail::message_bytes(p.nnz, n), log_p, P - 1.0);
  set(sync_choice::balanced_parallelism,
      (P - 1.0) * (detail::message_bytes(p.nnz / P, n / P) + detail::message_bytes(u_all / P, n / P)), 2.0,
      2.0 * (P - 1.0));
  double hierarchy = 0.0;
  for (int s = 0; s < static_cast<int>(stages); ++s) hierarchy += detail::message_bytes(detail::union_of(p, s), n);
  double rounds = stages;
  if (q != static_cast<std::uint64_t>(p.ranks)) {  // fold and unfold
    hierarchy += detail::message_bytes(p.nnz, n) + detail::message_bytes(u_all, n);
    rounds += 2.0;
  }
  set(sync_choice::hierarchical_centralization, hierarchy, rounds, rounds);
  for (int s = 1; s < 4; ++s) {
    if (c.seconds[s] < c.seconds[static_cast<int>(c.best)]) c.best = static_cast<sync_choice>(s);
  }
  return c;
}

/// The profile at another rank count: the same nnz per rank, and unions from the model
/// u_k = U (1 - (1 - nnz / U)^k), with the effective universe U fitted to the largest measured
/// union (ranks draw their nonzeros independently from U indices). When no U <= n fits (a
/// profile of one rank, whose only union is its nnz, among them), U = n.
inline sparsity_profile extrapolate(const sparsity_profile& measured, int ranks) {
  GRADZIP_EXPECTS(ranks >= 1, "extrapolate: ranks must be >= 1, got ", ranks);
  GRADZIP_EXPECTS(!measured.unions.empty() && measured.ranks >= 1 && measured.n >= 1,
                  "extrapolate: the measured profile needs n >= 1, ranks >= 1 and its unions (n = ", measured.n,
                  ", ranks = ", measured.ranks, ", ", measured.unions.size(), " unions)");
  const double nnz = measured.nnz, k = measured.ranks, u = measured.unions.back();
  // Solve U (1 - (1 - nnz / U)^k) = u for U in [u, n] by bisection (the left side grows with U).
  double lo = std::fmax(u, nnz), hi = static_cast<double>(measured.n);
  const auto f = [&](double U) { return U * (1.0 - std::pow(1.0 - nnz / U, k)) - u; };
  if (f(hi) > 0.0) {
    for (int it = 0; it < 200; ++it) {
      const double mid = 0.5 * (lo + hi);
      (f(mid) > 0.0 ? hi : lo) = mid;
    }
  } else {
    lo = hi;
  }
  const double U = lo;
  sparsity_profile out{measured.n, ranks, nnz, {}};
  for (std::int64_t level = 1; level <= ranks; level *= 2) {
    out.unions.push_back(U * (1.0 - std::pow(1.0 - nnz / U, static_cast<double>(level))));
  }
  if ((ranks & (ranks - 1)) != 0) out.unions.push_back(U * (1.0 - std::pow(1.0 - nnz / U, ranks)));
  return out;
}

}  // namespace gradzip::comm
