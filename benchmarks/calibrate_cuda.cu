// gradzip_calibrate_cuda: gradzip_calibrate's measurement on the CUDA executor, ready for the
// first GPU. Each codec's compress (which returns its size to the host, as a training loop
// needs) and decompress_add (then a stream synchronization) at 2^12 .. 2^24 fp32 elements, the
// median wall time of each, fitted to alpha + beta * bytes; the JSON holds device costs only.
// Merge it into the host calibration with gradzip_plan --device-calibration FILE.
//
// For a sparsifying codec it also times the sparse_sync route's own work on the device, as
// gradzip_calibrate does on the host: the group as planned_allreducer runs it by Zen's sparse
// sync (plan_codec<float, cuda>::sparse), on one rank, less the codec's compress.
//
//   gradzip_calibrate_cuda [--out device.json] [--quick]
#include "calibration.hpp"
#include "cuda_common.cuh"

namespace {

using namespace gradzip_calibration;

template <class Codec>
measured measure(const settings& s, const Codec& c) {
  gz::cuda exec;
  measured m;
  for (int log2 = 12; log2 <= 24; log2 += 2) {
    const std::size_t n = std::size_t{1} << log2;
    float* g = gradzip_bench::upload_gradient<float>(n);
    const std::size_t most = c.template max_compressed_bytes<float>(n);
    std::byte* out = nullptr;
    float* accum = nullptr;
    GRADZIP_CUDA_TRY(cudaMalloc(&out, most));
    GRADZIP_CUDA_TRY(cudaMalloc(&accum, n * sizeof(float)));
    GRADZIP_CUDA_TRY(cudaMemset(accum, 0, n * sizeof(float)));
    exec.reserve(c.template workspace_bytes<float>(exec, n));
    std::size_t size = 0;
    std::uint32_t step = 0;
    m.compress.push_back(median_seconds(s, [&] {
      size = c.compress(exec, gz::span<const float>(g, n), gz::span<std::byte>(out, most), {step++, 0});
      exec.synchronize();
    }));
    m.decompress_add.push_back(median_seconds(s, [&] {
      c.decompress_add(exec, gz::span<const std::byte>(out, size), gz::span<float>(accum, n));
      exec.synchronize();
    }));
    exec.check();
    m.bytes.push_back(4.0 * static_cast<double>(n));
    m.payload.push_back(static_cast<double>(size));
    if constexpr (Codec::has_indices) {
      gradzip_bench::single_rank_device one;
      const auto group = gz::comm::plan_codec<float, gz::cuda>::sparse("", c).build(exec, n, 1);
      float* work = nullptr;
      GRADZIP_CUDA_TRY(cudaMalloc(&work, n * sizeof(float)));
      const double whole = median_seconds(s, [&] {
        GRADZIP_CUDA_TRY(cudaMemcpyAsync(work, g, n * sizeof(float), cudaMemcpyDeviceToDevice, exec.stream()));
        group->run(one, exec, gz::span<float>(work, n), {step++, 0});
        exec.synchronize();
      });
      m.sparse_sync.push_back(std::max(whole - m.compress.back(), 1e-9));
      cudaFree(work);
    }
    cudaFree(g);
    cudaFree(out);
    cudaFree(accum);
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) try {
  const settings s = parse(argc, argv, "gradzip_calibrate_cuda");
  if (!gradzip_bench::has_gpu()) throw std::runtime_error("gradzip_calibrate_cuda: no CUDA device");
  json codecs = json::array();
  for_each_codec([&](const char* name, auto codec, double density) {
    codecs.push(codec_json(name, decltype(codec)::summable, density, measure(s, codec), gz::schedule::executor_kind::device));
  });
  write(s, json::object().set("executor", "cuda"), codecs);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
