/**
 * @file cuda.cuh
 * @brief `gradzip::cuda`, the CUDA executor, and the CUDA backends of every stage.
 *
 * `gradzip::cuda exec{stream}` runs work on `stream` and owns stream-ordered scratch memory
 * (cudaMallocAsync, grown to the largest request, then reused) and a device status word that
 * decoders write. Nothing synchronizes unless its name says so:
 *
 * - `compress` and `decompress_add` only enqueue work; they return at once.
 * - `check()` synchronizes the stream and throws `gradzip::format_error` if a decode on this
 *   executor met a bad payload since the last check. A failed decode changes no output, and the
 *   error is sticky: later decodes on the executor are skipped until `check()` reports it.
 * - `reserve` allocates (stream-ordered) so later calls allocate nothing.
 *
 * Payload buffers given to the CUDA executor are device memory, 16-byte aligned.
 *
 * @code
 * gradzip::cuda exec{stream};
 * exec.reserve(codec.workspace_bytes<float>(exec, n));
 * std::size_t bytes = codec.compress(exec, gradzip::span<const float>(d_grad), d_out);   // async
 * codec.decompress_add(exec, d_payload, d_accum);             // async
 * exec.check();                                               // sync; throws on bad bytes
 * @endcode
 */
#pragma once

#include <cub/device/device_scan.cuh>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "gradzip/codec.hpp"
#include "gradzip/core/error.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/wire/format.hpp"

/// Throws gradzip::cuda_error naming the call and the CUDA error unless it returned cudaSuccess.
#define GRADZIP_CUDA_TRY(call)                                                                  \
  do {                                                                                          \
    const cudaError_t gradzip_status_ = (call);                                                 \
    if (gradzip_status_ != cudaSuccess) {                                                       \
      throw ::gradzip::cuda_error(::gradzip::detail::concat(                                    \
          #call, " failed: ", cudaGetErrorName(gradzip_status_), " (",                          \
          cudaGetErrorString(gradzip_status_), ") at ", __FILE__, ":", __LINE__));              \
    }                                                                                           \
  } while (0)

/// The no-throw twin for destructors: the error is dropped (and cleared).
#define GRADZIP_CUDA_TRY_NO_THROW(call) static_cast<void>(call)

#include "gradzip/detail/cuda/launch.cuh"

namespace gradzip {

class cuda {
 public:
  /// A validation pass's pending word when no position has failed.
  static constexpr unsigned long long no_failure = ~0ull;

  explicit cuda(cudaStream_t stream = nullptr) : stream_(stream) {
    GRADZIP_CUDA_TRY(cudaMalloc(&status_, sizeof(status_words)));
    GRADZIP_CUDA_TRY(cudaMemsetAsync(&status_->first, 0, sizeof(wire::status), stream_));
    GRADZIP_CUDA_TRY(cudaMemsetAsync(&status_->pending, 0xFF, sizeof(status_->pending), stream_));
    GRADZIP_CUDA_TRY(cudaEventCreateWithFlags(&order_, cudaEventDisableTiming));
    GRADZIP_CUDA_TRY(cudaGetDevice(&device_));
    GRADZIP_CUDA_TRY(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_));
    GRADZIP_CUDA_TRY(cudaDeviceGetAttribute(&max_grid_, cudaDevAttrMaxGridDimX, device_));
    int cooperative = 0;
    GRADZIP_CUDA_TRY(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device_));
    cooperative_sms_ = cooperative != 0 ? sm_count_ : 0;
  }
  cuda(const cuda&) = delete;
  cuda& operator=(const cuda&) = delete;
  cuda(cuda&& o) noexcept { swap(o); }
  cuda& operator=(cuda&& o) noexcept {
    swap(o);
    return *this;
  }
  ~cuda() {
    if (scratch_ != nullptr) GRADZIP_CUDA_TRY_NO_THROW(cudaFreeAsync(scratch_, stream_));
    if (status_ != nullptr) {
      GRADZIP_CUDA_TRY_NO_THROW(cudaStreamSynchronize(stream_));
      GRADZIP_CUDA_TRY_NO_THROW(cudaFree(status_));
    }
    if (order_ != nullptr) GRADZIP_CUDA_TRY_NO_THROW(cudaEventDestroy(order_));
  }

  cudaStream_t stream() const noexcept { return stream_; }
  int sm_count() const noexcept { return sm_count_; }
  /// The device current when the executor was made: where its scratch lives.
  int device() const noexcept { return device_; }
  /// The largest grid.x the device accepts.
  int max_grid() const noexcept { return max_grid_; }

  /// The SMs a cooperative launch may fill: sm_count(); 0 on a device without cooperative
  /// launches (cudaDevAttrCooperativeLaunch 0); fewer once one declined a grid that the
  /// occupancy said the device holds, as an MPS client or a green context with a share of the
  /// SMs sees (`cooperative_declined`).
  int cooperative_sms() const noexcept { return cooperative_sms_; }

  /// Learns from a cooperative launch of `blocks` blocks, `per_sm` of them resident per SM, that
  /// the device declined it, for the reason launch_cooperative returned:
  /// - cudaErrorNotSupported: no cooperative launches at all (the attribute turned 0 since the
  ///   executor was made), so none is tried again;
  /// - otherwise (cudaErrorCooperativeLaunchTooLarge): it holds fewer than ceil(blocks / per_sm)
  ///   SMs' worth, so later grids are sized to at most one SM fewer, and a grid that cannot fit
  ///   is not tried again (a failed launch is an API call per compress). Each decline lowers the
  ///   count below the grid tried, so a grid size declines at most once.
  /// It changes the executor, as its scratch does: one thread at a time.
  void cooperative_declined(std::uint64_t blocks, int per_sm, cudaError_t why) noexcept {
    if (why == cudaErrorNotSupported) {
      cooperative_sms_ = 0;
      return;
    }
    if (blocks == 0 || per_sm <= 0) return;  // no grid was tried: nothing learned
    const auto p = static_cast<std::uint64_t>(per_sm);
    const std::uint64_t fewer = (blocks + p - 1) / p - 1;
    if (fewer < static_cast<std::uint64_t>(cooperative_sms_)) cooperative_sms_ = static_cast<int>(fewer);
  }

  /// Grows scratch to at least `bytes` (stream-ordered; the old block is freed on the stream).
  void reserve(std::size_t bytes) {
    if (bytes <= capacity_) return;
    if (scratch_ != nullptr) GRADZIP_CUDA_TRY(cudaFreeAsync(scratch_, stream_));
    scratch_ = nullptr;
    capacity_ = 0;
    GRADZIP_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&scratch_), bytes, stream_));
    capacity_ = bytes;
  }

  std::size_t scratch_capacity() const noexcept { return capacity_; }

  /// Device scratch of at least `bytes` bytes, 256-byte aligned.
  std::byte* scratch(std::size_t bytes) {
    reserve(bytes);
    return scratch_;
  }

  /// The decoders' status word (device memory): the first failure since the last check().
  wire::status* status_word() noexcept { return &status_->first; }

  /// The lowest failing position of the validation pass in flight (device memory; no_failure
  /// between passes), so that a decode reports the failure the host reports whatever the order
  /// its threads run in.
  unsigned long long* pending_failure() noexcept { return &status_->pending; }

  /// Work queued later on `other` waits for the work queued on this executor's stream so far
  /// (an event; no host synchronization).
  void order_before(cudaStream_t other) {
    GRADZIP_CUDA_TRY(cudaEventRecord(order_, stream_));
    GRADZIP_CUDA_TRY(cudaStreamWaitEvent(other, order_, 0));
  }
  /// Work queued later on this executor's stream waits for the work queued on `other` so far.
  void order_after(cudaStream_t other) {
    GRADZIP_CUDA_TRY(cudaEventRecord(order_, other));
    GRADZIP_CUDA_TRY(cudaStreamWaitEvent(stream_, order_, 0));
  }

  /// Waits for the stream's work to finish.
  void synchronize() { GRADZIP_CUDA_TRY(cudaStreamSynchronize(stream_)); }

  /// Synchronizes, then throws format_error for the first bad payload a decode met since the
  /// last check (and clears it). The status word is read and cleared on the executor's stream:
  /// the legacy stream that cudaMemcpy and cudaMemset use does not wait for, and is not waited
  /// for by, a non-blocking stream.
  void check() {
    wire::status s;
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(&s, &status_->first, sizeof(s), cudaMemcpyDeviceToHost, stream_));
    synchronize();
    if (!s.ok()) {
      GRADZIP_CUDA_TRY(cudaMemsetAsync(&status_->first, 0, sizeof(wire::status), stream_));
      wire::throw_if_failed(s, "decompress (cuda)");
    }
  }

 private:
  struct status_words {
    wire::status first;
    unsigned long long pending;
  };

  void swap(cuda& o) noexcept {
    std::swap(stream_, o.stream_);
    std::swap(scratch_, o.scratch_);
    std::swap(capacity_, o.capacity_);
    std::swap(status_, o.status_);
    std::swap(sm_count_, o.sm_count_);
    std::swap(device_, o.device_);
    std::swap(max_grid_, o.max_grid_);
    std::swap(cooperative_sms_, o.cooperative_sms_);
    std::swap(order_, o.order_);
  }

  cudaStream_t stream_ = nullptr;
  std::byte* scratch_ = nullptr;
  std::size_t capacity_ = 0;
  status_words* status_ = nullptr;
  cudaEvent_t order_ = nullptr;  // order_before / order_after
  int sm_count_ = 0;
  int device_ = 0;
  int max_grid_ = 1;
  int cooperative_sms_ = 0;
};

namespace detail {

/// Owning device array (cudaMalloc/cudaFree), for state such as error-feedback residuals.
template <class T>
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(std::size_t n) : size_(n) {
    GRADZIP_EXPECTS(n <= SIZE_MAX / sizeof(T), "device_buffer: ", n, " elements of ", sizeof(T), " bytes overflow a size");
    if (n != 0) GRADZIP_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&data_), n * sizeof(T)));
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  device_buffer(device_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~device_buffer() {
    if (data_ != nullptr) GRADZIP_CUDA_TRY_NO_THROW(cudaFree(data_));
  }
  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

/// Blocks for a kernel whose thread blocks take `units` (a tensor block each, say) in a
/// block-stride loop: enough to fill the GPU, no more than needed, never past the device's grid.
inline unsigned grid_for_units(const cuda& exec, std::uint64_t units, unsigned blocks_per_sm = 8) {
  std::uint64_t cap = static_cast<std::uint64_t>(exec.sm_count()) * blocks_per_sm;
  if (cap > static_cast<std::uint64_t>(exec.max_grid())) cap = static_cast<std::uint64_t>(exec.max_grid());
  return static_cast<unsigned>(units == 0 ? 1 : (units < cap ? units : cap));
}

/// Blocks for a grid-stride loop of a `launch_policy` over n items: items_per_thread per thread
/// and step, at most blocks_per_sm blocks per SM.
template <class Policy>
unsigned grid_for_policy(const cuda& exec, std::uint64_t n) {
  const std::uint64_t per_block = static_cast<std::uint64_t>(Policy::threads) * Policy::items_per_thread;
  return grid_for_units(exec, (n + per_block - 1) / per_block, Policy::blocks_per_sm);
}

/// A grid-stride kernel of a `launch_policy` over n items, on the executor's stream: the grid
/// from `grid_for_policy`, the block of `Policy::threads` (the kernel's `__launch_bounds__` must
/// name the same policy), no dynamic shared memory.
template <class Policy, class... Params, class... Args>
void launch_over(cuda& exec, std::uint64_t n, void (*kernel)(Params...), Args&&... args) {
  launch(kernel, grid_for_policy<Policy>(exec, n), Policy::threads, 0, exec.stream(),
         std::forward<Args>(args)...);
}

/// A kernel of a `launch_policy` whose blocks take `units` (a tensor block, a row) in a
/// block-stride loop, on the executor's stream, with `shared_bytes` of dynamic shared memory.
template <class Policy, class... Params, class... Args>
void launch_units(cuda& exec, std::uint64_t units, std::size_t shared_bytes, void (*kernel)(Params...),
                  Args&&... args) {
  launch(kernel, grid_for_units(exec, units, Policy::blocks_per_sm), Policy::threads, shared_bytes,
         exec.stream(), std::forward<Args>(args)...);
}

/// Bytes of CUB storage an exclusive sum of `items` u64 needs (plus up to 256 for alignment).
inline std::size_t exclusive_sum_bytes(cuda& exec, std::uint64_t items) {
  std::size_t bytes = 0;
  GRADZIP_CUDA_TRY(cub::DeviceScan::ExclusiveSum(nullptr, bytes, static_cast<const std::uint64_t*>(nullptr),
                                                 static_cast<std::uint64_t*>(nullptr), items, exec.stream()));
  return bytes;
}

/// Key bits a radix sort needs for keys below `range` (at least 1, at most 32).
inline int radix_bits(std::uint64_t range) {
  int bits = 1;
  while (bits < 32 && (std::uint64_t{1} << bits) < range) ++bits;
  return bits;
}

inline void require_aligned(const void* p, const char* what) {
  GRADZIP_EXPECTS(reinterpret_cast<std::uintptr_t>(p) % wire::alignment == 0, what,
                  ": device payload buffers must be 16-byte aligned, got address ", p);
}

}  // namespace detail
}  // namespace gradzip

#include "gradzip/detail/cuda/elementwise.cuh"
#include "gradzip/detail/cuda/payload.cuh"
#include "gradzip/detail/cuda/encode.cuh"
#include "gradzip/detail/cuda/quantize.cuh"
#include "gradzip/detail/cuda/blockwise_topk.cuh"
#include "gradzip/detail/cuda/threshold.cuh"
#include "gradzip/detail/cuda/sampled_topk.cuh"
#include "gradzip/detail/cuda/topk.cuh"
#include "gradzip/detail/cuda/hashed_topk.cuh"
#include "gradzip/detail/cuda/simhash.cuh"
#include "gradzip/detail/cuda/hadamard.cuh"
#include "gradzip/detail/cuda/count_sketch.cuh"
#include "gradzip/detail/cuda/fetchsgd.cuh"
#include "gradzip/detail/cuda/partition.cuh"
#include "gradzip/detail/cuda/sparse_sync.cuh"
#include "gradzip/detail/cuda/lowrank.cuh"
#include "gradzip/detail/cuda/compress_async.cuh"
