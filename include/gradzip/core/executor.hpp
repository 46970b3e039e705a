/**
 * @file executor.hpp
 * @brief `gradzip::host`, the CPU executor.
 *
 * An executor says where work runs and owns the scratch memory that work needs. The host
 * executor runs loops on the calling thread, or on `threads` OpenMP threads when gradzip is
 * compiled with OpenMP (0 = OpenMP's default). Results never depend on the thread count.
 *
 * Scratch memory grows to the largest size asked for and is then reused, so a training loop
 * allocates once; `reserve` does that growth up front. An executor serves one thread at a time.
 *
 * @code
 * gradzip::host exec;                   // or gradzip::host exec{2};
 * exec.reserve(codec.workspace_bytes<float>(exec, n));
 * codec.compress(exec, gradzip::span<const float>(grad), out);   // allocates nothing
 * @endcode
 *
 * The CUDA twin, `gradzip::cuda{stream}`, lives in `gradzip/core/cuda.cuh`.
 */
#pragma once

#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "gradzip/core/element_type.hpp"
#include "gradzip/core/error.hpp"
#include "gradzip/core/span.hpp"

namespace gradzip {

class host {
 public:
  /// threads: OpenMP threads to use (0 = OpenMP's default; ignored without OpenMP).
  explicit host(int threads = 0) : threads_(threads) {
    GRADZIP_EXPECTS(threads >= 0, "host: threads must be >= 0, got ", threads);
  }
  host(const host&) = delete;
  host& operator=(const host&) = delete;
  /// A moved-from executor keeps its thread count and has no scratch (it grows it again).
  host(host&& o) noexcept
      : threads_(o.threads_), scratch_(std::move(o.scratch_)), capacity_(std::exchange(o.capacity_, 0)) {}
  host& operator=(host&& o) noexcept {
    threads_ = o.threads_;
    scratch_ = std::move(o.scratch_);
    capacity_ = std::exchange(o.capacity_, 0);
    return *this;
  }

  /// Threads the loops will use: `threads` if given, else OpenMP's default; 1 when gradzip is
  /// compiled without OpenMP (see the README: link gradzip::gradzip with OpenMP found).
  int threads() const noexcept {
#if defined(_OPENMP)
    return threads_ > 0 ? threads_ : omp_get_max_threads();
#else
    return 1;
#endif
  }

  /// Grows scratch memory to at least `bytes` now, so later calls that need at most `bytes`
  /// (a codec's workspace_bytes) allocate nothing.
  void reserve(std::size_t bytes) {
    if (bytes <= capacity_) return;
    scratch_.reset(static_cast<std::byte*>(::operator new[](bytes, std::align_val_t{alignment})));
    capacity_ = bytes;
  }

  std::size_t scratch_capacity() const noexcept { return capacity_; }

  /// Scratch of at least `bytes` bytes, 64-byte aligned; valid until the next call that grows it.
  std::byte* scratch(std::size_t bytes) {
    reserve(bytes);
    return scratch_.get();
  }

 private:
  static constexpr std::size_t alignment = 64;
  struct aligned_delete {
    void operator()(std::byte* p) const noexcept { ::operator delete[](p, std::align_val_t{alignment}); }
  };

  int threads_;
  std::unique_ptr<std::byte[], aligned_delete> scratch_;
  std::size_t capacity_ = 0;
};

namespace detail {

/// `bytes` rounded up to a multiple of 256: where the next sub-buffer of an executor's scratch
/// may start (CUB's storage and vector loads want that alignment).
GRADZIP_HOST_DEVICE constexpr std::size_t scratch_aligned(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

/// The arithmetic of a state of T: double for double, float for float and the half types.
template <class T>
using state_arithmetic = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// a b + c with one rounding, in W (fmaf for float, fma for double).
template <class W>
GRADZIP_HOST_DEVICE inline W fused_multiply_add(W a, W b, W c) {
  if constexpr (std::is_same_v<W, double>) {
    return fma(a, b, c);
  } else {
    return fmaf(a, b, c);
  }
}

/// beta m + rest g (rest = 1 - beta, in W), one rounding after the product rest g.
template <class W>
GRADZIP_HOST_DEVICE inline W momentum_step(W m, W g, W beta, W rest) {
  return fused_multiply_add(beta, m, rest * g);
}
/// DGC's momentum correction: u <- m u + g, then v <- v + u (one rounding each, in W).
template <class W>
GRADZIP_HOST_DEVICE inline void correction_step(W& u, W& v, W g, W m) {
  u = fused_multiply_add(m, u, g);
  v = v + u;
}
/// After sending d (the decoded payload): v <- v - d, and u <- 0 where d is nonzero.
template <class W>
GRADZIP_HOST_DEVICE inline void mask_step(W& u, W& v, W d) {
  v = v - d;
  if (d != W(0)) u = W(0);
}
GRADZIP_HOST_DEVICE inline float sign_of(float v) {
  return v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : v);
}

/**
 * executor_ops<Exec>: the memory operations a stateful wrapper needs from an executor, so that
 * one template (error feedback, say) serves host and CUDA. Specialized here for `host` and in
 * `core/cuda.cuh` for `cuda`.
 */
template <class Exec>
struct executor_ops;

template <>
struct executor_ops<host> {
  template <class T>
  using buffer = std::vector<T>;

  template <class T>
  static buffer<T> allocate_zeroed(host&, std::size_t n) { return buffer<T>(n); }

  template <class T>
  static span<T> view(buffer<T>& b) { return span<T>(b.data(), b.size()); }

  /// y += x, element by element (in float for half types).
  template <class T>
  static void add(host&, span<T> y, span<const T> x) {
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = from_double<T>(to_float(y[i]) + to_float(x[i]));
  }

  /// d <- x - y, element by element (in float for half types).
  template <class T>
  static void subtract(host&, span<T> d, span<const T> x, span<const T> y) {
    for (std::size_t i = 0; i < d.size(); ++i) d[i] = from_double<T>(to_float(x[i]) - to_float(y[i]));
  }

  /// s <- s + a; a <- s (a running sum handed back in place: EF21's estimate).
  template <class T>
  static void running_sum(host&, span<T> s, span<T> a) {
    for (std::size_t i = 0; i < s.size(); ++i) a[i] = s[i] = from_double<T>(to_float(s[i]) + to_float(a[i]));
  }

  /// m <- beta m + (1 - beta) g, as fma(beta, m, (1 - beta) g) in the state's arithmetic (float,
  /// or double for double; CUDA does the same).
  template <class T>
  static void momentum(host&, span<T> m, span<const T> g, float beta) {
    using W = state_arithmetic<T>;
    const W b = beta, rest = W(1) - b;
    for (std::size_t i = 0; i < m.size(); ++i) {
      m[i] = from_double<T>(momentum_step<W>(to_float(m[i]), to_float(g[i]), b, rest));
    }
  }

  /// u <- m u + g; v <- v + u (momentum_correction's accumulation).
  template <class T>
  static void correct_momentum(host&, span<T> u, span<T> v, span<const T> g, float m) {
    using W = state_arithmetic<T>;
    for (std::size_t i = 0; i < u.size(); ++i) {
      W a = to_float(u[i]), b = to_float(v[i]);
      correction_step<W>(a, b, to_float(g[i]), m);
      u[i] = from_double<T>(a);
      v[i] = from_double<T>(b);
    }
  }

  /// v <- v - d; u <- 0 where d != 0 (momentum_correction's masking after a send).
  template <class T>
  static void mask_sent(host&, span<T> u, span<T> v, span<const T> d) {
    using W = state_arithmetic<T>;
    for (std::size_t i = 0; i < u.size(); ++i) {
      W a = to_float(u[i]), b = to_float(v[i]);
      mask_step<W>(a, b, to_float(d[i]));
      u[i] = from_double<T>(a);
      v[i] = from_double<T>(b);
    }
  }

  /// y <- sign(y): +1, -1, or 0 for zero (and NaN stays NaN).
  template <class T>
  static void sign(host&, span<T> y) {
    for (auto& v : y) v = from_double<T>(sign_of(to_float(v)));
  }

  template <class T>
  static void copy_to_host(host&, const buffer<T>& from, T* to) {
    if (!from.empty()) std::memcpy(to, from.data(), from.size() * sizeof(T));
  }

  template <class T>
  static void copy_from_host(host&, const T* from, buffer<T>& to) {
    if (!to.empty()) std::memcpy(to.data(), from, to.size() * sizeof(T));
  }

  /// Orders the executor's work before, and after, work on another CUDA stream (a device
  /// communicator's): nothing to order on the host, which has finished its work on return.
  static void hand_over(host&, void*) {}
  static void take_back(host&, void*) {}
};

}  // namespace detail
}  // namespace gradzip
