/**
 * @file ef21.hpp
 * @brief `feedback::ef21<Codec, T, Exec>`: EF21 (Richtárik, Sokolov, Fatkhullin, NeurIPS 2021,
 * "EF21: A New, Simpler, Theoretically Better, and Practically Faster Error Feedback").
 *
 * Error feedback (`error_feedback.hpp`) compresses the gradient plus what earlier steps held
 * back. EF21 compresses instead the *change* of a gradient estimate. Worker i keeps g_i, every
 * rank keeps the same estimate g (the average of the g_i), and each step, with gradient x_i:
 *
 *     c_i = C(x_i - g_i),   g_i <- g_i + D(c_i)                     (compress, on worker i)
 *     g   <- g + (1/P) sum_j D(c_j)                                  (apply, on every rank)
 *
 * and the optimizer steps along g (Algorithm 1 of the paper, with g_i and g starting at 0, so the
 * first step sends C(x_i)). Its analysis needs only a contractive C (top-k, not an unbiased one)
 * and no bounded-gradient assumption; with a contractive C, g_i tracks x_i and the payloads
 * shrink as training settles.
 *
 * `compress` is the worker's half. `apply` is the every-rank half: it takes the average of the
 * decoded payloads (what `comm::allreducer` computes, or `codec::decompress_add_all` with alpha
 * 1/P into zeros), adds it to g, and returns g in the same buffer. `comm::allreducer` with
 * `comm::feedback_mode::ef21` does both around its collective. State: g_i, g and a difference
 * buffer, n elements of T each, in the executor's memory; `save`/`restore` checkpoint g_i and g.
 *
 * @code
 * gradzip::feedback::ef21<codec_t, float, gradzip::host> ef(exec, codec, n);
 * std::size_t bytes = ef.compress(exec, grad, out);   // send out[0, bytes)
 * // average <- (1/P) * the sum of every rank's decoded payload, then:
 * ef.apply(exec, average);                            // average now holds g: step along it
 * @endcode
 */
#pragma once

#include <vector>

#include "gradzip/codec.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/feedback/dense_state.hpp"

namespace gradzip::feedback {

template <class Codec, class T, class Exec>
class ef21 {
  static_assert(is_element_v<T>, "ef21<Codec, T, Exec>: T must be float, double, __half or __nv_bfloat16");
  using ops = gradzip::detail::executor_ops<Exec>;

 public:
  /// Zero g_i and g for a tensor of n elements, allocated once in `exec`'s memory.
  ef21(Exec& exec, Codec codec, std::size_t n)
      : codec_(codec),
        local_(ops::template allocate_zeroed<T>(exec, n)),
        estimate_(ops::template allocate_zeroed<T>(exec, n)),
        difference_(ops::template allocate_zeroed<T>(exec, n)),
        size_(n) {}

  std::size_t size() const noexcept { return size_; }
  const Codec& codec() const noexcept { return codec_; }
  /// g_i, this worker's gradient estimate (in the executor's memory).
  span<const T> local() { return ops::view(local_); }
  /// g, the estimate every rank holds: the average of the workers' g_i.
  span<const T> estimate() { return ops::view(estimate_); }

  template <class U>
  std::size_t max_compressed_bytes() const {
    return codec_.template max_compressed_bytes<U>(size_);
  }

  /// Compresses grad - g_i into `out` (max_compressed_bytes<T>() bytes), adds its decode to g_i,
  /// and returns the payload's size in bytes. Bad arguments throw before g_i changes.
  std::size_t compress(Exec& exec, span<const T> grad, span<std::byte> out, quantize::compress_context ctx = {}) {
    GRADZIP_EXPECTS(grad.size() == size_, "ef21: gradient has ", grad.size(), " elements, the state ", size_);
    detail::expect_output(out, max_compressed_bytes<T>(), "ef21::compress");
    span<T> g_i = ops::view(local_), d = ops::view(difference_);
    ops::subtract(exec, d, grad, span<const T>(g_i));
    const std::size_t bytes = codec_.compress(exec, span<const T>(d), out, ctx);
    codec_.decompress_add(exec, span<const std::byte>(out.data(), bytes), g_i);
    return bytes;
  }

  /// g <- g + average; average <- g. `average` is (1/P) times the sum over the P ranks of their
  /// decoded payloads from this step; every rank calls this with the same values, so every
  /// rank's g stays the same.
  void apply(Exec& exec, span<T> average) {
    GRADZIP_EXPECTS(average.size() == size_, "ef21::apply: average has ", average.size(), " elements, the state ",
                    size_);
    ops::running_sum(exec, ops::view(estimate_), average);
  }

  /// g_i then g, each a dense-state payload (codec id 0), for checkpoints. Synchronous.
  std::vector<std::byte> save(Exec& exec) const {
    return detail::save_dense_states<T>(exec, local_, estimate_, size_);
  }

  /// Restores g_i and g saved by `save`; both are validated before either changes. Synchronous.
  void restore(Exec& exec, span<const std::byte> bytes) {
    const auto [first, second] = detail::split_dense_states<T>(bytes, size_, "ef21::restore");
    detail::restore_dense_state<T>(exec, first, local_, size_, "ef21::restore");
    detail::restore_dense_state<T>(exec, second, estimate_, size_, "ef21::restore");
  }

 private:
  Codec codec_;
  typename ops::template buffer<T> local_;
  typename ops::template buffer<T> estimate_;
  typename ops::template buffer<T> difference_;
  std::size_t size_;
};

}  // namespace gradzip::feedback
