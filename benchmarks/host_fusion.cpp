// Fusion on ResNet-50's 161 parameter tensors (25.6 M fp32 gradients, tools/common/
// model_profiles.hpp, in backprop order): the same flat gradient compressed and decoded
//   - per_tensor: one codec call and one payload per tensor (layer-wise, 161 calls),
//   - fused:      one call per fusion group, DDP's default 25 MB buckets (4 groups),
//   - single:     one call over everything,
// for top-k 1 %, QSGD 4-bit and the fp16 cast. Each reports the whole model's input GB/s and its
// fraction of a copy of those bytes in the same run; `calls` is the codec calls per step. Cupcake
// (MLSys '23) motivates fusion by the per-call cost that per_tensor pays 161 times.
#include "common.hpp"
#include "fusion_common.hpp"

namespace {

using namespace gradzip_bench;

/// The model's flat gradient, a fused_compressor over the mode's groups, and a payload per group.
template <class Codec>
struct model_setup {
  gradzip::host exec;
  gradzip::fusion::fused_compressor<Codec, float, gradzip::host> fc;
  const std::vector<float>& g;
  std::vector<std::vector<std::byte>> out;
  explicit model_setup(const benchmark::State& state)
      : exec(static_cast<int>(state.range(1))),
        fc(exec, make_codec<Codec>(), resnet50_layout(state.range(0)), gradzip::fusion::state::none),
        g(gradzip_bench::gradient(fc.shape().total())),
        out(fc.shape().group_count()) {
    for (std::size_t k = 0; k < out.size(); ++k) out[k].resize(fc.max_compressed_bytes(k));
  }
  /// Compresses every group; returns the payload bytes.
  std::size_t compress_all(std::uint32_t step) {
    std::size_t bytes = 0;
    for (std::size_t k = 0; k < out.size(); ++k) {
      bytes += fc.compress(exec, k, gradzip::span<const float>(g), gradzip::span<std::byte>(out[k]), {step, 0});
    }
    return bytes;
  }
  std::size_t input_bytes() const { return fc.shape().total() * sizeof(float); }
};

/// Compress every group of the model (state none): one step's encode.
template <class Codec>
void BM_compress(benchmark::State& state) {
  model_setup<Codec> m(state);
  std::uint32_t step = 0;
  std::size_t bytes = 0;
  gradzip_bench::run_timed(state, m.exec, m.input_bytes(), [&] { benchmark::DoNotOptimize(bytes = m.compress_all(step++)); });
  state.counters["calls"] = static_cast<double>(m.out.size());
  state.counters["payload_MB"] = bytes / 1e6;
}

/// Decode every group's payload into a flat fp32 accumulator: one peer's decode.
template <class Codec>
void BM_decompress_add(benchmark::State& state) {
  model_setup<Codec> m(state);
  std::vector<std::size_t> sizes;
  for (std::size_t k = 0; k < m.out.size(); ++k) {
    sizes.push_back(m.fc.compress(m.exec, k, gradzip::span<const float>(m.g), gradzip::span<std::byte>(m.out[k])));
  }
  std::vector<float> accum(m.fc.shape().total(), 0.0f);
  gradzip_bench::run_timed(state, m.exec, m.input_bytes(), [&] {
    for (std::size_t k = 0; k < m.out.size(); ++k) {
      m.fc.decompress_add(m.exec, k, gradzip::span<const std::byte>(m.out[k].data(), sizes[k]), gradzip::span<float>(accum));
    }
    benchmark::ClobberMemory();
  });
  state.counters["calls"] = static_cast<double>(m.out.size());
}

void modes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"mode", "threads"});
  for (int threads : {1, 2}) {
    for (int m : {fusion_mode::per_tensor, fusion_mode::fused, fusion_mode::single}) b->Args({m, threads});
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

}  // namespace

BENCHMARK_TEMPLATE(BM_compress, topk1)->Apply(modes);
BENCHMARK_TEMPLATE(BM_compress, qsgd4)->Apply(modes);
BENCHMARK_TEMPLATE(BM_compress, fp16)->Apply(modes);
BENCHMARK_TEMPLATE(BM_decompress_add, topk1)->Apply(modes);
BENCHMARK_TEMPLATE(BM_decompress_add, qsgd4)->Apply(modes);
BENCHMARK_TEMPLATE(BM_decompress_add, fp16)->Apply(modes);
