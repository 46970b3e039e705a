// structure_backend<host, sparsify::blockwise_topk>: blocks in parallel chunks, each by
// nth_element over its magnitude keys, then an ordered emit.
#pragma once

#include <algorithm>
#include <cstdint>

#include "gradzip/core/element_type.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/detail/codec_traits.hpp"
#include "gradzip/detail/host/parallel.hpp"
#include "gradzip/sparsify/blockwise_topk.hpp"

namespace gradzip::detail {

template <>
struct structure_backend<host, sparsify::blockwise_topk> {
  /// Two arrays of one block's keys per chunk: the keys in index order, and a copy to select in.
  template <class T>
  static std::size_t workspace_bytes(host& exec, std::size_t n) {
    return chunk_count(exec, n, 1) * 2 * sparsify::blockwise_topk::max_block * sizeof(key_type_t<T>);
  }

  template <class T, class Sink>
  static void select(host& exec, const sparsify::blockwise_topk& s, span<const T> x, std::uint64_t,
                     const Sink& sink) {
    using key = key_type_t<T>;
    const std::uint64_t n = x.size(), blocks = s.block_count(n);
    const std::size_t chunks = chunk_count(exec, n, 1);
    auto* scratch = reinterpret_cast<key*>(exec.scratch(workspace_bytes<T>(exec, n)));
    for_each_chunk(exec, chunks, [&](std::size_t c) {
      key* keys = scratch + c * 2 * sparsify::blockwise_topk::max_block;
      key* work = keys + sparsify::blockwise_topk::max_block;
      const index_range mine = chunk_of(blocks, chunks, c);
      const Sink local = sink;
      const T* data = x.data();
      for (std::uint64_t b = mine.begin; b < mine.end; ++b) {
        const std::uint64_t begin = b * s.block();
        const std::uint64_t length = std::min<std::uint64_t>(s.block(), n - begin);
        const std::uint64_t kept = s.kept_in_block(n, b);
        for (std::uint64_t i = 0; i < length; ++i) keys[i] = magnitude_key(data[begin + i]);
        std::copy(keys, keys + length, work);
        std::nth_element(work, work + (kept - 1), work + length, [](key l, key r) { return l > r; });
        const key cut = work[kept - 1];
        std::uint64_t above = 0;
        for (std::uint64_t i = 0; i < length; ++i) above += keys[i] > cut ? 1 : 0;
        std::uint64_t ties = kept - above;  // keys equal to the cut, taken from the lowest index
        std::uint64_t pos = b * s.per_block();
        for (std::uint64_t i = 0; i < length; ++i) {
          const bool tie = keys[i] == cut && ties > 0;
          if (keys[i] > cut || tie) {
            ties -= tie ? 1 : 0;
            local(pos++, begin + i, data[begin + i]);
          }
        }
      }
    });
  }
};

}  // namespace gradzip::detail
