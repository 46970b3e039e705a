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

/// gradzip::cuda on one device and one stream (torch's current stream there when the call came).
/// Opaque here: defined in device.cuh.
class device_executor;

struct device_executor_deleter {
  void operator()(device_executor* e) const noexcept;
};
using device_executor_ptr = std::unique_ptr<device_executor, device_executor_deleter>;

/// An executor on CUDA device `device` whose work goes to `stream` (a cudaStream_t as an
/// integer; 0 is the legacy default stream).
device_executor_ptr make_device_executor(int device, std::uintptr_t stream);

/// Error feedback around a codec for CUDA tensors of one size: the residual lives on the device
/// the feedback was made on. save() writes the host's format (a CPU feedback restores it).
class any_device_feedback {
 public:
  virtual ~any_device_feedback() = default;
  virtual int device() const = 0;
  virtual std::size_t compress(device_executor& exec, gradzip::span<const float> grad, gradzip::span<std::byte> out,
                               gradzip::quantize::compress_context ctx) = 0;
  virtual std::vector<std::byte> save(device_executor& exec) const = 0;
  virtual void restore(device_executor& exec, gradzip::span<const std::byte> state) = 0;
};

/// A codec on CUDA tensors: device pointers in, device pointers out. Every decode validates the
/// payload on the device and then synchronizes its stream, so that a bad payload raises from the
/// call that read it (gradzip::format_error) with the output unchanged.
class any_device_codec {
 public:
  virtual ~any_device_codec() = default;
  virtual std::size_t compress(device_executor& exec, gradzip::span<const float> x, gradzip::span<std::byte> out,
                               gradzip::quantize::compress_context ctx) const = 0;
  virtual void decompress(device_executor& exec, gradzip::span<const std::byte> payload,
                          gradzip::span<float> out) const = 0;
  virtual void decompress_add(device_executor& exec, gradzip::span<const std::byte> payload, gradzip::span<float> accum,
                              float alpha) const = 0;
  /// accum <- accum + alpha * each payload's decode, in order; all validated before accum changes,
  /// a bad one named by its position ("payload 2 of 4: ...").
  virtual void decompress_add_all(device_executor& exec, gradzip::span<const gradzip::span<const std::byte>> payloads,
                                  gradzip::span<float> accum, float alpha) const = 0;
  /// out <- the sum of every payload's decode, all validated before out changes.
  virtual void decompress_all(device_executor& exec, gradzip::span<const gradzip::span<const std::byte>> payloads,
                              gradzip::span<float> out) const = 0;
  virtual std::unique_ptr<any_device_feedback> error_feedback(device_executor& exec, std::size_t n) const = 0;
};

}  // namespace gradzip_py
