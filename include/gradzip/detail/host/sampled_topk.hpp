// structure_backend<host, sparsify::sampled_topk>: the sample's bracket by nth_element, the
// refinement rounds as parallel histograms, then the threshold stage's count and emit passes.
#pragma once

#include <algorithm>
#include <functional>

#include "gradzip/detail/codec_traits.hpp"
#include "gradzip/detail/host/threshold.hpp"
#include "gradzip/sparsify/sampled_topk.hpp"

namespace gradzip::detail {

template <>
struct structure_backend<host, sparsify::sampled_topk> {
  using search = sparsify::detail::threshold_search;
  using inner = structure_backend<host, sparsify::threshold>;

  /// Scratch: the threshold stage's, then the chosen threshold, the sample's keys, and one
  /// histogram per chunk.
  template <class T>
  static std::size_t workspace_bytes(host& exec, std::size_t n) {
    const layout l = layout_of<T>(exec, n);
    return l.histograms + chunk_count(exec, n) * (search::bins + 1) * sizeof(std::uint64_t);
  }

  template <class T>
  static std::uint64_t count(host& exec, const sparsify::sampled_topk& s, span<const T> x) {
    const std::uint64_t n = x.size();
    const std::uint64_t k = s.target_count(n);
    const layout l = layout_of<T>(exec, n);
    std::byte* scratch = exec.scratch(workspace_bytes<T>(exec, n));
    double& tau = *reinterpret_cast<double*>(scratch + l.tau);
    if (k == 0) return 0;  // keep nothing (not even NaN)
    search state = bracket(exec, s, x, k, reinterpret_cast<std::uint32_t*>(scratch + l.sample));
    auto* hist = reinterpret_cast<std::uint64_t*>(scratch + l.histograms);
    for (int round = 0; !state.done; ++round) {
      GRADZIP_EXPECTS(round < search::max_rounds, "sampled_topk: the threshold search did not converge");
      histogram(exec, state, x, hist);
      state.decide(hist, k, sparsify::sampled_topk::upper_count(k, n));
    }
    float t;
    std::memcpy(&t, &state.tau_key, 4);
    tau = t;
    return inner::count(exec, sparsify::threshold{tau}, x);
  }

  template <class T, class Sink>
  static void select(host& exec, const sparsify::sampled_topk&, span<const T> x, std::uint64_t k,
                     const Sink& sink) {
    if (k == 0) return;
    const double tau = *reinterpret_cast<const double*>(exec.scratch(workspace_bytes<T>(exec, x.size())) +
                                                        layout_of<T>(exec, x.size()).tau);
    inner::select(exec, sparsify::threshold{tau}, x, k, sink);
  }

 private:
  struct layout {
    std::size_t tau = 0, sample = 0, histograms = 0;
  };

  template <class T>
  static layout layout_of(host& exec, std::size_t n) {
    const auto up = [](std::size_t b) { return (b + 63) / 64 * 64; };
    layout l;
    l.tau = up(inner::workspace_bytes<T>(exec, n));
    l.sample = l.tau + 64;
    l.histograms = up(l.sample + sparsify::sampled_topk::sample_size(n, sparsify::sampled_topk::max_sample_rate) * 4);
    return l;
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
      for (std::uint64_t j = r.begin; j < r.end; ++j) {
        const std::uint64_t i = sparsify::sampled_topk::sample_position(s.seed(), n, size, j);
        keys[j] = sparsify::detail::magnitude_key(static_cast<float>(to_float(x[i])));
      }
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

  /// Step 3's pass: per-chunk histograms of the keys in the search's range, summed in hist[0].
  template <class T>
  static void histogram(host& exec, const search& state, span<const T> x, std::uint64_t* hist) {
    constexpr std::size_t width = search::bins + 1;
    const std::size_t chunks = chunk_count(exec, x.size());
    for_each_chunk(exec, chunks, [&](std::size_t c) {
      std::uint64_t* h = hist + c * width;
      std::fill(h, h + width, std::uint64_t{0});
      const index_range r = chunk_of(x.size(), chunks, c);
      const search local = state;
      const T* data = x.data();
      const auto add = [&](std::size_t i) {
        const int b = local.bin_of(sparsify::detail::magnitude_key(static_cast<float>(to_float(data[i]))));
        if (b >= 0) ++h[b];
      };
      // Most keys lie below the bracket: only those at or above its low end are binned.
      const auto in_bracket = [&](const T& v) {
        return sparsify::detail::magnitude_key(static_cast<float>(to_float(v))) >= local.lo;
      };
      for_each_match(data, r.begin, r.end, in_bracket, add);
    });
    for (std::size_t c = 1; c < chunks; ++c) {
      for (std::size_t b = 0; b < width; ++b) hist[b] += hist[c * width + b];
    }
  }
};

}  // namespace gradzip::detail
