/**
 * @file sparse_sync.hpp
 * @brief `comm::sparse_sync`: Zen's Balanced Parallelism (Wang et al., "Zen: Empowering
 * Distributed Training with Sparsity-driven Data Synchronization", OSDI 2025), a sparse
 * allreduce whose bytes per rank do not grow with the rank count.
 *
 * Every index i < n belongs to one part, p = h0(i) (`hash::partition`), owned by rank p. Part
 * p's index set I_p is fixed, so an index travels as its position among I_p's members, in
 * |I_p| ~ n / P positions. One step, for this rank's nonzeros (sorted indices and values):
 *
 * 1. split the nonzeros by part (exactly, by the hash: nothing overflows or is dropped);
 * 2. alltoallv: part p goes to rank p, its positions as COO, delta-varint or a bitmap over I_p,
 *    whichever is smallest (`encode::automatic` over the member space);
 * 3. rank p validates every part it received, then sums them into its member space in rank
 *    order: the sum of each index has one fixed order, so results repeat bit for bit;
 * 4. rank p encodes its reduced part (the union of the received positions, the hash bitmap
 *    when it is dense, and their sums) and every rank allgathers the P reduced parts;
 * 5. every rank validates all P reduced parts, then adds alpha times each to its dense output.
 *
 * Each rank sends about nnz + |union of part p| entries and receives about the same, against
 * (P - 1) nnz for an allgather of sparse payloads. `sparse_scheme::hierarchical_centralization`
 * (Zen's other optimal scheme: recursive doubling) and `sparse_scheme::allgather` (the baseline)
 * run through the same call; comm/sparse_cost.hpp's model says which one to use
 * (docs/sparse_sync.md). Bad bytes raise `gradzip::format_error`
 * naming the rank that sent them, on every rank, and leave the output unchanged: a rank that
 * cannot merge a part says so in its reduced part, so that no rank waits in a collective its
 * peers have left. Host executor; the communicator's buffers are host memory.
 *
 * Memory: 12 bytes per index of [0, n) for the member tables (built once), plus per step the
 * parts (sized by the nonzeros) and a sum and a flag per index of the universe the step sums
 * over (5 bytes on the host, 12 on the GPU with the flags' offsets): n / P for Balanced
 * Parallelism, n for the allgather scheme and the GPU's hierarchy. The GPU also expands each
 * received payload's positions, 8 bytes per entry.
 *
 * @code
 * gradzip::comm::sparse_sync zen(n, comm.size(), seed);
 * std::vector<std::uint64_t> indices = {3, 17, 40};   // this rank's nonzeros, increasing, < n
 * std::vector<float> values = {0.5f, -1.0f, 2.0f};
 * zen.run(comm, exec, indices, values, accum, 1.0f / comm.size());   // accum += the average
 * @endcode
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "gradzip/comm/collective.hpp"
#include "gradzip/comm/sparse_cost.hpp"
#include "gradzip/comm/zen_part.hpp"
#include "gradzip/detail/host/sparse_sync.hpp"

namespace gradzip::comm {

/// Bytes this rank moved in the last step, by phase (its own part, which stays local, excluded).
struct sparse_sync_traffic {
  std::uint64_t scatter_sent = 0, scatter_received = 0;  ///< step 2 (alltoallv); the hierarchy's stages
  std::uint64_t gather_sent = 0, gather_received = 0;    ///< step 4: the reduced part, to each of P - 1 ranks
  std::uint64_t union_entries = 0;                       ///< indices in the union of all ranks' nonzeros
  std::uint64_t sent() const { return scatter_sent + gather_sent; }
  std::uint64_t received() const { return scatter_received + gather_received; }
};

// comm::nonzeros (sparse_sync's input from a dense vector) is in detail/host/sparse_sync.hpp.

/// How sparse_sync moves the nonzeros.
enum class sparse_scheme {
  balanced_parallelism,          ///< Zen: parts to their owners (alltoallv), reduced parts back (allgather)
  hierarchical_centralization,   ///< Zen: recursive doubling, the whole aggregate at each of log2 P stages
  allgather,                     ///< the baseline: every rank's nonzeros to every rank
};

/**
 * Zen's sparse synchronization on executor Exec: `host` (this header), or `cuda`
 * (gradzip.cuh, detail/cuda/sparse_sync.cuh), where indices, values, the output and the
 * communicator's buffers are device memory. Both give the same bytes on the wire and the same
 * output bits. `comm::sparse_sync` is the host one.
 */
template <class Exec>
class basic_sparse_sync {
  using engine = detail::zen_engine<Exec>;

 public:
  /// For gradients of n elements over `ranks` ranks; `seed` keys h0 (the same on every rank).
  /// Builds the member tables: O(n) hashes, 12 bytes per element (and a device copy on cuda).
  basic_sparse_sync(std::uint64_t n, int ranks, std::uint64_t seed = 0)
      : n_(n), ranks_(ranks), tables_(n, ranks, seed), engine_(tables_) {
    const auto parts = static_cast<std::size_t>(ranks);
    sizes_.resize(parts);
    theirs_.resize(parts);
    gathered_sizes_.resize(parts);
    views_.resize(parts);
  }

  std::uint64_t size() const noexcept { return n_; }
  int ranks() const noexcept { return ranks_; }
  const hash::partition& partition() const noexcept { return tables_.partition; }
  /// |I_p|: how many indices part p owns.
  std::uint64_t members(std::uint32_t p) const { return tables_.members_of(p); }
  const sparse_sync_traffic& last_traffic() const noexcept { return traffic_; }
  /// After a hierarchical_centralization step on a rank below the largest power of two q <= P:
  /// the size of its aggregate after each doubling stage, that is the union of the nonzeros of
  /// 2, 4, ..., q ranks (what Zen's cost model calls densification, times this rank's nnz).
  const std::vector<std::uint64_t>& hierarchy_levels() const noexcept { return levels_; }

  /// The sparsity profile Zen's cost model needs (comm/sparse_cost.hpp), from the last
  /// hierarchical_centralization step on this rank: its nnz and the unions of 2, 4, ..., P
  /// ranks. Only when P is a power of two: otherwise the stages carry folded-in ranks, and their
  /// sizes are not the unions the model wants.
  sparsity_profile profile() const {
    GRADZIP_EXPECTS((ranks_ & (ranks_ - 1)) == 0, "sparse_sync::profile: needs a power-of-two rank count, got ", ranks_);
    GRADZIP_EXPECTS(!union_.empty(), "sparse_sync::profile: no hierarchical_centralization step has run");
    sparsity_profile p{n_, ranks_, static_cast<double>(union_[0]), {}};
    for (std::uint64_t u : union_) p.unions.push_back(static_cast<double>(u));
    return p;
  }

  /// run's argument checks, naming `what` (the caller) in the message: the communicator's size,
  /// as many values as indices, indices increasing and below n, and an output of n elements.
  void check_arguments(const communicator& comm, Exec& exec, span<const std::uint64_t> indices,
                       span<const float> values, span<float> out, const char* what) const {
    GRADZIP_EXPECTS(comm.size() == ranks_, what, ": communicator has ", comm.size(), " ranks, built for ", ranks_);
    GRADZIP_EXPECTS(indices.size() == values.size(), what, ": ", indices.size(), " indices and ", values.size(),
                    " values");
    GRADZIP_EXPECTS(out.size() == n_, what, ": output has ", out.size(), " elements, expected ", n_);
    engine::check_indices(exec, indices, n_, what);
  }

  /// out[i] += alpha * (the sum over ranks of their value at i), for the union of the ranks'
  /// nonzeros. `indices` are this rank's nonzeros, increasing and < n, with `values` beside
  /// them. Collective: every rank calls it in the same step. Bad arguments throw
  /// invalid_argument before any communication; a bad part or reduced part throws format_error
  /// naming the rank that sent it, on every rank, with `out` unchanged.
  void run(communicator& comm, Exec& exec, span<const std::uint64_t> indices, span<const float> values,
           span<float> out, float alpha = 1.0f, sparse_scheme scheme = sparse_scheme::balanced_parallelism) {
    check_arguments(comm, exec, indices, values, out, "sparse_sync");
    // Before any communication, so that no rank fails alone in the middle of the step.
    const std::uint64_t universe = scheme == sparse_scheme::balanced_parallelism ? largest_part() : n_;
    GRADZIP_EXPECTS(universe <= engine::max_universe, "sparse_sync: this executor sums over at most ",
                    engine::max_universe, " indices at a time; the scheme needs ", universe,
                    " (n = ", n_, ", ranks = ", ranks_, ")");
    me_ = static_cast<std::uint32_t>(comm.rank());
    traffic_ = {};
    failure_ = wire::status{};
    failure_rank_ = 0;
    if (scheme == sparse_scheme::hierarchical_centralization) {
      run_hierarchy(comm, exec, indices, values, out, alpha);
      return;
    }
    if (scheme == sparse_scheme::allgather) {
      engine::assign(exec, aggregate_, indices, values);
      engine::resize(exec, mine_, 0);
      encode(exec, static_cast<std::uint32_t>(ranks_), 2, n_, aggregate_, 0, aggregate_.size(), mine_);
      gather(comm, exec);
      apply_whole(comm, exec, out, alpha);
      return;
    }
    scatter(comm, exec, indices, values);
    reduce(exec);
    gather(comm, exec);
    apply(comm, exec, out, alpha);
  }

  /// As run, for this rank's gradient given densely: its nonzero entries (NaN included, zeros
  /// of either sign not) are what it sends. `dense` (n elements) is then scratch, its contents
  /// lost; `out` (n elements, not overlapping it) <- alpha * the sum over ranks, replaced, and
  /// unchanged when a bad message throws. Zen's route for a sparsifier's decoded selection
  /// (planned_allreducer's sparse_sync route).
  void sum_nonzeros(communicator& comm, Exec& exec, span<float> dense, span<float> out, float alpha = 1.0f,
                    sparse_scheme scheme = sparse_scheme::balanced_parallelism) {
    GRADZIP_EXPECTS(dense.size() == n_ && out.size() == n_, "sparse_sync::sum_nonzeros: dense has ", dense.size(),
                    " elements and out ", out.size(), ", expected ", n_);
    engine_.nonzeros(exec, span<const float>(dense.data(), dense.size()), input_);
    engine::zero(exec, dense);
    run(comm, exec, span<const std::uint64_t>(input_.position_data(), input_.size()),
        span<const float>(input_.value_data(), input_.size()), dense, alpha, scheme);
    engine::copy(exec, span<const float>(dense.data(), dense.size()), out);
  }

  /// The dense baseline through the same arguments: the nonzeros scattered into an n-element
  /// buffer, allreduced as f32, and out[i] += alpha buffer[i] for every i (so a -0.0 in `out`
  /// at an index no rank sent becomes +0.0). With a communicator that sums in rank order it
  /// gives the sparse schemes' bits. Returns the bytes allreduced (4n).
  std::uint64_t run_dense(communicator& comm, Exec& exec, span<const std::uint64_t> indices, span<const float> values,
                          span<float> out, float alpha = 1.0f, const char* what = "sparse_sync::run_dense") {
    check_arguments(comm, exec, indices, values, out, what);
    float* dense = engine_.densify(exec, indices, values, n_);
    engine::hand_over(exec, comm);
    comm.allreduce_sum(dense, static_cast<std::size_t>(n_), element_type::f32);
    engine::take_back(exec, comm);
    engine_.add_dense(exec, out, alpha);
    return 4 * n_;
  }

  /// values[0 .. count) (host memory) <- their sum over the ranks, in f64 (every rank then holds
  /// the same numbers: auto_sparse_sync's profile).
  void allreduce_host(communicator& comm, Exec& exec, double* values, std::size_t count) {
    engine_.allreduce_host(comm, exec, values, count);
  }

 private:
  std::uint64_t largest_part() const {
    std::uint64_t most = 0;
    for (std::uint32_t p = 0; p < static_cast<std::uint32_t>(ranks_); ++p) most = std::max(most, members(p));
    return most;
  }

  /// What a rank rejected, for the verdicts: the kinds of message.
  enum class failure_kind : std::uint8_t { part = 0, reduced_part = 1, payload = 2, stage_payload = 3 };

  // Step 1 and 2: split by part, encode each part, exchange.
  void scatter(communicator& comm, Exec& exec, span<const std::uint64_t> indices, span<const float> values) {
    engine_.split(exec, tables_, indices, values, split_, first_);
    engine::resize(exec, send_, 0);
    frames_.clear();
    for (std::uint32_t p = 0; p < static_cast<std::uint32_t>(ranks_); ++p) {
      frames_.push_back(frame(p, 0, members(p), first_[p + 1] - first_[p]));
    }
    engine_.encode_all(exec, frames_, split_, first_, send_, sizes_);
    for (std::uint32_t p = 0; p < static_cast<std::uint32_t>(ranks_); ++p) {
      if (p != me_) traffic_.scatter_sent += sizes_[p];
    }
    exchange_bytes(comm, exec);
    for (std::uint32_t r = 0; r < static_cast<std::uint32_t>(ranks_); ++r) {
      if (r != me_) traffic_.scatter_received += theirs_[r];
    }
  }

  /// alltoallv of send_ (sizes_ per rank) into recv_ (theirs_ per rank).
  void exchange_bytes(communicator& comm, Exec& exec) {
    comm.alltoall_sizes(span<const std::uint64_t>(sizes_), span<std::uint64_t>(theirs_));
    std::uint64_t total = 0;
    for (std::uint64_t t : theirs_) total += t;
    engine::resize(exec, recv_, total);
    engine::hand_over(exec, comm);
    comm.alltoallv_bytes(span<const std::byte>(engine::data(send_), send_.size()), span<const std::uint64_t>(sizes_),
                         span<std::byte>(engine::data(recv_), recv_.size()), span<const std::uint64_t>(theirs_));
    engine::take_back(exec, comm);
  }

  /// The frame of part p's payload from this rank (its encoding and index bytes left to the
  /// engine). A failure report carries no entries.
  detail::zen_part frame(std::uint32_t p, std::uint8_t phase, std::uint64_t universe, std::uint64_t k,
                         const wire::status& failure = {}, std::uint32_t culprit = 0) const {
    detail::zen_part z;
    z.part = p;
    z.sender = me_;
    z.phase = phase;
    z.failed = failure.ok() ? 0 : 1;
    z.code = static_cast<std::uint16_t>(failure.code);
    z.culprit = failure.ok() ? 0 : culprit;
    z.members = universe;
    z.k = failure.ok() ? k : 0;
    return z;
  }

  /// Appends part p's payload (entries l[at, at + k), positions increasing and < universe) to
  /// `to`; returns its size.
  std::uint64_t encode(Exec& exec, std::uint32_t p, std::uint8_t phase, std::uint64_t universe,
                       const typename engine::list& l, std::uint64_t at, std::uint64_t k,
                       typename engine::bytes& to, const wire::status& failure = {}, std::uint32_t culprit = 0) {
    frames_.assign(1, frame(p, phase, universe, k, failure, culprit));
    frame_at_.assign(1, at);
    engine_.encode_all(exec, frames_, l, frame_at_, to, frame_sizes_);
    return frame_sizes_[0];
  }

  // Step 3: validate every received part, then sum them in rank order; a bad one is reported
  // in the reduced part instead.
  void reduce(Exec& exec) {
    const std::uint64_t m = members(me_);
    expects_.clear();
    std::uint64_t at = 0;
    for (std::uint32_t r = 0; r < static_cast<std::uint32_t>(ranks_); ++r) {
      expects_.push_back({at, theirs_[r], me_, r, 0, m});
      at += theirs_[r];
    }
    engine_.check_all(exec, recv_, expects_, static_cast<std::uint32_t>(ranks_), views_, verdicts_of_);
    for (std::uint32_t r = 0; r < static_cast<std::uint32_t>(ranks_); ++r) note_failure(verdicts_of_[r], r, failure_kind::part);
    if (failure_.ok()) {
      engine_.sum(exec, views_, m);
      engine_.compact(exec, m, reduced_);
    } else {
      engine::assign(exec, reduced_, {}, {});
    }
    engine::resize(exec, mine_, 0);
    encode(exec, me_, 1, m, reduced_, 0, reduced_.size(), mine_, failure_, failure_rank_);
  }

  // Step 4: every rank's reduced part.
  void gather(communicator& comm, Exec& exec) {
    traffic_.gather_sent = static_cast<std::uint64_t>(mine_.size()) * static_cast<std::uint64_t>(ranks_ - 1);
    comm.allgather_sizes(static_cast<std::uint64_t>(mine_.size()), span<std::uint64_t>(gathered_sizes_));
    std::uint64_t total = 0;
    for (std::size_t r = 0; r < gathered_sizes_.size(); ++r) {
      total += gathered_sizes_[r];
      if (r != static_cast<std::size_t>(comm.rank())) traffic_.gather_received += gathered_sizes_[r];
    }
    engine::resize(exec, gathered_, total);
    engine::hand_over(exec, comm);
    comm.allgatherv_bytes(span<const std::byte>(engine::data(mine_), mine_.size()),
                          span<std::byte>(engine::data(gathered_), gathered_.size()),
                          span<const std::uint64_t>(gathered_sizes_));
    engine::take_back(exec, comm);
  }

  /// Checks the P payloads of gathered_ (phase 1: reduced parts; 2: whole payloads), noting
  /// the first failure.
  void check_gathered(Exec& exec, std::uint8_t phase, failure_kind kind) {
    expects_.clear();
    std::uint64_t at = 0;
    for (std::uint32_t q = 0; q < static_cast<std::uint32_t>(ranks_); ++q) {
      const std::uint32_t part = phase == 1 ? q : static_cast<std::uint32_t>(ranks_);
      expects_.push_back({at, gathered_sizes_[q], part, q, phase, phase == 1 ? members(q) : n_});
      at += gathered_sizes_[q];
    }
    engine_.check_all(exec, gathered_, expects_, static_cast<std::uint32_t>(ranks_), views_, verdicts_of_);
    for (std::uint32_t q = 0; q < static_cast<std::uint32_t>(ranks_); ++q) note_failure(verdicts_of_[q], q, kind);
  }

  // Step 5: validate all reduced parts (and what their owners report), agree, then apply them.
  void apply(communicator& comm, Exec& exec, span<float> out, float alpha) {
    check_gathered(exec, 1, failure_kind::reduced_part);
    // An owner's report of a part it rejected (this rank's own rejection is noted already).
    for (std::uint32_t q = 0; q < static_cast<std::uint32_t>(ranks_); ++q) {
      const detail::zen_part& z = views_[q].frame;
      if (z.failed != 0) note_failure(wire::fail(static_cast<wire::format_errc>(z.code)), z.culprit, failure_kind::part);
    }
    agree(comm);
    for (std::uint32_t q = 0; q < static_cast<std::uint32_t>(ranks_); ++q) {
      traffic_.union_entries += views_[q].frame.k;
      engine_.apply_part(exec, tables_, q, views_[q], out, alpha);
    }
  }

  // The allgather scheme: validate every rank's payload, then sum them in rank order.
  void apply_whole(communicator& comm, Exec& exec, span<float> out, float alpha) {
    check_gathered(exec, 2, failure_kind::payload);
    agree(comm);
    engine_.sum(exec, views_, n_);
    traffic_.union_entries = engine_.apply_sums(exec, out, alpha);
  }

  static const char* kind_name(std::uint64_t kind) {
    switch (kind) {
      case 0: return "part";
      case 1: return "reduced part";
      case 2: return "payload";
      case 3: return "stage payload";
      default: return "message";
    }
  }

  /// Keeps the first failure of the step.
  void note_failure(const wire::status& s, std::uint32_t sender, failure_kind kind) {
    if (s.ok() || !failure_.ok()) return;
    failure_ = s;
    failure_rank_ = sender;
    failure_kind_ = kind;
  }

  /// Every rank's verdict on what it received (8 bytes each, allgathered), so that all ranks
  /// throw, naming the sender, or none does: a message damaged on its way to one rank only must
  /// not leave the others applying the step. This rank's own failure comes first, with its
  /// full message.
  void agree(communicator& comm) {
    const std::uint64_t mine =
        failure_.ok() ? 0
                      : std::uint64_t{1} << 63 | static_cast<std::uint64_t>(failure_kind_) << 56 |
                            (static_cast<std::uint64_t>(failure_.code) & 0xFFFFFFu) << 32 | failure_rank_;
    verdicts_.resize(static_cast<std::size_t>(ranks_));
    comm.allgather_sizes(mine, span<std::uint64_t>(verdicts_));
    if (!failure_.ok()) {
      fail(failure_, gradzip::detail::concat("sparse_sync: the ", kind_name(static_cast<std::uint64_t>(failure_kind_)),
                                             " from rank ", failure_rank_));
    }
    for (std::uint32_t r = 0; r < static_cast<std::uint32_t>(ranks_); ++r) {
      const std::uint64_t v = verdicts_[r];
      if (v == 0) continue;
      const auto code = static_cast<wire::format_errc>((v >> 32) & 0xFFFFFFu);
      throw format_error(code, gradzip::detail::concat("sparse_sync: rank ", r, " rejected the ",
                                                       kind_name((v >> 56) & 0x7Fu), " from rank ", v & 0xFFFFFFFFu,
                                                       ": ", wire::describe(code)));
    }
  }

  // Hierarchical Centralization (Zen's Definition 7; SparCML's recursive doubling): over the
  // largest power of two q <= P, log2 q stages in which rank r and rank r xor 2^s swap their
  // aggregates and both merge them, the lower rank's aggregate first (so every rank adds the
  // same operands in the same order, and ends with the same bits).
  // Ranks q .. P - 1 first hand their nonzeros to rank r - q and get the result back at the end.
  // Each stage is one alltoallv with a single nonempty part. A bad stage payload is carried
  // forward as a failure, and the verdicts (agree) make all ranks throw.
  void run_hierarchy(communicator& comm, Exec& exec, span<const std::uint64_t> indices, span<const float> values,
                     span<float> out, float alpha) {
    engine::assign(exec, aggregate_, indices, values);
    levels_.clear();
    const std::uint32_t p = static_cast<std::uint32_t>(ranks_);
    std::uint32_t q = 1;
    while (q * 2 <= p) q *= 2;
    const std::uint32_t extra = p - q;
    std::uint32_t stage = 0;
    constexpr std::int64_t none = -1;
    // Fold the ranks past q into the first ones (every rank knows whether there are any).
    if (extra != 0) {
      exchange(comm, exec, stage, me_ >= q ? static_cast<std::int64_t>(me_ - q) : none,
               me_ < extra ? static_cast<std::int64_t>(me_ + q) : none, true);
    }
    ++stage;
    for (std::uint32_t bit = 1; bit < q; bit *= 2) {
      const std::int64_t partner = me_ < q ? static_cast<std::int64_t>(me_ ^ bit) : none;
      exchange(comm, exec, stage++, partner, partner, true);
      if (me_ < q) levels_.push_back(aggregate_.size());
    }
    // Serve the folded ranks.
    if (extra != 0) {
      exchange(comm, exec, stage, me_ < extra ? static_cast<std::int64_t>(me_ + q) : none,
               me_ >= q ? static_cast<std::int64_t>(me_ - q) : none, false);
    }
    agree(comm);
    union_.assign(1, indices.size());
    union_.insert(union_.end(), levels_.begin(), levels_.end());
    traffic_.union_entries = aggregate_.size();
    engine_.apply_list(exec, aggregate_, out, alpha);
  }

  /// One stage: this rank's aggregate to `to`, and `from`'s into it (merged, or replacing it).
  void exchange(communicator& comm, Exec& exec, std::uint32_t stage, std::int64_t to, std::int64_t from, bool merge) {
    std::fill(sizes_.begin(), sizes_.end(), 0);
    engine::resize(exec, send_, 0);
    if (to >= 0) {
      sizes_[static_cast<std::size_t>(to)] =
          encode(exec, stage, 3, n_, aggregate_, 0, aggregate_.size(), send_, failure_, failure_rank_);
      traffic_.scatter_sent += sizes_[static_cast<std::size_t>(to)];
    }
    exchange_bytes(comm, exec);
    for (std::uint32_t r = 0; r < static_cast<std::uint32_t>(ranks_); ++r) {  // only the partner may send
      if (theirs_[r] != 0 && static_cast<std::int64_t>(r) != from) {
        note_failure(wire::fail(wire::format_errc::trailing_bytes, theirs_[r], 0), r, failure_kind::stage_payload);
      }
    }
    if (from < 0) return;
    const auto sender = static_cast<std::uint32_t>(from);
    traffic_.scatter_received += theirs_[sender];
    std::uint64_t at = 0;
    for (std::uint32_t r = 0; r < sender; ++r) at += theirs_[r];
    expects_.assign(1, detail::zen_expect{at, theirs_[sender], stage, sender, 3, n_});
    engine_.check_all(exec, recv_, expects_, static_cast<std::uint32_t>(ranks_), stage_view_, verdicts_of_);
    const typename engine::view& v = stage_view_[0];
    const wire::status s = verdicts_of_[0];
    if (!failure_.ok()) return;  // already failed: keep the first failure
    if (!s.ok()) {
      note_failure(s, sender, failure_kind::stage_payload);
      return;
    }
    if (v.frame.failed) {  // a failure upstream: carry it
      note_failure(wire::fail(static_cast<wire::format_errc>(v.frame.code)), v.frame.culprit, failure_kind::stage_payload);
      return;
    }
    engine_.merge(exec, aggregate_, v, me_ < sender, merge);
  }

  [[noreturn]] static void fail(const wire::status& s, const std::string& what) {
    throw format_error(s.code, gradzip::detail::concat(what, ": ", wire::message(s)));
  }

  std::uint64_t n_;
  int ranks_;
  std::uint32_t me_ = 0;
  detail::zen_tables tables_;
  engine engine_;
  std::vector<std::uint64_t> sizes_, theirs_, gathered_sizes_, first_;
  typename engine::bytes send_, recv_, mine_, gathered_;
  typename engine::list split_, reduced_, aggregate_, input_;
  std::vector<std::uint64_t> levels_, union_;
  wire::status failure_;  // the first message this rank rejected in the step
  std::uint32_t failure_rank_ = 0;
  failure_kind failure_kind_ = failure_kind::part;
  std::vector<std::uint64_t> verdicts_;
  std::vector<typename engine::view> views_, stage_view_;
  std::vector<detail::zen_expect> expects_;
  std::vector<detail::zen_part> frames_;  // the payloads being encoded
  std::vector<std::uint64_t> frame_at_, frame_sizes_;
  std::vector<wire::status> verdicts_of_;  // check_all's, one per payload
  sparse_sync_traffic traffic_;
};

/// Zen's sparse synchronization on the host executor.
using sparse_sync = basic_sparse_sync<host>;

}  // namespace gradzip::comm
