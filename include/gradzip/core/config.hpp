/**
 * @file config.hpp
 * @brief Compiler macros shared by every gradzip header.
 *
 * `GRADZIP_HOST_DEVICE` marks the functions that hold an algorithm's math once for both
 * executors: under nvcc it expands to `__host__ __device__`, under a host compiler to nothing.
 */
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define GRADZIP_HOST_DEVICE __host__ __device__
#else
#define GRADZIP_HOST_DEVICE
#endif

/// Whether the calling code runs as CUDA device code: nvcc's device pass, or a kernel under the
/// CPU SIMT backend that runs gradzip's device tests without a GPU (tests/simt, which defines
/// GRADZIP_SIMT). A device-only path (an aligned typed store, say) is chosen by
/// `if (GRADZIP_DEVICE_CODE())`, so the SIMT backend executes the path a GPU would; `__CUDA_ARCH__`
/// stays only around intrinsics with an exact host twin.
#if defined(__CUDA_ARCH__)
#define GRADZIP_DEVICE_CODE() true
#elif defined(GRADZIP_SIMT)
#define GRADZIP_DEVICE_CODE() (::gradzip_simt::in_kernel())
#else
#define GRADZIP_DEVICE_CODE() false
#endif

#define GRADZIP_VERSION_MAJOR 0
#define GRADZIP_VERSION_MINOR 1
#define GRADZIP_VERSION_PATCH 0

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gradzip payloads store values in native byte order, which must be little-endian"
#endif

static_assert(sizeof(std::size_t) == 8, "gradzip needs 64-bit sizes (a 64-bit target)");

#if !defined(__SIZEOF_INT128__)
#error "gradzip needs a compiler with unsigned __int128 (GCC, Clang, nvcc)"
#endif

namespace gradzip::detail {

__extension__ typedef unsigned __int128 uint128;  // __extension__: no -Wpedantic warning

/// The high 64 bits of a x b.
GRADZIP_HOST_DEVICE inline std::uint64_t mul_hi64(std::uint64_t a, std::uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  return static_cast<std::uint64_t>((static_cast<uint128>(a) * b) >> 64);
#endif
}

}  // namespace gradzip::detail

namespace gradzip::detail {

/// Set bits of x.
GRADZIP_HOST_DEVICE inline int popcount64(std::uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __popcll(x);
#else
  return __builtin_popcountll(x);
#endif
}

/// Index of the lowest set bit of x, which must not be 0.
GRADZIP_HOST_DEVICE inline int lowest_bit64(std::uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __ffsll(static_cast<long long>(x)) - 1;
#else
  return __builtin_ctzll(x);
#endif
}

}  // namespace gradzip::detail

namespace gradzip::detail {

// a * b and a + b (F = float or double), each rounded to nearest once and never fused with a
// neighbour into an FMA. nvcc contracts a plain `a * b + c` by default (--fmad=true), and its result then differs
// from the host's in the last bit; the device's __fmul_rn and __fadd_rn are never contracted.
// Host compilers contract only when the target has FMA instructions (-march=haswell and up,
// with GCC's default -ffp-contract=fast), and gradzip's CMake target passes -ffp-contract=off.
// Where a fused result is wanted, the code says fmaf / fma. tools/check_kernels.py fails on
// any contraction nvcc makes in gradzip's kernels.
template <class F>
GRADZIP_HOST_DEVICE inline F mul_rn(F a, F b) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(F) == 4) return __fmul_rn(a, b); else return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
template <class F>
GRADZIP_HOST_DEVICE inline F add_rn(F a, F b) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(F) == 4) return __fadd_rn(a, b); else return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
// a / b and sqrt(a) for float, correctly rounded on the device even under --use_fast_math
// (which makes `/` and sqrtf approximate there); the host's are IEEE already.
GRADZIP_HOST_DEVICE inline float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
GRADZIP_HOST_DEVICE inline float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

}  // namespace gradzip::detail

/// Before a GRADZIP_HOST_DEVICE function template that calls a functor: host code may pass it
/// a host-only functor (a lambda), which is fine, and nvcc would otherwise warn about every such
/// instantiation (#20013).
#if defined(__CUDACC__)
#define GRADZIP_EXEC_CHECK_DISABLE _Pragma("nv_exec_check_disable")
#else
#define GRADZIP_EXEC_CHECK_DISABLE
#endif
