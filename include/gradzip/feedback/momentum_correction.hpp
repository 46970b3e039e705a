/**
 * @file momentum_correction.hpp
 * @brief `feedback::momentum_correction<Codec, T, Exec>`: DGC's momentum correction and momentum
 * factor masking around a sparsifying codec.
 *
 * Deep Gradient Compression (Lin et al., ICLR 2018, section 3.2) moves momentum to the worker,
 * before sparsification, so that what is held back still gets its momentum. Each step, with
 * gradient g, momentum m, velocity u and accumulator v:
 *
 *     u <- m u + g,   v <- v + u,   payload = C(v),   d = D(payload),
 *     v <- v - d,     u <- 0 where d != 0   (momentum factor masking)
 *
 * The optimizer then applies the averaged decoded payloads as plain SGD steps (the momentum is
 * already in them). With an unquantized sparsifier (`sparsify::topk`, `sampled_topk`) v is
 * exactly 0 where an element was sent. An element sent with the value 0 keeps its u: it carried
 * nothing. State: u, v and a decode buffer, n elements of T each, in the executor's memory.
 * `save`/`restore` checkpoint u and v.
 *
 * @code
 * using dgc = gradzip::codec<gradzip::sparsify::sampled_topk>;
 * gradzip::feedback::momentum_correction<dgc, float, gradzip::host> mc(exec, dgc{gradzip::sparsify::sampled_topk::ratio(0.001)}, n, 0.9f);
 * std::size_t bytes = mc.compress(exec, grad, out);
 * @endcode
 */
#pragma once

#include <cmath>
#include <vector>

#include "gradzip/codec.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/feedback/dense_state.hpp"

namespace gradzip::feedback {

namespace detail {
/// One step of momentum correction on state the caller owns (this class's, or slices of a
/// fusion::fused_compressor's flat state): u <- m u + g, v <- v + u, out <- C(v), d <- D(out),
/// v <- v - d, u <- 0 where d != 0. `d` is scratch of the gradient's size.
template <class Codec, class T, class Exec>
std::size_t momentum_correction_step(Exec& exec, const Codec& codec, span<T> u, span<T> v, span<T> d,
                                     span<const T> grad, span<std::byte> out, float momentum,
                                     quantize::compress_context ctx) {
  using ops = gradzip::detail::executor_ops<Exec>;
  ops::correct_momentum(exec, u, v, grad, momentum);
  const std::size_t bytes = codec.compress(exec, span<const T>(v), out, ctx);
  codec.decompress(exec, span<const std::byte>(out.data(), bytes), d);
  ops::mask_sent(exec, u, v, span<const T>(d));
  return bytes;
}
}  // namespace detail

template <class Codec, class T, class Exec>
class momentum_correction {
  static_assert(is_element_v<T>, "momentum_correction<Codec, T, Exec>: T must be float, double, __half or __nv_bfloat16");
  using ops = gradzip::detail::executor_ops<Exec>;

 public:
  /// Zero u and v for a tensor of n elements; `momentum` in [0, 1) (DGC uses 0.9).
  momentum_correction(Exec& exec, Codec codec, std::size_t n, float momentum)
      : codec_(codec),
        velocity_(ops::template allocate_zeroed<T>(exec, n)),
        accumulated_(ops::template allocate_zeroed<T>(exec, n)),
        decoded_(ops::template allocate_zeroed<T>(exec, n)),
        size_(n),
        momentum_(momentum) {
    GRADZIP_EXPECTS(std::isfinite(momentum) && momentum >= 0.0f && momentum < 1.0f,
                    "momentum_correction: momentum must be in [0, 1), got ", momentum);
  }

  std::size_t size() const noexcept { return size_; }
  float momentum() const noexcept { return momentum_; }
  const Codec& codec() const noexcept { return codec_; }
  /// u, the velocity (in the executor's memory).
  span<const T> velocity() { return ops::view(velocity_); }
  /// v, the accumulated velocity not yet sent.
  span<const T> accumulated() { return ops::view(accumulated_); }

  template <class U>
  std::size_t max_compressed_bytes() const {
    return codec_.template max_compressed_bytes<U>(size_);
  }

  /// One step: accumulates g, compresses v into `out` (max_compressed_bytes<T>() bytes), masks
  /// what was sent; returns the bytes. Bad arguments throw before the state changes (as in
  /// error_feedback::compress).
  std::size_t compress(Exec& exec, span<const T> grad, span<std::byte> out, quantize::compress_context ctx = {}) {
    GRADZIP_EXPECTS(grad.size() == size_, "momentum_correction: gradient has ", grad.size(),
                    " elements, the state ", size_);
    detail::expect_output(out, max_compressed_bytes<T>(), "momentum_correction::compress");
    return detail::momentum_correction_step(exec, codec_, ops::view(velocity_), ops::view(accumulated_),
                                            ops::view(decoded_), grad, out, momentum_, ctx);
  }

  /// u then v, each a dense-state payload (codec id 0), for checkpoints. Synchronous.
  std::vector<std::byte> save(Exec& exec) const {
    return detail::save_dense_states<T>(exec, velocity_, accumulated_, size_);
  }

  /// Restores u and v saved by `save`; both are validated before either changes. Synchronous.
  void restore(Exec& exec, span<const std::byte> bytes) {
    constexpr const char* what = "momentum_correction::restore";
    const auto [u_bytes, v_bytes] = detail::split_dense_states<T>(bytes, size_, what);
    detail::restore_dense_state<T>(exec, u_bytes, velocity_, size_, what);
    detail::restore_dense_state<T>(exec, v_bytes, accumulated_, size_, what);
  }

 private:
  Codec codec_;
  typename ops::template buffer<T> velocity_;
  typename ops::template buffer<T> accumulated_;
  typename ops::template buffer<T> decoded_;
  std::size_t size_;
  float momentum_;
};

}  // namespace gradzip::feedback
