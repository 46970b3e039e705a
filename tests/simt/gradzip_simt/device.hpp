/**
 * @file device.hpp
 * @brief gradzip's CPU SIMT backend, device side: what CUDA device code sees when a `.cu` file
 * is compiled by g++ and its kernels run on the CPU, one fiber per CUDA thread.
 *
 * A SIMT build force-includes this header (`-include gradzip_simt/device.hpp`) before anything
 * else. It defines the CUDA keywords, the built-in variables (`threadIdx`, `blockIdx`,
 * `blockDim`, `gridDim`), the synchronization and warp intrinsics and the atomics the library
 * uses, each with CUDA's semantics; `runtime.cpp` implements the launch, the scheduler and the
 * CUDA runtime API. The real `<cuda_runtime.h>` is included for its types and declarations.
 *
 * Semantics, in short (docs/architecture.md, "Device code without a GPU", has the whole list):
 * - a block's threads are fibers that run until they reach a synchronization point; the
 *   scheduler then completes every barrier and warp operation whose participants have all
 *   arrived, in thread order or in an order shuffled by a seed;
 * - `__syncthreads` waits for every thread of the block that has not exited (strict mode: at
 *   the same call site, and no thread may have exited);
 * - a warp operation completes when every lane its mask names waits at the same operation with
 *   the same mask; a mask that names an exited or missing lane, or lanes that never converge,
 *   is a fault that names the kernel, the block, the thread and the call sites;
 * - atomics are exact (blocks run one at a time, and a fiber yields only at a sync point);
 * - a cooperative launch (`launch_cooperative`) holds all its blocks at once: each runs until
 *   every live thread of it waits at `grid_sync`, then the next (in a shuffled order under a
 *   seed), and the barrier releases when every thread of the grid waits at it. Each block has
 *   its own dynamic shared memory, and (a clang build, below) its own static `__shared__`
 *   variables; under GCC those are one object for all blocks.
 */
#pragma once

#define GRADZIP_SIMT 1

// Keywords: defined before the CUDA headers, whose host_defines.h keeps a prior definition
// when nvcc is not compiling. A __shared__ variable is one object per block; blocks run one
// at a time, so a static variable is that, once the backend poisons it at each block's start
// (and, in a cooperative launch, swaps in each block's own copy). It can only where the
// variables share a section: clang honours the section of a function's local static; GCC
// ignores it on a template's (every gradzip kernel is one), so there a __shared__ variable
// starts at zero in the program's first block and keeps what the last block left.
#define GRADZIP_SIMT_SHARED_SECTION ".gradzip_simt_shared"
#define __global__
#define __device__
#define __host__
#if defined(__clang__)
#define __shared__ __attribute__((section(GRADZIP_SIMT_SHARED_SECTION))) static
#else
#define __shared__ static
#endif
#define __launch_bounds__(...)
#define __forceinline__ inline __attribute__((always_inline))

#include <cuda_runtime.h>

// Whether this is the AddressSanitizer build (GCC says so with a macro, clang with a feature).
#if defined(__SANITIZE_ADDRESS__)
#define GRADZIP_SIMT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GRADZIP_SIMT_ASAN 1
#endif
#endif

// Whether this is the ThreadSanitizer build.
#if defined(__SANITIZE_THREAD__)
#define GRADZIP_SIMT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GRADZIP_SIMT_TSAN 1
#endif
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace gradzip_simt {

/// Kinds of synchronization point a thread can wait at.
enum class wait_kind : std::uint8_t {
  none,
  syncthreads,
  syncthreads_count,
  syncthreads_or,
  syncthreads_and,
  collective,  // a CUB block-wide collective (BlockScan, BlockReduce)
  grid_sync,   // a cooperative launch's grid-wide barrier (detail::grid_sync)
  syncwarp,
  shfl,
  shfl_up,
  shfl_down,
  shfl_xor,
  ballot,
  any,
  all,
  match_any,
  activemask,
};

/// A block-wide collective: `run` computes every thread's output from every thread's input,
/// in linear thread order, once all threads have arrived.
struct collective_call {
  const void* storage;  // the TempStorage object: its identity, for CUB's reuse rule
  const char* name;     // e.g. "cub::BlockScan::ExclusiveSum", for messages
  unsigned block_threads;
  void (*run)(void* const* inputs, void* const* outputs, unsigned threads, const void* extra);
  const void* extra;
  const void* input;
  void* output;
};

/// What one CUDA thread is: its coordinates, and where it waits.
struct thread_context {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
  unsigned rank;  // linear thread index within the block
  unsigned lane;
  unsigned warp;

  // The pending synchronization: what, where, with which mask and operands.
  wait_kind kind = wait_kind::none;
  unsigned mask = 0;
  const char* file = nullptr;
  int line = 0;
  alignas(16) unsigned char value[16] = {};
  unsigned value_size = 0;
  int operand = 0;  // source lane, delta or lane mask of a shuffle; a barrier's predicate
  int width = 32;
  collective_call collective{};
  // The result the scheduler leaves when the operation completes.
  alignas(16) unsigned char result[16] = {};
  unsigned result_word = 0;
  // The ThreadSanitizer build's order (runtime.cpp, wait): a completed warp operation's lanes
  // and the parity of each one's arrival, and the keys a thread's arrivals release into (two
  // each, alternating, so that a thread running on to its next arrival cannot add to the key
  // of the one the others are still leaving).
  unsigned members = 0;
  unsigned member_parity = 0;
  unsigned lane_arrivals = 0;        // warp operations of part of the warp
  unsigned whole_warp_arrivals = 0;  // of the whole warp
  unsigned char lane_keys[2] = {};
  unsigned char whole_warp_keys[2] = {};  // lane 0's: the warp's
};

/// The calling CUDA thread; null outside kernels.
extern thread_local thread_context* current;

/// Whether the caller runs inside an emulated kernel (gradzip's device code paths test this).
inline bool in_kernel() noexcept { return current != nullptr; }

/// Reports a device-side fault (a broken CUDA rule, a misaligned access, ...) and ends the
/// launch: by default the process aborts with the message; a test of the backend itself can
/// ask for it as a sticky launch error instead (expect_faults).
[[noreturn]] void fault(const std::string& message);

inline thread_context& context() {
  if (current == nullptr) fault("a device built-in or intrinsic was used outside a kernel");
  return *current;
}

/// Waits (yields the fiber) until the scheduler completes the pending operation.
void wait(wait_kind kind, unsigned mask, const char* file, int line);

/// The block's dynamic shared memory (`extern __shared__`), filled with the poison pattern.
void* dynamic_shared();

/// Runs a block-wide collective: the calling thread's part; returns when all have taken part.
void block_collective(const collective_call& call, const char* file, int line);

/// The byte dynamic shared memory, fresh device allocations and CUB temp storage are filled with.
inline constexpr unsigned char poison_byte = 0xFF;

/// The section static __shared__ variables live in (a clang build).
inline constexpr const char* static_shared_section = GRADZIP_SIMT_SHARED_SECTION;

/// Whether static __shared__ variables are per block here: poisoned at each block's start, one
/// copy per block in a cooperative launch (a clang build: the section exists); otherwise they
/// are plain statics, zero at first and shared by every block.
bool static_shared_per_block();

// ---- the launch ----

/// One launch, type-erased: the grid, and the body every thread runs.
struct launch_record {
  dim3 grid;
  dim3 block;
  std::size_t shared_bytes;
  const void* kernel;
  std::function<void()> body;
  bool cooperative = false;  // cudaLaunchCooperativeKernel: every block resident, grid_sync allowed
  int host_pointer = -1;     // the first pointer parameter into memory a GPU cannot reach (-1: none)
};

/// Whether device code may dereference p: inside a device allocation or pinned host memory
/// (which unified addressing maps for the device), or one past its end.
bool device_accessible(const void* p);

/// The position of the first parameter that is a non-null data pointer a kernel could not
/// dereference on a GPU (into pageable host memory or a stack), or -1. Pointers inside structs
/// are not seen.
template <class Tuple, std::size_t... I>
int host_pointer_parameter(const Tuple& params, std::index_sequence<I...>) {
  int first = -1;
  auto check = [&](int i, const auto& value) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (std::is_pointer_v<T> && !std::is_function_v<std::remove_pointer_t<T>>) {
      if (first < 0 && value != nullptr && !device_accessible(value)) first = i;
    }
  };
  (check(static_cast<int>(I), std::get<I>(params)), ...);
  return first;
}

/// Validates the configuration (as cudaLaunchKernel does) and enqueues the launch on `stream`.
cudaError_t enqueue_launch(cudaStream_t stream, launch_record&& record);

/// kernel<<<grid, block, shared_bytes, stream>>>(args...): the parameters are copied now, as
/// CUDA copies them at the launch; every thread calls the kernel with its own copy.
template <class... Params, class... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream,
                   Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "launch: argument count differs from the kernel's");
  auto params = std::make_shared<std::tuple<std::decay_t<Params>...>>(std::forward<Args>(args)...);
  launch_record r{grid, block, shared_bytes, reinterpret_cast<const void*>(kernel),
                  [kernel, params] { std::apply(kernel, *params); }};
  r.host_pointer = host_pointer_parameter(*params, std::index_sequence_for<Params...>{});
  return enqueue_launch(stream, std::move(r));
}

/// cudaLaunchCooperativeKernel(kernel, grid, block, args, shared_bytes, stream): as launch, but
/// every block is resident at once, so that grid_sync may wait for all of them. A grid above
/// what the device holds at once (cudaOccupancyMaxActiveBlocksPerMultiprocessor x SMs) is
/// cudaErrorCooperativeLaunchTooLarge.
template <class... Params, class... Args>
cudaError_t launch_cooperative(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes,
                               cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "launch_cooperative: argument count differs from the kernel's");
  auto params = std::make_shared<std::tuple<std::decay_t<Params>...>>(std::forward<Args>(args)...);
  launch_record r{grid, block, shared_bytes, reinterpret_cast<const void*>(kernel),
                  [kernel, params] { std::apply(kernel, *params); }, true};
  r.host_pointer = host_pointer_parameter(*params, std::index_sequence_for<Params...>{});
  return enqueue_launch(stream, std::move(r));
}

/// cooperative_groups::this_grid().sync(): waits until every thread of the grid arrives (in a
/// cooperative launch only), with the memory ordering of a fence.
void grid_sync(const char* file, int line);

// ---- warp operations ----

template <class T>
T shuffle(wait_kind kind, unsigned mask, T var, int operand, int width, const char* file, int line) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 16, "shuffle: a trivially copyable value of <= 16 bytes");
  thread_context& c = context();
  std::memcpy(c.value, &var, sizeof(T));
  c.value_size = sizeof(T);
  c.operand = operand;
  c.width = width;
  wait(kind, mask, file, line);
  T out;
  std::memcpy(&out, c.result, sizeof(T));
  return out;
}

template <class T>
unsigned match_any(unsigned mask, T value, const char* file, int line) {
  static_assert(std::is_integral_v<T> && sizeof(T) <= 8, "__match_any_sync: a 32- or 64-bit integer");
  thread_context& c = context();
  const auto v = static_cast<std::uint64_t>(value);
  std::memcpy(c.value, &v, 8);
  c.value_size = 8;
  wait(wait_kind::match_any, mask, file, line);
  return c.result_word;
}

inline unsigned vote(wait_kind kind, unsigned mask, int predicate, const char* file, int line) {
  thread_context& c = context();
  c.operand = predicate != 0 ? 1 : 0;
  wait(kind, mask, file, line);
  return c.result_word;
}

inline unsigned barrier(wait_kind kind, int predicate, const char* file, int line) {
  thread_context& c = context();
  c.operand = predicate != 0 ? 1 : 0;
  wait(kind, 0, file, line);
  return c.result_word;
}

// ---- atomics: exact, since a fiber is never interrupted between its read and its write ----

template <class T, class F>
T atomic_update(T* address, F f) {
#if defined(GRADZIP_SIMT_TSAN)
  // Relaxed atomics, as CUDA's: ThreadSanitizer sees them as atomic (no race between two
  // threads' atomics), and they order nothing else.
  T old;
  __atomic_load(address, &old, __ATOMIC_RELAXED);
  T desired = f(old);
  while (!__atomic_compare_exchange(address, &old, &desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    desired = f(old);
  }
  return old;
#else
  const T old = *address;
  *address = f(old);
  return old;
#endif
}

}  // namespace gradzip_simt

// ---- built-in variables ----
#define threadIdx (::gradzip_simt::context().thread_idx)
#define blockIdx (::gradzip_simt::context().block_idx)
#define blockDim (::gradzip_simt::context().block_dim)
#define gridDim (::gradzip_simt::context().grid_dim)
inline constexpr int warpSize = 32;

// ---- synchronization ----
inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::gradzip_simt::barrier(::gradzip_simt::wait_kind::syncthreads, 0, file, line);
}
inline int __syncthreads_count(int predicate, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return static_cast<int>(::gradzip_simt::barrier(::gradzip_simt::wait_kind::syncthreads_count, predicate, file, line));
}
inline int __syncthreads_or(int predicate, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return static_cast<int>(::gradzip_simt::barrier(::gradzip_simt::wait_kind::syncthreads_or, predicate, file, line));
}
inline int __syncthreads_and(int predicate, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return static_cast<int>(::gradzip_simt::barrier(::gradzip_simt::wait_kind::syncthreads_and, predicate, file, line));
}
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::gradzip_simt::wait(::gradzip_simt::wait_kind::syncwarp, mask, file, line);
}
inline void __threadfence() {}
inline void __threadfence_block() {}

// ---- warp intrinsics ----
template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize, const char* file = __builtin_FILE(),
              int line = __builtin_LINE()) {
  return ::gradzip_simt::shuffle(::gradzip_simt::wait_kind::shfl, mask, var, src_lane, width, file, line);
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize, const char* file = __builtin_FILE(),
                 int line = __builtin_LINE()) {
  return ::gradzip_simt::shuffle(::gradzip_simt::wait_kind::shfl_up, mask, var, static_cast<int>(delta), width, file,
                                 line);
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize, const char* file = __builtin_FILE(),
                   int line = __builtin_LINE()) {
  return ::gradzip_simt::shuffle(::gradzip_simt::wait_kind::shfl_down, mask, var, static_cast<int>(delta), width,
                                 file, line);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize, const char* file = __builtin_FILE(),
                  int line = __builtin_LINE()) {
  return ::gradzip_simt::shuffle(::gradzip_simt::wait_kind::shfl_xor, mask, var, lane_mask, width, file, line);
}
inline unsigned __ballot_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  return ::gradzip_simt::vote(::gradzip_simt::wait_kind::ballot, mask, predicate, file, line);
}
inline int __any_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return static_cast<int>(::gradzip_simt::vote(::gradzip_simt::wait_kind::any, mask, predicate, file, line));
}
inline int __all_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return static_cast<int>(::gradzip_simt::vote(::gradzip_simt::wait_kind::all, mask, predicate, file, line));
}
template <class T>
unsigned __match_any_sync(unsigned mask, T value, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::gradzip_simt::match_any(mask, value, file, line);
}
/// The lanes of the caller's warp that are converged with it: those waiting at this same call.
inline unsigned __activemask(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::gradzip_simt::wait(::gradzip_simt::wait_kind::activemask, 0, file, line);
  return ::gradzip_simt::context().result_word;
}

// ---- integer intrinsics (exact host twins) ----
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  __extension__ using u128 = unsigned __int128;
  return static_cast<unsigned long long>((static_cast<u128>(a) * b) >> 64);
}
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}
/// Byte n of the result is byte (s >> 4 n) & 7 of the 8 bytes y:x (x the low four), or, where
/// the selector's fourth bit is set, that byte's sign bit replicated over all eight: PTX's
/// prmt.b32 in its default mode, which __byte_perm compiles to (CUDA's documentation names only
/// the three low bits; s's upper 16 bits are ignored).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long bytes = (static_cast<unsigned long long>(y) << 32) | x;
  unsigned out = 0;
  for (int n = 0; n < 4; ++n) {
    const unsigned selector = (s >> (4 * n)) & 0xFu;
    unsigned byte = static_cast<unsigned>(bytes >> (8 * (selector & 7u))) & 0xFFu;
    if ((selector & 8u) != 0) byte = (byte & 0x80u) != 0 ? 0xFFu : 0u;
    out |= byte << (8 * n);
  }
  return out;
}
inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0F0F0F0Fu) | ((x & 0x0F0F0F0Fu) << 4);
  return __builtin_bswap32(x);
}

// ---- floating-point intrinsics: IEEE round-to-nearest, never contracted ----
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __fma_rn(double a, double b, double c) { return __builtin_fma(a, b, c); }
inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline int __float_as_int(float f) { int x; std::memcpy(&x, &f, 4); return x; }
inline float __uint_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned x; std::memcpy(&x, &f, 4); return x; }
template <class T>
T __ldg(const T* p) { return *p; }
template <class T>
T __ldcg(const T* p) {  // cached in L2 only: here, a load whose address must be aligned as T
  if (reinterpret_cast<std::uintptr_t>(p) % alignof(T) != 0) ::gradzip_simt::fault("__ldcg of a misaligned address");
  return *p;
}

// ---- atomics ----
#define GRADZIP_SIMT_ATOMIC(name, type, expr) \
  inline type name(type* address, type val) { \
    return ::gradzip_simt::atomic_update(address, [val](type old) { \
      static_cast<void>(old);                                          \
      return static_cast<type>(expr);                                  \
    });                                                                \
  }
GRADZIP_SIMT_ATOMIC(atomicAdd, int, old + val)
GRADZIP_SIMT_ATOMIC(atomicAdd, unsigned int, old + val)
GRADZIP_SIMT_ATOMIC(atomicAdd, unsigned long long, old + val)
GRADZIP_SIMT_ATOMIC(atomicAdd, float, old + val)
GRADZIP_SIMT_ATOMIC(atomicAdd, double, old + val)
GRADZIP_SIMT_ATOMIC(atomicSub, int, old - val)
GRADZIP_SIMT_ATOMIC(atomicSub, unsigned int, old - val)
GRADZIP_SIMT_ATOMIC(atomicExch, int, val)
GRADZIP_SIMT_ATOMIC(atomicExch, unsigned int, val)
GRADZIP_SIMT_ATOMIC(atomicExch, unsigned long long, val)
GRADZIP_SIMT_ATOMIC(atomicExch, float, val)
GRADZIP_SIMT_ATOMIC(atomicMin, int, val < old ? val : old)
GRADZIP_SIMT_ATOMIC(atomicMin, unsigned int, val < old ? val : old)
GRADZIP_SIMT_ATOMIC(atomicMin, long long, val < old ? val : old)
GRADZIP_SIMT_ATOMIC(atomicMin, unsigned long long, val < old ? val : old)
GRADZIP_SIMT_ATOMIC(atomicMax, int, val > old ? val : old)
GRADZIP_SIMT_ATOMIC(atomicMax, unsigned int, val > old ? val : old)
GRADZIP_SIMT_ATOMIC(atomicMax, long long, val > old ? val : old)
GRADZIP_SIMT_ATOMIC(atomicMax, unsigned long long, val > old ? val : old)
GRADZIP_SIMT_ATOMIC(atomicAnd, int, old & val)
GRADZIP_SIMT_ATOMIC(atomicAnd, unsigned int, old & val)
GRADZIP_SIMT_ATOMIC(atomicAnd, unsigned long long, old & val)
GRADZIP_SIMT_ATOMIC(atomicOr, int, old | val)
GRADZIP_SIMT_ATOMIC(atomicOr, unsigned int, old | val)
GRADZIP_SIMT_ATOMIC(atomicOr, unsigned long long, old | val)
GRADZIP_SIMT_ATOMIC(atomicXor, int, old ^ val)
GRADZIP_SIMT_ATOMIC(atomicXor, unsigned int, old ^ val)
GRADZIP_SIMT_ATOMIC(atomicXor, unsigned long long, old ^ val)
#undef GRADZIP_SIMT_ATOMIC
inline unsigned atomicInc(unsigned* address, unsigned val) {
  return ::gradzip_simt::atomic_update(address, [val](unsigned old) { return old >= val ? 0u : old + 1; });
}
inline int atomicCAS(int* address, int compare, int val) {
  return ::gradzip_simt::atomic_update(address, [&](int old) { return old == compare ? val : old; });
}
inline unsigned atomicCAS(unsigned* address, unsigned compare, unsigned val) {
  return ::gradzip_simt::atomic_update(address, [&](unsigned old) { return old == compare ? val : old; });
}
inline unsigned long long atomicCAS(unsigned long long* address, unsigned long long compare, unsigned long long val) {
  return ::gradzip_simt::atomic_update(address,
                                       [&](unsigned long long old) { return old == compare ? val : old; });
}
