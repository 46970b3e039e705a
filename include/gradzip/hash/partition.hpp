/**
 * @file partition.hpp
 * @brief `hash::partition`: Zen's hash partitioning of gradient indices over P parts, a bounded
 * fixed-size split with an overflow area, and the "hash bitmap" encoding over a part's members.
 *
 * Zen (Wang et al., "Zen: Near-Optimal Sparse Tensor Synchronization for Distributed DNN
 * Training", 2023) balances a sparse reduce-scatter by hashing every index i to one part,
 * p = h0(i) (here hash_to_range(hash64(seed, i), P)): each part's owner aggregates the indices
 * that hash to it, and the load is balanced whatever the gradient's sparsity pattern (a
 * contiguous split is not: gradients cluster by layer). Because a part's index set (its
 * members: all i < n with h0(i) = p) is fixed, the owner can return its aggregated result as a
 * bitmap over the members (|members| ~ n / P bits) instead of indices: the hash bitmap.
 *
 * Zen's released code drops the read-after-write check of its GPU hash table, uses index 0 as
 * the empty marker and lets its overflow area grow without bound. `split_fixed` instead places
 * each part's indices into `capacity` slots and the excess into one shared overflow area of
 * `overflow` slots; whatever fits in neither is counted and returned (`unplaced`), never dropped
 * silently, and no index value is reserved as a marker (the per-part counts say what is filled).
 * Host, and CUDA through the overloads that take an executor first (detail/cuda/partition.cuh:
 * the host's results; synchronous, since each returns counts).
 *
 * @code
 * gradzip::hash::partition zen{64, seed};
 * auto load = zen.loads(n);                            // balance: max / mean near 1
 * std::vector<std::uint64_t> sorted = {3, 17, 40};     // the nonzeros' indices, increasing, < n
 * const std::uint64_t capacity = 4, overflow = 8;      // slots per part, shared overflow slots
 * std::vector<std::uint64_t> slots(64 * capacity), counts(64), spill(overflow);
 * std::vector<std::uint32_t> spill_parts(overflow);
 * auto r = zen.split_fixed(sorted, n, capacity, overflow, slots, counts, spill, spill_parts);
 * if (r.unplaced != 0) {
 *   // send the rest another way
 * }
 * @endcode
 */
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "gradzip/core/config.hpp"
#include "gradzip/core/error.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/core/span.hpp"
#include "gradzip/random/hash.hpp"
#include "gradzip/wire/errc.hpp"

namespace gradzip::hash {
class partition;
}

namespace gradzip::detail {
/// Executors other than the host's (detail/cuda/partition.cuh for `cuda`).
template <class Exec>
struct partition_backend;
}  // namespace gradzip::detail

namespace gradzip::hash {

class partition {
 public:
  partition(std::uint32_t parts, std::uint64_t seed) : parts_(parts), seed_(seed) {
    GRADZIP_EXPECTS(parts >= 1, "partition: parts must be >= 1");
  }

  std::uint32_t parts() const noexcept { return parts_; }
  std::uint64_t seed() const noexcept { return seed_; }

  /// h0(i): the part that owns index i.
  GRADZIP_HOST_DEVICE static std::uint32_t part_of(std::uint64_t seed, std::uint64_t i, std::uint32_t parts) {
    return static_cast<std::uint32_t>(hash_to_range(hash64(seed, i), parts));
  }
  std::uint32_t part_of(std::uint64_t i) const { return part_of(seed_, i, parts_); }

  /// How many of the indices [0, n) each part owns.
  std::vector<std::uint64_t> loads(std::uint64_t n) const {
    std::vector<std::uint64_t> load(parts_, 0);
    for (std::uint64_t i = 0; i < n; ++i) ++load[part_of(i)];
    return load;
  }

  struct split_result {
    std::uint64_t overflowed = 0;  ///< indices that went to the overflow area
    std::uint64_t unplaced = 0;    ///< indices that fit in neither: reported, for the caller to send
  };

  /**
   * Splits sorted indices (< n) by part into fixed-size storage: part p's first `capacity`
   * indices go to slots[p * capacity ...] (counts[p] of them, in increasing order), the next
   * ones to the shared overflow area spill[0 .. overflow) with their part in spill_parts, in
   * increasing index order. Returns how many overflowed and how many fit nowhere.
   */
  [[nodiscard]] split_result split_fixed(span<const std::uint64_t> sorted, std::uint64_t n, std::uint64_t capacity,
                                         std::uint64_t overflow, span<std::uint64_t> slots, span<std::uint64_t> counts,
                                         span<std::uint64_t> spill, span<std::uint32_t> spill_parts) const {
    expect_split_sizes(capacity, overflow, slots, counts, spill, spill_parts);
    for (std::size_t j = 0; j < sorted.size(); ++j) {  // all checked before any output is written
      if (sorted[j] >= n || (j != 0 && sorted[j] <= sorted[j - 1])) {
        refuse_split_index(j, sorted[j], j == 0 ? 0 : sorted[j - 1], n);
      }
    }
    for (auto& c : counts) c = 0;
    split_result r;
    for (const std::uint64_t i : sorted) {
      const std::uint32_t p = part_of(i);
      if (counts[p] < capacity) {
        slots[p * capacity + counts[p]++] = i;
      } else if (r.overflowed < overflow) {
        spill[r.overflowed] = i;
        spill_parts[r.overflowed++] = p;
      } else {
        ++r.unplaced;
      }
    }
    return r;
  }

  /// split_fixed's error for sorted[j], the first index not increasing or not below n (every
  /// executor's message).
  [[noreturn]] static void refuse_split_index(std::uint64_t j, std::uint64_t value, std::uint64_t previous,
                                              std::uint64_t n) {
    throw invalid_argument(gradzip::detail::concat("partition::split_fixed: sorted[", j, "] is ", value,
                                                   j == 0 ? "" : gradzip::detail::concat(" after ", previous),
                                                   ": indices must be increasing and below n = ", n));
  }

  /// The hash bitmap of part p: bit j says whether p's j-th member (in index order) is among
  /// `sorted` (increasing indices of p's members, < n). `bits` needs ceil(members / 64) words;
  /// returns the member count.
  std::uint64_t encode_bitmap(std::uint32_t p, std::uint64_t n, span<const std::uint64_t> sorted,
                              span<std::uint64_t> bits) const {
    check_part(p);
    for (auto& w : bits) w = 0;
    std::uint64_t member = 0;
    std::size_t next = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
      if (part_of(i) != p) continue;
      if (next < sorted.size() && sorted[next] == i) {
        GRADZIP_EXPECTS(member / 64 < bits.size(), "partition::encode_bitmap: ", bits.size(), " words are too few");
        bits[member / 64] |= std::uint64_t{1} << (member % 64);
        ++next;
      }
      ++member;
    }
    GRADZIP_EXPECTS(next == sorted.size(), "partition::encode_bitmap: index ", next < sorted.size() ? sorted[next] : 0,
                    " is not a member of part ", p, " (or not increasing)");
    return member;
  }

  /// The same operations on an executor: `host` runs the functions above; on CUDA the spans
  /// are device memory and every call is synchronous. decode_bitmap writes the indices into
  /// `out` (which must hold them all) and returns their count.
  template <class Exec>
  std::vector<std::uint64_t> loads(Exec& exec, std::uint64_t n) const {
    if constexpr (std::is_same_v<Exec, host>) {
      return loads(n);
    } else {
      return gradzip::detail::partition_backend<Exec>::loads(*this, exec, n);
    }
  }
  template <class Exec>
  [[nodiscard]] split_result split_fixed(Exec& exec, span<const std::uint64_t> sorted, std::uint64_t n,
                                         std::uint64_t capacity, std::uint64_t overflow, span<std::uint64_t> slots,
                                         span<std::uint64_t> counts, span<std::uint64_t> spill,
                                         span<std::uint32_t> spill_parts) const {
    if constexpr (std::is_same_v<Exec, host>) {
      return split_fixed(sorted, n, capacity, overflow, slots, counts, spill, spill_parts);
    } else {
      expect_split_sizes(capacity, overflow, slots, counts, spill, spill_parts);
      return gradzip::detail::partition_backend<Exec>::split_fixed(*this, exec, sorted, n, capacity, overflow, slots,
                                                                   counts, spill, spill_parts);
    }
  }
  template <class Exec>
  std::uint64_t encode_bitmap(Exec& exec, std::uint32_t p, std::uint64_t n, span<const std::uint64_t> sorted,
                              span<std::uint64_t> bits) const {
    if constexpr (std::is_same_v<Exec, host>) {
      return encode_bitmap(p, n, sorted, bits);
    } else {
      return gradzip::detail::partition_backend<Exec>::encode_bitmap(*this, exec, p, n, sorted, bits);
    }
  }
  template <class Exec>
  std::uint64_t decode_bitmap(Exec& exec, std::uint32_t p, std::uint64_t n, span<const std::uint64_t> bits,
                              span<std::uint64_t> out) const {
    if constexpr (std::is_same_v<Exec, host>) {
      const std::vector<std::uint64_t> set = decode_bitmap(p, n, bits);
      GRADZIP_EXPECTS(set.size() <= out.size(), "partition::decode_bitmap: the output holds ", out.size(),
                      " indices, ", set.size(), " are set");
      for (std::size_t j = 0; j < set.size(); ++j) out[j] = set[j];
      return set.size();
    } else {
      return gradzip::detail::partition_backend<Exec>::decode_bitmap(*this, exec, p, n, bits, out);
    }
  }

  /// The members of part p whose bits are set, in increasing order (`bits` from encode_bitmap).
  /// Throws if a bit is set past the part's last member.
  std::vector<std::uint64_t> decode_bitmap(std::uint32_t p, std::uint64_t n, span<const std::uint64_t> bits) const {
    check_part(p);
    std::vector<std::uint64_t> out;
    std::uint64_t member = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
      if (part_of(i) != p) continue;
      if (member / 64 < bits.size() && ((bits[member / 64] >> (member % 64)) & 1) != 0) out.push_back(i);
      ++member;
    }
    for (std::uint64_t b = member; b < bits.size() * 64; ++b) {
      if (((bits[b / 64] >> (b % 64)) & 1) != 0) {
        throw format_error(wire::format_errc::bitmap_bit_past_end,
                           gradzip::detail::concat("partition::decode_bitmap: bit ", b, " is set past part ", p, "'s ",
                                                   member, " members"));
      }
    }
    return out;
  }

 private:
  void expect_split_sizes(std::uint64_t capacity, std::uint64_t overflow, span<std::uint64_t> slots,
                          span<std::uint64_t> counts, span<std::uint64_t> spill, span<std::uint32_t> spill_parts) const {
    GRADZIP_EXPECTS(capacity <= slots.size() / parts_ && counts.size() == parts_, "partition::split_fixed: ",
                    slots.size(), " slots and ", counts.size(), " counts for ", parts_, " parts of ", capacity);
    GRADZIP_EXPECTS(spill.size() >= overflow && spill_parts.size() >= overflow,
                    "partition::split_fixed: the overflow area needs ", overflow, " entries");
  }

  /// Part p exists (as the CUDA backend checks, detail/cuda/partition.cuh).
  void check_part(std::uint32_t p) const { GRADZIP_EXPECTS(p < parts_, "partition: part ", p, " of ", parts_); }

  std::uint32_t parts_;
  std::uint64_t seed_;
};

}  // namespace gradzip::hash
