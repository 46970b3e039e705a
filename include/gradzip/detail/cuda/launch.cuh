// Every kernel launch in gradzip goes through detail::launch: <<<>>> and the launch's error
// check under nvcc, the CPU SIMT backend's launcher in a SIMT build (tests/simt), so the very
// same call sites run on a GPU and, without one, in CI.
//
// Kernels defined in headers are templates, `template <class = void>` where nothing else is a
// parameter (launched as `kernel<>`): nvcc ignores `inline` on a __global__ function (warning
// #20050 in every consumer's build), and a plain one would be defined in every translation unit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "gradzip/core/error.hpp"

#if !defined(GRADZIP_SIMT)
#include <cooperative_groups.h>
#include <tuple>
#endif

namespace gradzip::detail {

/// A kernel family's launch parameters in one place, like CUB's `Policy` structs: the family's
/// launches (`grid_for_policy`, core/cuda.cuh) and its kernels' `__launch_bounds__` read them,
/// so retuning is one line. No launch site names a block size of its own: a grid-stride
/// family declares `launch_policy<256, 1, 8>` and says so in one place.
template <unsigned Threads, unsigned ItemsPerThread, unsigned BlocksPerSm>
struct launch_policy {
  static constexpr unsigned threads = Threads;                  ///< per block
  static constexpr unsigned items_per_thread = ItemsPerThread;  ///< per thread and loop step
  static constexpr unsigned blocks_per_sm = BlocksPerSm;        ///< the grid's cap, per SM
  static_assert(Threads % 32 == 0 && Threads <= 1024, "launch_policy: whole warps, at most 1024 threads");
};

/// The largest grid.x a CUDA device accepts (every architecture gradzip supports).
inline constexpr std::uint64_t max_grid_blocks = 0x7FFFFFFFu;

/**
 * kernel<<<blocks, threads, shared_bytes, stream>>>(args...), then throws gradzip::cuda_error if
 * the launch failed. `blocks` is 64-bit so that no caller narrows a count: more than a grid
 * holds is an invalid_argument here, never a silent wrap (kernels over more work than that
 * stride over it). A kernel template is passed instantiated (`kernel<T>`): a launch through a
 * pointer cannot deduce template arguments.
 */
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), std::uint64_t blocks, unsigned threads, std::size_t shared_bytes,
            cudaStream_t stream, Args&&... args) {
  GRADZIP_EXPECTS(blocks <= max_grid_blocks, "launch: ", blocks, " blocks exceed a CUDA grid (at most ",
                  max_grid_blocks, ")");
#if defined(GRADZIP_SIMT)
  ::gradzip_simt::launch(kernel, dim3(static_cast<unsigned>(blocks)), dim3(threads), shared_bytes, stream,
                         std::forward<Args>(args)...);
#else
  kernel<<<static_cast<unsigned>(blocks), threads, shared_bytes, stream>>>(std::forward<Args>(args)...);
#endif
  GRADZIP_CUDA_TRY(cudaGetLastError());
}

/**
 * A cooperative launch (cudaLaunchCooperativeKernel): every block of the grid is resident at
 * once, so that the kernel may wait for all of them at grid_sync. Returns cudaSuccess when it
 * launched. Returns the reason, launching nothing and leaving no error behind, when the device
 * cannot hold the grid at once (cudaErrorCooperativeLaunchTooLarge: above
 * cudaOccupancyMaxActiveBlocksPerMultiprocessor x SMs, or fewer SMs than the device has, as an
 * MPS client with an active-thread percentage gets) or has no cooperative launches
 * (cudaErrorNotSupported; cudaDevAttrCooperativeLaunch 0), so the caller can run another way
 * and tell the executor which (`cuda::cooperative_declined`); throws gradzip::cuda_error on
 * any other failure.
 * In a SIMT build the backend holds every block's threads and releases grid_sync when all arrive.
 */
template <class... Params, class... Args>
[[nodiscard]] cudaError_t launch_cooperative(void (*kernel)(Params...), std::uint64_t blocks, unsigned threads,
                                      std::size_t shared_bytes, cudaStream_t stream, Args&&... args) {
  GRADZIP_EXPECTS(blocks <= max_grid_blocks, "launch_cooperative: ", blocks, " blocks exceed a CUDA grid (at most ",
                  max_grid_blocks, ")");
#if defined(GRADZIP_SIMT)
  cudaError_t e = ::gradzip_simt::launch_cooperative(kernel, dim3(static_cast<unsigned>(blocks)), dim3(threads),
                                                     shared_bytes, stream, std::forward<Args>(args)...);
#else
  // The runtime takes each argument's address, of the kernel's own parameter type.
  std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
  cudaError_t e = cudaSuccess;
  std::apply(
      [&](auto&... p) {
        void* addresses[] = {static_cast<void*>(&p)..., nullptr};
        e = cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(static_cast<unsigned>(blocks)),
                                        dim3(threads), addresses, shared_bytes, stream);
      },
      params);
#endif
  if (e == cudaErrorCooperativeLaunchTooLarge || e == cudaErrorNotSupported) {
    (void)cudaGetLastError();  // not sticky: clear it, so the next launch's check does not see it
    return e;
  }
  GRADZIP_CUDA_TRY(e);
  GRADZIP_CUDA_TRY(cudaGetLastError());
  return cudaSuccess;
}

/// The grid-wide barrier of a cooperative launch (cooperative_groups' grid.sync()): every thread
/// of the grid arrives before any leaves, and memory written before it is visible after it.
#if defined(GRADZIP_SIMT)
inline void grid_sync(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::gradzip_simt::grid_sync(file, line);
}
#else
__device__ inline void grid_sync() { cooperative_groups::this_grid().sync(); }
#endif

/// The block's dynamic shared memory (the launch's `shared_bytes`), 16-byte aligned.
template <class T>
__device__ T* dynamic_shared_memory() {
#if defined(GRADZIP_SIMT)
  return static_cast<T*>(::gradzip_simt::dynamic_shared());
#else
  extern __shared__ __align__(16) unsigned char gradzip_dynamic_shared[];
  return reinterpret_cast<T*>(gradzip_dynamic_shared);
#endif
}

}  // namespace gradzip::detail
