/**
 * @file layout.hpp
 * @brief `fusion::layout`: a model's gradient tensors laid out back to back in one flat buffer,
 * in backprop order, and cut into contiguous fusion groups.
 *
 * Cupcake (Wang et al., MLSys '23) compresses gradients in fusion groups rather than one
 * tensor at a time: tensors are placed in the order backprop produces them, and each group of
 * consecutive tensors is compressed by one codec call into one payload. A layout holds that
 * arrangement: tensor t occupies elements [offset(t), offset(t) + size(t)) of the flat buffer,
 * with no padding, and group g is the tensors [first_tensor(g), end_tensor(g)), so its elements
 * are one contiguous range too. The group boundaries come from the user, from `by_elements`
 * (greedy, like DDP's `bucket_cap_mb`), or from Cupcake's scheduler and Espresso's planner
 * (gradzip/schedule/planner.hpp).
 *
 * @code
 * // Three tensors in backprop order; groups {0, 1} and {2}.
 * gradzip::fusion::layout l({1000, 10, 4096}, {0, 2});
 * l.offset(2);      // 1010
 * l.group_size(0);  // 1010 elements
 * @endcode
 */
#pragma once

#include <cstddef>
#include <limits>
#include <utility>
#include <vector>

#include "gradzip/core/error.hpp"

namespace gradzip::fusion {

class layout {
 public:
  /// No tensors, no groups.
  layout() = default;

  /// `sizes`: each tensor's element count, in backprop order. `group_starts`: the first tensor of
  /// each group, strictly increasing from 0 and below sizes.size(); empty means one group of
  /// everything (none when there are no tensors).
  explicit layout(std::vector<std::size_t> sizes, std::vector<std::size_t> group_starts = {})
      : sizes_(std::move(sizes)), offsets_(sizes_.size() + 1, 0), starts_(std::move(group_starts)) {
    for (std::size_t t = 0; t < sizes_.size(); ++t) {
      GRADZIP_EXPECTS(sizes_[t] <= std::numeric_limits<std::size_t>::max() - offsets_[t],
                      "fusion::layout: the tensors' sizes overflow at tensor ", t);
      offsets_[t + 1] = offsets_[t] + sizes_[t];
    }
    if (starts_.empty() && !sizes_.empty()) starts_.push_back(0);
    for (std::size_t g = 0; g < starts_.size(); ++g) {
      GRADZIP_EXPECTS(starts_[g] < sizes_.size(), "fusion::layout: group ", g, " starts at tensor ", starts_[g],
                      ", but there are ", sizes_.size(), " tensors");
      GRADZIP_EXPECTS(g == 0 ? starts_[0] == 0 : starts_[g] > starts_[g - 1], "fusion::layout: group_starts[", g,
                      "] is ", starts_[g], g == 0 ? ": the first group must start at tensor 0" : ", not after the group before it");
    }
    starts_.push_back(sizes_.size());  // a sentinel: group g ends where group g + 1 starts
  }

  /// One group per tensor: layer-wise compression.
  static layout per_tensor(std::vector<std::size_t> sizes) {
    std::vector<std::size_t> starts(sizes.size());
    for (std::size_t t = 0; t < starts.size(); ++t) starts[t] = t;
    return layout(std::move(sizes), std::move(starts));
  }

  /// Greedy groups in backprop order, each closed once it holds at least `min_elements`
  /// elements (the last may hold fewer), as DDP fills its buckets up to `bucket_cap_mb`.
  static layout by_elements(std::vector<std::size_t> sizes, std::size_t min_elements) {
    GRADZIP_EXPECTS(min_elements >= 1, "fusion::layout::by_elements: min_elements must be >= 1, got ", min_elements);
    std::vector<std::size_t> starts;
    std::size_t filled = min_elements;  // so that tensor 0 opens a group
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      if (filled >= min_elements) {
        starts.push_back(t);
        filled = 0;
      }
      filled += sizes[t];
    }
    return layout(std::move(sizes), std::move(starts));
  }

  std::size_t tensor_count() const noexcept { return sizes_.size(); }
  /// Elements in the flat buffer: the sum of the tensors' sizes.
  std::size_t total() const noexcept { return offsets_.back(); }
  std::size_t size(std::size_t t) const {
    GRADZIP_EXPECTS(t < tensor_count(), "fusion::layout: tensor ", t, " of ", tensor_count());
    return sizes_[t];
  }
  /// Where tensor t starts; offset(tensor_count()) is total().
  std::size_t offset(std::size_t t) const {
    GRADZIP_EXPECTS(t <= tensor_count(), "fusion::layout: the offset of tensor ", t, " of ", tensor_count(),
                    " (offsets go up to ", tensor_count(), ", the end)");
    return offsets_[t];
  }
  const std::vector<std::size_t>& sizes() const noexcept { return sizes_; }

  std::size_t group_count() const noexcept { return starts_.size() - 1; }
  std::size_t first_tensor(std::size_t g) const { return check_group(g), starts_[g]; }
  std::size_t end_tensor(std::size_t g) const { return check_group(g), starts_[g + 1]; }
  std::size_t group_offset(std::size_t g) const { return offsets_[first_tensor(g)]; }
  std::size_t group_size(std::size_t g) const { return offsets_[end_tensor(g)] - group_offset(g); }
  /// The first tensor of each group (without the sentinel).
  std::vector<std::size_t> group_starts() const { return {starts_.begin(), starts_.end() - 1}; }
  /// The largest group, in elements (0 without groups).
  std::size_t largest_group() const {
    std::size_t most = 0;
    for (std::size_t g = 0; g < group_count(); ++g) most = group_size(g) > most ? group_size(g) : most;
    return most;
  }

 private:
  void check_group(std::size_t g) const {
    GRADZIP_EXPECTS(g < group_count(), "fusion::layout: group ", g, " of ", group_count());
  }

  std::vector<std::size_t> sizes_;
  std::vector<std::size_t> offsets_ = {0};  // offsets_[t]: where tensor t starts; back(): total
  std::vector<std::size_t> starts_ = {0};   // group starts and the sentinel tensor_count()
};

}  // namespace gradzip::fusion
