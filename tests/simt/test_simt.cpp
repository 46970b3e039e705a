// The SIMT backend's own tests: CUDA's semantics for the built-ins, barriers, warp intrinsics,
// CUB's contracts and stream ordering, and a fault (not silence) for every broken rule.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "gradzip_simt/settings.hpp"

#if defined(GRADZIP_SIMT_ASAN)
#include <sanitizer/asan_interface.h>
#endif

namespace sim = gradzip_simt;

namespace {

/// Runs `kernel` and waits; returns the launch's error (cudaSuccess, or the fault's).
template <class... P, class... A>
cudaError_t run(void (*kernel)(P...), dim3 grid, dim3 block, std::size_t shared, A... args) {
  const cudaError_t e = sim::launch(kernel, grid, block, shared, nullptr, args...);
  if (e != cudaSuccess) return e;
  return cudaDeviceSynchronize();
}

/// Default settings for one test whatever the binary's mode, restored afterwards; faults come
/// back as errors.
struct scoped_settings {
  sim::settings saved = sim::config();
  scoped_settings() {
    sim::config() = sim::settings{};
    sim::config().expect_faults = true;
  }
  ~scoped_settings() {
    sim::config() = saved;
    sim::take_fault();
    cudaGetLastError();
  }
};

template <class T>
struct device_array {
  T* data = nullptr;
  std::size_t size;
  explicit device_array(std::size_t n, T fill = T{}) : size(n) {
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&data), n * sizeof(T)) == cudaSuccess);
    std::vector<T> h(n, fill);
    REQUIRE(cudaMemcpy(data, h.data(), n * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~device_array() { cudaFree(data); }
  std::vector<T> get() const {
    std::vector<T> h(size);
    REQUIRE(cudaMemcpy(h.data(), data, size * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
};

/// Whether the last fault's message says `text`.
bool fault_says(const std::string& text) {
  const std::string m = sim::take_fault();
  INFO("fault: " << m);
  return m.find(text) != std::string::npos;
}

}  // namespace

// The kernels: in a named namespace, so that a fault can name them (dladdr sees no internal symbols).
namespace simt_test {

__global__ void coordinates_kernel(unsigned* out) {
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  out[block * blockDim.x * blockDim.y * blockDim.z + thread] = block * 1000 + thread;
}

__global__ void rotate_kernel(int* out) {
  __shared__ int s[256];
  s[threadIdx.x] = static_cast<int>(threadIdx.x) * 3;
  __syncthreads();
  out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

__global__ void rotate_without_barrier_kernel(int* out) {
  __shared__ int s[256];
  s[threadIdx.x] = static_cast<int>(threadIdx.x) * 3 + 7 * static_cast<int>(blockIdx.x);
  out[blockIdx.x * blockDim.x + threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];  // a race: no barrier
}

/// Lanes trade words through shared memory, the two halves of a warp apart: with `order`, a
/// __syncwarp between the write and the read (CUDA's rule: lanes are not in lockstep since
/// Volta); without it, a race.
template <bool order>
__global__ void warp_exchange_kernel(int* out) {
  __shared__ int s[64];
  s[threadIdx.x] = static_cast<int>(threadIdx.x) * 5;
  if (order) __syncwarp();
  out[threadIdx.x] = s[threadIdx.x ^ 16u];
}

/// Thread 0 writes a word and thread 1 reads it between the same two barriers (`warp`: two
/// __syncwarp; else two __syncthreads): a race, however the threads are ordered.
template <bool warp>
__global__ void race_between_barriers_kernel(int* out) {
  __shared__ int s[64];
  s[threadIdx.x] = 1;
  warp ? __syncwarp() : __syncthreads();
  if (threadIdx.x == 0) s[1] = 7;
  if (threadIdx.x == 1) out[0] = s[1];
  warp ? __syncwarp() : __syncthreads();
  out[threadIdx.x + 1] = s[threadIdx.x];
}

__global__ void barrier_votes_kernel(int* out) {
  const int odd = static_cast<int>(threadIdx.x % 2);
  out[threadIdx.x * 3 + 0] = __syncthreads_count(odd);
  out[threadIdx.x * 3 + 1] = __syncthreads_or(threadIdx.x == 5);
  out[threadIdx.x * 3 + 2] = __syncthreads_and(threadIdx.x < 1000);
}

__global__ void warp_ops_kernel(int* out) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  int* o = out + threadIdx.x * 10;
  o[0] = __shfl_sync(0xFFFFFFFFu, lane * 10, 3);
  o[1] = __shfl_sync(0xFFFFFFFFu, lane * 10, lane + 1, 8);
  o[2] = __shfl_up_sync(0xFFFFFFFFu, lane * 10, 2, 16);
  o[3] = __shfl_down_sync(0xFFFFFFFFu, lane * 10, 3, 16);
  o[4] = __shfl_xor_sync(0xFFFFFFFFu, lane * 10, 5);
  o[5] = static_cast<int>(__ballot_sync(0xFFFFFFFFu, lane % 3 == 0));
  o[6] = __any_sync(0xFFFFFFFFu, lane == 31);
  o[7] = __all_sync(0xFFFFFFFFu, lane < 31);
  o[8] = static_cast<int>(__match_any_sync(0xFFFFFFFFu, lane % 4));
  const double d = __shfl_xor_sync(0xFFFFFFFFu, 0.5 + lane, 16);
  o[9] = static_cast<int>(d * 2);
}

__global__ void half_warp_kernel(int* out) {
  const unsigned lane = threadIdx.x % 32;
  if (lane < 16) {
    out[threadIdx.x] = __shfl_xor_sync(0x0000FFFFu, static_cast<int>(lane), 1);
  } else {
    out[threadIdx.x] = static_cast<int>(__activemask());
  }
}

__global__ void shuffle_exited_lane_kernel(int* out) {
  if (threadIdx.x == 7) return;
  out[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, 1, 1);
}

__global__ void shuffle_diverged_kernel(int* out) {
  if (threadIdx.x < 16) {
    out[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, 1, 1);
  } else {
    out[threadIdx.x] = __ballot_sync(0xFFFFFFFFu, 1);
  }
}

__global__ void shuffle_missing_lane_kernel(int* out) {
  out[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, 1, 1);  // launched with 48 threads
}

__global__ void barrier_after_exit_kernel(int* out) {
  if (threadIdx.x == 3) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void divergent_barriers_kernel(int* out) {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

__global__ void dynamic_shared_kernel(unsigned* out) {
  auto* s = static_cast<unsigned*>(sim::dynamic_shared());
  out[threadIdx.x] = s[threadIdx.x];  // never written: the poison pattern
}

__global__ void block_scan_kernel(unsigned* out) {
  using scan = cub::BlockScan<unsigned, 128>;
  using reduce = cub::BlockReduce<unsigned, 128>;
  __shared__ scan::TempStorage scan_storage;
  __shared__ reduce::TempStorage reduce_storage;
  unsigned prefix = 0, total = 0;
  scan(scan_storage).ExclusiveSum(threadIdx.x + 1, prefix, total);
  out[threadIdx.x * 3 + 0] = prefix;
  out[threadIdx.x * 3 + 1] = total;
  out[threadIdx.x * 3 + 2] = reduce(reduce_storage).Sum(2);
}

__global__ void block_scan_reuse_kernel(unsigned* out) {
  using scan = cub::BlockScan<unsigned, 128>;
  __shared__ scan::TempStorage storage;
  unsigned a = 0, b = 0;
  scan(storage).ExclusiveSum(1, a);
  scan(storage).ExclusiveSum(1, b);  // CUB needs a __syncthreads() before reusing the storage
  out[threadIdx.x] = a + b;
}

__global__ void block_scan_size_kernel(unsigned* out) {
  using scan = cub::BlockScan<unsigned, 256>;  // launched with 128 threads
  __shared__ scan::TempStorage storage;
  unsigned a = 0;
  scan(storage).ExclusiveSum(1, a);
  out[threadIdx.x] = a;
}

__global__ void add_one_kernel(int* p, int n) {
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < n;
       i += static_cast<int>(gridDim.x * blockDim.x)) {
    p[i] += 1;
  }
}

/// Each block publishes a value, waits at the grid barrier, then sums every block's value and
/// its own dynamic shared word (which the barrier must keep).
__global__ void grid_sum_kernel(unsigned* published, unsigned* sums) {
  auto* mine = static_cast<unsigned*>(sim::dynamic_shared());
  if (threadIdx.x == 0) {
    published[blockIdx.x] = blockIdx.x + 1;
    *mine = 1000 * (blockIdx.x + 1);
  }
  sim::grid_sync(__FILE__, __LINE__);
  if (threadIdx.x == 0) {
    unsigned total = 0;
    for (unsigned b = 0; b < gridDim.x; ++b) total += published[b];
    sums[blockIdx.x] = total + *mine;
  }
  sim::grid_sync(__FILE__, __LINE__);
  if (threadIdx.x == 1) published[blockIdx.x] = sums[(blockIdx.x + 1) % gridDim.x];  // every block's sum is out
}

__global__ void grid_sync_after_exit_kernel(unsigned* out) {
  if (blockIdx.x == 1 && threadIdx.x == 5) return;
  sim::grid_sync(__FILE__, __LINE__);
  out[blockIdx.x] = 1;
}

__global__ void grid_sync_uncooperative_kernel(unsigned* out) {
  sim::grid_sync(__FILE__, __LINE__);
  out[blockIdx.x] = 1;
}

// Thread 0 reports what the block finds in its static __shared__ variables, then leaves its
// own mark there.
__global__ void static_shared_first_read_kernel(unsigned* out) {
  __shared__ unsigned word;
  alignas(16) __shared__ unsigned char bytes[40];
  if (threadIdx.x == 0) {
    unsigned tail = 0;
    std::memcpy(&tail, bytes + 36, 4);
    out[2 * blockIdx.x] = word;
    out[2 * blockIdx.x + 1] = tail;
    word = 1234 + blockIdx.x;
    std::memset(bytes, static_cast<int>(blockIdx.x), sizeof bytes);
  }
}

#if defined(GRADZIP_SIMT_ASAN)
// Whether ASan would report an access to the first byte past the block's dynamic shared memory,
// and to its last byte.
__global__ void dynamic_shared_slack_kernel(std::size_t bytes, int* out) {
  auto* shared = static_cast<unsigned char*>(sim::dynamic_shared());
  if (threadIdx.x == 0) {
    out[2 * blockIdx.x] = __asan_address_is_poisoned(shared + bytes);
    out[2 * blockIdx.x + 1] = __asan_address_is_poisoned(shared + bytes - 1);
  }
}
#endif

// Each block keeps a value in a static __shared__ variable across two grid-wide barriers.
__global__ void static_shared_across_grid_sync_kernel(unsigned* out) {
  __shared__ unsigned mine;
  if (threadIdx.x == 0) mine = 7 * blockIdx.x + 1;
  sim::grid_sync(__FILE__, __LINE__);
  __syncthreads();
  if (threadIdx.x == 1) mine += 2;
  sim::grid_sync(__FILE__, __LINE__);
  if (threadIdx.x == 0) out[blockIdx.x] = mine;
}

}  // namespace simt_test

using namespace simt_test;

TEST_CASE("simt: static __shared__ variables start poisoned in every block (clang build)", "[simt]") {
  scoped_settings s;
  for (const std::uint64_t seed : {0, 1}) {
    sim::config().shuffle_seed = seed;
    INFO("seed " << seed);
    device_array<unsigned> out(2 * 6, 5);
    REQUIRE(run(static_shared_first_read_kernel, dim3(6), dim3(32), 0, out.data) == cudaSuccess);
    const auto got = out.get();
    if (sim::static_shared_per_block()) {
      CHECK(got == std::vector<unsigned>(12, 0xFFFFFFFFu));
    } else if (seed == 0) {
      // GCC: plain statics. Each block sees the previous block's mark (block 0 what this test's
      // first launch left, or zero).
      for (unsigned b = 1; b < 6; ++b) {
        CHECK(got[2 * b] == 1233 + b);
        CHECK(got[2 * b + 1] == (b - 1) * 0x01010101u);
      }
    }
  }
  if (!sim::static_shared_per_block()) {
    WARN("static __shared__ variables are plain statics in this (GCC) build; the clang build poisons them");
  }
}

TEST_CASE("simt: under ASan, the bytes past an allocation's or dynamic shared memory's size are unaddressable",
          "[simt]") {
#if defined(GRADZIP_SIMT_ASAN)
  scoped_settings s;
  for (const std::size_t bytes : {std::size_t{13}, std::size_t{256}, std::size_t{1000}}) {
    INFO(bytes << " bytes");
    unsigned char* p = nullptr;
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&p), bytes) == cudaSuccess);
    CHECK_FALSE(__asan_address_is_poisoned(p + bytes - 1));
    CHECK(__asan_address_is_poisoned(p + bytes));
    CHECK(__asan_region_is_poisoned(p, bytes) == nullptr);
    REQUIRE(cudaFree(p) == cudaSuccess);
    device_array<int> out(2 * 3, -1);
    REQUIRE(run(dynamic_shared_slack_kernel, dim3(3), dim3(32), bytes, bytes, out.data) == cudaSuccess);
    for (unsigned b = 0; b < 3; ++b) {
      CHECK(out.get()[2 * b] == 1);
      CHECK(out.get()[2 * b + 1] == 0);
    }
  }
#else
  WARN("not an ASan build: nothing to check");
#endif
}

TEST_CASE("simt: a cooperative launch keeps each block's static __shared__ variables (clang build)", "[simt]") {
  scoped_settings s;
  if (!sim::static_shared_per_block()) {
    WARN("static __shared__ variables are one object for all blocks in this (GCC) build; the clang build "
         "keeps one per block");
    return;
  }
  for (const std::uint64_t seed : {0, 1, 2}) {
    sim::config().shuffle_seed = seed;
    INFO("seed " << seed);
    device_array<unsigned> out(8);
    REQUIRE(sim::launch_cooperative(static_shared_across_grid_sync_kernel, dim3(8), dim3(64), 0, nullptr, out.data) ==
            cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const auto got = out.get();
    for (unsigned b = 0; b < 8; ++b) CHECK(got[b] == 7 * b + 3);
  }
}

TEST_CASE("simt: built-in variables cover every block and thread", "[simt]") {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  device_array<unsigned> out(12 * 24);
  REQUIRE(run(coordinates_kernel, grid, block, 0, out.data) == cudaSuccess);
  const auto got = out.get();
  for (unsigned b = 0; b < 12; ++b) {
    for (unsigned t = 0; t < 24; ++t) CHECK(got[b * 24 + t] == b * 1000 + t);
  }
}

TEST_CASE("simt: __syncthreads orders shared memory, and its votes count every thread", "[simt]") {
  device_array<int> rotated(256);
  REQUIRE(run(rotate_kernel, dim3(1), dim3(256), 0, rotated.data) == cudaSuccess);
  const auto r = rotated.get();
  for (int t = 0; t < 256; ++t) CHECK(r[t] == ((t + 1) % 256) * 3);
  device_array<int> votes(64 * 3);
  REQUIRE(run(barrier_votes_kernel, dim3(1), dim3(64), 0, votes.data) == cudaSuccess);
  const auto v = votes.get();
  for (int t = 0; t < 64; ++t) {
    CHECK(v[t * 3 + 0] == 32);
    CHECK(v[t * 3 + 1] == 1);
    CHECK(v[t * 3 + 2] == 1);
  }
}

#if defined(GRADZIP_SIMT_TSAN)
// The ThreadSanitizer build reports this race and fails; it runs alone there, by its own ctest.
#define GRADZIP_RACY_TAGS "[.race]"
#else
#define GRADZIP_RACY_TAGS "[simt]"
#endif

TEST_CASE("simt: a shuffled thread order exposes a missing barrier", GRADZIP_RACY_TAGS) {
  scoped_settings s;
  // Two blocks of 64 threads, so a block's previous contents can leak into the race.
  const auto racy = [&](std::uint64_t seed) {
    sim::config().shuffle_seed = seed;
    device_array<int> out(128);
    REQUIRE(run(rotate_without_barrier_kernel, dim3(2), dim3(64), 0, out.data) == cudaSuccess);
    return out.get();
  };
  const auto ordered = racy(0);
  bool differs = false;
  for (std::uint64_t seed = 1; seed <= 4 && !differs; ++seed) differs = racy(seed) != ordered;
  CHECK(differs);
}

TEST_CASE("simt: __syncwarp orders a warp's shared memory", "[simt]") {
  device_array<int> out(64);
  REQUIRE(run(warp_exchange_kernel<true>, dim3(1), dim3(64), 0, out.data) == cudaSuccess);
  const auto o = out.get();
  for (int t = 0; t < 64; ++t) CHECK(o[t] == (t ^ 16) * 5);
}

#if defined(GRADZIP_SIMT_TSAN)
// Races that the ThreadSanitizer build must report: their ctests pass on TSan's warning.
TEST_CASE("simt: a missing __syncthreads is a race ThreadSanitizer reports", "[.race]") {
  device_array<int> out(64);
  REQUIRE(run(rotate_without_barrier_kernel, dim3(1), dim3(64), 0, out.data) == cudaSuccess);
}

TEST_CASE("simt: a missing __syncwarp is a race ThreadSanitizer reports", "[.race]") {
  device_array<int> out(64);
  REQUIRE(run(warp_exchange_kernel<false>, dim3(1), dim3(64), 0, out.data) == cudaSuccess);
}

// Thread 0 reaches the second barrier before thread 1 leaves the first: the second barrier's
// arrival must not order thread 0's write before thread 1's read.
TEST_CASE("simt: a write and a read between two __syncthreads is a race ThreadSanitizer reports", "[.race]") {
  device_array<int> out(65);
  REQUIRE(run(race_between_barriers_kernel<false>, dim3(1), dim3(64), 0, out.data) == cudaSuccess);
}

TEST_CASE("simt: a write and a read between two __syncwarp is a race ThreadSanitizer reports", "[.race]") {
  device_array<int> out(33);
  REQUIRE(run(race_between_barriers_kernel<true>, dim3(1), dim3(32), 0, out.data) == cudaSuccess);
}
#endif

TEST_CASE("simt: __byte_perm picks bytes of y:x, or their signs, as PTX's prmt.b32 does", "[simt]") {
  const unsigned x = 0x33221100u, y = 0x77665544u;
  CHECK(__byte_perm(x, y, 0x3210u) == x);
  CHECK(__byte_perm(x, y, 0x7654u) == y);
  CHECK(__byte_perm(x, y, 0x5410u) == 0x55441100u);  // the two low bytes of each
  CHECK(__byte_perm(x, y, 0x0123u) == 0x00112233u);  // reversed
  CHECK(__byte_perm(x, y, 0x6240u) == 0x66224400u);  // transpose_bytes_4_lanes' selectors
  CHECK(__byte_perm(x, y, 0x3715u) == 0x33771155u);
  CHECK(__byte_perm(x, y, 0xFFFF3210u) == x);  // the upper 16 bits select nothing
  // A selector's fourth bit replicates the selected byte's sign bit (PTX prmt.b32's default mode).
  const unsigned signs = 0x7F80FF01u, more = 0x00800102u;
  CHECK(__byte_perm(signs, more, 0xBA98u) == 0x00FFFF00u);
  CHECK(__byte_perm(signs, more, 0x0C1Du) == 0x0100FF00u);
  CHECK(__byte_perm(signs, more, 0x000Eu) == 0x010101FFu);  // byte 6: y's 0x80
}

TEST_CASE("simt: warp intrinsics follow CUDA's definitions", "[simt]") {
  device_array<int> out(64 * 10);
  REQUIRE(run(warp_ops_kernel, dim3(1), dim3(64), 0, out.data) == cudaSuccess);
  const auto o = out.get();
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32;
    INFO("thread " << t);
    const int* r = &o[t * 10];
    CHECK(r[0] == 30);
    CHECK(r[1] == ((lane & ~7) + ((lane + 1) & 7)) * 10);
    CHECK(r[2] == ((lane % 16) >= 2 ? lane - 2 : lane) * 10);
    CHECK(r[3] == ((lane % 16) + 3 < 16 ? lane + 3 : lane) * 10);
    CHECK(r[4] == (lane ^ 5) * 10);
    CHECK(static_cast<unsigned>(r[5]) == 0x49249249u);
    CHECK(r[6] == 1);
    CHECK(r[7] == 0);
    CHECK(static_cast<unsigned>(r[8]) == (0x11111111u << (lane % 4)));
    CHECK(r[9] == 2 * (lane ^ 16) + 1);
  }
  device_array<int> halves(64);
  REQUIRE(run(half_warp_kernel, dim3(1), dim3(64), 0, halves.data) == cudaSuccess);
  const auto h = halves.get();
  for (int t = 0; t < 64; ++t) CHECK(h[t] == ((t % 32) < 16 ? (t % 32) ^ 1 : static_cast<int>(0xFFFF0000u)));
}

TEST_CASE("simt: broken warp and barrier rules are faults that say what broke", "[simt]") {
  scoped_settings s;
  device_array<int> out(64);
  CHECK(run(shuffle_exited_lane_kernel, dim3(1), dim3(32), 0, out.data) == cudaErrorLaunchFailure);
  const std::string m = sim::take_fault();  // the kernel, the block, the thread and the call
  CHECK(m.find("shuffle_exited_lane_kernel") != std::string::npos);
  CHECK(m.find("thread (0,0,0)") != std::string::npos);
  CHECK(m.find("__shfl_xor_sync with mask 0xffffffff at") != std::string::npos);
  CHECK(m.find("names lane 7, which has exited") != std::string::npos);
  CHECK(run(shuffle_diverged_kernel, dim3(1), dim3(32), 0, out.data) == cudaErrorLaunchFailure);
  CHECK(fault_says("never converge"));
  CHECK(run(shuffle_missing_lane_kernel, dim3(1), dim3(48), 0, out.data) == cudaErrorLaunchFailure);
  CHECK(fault_says("does not exist"));
  CHECK(sim::take_fault().empty());  // taken once

  // An exited thread does not hold a barrier up (as on sm_70 and later), unless strict.
  CHECK(run(barrier_after_exit_kernel, dim3(1), dim3(64), 0, out.data) == cudaSuccess);
  CHECK(run(divergent_barriers_kernel, dim3(1), dim3(64), 0, out.data) == cudaSuccess);
  sim::config().strict = true;
  CHECK(run(barrier_after_exit_kernel, dim3(1), dim3(64), 0, out.data) == cudaErrorLaunchFailure);
  CHECK(fault_says("thread 3 exited without reaching it"));
  CHECK(run(divergent_barriers_kernel, dim3(1), dim3(64), 0, out.data) == cudaErrorLaunchFailure);
  CHECK(fault_says("divergent __syncthreads"));
}

TEST_CASE("simt: launch configurations CUDA rejects are rejected", "[simt]") {
  scoped_settings s;
  device_array<int> out(4);
  CHECK(sim::launch(add_one_kernel, dim3(0), dim3(32), 0, nullptr, out.data, 4) == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(sim::launch(add_one_kernel, dim3(1), dim3(1025), 0, nullptr, out.data, 4) == cudaErrorInvalidConfiguration);
  CHECK(sim::launch(add_one_kernel, dim3(1), dim3(32), 48 * 1024 + 1, nullptr, out.data, 4) == cudaErrorInvalidValue);
  sim::config().max_grid_x = 8;
  CHECK(sim::launch(add_one_kernel, dim3(9), dim3(32), 0, nullptr, out.data, 4) == cudaErrorInvalidConfiguration);
  cudaGetLastError();
  CHECK(out.get() == std::vector<int>(4, 0));  // nothing ran
}

TEST_CASE("simt: a kernel given a pointer into pageable host memory faults, as on a GPU", "[simt]") {
  scoped_settings s;
  std::vector<int> host(4, 0);
  CHECK(run(add_one_kernel, dim3(1), dim3(32), 0, host.data(), 4) == cudaErrorLaunchFailure);
  CHECK(fault_says("add_one_kernel(int*, int): parameter 0 points to host memory a GPU cannot reach"));
  CHECK(host == std::vector<int>(4, 0));  // nothing ran
  cudaGetLastError();
  int on_stack[4] = {};
  CHECK(run(add_one_kernel, dim3(1), dim3(32), 0, on_stack, 4) == cudaErrorLaunchFailure);
  CHECK(fault_says("parameter 0 points to host memory"));
  cudaGetLastError();
  // Device memory (its end included: an empty range there), pinned host memory and null are fine.
  device_array<int> out(4);
  CHECK(run(add_one_kernel, dim3(1), dim3(32), 0, out.data, 4) == cudaSuccess);
  CHECK(run(add_one_kernel, dim3(1), dim3(32), 0, out.data + 4, 0) == cudaSuccess);
  CHECK(run(add_one_kernel, dim3(1), dim3(32), 0, static_cast<int*>(nullptr), 0) == cudaSuccess);
  int* pinned = nullptr;
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&pinned), 4 * sizeof(int)) == cudaSuccess);
  std::fill(pinned, pinned + 4, 0);
  CHECK(run(add_one_kernel, dim3(1), dim3(32), 0, pinned, 4) == cudaSuccess);
  CHECK(std::vector<int>(pinned, pinned + 4) == std::vector<int>(4, 1));
  cudaFreeHost(pinned);
  CHECK(out.get() == std::vector<int>(4, 1));
}

TEST_CASE("simt: a cooperative launch's grid_sync waits for every block, and keeps each block's shared memory",
          "[simt]") {
  scoped_settings s;
  for (const std::uint64_t seed : {0, 1, 2}) {
    sim::config().shuffle_seed = seed;
    INFO("seed " << seed);
    device_array<unsigned> published(8), sums(8);
    REQUIRE(sim::launch_cooperative(simt_test::grid_sum_kernel, dim3(8), dim3(64), 4, nullptr, published.data,
                                    sums.data) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const auto got = sums.get();
    for (unsigned b = 0; b < 8; ++b) CHECK(got[b] == 36 + 1000 * (b + 1));
    const auto next = published.get();
    for (unsigned b = 0; b < 8; ++b) CHECK(next[b] == got[(b + 1) % 8]);
  }
  sim::config().shuffle_seed = 0;
  device_array<unsigned> out(8);
  // More blocks than 4 SMs x 2 hold at once.
  CHECK(sim::launch_cooperative(simt_test::grid_sync_uncooperative_kernel, dim3(9), dim3(32), 0, nullptr, out.data) ==
        cudaErrorCooperativeLaunchTooLarge);
  CHECK(cudaGetLastError() == cudaErrorCooperativeLaunchTooLarge);
  sim::config().max_cooperative_blocks = 3;  // an MPS client's share of the SMs
  CHECK(sim::launch_cooperative(simt_test::grid_sync_uncooperative_kernel, dim3(4), dim3(32), 0, nullptr, out.data) ==
        cudaErrorCooperativeLaunchTooLarge);
  CHECK(cudaGetLastError() == cudaErrorCooperativeLaunchTooLarge);
  sim::config().max_cooperative_blocks = 0;
  sim::config().cooperative_launch = false;  // a device without cooperative launches
  int attribute = 1;
  CHECK(cudaDeviceGetAttribute(&attribute, cudaDevAttrCooperativeLaunch, 0) == cudaSuccess);
  CHECK(attribute == 0);
  CHECK(sim::launch_cooperative(simt_test::grid_sync_uncooperative_kernel, dim3(2), dim3(32), 0, nullptr, out.data) ==
        cudaErrorNotSupported);
  CHECK(cudaGetLastError() == cudaErrorNotSupported);
  sim::config().cooperative_launch = true;
  CHECK(cudaDeviceGetAttribute(&attribute, cudaDevAttrCooperativeLaunch, 0) == cudaSuccess);
  CHECK(attribute == 1);
  int per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, simt_test::grid_sum_kernel, 64, 0) == cudaSuccess);
  CHECK(per_sm == 2);
  CHECK(run(simt_test::grid_sync_uncooperative_kernel, dim3(2), dim3(32), 0, out.data) == cudaErrorLaunchFailure);
  CHECK(fault_says("in an ordinary launch"));
  CHECK(sim::launch_cooperative(simt_test::grid_sync_after_exit_kernel, dim3(2), dim3(32), 0, nullptr, out.data) ==
        cudaSuccess);
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  CHECK(fault_says("exited while other threads of the grid wait at grid_sync"));
  CHECK(out.get() == std::vector<unsigned>(8, 0));  // no block passed the barrier
}

TEST_CASE("simt: dynamic shared memory starts as poison", "[simt]") {
  device_array<unsigned> out(64);
  REQUIRE(run(dynamic_shared_kernel, dim3(2), dim3(64), 64 * 4, out.data) == cudaSuccess);
  CHECK(out.get() == std::vector<unsigned>(64, 0xFFFFFFFFu));
}

TEST_CASE("simt: CUB block collectives keep CUB's contract", "[simt]") {
  scoped_settings s;
  device_array<unsigned> out(128 * 3);
  REQUIRE(run(block_scan_kernel, dim3(1), dim3(128), 0, out.data) == cudaSuccess);
  const auto o = out.get();
  for (unsigned t = 0; t < 128; ++t) {
    CHECK(o[t * 3 + 0] == t * (t + 1) / 2);
    CHECK(o[t * 3 + 1] == 128u * 129 / 2);
    CHECK(o[t * 3 + 2] == (t == 0 ? 256u : 0xFFFFFFFFu));  // BlockReduce: thread 0 only
  }
  CHECK(run(block_scan_reuse_kernel, dim3(1), dim3(128), 0, out.data) == cudaErrorLaunchFailure);
  CHECK(fault_says("reuses its TempStorage without a __syncthreads()"));
  CHECK(run(block_scan_size_kernel, dim3(1), dim3(128), 0, out.data) == cudaErrorLaunchFailure);
  CHECK(fault_says("instantiated for 256 threads, but the block has 128"));
}

TEST_CASE("simt: CUB device algorithms keep CUB's contract", "[simt]") {
  const std::vector<std::uint32_t> keys{5, 0x100 | 3, 3, 0x200 | 5, 1, 3};
  const std::vector<std::uint32_t> values{0, 1, 2, 3, 4, 5};
  device_array<std::uint32_t> k_in(6), k_out(6), v_in(6), v_out(6);
  REQUIRE(cudaMemcpy(k_in.data, keys.data(), 24, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(v_in.data, values.data(), 24, cudaMemcpyHostToDevice) == cudaSuccess);
  std::size_t bytes = 0;
  REQUIRE(cub::DeviceRadixSort::SortPairs(nullptr, bytes, k_in.data, k_out.data, v_in.data, v_out.data, 6, 0, 8) ==
          cudaSuccess);
  device_array<unsigned char> temp(bytes);
  // Bits [0, 8) only: stable, so equal low bytes keep their input order.
  REQUIRE(cub::DeviceRadixSort::SortPairs(temp.data, bytes, k_in.data, k_out.data, v_in.data, v_out.data, 6, 0, 8) ==
          cudaSuccess);
  CHECK(v_out.get() == std::vector<std::uint32_t>{4, 1, 2, 5, 0, 3});
  CHECK(k_out.get() == std::vector<std::uint32_t>{1, 0x103, 3, 3, 5, 0x205});
  REQUIRE(cub::DeviceRadixSort::SortPairsDescending(temp.data, bytes, k_in.data, k_out.data, v_in.data, v_out.data, 6,
                                                    0, 8) == cudaSuccess);
  CHECK(v_out.get() == std::vector<std::uint32_t>{0, 3, 1, 2, 5, 4});

  scoped_settings s;
  std::size_t small = bytes - 1;
  CHECK(cub::DeviceRadixSort::SortPairs(temp.data, small, k_in.data, k_out.data, v_in.data, v_out.data, 6, 0, 8) ==
        cudaErrorInvalidValue);
  CHECK(cub::DeviceRadixSort::SortPairs(temp.data, bytes, k_in.data, k_in.data, v_in.data, v_out.data, 6, 0, 8) ==
        cudaErrorInvalidValue);  // in place: CUB forbids overlapping ranges
  std::vector<std::uint32_t> host_keys(keys);
  CHECK(cub::DeviceRadixSort::SortPairs(temp.data, bytes, host_keys.data(), k_out.data, v_in.data, v_out.data, 6, 0,
                                        8) == cudaErrorInvalidValue);  // not device memory

  std::size_t scan_bytes = 0;
  REQUIRE(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, v_in.data, v_out.data, 6) == cudaSuccess);
  std::size_t scan_bytes_large = 0;
  REQUIRE(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes_large, v_in.data, v_out.data, 1 << 24) == cudaSuccess);
  CHECK(scan_bytes_large > scan_bytes);  // sized by the item count, as CUB's is
  device_array<unsigned char> scan_temp(scan_bytes);
  REQUIRE(cub::DeviceScan::ExclusiveSum(scan_temp.data, scan_bytes, v_in.data, v_in.data, 6) == cudaSuccess);  // in place
  CHECK(v_in.get() == std::vector<std::uint32_t>{0, 0, 1, 3, 6, 10});
}

TEST_CASE("simt: streams run lazily, in order, and events order them", "[simt]") {
  device_array<int> x(1000);
  cudaStream_t a = nullptr, b = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(sim::launch(add_one_kernel, dim3(2), dim3(64), 0, a, x.data, 1000) == cudaSuccess);
  int first = -1;
  REQUIRE(cudaMemcpyAsync(&first, x.data, sizeof(int), cudaMemcpyDeviceToHost, b) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  CHECK(first == 0);  // b never waited for a: the kernel has not run
  cudaEvent_t done = nullptr;
  REQUIRE(cudaEventCreate(&done) == cudaSuccess);
  REQUIRE(cudaEventRecord(done, a) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(b, done, 0) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(&first, x.data, sizeof(int), cudaMemcpyDeviceToHost, b) == cudaSuccess);
  CHECK(first == 0);  // nothing runs before the host waits
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  CHECK(first == 1);
  CHECK(x.get() == std::vector<int>(1000, 1));
  cudaEventDestroy(done);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}
