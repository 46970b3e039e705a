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
 * Nonblocking communicators (`ncclConfig_t::blocking = 0`, NCCL 2.14 and later) work too: a call
 * that returns `ncclInProgress` is waited for (`ncclCommGetAsyncError` polled until it says
 * otherwise) before the next, as NCCL requires, so each call here returns with its work queued.
 * Where the communicator waits for its stream (the size exchanges), it polls the stream and
 * `ncclCommGetAsyncError` in turn: an asynchronous error (a peer or the network failed) throws a
 * `cuda_error` instead of waiting for a stream that may never finish. The communicator is then
 * unusable: abort it (`ncclCommAbort`) and build a new one, as with any NCCL error.
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

#include <string>
#include <thread>
#include <vector>

#include "gradzip/comm/collective.hpp"
#include "gradzip/core/cuda.cuh"

// Throws a cuda_error naming `text` (the call) when `status` is not ncclSuccess.
#define GRADZIP_NCCL_CHECK_STATUS(status, text)                                                    \
  do {                                                                                             \
    const ncclResult_t gradzip_nccl_status_ = (status);                                            \
    if (gradzip_nccl_status_ != ncclSuccess) {                                                     \
      throw ::gradzip::cuda_error(::gradzip::detail::concat(text, " failed: ",                     \
                                                            ncclGetErrorString(gradzip_nccl_status_), \
                                                            " at ", __FILE__, ":", __LINE__));      \
    }                                                                                              \
  } while (0)
#define GRADZIP_NCCL_TRY(call) GRADZIP_NCCL_CHECK_STATUS(call, #call)

namespace gradzip::comm::detail {
/// Whether `result` is ncclInProgress (NCCL 2.14 on; before it, no call is ever in progress).
constexpr bool nccl_in_progress(ncclResult_t result) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
  return result == ncclInProgress;
#else
  return (void)result, false;
#endif
}

/// A call's result on `comm`: ncclInProgress (a nonblocking communicator's call still being
/// issued) becomes the call's outcome, read from ncclCommGetAsyncError once it stops saying
/// ncclInProgress. NCCL requires that before the communicator's next call.
inline ncclResult_t nccl_settled(ncclComm_t comm, ncclResult_t result) {
  while (nccl_in_progress(result)) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t queried = ncclCommGetAsyncError(comm, &state);
    if (queried != ncclSuccess) return queried;
    result = state;
    if (nccl_in_progress(result)) std::this_thread::yield();
  }
  return result;
}
}  // namespace gradzip::comm::detail

/// GRADZIP_NCCL_TRY for a call on communicator `nccl_comm`, which may be nonblocking.
#define GRADZIP_NCCL_TRY_ON(nccl_comm, call) \
  GRADZIP_NCCL_CHECK_STATUS(::gradzip::comm::detail::nccl_settled((nccl_comm), (call)), #call)

namespace gradzip::comm::detail {
/// ncclGroupStart in the constructor, ncclGroupEnd in end() or, if an NCCL call between them
/// threw, in the destructor: a group left open would silently batch the next step's calls.
class nccl_group {
 public:
  explicit nccl_group(ncclComm_t comm) : comm_(comm) { GRADZIP_NCCL_TRY(ncclGroupStart()); }
  nccl_group(const nccl_group&) = delete;
  nccl_group& operator=(const nccl_group&) = delete;
  void end() {
    open_ = false;
    GRADZIP_NCCL_TRY_ON(comm_, ncclGroupEnd());
  }
  ~nccl_group() {
    // Unwinding: the error that threw is the one to report.
    if (open_) (void)nccl_settled(comm_, ncclGroupEnd());
  }

 private:
  ncclComm_t comm_;
  bool open_ = true;
};
}  // namespace gradzip::comm::detail

namespace gradzip::comm {

class nccl_communicator final : public communicator {
 public:
  nccl_communicator(ncclComm_t comm, cudaStream_t stream) : comm_(comm), stream_(stream) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
    // A nonblocking communicator may still be initializing.
    GRADZIP_NCCL_CHECK_STATUS(detail::nccl_settled(comm_, ncclInProgress),
                              "nccl_communicator: the communicator's initialization");
#endif
    GRADZIP_NCCL_TRY_ON(comm_, ncclCommUserRank(comm_, &rank_));
    GRADZIP_NCCL_TRY_ON(comm_, ncclCommCount(comm_, &size_));
    sizes_ = gradzip::detail::device_buffer<std::uint64_t>(static_cast<std::size_t>(size_));
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void* cuda_stream() const noexcept override { return stream_; }

  void allreduce_sum(void* data, std::size_t count, element_type type) override {
    GRADZIP_NCCL_TRY_ON(comm_, ncclAllReduce(data, data, count, nccl_type(type), ncclSum, comm_, stream_));
  }

  void allgather_sizes(std::uint64_t mine, span<std::uint64_t> sizes) override {
    GRADZIP_EXPECTS(sizes.size() == static_cast<std::size_t>(size_), "allgather_sizes: ", sizes.size(),
                    " slots for ", size_, " ranks");
    std::uint64_t* slot = sizes_.data() + rank_;
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(slot, &mine, sizeof mine, cudaMemcpyHostToDevice, stream_));
    GRADZIP_NCCL_TRY_ON(comm_, ncclAllGather(slot, sizes_.data(), 1, ncclUint64, comm_, stream_));
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(sizes.data(), sizes_.data(), sizes.size() * sizeof(std::uint64_t),
                                     cudaMemcpyDeviceToHost, stream_));
    wait_for_stream("allgather_sizes");  // `mine` is a local, and the host needs the sizes
  }

  void allgatherv_bytes(span<const std::byte> mine, span<std::byte> all, span<const std::uint64_t> sizes) override {
    GRADZIP_EXPECTS(sizes.size() == static_cast<std::size_t>(size_), "allgatherv_bytes: ", sizes.size(),
                    " sizes for ", size_, " ranks");
    std::uint64_t total = 0;
    for (std::uint64_t s : sizes) total += s;
    GRADZIP_EXPECTS(total <= all.size(), "allgatherv_bytes: ", total, " bytes to gather into ", all.size());
    GRADZIP_EXPECTS(mine.size() == sizes[static_cast<std::size_t>(rank_)], "allgatherv_bytes: this rank sends ",
                    mine.size(), " bytes, its announced size is ", sizes[static_cast<std::size_t>(rank_)]);
    detail::nccl_group group(comm_);
    std::uint64_t at = 0;
    for (int r = 0; r < size_; ++r) {
      const void* send = r == rank_ ? static_cast<const void*>(mine.data()) : nullptr;
      GRADZIP_NCCL_TRY_ON(comm_, ncclBroadcast(send, all.data() + at, sizes[static_cast<std::size_t>(r)], ncclUint8, r, comm_, stream_));
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
    detail::nccl_group group(comm_);
    for (int r = 0; r < size_; ++r) {
      GRADZIP_NCCL_TRY_ON(comm_, ncclSend(out + r, 1, ncclUint64, r, comm_, stream_));
      GRADZIP_NCCL_TRY_ON(comm_, ncclRecv(in + r, 1, ncclUint64, r, comm_, stream_));
    }
    group.end();
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(theirs.data(), in, theirs.size() * sizeof(std::uint64_t), cudaMemcpyDeviceToHost,
                                     stream_));
    wait_for_stream("alltoall_sizes");  // the host reads the sizes; `mine` may go away
  }

  /// send and recv in device memory; queued on the communicator's stream (sizes on the host).
  void alltoallv_bytes(span<const std::byte> send, span<const std::uint64_t> send_sizes, span<std::byte> recv,
                       span<const std::uint64_t> recv_sizes) override {
    detail::check_alltoallv(send, send_sizes, recv, recv_sizes, static_cast<std::size_t>(size_), "alltoallv_bytes");
    std::uint64_t out = 0, in = 0;
    detail::nccl_group group(comm_);
    for (int r = 0; r < size_; ++r) {
      const auto part = static_cast<std::size_t>(r);
      if (send_sizes[part] != 0) {
        GRADZIP_NCCL_TRY_ON(comm_, ncclSend(send.data() + out, send_sizes[part], ncclUint8, r, comm_, stream_));
      }
      if (recv_sizes[part] != 0) {
        GRADZIP_NCCL_TRY_ON(comm_, ncclRecv(recv.data() + in, recv_sizes[part], ncclUint8, r, comm_, stream_));
      }
      out += send_sizes[part];
      in += recv_sizes[part];
    }
    group.end();
  }

 private:
  /// Waits until the stream's work is done, polling NCCL's asynchronous error between looks: a
  /// failed peer or link leaves a collective, and so the stream, unfinished for ever.
  void wait_for_stream(const char* what) const {
    for (;;) {
      const cudaError_t done = cudaStreamQuery(stream_);
      ncclResult_t state = ncclSuccess;
      GRADZIP_NCCL_TRY(ncclCommGetAsyncError(comm_, &state));
      if (state != ncclSuccess && !detail::nccl_in_progress(state)) {
        throw cuda_error(gradzip::detail::concat("nccl_communicator::", what, ": NCCL reported an asynchronous error (",
                                                 ncclGetErrorString(state), last_error(),
                                                 "): abort the communicator (ncclCommAbort)"));
      }
      if (done == cudaSuccess) return;
      if (done != cudaErrorNotReady) {
        throw cuda_error(gradzip::detail::concat("nccl_communicator::", what, ": cudaStreamQuery failed: ",
                                                 cudaGetErrorName(done), " (", cudaGetErrorString(done), ")"));
      }
      std::this_thread::yield();
    }
  }

  /// NCCL's own words on its last error ("; ..."), where NCCL has ncclGetLastError (2.13 on).
  std::string last_error() const {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
    const char* text = ncclGetLastError(comm_);
    if (text != nullptr && *text != '\0') return std::string("; ") + text;
#endif
    return {};
  }

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
