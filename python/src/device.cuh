// The Python module's codecs on CUDA tensors: each call is the C++ codec's own call on
// gradzip::cuda (no copies, the same bytes as the CPU path) on the executor's stream, ordered
// with the caller's stream by events, and waited for wherever a payload was read, so that a bad
// payload raises from the call that read it.
// Compiled by nvcc in GRADZIP_PYTHON_CUDA builds (codecs_*.cpp, device.cu), and by the SIMT
// backend's g++ in tests/device/test_python_device.cu.
#pragma once

#include <gradzip/gradzip.cuh>

#include <new>
#include <optional>

#include "device.hpp"
#include "erased.hpp"

namespace gradzip_py {

/// Makes `device` current for its lifetime (calls may come from any thread: DDP's callbacks run on
/// the communication library's threads), then restores the previous one. The nothrow form is for
/// destructors: it ignores errors instead of throwing them.
class current_device {
 public:
  explicit current_device(int device) : device_(device) {
    GRADZIP_CUDA_TRY(cudaGetDevice(&previous_));
    if (previous_ != device_) GRADZIP_CUDA_TRY(cudaSetDevice(device_));
  }
  current_device(int device, std::nothrow_t) noexcept : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = device_;
    if (previous_ != device_) GRADZIP_CUDA_TRY_NO_THROW(cudaSetDevice(device_));
  }
  ~current_device() {
    if (previous_ != device_) GRADZIP_CUDA_TRY_NO_THROW(cudaSetDevice(previous_));
  }
  current_device(const current_device&) = delete;
  current_device& operator=(const current_device&) = delete;

 private:
  int device_;
  int previous_ = 0;
};

class device_executor {
 public:
  explicit device_executor(int device) : device_(device) {
    current_device on(device_);
    GRADZIP_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    GRADZIP_CUDA_TRY(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    exec_.emplace(stream_);
  }
  ~device_executor() {
    current_device on(device_, std::nothrow);
    exec_.reset();  // frees its scratch and status word on its own stream, and waits for it
    spare_ = gz::detail::device_buffer<float>();
    GRADZIP_CUDA_TRY_NO_THROW(cudaEventDestroy(done_));
    GRADZIP_CUDA_TRY_NO_THROW(cudaStreamDestroy(stream_));
  }
  device_executor(const device_executor&) = delete;
  device_executor& operator=(const device_executor&) = delete;

  int device() const { return device_; }
  gz::cuda& exec() { return *exec_; }

  /// The caller's later work waits for the work queued here so far (no host synchronization).
  void release_to(cudaStream_t caller) noexcept {
    GRADZIP_CUDA_TRY_NO_THROW(cudaEventRecord(done_, stream_));
    GRADZIP_CUDA_TRY_NO_THROW(cudaStreamWaitEvent(caller, done_, 0));
  }

  /// A float buffer of at least n elements on this device, apart from the executor's scratch
  /// (which every decode uses): grows, never shrinks. Used on the executor's stream only.
  gz::span<float> spare(std::size_t n) {
    if (spare_.size() < n) spare_ = gz::detail::device_buffer<float>(n);
    return gz::span<float>(spare_.data(), n);
  }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  std::optional<gz::cuda> exec_;
  gz::detail::device_buffer<float> spare_;
};

/// One call from the caller's stream (torch's current stream, as an integer): the executor's
/// device made current, its stream made to wait for the caller's work so far, and, when the call
/// ends (by an exception too), the caller's later work made to wait for the call's. Memory the
/// caller's allocator frees after the call is then reused only after the call has read it.
class call_scope {
 public:
  call_scope(device_executor& d, std::uintptr_t caller)
      : on_(d.device()), d_(d), caller_(reinterpret_cast<cudaStream_t>(caller)) {
    d_.exec().order_after(caller_);
  }
  ~call_scope() { d_.release_to(caller_); }
  call_scope(const call_scope&) = delete;
  call_scope& operator=(const call_scope&) = delete;

 private:
  current_device on_;
  device_executor& d_;
  cudaStream_t caller_;
};

namespace detail {

/// Runs check(i) for each payload i after its decode has been queued, so that the first bad one
/// is named: "payload 2 of 4: ..." (the host's wording).
template <class F>
void name_bad_payload(std::size_t count, F&& check) {
  std::size_t m = 0;
  try {
    for (; m < count; ++m) check(m);
  } catch (const gz::format_error& e) {
    throw gz::format_error(e.code(), gz::detail::concat("payload ", m, " of ", count, ": ", e.what()));
  }
}

/// Raises the failure of the decode queued by decode() here; when decode() itself throws something
/// else (a misaligned payload, found while queuing), first clears any failure an earlier queued
/// check recorded, so that the executor's next call does not report it.
template <class F>
void decode_and_check(device_executor& d, F&& decode) {
  try {
    decode();
  } catch (const gz::format_error&) {
    throw;
  } catch (...) {
    try {
      d.exec().check();
    } catch (const gz::format_error&) {
    }
    throw;
  }
  d.exec().check();
}

}  // namespace detail

template <class Codec>
class erased_device_feedback final : public any_device_feedback {
 public:
  erased_device_feedback(device_executor& d, const Codec& codec, std::size_t n) : device_(d.device()) {
    current_device on(device_);
    ef_.emplace(d.exec(), codec, n);  // zeroed on the executor's stream, as every later call runs
  }
  ~erased_device_feedback() override {
    current_device on(device_, std::nothrow);
    ef_.reset();  // the residual is freed on its own device
  }

  int device() const override { return device_; }
  std::size_t compress(device_executor& d, std::uintptr_t stream, gz::span<const float> grad,
                       gz::span<std::byte> out, gz::quantize::compress_context ctx) override {
    call_scope call(d, stream);
    return ef_->compress(d.exec(), grad, out, ctx);
  }
  std::vector<std::byte> save(device_executor& d, std::uintptr_t stream) const override {
    call_scope call(d, stream);
    return ef_->save(d.exec());
  }
  void restore(device_executor& d, std::uintptr_t stream, bytes_view state) override {
    call_scope call(d, stream);
    ef_->restore(d.exec(), state);
  }

 private:
  int device_;
  std::optional<gz::feedback::error_feedback<Codec, float, gz::cuda>> ef_;
};

template <class Codec>
class erased_device_codec final : public any_device_codec {
 public:
  explicit erased_device_codec(const Codec& codec) : codec_(codec) {}

  std::size_t compress(device_executor& d, std::uintptr_t stream, gz::span<const float> x, gz::span<std::byte> out,
                       gz::quantize::compress_context ctx) const override {
    call_scope call(d, stream);
    return codec_.compress(d.exec(), x, out, ctx);
  }
  void decompress(device_executor& d, std::uintptr_t stream, bytes_view payload, gz::span<float> out) const override {
    call_scope call(d, stream);
    detail::decode_and_check(d, [&] { codec_.decompress(d.exec(), payload, out); });
  }
  void decompress_add(device_executor& d, std::uintptr_t stream, bytes_view payload, gz::span<float> accum,
                      float alpha) const override {
    call_scope call(d, stream);
    detail::decode_and_check(d, [&] { codec_.decompress_add(d.exec(), payload, accum, alpha); });
  }
  void decompress_add_all(device_executor& d, std::uintptr_t stream, payloads all, gz::span<float> accum,
                          float alpha) const override {
    call_scope call(d, stream);
    if constexpr (detail::is_codec<Codec>) {  // every check first, then each add
      decode_all_and_check(d, all, accum.size(), [&] { codec_.decompress_add_all(d.exec(), all, accum, alpha); });
    } else {
      // SimHash and the rotations have no check-only pass: the payloads are added into a copy of
      // accum, each checked as it goes, and the copy is written back once all have passed.
      gz::span<float> copy = copy_to_spare(d, accum);
      detail::name_bad_payload(all.size(), [&](std::size_t m) {
        detail::decode_and_check(d, [&] { codec_.decompress_add(d.exec(), all[m], copy, alpha); });
      });
      copy_back(d, copy, accum);
    }
  }
  void decompress_all(device_executor& d, std::uintptr_t stream, payloads all, gz::span<float> out) const override {
    GRADZIP_EXPECTS(!all.empty(), "decompress_all: no payloads");
    call_scope call(d, stream);
    if constexpr (detail::is_codec<Codec>) {
      decode_all_and_check(d, all, out.size(), [&] { codec_.decompress_all(d.exec(), all, out); });
    } else {
      gz::span<float> sum = d.spare(out.size());
      detail::name_bad_payload(all.size(), [&](std::size_t m) {
        detail::decode_and_check(d, [&] {
          if (m == 0) {
            codec_.decompress(d.exec(), all[m], sum);
          } else {
            codec_.decompress_add(d.exec(), all[m], sum, 1.0f);
          }
        });
      });
      copy_back(d, sum, out);
    }
  }
  std::unique_ptr<any_device_feedback> error_feedback(device_executor& d, std::size_t n) const override {
    return std::make_unique<erased_device_feedback<Codec>>(d, codec_, n);
  }

 private:
  /// A multi-payload decode of the library's (every check queued before any write), raised here.
  /// After a failure (the output unchanged) the payloads are checked one at a time, so that the
  /// first bad one's error is thrown with its position.
  template <class F>
  void decode_all_and_check(device_executor& d, payloads all, std::size_t n, F&& decode) const {
    try {
      detail::decode_and_check(d, decode);
    } catch (const gz::format_error&) {
      detail::name_bad_payload(all.size(), [&](std::size_t m) {
        detail::decode_and_check(d, [&] { gz::detail::payload_backend<gz::cuda>::check(d.exec(), codec_, all[m], n); });
      });
      throw;  // none fails alone (not expected: the checks are per payload)
    }
  }

  /// A copy of x in the executor's spare buffer (stream-ordered).
  static gz::span<float> copy_to_spare(device_executor& d, gz::span<const float> x) {
    gz::span<float> copy = d.spare(x.size());
    if (!x.empty()) {
      GRADZIP_CUDA_TRY(cudaMemcpyAsync(copy.data(), x.data(), x.size() * sizeof(float), cudaMemcpyDeviceToDevice,
                                       d.exec().stream()));
    }
    return copy;
  }
  static void copy_back(device_executor& d, gz::span<const float> from, gz::span<float> to) {
    if (from.empty()) return;
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(to.data(), from.data(), from.size() * sizeof(float), cudaMemcpyDeviceToDevice,
                                     d.exec().stream()));
  }

  Codec codec_;
};

template <class Codec>
std::unique_ptr<any_device_codec> make_device_codec(const Codec& codec) {
  return std::make_unique<erased_device_codec<Codec>>(codec);
}

}  // namespace gradzip_py
