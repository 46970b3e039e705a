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

/// A one-rank NCCL communicator on device 0 and a stream of its own, released on exit.
struct one_rank_nccl {
  ncclComm_t nccl{};
  cudaStream_t stream{};
  one_rank_nccl() {
    int device = 0;
    GRADZIP_NCCL_TRY(ncclCommInitAll(&nccl, 1, &device));
    GRADZIP_CUDA_TRY(cudaStreamCreate(&stream));
  }
  ~one_rank_nccl() {
    cudaStreamDestroy(stream);
    ncclCommDestroy(nccl);
  }
};

template <class Codec>
void one_rank(const Codec& c, bool feedback) {
  const std::size_t n = 1 << 16;
  const auto g = gradzip_tools::synthetic_gradient<float>(n, 77);
  one_rank_nccl one;
  {
    gz::comm::nccl_communicator comm{one.nccl, one.stream};
    gz::cuda exec{one.stream};
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
}

/// alltoall_sizes and alltoallv_bytes on one rank: its part comes back to it whole.
void alltoall_to_self(one_rank_nccl& one) {
  gz::comm::nccl_communicator comm{one.nccl, one.stream};
  const std::vector<std::uint64_t> mine{37};
  std::vector<std::uint64_t> theirs{0};
  comm.alltoall_sizes(gz::span<const std::uint64_t>(mine.data(), 1), gz::span<std::uint64_t>(theirs.data(), 1));
  CHECK(theirs[0] == 37);
  std::vector<std::byte> part(37);
  for (std::size_t i = 0; i < part.size(); ++i) part[i] = static_cast<std::byte>(i * 5 + 1);
  std::byte* d_send = nullptr;
  std::byte* d_recv = nullptr;
  GRADZIP_CUDA_TRY(cudaMalloc(&d_send, part.size()));
  GRADZIP_CUDA_TRY(cudaMalloc(&d_recv, part.size()));
  GRADZIP_CUDA_TRY(cudaMemcpy(d_send, part.data(), part.size(), cudaMemcpyHostToDevice));
  comm.alltoallv_bytes(gz::span<const std::byte>(d_send, part.size()), gz::span<const std::uint64_t>(mine.data(), 1),
                       gz::span<std::byte>(d_recv, part.size()), gz::span<const std::uint64_t>(theirs.data(), 1));
  GRADZIP_CUDA_TRY(cudaStreamSynchronize(one.stream));
  std::vector<std::byte> got(part.size());
  GRADZIP_CUDA_TRY(cudaMemcpy(got.data(), d_recv, got.size(), cudaMemcpyDeviceToHost));
  CHECK(got == part);
  cudaFree(d_send);
  cudaFree(d_recv);
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

TEST_CASE("nccl alltoall_sizes and alltoallv_bytes deliver a rank's part to itself", "[gpu]") {
  if (!has_gpu()) {
    WARN("GRADZIP_NO_GPU");
    return;
  }
  one_rank_nccl one;
  alltoall_to_self(one);
}
