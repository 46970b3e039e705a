// zen_engine<host>: the work of comm::sparse_sync's steps on the host, over std::vector. The
// steps' order, the frames and the collectives are comm/sparse_sync.hpp's; an engine owns the
// entry lists and sums, and turns them into parts and back (the CUDA engine is
// detail/cuda/sparse_sync.cuh, with the same results bit for bit).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gradzip/comm/collective.hpp"
#include "gradzip/comm/zen_part.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/detail/host/encode.hpp"

namespace gradzip::comm {

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

namespace detail {

template <class Exec>
struct zen_engine;

template <>
struct zen_engine<host> {
  using bytes = std::vector<std::byte>;
  using view = zen_part_view;

  /// Entries: positions (increasing) and their values.
  struct list {
    std::vector<std::uint64_t> positions;
    std::vector<float> values;
    std::uint64_t size() const noexcept { return positions.size(); }
    const std::uint64_t* position_data(std::uint64_t at = 0) const { return positions.data() + at; }
    const float* value_data(std::uint64_t at = 0) const { return values.data() + at; }
  };

  explicit zen_engine(const zen_tables&) {}

  /// The largest universe this engine sums over.
  static constexpr std::uint64_t max_universe = ~std::uint64_t{0};

  static std::byte* data(bytes& b) { return b.data(); }
  static const std::byte* data(const bytes& b) { return b.data(); }
  static void resize(host&, bytes& b, std::uint64_t size) { b.resize(static_cast<std::size_t>(size)); }
  /// Around a collective on this executor's buffers: nothing to order on the host.
  static void hand_over(host&, communicator&) {}
  static void take_back(host&, communicator&) {}

  /// Throws invalid_argument naming `what` unless indices increase and stay below n.
  static void check_indices(host&, span<const std::uint64_t> indices, std::uint64_t n, const char* what) {
    for (std::size_t j = 0; j < indices.size(); ++j) {
      GRADZIP_EXPECTS(indices[j] < n && (j == 0 || indices[j] > indices[j - 1]), what, ": index ", j, " (",
                      indices[j], ") is not increasing and below n = ", n);
    }
  }

  static void assign(host&, list& to, span<const std::uint64_t> indices, span<const float> values) {
    to.positions.assign(indices.begin(), indices.end());
    to.values.assign(values.begin(), values.end());
  }

  /// Step 1: the entries by part, each part's as positions in I_p (increasing: members are
  /// sorted by index), at to[first[p] .. first[p + 1]).
  void split(host&, const zen_tables& t, span<const std::uint64_t> indices, span<const float> values, list& to,
             std::vector<std::uint64_t>& first) {
    const std::size_t parts = t.start.size() - 1;
    part_.resize(indices.size());
    first.assign(parts + 1, 0);
    for (std::size_t j = 0; j < indices.size(); ++j) {
      part_[j] = t.partition.part_of(indices[j]);
      ++first[part_[j] + 1];
    }
    for (std::size_t p = 0; p < parts; ++p) first[p + 1] += first[p];
    to.positions.resize(indices.size());
    to.values.resize(indices.size());
    next_.assign(first.begin(), first.end() - 1);
    for (std::size_t j = 0; j < indices.size(); ++j) {
      const std::uint64_t at = next_[part_[j]]++;
      to.positions[at] = t.position[indices[j]];
      to.values[at] = values[j];
    }
  }

  /// Appends the payload of each frame (all but its encoding and index bytes, which this fills)
  /// with frames[p].k entries at l[first[p] ..) to `to`, sizes[p] <- its size.
  void encode_all(host& exec, std::vector<zen_part>& frames, const list& l, const std::vector<std::uint64_t>& first,
                  bytes& to, std::vector<std::uint64_t>& sizes) {
    sizes.resize(frames.size());
    for (std::size_t p = 0; p < frames.size(); ++p) {
      sizes[p] = encode(exec, frames[p], l.position_data(first[p]), l.value_data(first[p]), to);
    }
  }

  /// Checks each payload `expects` names in b (frame and positions): views[i] views payload i
  /// in place, out[i] is its verdict.
  static void check_all(host&, const bytes& b, const std::vector<zen_expect>& expects, std::uint32_t ranks,
                        std::vector<view>& views, std::vector<wire::status>& out) {
    views.resize(expects.size());
    out.resize(expects.size());
    const auto* base = reinterpret_cast<const std::uint8_t*>(b.data());
    for (std::size_t i = 0; i < expects.size(); ++i) {
      const zen_expect& e = expects[i];
      out[i] = check_zen_part(base + e.at, e.size, e.part, e.sender, e.phase, e.members, ranks, views[i]);
    }
  }

  /// sums[i] <- the sum from zero, in view order, of the views' values at i (i below
  /// `universe`), and touched[i] <- whether any of them has i. The views are validated.
  void sum(host&, const std::vector<view>& views, std::uint64_t universe) {
    sums_.assign(static_cast<std::size_t>(universe), 0.0f);
    touched_.assign(static_cast<std::size_t>(universe), 0);
    for (const view& v : views) {
      (void)for_each_position(v, [&](std::uint64_t j, std::uint64_t i) {
        sums_[i] += zen_value(v, j);
        touched_[i] = 1;
      });
    }
  }

  /// `to` <- the touched positions below `universe` and their sums.
  void compact(host&, std::uint64_t universe, list& to) {
    to.positions.clear();
    to.values.clear();
    for (std::uint64_t i = 0; i < universe; ++i) {
      if (touched_[i] != 0) {
        to.positions.push_back(i);
        to.values.push_back(sums_[i]);
      }
    }
  }

  /// out[i] += alpha sums[i] where touched, for i < out.size(); returns how many.
  std::uint64_t apply_sums(host&, span<float> out, float alpha) {
    std::uint64_t touched = 0;
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (touched_[i] != 0) {
        add_scaled(out[i], sums_[i], alpha);
        ++touched;
      }
    }
    return touched;
  }

  /// out[member] += alpha value for every entry of reduced part q (validated), positions in I_q.
  static void apply_part(host&, const zen_tables& t, std::uint32_t q, const view& v, span<float> out, float alpha) {
    const std::uint64_t* part_members = t.members.data() + t.start[q];
    (void)for_each_position(v, [&](std::uint64_t j, std::uint64_t pos) {
      add_scaled(out[part_members[pos]], zen_value(v, j), alpha);
    });
  }

  static void apply_list(host&, const list& l, span<float> out, float alpha) {
    for (std::size_t j = 0; j < l.positions.size(); ++j) add_scaled(out[l.positions[j]], l.values[j], alpha);
  }

  /// mine <- the union of mine and v's entries (merge), or v's entries alone; where both have a
  /// position, the lower rank's value is the first operand (mine's when `mine_first`), so that
  /// both ranks of a stage add the same operands in the same order, NaN payloads included.
  void merge(host&, list& mine, const view& v, bool mine_first, bool merge) {
    merged_.positions.clear();
    merged_.values.clear();
    std::size_t j = 0;
    (void)for_each_position(v, [&](std::uint64_t k, std::uint64_t i) {
      const float x = zen_value(v, k);
      if (merge) {
        for (; j < mine.positions.size() && mine.positions[j] < i; ++j) {
          merged_.positions.push_back(mine.positions[j]);
          merged_.values.push_back(mine.values[j]);
        }
        if (j < mine.positions.size() && mine.positions[j] == i) {
          merged_.positions.push_back(i);
          merged_.values.push_back(mine_first ? mine.values[j] + x : x + mine.values[j]);
          ++j;
          return;
        }
      }
      merged_.positions.push_back(i);
      merged_.values.push_back(x);
    });
    if (merge) {
      for (; j < mine.positions.size(); ++j) {
        merged_.positions.push_back(mine.positions[j]);
        merged_.values.push_back(mine.values[j]);
      }
    }
    std::swap(mine, merged_);
  }

  /// `to` <- the positions of dense's nonzero elements, increasing, and the elements.
  static void nonzeros(host&, span<const float> dense, list& to) { comm::nonzeros(dense, to.positions, to.values); }
  static void zero(host&, span<float> y) { std::fill(y.begin(), y.end(), 0.0f); }
  static void copy(host&, span<const float> from, span<float> to) { std::copy(from.begin(), from.end(), to.begin()); }

  /// The dense baseline's buffer: n zeros, then values[j] at indices[j].
  float* densify(host&, span<const std::uint64_t> indices, span<const float> values, std::uint64_t n) {
    sums_.assign(static_cast<std::size_t>(n), 0.0f);
    for (std::size_t j = 0; j < indices.size(); ++j) sums_[indices[j]] = values[j];
    return sums_.data();
  }

  /// out[i] += alpha buffer[i], every i.
  void add_dense(host&, span<float> out, float alpha) {
    for (std::size_t i = 0; i < out.size(); ++i) add_scaled(out[i], sums_[i], alpha);
  }

  static void allreduce_host(communicator& comm, host&, double* values, std::size_t count) {
    comm.allreduce_sum(values, count, element_type::f64);
  }

 private:
  /// One frame's payload appended to `to`; returns its size.
  std::uint64_t encode(host& exec, zen_part z, const std::uint64_t* positions, const float* values, bytes& to) {
    using encoder = gradzip::detail::index_encoder<host>;
    workspace_.resize(encoder::workspace_bytes(exec, z.k));
    z.index_bytes = encoder::plan<encode::automatic>(exec, positions, z.k, z.members, workspace_.data(), z.encoding);
    const wire::payload_layout l = z.layout();
    const std::size_t at = to.size();
    to.resize(at + static_cast<std::size_t>(l.total_bytes()));
    auto* base = reinterpret_cast<std::uint8_t*>(to.data() + at);
    z.write_frame(base);
    encoder::encode(exec, z.encoding, positions, z.k, z.members, workspace_.data(), base + l.at(1).offset);
    if (z.k != 0) std::memcpy(base + l.at(2).offset, values, z.k * sizeof(float));
    return l.total_bytes();
  }

  std::vector<std::uint32_t> part_;
  std::vector<std::uint64_t> next_;
  std::vector<std::byte> workspace_;
  std::vector<float> sums_;
  std::vector<std::uint8_t> touched_;
  list merged_;
};

}  // namespace detail
}  // namespace gradzip::comm
