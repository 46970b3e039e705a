// The CUDA top-k's plan: its digits, its state, how a select narrows the state, and how big its
// candidate list may grow. GRADZIP_HOST_DEVICE and free of CUB; the kernels that use it are in
// detail/cuda/topk.cuh, and the SIMT backend (tests/simt) executes them in CI.
#pragma once

#include <cstdint>

#include "gradzip/core/element_type.hpp"
#include "gradzip/detail/topk_select.hpp"

namespace gradzip::detail {

/// Threads of the block that picks a digit's bin (`block_find_rank`, in the last block of each
/// counting pass; once a kernel of its own, whose 1,024 threads at 80 registers could not launch
/// on sm_90): 256, each thread summing 8 of the 2,048 bins.
inline constexpr int cuda_topk_select_threads = 256;

/// Until the compaction has run, the candidate list holds nothing a pass may read.
inline constexpr std::uint64_t cuda_topk_no_list = ~std::uint64_t{0};

template <class Key>
struct cuda_topk_state {
  Key prefix;                     // the digits chosen so far
  Key mask;                       // their bits
  Key threshold;                  // T, once resolved: keys above T are taken, and ties_to_take keys equal to T
  Key bound;                      // the sample's bound: the sampled compaction keeps keys >= bound
  std::uint64_t rank;             // rank of T among the keys that match the prefix (and reach the bound, sampled)
  std::uint64_t ties_to_take;
  std::uint64_t resolved;         // 1 once T is known: at the last digit, or when a bin is taken whole
  std::uint64_t candidates;       // elements in the candidate list, or cuda_topk_no_list
  std::uint64_t sampled;          // 1 while the list is the sampled compaction's (the radix passes over x return)
  unsigned long long tickets[3];  // tile ids of the compaction, the emit and the sampled compaction (lookback.cuh)
  unsigned blocks_done;           // blocks of the running counting pass that have finished it
};

/// Which select a counting pass serves: both, the radix one from x only (it returns when the
/// sampled list holds the candidates), or the sampled one only (it returns when that fell back).
enum class topk_pass : unsigned { both, radix, sampled };

/// Whether a pass for `p` has work with the state st (T unresolved, and p's select running).
template <class Key>
GRADZIP_HOST_DEVICE inline bool topk_pass_runs(const cuda_topk_state<Key>* st, topk_pass p) {
  if (st->resolved != 0) return false;
  if (p == topk_pass::radix) return st->sampled == 0;
  if (p == topk_pass::sampled) return st->sampled != 0;
  return true;
}

/// Inputs from this size on start from a strided sample's bound (topk_sample_size): one read of
/// x, the compaction's, instead of a histogram's and the compaction's. Below it the sample, its
/// compaction and the radix launches that return at once cost more than the histogram's read
/// saves: an H200 timed the whole select with the start forced either way (docs/performance.md,
/// "Measured on an H200 (2026-11-27)"; `BM_cuda_topk_start`).
inline constexpr std::uint64_t cuda_topk_sample_from = std::uint64_t{1} << 23;

/// Inputs of at most this many elements take the one-launch select (`topk_resident_kernel`) when
/// its grid, a block per 4,096 elements, fits the device at once. An H100 holds 528 blocks (132
/// SMs, 4 each), 2,162,688 elements; 2^21 (512 blocks) is the largest power of two within that,
/// and there the one launch took 0.59x the five launches' time (docs/performance.md, "Measured on
/// an H100 (2026-11-27, later)"). Devices that hold more: untimed, so the cap stays.
inline constexpr std::uint64_t cuda_topk_resident_max = std::uint64_t{1} << 21;

/// One radix digit: bits [shift, shift + width) of the key.
struct radix_digit {
  int shift;
  int width;
};

/// The digit whose top bit is bit high - 1: 11 bits, or the `high` bits left below the others.
GRADZIP_HOST_DEVICE inline radix_digit topk_digit_below(int high) {
  const int w = topk_digit_bits < high ? topk_digit_bits : high;
  return radix_digit{high - w, w};
}

/// The digits of the device select: 11 bits each from the top, as the host's, the last one
/// narrower (31 = 11 + 11 + 9 for float keys, 63 = 5 x 11 + 8 for double). 2,048 bins fit a
/// block's shared memory, so no pass needs global per-bin counters.
GRADZIP_HOST_DEVICE inline int cuda_topk_digits(int key_bits, radix_digit* out) {
  int count = 0;
  for (int high = key_bits; high > 0; high = out[count - 1].shift) out[count++] = topk_digit_below(high);
  return count;
}

/// prefix and mask with bin `digit` of d appended: the digits chosen so far, and their bits.
template <class Key>
GRADZIP_HOST_DEVICE inline void append_digit(Key& prefix, Key& mask, radix_digit d, int digit) {
  prefix |= static_cast<Key>(digit) << d.shift;
  mask |= ((Key{1} << d.width) - 1) << d.shift;
}

/**
 * The select chose bin `digit` of digit d, holding `in_bin` keys, with `above` keys in higher
 * bins. Narrows the prefix, and resolves T at the last digit or as soon as the whole bin is
 * taken (rank == in_bin): then every key >= the bin's lowest is taken, which is "above
 * prefix - 1" with no ties. A bin whose lowest key is 0 never stops early (prefix - 1 would wrap).
 */
template <class Key>
GRADZIP_HOST_DEVICE void narrow_state(cuda_topk_state<Key>* st, radix_digit d, int digit, std::uint64_t above,
                                      std::uint64_t in_bin) {
  st->rank -= above;
  append_digit(st->prefix, st->mask, d, digit);
  if (d.shift == 0) {
    st->threshold = st->prefix;
    st->ties_to_take = st->rank;
    st->resolved = 1;
  } else if (st->rank == in_bin && st->prefix != 0) {
    st->threshold = st->prefix - 1;
    st->ties_to_take = 0;
    st->resolved = 1;
  }
}

/**
 * Entries of the candidate list for n elements. The list holds every element whose key is at
 * least the lowest of the first digit's chosen bin: the k largest and the rest of that bin (a
 * bin spans an eighth of an octave). On the synthetic gradient that is 1.07-1.25 k for k from
 * 0.1 % to 10 % of n (2^20 and 2^24 elements), so n / 8 leaves room up to about k = 10 %;
 * beyond, the later passes read x instead (the same bytes). From a sample, the list holds the
 * keys at or above the sample's bound instead (about 1.37 k at 1 %), and only when they fit.
 */
GRADZIP_HOST_DEVICE inline std::uint64_t cuda_topk_list_capacity(std::uint64_t n) {
  return topk_candidate_capacity(n, std::uint64_t{1} << 16);
}

}  // namespace gradzip::detail
