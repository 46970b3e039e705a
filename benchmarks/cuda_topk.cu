// CUDA top-k at 1 % (fp32 and bf16 input) beside a device-to-device copy of the same bytes,
// 2^16 .. 2^28 elements, timed with CUDA events (manual time). Without a GPU every benchmark
// reports "no CUDA device" and skips.
#include "cuda_common.cuh"

namespace {

using namespace gradzip_bench;

template <class T>
void BM_cuda_topk(benchmark::State& state) {
  if (!has_gpu()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  gradzip::cuda exec;
  const gradzip::codec<gradzip::sparsify::topk> c{gradzip::sparsify::topk::ratio(0.01)};
  T* x = upload_gradient<T>(n);
  std::byte* out = nullptr;
  const std::size_t out_bytes = c.max_compressed_bytes<T>(n);
  GRADZIP_CUDA_TRY(cudaMalloc(&out, out_bytes));
  exec.reserve(c.workspace_bytes<T>(exec, n));
  time_events(state, exec.stream(), n * sizeof(T), [&] {
    c.compress(exec, gradzip::span<const T>(x, n), gradzip::span<std::byte>(out, out_bytes));
  });
  // The copy reads and writes the bytes; top-k reads them (three times) and writes 1 %.
  state.counters["copy_GBps"] = copy_roofline(n * sizeof(T), exec.stream()) / 1e9;
  state.counters["roofline"] = state.counters["input_GBps"] / state.counters["copy_GBps"];
  cudaFree(x);
  cudaFree(out);
}

}  // namespace

BENCHMARK_TEMPLATE(BM_cuda_topk, float)->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_cuda_topk, __nv_bfloat16)->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
