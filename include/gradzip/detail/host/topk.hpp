// Host top-k: an O(n) radix select on magnitude keys, three reads of the input.
//
//   read 1  histogram of the top 11 key bits, per chunk (4 interleaved sub-histograms to break
//           the store-to-load dependency on runs of equal bins)
//   read 2  gather the keys in the bin that holds the k-th largest into a candidate buffer
//           (when it holds more than n/8 keys, refine with further histogram reads instead)
//   read 3  per chunk, emit elements with key > T and the chunk's share of ties at T, in index
//           order, at offsets computed from the per-chunk counts: indices come out sorted.
#pragma once

#include <algorithm>
#include <functional>
#include <vector>

#include "gradzip/core/element_type.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/detail/host/parallel.hpp"
#include "gradzip/detail/topk_select.hpp"

namespace gradzip::detail {

template <class Key>
struct host_topk_scratch {
  std::uint64_t* hist;       // chunks x bins, this level's per-chunk histogram
  std::uint32_t* sub_hist;   // chunks x 4 x bins, the interleaved sub-histograms
  std::uint64_t* total;      // bins
  std::uint64_t* above;      // chunks: elements certainly selected (higher bins so far)
  std::uint64_t* in_bin;     // chunks: elements in the chosen bin
  std::uint64_t* out_at;     // chunks: first output position
  std::uint64_t* take_ties;  // chunks: ties at T this chunk emits
  Key* candidates;           // cap
  Key* candidates_sorted;    // cap

  /// Carves the scratch for `chunks` chunks and `cap` candidates from `carver`.
  host_topk_scratch(scratch_carver& carver, std::size_t chunks, std::size_t cap)
      : hist(carver.take<std::uint64_t>(chunks * topk_digit_bins)),
        sub_hist(carver.take<std::uint32_t>(chunks * 4 * topk_digit_bins)),
        total(carver.take<std::uint64_t>(topk_digit_bins)),
        above(carver.take<std::uint64_t>(chunks)),
        in_bin(carver.take<std::uint64_t>(chunks)),
        out_at(carver.take<std::uint64_t>(chunks)),
        take_ties(carver.take<std::uint64_t>(chunks)),
        candidates(carver.take<Key>(cap)),
        candidates_sorted(carver.take<Key>(cap)) {}
};

/// Candidate buffer size: the gather path is used when the chosen bin holds at most this many.
inline std::size_t host_topk_candidate_cap(std::size_t n) {
  return std::min<std::size_t>(n, std::max<std::size_t>(n / 8, 4096));
}

template <class T>
std::size_t host_topk_workspace_bytes(host& exec, std::size_t n) {
  scratch_carver dry(nullptr);
  host_topk_scratch<key_type_t<T>>(dry, chunk_count(exec, n), host_topk_candidate_cap(n));
  return dry.used() + 64;
}

/**
 * Histogram of digit (key >> shift) & (bins - 1) over the keys of chunk [r.begin, r.end) that
 * match `prefix` under `prefix_mask`, into hist[0 .. bins).
 */
template <class T, class Key>
void histogram_chunk(const T* x, index_range r, Key prefix, Key prefix_mask, int shift,
                     std::uint64_t* hist, std::uint32_t* sub) {
  constexpr std::size_t bins = topk_digit_bins;
  constexpr std::size_t block = std::size_t{1} << 30;  // keeps the u32 sub-counts from overflowing
  std::fill(hist, hist + bins, 0);
  for (std::size_t begin = r.begin; begin < r.end; begin += block) {
    const std::size_t end = std::min(r.end, begin + block);
    std::fill(sub, sub + 4 * bins, 0);
    std::size_t i = begin;
    auto count = [&](std::size_t lane, std::size_t at) {
      const Key key = magnitude_key(x[at]);
      if ((key & prefix_mask) == prefix) ++sub[lane * bins + ((key >> shift) & (bins - 1))];
    };
    for (; i + 4 <= end; i += 4) {
      count(0, i);
      count(1, i + 1);
      count(2, i + 2);
      count(3, i + 3);
    }
    for (; i < end; ++i) count(0, i);
    for (std::size_t b = 0; b < bins; ++b) {
      hist[b] += std::uint64_t{sub[b]} + sub[bins + b] + sub[2 * bins + b] + sub[3 * bins + b];
    }
  }
}

/// Elements per block of the gather and compaction passes, which first test a whole block with
/// a branch-free (vectorizable) loop and skip it when no element qualifies: at 1 % density most
/// blocks are skipped.
inline constexpr std::size_t topk_scan_block = 64;

/// Calls f(i) for each i in r with pred(x[i]), skipping blocks where pred holds nowhere.
template <class T, class Pred, class F>
void for_each_match(const T* x, index_range r, const Pred& pred, F&& f) {
  std::size_t i = r.begin;
  for (; i + topk_scan_block <= r.end; i += topk_scan_block) {
    unsigned any = 0;
    for (std::size_t j = 0; j < topk_scan_block; ++j) any |= static_cast<unsigned>(pred(x[i + j]));
    if (!any) continue;
    for (std::size_t j = i; j < i + topk_scan_block; ++j) {
      if (pred(x[j])) f(j);
    }
  }
  for (; i < r.end; ++i) {
    if (pred(x[i])) f(i);
  }
}

/**
 * Selects the k elements of x with the largest magnitude (ties to the lower index) and calls
 * sink(position, index, value) for each, positions 0..k-1 in ascending index order.
 */
template <class T, class Sink>
void host_topk(host& exec, span<const T> x, std::uint64_t k, const Sink& sink) {
  using Key = key_type_t<T>;
  const std::size_t n = x.size();
  if (k == 0 || n == 0) return;
  const std::size_t chunks = chunk_count(exec, n);
  const std::size_t cap = host_topk_candidate_cap(n);
  scratch_carver carver(exec.scratch(host_topk_workspace_bytes<T>(exec, n)));
  host_topk_scratch<Key> s(carver, chunks, cap);
  constexpr int bins = topk_digit_bins;

  Key prefix = 0, prefix_mask = 0, threshold = 0;
  std::uint64_t rank = k;  // rank of the threshold element among those matching the prefix
  std::fill(s.above, s.above + chunks, 0);

  for (int high = magnitude_key_bits<Key>;;) {
    const int low = std::max(0, high - topk_digit_bits);
    const int shift = low;
    for_each_chunk(exec, chunks, [&](std::size_t c) {
      histogram_chunk(x.data(), chunk_of(n, chunks, c), prefix, prefix_mask, shift,
                      s.hist + c * bins, s.sub_hist + c * 4 * bins);
    });
    std::fill(s.total, s.total + bins, 0);
    for (std::size_t c = 0; c < chunks; ++c) {
      for (int b = 0; b < bins; ++b) s.total[b] += s.hist[c * bins + b];
    }
    std::uint64_t above = 0;
    const int bin = find_rank_bin(s.total, bins, rank, above);
    for (std::size_t c = 0; c < chunks; ++c) {
      const std::uint64_t* h = s.hist + c * bins;
      for (int b = bin + 1; b < bins; ++b) s.above[c] += h[b];
      s.in_bin[c] = h[bin];
    }
    rank -= above;
    prefix |= static_cast<Key>(bin) << shift;
    prefix_mask |= static_cast<Key>(bins - 1) << shift;
    high = low;

    if (high == 0) {  // every key bit resolved: the bin's elements all equal the threshold
      threshold = prefix;
      for (std::size_t c = 0; c < chunks; ++c) s.take_ties[c] = s.in_bin[c];  // ties available
      break;
    }
    std::uint64_t in_bin_total = 0;
    for (std::size_t c = 0; c < chunks; ++c) in_bin_total += s.in_bin[c];
    if (in_bin_total > cap) continue;  // too many candidates to gather: refine by another read

    // Gather the candidates' keys, chunk by chunk, then find the rank-th largest among them.
    for (std::size_t c = 0, at = 0; c < chunks; ++c) {
      s.out_at[c] = at;
      at += s.in_bin[c];
    }
    for_each_chunk(exec, chunks, [&](std::size_t c) {
      const index_range r = chunk_of(n, chunks, c);
      Key* out = s.candidates + s.out_at[c];
      const auto in_bin = [=](const T& v) { return (magnitude_key(v) & prefix_mask) == prefix; };
      for_each_match(x.data(), r, in_bin, [&](std::size_t i) { *out++ = magnitude_key(x[i]); });
    });
    std::copy(s.candidates, s.candidates + in_bin_total, s.candidates_sorted);
    std::nth_element(s.candidates_sorted, s.candidates_sorted + (rank - 1),
                     s.candidates_sorted + in_bin_total, std::greater<Key>());
    threshold = s.candidates_sorted[rank - 1];
    for (std::size_t c = 0; c < chunks; ++c) {
      const Key* begin = s.candidates + s.out_at[c];
      const Key* end = begin + s.in_bin[c];
      s.above[c] += static_cast<std::uint64_t>(
          std::count_if(begin, end, [&](Key key) { return key > threshold; }));
      s.take_ties[c] = static_cast<std::uint64_t>(std::count(begin, end, threshold));
    }
    break;
  }

  // Ties at the threshold go to the lowest indices: walk chunks in order, then lay out outputs.
  std::uint64_t certain = 0;
  for (std::size_t c = 0; c < chunks; ++c) certain += s.above[c];
  std::uint64_t ties_left = k - certain;
  for (std::size_t c = 0, at = 0; c < chunks; ++c) {
    s.take_ties[c] = std::min(s.take_ties[c], ties_left);
    ties_left -= s.take_ties[c];
    s.out_at[c] = at;
    at += s.above[c] + s.take_ties[c];
  }

  for_each_chunk(exec, chunks, [&](std::size_t c) {
    const index_range r = chunk_of(n, chunks, c);
    std::uint64_t pos = s.out_at[c];
    std::uint64_t ties = s.take_ties[c];
    const Key t = threshold;
    // Keys never exceed the signed maximum, so a signed compare orders them the same (and
    // vectorizes on baseline x86-64).
    using signed_key = std::make_signed_t<Key>;
    const auto candidate = [t](const T& v) {
      return static_cast<signed_key>(magnitude_key(v)) >= static_cast<signed_key>(t);
    };
    for_each_match(x.data(), r, candidate, [&](std::size_t i) {
      const Key key = magnitude_key(x[i]);
      if (key > t || ties > 0) {
        if (key == t) --ties;
        sink(pos++, i, x[i]);
      }
    });
  });
}

}  // namespace gradzip::detail
