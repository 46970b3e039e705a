/**
 * @file sparse_sync_auto.hpp
 * @brief `comm::auto_sparse_sync`: Zen's profile-then-choose. The first steps run Balanced
 * Parallelism and measure the sparsity; from then on each step runs the scheme Zen's cost model
 * (comm/sparse_cost.hpp) finds fastest on the given link: dense allreduce, sparse allgather,
 * Balanced Parallelism or Hierarchical Centralization.
 *
 * Zen (Wang et al., OSDI 2025, section 4) profiles the first iterations, because a model's
 * density and the overlap of its ranks' nonzeros are stable over training. What the profile
 * holds:
 * - the mean nonzeros per rank, nnz, and the union of all ranks' nonzeros, u_P
 *   (`sparse_sync_traffic::union_entries`), each averaged over the profiling steps and over
 *   the ranks with one 16-byte allreduce, so that every rank holds the same numbers and makes
 *   the same choice;
 * - the unions of 2, 4, ... ranks, which the hierarchy's cost needs, from comm::extrapolate's
 *   overlap model fitted to u_P (ranks drawing their nonzeros from a common effective universe).
 *
 * The dense choice scatters the nonzeros into an n-element buffer and allreduces it as f32; with
 * a communicator that sums in rank order it gives the same bits as the sparse schemes (but for the
 * sign of a -0.0 in `out` at an index no rank sent: + 0.0 makes it +0.0).
 *
 * @code
 * gradzip::comm::auto_sparse_sync zen(n, comm.size(), gradzip::comm::link_model{5e-6, 12.5e9, 5e-7});
 * zen.run(comm, exec, indices, values, accum, 1.0f / comm.size());   // step 0: profiles, then chooses
 * std::printf("%s\n", gradzip::comm::name(zen.choice()));
 * @endcode
 */
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "gradzip/comm/sparse_cost.hpp"
#include "gradzip/comm/sparse_sync.hpp"

namespace gradzip::comm {

/// On executor Exec (host, or cuda with device indices, values, output and buffers: gradzip.cuh).
template <class Exec>
class basic_auto_sparse_sync {
 public:
  /// For gradients of n elements over `ranks` ranks on `link`; `seed` keys Zen's partition;
  /// the first `profile_steps` steps profile (with Balanced Parallelism).
  basic_auto_sparse_sync(std::uint64_t n, int ranks, link_model link, std::uint64_t seed = 0, int profile_steps = 1)
      : sync_(n, ranks, seed), link_(link), profile_steps_(profile_steps) {
    GRADZIP_EXPECTS(profile_steps >= 1, "auto_sparse_sync: profile_steps must be >= 1, got ", profile_steps);
    GRADZIP_EXPECTS(link.bytes_per_s > 0 && std::isfinite(link.bytes_per_s) && link.latency_s >= 0 &&
                        link.message_s >= 0,
                    "auto_sparse_sync: bad link (latency ", link.latency_s, " s, ", link.bytes_per_s, " B/s, ",
                    link.message_s, " s per message)");
  }

  /// out[i] += alpha * (the sum over ranks of their value at i), as sparse_sync::run. Collective.
  void run(communicator& comm, Exec& exec, span<const std::uint64_t> indices, span<const float> values,
           span<float> out, float alpha = 1.0f) {
    if (!profiled()) {
      sync_.run(comm, exec, indices, values, out, alpha, sparse_scheme::balanced_parallelism);
      observe(comm, exec, static_cast<double>(indices.size()), static_cast<double>(sync_.last_traffic().union_entries));
      dense_bytes_ = 0;
      return;
    }
    dense_bytes_ = 0;
    switch (choice_) {
      case sync_choice::dense_allreduce: return run_dense(comm, exec, indices, values, out, alpha);
      case sync_choice::allgather: return sync_.run(comm, exec, indices, values, out, alpha, sparse_scheme::allgather);
      case sync_choice::balanced_parallelism:
        return sync_.run(comm, exec, indices, values, out, alpha, sparse_scheme::balanced_parallelism);
      case sync_choice::hierarchical_centralization:
        return sync_.run(comm, exec, indices, values, out, alpha, sparse_scheme::hierarchical_centralization);
    }
  }

  /// Whether the profile is complete (and choice() decided).
  bool profiled() const noexcept { return steps_ >= profile_steps_; }
  /// The scheme steps use after the profile.
  sync_choice choice() const {
    GRADZIP_EXPECTS(profiled(), "auto_sparse_sync::choice: still profiling (", steps_, " of ", profile_steps_,
                    " steps run)");
    return choice_;
  }
  /// The model's estimate for every scheme, from the profile.
  const scheme_costs& costs() const {
    GRADZIP_EXPECTS(profiled(), "auto_sparse_sync::costs: still profiling");
    return costs_;
  }
  /// The profile the choice came from (nnz and u_P measured; the other unions from the model).
  const sparsity_profile& profile() const {
    GRADZIP_EXPECTS(profiled(), "auto_sparse_sync::profile: still profiling");
    return profile_;
  }
  /// Profile again from the next step (after the sparsity changed: a new phase of training).
  void reprofile() {
    steps_ = 0;
    nnz_sum_ = union_sum_ = 0.0;
  }
  /// The sparse schemes' traffic in the last step (zero after a dense step; see last_dense_bytes).
  const sparse_sync_traffic& last_traffic() const noexcept { return sync_.last_traffic(); }
  /// Bytes of the last step's dense allreduce buffer (4n), or 0 after a sparse step.
  std::uint64_t last_dense_bytes() const noexcept { return dense_bytes_; }
  const basic_sparse_sync<Exec>& sync() const noexcept { return sync_; }

 private:
  /// Adds one step to the profile; after the last profiling step, chooses.
  void observe(communicator& comm, Exec& exec, double nnz, double union_entries) {
    double sums[2] = {nnz, union_entries};
    sync_.allreduce_host(comm, exec, sums, 2);  // every rank then holds the same numbers
    const double ranks = static_cast<double>(sync_.ranks());
    nnz_sum_ += sums[0] / ranks;
    union_sum_ += sums[1] / ranks;
    if (++steps_ < profile_steps_) return;
    const double steps = static_cast<double>(profile_steps_);
    const sparsity_profile measured{sync_.size(), sync_.ranks(), nnz_sum_ / steps, {union_sum_ / steps}};
    profile_ = extrapolate(measured, sync_.ranks());
    profile_.unions.back() = measured.unions.back();  // u_P as measured, the others from the model
    costs_ = estimate(profile_, link_);
    choice_ = costs_.best;
  }

  void run_dense(communicator& comm, Exec& exec, span<const std::uint64_t> indices, span<const float> values,
                 span<float> out, float alpha) {
    dense_bytes_ = sync_.run_dense(comm, exec, indices, values, out, alpha, "auto_sparse_sync");
  }

  basic_sparse_sync<Exec> sync_;
  link_model link_;
  int profile_steps_;
  int steps_ = 0;
  double nnz_sum_ = 0.0, union_sum_ = 0.0;
  sparsity_profile profile_;
  scheme_costs costs_;
  sync_choice choice_ = sync_choice::balanced_parallelism;
  std::uint64_t dense_bytes_ = 0;
};

/// Zen's profile-then-choose on the host executor.
using auto_sparse_sync = basic_auto_sparse_sync<host>;

}  // namespace gradzip::comm
