/**
 * @file blockwise_topk.hpp
 * @brief `sparsify::blockwise_topk`: the top k_b of every block of B consecutive elements.
 *
 * The tensor is cut into blocks of B elements (the last may be shorter); block b keeps its
 * min(k_b, length) largest |x|, with top-k's rules (ties to the lower index, NaN above +inf).
 * Every block's work is independent and equal, so the selection is load-balanced on any
 * executor and needs no global pass, and every block of the gradient is represented (a
 * global top-k can starve layers with small gradients). The payload is top-k's: increasing
 * indices (an explicit index stage) and their values; k = (n / B) k_b + min(k_b, n mod B).
 *
 * Algorithm, the same result on both executors: per block, find the k_b-th largest magnitude
 * key T (host: nth_element; CUDA: one thread block per block of the tensor, a binary search
 * over the key's bits with block-wide counts), then emit in index order every key > T and the
 * first (k_b − count(key > T)) keys equal to T.
 *
 * @code
 * gradzip::codec<gradzip::sparsify::blockwise_topk> c{gradzip::sparsify::blockwise_topk{1024, 16}};
 * @endcode
 */
#pragma once

#include <cstdint>

#include "gradzip/core/error.hpp"

namespace gradzip::sparsify {

class blockwise_topk {
 public:
  static constexpr std::uint8_t id = 4;
  static constexpr bool explicit_indices = true;
  static constexpr bool summable = false;
  /// The CUDA executor keeps a block's keys in shared memory: blocks of at most 4096 elements.
  static constexpr std::uint64_t max_block = 4096;

  /// block: elements per block (1 .. 4096); per_block: elements kept per block (1 .. block).
  blockwise_topk(std::uint64_t block, std::uint64_t per_block) : block_(block), per_block_(per_block) {
    GRADZIP_EXPECTS(block >= 1 && block <= max_block, "blockwise_topk: block must be in [1, 4096], got ", block);
    GRADZIP_EXPECTS(per_block >= 1 && per_block <= block, "blockwise_topk: per_block must be in [1, block = ",
                    block, "], got ", per_block);
  }
  blockwise_topk() = default;

  std::uint64_t block() const noexcept { return block_; }
  std::uint64_t per_block() const noexcept { return per_block_; }

  /// Kept from block b (its first element b x block) of a tensor of n elements.
  std::uint64_t kept_in_block(std::uint64_t n, std::uint64_t b) const {
    const std::uint64_t begin = b * block_;
    const std::uint64_t length = n - begin < block_ ? n - begin : block_;
    return length < per_block_ ? length : per_block_;
  }

  std::uint64_t block_count(std::uint64_t n) const { return (n + block_ - 1) / block_; }

  std::uint64_t selected_count(std::uint64_t n) const {
    const std::uint64_t full = n / block_, rest = n % block_;
    return full * per_block_ + (rest < per_block_ ? rest : per_block_);
  }

 private:
  std::uint64_t block_ = 1024;
  std::uint64_t per_block_ = 10;  // about 1 %
};

}  // namespace gradzip::sparsify
