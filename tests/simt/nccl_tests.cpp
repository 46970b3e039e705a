// tests/device/test_nccl.cu on the SIMT backend, over the one-rank fake NCCL (fake_nccl.cpp),
// and what only a fake can be made to do: a nonblocking communicator's ncclInProgress, and an
// asynchronous error while nccl_communicator waits for its stream.
#include "device/test_nccl.cu"

#include "fake_nccl.hpp"

namespace {

/// Nonblocking fake communicators for one test case, then blocking ones again.
struct nonblocking_fakes {
  explicit nonblocking_fakes(int polls) { fake_nccl::use({polls}); }
  ~nonblocking_fakes() { fake_nccl::use({}); }
};

}  // namespace

TEST_CASE("nccl_communicator on a nonblocking communicator waits out ncclInProgress before its next call",
          "[nccl]") {
  nonblocking_fakes fakes(3);
  // allreduce_sum (fp16 cast), allgather_sizes and the grouped broadcasts (top-k): the same bytes.
  one_rank(gz::codec<gz::sparsify::none, gz::quantize::cast_fp16, gz::encode::none>{}, false);
  one_rank(gz::codec<gz::sparsify::topk>{gz::sparsify::topk::ratio(0.01)}, true);

  // The grouped sends and receives of both exchanges.
  one_rank_nccl one;
  alltoall_to_self(one);
  const fake_nccl::counts seen = fake_nccl::seen(one.nccl);
  CHECK(seen.calls_while_in_progress == 0);
  // The constructor's two calls and the two groups, 3 polls each at least.
  CHECK(seen.async_error_queries >= 12);
}

TEST_CASE("nccl_communicator throws NCCL's asynchronous error where it waits for its stream", "[nccl]") {
  one_rank_nccl one;
  gz::comm::nccl_communicator comm{one.nccl, one.stream};
  fake_nccl::fail(one.nccl, ncclRemoteError);
  const std::vector<std::uint64_t> mine{5};
  std::vector<std::uint64_t> theirs{0};
  CHECK_THROWS_WITH(comm.alltoall_sizes(gz::span<const std::uint64_t>(mine.data(), 1),
                                        gz::span<std::uint64_t>(theirs.data(), 1)),
                    "nccl_communicator::alltoall_sizes: NCCL reported an asynchronous error (remote process exited "
                    "or there was a network error; fake: rank 1 stopped answering): abort the communicator "
                    "(ncclCommAbort)");
  std::vector<std::uint64_t> sizes(1);
  CHECK_THROWS_WITH(comm.allgather_sizes(7, gz::span<std::uint64_t>(sizes.data(), 1)),
                    Catch::Contains("nccl_communicator::allgather_sizes: NCCL reported an asynchronous error"));
}

TEST_CASE("nccl_communicator names the call whose ncclInProgress ends in an error", "[nccl]") {
  nonblocking_fakes fakes(2);
  one_rank_nccl one;
  gz::comm::nccl_communicator comm{one.nccl, one.stream};
  float* d = nullptr;
  GRADZIP_CUDA_TRY(cudaMalloc(&d, 4 * sizeof(float)));
  fake_nccl::fail(one.nccl, ncclRemoteError);
  CHECK_THROWS_WITH(comm.allreduce_sum(d, 4, gz::element_type::f32),
                    Catch::Contains("ncclAllReduce(data, data, count, nccl_type(type), ncclSum, comm_, stream_) failed: "
                                    "remote process exited or there was a network error"));
  cudaFree(d);
}
