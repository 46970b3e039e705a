/**
 * @file powersgd.hpp
 * @brief `comm::powersgd_allreducer<T, Exec>`: a bucket's PowerSGD step over a communicator,
 * as PyTorch's `powerSGD_hook` runs it.
 *
 * Three allreduces a step, each a plain sum of floats (or of T):
 * 1. the uncompressed tensors (those too small to gain, by lowrank/powersgd.hpp's rule),
 *    gathered into one buffer, summed, divided by the rank count and put back;
 * 2. the P factors of every compressed matrix (lowrank::powersgd::compress_p), summed;
 * 3. the Q factors (compress_q), summed, then decompress writes P Q^T / ranks into the bucket.
 *
 * All buffers are sized at construction: a step allocates nothing. On CUDA the collectives may
 * run on a stream of their own (NCCL's), ordered with events as in `allreducer`, and a bad frame
 * is reported by the exec.check() that `run` ends with.
 *
 * @code
 * gradzip::lowrank::powersgd_params params;   // rank 1, error feedback, warm start
 * gradzip::comm::powersgd_allreducer<float, gradzip::host> ar(exec, {{128, 784}, {128}, {10, 128}, {10}},
 *                                                             params, comm.size());
 * ar.run(comm, exec, bucket, {step, 0});   // bucket <- PowerSGD's estimate of the average
 * @endcode
 */
#pragma once

#include <vector>

#include "gradzip/comm/collective.hpp"
#include "gradzip/lowrank/powersgd.hpp"

namespace gradzip::comm {

template <class T, class Exec>
class powersgd_allreducer {
  using ops = gradzip::detail::executor_ops<Exec>;
  using backend = gradzip::detail::lowrank_backend<Exec>;

 public:
  powersgd_allreducer(Exec& exec, const std::vector<std::vector<std::size_t>>& shapes, lowrank::powersgd_params params,
                      int ranks)
      : compressor_(exec, shapes, params),
        ranks_(ranks),
        dense_(ops::template allocate_zeroed<T>(exec, compressor_.plan().dense_elements())),
        p_payload_(ops::template allocate_zeroed<std::byte>(exec, compressor_.payload_bytes(lowrank::factor::p))),
        q_payload_(ops::template allocate_zeroed<std::byte>(exec, compressor_.payload_bytes(lowrank::factor::q))) {
    GRADZIP_EXPECTS(ranks >= 1, "powersgd_allreducer: ranks must be >= 1, got ", ranks);
  }

  const lowrank::powersgd<T, Exec>& compressor() const noexcept { return compressor_; }

  /// Bytes this rank put on the wire in a step: the uncompressed elements and both factors.
  std::size_t sent_bytes() const noexcept {
    const auto& plan = compressor_.plan();
    return plan.dense_elements() * sizeof(T) +
           (plan.factor_elements(lowrank::factor::p) + plan.factor_elements(lowrank::factor::q)) * sizeof(float);
  }

  /// bucket (in `exec`'s memory, the tensors back to back): in, this rank's gradients; out,
  /// the average over ranks of the uncompressed tensors and PowerSGD's estimate of the average
  /// of the others. Collective: every rank calls it with the same shapes and parameters.
  void run(communicator& comm, Exec& exec, span<T> bucket, quantize::compress_context ctx = {}) {
    GRADZIP_EXPECTS(bucket.size() == compressor_.size(), "powersgd_allreducer: bucket has ", bucket.size(),
                    " elements, expected ", compressor_.size());
    GRADZIP_EXPECTS(comm.size() == ranks_, "powersgd_allreducer: communicator has ", comm.size(),
                    " ranks, built for ", ranks_);
    const float ranks = static_cast<float>(ranks_);
    span<std::byte> p = ops::view(p_payload_), q = ops::view(q_payload_);
    compressor_.compress_p(exec, span<const T>(bucket), p, ctx);
    gather_dense(exec, bucket);
    ops::hand_over(exec, comm.cuda_stream());
    span<T> dense = ops::view(dense_);
    if (!dense.empty()) comm.allreduce_sum(dense.data(), dense.size(), element_traits<T>::type);
    sum(comm, compressor_.factors(p, lowrank::factor::p));
    ops::take_back(exec, comm.cuda_stream());
    backend::divide(exec, dense.data(), dense.size(), ranks);
    scatter_dense(exec, bucket);
    compressor_.compress_q(exec, span<const std::byte>(p), q);
    ops::hand_over(exec, comm.cuda_stream());
    sum(comm, compressor_.factors(q, lowrank::factor::q));
    ops::take_back(exec, comm.cuda_stream());
    compressor_.decompress(exec, span<const std::byte>(q), ranks_, bucket);
    if constexpr (!std::is_same_v<Exec, host>) exec.check();
  }

  /// PowerSGD's state (residual, warm-start Q), for checkpoints: see lowrank::powersgd::save.
  std::vector<std::byte> save(Exec& exec) const { return compressor_.save(exec); }
  void restore(Exec& exec, span<const std::byte> bytes) { compressor_.restore(exec, bytes); }

 private:
  static void sum(communicator& comm, span<float> factors) {
    if (!factors.empty()) comm.allreduce_sum(factors.data(), factors.size(), element_type::f32);
  }

  void gather_dense(Exec& exec, span<T> bucket) {
    T* to = ops::view(dense_).data();
    for (const lowrank::tensor_plan& t : compressor_.plan().tensors()) {
      if (t.compressed()) continue;
      backend::copy_elements(exec, bucket.data() + t.offset, to, t.size());
      to += t.size();
    }
  }

  void scatter_dense(Exec& exec, span<T> bucket) {
    const T* from = ops::view(dense_).data();
    for (const lowrank::tensor_plan& t : compressor_.plan().tensors()) {
      if (t.compressed()) continue;
      backend::copy_elements(exec, from, bucket.data() + t.offset, t.size());
      from += t.size();
    }
  }

  lowrank::powersgd<T, Exec> compressor_;
  int ranks_;
  typename ops::template buffer<T> dense_;
  typename ops::template buffer<std::byte> p_payload_;
  typename ops::template buffer<std::byte> q_payload_;
};

}  // namespace gradzip::comm
