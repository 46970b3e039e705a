// structure_backend<host, hash::hashed_topk>: the sample's threshold, survivors into slots with a
// 64-bit compare-and-swap max (the rule makes the winner independent of the order), then a
// winner count per chunk and an ordered emit. Survivors are found 64 at a time with a
// vectorized compare, as the threshold stage's emit does.
#pragma once
#include <algorithm>
#include <functional>

#include "gradzip/detail/codec_traits.hpp"
#include "gradzip/detail/host/match_scan.hpp"
#include "gradzip/detail/host/parallel.hpp"
#include "gradzip/hash/hashed_topk.hpp"

namespace gradzip::detail {

template <>
struct structure_backend<host, hash::hashed_topk> {
  template <class T>
  static std::size_t workspace_bytes(host& exec, const hash::hashed_topk& s, std::size_t n) {
    return layout_of(exec, s, n).total;
  }

  template <class T>
  static std::uint64_t count(host& exec, const hash::hashed_topk& s, span<const T> x) {
    const std::uint64_t n = x.size();
    GRADZIP_EXPECTS(n <= hash::hashed_topk::max_elements, "hashed_topk: n = ", n, " exceeds 2^33 - 1");
    const layout l = layout_of(exec, s, n);
    std::byte* scratch = exec.scratch(l.total);
    auto* slots = reinterpret_cast<std::uint64_t*>(scratch + l.slots);
    auto* counts = reinterpret_cast<std::uint64_t*>(scratch + l.counts);
    std::uint32_t& tau = *reinterpret_cast<std::uint32_t*>(scratch + l.tau);
    const std::uint64_t k = s.target_count(n), m = s.slots(n);
    const std::size_t chunks = chunk_count(exec, n);
    std::fill(counts, counts + chunks, std::uint64_t{0});
    if (k == 0 || m == 0) {
      tau = 0xFFFFFFFFu;  // above every key: no survivor
      return 0;
    }
    tau = threshold_key(s, x, k, reinterpret_cast<std::uint32_t*>(scratch + l.keys));
    std::fill(slots, slots + m, std::uint64_t{0});
    const std::uint64_t seed = s.seed();
    for_each_chunk(exec, chunks, [&](std::size_t c) {  // survivors into slots
      const index_range r = chunk_of(n, chunks, c);
      for_each_survivor(x.data(), r.begin, r.end, tau, [&](std::uint64_t i, std::uint32_t key) {
        std::uint64_t* slot = slots + hash::hashed_topk::slot_of(seed, i, m);
        const std::uint64_t word = hash::hashed_topk::slot_word(key, i);
        std::uint64_t seen = __atomic_load_n(slot, __ATOMIC_RELAXED);
        while (word > seen && !__atomic_compare_exchange_n(slot, &seen, word, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        }
      });
    });
    for_each_chunk(exec, chunks, [&](std::size_t c) {  // the winners per chunk
      const index_range r = chunk_of(n, chunks, c);
      std::uint64_t won = 0;
      for_each_survivor(x.data(), r.begin, r.end, tau, [&](std::uint64_t i, std::uint32_t key) {
        won += slots[hash::hashed_topk::slot_of(seed, i, m)] == hash::hashed_topk::slot_word(key, i) ? 1 : 0;
      });
      counts[c] = won;
    });
    std::uint64_t total = 0;
    for (std::size_t c = 0; c < chunks; ++c) total += counts[c];
    return total;
  }

  /// Emits the winners in index order; chunk c starts after the winners of chunks < c.
  template <class T, class Sink>
  static void select(host& exec, const hash::hashed_topk& s, span<const T> x, std::uint64_t, const Sink& sink) {
    const std::uint64_t n = x.size();
    const layout l = layout_of(exec, s, n);
    std::byte* scratch = exec.scratch(l.total);
    const auto* slots = reinterpret_cast<const std::uint64_t*>(scratch + l.slots);
    const auto* counts = reinterpret_cast<const std::uint64_t*>(scratch + l.counts);
    const std::uint32_t tau = *reinterpret_cast<const std::uint32_t*>(scratch + l.tau);
    if (tau == 0xFFFFFFFFu) return;
    const std::uint64_t m = s.slots(n), seed = s.seed();
    const std::size_t chunks = chunk_count(exec, n);
    for_each_chunk(exec, chunks, [&](std::size_t c) {
      std::uint64_t pos = 0;
      for (std::size_t d = 0; d < c; ++d) pos += counts[d];
      const index_range r = chunk_of(n, chunks, c);
      const Sink local = sink;
      const T* data = x.data();
      for_each_survivor(data, r.begin, r.end, tau, [&](std::uint64_t i, std::uint32_t key) {
        if (slots[hash::hashed_topk::slot_of(seed, i, m)] == hash::hashed_topk::slot_word(key, i)) local(pos++, i, data[i]);
      });
    });
  }

 private:
  struct layout {
    std::size_t slots = 0, keys = 0, counts = 0, tau = 0, total = 0;
  };

  static layout layout_of(host& exec, const hash::hashed_topk& s, std::size_t n) {
    const auto up = [](std::size_t b) { return (b + 63) / 64 * 64; };
    layout l;
    l.keys = up(s.slots(n) * sizeof(std::uint64_t));
    l.counts = up(l.keys + sparsify::sampled_topk::sample_size(n, s.sample_rate()) * 4);
    l.tau = up(l.counts + chunk_count(exec, n) * sizeof(std::uint64_t));
    l.total = l.tau + 64;
    return l;
  }

  /// The sample's magnitude key at rank ceil(k s / n) (0 when every element is wanted).
  template <class T>
  static std::uint32_t threshold_key(const hash::hashed_topk& s, span<const T> x, std::uint64_t k, std::uint32_t* keys) {
    const std::uint64_t n = x.size();
    if (k >= n) return 0;
    const std::uint64_t size = sparsify::sampled_topk::sample_size(n, s.sample_rate());
    for (std::uint64_t j = 0; j < size; ++j) {
      const std::uint64_t i = sparsify::sampled_topk::sample_position(s.seed(), n, size, j);
      keys[j] = sparsify::detail::magnitude_key(static_cast<float>(to_float(x[i])));
    }
    std::uint64_t rank = static_cast<std::uint64_t>((static_cast<uint128>(k) * size + n - 1) / n);
    rank = std::min<std::uint64_t>(std::max<std::uint64_t>(rank, 1), size);
    std::nth_element(keys, keys + (rank - 1), keys + size, std::greater<>());
    return keys[rank - 1];
  }

  /// f(i, key) for every i in [begin, end) whose magnitude key is >= tau, in order.
  template <class T, class F>
  static void for_each_survivor(const T* data, std::uint64_t begin, std::uint64_t end, std::uint32_t tau, F&& f) {
    const auto key_of = [](const T& v) { return sparsify::detail::magnitude_key(static_cast<float>(to_float(v))); };
    for_each_match(data, begin, end, [&](const T& v) { return key_of(v) >= tau; },
                   [&](std::uint64_t i) { f(i, key_of(data[i])); });
  }
};

}  // namespace gradzip::detail
