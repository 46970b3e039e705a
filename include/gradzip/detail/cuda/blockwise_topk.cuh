// structure_backend<cuda, sparsify::blockwise_topk>: each thread block takes blocks of the tensor in turn.
// The block's magnitude keys go to shared memory; the k_b-th largest key is found by a binary
// search over its bits (the largest t with count(key >= t) >= k_b, one block-wide count per
// bit); then the elements are emitted in index order: every key above the cut and the first
// ties, exactly as the host does.
#pragma once

#include <cub/block/block_scan.cuh>

namespace gradzip::detail {

/// Block-wise top-k: a thread block per tensor block, at most 8 blocks per SM.
using blockwise_policy = launch_policy<256, 1, 8>;

template <class T, class Sink>
__global__ __launch_bounds__(blockwise_policy::threads)
void blockwise_topk_kernel(const T* x, std::uint64_t n, std::uint64_t block,
                           std::uint64_t per_block, Sink sink) {
  using key = key_type_t<T>;
  using scan = cub::BlockScan<unsigned, blockwise_policy::threads>;
  __shared__ typename scan::TempStorage storage;
  __shared__ key keys[sparsify::blockwise_topk::max_block];
  const std::uint64_t blocks = (n + block - 1) / block;
  // Tensor blocks b = blockIdx.x, + gridDim.x, ...: a grid holds at most 2^31 - 1 thread blocks.
  for (std::uint64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const std::uint64_t begin = b * block;
    const unsigned length = static_cast<unsigned>(n - begin < block ? n - begin : block);
    const unsigned kept = static_cast<unsigned>(length < per_block ? length : per_block);
    for (unsigned i = threadIdx.x; i < length; i += blockwise_policy::threads) keys[i] = magnitude_key(x[begin + i]);
    __syncthreads();
    // The largest cut with count(key >= cut) >= kept, bit by bit from the top.
    key cut = 0;
    for (int bit = static_cast<int>(sizeof(key) * 8) - 1; bit >= 0; --bit) {
      const key candidate = cut | (key{1} << bit);
      unsigned mine = 0;
      for (unsigned i = threadIdx.x; i < length; i += blockwise_policy::threads) mine += keys[i] >= candidate ? 1u : 0u;
      unsigned total = 0;
      {
        unsigned ignored = 0;
        scan(storage).ExclusiveSum(mine, ignored, total);
        __syncthreads();
      }
      if (total >= kept) cut = candidate;
    }
    unsigned above_mine = 0;
    for (unsigned i = threadIdx.x; i < length; i += blockwise_policy::threads) above_mine += keys[i] > cut ? 1u : 0u;
    unsigned above = 0;
    {
      unsigned ignored = 0;
      scan(storage).ExclusiveSum(above_mine, ignored, above);
      __syncthreads();
    }
    const unsigned ties = kept - above;
    // Ordered emit, 256 elements per round: ties are taken by their rank among ties so far.
    std::uint64_t pos = b * per_block;
    unsigned ties_before = 0;
    for (unsigned round = 0; round < length; round += blockwise_policy::threads) {
      const unsigned i = round + threadIdx.x;
      const key k = i < length ? keys[i] : key{0};
      const unsigned is_tie = i < length && k == cut ? 1u : 0u;
      unsigned tie_rank = 0, round_ties = 0;
      scan(storage).ExclusiveSum(is_tie, tie_rank, round_ties);
      __syncthreads();
      const unsigned take = i < length && (k > cut || (is_tie && ties_before + tie_rank < ties)) ? 1u : 0u;
      unsigned rank = 0, round_taken = 0;
      scan(storage).ExclusiveSum(take, rank, round_taken);
      __syncthreads();
      if (take) sink(pos + rank, begin + i, x[begin + i]);
      pos += round_taken;
      ties_before += round_ties;
    }
    __syncthreads();  // keys are rewritten for the next block
  }
}

template <>
struct structure_backend<cuda, sparsify::blockwise_topk> {
  template <class T>
  static std::size_t workspace_bytes(cuda&, std::size_t) { return 0; }

  template <class T, class Sink>
  static void select(cuda& exec, const sparsify::blockwise_topk& s, span<const T> x, std::uint64_t,
                     const Sink& sink) {
    const std::uint64_t blocks = s.block_count(x.size());
    if (blocks == 0) return;
    launch_units<blockwise_policy>(exec, blocks, 0, blockwise_topk_kernel<T, Sink>, x.data(),
                                   x.size(), s.block(), s.per_block(), sink);
  }
};

}  // namespace gradzip::detail
