// The MPI adapter's personalized exchange under mpirun (ctest: 3 ranks): alltoall_sizes and
// alltoallv_bytes (MPI_Alltoall, MPI_Alltoallv) deliver every part to its rank, and agree with the
// communicator's default built on allgather (called through the base class). Exits non-zero and
// names the rank, part and byte on the first mismatch.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdio>
#include <vector>

#include <gradzip/comm/mpi.hpp>

namespace gz = gradzip;

namespace {

std::uint64_t part_size(int from, int to) { return static_cast<std::uint64_t>((from * 5 + to * 3) % 9); }
std::byte byte_of(int from, int to, std::uint64_t i) { return static_cast<std::byte>(from * 64 + to * 8 + i % 8); }

/// One exchange through `exchange`; returns the number of wrong bytes (and prints the first).
template <class Exchange>
int check(gz::comm::mpi_communicator& comm, const char* what, Exchange exchange) {
  const int ranks = comm.size(), me = comm.rank();
  std::vector<std::uint64_t> send_sizes(ranks), recv_sizes(ranks);
  std::vector<std::byte> send;
  for (int to = 0; to < ranks; ++to) {
    send_sizes[to] = part_size(me, to);
    for (std::uint64_t i = 0; i < send_sizes[to]; ++i) send.push_back(byte_of(me, to, i));
  }
  std::vector<std::byte> recv;
  int wrong = exchange(send, send_sizes, recv, recv_sizes);
  std::size_t at = 0;
  for (int from = 0; from < ranks; ++from) {
    if (recv_sizes[from] != part_size(from, me)) {
      if (wrong++ == 0) std::printf("rank %d, %s: %llu bytes announced from rank %d, expected %llu\n", me, what,
                                    static_cast<unsigned long long>(recv_sizes[from]), from,
                                    static_cast<unsigned long long>(part_size(from, me)));
      return wrong;
    }
    for (std::uint64_t i = 0; i < recv_sizes[from]; ++i, ++at) {
      if (recv[at] != byte_of(from, me, i) && wrong++ == 0) {
        std::printf("rank %d, %s: byte %llu of rank %d's part is wrong\n", me, what, static_cast<unsigned long long>(i),
                    from);
      }
    }
  }
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int wrong = 0;
  {
    gz::comm::mpi_communicator comm{MPI_COMM_WORLD};
    const auto run = [&](bool adapter) {
      return [&comm, adapter](const std::vector<std::byte>& send, const std::vector<std::uint64_t>& send_sizes,
                              std::vector<std::byte>& recv, std::vector<std::uint64_t>& recv_sizes) {
        gz::comm::communicator& base = comm;
        const gz::span<const std::uint64_t> mine(send_sizes.data(), send_sizes.size());
        const gz::span<std::uint64_t> theirs(recv_sizes.data(), recv_sizes.size());
        adapter ? comm.alltoall_sizes(mine, theirs) : base.communicator::alltoall_sizes(mine, theirs);
        std::uint64_t total = 0;
        for (std::uint64_t s : recv_sizes) total += s;
        recv.assign(total, std::byte{0});
        const gz::span<const std::byte> out(send.data(), send.size());
        const gz::span<std::byte> in(recv.data(), recv.size());
        if (adapter) {
          comm.alltoallv_bytes(out, mine, in, gz::span<const std::uint64_t>(recv_sizes.data(), recv_sizes.size()));
        } else {
          base.communicator::alltoallv_bytes(out, mine, in, gz::span<const std::uint64_t>(recv_sizes.data(), recv_sizes.size()));
        }
        return 0;
      };
    };
    wrong += check(comm, "MPI_Alltoallv", run(true));
    wrong += check(comm, "the default through allgather", run(false));
    int total = 0;
    MPI_Allreduce(&wrong, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (comm.rank() == 0) {
      std::printf(total == 0 ? "mpi communicator: alltoall_sizes and alltoallv_bytes deliver every part on %d ranks\n"
                             : "mpi communicator: FAILED on %d ranks\n",
                  comm.size());
    }
    wrong = total;
  }
  MPI_Finalize();
  return wrong == 0 ? 0 : 1;
}
