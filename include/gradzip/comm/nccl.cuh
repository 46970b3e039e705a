/**
 * @file nccl.cuh
 * @brief `comm::nccl_communicator`: gradzip's communicator over an NCCL communicator and a CUDA
 * stream, for `allreducer<Codec, T, gradzip::cuda>`.
 *
 * Buffers are device memory. `allreduce_sum` is one `ncclAllReduce` (fp32, fp64, fp16 and bf16
 * natively); `allgather_sizes` gathers into device memory and copies the sizes to the host (one
 * synchronization: the host needs them to lay out the gather); `allgatherv_bytes` is a group of
 * one `ncclBroadcast` per rank, each rank's payload straight into its place. The executor may
 * run on another stream than the communicator: allreducer orders compress before the
 * collectives and decode after them with events (`communicator::cuda_stream`). Every NCCL
 * error becomes a `gradzip::cuda_error` naming the call.
 *
 * This header includes <nccl.h>; the rest of gradzip never does. Link libnccl
 * (`find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})`).
 *
 * @code
 * ncclComm_t nccl;  ncclCommInitRank(&nccl, ranks, nccl_id, rank);
 * gradzip::comm::nccl_communicator comm{nccl, stream};
 * gradzip::cuda exec{stream};
 * gradzip::comm::allreducer<codec_t, float, gradzip::cuda> all(exec, codec, n, ranks, true);
 * all.run(comm, exec, d_grad, {step, tensor_id});   // d_grad: gradzip::span<float>, device memory
 * @endcode
 */
#pragma once

#include <nccl.h>

#include <vector>

#include "gradzip/comm/collective.hpp"
#include "gradzip/core/cuda.cuh"

#define GRADZIP_NCCL_TRY(call)                                                                     \
  do {                                                                                             \
    const ncclResult_t gradzip_nccl_status_ = (call);                                              \
    if (gradzip_nccl_status_ != ncclSuccess) {                                                     \
      throw ::gradzip::cuda_error(::gradzip::detail::concat(#call, " failed: ",                    \
                                                            ncclGetErrorString(gradzip_nccl_status_), \
                                                            " at ", __FILE__, ":", __LINE__));      \
    }                                                                                              \
  } while (0)

namespace gradzip::comm::detail {
/// ncclGroupStart in the constructor, ncclGroupEnd in end() or, if an NCCL call between them
/// threw, in the destructor: a group left open would silently batch the next step's calls.
class nccl_group {
 public:
  nccl_group() { GRADZIP_NCCL_TRY(ncclGroupStart()); }
  nccl_group(const nccl_group&) = delete;
  nccl_group& operator=(const nccl_group&) = delete;
  void end() {
    open_ = false;
    GRADZIP_NCCL_TRY(ncclGroupEnd());
  }
  ~nccl_group() {
    if (open_) (void)ncclGroupEnd();  // unwinding: the error that threw is the one to report
  }

 private:
  bool open_ = true;
};
}  // namespace gradzip::comm::detail

namespace gradzip::comm {

class nccl_communicator final : public communicator {
 public:
  nccl_communicator(ncclComm_t comm, cudaStream_t stream) : comm_(comm), stream_(stream) {
    GRADZIP_NCCL_TRY(ncclCommUserRank(comm_, &rank_));
    GRADZIP_NCCL_TRY(ncclCommCount(comm_, &size_));
    sizes_ = gradzip::detail::device_buffer<std::uint64_t>(static_cast<std::size_t>(size_));
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void* cuda_stream() const noexcept override { return stream_; }

  void allreduce_sum(void* data, std::size_t count, element_type type) override {
    GRADZIP_NCCL_TRY(ncclAllReduce(data, data, count, nccl_type(type), ncclSum, comm_, stream_));
  }

  void allgather_sizes(std::uint64_t mine, span<std::uint64_t> sizes) override {
    GRADZIP_EXPECTS(sizes.size() == static_cast<std::size_t>(size_), "allgather_sizes: ", sizes.size(),
                    " slots for ", size_, " ranks");
    std::uint64_t* slot = sizes_.data() + rank_;
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(slot, &mine, sizeof mine, cudaMemcpyHostToDevice, stream_));
    GRADZIP_NCCL_TRY(ncclAllGather(slot, sizes_.data(), 1, ncclUint64, comm_, stream_));
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(sizes.data(), sizes_.data(), sizes.size() * sizeof(std::uint64_t),
                                     cudaMemcpyDeviceToHost, stream_));
    GRADZIP_CUDA_TRY(cudaStreamSynchronize(stream_));  // `mine` is a local, and the host needs the sizes
  }

  void allgatherv_bytes(span<const std::byte> mine, span<std::byte> all, span<const std::uint64_t> sizes) override {
    GRADZIP_EXPECTS(sizes.size() == static_cast<std::size_t>(size_), "allgatherv_bytes: ", sizes.size(),
                    " sizes for ", size_, " ranks");
    std::uint64_t total = 0;
    for (std::uint64_t s : sizes) total += s;
    GRADZIP_EXPECTS(total <= all.size(), "allgatherv_bytes: ", total, " bytes to gather into ", all.size());
    GRADZIP_EXPECTS(mine.size() == sizes[static_cast<std::size_t>(rank_)], "allgatherv_bytes: this rank sends ",
                    mine.size(), " bytes, its announced size is ", sizes[static_cast<std::size_t>(rank_)]);
    detail::nccl_group group;
    std::uint64_t at = 0;
    for (int r = 0; r < size_; ++r) {
      const void* send = r == rank_ ? static_cast<const void*>(mine.data()) : nullptr;
      GRADZIP_NCCL_TRY(ncclBroadcast(send, all.data() + at, sizes[static_cast<std::size_t>(r)], ncclUint8, r, comm_, stream_));
      at += sizes[static_cast<std::size_t>(r)];
    }
    group.end();
  }

  /// mine and theirs in host memory, as for every communicator; staged through device memory.
  void alltoall_sizes(span<const std::uint64_t> mine, span<std::uint64_t> theirs) override {
    detail::check_alltoall_sizes(mine, theirs, static_cast<std::size_t>(size_));
    if (exchange_.size() != 2 * mine.size()) exchange_ = gradzip::detail::device_buffer<std::uint64_t>(2 * mine.size());
    std::uint64_t* out = exchange_.data();
    std::uint64_t* in = exchange_.data() + mine.size();
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(out, mine.data(), mine.size() * sizeof(std::uint64_t), cudaMemcpyHostToDevice,
                                     stream_));
    detail::nccl_group group;
    for (int r = 0; r < size_; ++r) {
      GRADZIP_NCCL_TRY(ncclSend(out + r, 1, ncclUint64, r, comm_, stream_));
      GRADZIP_NCCL_TRY(ncclRecv(in + r, 1, ncclUint64, r, comm_, stream_));
    }
    group.end();
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(theirs.data(), in, theirs.size() * sizeof(std::uint64_t), cudaMemcpyDeviceToHost,
                                     stream_));
    GRADZIP_CUDA_TRY(cudaStreamSynchronize(stream_));  // the host reads the sizes; `mine` may go away
  }

  /// send and recv in device memory; queued on the communicator's stream (sizes on the host).
  void alltoallv_bytes(span<const std::byte> send, span<const std::uint64_t> send_sizes, span<std::byte> recv,
                       span<const std::uint64_t> recv_sizes) override {
    detail::check_alltoallv(send, send_sizes, recv, recv_sizes, static_cast<std::size_t>(size_), "alltoallv_bytes");
    std::uint64_t out = 0, in = 0;
    detail::nccl_group group;
    for (int r = 0; r < size_; ++r) {
      const auto part = static_cast<std::size_t>(r);
      if (send_sizes[part] != 0) {
        GRADZIP_NCCL_TRY(ncclSend(send.data() + out, send_sizes[part], ncclUint8, r, comm_, stream_));
      }
      if (recv_sizes[part] != 0) {
        GRADZIP_NCCL_TRY(ncclRecv(recv.data() + in, recv_sizes[part], ncclUint8, r, comm_, stream_));
      }
      out += send_sizes[part];
      in += recv_sizes[part];
    }
    group.end();
  }

 private:
  static ncclDataType_t nccl_type(element_type type) {
    switch (type) {
      case element_type::f32: return ncclFloat32;
      case element_type::f64: return ncclFloat64;
      case element_type::f16: return ncclFloat16;
      case element_type::bf16: return ncclBfloat16;
    }
    throw invalid_argument(gradzip::detail::concat("nccl_communicator: cannot sum element type ", static_cast<int>(type)));
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  int rank_ = 0, size_ = 1;
  gradzip::detail::device_buffer<std::uint64_t> sizes_;
  gradzip::detail::device_buffer<std::uint64_t> exchange_;  // alltoall_sizes: out, then in
};

}  // namespace gradzip::comm
