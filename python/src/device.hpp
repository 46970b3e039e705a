// The Python module's CUDA side, as the host-compiled module.cpp sees it: interfaces only, no
// CUDA header. The implementations (device.cuh, device.cu) exist in GRADZIP_PYTHON_CUDA builds,
// whose codec translation units nvcc compiles.
#pragma once

#include <gradzip/core/span.hpp>
#include <gradzip/quantize/bucket_stats.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace gradzip_py {

/// gradzip::cuda on one device, on a stream of its own: each call is ordered after the caller's
/// stream (torch's current stream) by an event, and the caller's later work after the call's, so
/// one executor (its scratch, status word and the residuals it holds) serves every stream of its
/// device. Opaque here: defined in device.cuh.
class device_executor;

struct device_executor_deleter {
  void operator()(device_executor* e) const noexcept;
};
using device_executor_ptr = std::unique_ptr<device_executor, device_executor_deleter>;

/// An executor on CUDA device `device`.
device_executor_ptr make_device_executor(int device);

/// Error feedback around a codec for CUDA tensors of one size: the residual lives on the device
/// the feedback was made on. save() writes the host's format (a CPU feedback restores it).
class any_device_feedback {
 public:
  virtual ~any_device_feedback() = default;
  virtual int device() const = 0;
  virtual std::size_t compress(device_executor& exec, std::uintptr_t stream, gradzip::span<const float> grad,
                               gradzip::span<std::byte> out, gradzip::quantize::compress_context ctx) = 0;
  virtual std::vector<std::byte> save(device_executor& exec, std::uintptr_t stream) const = 0;
  virtual void restore(device_executor& exec, std::uintptr_t stream, gradzip::span<const std::byte> state) = 0;
};

/// A codec on CUDA tensors: device pointers in, device pointers out, each call ordered with the
/// caller's `stream` (a cudaStream_t as an integer; 0 is the legacy default stream). Every decode
/// validates the payload on the device and then waits for it, so that a bad payload raises from
/// the call that read it (gradzip::format_error) with the output unchanged.
class any_device_codec {
 public:
  using payloads = gradzip::span<const gradzip::span<const std::byte>>;
  virtual ~any_device_codec() = default;
  virtual std::size_t compress(device_executor& exec, std::uintptr_t stream, gradzip::span<const float> x,
                               gradzip::span<std::byte> out, gradzip::quantize::compress_context ctx) const = 0;
  virtual void decompress(device_executor& exec, std::uintptr_t stream, gradzip::span<const std::byte> payload,
                          gradzip::span<float> out) const = 0;
  virtual void decompress_add(device_executor& exec, std::uintptr_t stream, gradzip::span<const std::byte> payload,
                              gradzip::span<float> accum, float alpha) const = 0;
  /// accum <- accum + alpha * each payload's decode, in order; all validated before accum changes,
  /// a bad one named by its position ("payload 2 of 4: ...").
  virtual void decompress_add_all(device_executor& exec, std::uintptr_t stream, payloads all,
                                  gradzip::span<float> accum, float alpha) const = 0;
  /// out <- the sum of every payload's decode, all validated before out changes.
  virtual void decompress_all(device_executor& exec, std::uintptr_t stream, payloads all,
                              gradzip::span<float> out) const = 0;
  /// A residual of n zeros on the executor's device.
  virtual std::unique_ptr<any_device_feedback> error_feedback(device_executor& exec, std::size_t n) const = 0;
};

}  // namespace gradzip_py
