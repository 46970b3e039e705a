// The parameter tensors of reference models, for fusion benchmarks and the scheduler's tables.
//
// ResNet-50: torchvision's `resnet50()` (He et al., CVPR 2016; torchvision/models/resnet.py,
// Bottleneck with the stride on the 3x3 convolution): 161 parameter tensors, 25,557,032
// parameters, at 224 x 224 inputs.
// BERT-base: Hugging Face's `BertModel` with bert-base-uncased's configuration (Devlin et al.,
// NAACL 2019: 12 layers, hidden 768, 12 heads, FFN 3072, vocabulary 30,522, 512 positions) and
// its pooler: 199 parameter tensors, 109,482,240 parameters, at sequence length 128.
// Listed layer by layer in the order the frameworks register them (forward order); backprop
// produces their gradients in the reverse order, which `backprop_order` gives.
//
// Each parameter carries the forward FLOPs it is charged with per sample (an image; a token for
// BERT), counted from the layer's shape: 2 in out k^2 H_out W_out for a convolution, 2 in out
// for a linear layer, and for BERT's attention the score and value products (2 x 2 x 128 x 768
// per token per layer, charged to the attention's output projection). Normalization layers are
// charged 8 FLOPs per activation and biases nothing: they are memory-bound and small. The
// scheduler's tables (docs/scheduling.md) take backward time as twice the forward FLOPs at an
// assumed sustained rate: the shapes are the source, the rate an assumption stated there.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace gradzip_tools {

struct parameter {
  std::string name;
  std::vector<std::size_t> shape;
  double forward_flops = 0.0;  ///< per sample (image or token), charged to this tensor
  std::size_t size() const {
    std::size_t n = 1;
    for (std::size_t d : shape) n *= d;
    return n;
  }
};

/// torchvision resnet50's parameters in registration (forward) order.
inline std::vector<parameter> resnet50_parameters() {
  std::vector<parameter> p;
  // A convolution with `hw` x `hw` outputs, and the batch norm after it.
  const auto conv = [&](const std::string& name, std::size_t out, std::size_t in, std::size_t k, std::size_t hw) {
    p.push_back({name + ".weight", {out, in, k, k}, 2.0 * in * out * k * k * hw * hw});
  };
  const auto bn = [&](const std::string& name, std::size_t c, std::size_t hw) {  // BatchNorm2d: weight and bias
    p.push_back({name + ".weight", {c}, 8.0 * c * hw * hw});
    p.push_back({name + ".bias", {c}, 0.0});
  };
  conv("conv1", 64, 3, 7, 112);
  bn("bn1", 64, 112);
  const std::size_t planes[4] = {64, 128, 256, 512}, blocks[4] = {3, 4, 6, 3}, sides[4] = {56, 28, 14, 7};
  std::size_t in = 64;
  for (int layer = 0; layer < 4; ++layer) {
    for (std::size_t b = 0; b < blocks[layer]; ++b) {
      const std::string block = "layer" + std::to_string(layer + 1) + "." + std::to_string(b);
      const std::size_t width = planes[layer], out = 4 * planes[layer], hw = sides[layer];
      // The first block of layers 2-4 runs its 1x1 reduction at the previous (twice larger) side.
      const std::size_t before = layer > 0 && b == 0 ? 2 * hw : hw;
      conv(block + ".conv1", width, in, 1, before);
      bn(block + ".bn1", width, before);
      conv(block + ".conv2", width, width, 3, hw);
      bn(block + ".bn2", width, hw);
      conv(block + ".conv3", out, width, 1, hw);
      bn(block + ".bn3", out, hw);
      if (b == 0) {  // the projection shortcut
        conv(block + ".downsample.0", out, in, 1, hw);
        bn(block + ".downsample.1", out, hw);
      }
      in = out;
    }
  }
  p.push_back({"fc.weight", {1000, 2048}, 2.0 * 2048 * 1000});
  p.push_back({"fc.bias", {1000}, 0.0});
  return p;
}

/// Hugging Face BertModel (bert-base-uncased) parameters in registration order; FLOPs per token
/// at sequence length `sequence`.
inline std::vector<parameter> bert_base_parameters(std::size_t sequence = 128) {
  const std::size_t hidden = 768, ffn = 3072, layers = 12;
  std::vector<parameter> p;
  const auto linear = [&](const std::string& name, std::size_t out, std::size_t in, double extra = 0.0) {
    p.push_back({name + ".weight", {out, in}, 2.0 * in * out + extra});
    p.push_back({name + ".bias", {out}, 0.0});
  };
  const auto norm = [&](const std::string& name) {
    p.push_back({name + ".weight", {hidden}, 8.0 * hidden});
    p.push_back({name + ".bias", {hidden}, 0.0});
  };
  // Embedding lookups: their backward is a scatter-add of one row per token.
  p.push_back({"embeddings.word_embeddings.weight", {30522, hidden}, 2.0 * hidden});
  p.push_back({"embeddings.position_embeddings.weight", {512, hidden}, 2.0 * hidden});
  p.push_back({"embeddings.token_type_embeddings.weight", {2, hidden}, 2.0 * hidden});
  norm("embeddings.LayerNorm");
  for (std::size_t l = 0; l < layers; ++l) {
    const std::string layer = "encoder.layer." + std::to_string(l);
    linear(layer + ".attention.self.query", hidden, hidden);
    linear(layer + ".attention.self.key", hidden, hidden);
    linear(layer + ".attention.self.value", hidden, hidden);
    // QK^T and the weighted sum of V, 2 x 2 x sequence x hidden per token, charged here.
    linear(layer + ".attention.output.dense", hidden, hidden, 4.0 * static_cast<double>(sequence) * hidden);
    norm(layer + ".attention.output.LayerNorm");
    linear(layer + ".intermediate.dense", ffn, hidden);
    linear(layer + ".output.dense", hidden, ffn);
    norm(layer + ".output.LayerNorm");
  }
  linear("pooler.dense", hidden, hidden);
  return p;
}

/// examples/mpi_train.cpp's 784-128-10 MLP, as two linear layers (fc1, fc2); FLOPs per image.
inline std::vector<parameter> mlp_parameters() {
  return {{"fc1.weight", {128, 784}, 2.0 * 784 * 128},
          {"fc1.bias", {128}, 0.0},
          {"fc2.weight", {10, 128}, 2.0 * 128 * 10},
          {"fc2.bias", {10}, 0.0}};
}

/// The tensors' element counts in backprop order (the reverse of registration order).
inline std::vector<std::size_t> backprop_order(const std::vector<parameter>& forward) {
  std::vector<std::size_t> sizes;
  for (auto it = forward.rbegin(); it != forward.rend(); ++it) sizes.push_back(it->size());
  return sizes;
}

/// Each tensor's backward time in backprop order: twice its forward FLOPs for `samples` samples
/// at `flops_per_second`.
inline std::vector<double> backward_seconds(const std::vector<parameter>& forward, double samples,
                                            double flops_per_second) {
  std::vector<double> t;
  for (auto it = forward.rbegin(); it != forward.rend(); ++it) t.push_back(2.0 * it->forward_flops * samples / flops_per_second);
  return t;
}

/// The forward pass's FLOPs per sample.
inline double forward_flops(const std::vector<parameter>& forward) {
  double f = 0.0;
  for (const parameter& q : forward) f += q.forward_flops;
  return f;
}

}  // namespace gradzip_tools
