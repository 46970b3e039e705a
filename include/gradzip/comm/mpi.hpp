/**
 * @file mpi.hpp
 * @brief `comm::mpi_communicator`: gradzip's communicator over an MPI communicator.
 *
 * Buffers are host memory, or device memory when the MPI library is CUDA-aware (Open MPI built
 * with CUDA: check `MPIX_Query_cuda_support()`; Debian's Open MPI is not, so stage device
 * payloads through host memory there). fp32 and fp64 sums use MPI_SUM; fp16 and bf16 sums use
 * user-defined MPI operations that add in float and round to nearest even, as gradzip's casts
 * do. With `MPI_ERRORS_RETURN` set on the communicator, every MPI error becomes a
 * `gradzip::error` naming the call and MPI's message (under MPI's default handler,
 * MPI_ERRORS_ARE_FATAL, it aborts the job first). A gather's counts and displacements above
 * INT_MAX bytes are refused (MPI's are int): each rank's payload, and the bytes before each.
 *
 * This header includes <mpi.h>; the rest of gradzip never does. Link MPI::MPI_CXX.
 *
 * @code
 * MPI_Init(nullptr, nullptr);
 * {
 *   gradzip::comm::mpi_communicator comm{MPI_COMM_WORLD};
 *   gradzip::comm::allreducer<codec_t, float, gradzip::host> all(exec, codec, n, comm.size(), true);
 *   all.run(comm, exec, gradzip::span<float>(grad), {step, tensor_id});
 * }  // the communicator goes before MPI_Finalize
 * MPI_Finalize();
 * @endcode
 */
#pragma once

#include <mpi.h>

#include <climits>
#include <cstdint>
#include <vector>

#include "gradzip/comm/collective.hpp"
#include "gradzip/quantize/float_formats.hpp"

namespace gradzip::comm {

namespace detail {

inline void mpi_check(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw error(gradzip::detail::concat(call, " failed: ", std::string(text, static_cast<std::size_t>(length))));
}

/// MPI user operation: inout[i] += in[i] for 16-bit floats of `Type`, added in float.
template <element_type Type>
void sum_16bit(void* in, void* inout, int* length, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint8_t*>(in);
  auto* b = static_cast<std::uint8_t*>(inout);
  for (int i = 0; i < *length; ++i) {
    const auto pos = static_cast<std::uint64_t>(i);
    const float sum = static_cast<float>(gradzip::detail::load_value(a, Type, pos)) +
                      static_cast<float>(gradzip::detail::load_value(b, Type, pos));
    const std::uint16_t bits =
        Type == element_type::f16 ? quantize::float_to_half_bits(sum) : quantize::float_to_bf16_bits(sum);
    std::memcpy(b + 2 * pos, &bits, 2);
  }
}

}  // namespace detail

class mpi_communicator final : public communicator {
 public:
  explicit mpi_communicator(MPI_Comm comm = MPI_COMM_WORLD) : comm_(comm) {
    detail::mpi_check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    detail::mpi_check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    detail::mpi_check(MPI_Op_create(&detail::sum_16bit<element_type::f16>, 1, &sum_f16_), "MPI_Op_create");
    detail::mpi_check(MPI_Op_create(&detail::sum_16bit<element_type::bf16>, 1, &sum_bf16_), "MPI_Op_create");
  }
  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;
  ~mpi_communicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {  // after MPI_Finalize the ops are gone anyway
      MPI_Op_free(&sum_f16_);
      MPI_Op_free(&sum_bf16_);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MPI_Comm native() const noexcept { return comm_; }

  void allreduce_sum(void* data, std::size_t count, element_type type) override {
    const int n = checked_count(count, "allreduce_sum");
    switch (type) {
      case element_type::f32:
        return detail::mpi_check(MPI_Allreduce(MPI_IN_PLACE, data, n, MPI_FLOAT, MPI_SUM, comm_), "MPI_Allreduce");
      case element_type::f64:
        return detail::mpi_check(MPI_Allreduce(MPI_IN_PLACE, data, n, MPI_DOUBLE, MPI_SUM, comm_), "MPI_Allreduce");
      case element_type::f16:
        return detail::mpi_check(MPI_Allreduce(MPI_IN_PLACE, data, n, MPI_UINT16_T, sum_f16_, comm_), "MPI_Allreduce");
      case element_type::bf16:
        return detail::mpi_check(MPI_Allreduce(MPI_IN_PLACE, data, n, MPI_UINT16_T, sum_bf16_, comm_), "MPI_Allreduce");
    }
    throw invalid_argument(gradzip::detail::concat("mpi_communicator: cannot sum element type ", static_cast<int>(type)));
  }

  void allgather_sizes(std::uint64_t mine, span<std::uint64_t> sizes) override {
    GRADZIP_EXPECTS(sizes.size() == static_cast<std::size_t>(size_), "allgather_sizes: ", sizes.size(),
                    " slots for ", size_, " ranks");
    detail::mpi_check(MPI_Allgather(&mine, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, comm_), "MPI_Allgather");
  }

  void allgatherv_bytes(span<const std::byte> mine, span<std::byte> all, span<const std::uint64_t> sizes) override {
    GRADZIP_EXPECTS(sizes.size() == static_cast<std::size_t>(size_), "allgatherv_bytes: ", sizes.size(),
                    " sizes for ", size_, " ranks");
    const std::uint64_t at = to_counts(sizes, counts_, displacements_, "allgatherv_bytes");
    GRADZIP_EXPECTS(at <= all.size(), "allgatherv_bytes: ", at, " bytes to gather into ", all.size());
    GRADZIP_EXPECTS(mine.size() == sizes[rank_], "allgatherv_bytes: this rank sends ", mine.size(),
                    " bytes, its announced size is ", sizes[rank_]);
    detail::mpi_check(MPI_Allgatherv(mine.data(), counts_[rank_], MPI_BYTE, all.data(), counts_.data(),
                                     displacements_.data(), MPI_BYTE, comm_),
                      "MPI_Allgatherv");
  }

  void alltoall_sizes(span<const std::uint64_t> mine, span<std::uint64_t> theirs) override {
    comm::detail::check_alltoall_sizes(mine, theirs, static_cast<std::size_t>(size_));
    detail::mpi_check(MPI_Alltoall(mine.data(), 1, MPI_UINT64_T, theirs.data(), 1, MPI_UINT64_T, comm_),
                      "MPI_Alltoall");
  }

  void alltoallv_bytes(span<const std::byte> send, span<const std::uint64_t> send_sizes, span<std::byte> recv,
                       span<const std::uint64_t> recv_sizes) override {
    comm::detail::check_alltoallv(send, send_sizes, recv, recv_sizes, static_cast<std::size_t>(size_),
                                  "alltoallv_bytes");
    to_counts(send_sizes, counts_, displacements_, "alltoallv_bytes");
    to_counts(recv_sizes, recv_counts_, recv_displacements_, "alltoallv_bytes");
    detail::mpi_check(MPI_Alltoallv(send.data(), counts_.data(), displacements_.data(), MPI_BYTE, recv.data(),
                                    recv_counts_.data(), recv_displacements_.data(), MPI_BYTE, comm_),
                      "MPI_Alltoallv");
  }

 private:
  /// MPI's int counts and displacements of parts of `sizes` bytes laid back to back, checked;
  /// returns their total.
  static std::uint64_t to_counts(span<const std::uint64_t> sizes, std::vector<int>& counts,
                                 std::vector<int>& displacements, const char* what) {
    counts.resize(sizes.size());
    displacements.resize(sizes.size());
    std::uint64_t at = 0;
    for (std::size_t r = 0; r < sizes.size(); ++r) {
      counts[r] = checked_part(sizes[r], what, "count", r);
      displacements[r] = checked_part(at, what, "displacement", r);
      at += sizes[r];
    }
    return at;
  }

  static int checked_count(std::uint64_t count, const char* what) {
    GRADZIP_EXPECTS(count <= static_cast<std::uint64_t>(INT_MAX), "mpi_communicator::", what, ": ", count,
                    " exceeds MPI's int counts");
    return static_cast<int>(count);
  }
  /// A gather's or exchange's count or displacement (`kind`) for rank r, as an int.
  static int checked_part(std::uint64_t bytes, const char* what, const char* kind, std::size_t r) {
    GRADZIP_EXPECTS(bytes <= static_cast<std::uint64_t>(INT_MAX), "mpi_communicator::", what, ": rank ", r, "'s ",
                    kind, " of ", bytes, " bytes exceeds MPI's int counts");
    return static_cast<int>(bytes);
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  MPI_Op sum_f16_ = MPI_OP_NULL, sum_bf16_ = MPI_OP_NULL;
  std::vector<int> counts_, displacements_, recv_counts_, recv_displacements_;  // grown once, reused
};

}  // namespace gradzip::comm
