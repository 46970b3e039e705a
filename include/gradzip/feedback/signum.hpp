/**
 * @file signum.hpp
 * @brief `feedback::signum<Codec, T, Exec>`: momentum, then compression (Signum).
 *
 * Bernstein, Wang, Azizzadenesheli, Anandkumar, "signSGD: compressed optimisation for
 * non-convex problems" (ICML 2018), Algorithm 2. Keeps the momentum m of one tensor in the
 * executor's memory; each step, with gradient g and 0 <= beta < 1:
 *
 *     m <- beta m + (1 − beta) g      (one fma per element, in float, or double for double
 *                                      states; the same on host and CUDA)
 *     payload = C(m)
 *
 * With `Codec` a dense `quantize::sign<false>` codec this is Signum: each worker sends sign(m),
 * and the server aggregates with `quantize::majority_vote`. Any codec works (scaled sign,
 * top-k of the momentum, ...). Unlike error feedback nothing dropped is carried over: the
 * momentum itself is the state. `save`/`restore` move it to and from bytes for checkpoints.
 *
 * @code
 * using sign_codec = gradzip::codec<gradzip::sparsify::none, gradzip::quantize::sign<false>,
 *                                   gradzip::encode::none>;
 * gradzip::feedback::signum<sign_codec, float, gradzip::host> s(exec, sign_codec{}, n, 0.9f);
 * std::size_t bytes = s.compress(exec, grad, out);
 * @endcode
 */
#pragma once

#include <vector>

#include "gradzip/codec.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/feedback/dense_state.hpp"

namespace gradzip::feedback {

template <class Codec, class T, class Exec>
class signum {
  static_assert(is_element_v<T>, "signum<Codec, T, Exec>: T must be float, double, __half or __nv_bfloat16");
  using ops = gradzip::detail::executor_ops<Exec>;

 public:
  /// A zero momentum for a tensor of n elements; beta in [0, 1) (the paper uses 0.9).
  signum(Exec& exec, Codec codec, std::size_t n, float beta = 0.9f)
      : codec_(codec), momentum_(ops::template allocate_zeroed<T>(exec, n)), size_(n), beta_(beta) {
    GRADZIP_EXPECTS(beta >= 0.0f && beta < 1.0f, "signum: beta must be in [0, 1), got ", beta);
  }

  std::size_t size() const noexcept { return size_; }
  float beta() const noexcept { return beta_; }
  const Codec& codec() const noexcept { return codec_; }

  /// The momentum m, in the executor's memory.
  span<const T> momentum() { return ops::view(momentum_); }

  template <class U>
  std::size_t max_compressed_bytes() const {
    return codec_.template max_compressed_bytes<U>(size_);
  }

  /// Folds grad into the momentum and compresses the momentum into `out`
  /// (max_compressed_bytes<T>() bytes); returns its bytes. Bad arguments throw before the
  /// momentum changes.
  std::size_t compress(Exec& exec, span<const T> grad, span<std::byte> out,
                       quantize::compress_context ctx = {}) {
    GRADZIP_EXPECTS(grad.size() == size_, "signum: gradient has ", grad.size(),
                    " elements, the momentum ", size_);
    detail::expect_output(out, max_compressed_bytes<T>(), "signum::compress");
    span<T> m = ops::view(momentum_);
    ops::momentum(exec, m, grad, beta_);
    return codec_.compress(exec, span<const T>(m), out, ctx);
  }

  /// The momentum as a payload (codec id 0: dense values). Synchronous.
  std::vector<std::byte> save(Exec& exec) const {
    return detail::save_dense_state<T>(exec, momentum_, size_);
  }

  /// Restores a momentum saved by `save`; the element type and count must match. Synchronous.
  void restore(Exec& exec, span<const std::byte> bytes) {
    detail::restore_dense_state<T>(exec, bytes, momentum_, size_, "signum::restore");
  }

 private:
  Codec codec_;
  typename ops::template buffer<T> momentum_;
  std::size_t size_;
  float beta_;
};

}  // namespace gradzip::feedback
