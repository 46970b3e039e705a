// Host top-k: an O(n) selection on magnitude keys, one read of the input when k is small.
//
//   one read   a strided sample of x gives a bound that about k + 4 sigma keys exceed; one read
//              gathers every (index, value) whose key is at least the bound into each chunk's
//              share of a list, in index order. If at least k were gathered and no share
//              overflowed, the k-th largest and all its ties are in the list.
//   otherwise  (k large against the list, or the sample misled) a radix select:
//     read 1   histogram of the top 11 key bits, per chunk; the bin that holds the k-th largest
//              fixes, per chunk, how many keys lie at or above that bin's lowest key;
//     read 2   per chunk, gather those into the list at offsets known from the counts.
//   then       the threshold T is the k-th largest key of the list, and the emit walks the
//              list: keys > T and the lowest-indexed ties at T, indices sorted.
// When the list would exceed its capacity (n / 8, flat inputs or k above about 10 %), another
// histogram read refines the prefix first; if every key bit is resolved and it still does not
// fit, the emit reads x a third time instead of the list.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>

#include "gradzip/core/element_type.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/detail/host/match_scan.hpp"
#include "gradzip/detail/host/parallel.hpp"
#include "gradzip/detail/topk_select.hpp"

namespace gradzip::detail {

/// Stride of one sub-histogram: the bins, and one more that counts keys outside the prefix.
inline constexpr std::size_t topk_sub_stride = topk_digit_bins + 1;

template <class T>
struct host_topk_scratch {
  using Key = key_type_t<T>;
  std::uint64_t* hist;       // chunks x bins, this level's per-chunk histogram
  std::uint32_t* sub_hist;   // chunks x 4 x (bins + 1), the interleaved sub-histograms
  std::uint64_t* total;      // bins
  std::uint64_t* above;      // chunks: elements certainly selected (higher bins so far, then > T)
  std::uint64_t* in_bin;     // chunks: elements in the chosen bin
  std::uint64_t* out_at;     // chunks: first list entry, then first output position
  std::uint64_t* take_ties;  // chunks: ties at T this chunk emits
  std::uint64_t* list_at;    // chunks: chunk c's list entries are [list_at[c], list_end[c])
  std::uint64_t* list_end;   // chunks
  std::uint64_t* index;      // cap: the list's indices, in index order
  T* values;                 // cap: the list's values
  Key* keys;                 // cap: the list's keys, reordered by the threshold search

  /// Carves the scratch for `chunks` chunks and a list of `cap` entries from `carver`.
  host_topk_scratch(scratch_carver& carver, std::size_t chunks, std::size_t cap)
      : hist(carver.take<std::uint64_t>(chunks * topk_digit_bins)),
        sub_hist(carver.take<std::uint32_t>(chunks * 4 * topk_sub_stride)),
        total(carver.take<std::uint64_t>(topk_digit_bins)),
        above(carver.take<std::uint64_t>(chunks)),
        in_bin(carver.take<std::uint64_t>(chunks)),
        out_at(carver.take<std::uint64_t>(chunks)),
        take_ties(carver.take<std::uint64_t>(chunks)),
        list_at(carver.take<std::uint64_t>(chunks)),
        list_end(carver.take<std::uint64_t>(chunks)),
        index(carver.take<std::uint64_t>(cap)),
        values(carver.take<T>(cap)),
        keys(carver.take<Key>(cap)) {}
};

/// List capacity: the list path is taken when at most this many keys lie at or above the
/// chosen bin's lowest.
inline std::size_t host_topk_candidate_cap(std::size_t n) {
  return static_cast<std::size_t>(topk_candidate_capacity(n, 4096));
}

template <class T>
std::size_t host_topk_workspace_bytes(host& exec, std::size_t n) {
  scratch_carver dry(nullptr);
  host_topk_scratch<T>(dry, chunk_count(exec, n), host_topk_candidate_cap(n));
  return dry.used() + 64;
}

/**
 * Histogram of digit (key >> shift) & (bins - 1) over the keys of chunk [r.begin, r.end) that
 * match `prefix` under `prefix_mask`, into hist[0 .. bins). Blocks of 16: the digits first, in a
 * branch-free loop that vectorizes (a key outside the prefix gets the extra bin), then the
 * increments, spread over 4 sub-histograms so that runs of one bin do not wait on each other.
 */
template <class T, class Key>
void histogram_chunk(const T* x, index_range r, Key prefix, Key prefix_mask, int shift,
                     std::uint64_t* hist, std::uint32_t* sub) {
  constexpr std::size_t bins = topk_digit_bins, stride = topk_sub_stride, run = 256;
  constexpr std::size_t block = std::size_t{1} << 30;  // keeps the u32 sub-counts from overflowing
  const auto digit = [=](const T& v) -> std::uint32_t {  // masks, not a branch: it vectorizes
    const Key key = magnitude_key(v);
    const auto in_prefix = static_cast<std::uint32_t>(0) - static_cast<std::uint32_t>((key & prefix_mask) == prefix);
    return (static_cast<std::uint32_t>(key >> shift) & (bins - 1) & in_prefix) | (bins & ~in_prefix);
  };
  std::fill(hist, hist + bins, 0);
  for (std::size_t begin = r.begin; begin < r.end; begin += block) {
    const std::size_t end = std::min(r.end, begin + block);
    std::fill(sub, sub + 4 * stride, 0);
    std::size_t i = begin;
    for (; i + run <= end; i += run) {
      std::uint32_t d[run];
      for (std::size_t j = 0; j < run; ++j) d[j] = digit(x[i + j]);
      for (std::size_t j = 0; j < run; j += 4) {
        ++sub[d[j]];
        ++sub[stride + d[j + 1]];
        ++sub[2 * stride + d[j + 2]];
        ++sub[3 * stride + d[j + 3]];
      }
    }
    for (; i < end; ++i) ++sub[digit(x[i])];
    for (std::size_t b = 0; b < bins; ++b) {
      hist[b] += std::uint64_t{sub[b]} + sub[stride + b] + sub[2 * stride + b] + sub[3 * stride + b];
    }
  }
}

/// Keys never exceed the signed maximum, so a signed compare orders them the same (and
/// vectorizes on baseline x86-64): is x's key at least `low`?
template <class T>
auto key_at_least(key_type_t<T> low) {
  using signed_key = std::make_signed_t<key_type_t<T>>;
  return [low](const T& v) { return static_cast<signed_key>(magnitude_key(v)) >= static_cast<signed_key>(low); };
}

/**
 * Given per-chunk counts of keys above T (`s.above`) and of ties at T (`s.take_ties`, those
 * available), gives the ties to the lowest indices and sets each chunk's first output position.
 */
template <class T>
void host_topk_layout(host_topk_scratch<T>& s, std::size_t chunks, std::uint64_t k) {
  std::uint64_t certain = 0;
  for (std::size_t c = 0; c < chunks; ++c) certain += s.above[c];
  std::uint64_t ties_left = k - certain;
  for (std::size_t c = 0, at = 0; c < chunks; ++c) {
    s.take_ties[c] = std::min(s.take_ties[c], ties_left);
    ties_left -= s.take_ties[c];
    s.out_at[c] = at;
    at += s.above[c] + s.take_ties[c];
  }
}

/**
 * Writes the (index, value, key) of every element of x[r] whose key is at least `low` into the
 * list from entry `at`, at most `room` of them. Returns how many there are (more than `room`
 * means the rest were counted, not written).
 */
template <class T>
std::uint64_t host_topk_gather(const T* x, index_range r, key_type_t<T> low, host_topk_scratch<T>& s,
                               std::uint64_t at, std::uint64_t room) {
  std::uint64_t count = 0;
  for_each_match(x, r.begin, r.end, key_at_least<T>(low), [&](std::uint64_t i) {
    if (count < room) {
      s.index[at + count] = i;
      s.values[at + count] = x[i];
      s.keys[at + count] = magnitude_key(x[i]);
    }
    ++count;
  });
  return count;
}

/**
 * The threshold and the emit from the list, which holds every key >= some bound, at least k of
 * them: chunk c's entries are [list_at[c], list_end[c]), in index order, and s.keys[0, listed)
 * holds all their keys in any order. T is the k-th largest of them.
 */
template <class T, class Sink>
void host_topk_emit_list(host& exec, std::uint64_t k, host_topk_scratch<T>& s, std::size_t chunks,
                         std::uint64_t listed, const Sink& sink) {
  using Key = key_type_t<T>;
  std::nth_element(s.keys, s.keys + (k - 1), s.keys + listed, std::greater<Key>());
  const Key t = s.keys[k - 1];
  for (std::size_t c = 0; c < chunks; ++c) {
    s.above[c] = s.take_ties[c] = 0;
    for (std::uint64_t e = s.list_at[c]; e < s.list_end[c]; ++e) {
      const Key key = magnitude_key(s.values[e]);
      s.above[c] += key > t;
      s.take_ties[c] += key == t;
    }
  }
  host_topk_layout(s, chunks, k);
  for_each_chunk(exec, chunks, [&](std::size_t c) {
    std::uint64_t pos = s.out_at[c], ties = s.take_ties[c];
    for (std::uint64_t e = s.list_at[c]; e < s.list_end[c]; ++e) {
      const Key key = magnitude_key(s.values[e]);
      if (key > t || (key == t && ties > 0)) {
        ties -= key == t;
        sink(pos++, s.index[e], s.values[e]);
      }
    }
  });
}

/// Read 2 of the histogram path: every key >= low (`listed` of them, per chunk known from the
/// histograms) goes to the list, chunk after chunk; then the emit from the list.
template <class T, class Sink>
void host_topk_from_list(host& exec, span<const T> x, std::uint64_t k, host_topk_scratch<T>& s,
                         std::size_t chunks, key_type_t<T> low, std::uint64_t listed, const Sink& sink) {
  for (std::size_t c = 0, at = 0; c < chunks; ++c) {
    s.list_at[c] = at;
    at += s.above[c] + s.in_bin[c];
    s.list_end[c] = at;
  }
  for_each_chunk(exec, chunks, [&](std::size_t c) {
    host_topk_gather(x.data(), chunk_of(x.size(), chunks, c), low, s, s.list_at[c], s.list_end[c] - s.list_at[c]);
  });
  host_topk_emit_list(exec, k, s, chunks, listed, sink);
}

/**
 * The one-read path, tried first when k is small against the list: a strided sample of x gives
 * a bound that about k + 4 sigma keys exceed; one read gathers every key >= bound into each
 * chunk's share of the list (cap / chunks entries). If at least k were gathered and no chunk
 * overflowed, the k-th largest and all its ties are in the list: the emit uses it and x is read
 * once. Otherwise returns false, having written nothing to the sink.
 */
template <class T, class Sink>
bool host_topk_one_read(host& exec, span<const T> x, std::uint64_t k, host_topk_scratch<T>& s,
                        std::size_t chunks, std::size_t cap, const Sink& sink) {
  using Key = key_type_t<T>;
  const std::size_t n = x.size();
  const std::size_t m = topk_sample_size(n);
  const std::uint64_t rank = topk_sample_rank(n, k, m);
  const std::size_t room = cap / chunks;
  if (!topk_one_read_fits(n, m, rank, room)) return false;
  const auto r = static_cast<std::uint32_t>(n % m), m32 = static_cast<std::uint32_t>(m);
  for (std::size_t j = 0; j < m; ++j) s.keys[j] = magnitude_key(x[topk_sample_position(j, n / m, r, m32)]);
  std::nth_element(s.keys, s.keys + (rank - 1), s.keys + m, std::greater<Key>());
  const Key bound = s.keys[rank - 1];
  for_each_chunk(exec, chunks, [&](std::size_t c) {
    s.list_at[c] = c * room;
    s.list_end[c] = s.list_at[c] + host_topk_gather(x.data(), chunk_of(n, chunks, c), bound, s, c * room, room);
  });
  std::uint64_t listed = 0;
  for (std::size_t c = 0; c < chunks; ++c) {
    if (s.list_end[c] - s.list_at[c] > room) return false;
    listed += s.list_end[c] - s.list_at[c];
  }
  if (listed < k) return false;
  for (std::size_t c = 0, at = 0; c < chunks; ++c) {  // the keys side by side, for the threshold
    if (at != s.list_at[c]) std::copy(s.keys + s.list_at[c], s.keys + s.list_end[c], s.keys + at);  // at < list_at[c]
    at += s.list_end[c] - s.list_at[c];
  }
  host_topk_emit_list(exec, k, s, chunks, listed, sink);
  return true;
}

/// The emit when the list never fit: a third read of x, keys > t and the chunk's ties at t.
template <class T, class Sink>
void host_topk_from_x(host& exec, span<const T> x, key_type_t<T> t, host_topk_scratch<T>& s,
                      std::size_t chunks, const Sink& sink) {
  using Key = key_type_t<T>;
  const std::size_t n = x.size();
  for_each_chunk(exec, chunks, [&](std::size_t c) {
    std::uint64_t pos = s.out_at[c], ties = s.take_ties[c];
    const index_range r = chunk_of(n, chunks, c);
    for_each_match(x.data(), r.begin, r.end, key_at_least<T>(t), [&](std::uint64_t i) {
      const Key key = magnitude_key(x[i]);
      if (key > t || ties > 0) {
        if (key == t) --ties;
        sink(pos++, i, x[i]);
      }
    });
  });
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
  host_topk_scratch<T> s(carver, chunks, cap);
  constexpr int bins = topk_digit_bins;
  if (host_topk_one_read(exec, x, k, s, chunks, cap, sink)) return;

  Key prefix = 0, prefix_mask = 0;
  std::uint64_t rank = k;  // rank of the threshold element among those matching the prefix
  std::fill(s.above, s.above + chunks, 0);
  for (int high = magnitude_key_bits<Key>;;) {
    const int shift = std::max(0, high - topk_digit_bits);
    for_each_chunk(exec, chunks, [&](std::size_t c) {
      histogram_chunk(x.data(), chunk_of(n, chunks, c), prefix, prefix_mask, shift,
                      s.hist + c * bins, s.sub_hist + c * 4 * topk_sub_stride);
    });
    std::fill(s.total, s.total + bins, 0);
    for (std::size_t c = 0; c < chunks; ++c) {
      for (int b = 0; b < bins; ++b) s.total[b] += s.hist[c * bins + b];
    }
    std::uint64_t above = 0;
    const int bin = find_rank_bin(s.total, bins, rank, above);
    std::uint64_t listed = 0;  // keys at or above the bin's lowest, over all chunks
    for (std::size_t c = 0; c < chunks; ++c) {
      const std::uint64_t* h = s.hist + c * bins;
      for (int b = bin + 1; b < bins; ++b) s.above[c] += h[b];
      s.in_bin[c] = h[bin];
      listed += s.above[c] + s.in_bin[c];
    }
    rank -= above;
    prefix |= static_cast<Key>(bin) << shift;
    prefix_mask |= static_cast<Key>(bins - 1) << shift;
    high = shift;
    if (listed <= cap) return host_topk_from_list(exec, x, k, s, chunks, prefix, listed, sink);
    if (high == 0) {  // every key bit resolved: the bin's elements all equal the threshold
      std::copy(s.in_bin, s.in_bin + chunks, s.take_ties);  // ties available
      host_topk_layout(s, chunks, k);
      return host_topk_from_x(exec, x, prefix, s, chunks, sink);
    }
  }
}

}  // namespace gradzip::detail
