// structure_backend<host, sparsify::sampled_topk>: the sample's bracket by nth_element, the
// refinement rounds as parallel histograms, then the count and the emit at the threshold found.
//
// One read of x where the candidates fit: the first round, which bins every key at or above the
// bracket's low end (`floor`), also gathers those elements into each chunk's share of a list
// (index order). Later rounds whose bracket stays at or above the floor, and the count and the
// emit at a threshold at or above it, then read the list instead of x: every element they look
// at has a key >= floor. When a share overflows (the list holds n / 8 elements) or the search
// leaves the floor (the sample's bracket was too high), they read x, as the threshold stage does.
#pragma once

#include <algorithm>
#include <functional>

#include "gradzip/detail/codec_traits.hpp"
#include "gradzip/detail/host/threshold.hpp"
#include "gradzip/detail/topk_select.hpp"
#include "gradzip/sparsify/sampled_topk.hpp"

namespace gradzip::detail {

template <>
struct structure_backend<host, sparsify::sampled_topk> {
  using search = sparsify::detail::threshold_search;
  using inner = structure_backend<host, sparsify::threshold>;

  /// Scratch: the threshold stage's, then the chosen threshold, the sample's keys, one histogram
  /// per chunk, and the candidate list (n / 8 entries of index, value and key: 14-20 bytes each).
  template <class T>
  static std::size_t workspace_bytes(host& exec, std::size_t n) {
    return layout_of<T>(exec, n).end;
  }

  template <class T>
  static std::uint64_t count(host& exec, const sparsify::sampled_topk& s, span<const T> x) {
    const std::uint64_t n = x.size();
    const std::uint64_t k = s.target_count(n);
    const layout l = layout_of<T>(exec, n);
    std::byte* scratch = exec.scratch(l.end);
    double& tau = *reinterpret_cast<double*>(scratch + l.tau);
    const candidates<T> list = candidates_in<T>(scratch, l);
    *list.valid = 0;
    if (k == 0) return 0;  // keep nothing (not even NaN)
    search state = bracket(exec, s, x, k, reinterpret_cast<std::uint32_t*>(scratch + l.sample));
    auto* hist = reinterpret_cast<std::uint64_t*>(scratch + l.histograms);
    const std::uint32_t floor = state.lo;  // the first round gathers every key >= floor
    bool listed = false;                   // whether the list holds them all
    const bool gather = search::gather_pays(k, n, s.sample_size(n), list.room * list.chunks);
    for (int round = 0; !state.done; ++round) {
      GRADZIP_EXPECTS(round < search::max_rounds, "sampled_topk: the threshold search did not converge");
      if (round == 0) {
        listed = histogram(exec, state, x, hist, gather ? list : candidates<T>{});
      } else if (listed && state.lo >= floor) {
        histogram_listed(state, list, hist);
      } else {
        listed = false;
        histogram(exec, state, x, hist, candidates<T>{});
      }
      state.decide(hist, k, sparsify::sampled_topk::upper_count(k, n));
    }
    tau = sparsify::detail::least_double_rounding_to(state.tau_key);  // float inputs compare with its float, tau_key's
    const sparsify::threshold cut{tau};
    // A key >= tau_key >= floor is listed (tau_key can fall below floor where the floor was
    // inf's or NaN's key: max_threshold_key caps it). A subnormal tau is left to the x path
    // (smallest_normal_key).
    if (!listed || state.tau_key < floor || state.tau_key < sparsify::detail::smallest_normal_key) {
      return inner::count(exec, cut, x);
    }
    *list.valid = 1;
    return count_listed(exec, cut, list, reinterpret_cast<std::uint64_t*>(scratch));
  }

  template <class T, class Sink>
  static void select(host& exec, const sparsify::sampled_topk&, span<const T> x, std::uint64_t k,
                     const Sink& sink) {
    if (k == 0) return;
    const layout l = layout_of<T>(exec, x.size());
    std::byte* scratch = exec.scratch(l.end);
    const sparsify::threshold cut{*reinterpret_cast<const double*>(scratch + l.tau)};
    const candidates<T> list = candidates_in<T>(scratch, l);
    if (*list.valid == 0) return inner::select(exec, cut, x, k, sink);
    emit_listed(exec, cut, list, reinterpret_cast<const std::uint64_t*>(scratch), sink);
  }

 private:
  struct layout {
    std::size_t tau = 0, sample = 0, histograms = 0, valid = 0, gathered = 0, index = 0, values = 0, keys = 0,
                end = 0;
    std::size_t chunks = 1, room = 0;  // the list: `chunks` shares of `room` entries
  };

  /// The elements whose keys are at least the first bracket's floor, chunk c's (of `chunks`, as
  /// the threshold stage splits x) from entry c x room: gathered[c] of them (more than room: it
  /// overflowed, and the rest were counted, not written). No list where index is null.
  template <class T>
  struct candidates {
    std::uint64_t* valid = nullptr;     // 1 when select reads the list
    std::uint64_t* gathered = nullptr;  // chunks
    std::uint64_t* index = nullptr;
    T* values = nullptr;
    std::uint32_t* keys = nullptr;
    std::size_t chunks = 0, room = 0;
  };

  template <class T>
  static layout layout_of(host& exec, std::size_t n) {
    const auto up = [](std::size_t b) { return (b + 63) / 64 * 64; };
    layout l;
    l.tau = up(inner::workspace_bytes<T>(exec, n));
    l.sample = l.tau + 64;
    l.histograms = up(l.sample + sparsify::sampled_topk::sample_size(n, sparsify::sampled_topk::max_sample_rate) * 4);
    l.chunks = chunk_count(exec, n);  // the histograms' and the list's chunks, as the threshold stage's
    l.valid = up(l.histograms + l.chunks * (search::bins + 1) * sizeof(std::uint64_t));
    l.room = static_cast<std::size_t>(topk_candidate_capacity(n, 4096)) / l.chunks;
    l.gathered = l.valid + 64;
    l.index = up(l.gathered + l.chunks * sizeof(std::uint64_t));
    l.values = up(l.index + l.chunks * l.room * sizeof(std::uint64_t));
    l.keys = up(l.values + l.chunks * l.room * sizeof(T));
    l.end = up(l.keys + l.chunks * l.room * sizeof(std::uint32_t));
    return l;
  }

  template <class T>
  static candidates<T> candidates_in(std::byte* scratch, const layout& l) {
    return {reinterpret_cast<std::uint64_t*>(scratch + l.valid), reinterpret_cast<std::uint64_t*>(scratch + l.gathered),
            reinterpret_cast<std::uint64_t*>(scratch + l.index), reinterpret_cast<T*>(scratch + l.values),
            reinterpret_cast<std::uint32_t*>(scratch + l.keys), l.chunks, l.room};
  }

  /// Step 2: the sample's keys at ranks m / 2 and 2m (nth_element: the same keys a sort gives).
  template <class T>
  static search bracket(host& exec, const sparsify::sampled_topk& s, span<const T> x, std::uint64_t k,
                        std::uint32_t* keys) {
    const std::uint64_t n = x.size();
    const std::uint64_t size = s.sample_size(n);
    const std::size_t chunks = chunk_count(exec, size);
    for_each_chunk(exec, chunks, [&](std::size_t c) {
      const index_range r = chunk_of(size, chunks, c);
      // Each sample is a cache line of its own (n / size elements apart): its load is prefetched
      // `ahead` samples before it is read, so that many misses are in flight, not a few.
      constexpr std::uint64_t ahead = 16;
      std::uint64_t pending[ahead] = {};  // each read after its write; nvcc cannot see that (#549)
      const auto read = [&](std::uint64_t j) {
        keys[j] = sparsify::detail::magnitude_key(static_cast<float>(to_float(x[pending[j % ahead]])));
      };
      sparsify::sampled_topk::for_each_sample_position(s.seed(), n, size, r.begin, r.end,
                                                       [&](std::uint64_t j, std::uint64_t i) {
        __builtin_prefetch(x.data() + i);
        if (j >= r.begin + ahead) read(j - ahead);
        pending[j % ahead] = i;
      });
      for (std::uint64_t j = r.end > r.begin + ahead ? r.end - ahead : r.begin; j < r.end; ++j) read(j);
    });
    std::uint64_t high_rank = 1, low_rank = 1;
    search::bracket_ranks(k, n, size, high_rank, low_rank);
    std::nth_element(keys, keys + (low_rank - 1), keys + size, std::greater<>());
    const std::uint32_t low = keys[low_rank - 1];
    std::nth_element(keys, keys + (high_rank - 1), keys + (low_rank - 1), std::greater<>());
    const std::uint32_t high = high_rank == low_rank ? low : keys[high_rank - 1];
    search state;
    state.start(high, low, k, n);
    return state;
  }

  /// Step 3's pass: per-chunk histograms of the keys in the search's range, summed in hist[0];
  /// where `list` has an index array, each key >= the range's low end also goes to its chunk's
  /// share. Returns whether every share held its chunk's keys.
  template <class T>
  static bool histogram(host& exec, const search& state, span<const T> x, std::uint64_t* hist,
                        const candidates<T>& list) {
    constexpr std::size_t width = search::bins + 1;
    const std::size_t chunks = chunk_count(exec, x.size());
    for_each_chunk(exec, chunks, [&](std::size_t c) {
      std::uint64_t* h = hist + c * width;
      std::fill(h, h + width, std::uint64_t{0});
      const index_range r = chunk_of(x.size(), chunks, c);
      const search local = state;
      const T* data = x.data();
      const std::size_t first = c * list.room;
      std::uint64_t gathered = 0;
      const auto add = [&](std::size_t i) {
        const std::uint32_t key = sparsify::detail::magnitude_key(static_cast<float>(to_float(data[i])));
        const int b = local.bin_of(key);
        if (b >= 0) ++h[b];
        if (list.index != nullptr && gathered < list.room) {
          list.index[first + gathered] = i;
          list.values[first + gathered] = data[i];
          list.keys[first + gathered] = key;
        }
        ++gathered;
      };
      // Most keys lie below the bracket: only those at or above its low end are binned.
      const auto in_bracket = [&](const T& v) {
        return sparsify::detail::magnitude_key(static_cast<float>(to_float(v))) >= local.lo;
      };
      for_each_match(data, r.begin, r.end, in_bracket, add);
      if (list.index != nullptr) list.gathered[c] = gathered;
    });
    sum_histograms(hist, chunks);
    if (list.index == nullptr) return false;
    for (std::size_t c = 0; c < chunks; ++c) {
      if (list.gathered[c] > list.room) return false;
    }
    return true;
  }

  /// A later round's histogram from the list (a few k entries: one thread).
  template <class T>
  static void histogram_listed(const search& state, const candidates<T>& list, std::uint64_t* hist) {
    std::fill(hist, hist + search::bins + 1, std::uint64_t{0});
    for (std::size_t c = 0; c < list.chunks; ++c) {
      const std::uint32_t* keys = list.keys + c * list.room;
      for (std::uint64_t e = 0; e < list.gathered[c]; ++e) {
        const int b = state.bin_of(keys[e]);
        if (b >= 0) ++hist[b];
      }
    }
  }

  static void sum_histograms(std::uint64_t* hist, std::size_t chunks) {
    constexpr std::size_t width = search::bins + 1;
    for (std::size_t c = 1; c < chunks; ++c) {
      for (std::size_t b = 0; b < width; ++b) hist[b] += hist[c * width + b];
    }
  }

  /// The threshold stage's count, from the list: the listed elements that pass, per chunk into
  /// counts (where the threshold stage keeps its own, for `emit_listed`).
  template <class T>
  static std::uint64_t count_listed(host& exec, const sparsify::threshold& cut, const candidates<T>& list,
                                    std::uint64_t* counts) {
    return inner::count_by_chunk<T>(exec, cut, list.chunks, counts, [&](std::size_t c, auto t) {
      const T* values = list.values + c * list.room;
      std::uint64_t kept = 0;
      for (std::uint64_t e = 0; e < list.gathered[c]; ++e) kept += sparsify::detail::passes(to_float(values[e]), t) ? 1 : 0;
      return kept;
    });
  }

  /// The threshold stage's emit, from the list: chunk c's passing elements in index order, after
  /// the counts of chunks < c.
  template <class T, class Sink>
  static void emit_listed(host& exec, const sparsify::threshold& cut, const candidates<T>& list,
                          const std::uint64_t* counts, const Sink& sink) {
    inner::emit_by_chunk<T>(exec, cut, list.chunks, counts, [&](std::size_t c, auto t, std::uint64_t pos) {
      const std::uint64_t* index = list.index + c * list.room;
      const T* values = list.values + c * list.room;
      const Sink local = sink;
      for (std::uint64_t e = 0; e < list.gathered[c]; ++e) {
        if (sparsify::detail::passes(to_float(values[e]), t)) local(pos++, index[e], values[e]);
      }
    });
  }
};

}  // namespace gradzip::detail
