/**
 * @file fused_compressor.hpp
 * @brief `fusion::fused_compressor<Codec, T, Exec>`: one codec call and one payload per fusion
 * group of a `fusion::layout`, with error feedback or momentum correction kept in the same flat
 * layout.
 *
 * Cupcake (Wang et al., MLSys '23) shows that compressing layer by layer pays a codec's fixed
 * cost once per tensor (161 times per step for ResNet-50), and that compressing fused groups of
 * consecutive tensors removes most of it. Group g's payload is exactly what `Codec` makes of the
 * group's elements [group_offset(g), group_offset(g) + group_size(g)): decode it with the same
 * codec, here (`decompress_add`) or anywhere else.
 *
 * State. With `state::error_feedback` the residual e, and with `state::momentum_correction`
 * DGC's u and v (see feedback/error_feedback.hpp and feedback/momentum_correction.hpp), are flat
 * buffers in the same layout as the gradients: group g's state is the same slice as its
 * gradient. `save` and `restore` move the whole state at once, for checkpoints.
 *
 * Randomness. Group g is compressed with `ctx.tensor_id + g` as its tensor id, so groups draw
 * independent streams from one context; pass the training step in `ctx.step`.
 *
 * All buffers are allocated at construction, and the executor's workspace is reserved for the
 * largest group: a step allocates nothing.
 *
 * @code
 * gradzip::fusion::layout l = gradzip::fusion::layout::by_elements(sizes, 1 << 22);
 * gradzip::fusion::flat_buffer<float, gradzip::host> grads(exec, l);
 * using topk = gradzip::codec<gradzip::sparsify::topk>;
 * gradzip::fusion::fused_compressor<topk, float, gradzip::host> fc(exec, topk{gradzip::sparsify::topk::ratio(0.01)}, l,
 *                                                                 gradzip::fusion::state::error_feedback);
 * std::vector<std::byte> out(fc.max_compressed_bytes(0));
 * std::size_t bytes = fc.compress(exec, 0, grads.all(), out, {step, 0});
 * gradzip::fusion::flat_buffer<float, gradzip::host> sum(exec, l);
 * fc.decompress_add(exec, 0, gradzip::span<const std::byte>(out.data(), bytes), sum.all());
 * @endcode
 */
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

#include "gradzip/codec.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/feedback/dense_state.hpp"
#include "gradzip/feedback/error_feedback.hpp"
#include "gradzip/feedback/momentum_correction.hpp"
#include "gradzip/fusion/layout.hpp"

namespace gradzip::fusion {

/// What a fused_compressor keeps between steps, in the flat layout.
enum class state {
  none,                 ///< nothing: group g's payload is C(g's gradients)
  error_feedback,       ///< the residual e: the payload is C(g + e)
  momentum_correction,  ///< DGC's u and v: the payload is C(v)
};

template <class Codec, class T, class Exec>
class fused_compressor {
  static_assert(is_element_v<T>, "fused_compressor<Codec, T, Exec>: T must be float, double, __half or __nv_bfloat16");
  using ops = gradzip::detail::executor_ops<Exec>;

 public:
  /// For the groups of `shape`, keeping `kept` state; `momentum` (momentum correction only) in
  /// [0, 1), DGC's 0.9 by default.
  fused_compressor(Exec& exec, Codec codec, layout shape, state kept, float momentum = 0.9f)
      : codec_(codec),
        shape_(std::move(shape)),
        kept_(kept),
        momentum_(momentum),
        first_(ops::template allocate_zeroed<T>(exec, kept == state::none ? 0 : shape_.total())),
        second_(ops::template allocate_zeroed<T>(exec, kept == state::momentum_correction ? shape_.total() : 0)),
        decoded_(ops::template allocate_zeroed<T>(exec, kept == state::momentum_correction ? shape_.largest_group() : 0)) {
    GRADZIP_EXPECTS(kept != state::momentum_correction || (std::isfinite(momentum) && momentum >= 0.0f && momentum < 1.0f),
                    "fused_compressor: momentum must be in [0, 1), got ", momentum);
    exec.reserve(codec.template workspace_bytes<T>(exec, shape_.largest_group()));
  }

  const layout& shape() const noexcept { return shape_; }
  const Codec& codec() const noexcept { return codec_; }
  state kept() const noexcept { return kept_; }

  /// Bytes group g's payload may take.
  std::size_t max_compressed_bytes(std::size_t g) const {
    return codec_.template max_compressed_bytes<T>(shape_.group_size(g));
  }

  /// Compresses group g of `grads` (the flat buffer, shape().total() elements in the executor's
  /// memory) into `out` (max_compressed_bytes(g) bytes), updates g's state, and returns the
  /// payload's size. Bad arguments throw before any state changes.
  std::size_t compress(Exec& exec, std::size_t g, span<const T> grads, span<std::byte> out,
                       quantize::compress_context ctx = {}) {
    check_flat(grads.size(), "compress");
    feedback::detail::expect_output(out, max_compressed_bytes(g), "fused_compressor::compress");
    GRADZIP_EXPECTS(ctx.tensor_id + g >= ctx.tensor_id, "fused_compressor: ctx.tensor_id ", ctx.tensor_id,
                    " + group ", g, " overflows");
    ctx.tensor_id += g;
    const std::size_t at = shape_.group_offset(g), n = shape_.group_size(g);
    const span<const T> grad = grads.subspan(at, n);
    switch (kept_) {
      case state::error_feedback:
        return feedback::detail::error_feedback_step(exec, codec_, ops::view(first_).subspan(at, n), grad, out, ctx);
      case state::momentum_correction:
        return feedback::detail::momentum_correction_step(exec, codec_, ops::view(first_).subspan(at, n),
                                                          ops::view(second_).subspan(at, n),
                                                          ops::view(decoded_).subspan(0, n), grad, out, momentum_, ctx);
      case state::none:
        break;
    }
    return codec_.compress(exec, grad, out, ctx);
  }

  /// Group g of `accum` (the flat buffer) += alpha * the decoded payload; the payload is
  /// validated first (see codec::decompress_add).
  void decompress_add(Exec& exec, std::size_t g, span<const std::byte> payload, span<T> accum, float alpha = 1.0f) const {
    check_flat(accum.size(), "decompress_add");
    codec_.decompress_add(exec, payload, accum.subspan(shape_.group_offset(g), shape_.group_size(g)), alpha);
  }

  /// Group g of `accum` += alpha * the sum of every payload (one per rank, say), all validated
  /// before anything is written (see codec::decompress_add_all: on CUDA, errors at check()).
  void decompress_add_all(Exec& exec, std::size_t g, span<const span<const std::byte>> payloads, span<T> accum,
                          float alpha = 1.0f) const {
    check_flat(accum.size(), "decompress_add_all");
    codec_.decompress_add_all(exec, payloads, accum.subspan(shape_.group_offset(g), shape_.group_size(g)), alpha);
  }

  /// The whole flat state, for checkpoints: e (error feedback), or u then v (momentum
  /// correction), each a dense-state payload of shape().total() elements. Synchronous.
  std::vector<std::byte> save(Exec& exec) const {
    GRADZIP_EXPECTS(kept_ != state::none, "fused_compressor::save: the state is none: nothing to save");
    if (kept_ == state::error_feedback) return feedback::detail::save_dense_state<T>(exec, first_, shape_.total());
    return feedback::detail::save_dense_states<T>(exec, first_, second_, shape_.total());
  }

  /// Restores what `save` wrote, validated completely before anything changes. Synchronous.
  void restore(Exec& exec, span<const std::byte> bytes) {
    constexpr const char* what = "fused_compressor::restore";
    GRADZIP_EXPECTS(kept_ != state::none, what, ": the state is none: nothing to restore");
    if (kept_ == state::error_feedback) {
      feedback::detail::restore_dense_state<T>(exec, bytes, first_, shape_.total(), what);
      return;
    }
    const auto [u_bytes, v_bytes] = feedback::detail::split_dense_states<T>(bytes, shape_.total(), what);
    feedback::detail::restore_dense_state<T>(exec, u_bytes, first_, shape_.total(), what);
    feedback::detail::restore_dense_state<T>(exec, v_bytes, second_, shape_.total(), what);
  }

 private:
  void check_flat(std::size_t n, const char* call) const {
    GRADZIP_EXPECTS(n == shape_.total(), "fused_compressor::", call, ": the flat buffer has ", n,
                    " elements, the layout ", shape_.total());
  }

  Codec codec_;
  layout shape_;
  state kept_;
  float momentum_;
  typename ops::template buffer<T> first_;    // e, or u
  typename ops::template buffer<T> second_;   // v
  typename ops::template buffer<T> decoded_;  // momentum correction's D(payload), the largest group
};

}  // namespace gradzip::fusion
