// executor_ops<cuda>: device buffers and element-wise work for stateful wrappers.
#pragma once

#include "gradzip/core/element_type.hpp"
#include "gradzip/detail/cuda/status_word.cuh"
#include "gradzip/wire/format.hpp"

namespace gradzip::detail {

/// The stateful wrappers' element-wise kernels (error feedback, momentum, sign): one element per
/// thread and grid-stride step.
using elementwise_policy = launch_policy<256, 1, 8>;

template <class T>
__global__ __launch_bounds__(elementwise_policy::threads)
void add_kernel(T* y, const T* x, std::uint64_t n) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = from_double<T>(to_float(y[i]) + to_float(x[i]));  // the host's arithmetic exactly
  }
}

template <class T>
__global__ __launch_bounds__(elementwise_policy::threads)
void subtract_kernel(T* d, const T* x, const T* y, std::uint64_t n) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    d[i] = from_double<T>(to_float(x[i]) - to_float(y[i]));
  }
}

template <class T>
__global__ __launch_bounds__(elementwise_policy::threads)
void running_sum_kernel(T* s, T* a, std::uint64_t n) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    a[i] = s[i] = from_double<T>(to_float(s[i]) + to_float(a[i]));
  }
}

template <class T>
__global__ __launch_bounds__(elementwise_policy::threads)
void momentum_kernel(T* m, const T* g, std::uint64_t n, float beta) {
  using W = state_arithmetic<T>;
  const W b = beta, rest = W(1) - b;  // as the host's executor_ops<host>::momentum
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    m[i] = from_double<T>(momentum_step<W>(to_float(m[i]), to_float(g[i]), b, rest));
  }
}

template <class T>
__global__ __launch_bounds__(elementwise_policy::threads)
void correct_momentum_kernel(T* u, T* v, const T* g, std::uint64_t n, float m) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    state_arithmetic<T> a = to_float(u[i]), b = to_float(v[i]);
    correction_step<state_arithmetic<T>>(a, b, to_float(g[i]), m);
    u[i] = from_double<T>(a);
    v[i] = from_double<T>(b);
  }
}

template <class T>
__global__ __launch_bounds__(elementwise_policy::threads)
void mask_sent_kernel(T* u, T* v, const T* d, std::uint64_t n) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    state_arithmetic<T> a = to_float(u[i]), b = to_float(v[i]);
    mask_step<state_arithmetic<T>>(a, b, to_float(d[i]));
    u[i] = from_double<T>(a);
    v[i] = from_double<T>(b);
  }
}

template <class T>
__global__ __launch_bounds__(elementwise_policy::threads)
void sign_kernel(T* y, std::uint64_t n, const wire::status* st) {
  if (failure_recorded(st)) return;  // a decode before failed: change nothing
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = from_double<T>(sign_of(to_float(y[i])));
  }
}

template <>
struct executor_ops<cuda> {
  template <class T>
  using buffer = device_buffer<T>;

  template <class T>
  static buffer<T> allocate_zeroed(cuda& exec, std::size_t n) {
    buffer<T> b(n);
    if (n != 0) GRADZIP_CUDA_TRY(cudaMemsetAsync(b.data(), 0, n * sizeof(T), exec.stream()));
    return b;
  }

  template <class T>
  static span<T> view(buffer<T>& b) { return span<T>(b.data(), b.size()); }

  template <class T>
  static void add(cuda& exec, span<T> y, span<const T> x) {
    if (y.empty()) return;
    launch_over<elementwise_policy>(exec, y.size(), add_kernel<T>, y.data(), x.data(), y.size());
  }

  template <class T>
  static void subtract(cuda& exec, span<T> d, span<const T> x, span<const T> y) {
    if (d.empty()) return;
    launch_over<elementwise_policy>(exec, d.size(), subtract_kernel<T>, d.data(), x.data(),
                                    y.data(), d.size());
  }

  template <class T>
  static void running_sum(cuda& exec, span<T> s, span<T> a) {
    if (s.empty()) return;
    launch_over<elementwise_policy>(exec, s.size(), running_sum_kernel<T>, s.data(), a.data(),
                                    s.size());
  }

  template <class T>
  static void momentum(cuda& exec, span<T> m, span<const T> g, float beta) {
    if (m.empty()) return;
    launch_over<elementwise_policy>(exec, m.size(), momentum_kernel<T>, m.data(), g.data(),
                                    m.size(), beta);
  }

  template <class T>
  static void correct_momentum(cuda& exec, span<T> u, span<T> v, span<const T> g, float m) {
    if (u.empty()) return;
    launch_over<elementwise_policy>(exec, u.size(), correct_momentum_kernel<T>, u.data(), v.data(),
                                    g.data(), u.size(), m);
  }

  template <class T>
  static void mask_sent(cuda& exec, span<T> u, span<T> v, span<const T> d) {
    if (u.empty()) return;
    launch_over<elementwise_policy>(exec, u.size(), mask_sent_kernel<T>, u.data(), v.data(),
                                    d.data(), u.size());
  }

  template <class T>
  static void sign(cuda& exec, span<T> y) {
    if (y.empty()) return;
    launch_over<elementwise_policy>(exec, y.size(), sign_kernel<T>, y.data(), y.size(),
                                    exec.status_word());
  }

  template <class T>
  static void copy_to_host(cuda& exec, const buffer<T>& from, T* to) {
    if (from.size() == 0) return;
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(to, from.data(), from.size() * sizeof(T),
                                     cudaMemcpyDeviceToHost, exec.stream()));
    exec.synchronize();
  }

  /// Work queued later on `stream` (a communicator's) waits for the work queued on exec's so far.
  static void hand_over(cuda& exec, void* stream) {
    if (stream != nullptr && stream != exec.stream()) exec.order_before(static_cast<cudaStream_t>(stream));
  }
  /// Work queued later on exec's stream waits for the work queued on `stream` so far.
  static void take_back(cuda& exec, void* stream) {
    if (stream != nullptr && stream != exec.stream()) exec.order_after(static_cast<cudaStream_t>(stream));
  }

  template <class T>
  static void copy_from_host(cuda& exec, const T* from, buffer<T>& to) {
    if (to.size() == 0) return;
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(to.data(), from, to.size() * sizeof(T),
                                     cudaMemcpyHostToDevice, exec.stream()));
    exec.synchronize();  // `from` may be a temporary
  }
};

}  // namespace gradzip::detail
