// CUDA quantizers, dense, 2^16 .. 2^28 elements of fp32 and bf16: compress (one kernel, one read
// of the input) and decompress_add (validate, then one fused dequantize-accumulate pass), timed
// with CUDA events. Counters: input_GBps (dense tensor bytes / time), total_IO_GBps (every byte
// read and written: input + payload for compress; payload + accumulator read and write for
// decompress_add), roofline (total IO over a device copy's read + write measured in this run),
// bytes_per_element. The issue's target on H100: >= 2.6 TB/s total IO at 2^28.
#include "cuda_common.cuh"

namespace {

using namespace gradzip_bench;
namespace q = gradzip::quantize;
template <class Values>
using dense = gradzip::codec<gradzip::sparsify::none, Values, gradzip::encode::none>;

template <class Values>
struct seeded : Values {
  constexpr seeded() = default;
  explicit constexpr seeded(std::uint64_t) {}
};
using uniform4_stochastic = q::uniform<4, q::rounding::stochastic>;

template <class Values, class T, bool Decompress>
void BM_cuda_quantize(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  gradzip::cuda exec;
  const dense<Values> c{{}, Values{7}};
  T* x = upload_gradient<T>(n);
  const std::size_t payload_bytes = c.template max_compressed_bytes<T>(n);
  std::byte* payload = nullptr;
  float* accum = nullptr;
  GRADZIP_CUDA_TRY(cudaMalloc(&payload, payload_bytes));
  GRADZIP_CUDA_TRY(cudaMalloc(&accum, n * sizeof(float)));
  GRADZIP_CUDA_TRY(cudaMemset(accum, 0, n * sizeof(float)));
  exec.reserve(c.template workspace_bytes<T>(exec, n));
  c.compress(exec, gradzip::span<const T>(x, n), gradzip::span<std::byte>(payload, payload_bytes));
  double io = 0;
  if constexpr (Decompress) {
    time_events(state, exec.stream(), n * sizeof(T), [&] {
      c.decompress_add(exec, gradzip::span<const std::byte>(payload, payload_bytes), gradzip::span<float>(accum, n));
    });
    io = payload_bytes + 2.0 * n * sizeof(float);
  } else {
    std::uint32_t step = 0;
    time_events(state, exec.stream(), n * sizeof(T), [&] {
      c.compress(exec, gradzip::span<const T>(x, n), gradzip::span<std::byte>(payload, payload_bytes), {step++, 0});
    });
    io = static_cast<double>(n * sizeof(T) + payload_bytes);
  }
  exec.check();
  const double seconds = n * sizeof(T) / (state.counters["input_GBps"] * 1e9);
  state.counters["total_IO_GBps"] = io / seconds / 1e9;
  state.counters["copy_IO_GBps"] = 2.0 * copy_roofline(n * sizeof(T), exec.stream()) / 1e9;
  state.counters["roofline"] = state.counters["total_IO_GBps"] / state.counters["copy_IO_GBps"];
  state.counters["bytes_per_element"] = static_cast<double>(payload_bytes) / n;
  cudaFree(x);
  cudaFree(payload);
  cudaFree(accum);
}

}  // namespace

#define GRADZIP_CUDA_QUANTIZER_BENCH(name, values)                                                       \
  BENCHMARK_TEMPLATE(BM_cuda_quantize, values, float, false)->Name("cuda_compress/" name "/f32")         \
      ->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);                                \
  BENCHMARK_TEMPLATE(BM_cuda_quantize, values, __nv_bfloat16, false)->Name("cuda_compress/" name "/bf16") \
      ->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond);                                \
  BENCHMARK_TEMPLATE(BM_cuda_quantize, values, float, true)->Name("cuda_decompress_add/" name "/f32")    \
      ->Apply(device_axis)->UseManualTime()->Unit(benchmark::kMicrosecond)

GRADZIP_CUDA_QUANTIZER_BENCH("cast_fp16", seeded<q::cast_fp16>);
GRADZIP_CUDA_QUANTIZER_BENCH("cast_bf16", seeded<q::cast_bf16>);
GRADZIP_CUDA_QUANTIZER_BENCH("cast_fp8_e4m3", seeded<q::cast_fp8_e4m3>);
GRADZIP_CUDA_QUANTIZER_BENCH("uniform4", seeded<q::uniform<4>>);
GRADZIP_CUDA_QUANTIZER_BENCH("uniform4_stochastic", uniform4_stochastic);
GRADZIP_CUDA_QUANTIZER_BENCH("qsgd4", q::qsgd<7>);
GRADZIP_CUDA_QUANTIZER_BENCH("terngrad", q::terngrad<>);
GRADZIP_CUDA_QUANTIZER_BENCH("sign", seeded<q::sign<false>>);
GRADZIP_CUDA_QUANTIZER_BENCH("scaled_sign", seeded<q::scaled_sign>);
GRADZIP_CUDA_QUANTIZER_BENCH("onebit", seeded<q::onebit<>>);
GRADZIP_CUDA_QUANTIZER_BENCH("natural8", q::natural<8>);
