// What the host and CUDA fusion benchmarks share: the codecs, and ResNet-50's tensors
// (tools/common/model_profiles.hpp, backprop order) laid out per tensor, in DDP's 25 MB
// buckets, or as one group.
#pragma once

#include <type_traits>

#include "common/model_profiles.hpp"
#include "gradzip/gradzip.hpp"

namespace gradzip_bench {

using topk1 = gradzip::codec<gradzip::sparsify::topk>;
using qsgd4 = gradzip::codec<gradzip::sparsify::none, gradzip::quantize::qsgd<7>, gradzip::encode::none>;
using fp16 = gradzip::codec<gradzip::sparsify::none, gradzip::quantize::cast_fp16, gradzip::encode::none>;

template <class Codec>
Codec make_codec() {
  if constexpr (std::is_same_v<Codec, topk1>) {
    return topk1{gradzip::sparsify::topk::ratio(0.01)};
  } else {
    return Codec{};
  }
}

enum fusion_mode : int { per_tensor, fused, single };

inline gradzip::fusion::layout resnet50_layout(std::int64_t mode) {
  auto sizes = gradzip_tools::backprop_order(gradzip_tools::resnet50_parameters());
  if (mode == per_tensor) return gradzip::fusion::layout::per_tensor(std::move(sizes));
  if (mode == fused) return gradzip::fusion::layout::by_elements(std::move(sizes), 25u * 1024 * 1024 / 4);
  return gradzip::fusion::layout(std::move(sizes));
}

}  // namespace gradzip_bench
