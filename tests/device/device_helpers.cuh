// What every device test file needs: the GPU check that lets a test report itself skipped, a
// device buffer, and the bit-exact comparison of a device's outputs with the host's.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gradzip/gradzip.cuh"

namespace gz = gradzip;

namespace {

bool has_gpu() {
  int count = 0;  // cudaGetDeviceCount leaves it unset when no driver is present
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

#define REQUIRE_GPU()         \
  if (!has_gpu()) {           \
    WARN("GRADZIP_NO_GPU");   \
    return;                   \
  }

template <class T>
std::string bits_of(const T& x) {
  std::uint64_t word = 0;
  std::memcpy(&word, &x, sizeof(T));
  std::ostringstream s;
  s << "0x" << std::hex << std::setw(2 * sizeof(T)) << std::setfill('0') << word << std::dec << " ("
    << static_cast<double>(gz::to_float(x)) << ")";
  return s.str();
}

/**
 * "" when the device's outputs are the host's bit for bit, NaNs aside; else the first difference.
 * A NaN must meet a NaN, whatever its bits: an x86 operation keeps a NaN operand's payload and
 * makes a NaN of its own for an invalid one such as inf * 0, where a GPU returns its canonical
 * NaN. The first H100 run (2026-11-25) failed on this alone, decoding buckets whose scale is not
 * finite: the device wrote 0x7fffffff (fp32) and 0x7fffffffe0000000 (fp64) where the host wrote
 * 0x7fc00000 and 0x7ff8000000000000. The first NaN that differs is printed to stderr.
 */
template <class T>
std::string output_difference(const T* got, const T* want, std::size_t n) {
  const auto nan = [](const T& x) { return std::isnan(static_cast<double>(gz::to_float(x))); };
  std::size_t count = 0, first = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::memcmp(got + i, want + i, sizeof(T)) == 0) continue;
    if (nan(got[i]) && nan(want[i])) {
      static bool told = false;  // once per run, for the log: which NaNs the two executors make
      if (!told) std::fprintf(stderr, "NaN bits differ: device %s, host %s\n", bits_of(got[i]).c_str(), bits_of(want[i]).c_str());
      told = true;
      continue;
    }
    if (count++ == 0) first = i;
  }
  if (count == 0) return {};
  std::ostringstream s;
  s << count << " of " << n << " outputs differ; the first, [" << first << "]: device " << bits_of(got[first])
    << ", host " << bits_of(want[first]);
  return s.str();
}

template <class T>
struct device_vector {
  T* data = nullptr;
  std::size_t size = 0;
  explicit device_vector(std::size_t n) : size(n) {
    GRADZIP_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&data), n * sizeof(T) + 16));
  }
  explicit device_vector(const std::vector<T>& h) : device_vector(h.size()) {
    GRADZIP_CUDA_TRY(cudaMemcpy(data, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  device_vector(const device_vector&) = delete;
  device_vector& operator=(const device_vector&) = delete;
  device_vector(device_vector&& o) noexcept : data(std::exchange(o.data, nullptr)), size(std::exchange(o.size, 0)) {}
  device_vector& operator=(device_vector&&) = delete;
  ~device_vector() { cudaFree(data); }
  /// The first `count` elements (all of them by default).
  std::vector<T> download(std::size_t count = static_cast<std::size_t>(-1)) const {
    std::vector<T> h(std::min(count, size));
    GRADZIP_CUDA_TRY(cudaMemcpy(h.data(), data, h.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  gz::span<T> view() const { return gz::span<T>(data, size); }
};
}  // namespace
