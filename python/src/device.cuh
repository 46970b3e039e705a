// The Python module's codecs on CUDA tensors: each call is the C++ codec's own call on
// gradzip::cuda (no copies, the same bytes as the CPU path), then a synchronization of the
// stream wherever a payload was read, so that a bad payload raises from the call that read it.
// Compiled by nvcc in GRADZIP_PYTHON_CUDA builds (codecs_*.cpp, device.cu), and by the SIMT
// backend's g++ in tests/device/test_python_device.cu.
#pragma once

#include <gradzip/gradzip.cuh>

#include <optional>

#include "device.hpp"
#include "erased.hpp"

namespace gradzip_py {

/// Makes `device` current for its lifetime (calls may come from any thread: DDP's callbacks run on
/// the communication library's threads), then restores the previous one.
class current_device {
 public:
  explicit current_device(int device) : device_(device) {
    GRADZIP_CUDA_TRY(cudaGetDevice(&previous_));
    if (previous_ != device_) GRADZIP_CUDA_TRY(cudaSetDevice(device_));
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
  device_executor(int device, cudaStream_t stream) : device_(device) {
    current_device on(device_);
    exec_.emplace(stream);
  }
  ~device_executor() {
    current_device on(device_);
    exec_.reset();  // frees its scratch and status word on its own device
    spare_ = gz::detail::device_buffer<float>();
  }
  device_executor(const device_executor&) = delete;
  device_executor& operator=(const device_executor&) = delete;

  int device() const { return device_; }
  gz::cuda& exec() { return *exec_; }

  /// A float buffer of at least n elements on this device, apart from the executor's scratch
  /// (which every decode uses): grows, never shrinks.
  gz::span<float> spare(std::size_t n) {
    if (spare_.size() < n) {
      current_device on(device_);
      spare_ = gz::detail::device_buffer<float>(n);
    }
    return gz::span<float>(spare_.data(), n);
  }

 private:
  int device_;
  std::optional<gz::cuda> exec_;
  gz::detail::device_buffer<float> spare_;
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

}  // namespace detail

template <class Codec>
class erased_device_feedback final : public any_device_feedback {
 public:
  erased_device_feedback(device_executor& d, const Codec& codec, std::size_t n) : device_(d.device()) {
    current_device on(device_);
    ef_.emplace(d.exec(), codec, n);
  }
  ~erased_device_feedback() override {
    current_device on(device_);
    ef_.reset();  // the residual is freed on its own device
  }

  int device() const override { return device_; }
  std::size_t compress(device_executor& d, gz::span<const float> grad, gz::span<std::byte> out,
                       gz::quantize::compress_context ctx) override {
    current_device on(d.device());
    return ef_->compress(d.exec(), grad, out, ctx);
  }
  std::vector<std::byte> save(device_executor& d) const override {
    current_device on(d.device());
    return ef_->save(d.exec());
  }
  void restore(device_executor& d, bytes_view state) override {
    current_device on(d.device());
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

  std::size_t compress(device_executor& d, gz::span<const float> x, gz::span<std::byte> out,
                       gz::quantize::compress_context ctx) const override {
    current_device on(d.device());
    return codec_.compress(d.exec(), x, out, ctx);
  }
  void decompress(device_executor& d, bytes_view payload, gz::span<float> out) const override {
    current_device on(d.device());
    codec_.decompress(d.exec(), payload, out);
    d.exec().check();
  }
  void decompress_add(device_executor& d, bytes_view payload, gz::span<float> accum, float alpha) const override {
    current_device on(d.device());
    codec_.decompress_add(d.exec(), payload, accum, alpha);
    d.exec().check();
  }
  void decompress_add_all(device_executor& d, gz::span<const bytes_view> payloads, gz::span<float> accum,
                          float alpha) const override {
    current_device on(d.device());
    if constexpr (detail::is_codec<Codec>) {
      codec_.decompress_add_all(d.exec(), payloads, accum, alpha);  // every check first, then each add
      try {
        d.exec().check();
      } catch (const gz::format_error&) {
        name_first_bad(d, payloads, accum.size());
        throw;  // none fails alone (not expected: the checks are per payload)
      }
    } else {
      // SimHash and the rotations have no check-only pass: the payloads are added into a copy of
      // accum, each checked as it goes, and the copy is written back once all have passed.
      gz::span<float> copy = copy_to_spare(d, accum);
      detail::name_bad_payload(payloads.size(), [&](std::size_t m) {
        codec_.decompress_add(d.exec(), payloads[m], copy, alpha);
        d.exec().check();
      });
      copy_back(d, copy, accum);
    }
  }
  void decompress_all(device_executor& d, gz::span<const bytes_view> payloads, gz::span<float> out) const override {
    GRADZIP_EXPECTS(!payloads.empty(), "decompress_all: no payloads");
    current_device on(d.device());
    if constexpr (detail::is_codec<Codec>) {
      codec_.decompress_all(d.exec(), payloads, out);
      try {
        d.exec().check();
      } catch (const gz::format_error&) {
        name_first_bad(d, payloads, out.size());
        throw;  // none fails alone
      }
    } else {
      gz::span<float> sum = d.spare(out.size());
      detail::name_bad_payload(payloads.size(), [&](std::size_t m) {
        if (m == 0) {
          codec_.decompress(d.exec(), payloads[m], sum);
        } else {
          codec_.decompress_add(d.exec(), payloads[m], sum, 1.0f);
        }
        d.exec().check();
      });
      copy_back(d, sum, out);
    }
  }
  std::unique_ptr<any_device_feedback> error_feedback(device_executor& d, std::size_t n) const override {
    return std::make_unique<erased_device_feedback<Codec>>(d, codec_, n);
  }

 private:
  /// After a failed multi-payload decode (the output unchanged): checks the payloads one at a
  /// time and throws the first bad one's error with its position.
  void name_first_bad(device_executor& d, gz::span<const bytes_view> payloads, std::size_t n) const {
    detail::name_bad_payload(payloads.size(), [&](std::size_t m) {
      gz::detail::payload_backend<gz::cuda>::check(d.exec(), codec_, payloads[m], n);
      d.exec().check();
    });
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
