// The CUDA top-k's plan and functors: its digit plan, how a select narrows the state, and the
// scan's classify and emit functors (GRADZIP_HOST_DEVICE, free of CUB). The kernels that use
// them are in detail/cuda/topk.cuh, and the SIMT backend (tests/simt) executes them in CI.
#pragma once

#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/tabulate_output_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <utility>

#include "gradzip/core/element_type.hpp"
#include "gradzip/detail/topk_select.hpp"

namespace gradzip::detail {

inline constexpr int cuda_topk_wide_bits = 20;    // digits after the first
inline constexpr int cuda_topk_coarse_bits = 10;  // coarse bins of a wide digit
/// Threads of the one-block select kernels. 256, not 1024: ptxas gives them 80 registers on
/// sm_90, and 80 x 1024 exceeds a block's 65,536 (the launch failed); at 256 each thread sums 16
/// of the 4,096 bins, and tools/check_kernels.py guards the fit.
inline constexpr int cuda_topk_select_threads = 256;

template <class Key>
struct cuda_topk_state {
  Key prefix;
  Key mask;
  std::uint64_t rank;          // rank of the threshold among keys matching the prefix
  std::uint64_t ties_to_take;  // set once the threshold is resolved
};

/// One radix digit: bits [shift, shift + width) of the key.
struct radix_digit {
  int shift;
  int width;
};

/// The digits of the device select for a key of `key_bits` significant bits.
inline int cuda_topk_digits(int key_bits, radix_digit* out) {
  int count = 0;
  int high = key_bits;
  int width = topk_digit_bits;
  while (high > 0) {
    const int w = width < high ? width : high;
    out[count++] = radix_digit{high - w, w};
    high -= w;
    width = cuda_topk_wide_bits;
  }
  return count;
}

template <class Key>
GRADZIP_HOST_DEVICE void narrow_state(cuda_topk_state<Key>* st, radix_digit d, int digit, std::uint64_t above) {
  st->rank -= above;
  st->prefix |= static_cast<Key>(digit) << d.shift;
  st->mask |= ((Key{1} << d.width) - 1) << d.shift;
  if (d.shift == 0) st->ties_to_take = st->rank;  // resolved: rank counts ties at T to take
}

/// Per-element scan item: running counts of keys above T and equal to T, and the element.
template <class T>
struct topk_scan_item {
  std::uint64_t above;
  std::uint64_t ties;
  T value;
  unsigned int kind;  // 0 not selected, 1 above T, 2 equal to T
};

template <class T>
struct topk_scan_op {
  GRADZIP_HOST_DEVICE topk_scan_item<T> operator()(const topk_scan_item<T>& a, const topk_scan_item<T>& b) const {
    return {a.above + b.above, a.ties + b.ties, b.value, b.kind};  // counts add, the rest is b's
  }
};

template <class T, class Key>
struct topk_classify {
  const T* x;
  const cuda_topk_state<Key>* st;
  GRADZIP_HOST_DEVICE topk_scan_item<T> operator()(std::uint64_t i) const {
    const T v = x[i];
    const Key key = magnitude_key(v);
    const Key threshold = st->prefix;
    const unsigned int kind = key > threshold ? 1u : (key == threshold ? 2u : 0u);
    return {kind == 1u ? 1ull : 0ull, kind == 2u ? 1ull : 0ull, v, kind};
  }
};

template <class T, class Key, class Sink>
struct topk_emit {
  Sink sink;
  const cuda_topk_state<Key>* st;
  GRADZIP_HOST_DEVICE void operator()(std::uint64_t i, const topk_scan_item<T>& s) const {
    const std::uint64_t ties = st->ties_to_take;
    if (s.kind == 1u) {
      sink(s.above - 1 + (s.ties < ties ? s.ties : ties), i, s.value);
    } else if (s.kind == 2u && s.ties <= ties) {
      sink(s.above + s.ties - 1, i, s.value);
    }
  }
};

template <class T, class Key, class Sink>
auto topk_scan_iterators(const T* x, const cuda_topk_state<Key>* st, const Sink& sink) {
  auto in = thrust::make_transform_iterator(thrust::counting_iterator<std::uint64_t>(0),
                                            topk_classify<T, Key>{x, st});
  auto out = thrust::make_tabulate_output_iterator(topk_emit<T, Key, Sink>{sink, st});
  return std::make_pair(in, out);
}

}  // namespace gradzip::detail
