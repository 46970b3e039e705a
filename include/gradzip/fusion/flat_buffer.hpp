/**
 * @file flat_buffer.hpp
 * @brief `fusion::flat_buffer<T, Exec>`: one allocation in the executor's memory holding every
 * tensor of a `fusion::layout`, with a view per tensor and per fusion group.
 *
 * Allocate the model's gradients in it (point each parameter's gradient at `tensor(t)`), or copy
 * each gradient into `tensor(t)` as backprop produces it; then compress `group(g)` in one call.
 * Zeroed on allocation; allocated once.
 *
 * @code
 * gradzip::fusion::layout l({1000, 10, 4096}, {0, 2});
 * gradzip::fusion::flat_buffer<float, gradzip::host> grads(exec, l);
 * std::copy(grad.begin(), grad.begin() + 4096, grads.tensor(2).begin());   // CUDA: cudaMemcpyAsync
 * @endcode
 */
#pragma once

#include "gradzip/core/executor.hpp"
#include "gradzip/core/span.hpp"
#include "gradzip/fusion/layout.hpp"

namespace gradzip::fusion {

template <class T, class Exec>
class flat_buffer {
  using ops = gradzip::detail::executor_ops<Exec>;

 public:
  flat_buffer(Exec& exec, layout shape) : shape_(std::move(shape)), data_(ops::template allocate_zeroed<T>(exec, shape_.total())) {}

  const layout& shape() const noexcept { return shape_; }
  /// The whole buffer (in the executor's memory), layout().total() elements.
  span<T> all() { return ops::view(data_); }
  /// Tensor t's elements.
  span<T> tensor(std::size_t t) { return all().subspan(shape_.offset(t), shape_.size(t)); }
  /// Group g's elements: its tensors, back to back.
  span<T> group(std::size_t g) { return all().subspan(shape_.group_offset(g), shape_.group_size(g)); }

 private:
  layout shape_;
  typename ops::template buffer<T> data_;
};

}  // namespace gradzip::fusion
