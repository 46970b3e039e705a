// The NCCL adapter on one rank: allreducer over nccl_communicator, on the summable path (fp16
// cast) and the gather path (top-k), equals decoding this rank's own payload. Without a GPU each
// test prints GRADZIP_NO_GPU and returns (ctest: skipped).
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"
#include "gradzip/comm/nccl.cuh"
#include "gradzip/gradzip.cuh"

namespace gz = gradzip;

namespace {

bool has_gpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

template <class Codec>
void one_rank(const Codec& c, bool feedback) {
  const std::size_t n = 1 << 16;
  const auto g = gradzip_tools::synthetic_gradient<float>(n, 77);
  ncclComm_t nccl;
  int device = 0;
  GRADZIP_NCCL_TRY(ncclCommInitAll(&nccl, 1, &device));
  cudaStream_t stream;
  GRADZIP_CUDA_TRY(cudaStreamCreate(&stream));
  {
    gz::comm::nccl_communicator comm{nccl, stream};
    gz::cuda exec{stream};
    gz::comm::allreducer<Codec, float, gz::cuda> all(exec, c, n, 1, feedback);
    float* d = nullptr;
    GRADZIP_CUDA_TRY(cudaMalloc(&d, n * sizeof(float)));
    GRADZIP_CUDA_TRY(cudaMemcpy(d, g.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    all.run(comm, exec, gz::span<float>(d, n), {3, 0});
    exec.check();
    std::vector<float> got(n);
    GRADZIP_CUDA_TRY(cudaMemcpy(got.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    cudaFree(d);
    gz::host host;
    std::vector<float> expected(n);
    const auto payload = test::compress(c, host, g, {3, 0});
    c.decompress(host, gz::span<const std::byte>(payload), gz::span<float>(expected));
    CHECK(std::memcmp(got.data(), expected.data(), n * sizeof(float)) == 0);
  }
  cudaStreamDestroy(stream);
  ncclCommDestroy(nccl);
}

}  // namespace

TEST_CASE("nccl allreducer on one rank equals the codec's own round trip", "[gpu]") {
  if (!has_gpu()) {
    WARN("GRADZIP_NO_GPU");
    return;
  }
  one_rank(gz::codec<gz::sparsify::none, gz::quantize::cast_fp16, gz::encode::none>{}, false);
  one_rank(gz::codec<gz::sparsify::topk>{gz::sparsify::topk::ratio(0.01)}, true);
}
