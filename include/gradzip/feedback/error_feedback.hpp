/**
 * @file error_feedback.hpp
 * @brief `feedback::error_feedback<Codec, T, Exec>`: error feedback around any codec.
 *
 * Keeps the residual e of one tensor (Seide et al. 2014, "1-bit SGD"; Karimireddy et al. 2019,
 * "Error feedback fixes SignSGD") in the executor's memory. Each step, with gradient g:
 *
 *     p = x + e,   payload = C(p),   e <- p - D(payload)
 *
 * so what compression drops is not lost but sent in a later step. `save` and `restore` move the
 * residual to and from bytes (a gradzip payload of the dense residual), for checkpoints.
 *
 * @code
 * gradzip::feedback::error_feedback<codec_t, float, gradzip::host> ef(exec, codec, n);
 * std::size_t bytes = ef.compress(exec, grad, out);      // residual updated in place
 * std::vector<std::byte> state = ef.save(exec);          // ... ef.restore(exec, state);
 * @endcode
 */
#pragma once

#include <vector>

#include "gradzip/codec.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/feedback/dense_state.hpp"

namespace gradzip::feedback {

namespace detail {
/// One step of error feedback on a residual e the caller owns (this class's, or a slice of a
/// fusion::fused_compressor's flat state): e <- g + e, out <- C(e), e <- e - D(out).
template <class Codec, class T, class Exec>
std::size_t error_feedback_step(Exec& exec, const Codec& codec, span<T> e, span<const T> grad, span<std::byte> out,
                                quantize::compress_context ctx) {
  gradzip::detail::executor_ops<Exec>::add(exec, e, grad);  // e now holds p = g + e
  const std::size_t bytes = codec.compress(exec, span<const T>(e), out, ctx);
  codec.decompress_add(exec, span<const std::byte>(out.data(), bytes), e, -1.0f);
  return bytes;
}
}  // namespace detail

template <class Codec, class T, class Exec>
class error_feedback {
  static_assert(is_element_v<T>, "error_feedback<Codec, T, Exec>: T must be float, double, __half or __nv_bfloat16");
  using ops = gradzip::detail::executor_ops<Exec>;

 public:
  /// A zero residual for a tensor of n elements, allocated once in `exec`'s memory.
  error_feedback(Exec& exec, Codec codec, std::size_t n)
      : codec_(codec), residual_(ops::template allocate_zeroed<T>(exec, n)), size_(n) {}

  std::size_t size() const noexcept { return size_; }
  const Codec& codec() const noexcept { return codec_; }

  /// The residual e, in the executor's memory.
  span<const T> residual() { return ops::view(residual_); }

  template <class U>
  std::size_t max_compressed_bytes() const {
    return codec_.template max_compressed_bytes<U>(size_);
  }

  /// Compresses grad + e into `out` (max_compressed_bytes<T>() bytes), updates e, and returns
  /// the payload's size in bytes. `ctx` (training step, tensor id) keys a stochastic values
  /// stage: pass the real step, so each step draws fresh randomness. Bad arguments throw before
  /// e changes; only a data-dependent count over its bound (count_over_bound: a gradient with
  /// more non-finite values than the payload holds) is found after, with e holding grad + e.
  std::size_t compress(Exec& exec, span<const T> grad, span<std::byte> out,
                       quantize::compress_context ctx = {}) {
    GRADZIP_EXPECTS(grad.size() == size_, "error_feedback: gradient has ", grad.size(),
                    " elements, the residual ", size_);
    detail::expect_output(out, max_compressed_bytes<T>(), "error_feedback::compress");
    return detail::error_feedback_step(exec, codec_, ops::view(residual_), grad, out, ctx);
  }

  /// The residual as a payload (codec id 0: dense values), for checkpoints. Synchronous.
  std::vector<std::byte> save(Exec& exec) const {
    return detail::save_dense_state<T>(exec, residual_, size_);
  }

  /// Restores a residual saved by `save`; the element type and count must match. Synchronous.
  void restore(Exec& exec, span<const std::byte> bytes) {
    detail::restore_dense_state<T>(exec, bytes, residual_, size_, "error_feedback::restore");
  }

 private:
  Codec codec_;
  typename ops::template buffer<T> residual_;
  std::size_t size_;
};

}  // namespace gradzip::feedback
