// Fusion on the device, ready for the first GPU: ResNet-50's 161 parameter tensors (25.6 M fp32
// gradients, tools/common/model_profiles.hpp, backprop order) compressed and decoded per tensor
// (161 calls), in DDP's 25 MB buckets (4 groups) and in one call, for top-k 1 %, QSGD 4-bit and
// the fp16 cast, timed with CUDA events around the whole model. Counters: input_GBps (the
// model's fp32 bytes / time), roofline (against a device copy of those bytes in this run),
// calls. Each compress returns its size to the host, as a training loop needs it: the per-call
// cost that fusion removes includes that synchronization.
#include "cuda_common.cuh"
#include "fusion_common.hpp"

namespace {

using namespace gradzip_bench;

template <class Codec, bool Decompress>
void BM_cuda_fusion(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  gradzip::cuda exec;
  gradzip::fusion::fused_compressor<Codec, float, gradzip::cuda> fc(exec, make_codec<Codec>(), resnet50_layout(state.range(0)),
                                                                    gradzip::fusion::state::none);
  const gradzip::fusion::layout& l = fc.shape();
  float* g = upload_gradient<float>(l.total());
  gradzip::fusion::flat_buffer<float, gradzip::cuda> accum(exec, l);
  std::vector<std::byte*> out(l.group_count());
  std::vector<std::size_t> bytes(l.group_count());
  for (std::size_t k = 0; k < out.size(); ++k) GRADZIP_CUDA_TRY(cudaMalloc(&out[k], fc.max_compressed_bytes(k)));
  const gradzip::span<const float> grads(g, l.total());
  std::uint32_t step = 0;
  const auto compress_all = [&] {
    for (std::size_t k = 0; k < out.size(); ++k) {
      bytes[k] = fc.compress(exec, k, grads, gradzip::span<std::byte>(out[k], fc.max_compressed_bytes(k)), {step, 0});
    }
    ++step;
  };
  compress_all();
  if constexpr (Decompress) {
    time_events(state, exec.stream(), l.total() * sizeof(float), [&] {
      for (std::size_t k = 0; k < out.size(); ++k) {
        fc.decompress_add(exec, k, gradzip::span<const std::byte>(out[k], bytes[k]), accum.all());
      }
    });
  } else {
    time_events(state, exec.stream(), l.total() * sizeof(float), compress_all);
  }
  exec.check();
  state.counters["calls"] = static_cast<double>(l.group_count());
  state.counters["copy_GBps"] = copy_roofline(l.total() * sizeof(float), exec.stream()) / 1e9;
  state.counters["roofline"] = state.counters["input_GBps"] / state.counters["copy_GBps"];
  cudaFree(g);
  for (std::byte* p : out) cudaFree(p);
}

/// Per tensor, in buckets, in one call; each `timed_runs` times, as every device benchmark (the
/// library's own iteration count would take as few runs as fill its minimum time).
void modes(benchmark::internal::Benchmark* b) {
  b->ArgName("mode")->Arg(0)->Arg(1)->Arg(2)->Iterations(timed_runs)->UseManualTime()->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK_TEMPLATE(BM_cuda_fusion, topk1, false)->Name("cuda_fusion_compress/topk1")->Apply(modes);
BENCHMARK_TEMPLATE(BM_cuda_fusion, qsgd4, false)->Name("cuda_fusion_compress/qsgd4")->Apply(modes);
BENCHMARK_TEMPLATE(BM_cuda_fusion, fp16, false)->Name("cuda_fusion_compress/fp16")->Apply(modes);
BENCHMARK_TEMPLATE(BM_cuda_fusion, topk1, true)->Name("cuda_fusion_decompress_add/topk1")->Apply(modes);
BENCHMARK_TEMPLATE(BM_cuda_fusion, qsgd4, true)->Name("cuda_fusion_decompress_add/qsgd4")->Apply(modes);
BENCHMARK_TEMPLATE(BM_cuda_fusion, fp16, true)->Name("cuda_fusion_decompress_add/fp16")->Apply(modes);
