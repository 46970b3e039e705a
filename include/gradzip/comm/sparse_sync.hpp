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
 * parts (sized by the nonzeros) and a sum and a flag (5 bytes) per index of the universe the
 * step sums over: n / P for Balanced Parallelism, n for the allgather scheme.
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
#include <cstring>
#include <vector>

#include "gradzip/comm/collective.hpp"
#include "gradzip/comm/sparse_cost.hpp"
#include "gradzip/detail/host/encode.hpp"
#include "gradzip/encode/automatic.hpp"
#include "gradzip/hash/partition.hpp"
#include "gradzip/wire/reader.hpp"
#include "gradzip/wire/writer.hpp"

namespace gradzip::comm {

/// Structure id of Zen's part payloads (docs/format.md).
inline constexpr std::uint8_t zen_part_id = 10;

namespace detail {

/// y += alpha * v: exactly y + v when alpha is 1, else one fused multiply-add (every scheme,
/// auto_sparse_sync's dense one included, applies its sums so).
inline void add_scaled(float& y, float v, float alpha) { y = alpha == 1.0f ? y + v : fmaf(alpha, v, y); }

/**
 * A part payload: element type f32, element count |I_p| (the member space), codec id
 * {0, 10, 0, encoding}, sections params (32 bytes), indices (positions in I_p, increasing),
 * values (k floats).
 *
 * | params byte | field |
 * | 0 | u32 part p (P for a whole payload) |
 * | 4 | u32 sender rank |
 * | 8 | u8 phase: 0 a part for its owner, 1 a reduced part, 2 a whole payload (allgather), 3 a
 *   stage of the hierarchy (part = the stage) |
 * | 9 | u8 failed: 1 when the owner could not merge a part (then k = 0), else 0 |
 * | 10 | u16 the format_errc of that part (failed = 1), else 0 |
 * | 12 | u32 the rank that sent that part (failed = 1), else 0 |
 * | 16 | u64 k |
 * | 24 | the encoding's 8 parameter bytes |
 */
struct zen_part {
  static constexpr std::uint64_t params_bytes = 32;

  std::uint32_t part = 0;
  std::uint32_t sender = 0;
  std::uint8_t phase = 0;
  std::uint8_t failed = 0;
  std::uint16_t code = 0;
  std::uint32_t culprit = 0;
  std::uint64_t members = 0;  ///< |I_p|
  std::uint64_t k = 0;
  std::uint8_t encoding = encode::coo::id;
  std::uint64_t index_bytes = 0;

  wire::payload_layout layout() const {
    wire::payload_layout l;
    l.add(wire::tag::params, params_bytes);
    l.add(wire::tag::indices, index_bytes);
    l.add(wire::tag::values, k * sizeof(float));
    return l;
  }

  void write_frame(std::uint8_t* out) const {
    const wire::payload_layout l = layout();
    wire::write_header(out, l, element_type::f32, wire::codec_id{0, zen_part_id, 0, encoding}, members);
    wire::zero_section_padding(out, l);
    std::uint8_t* p = out + l.at(0).offset;
    std::memset(p, 0, params_bytes);
    wire::detail::store_le(p, part, 4);
    wire::detail::store_le(p + 4, sender, 4);
    p[8] = phase;
    p[9] = failed;
    wire::detail::store_le(p + 10, code, 2);
    wire::detail::store_le(p + 12, culprit, 4);
    wire::detail::store_le(p + 16, k, 8);
    if (encoding == encode::coo::id) encode::coo::write_params(p + 24, members);
    if (encoding == encode::delta_varint::id) encode::delta_varint::write_params(p + 24, members);
  }
};

/// A validated part: its frame fields and where its sections are.
struct zen_part_view {
  zen_part frame;
  const std::uint8_t* indices = nullptr;
  const std::uint8_t* value_bytes = nullptr;  // may be unaligned on the host: read with memcpy
};

/// f(j, position) for the positions of a part, in order, checking them as it goes: increasing,
/// below |I_p|, and as many as k.
template <class F>
wire::status for_each_position(const zen_part_view& v, F&& f) {
  using wire::format_errc;
  const zen_part& z = v.frame;
  if (z.encoding == encode::coo::id) {
    const int width = encode::coo::index_width(z.members);
    std::uint64_t previous = 0;
    for (std::uint64_t j = 0; j < z.k; ++j) {
      const std::uint64_t i = encode::coo::load(v.indices, width, j);
      if (i >= z.members) return wire::fail(format_errc::index_out_of_range, j, i, z.members);
      if (j != 0 && i <= previous) return wire::fail(format_errc::index_not_increasing, j, i, previous);
      previous = i;
      f(j, i);
    }
    return {};
  }
  if (z.encoding == encode::bitmap::id) {
    std::uint64_t bits = 0;
    const std::uint64_t words = encode::bitmap::words(z.members);
    const wire::status s = encode::bitmap::count_bits(v.indices, z.members, 0, words, bits);
    if (!s.ok()) return s;
    if (bits != z.k) return wire::fail(format_errc::bitmap_count_mismatch, bits, z.k);
    encode::bitmap::for_each_index(v.indices, 0, words, 0, f);
    return {};
  }
  const int width = encode::delta_varint::gap_width(z.members);
  for (std::uint64_t c = 0; c < encode::delta_varint::chunks(z.k); ++c) {
    const wire::status s = encode::delta_varint::decode_chunk(v.indices, z.index_bytes, z.k, z.members, width, c, f);
    if (!s.ok()) return s;
  }
  return {};
}

/// Parses `bytes` (exactly one payload) as a part of `phase` for part `part` (|I_part| =
/// members) sent by `sender`, and checks every position.
inline wire::status check_zen_part(const std::uint8_t* bytes, std::uint64_t size, std::uint32_t part,
                                   std::uint32_t sender, std::uint8_t phase, std::uint64_t members,
                                   std::uint32_t ranks, zen_part_view& v) {
  using wire::format_errc;
  wire::header h;
  wire::status s = wire::parse_header(bytes, size, h);
  if (!s.ok()) return s;
  if (h.total_bytes != size) return wire::fail(format_errc::trailing_bytes, size - h.total_bytes, h.total_bytes);
  if (h.flags != 0) return wire::fail(format_errc::unknown_flags, h.flags);  // parts are never sealed
  const std::uint8_t encoding = h.codec.indices;
  if (h.codec.transform != 0 || h.codec.structure != zen_part_id || h.codec.values != 0 ||
      (encoding != encode::coo::id && encoding != encode::bitmap::id && encoding != encode::delta_varint::id)) {
    return wire::fail(format_errc::codec_mismatch, h.codec.packed(),
                      wire::codec_id{0, zen_part_id, 0, encode::coo::id}.packed());
  }
  const wire::tag tags[3] = {wire::tag::params, wire::tag::indices, wire::tag::values};
  s = wire::expect_sections(h, tags, 3);
  if (!s.ok()) return s;
  if (h.sections[0].size != zen_part::params_bytes) {
    return wire::fail(format_errc::bad_section_size, 0, h.sections[0].size, zen_part::params_bytes);
  }
  if (h.type != element_type::f32) {
    return wire::fail(format_errc::element_type_mismatch, static_cast<std::uint64_t>(h.type),
                      static_cast<std::uint64_t>(element_type::f32));
  }
  if (h.element_count != members) return wire::fail(format_errc::size_mismatch, h.element_count, members);
  const std::uint64_t at = h.sections[0].offset;
  const std::uint8_t* p = bytes + at;
  const wire::param_field fields[3] = {{0, 4, part}, {4, 4, sender}, {8, 1, phase}};
  s = wire::expect_params(p, fields, 3);
  if (!s.ok()) return s;
  zen_part z;
  z.part = part;
  z.sender = sender;
  z.phase = phase;
  z.failed = p[9];
  z.code = static_cast<std::uint16_t>(wire::detail::load_le(p + 10, 2));
  z.culprit = static_cast<std::uint32_t>(wire::detail::load_le(p + 12, 4));
  z.members = members;
  z.k = wire::detail::load_le(p + 16, 8);
  z.encoding = encoding;
  z.index_bytes = h.sections[1].size;
  // Only reduced parts and stages report failures, with a code that exists.
  if (z.failed > 1 || (z.failed == 1 && phase != 1 && phase != 3)) return wire::fail(format_errc::bad_params, 9, z.failed);
  if (z.code > static_cast<std::uint16_t>(format_errc::step_incomplete)) {
    return wire::fail(format_errc::bad_params, 10, z.code);
  }
  if (z.failed == 0 && (z.code != 0 || z.culprit != 0)) return wire::fail(format_errc::nonzero_reserved, at + 10);
  if (z.failed == 1 && (z.code == 0 || z.culprit >= ranks)) return wire::fail(format_errc::bad_params, 10, z.code);
  if (z.k > members || (z.failed == 1 && z.k != 0)) return wire::fail(format_errc::count_overflow, z.k, members);
  if (encoding == encode::coo::id) s = encode::coo::check_params(p + 24, members, at + 24);
  if (encoding == encode::bitmap::id) s = encode::bitmap::check_params(p + 24, members, at + 24);
  if (encoding == encode::delta_varint::id) s = encode::delta_varint::check_params(p + 24, members, at + 24);
  if (!s.ok()) return s;
  s = encode::check_section_size(encoding, z.k, members, z.index_bytes, 1);
  if (!s.ok()) return s;
  if (h.sections[2].size != z.k * sizeof(float)) {
    return wire::fail(format_errc::bad_section_size, 2, h.sections[2].size, z.k * sizeof(float));
  }
  v.frame = z;
  v.indices = bytes + h.sections[1].offset;
  v.value_bytes = bytes + h.sections[2].offset;
  return for_each_position(v, [](std::uint64_t, std::uint64_t) {});
}

inline float zen_value(const zen_part_view& v, std::uint64_t j) {
  float x;
  std::memcpy(&x, v.value_bytes + j * sizeof(float), sizeof(float));
  return x;
}

}  // namespace detail

/// Bytes this rank moved in the last step, by phase (its own part, which stays local, excluded).
struct sparse_sync_traffic {
  std::uint64_t scatter_sent = 0, scatter_received = 0;  ///< step 2 (alltoallv); the hierarchy's stages
  std::uint64_t gather_sent = 0, gather_received = 0;    ///< step 4: the reduced part, to each of P - 1 ranks
  std::uint64_t union_entries = 0;                       ///< indices in the union of all ranks' nonzeros
  std::uint64_t sent() const { return scatter_sent + gather_sent; }
  std::uint64_t received() const { return scatter_received + gather_received; }
};

/// sparse_sync's input from a dense vector: indices <- the positions of its nonzero elements,
/// increasing, and values <- those elements (both cleared first; their capacity is kept).
inline void nonzeros(span<const float> dense, std::vector<std::uint64_t>& indices, std::vector<float>& values) {
  indices.clear();
  values.clear();
  for (std::size_t i = 0; i < dense.size(); ++i) {
    if (dense[i] != 0.0f) {
      indices.push_back(i);
      values.push_back(dense[i]);
    }
  }
}

/// How sparse_sync moves the nonzeros.
enum class sparse_scheme {
  balanced_parallelism,          ///< Zen: parts to their owners (alltoallv), reduced parts back (allgather)
  hierarchical_centralization,   ///< Zen: recursive doubling, the whole aggregate at each of log2 P stages
  allgather,                     ///< the baseline: every rank's nonzeros to every rank
};

class sparse_sync {
 public:
  /// For gradients of n elements over `ranks` ranks; `seed` keys h0 (the same on every rank).
  /// Builds the member tables: O(n) hashes, 12 bytes per element.
  sparse_sync(std::uint64_t n, int ranks, std::uint64_t seed = 0)
      : n_(n), ranks_(ranks), partition_(static_cast<std::uint32_t>(ranks >= 1 ? ranks : 1), seed) {
    GRADZIP_EXPECTS(ranks >= 1, "sparse_sync: ranks must be >= 1, got ", ranks);
    GRADZIP_EXPECTS(n <= 0xFFFFFFFFull * static_cast<std::uint64_t>(ranks),
                    "sparse_sync: n = ", n, " is too large for 32-bit member positions");
    const auto parts = static_cast<std::size_t>(ranks);
    start_.assign(parts + 1, 0);
    position_.resize(static_cast<std::size_t>(n));
    std::vector<std::uint64_t> count(parts, 0);
    for (std::uint64_t i = 0; i < n; ++i) position_[i] = static_cast<std::uint32_t>(count[partition_.part_of(i)]++);
    for (std::size_t p = 0; p < parts; ++p) {
      GRADZIP_EXPECTS(count[p] <= 0x100000000ull, "sparse_sync: part ", p, " has ", count[p],
                      " members, more than 32-bit positions address (n = ", n, ", ranks = ", ranks, ")");
      start_[p + 1] = start_[p] + count[p];
    }
    members_.resize(static_cast<std::size_t>(n));
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::uint32_t p = partition_.part_of(i);
      members_[start_[p] + position_[i]] = i;
    }
    sizes_.resize(parts);
    theirs_.resize(parts);
    gathered_sizes_.resize(parts);
  }

  std::uint64_t size() const noexcept { return n_; }
  int ranks() const noexcept { return ranks_; }
  const hash::partition& partition() const noexcept { return partition_; }
  /// |I_p|: how many indices part p owns.
  std::uint64_t members(std::uint32_t p) const { return start_[p + 1] - start_[p]; }
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
  void check_arguments(const communicator& comm, span<const std::uint64_t> indices, span<const float> values,
                       span<float> out, const char* what) const {
    GRADZIP_EXPECTS(comm.size() == ranks_, what, ": communicator has ", comm.size(), " ranks, built for ", ranks_);
    GRADZIP_EXPECTS(indices.size() == values.size(), what, ": ", indices.size(), " indices and ", values.size(),
                    " values");
    GRADZIP_EXPECTS(out.size() == n_, what, ": output has ", out.size(), " elements, expected ", n_);
    for (std::size_t j = 0; j < indices.size(); ++j) {
      GRADZIP_EXPECTS(indices[j] < n_ && (j == 0 || indices[j] > indices[j - 1]), what, ": index ", j, " (",
                      indices[j], ") is not increasing and below n = ", n_);
    }
  }

  /// out[i] += alpha * (the sum over ranks of their value at i), for the union of the ranks'
  /// nonzeros. `indices` are this rank's nonzeros, increasing and < n, with `values` beside
  /// them. Collective: every rank calls it in the same step. Bad arguments throw
  /// invalid_argument before any communication; a bad part or reduced part throws format_error
  /// naming the rank that sent it, on every rank, with `out` unchanged.
  void run(communicator& comm, host& exec, span<const std::uint64_t> indices, span<const float> values, span<float> out,
           float alpha = 1.0f, sparse_scheme scheme = sparse_scheme::balanced_parallelism) {
    check_arguments(comm, indices, values, out, "sparse_sync");
    me_ = static_cast<std::uint32_t>(comm.rank());
    traffic_ = {};
    failure_ = wire::status{};
    failure_rank_ = 0;
    if (scheme == sparse_scheme::hierarchical_centralization) {
      run_hierarchy(comm, exec, indices, values, out, alpha);
      return;
    }
    if (scheme == sparse_scheme::allgather) {
      positions_.assign(indices.begin(), indices.end());
      values_.assign(values.begin(), values.end());
      mine_.clear();
      encode_part(exec, static_cast<std::uint32_t>(ranks_), me_, 2, n_, positions_, values_, mine_);
      gather(comm);
      apply_whole(comm, out, alpha);
      return;
    }
    scatter(comm, exec, indices, values);
    reduce(exec, reinterpret_cast<const std::uint8_t*>(recv_.data()));
    gather(comm);
    apply(comm, out, alpha);
  }

 private:
  // Step 1 and 2: split by part, encode each part, exchange.
  void scatter(communicator& comm, host& exec, span<const std::uint64_t> indices, span<const float> values) {
    const std::uint32_t me = me_;
    const auto parts = static_cast<std::size_t>(ranks_);
    part_positions_.assign(parts, {});
    part_values_.assign(parts, {});
    for (std::size_t j = 0; j < indices.size(); ++j) {  // positions stay increasing: members are sorted by index
      const std::uint32_t p = partition_.part_of(indices[j]);
      part_positions_[p].push_back(position_[indices[j]]);
      part_values_[p].push_back(values[j]);
    }
    send_.clear();
    for (std::uint32_t p = 0; p < parts; ++p) {
      sizes_[p] = encode_part(exec, p, me, 0, members(p), part_positions_[p], part_values_[p], send_);
      if (p != me) traffic_.scatter_sent += sizes_[p];
    }
    comm.alltoall_sizes(span<const std::uint64_t>(sizes_), span<std::uint64_t>(theirs_));
    std::uint64_t total = 0;
    for (std::uint32_t r = 0; r < parts; ++r) {
      total += theirs_[r];
      if (r != me) traffic_.scatter_received += theirs_[r];
    }
    recv_.resize(static_cast<std::size_t>(total));
    comm.alltoallv_bytes(span<const std::byte>(send_), span<const std::uint64_t>(sizes_), span<std::byte>(recv_),
                         span<const std::uint64_t>(theirs_));
  }

  /// Appends part p's payload (positions increasing, < members(p)) to `to`; returns its size.
  std::uint64_t encode_part(host& exec, std::uint32_t p, std::uint32_t me, std::uint8_t phase, std::uint64_t universe,
                            const std::vector<std::uint64_t>& positions, const std::vector<float>& values,
                            std::vector<std::byte>& to, const wire::status& failure = {}, std::uint32_t culprit = 0) {
    detail::zen_part z;
    z.part = p;
    z.sender = me;
    z.phase = phase;
    z.failed = failure.ok() ? 0 : 1;
    z.code = static_cast<std::uint16_t>(failure.code);
    z.culprit = failure.ok() ? 0 : culprit;
    z.members = universe;
    z.k = failure.ok() ? positions.size() : 0;  // a failure report carries no entries
    workspace_.resize(gradzip::detail::index_encoder<host>::workspace_bytes(exec, z.k));
    z.index_bytes = gradzip::detail::index_encoder<host>::plan<encode::automatic>(exec, positions.data(), z.k, z.members,
                                                                                  workspace_.data(), z.encoding);
    const wire::payload_layout l = z.layout();
    const std::size_t at = to.size();
    to.resize(at + static_cast<std::size_t>(l.total_bytes()));
    auto* base = reinterpret_cast<std::uint8_t*>(to.data() + at);
    z.write_frame(base);
    gradzip::detail::index_encoder<host>::encode(exec, z.encoding, positions.data(), z.k, z.members, workspace_.data(),
                                                 base + l.at(1).offset);
    if (z.k != 0) std::memcpy(base + l.at(2).offset, values.data(), z.k * sizeof(float));
    return l.total_bytes();
  }

  // Step 3: validate every received part, then sum them in rank order; a bad one is reported
  // in the reduced part instead.
  void reduce(host& exec, const std::uint8_t* received) {
    const std::uint32_t me = me_;
    const std::uint64_t m = members(me);
    views_.resize(static_cast<std::size_t>(ranks_));
    std::uint64_t at = 0;
    for (std::uint32_t r = 0; r < static_cast<std::uint32_t>(ranks_); ++r) {
      const wire::status s = detail::check_zen_part(received + at, theirs_[r], me, r, 0, m,
                                                    static_cast<std::uint32_t>(ranks_), views_[r]);
      at += theirs_[r];
      note_failure(s, r, failure_kind::part);
    }
    reduced_positions_.clear();
    reduced_values_.clear();
    if (failure_.ok()) {
      sum_in_rank_order(m);
      for (std::uint64_t pos = 0; pos < m; ++pos) {
        if (touched_[pos] != 0) {
          reduced_positions_.push_back(pos);
          reduced_values_.push_back(sums_[pos]);
        }
      }
    }
    mine_.clear();
    encode_part(exec, me, me, 1, m, reduced_positions_, reduced_values_, mine_, failure_, failure_rank_);
  }

  // Step 4: every rank's reduced part.
  void gather(communicator& comm) {
    traffic_.gather_sent = static_cast<std::uint64_t>(mine_.size()) * static_cast<std::uint64_t>(ranks_ - 1);
    comm.allgather_sizes(static_cast<std::uint64_t>(mine_.size()), span<std::uint64_t>(gathered_sizes_));
    std::uint64_t total = 0;
    for (std::size_t r = 0; r < gathered_sizes_.size(); ++r) {
      total += gathered_sizes_[r];
      if (r != static_cast<std::size_t>(comm.rank())) traffic_.gather_received += gathered_sizes_[r];
    }
    gathered_.resize(static_cast<std::size_t>(total));
    comm.allgatherv_bytes(span<const std::byte>(mine_), span<std::byte>(gathered_),
                          span<const std::uint64_t>(gathered_sizes_));
  }

  // Step 5: validate all reduced parts (and what their owners report), agree, then apply them.
  void apply(communicator& comm, span<float> out, float alpha) {
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(gathered_.data());
    std::uint64_t at = 0;
    for (std::uint32_t q = 0; q < static_cast<std::uint32_t>(ranks_); ++q) {
      const wire::status s = detail::check_zen_part(bytes + at, gathered_sizes_[q], q, q, 1, members(q),
                                                    static_cast<std::uint32_t>(ranks_), views_[q]);
      at += gathered_sizes_[q];
      note_failure(s, q, failure_kind::reduced_part);
    }
    // An owner's report of a part it rejected (this rank's own rejection is noted already).
    for (std::uint32_t q = 0; q < static_cast<std::uint32_t>(ranks_); ++q) {
      const detail::zen_part& z = views_[q].frame;
      if (z.failed != 0) note_failure(wire::fail(static_cast<wire::format_errc>(z.code)), z.culprit, failure_kind::part);
    }
    agree(comm);
    for (std::uint32_t q = 0; q < static_cast<std::uint32_t>(ranks_); ++q) {
      const detail::zen_part_view& v = views_[q];
      const std::uint64_t* part_members = members_.data() + start_[q];
      traffic_.union_entries += v.frame.k;
      (void)detail::for_each_position(v, [&](std::uint64_t j, std::uint64_t pos) {  // validated already
        add_scaled(out[part_members[pos]], detail::zen_value(v, j), alpha);
      });
    }
  }

  /// What a rank rejected, for the verdicts: the kinds of message.
  enum class failure_kind : std::uint8_t { part = 0, reduced_part = 1, payload = 2, stage_payload = 3 };
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
  void run_hierarchy(communicator& comm, host& exec, span<const std::uint64_t> indices, span<const float> values,
                     span<float> out, float alpha) {
    positions_.assign(indices.begin(), indices.end());
    values_.assign(values.begin(), values.end());
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
      if (me_ < q) levels_.push_back(positions_.size());
    }
    // Serve the folded ranks.
    if (extra != 0) {
      exchange(comm, exec, stage, me_ < extra ? static_cast<std::int64_t>(me_ + q) : none,
               me_ >= q ? static_cast<std::int64_t>(me_ - q) : none, false);
    }
    agree(comm);
    union_.assign(1, indices.size());
    union_.insert(union_.end(), levels_.begin(), levels_.end());
    traffic_.union_entries = positions_.size();
    for (std::size_t j = 0; j < positions_.size(); ++j) add_scaled(out[positions_[j]], values_[j], alpha);
  }

  /// One stage: this rank's aggregate to `to`, and `from`'s into it (merged, or replacing it).
  void exchange(communicator& comm, host& exec, std::uint32_t stage, std::int64_t to, std::int64_t from, bool merge) {
    std::fill(sizes_.begin(), sizes_.end(), 0);
    send_.clear();
    if (to >= 0) {
      sizes_[static_cast<std::size_t>(to)] =
          encode_part(exec, stage, me_, 3, n_, positions_, values_, send_, failure_, failure_rank_);
      traffic_.scatter_sent += sizes_[static_cast<std::size_t>(to)];
    }
    comm.alltoall_sizes(span<const std::uint64_t>(sizes_), span<std::uint64_t>(theirs_));
    std::uint64_t total = 0;
    for (std::uint64_t t : theirs_) total += t;
    recv_.resize(static_cast<std::size_t>(total));
    comm.alltoallv_bytes(span<const std::byte>(send_), span<const std::uint64_t>(sizes_), span<std::byte>(recv_),
                         span<const std::uint64_t>(theirs_));
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
    detail::zen_part_view v;
    const wire::status s = detail::check_zen_part(reinterpret_cast<const std::uint8_t*>(recv_.data()) + at,
                                                  theirs_[sender], stage, sender, 3, n_,
                                                  static_cast<std::uint32_t>(ranks_), v);
    if (!failure_.ok()) return;  // already failed: keep the first failure
    if (!s.ok()) {
      note_failure(s, sender, failure_kind::stage_payload);
      return;
    }
    if (v.frame.failed) {  // a failure upstream: carry it
      note_failure(wire::fail(static_cast<wire::format_errc>(v.frame.code)), v.frame.culprit, failure_kind::stage_payload);
      return;
    }
    merged_positions_.clear();
    merged_values_.clear();
    std::size_t j = 0;
    (void)detail::for_each_position(v, [&](std::uint64_t k, std::uint64_t i) {  // validated already
      const float x = detail::zen_value(v, k);
      if (merge) {
        for (; j < positions_.size() && positions_[j] < i; ++j) {
          merged_positions_.push_back(positions_[j]);
          merged_values_.push_back(values_[j]);
        }
        if (j < positions_.size() && positions_[j] == i) {
          merged_positions_.push_back(i);
          // The lower rank's aggregate first: every rank then adds the same operands in the
          // same order, NaN payloads included.
          merged_values_.push_back(me_ < sender ? values_[j] + x : x + values_[j]);
          ++j;
          return;
        }
      }
      merged_positions_.push_back(i);
      merged_values_.push_back(x);
    });
    if (merge) {
      for (; j < positions_.size(); ++j) {
        merged_positions_.push_back(positions_[j]);
        merged_values_.push_back(values_[j]);
      }
    }
    positions_.swap(merged_positions_);
    values_.swap(merged_values_);
  }

  // The allgather scheme: validate every rank's payload, then sum them in rank order.
  void apply_whole(communicator& comm, span<float> out, float alpha) {
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(gathered_.data());
    views_.resize(static_cast<std::size_t>(ranks_));
    std::uint64_t at = 0;
    for (std::uint32_t q = 0; q < static_cast<std::uint32_t>(ranks_); ++q) {
      const wire::status s = detail::check_zen_part(bytes + at, gathered_sizes_[q], static_cast<std::uint32_t>(ranks_), q,
                                                    2, n_, static_cast<std::uint32_t>(ranks_), views_[q]);
      at += gathered_sizes_[q];
      note_failure(s, q, failure_kind::payload);
    }
    agree(comm);
    sum_in_rank_order(n_);
    for (std::uint64_t i = 0; i < n_; ++i) {
      if (touched_[i] != 0) {
        add_scaled(out[i], sums_[i], alpha);
        ++traffic_.union_entries;
      }
    }
  }

  /// sums_[i] <- the sum from zero, in rank order, of the validated views_' values at i (i below
  /// `universe`), and touched_[i] <- whether any view has i.
  void sum_in_rank_order(std::uint64_t universe) {
    sums_.assign(static_cast<std::size_t>(universe), 0.0f);
    touched_.assign(static_cast<std::size_t>(universe), 0);
    for (std::uint32_t r = 0; r < static_cast<std::uint32_t>(ranks_); ++r) {
      const detail::zen_part_view& v = views_[r];
      (void)detail::for_each_position(v, [&](std::uint64_t j, std::uint64_t i) {  // validated already
        sums_[i] += detail::zen_value(v, j);
        touched_[i] = 1;
      });
    }
  }

  static void add_scaled(float& y, float v, float alpha) { detail::add_scaled(y, v, alpha); }

  [[noreturn]] static void fail(const wire::status& s, const std::string& what) {
    throw format_error(s.code, gradzip::detail::concat(what, ": ", wire::message(s)));
  }

  std::uint64_t n_;
  int ranks_;
  std::uint32_t me_ = 0;
  hash::partition partition_;
  std::vector<std::uint32_t> position_;  // i's position among its part's members
  std::vector<std::uint64_t> start_;     // part p's members are members_[start_[p] .. start_[p + 1])
  std::vector<std::uint64_t> members_;
  std::vector<std::uint64_t> sizes_, theirs_, gathered_sizes_;
  std::vector<std::vector<std::uint64_t>> part_positions_;
  std::vector<std::vector<float>> part_values_;
  std::vector<std::byte> send_, recv_, mine_, gathered_, workspace_;
  std::vector<float> sums_;
  std::vector<std::uint8_t> touched_;
  std::vector<std::uint64_t> reduced_positions_, positions_, merged_positions_, levels_, union_;
  std::vector<float> reduced_values_, values_, merged_values_;
  wire::status failure_;  // the first message this rank rejected in the step
  std::uint32_t failure_rank_ = 0;
  failure_kind failure_kind_ = failure_kind::part;
  std::vector<std::uint64_t> verdicts_;
  std::vector<detail::zen_part_view> views_;
  sparse_sync_traffic traffic_;
};

}  // namespace gradzip::comm
