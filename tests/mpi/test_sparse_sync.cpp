// comm::sparse_sync (Zen's Balanced Parallelism) under mpirun (ctest: 4 ranks). Checks, and exits
// non-zero naming the first failure:
// 1. Zen's sum equals MPI_Allreduce's dense sum within the bound of two orders of summation:
//    |zen - dense| <= 2 (P - 1) 2^-24 sum_r |v_r| per element;
// 2. at this density, Zen receives fewer bytes per rank than the sparse allgather;
// 3. a part damaged in transit from rank 2 raises format_error on every rank, naming rank 2,
//    and leaves the output unchanged.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <gradzip/comm/mpi.hpp>
#include <gradzip/comm/sparse_sync.hpp>

namespace gz = gradzip;

namespace {

/// Forwards to MPI, damaging the first byte of what `from` sends this rank in alltoallv.
class damaging_communicator final : public gz::comm::communicator {
 public:
  damaging_communicator(gz::comm::mpi_communicator& inner, int from) : inner_(inner), from_(from) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void allreduce_sum(void* data, std::size_t count, gz::element_type type) override {
    inner_.allreduce_sum(data, count, type);
  }
  void allgather_sizes(std::uint64_t mine, gz::span<std::uint64_t> sizes) override { inner_.allgather_sizes(mine, sizes); }
  void allgatherv_bytes(gz::span<const std::byte> mine, gz::span<std::byte> all,
                        gz::span<const std::uint64_t> sizes) override {
    inner_.allgatherv_bytes(mine, all, sizes);
  }
  void alltoall_sizes(gz::span<const std::uint64_t> mine, gz::span<std::uint64_t> theirs) override {
    inner_.alltoall_sizes(mine, theirs);
  }
  void alltoallv_bytes(gz::span<const std::byte> send, gz::span<const std::uint64_t> send_sizes, gz::span<std::byte> recv,
                       gz::span<const std::uint64_t> recv_sizes) override {
    inner_.alltoallv_bytes(send, send_sizes, recv, recv_sizes);
    std::uint64_t at = 0;
    for (int r = 0; r < from_; ++r) at += recv_sizes[r];
    if (recv_sizes[from_] != 0) recv[at] ^= std::byte{0xFF};
  }

 private:
  gz::comm::mpi_communicator& inner_;
  int from_;
};

/// Rank r's nonzeros: a hot set shared by all ranks (half of the first n / 50 indices) and 1 %
/// of its own elsewhere.
void gradient_of(int r, std::uint64_t n, std::vector<std::uint64_t>& idx, std::vector<float>& val) {
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t h = gz::hash64(17 + static_cast<std::uint64_t>(r), i);
    const bool keep = i < n / 50 ? (h & 1) != 0 : (h >> 11) % 100 == 0;
    if (keep) {
      idx.push_back(i);
      val.push_back(static_cast<float>(static_cast<std::int64_t>(h >> 40) - (1 << 23)) / (1 << 20));
    }
  }
}

int failures = 0;
void expect(bool ok, int rank, const std::string& what) {
  if (!ok && failures++ == 0) std::printf("rank %d: FAILED: %s\n", rank, what.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    gz::comm::mpi_communicator comm{MPI_COMM_WORLD};
    const int me = comm.rank(), ranks = comm.size();
    const std::uint64_t n = 400000;
    std::vector<std::uint64_t> idx;
    std::vector<float> val;
    gradient_of(me, n, idx, val);
    gz::host exec(1);
    gz::comm::sparse_sync zen(n, ranks, 7);

    // 1. Zen against MPI_Allreduce of the dense gradients.
    std::vector<float> out(n, 0.0f), dense(n, 0.0f), magnitude(n, 0.0f);
    zen.run(comm, exec, gz::span<const std::uint64_t>(idx), gz::span<const float>(val), gz::span<float>(out));
    const gz::comm::sparse_sync_traffic zen_bytes = zen.last_traffic();
    for (std::size_t j = 0; j < idx.size(); ++j) {
      dense[idx[j]] = val[j];
      magnitude[idx[j]] = std::fabs(val[j]);
    }
    MPI_Allreduce(MPI_IN_PLACE, dense.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, magnitude.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double worst = 0.0;
    for (std::uint64_t i = 0; i < n; ++i) {
      const double bound = 2.0 * (ranks - 1) * std::ldexp(1.0, -24) * magnitude[i] * 1.0001;
      const double off = std::fabs(static_cast<double>(out[i]) - dense[i]);
      if (off > bound) expect(false, me, "element " + std::to_string(i) + " differs from the dense sum by " + std::to_string(off));
      if (magnitude[i] > 0) worst = std::max(worst, off / magnitude[i]);
    }

    // 2. Bytes against the sparse allgather of the same nonzeros.
    std::vector<float> gathered(n, 0.0f);
    zen.run(comm, exec, gz::span<const std::uint64_t>(idx), gz::span<const float>(val), gz::span<float>(gathered), 1.0f,
            gz::comm::sparse_scheme::allgather);
    const gz::comm::sparse_sync_traffic gather_bytes = zen.last_traffic();
    expect(gathered == out, me, "the allgather scheme's sum differs from Zen's");
    expect(zen_bytes.received() < gather_bytes.received(), me,
           "Zen received " + std::to_string(zen_bytes.received()) + " bytes, the allgather " +
               std::to_string(gather_bytes.received()));

    // 3. A part from rank 2 damaged in transit.
    damaging_communicator damaged(comm, 2 % ranks);
    std::vector<float> untouched(n, 1.0f);
    std::string error;
    try {
      zen.run(damaged, exec, gz::span<const std::uint64_t>(idx), gz::span<const float>(val), gz::span<float>(untouched));
    } catch (const gz::format_error& e) {
      error = e.what();
    }
    expect(error.find("part from rank " + std::to_string(2 % ranks)) != std::string::npos, me,
           "the damaged part raised \"" + error + "\"");
    expect(untouched == std::vector<float>(n, 1.0f), me, "the output changed after a damaged part");

    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    std::uint64_t nonzeros = idx.size();
    MPI_Allreduce(MPI_IN_PLACE, &nonzeros, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0) {
      std::printf("sparse_sync on %d ranks, n = %llu, %llu nonzeros in all: largest |zen - dense| / sum |v| = %.3g; "
                  "rank 0 received %llu bytes (Zen) against %llu (allgather)\n%s\n",
                  ranks, static_cast<unsigned long long>(n), static_cast<unsigned long long>(nonzeros), worst,
                  static_cast<unsigned long long>(zen_bytes.received()),
                  static_cast<unsigned long long>(gather_bytes.received()),
                  total == 0 ? "all checks passed" : "FAILED");
    }
    failures = total;
  }
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
