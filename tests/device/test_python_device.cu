// The Python module's CUDA half (python/src/device.cuh): each erased codec's device calls must
// give its host calls' bytes and outputs, check payloads before writing, and name a bad one by
// its position as the host does. The module's nanobind layer only routes arrays to these calls.
#define GRADZIP_PYTHON_CUDA 1

#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "../../python/src/device.cu"
#include "common/synthetic_gradient.hpp"
#include "device/device_helpers.cuh"

namespace py = gradzip_py;

namespace {

using bytes_view = gz::span<const std::byte>;

/// A stream that does not synchronize with the legacy stream, as torch's side streams: each call
/// must be ordered with it (events both ways), since the executor runs on a stream of its own.
struct owned_stream {
  cudaStream_t s = nullptr;
  owned_stream() { GRADZIP_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~owned_stream() { cudaStreamDestroy(s); }
  std::uintptr_t handle() const { return reinterpret_cast<std::uintptr_t>(s); }
};

std::vector<float> download_on(cudaStream_t s, const device_vector<float>& v) {
  GRADZIP_CUDA_TRY(cudaStreamSynchronize(s));
  return v.download();
}

/// Compress, decode and decode-add of three gradients through the erased codec's two halves.
template <class Codec>
void check_codec(const Codec& codec, std::size_t n) {
  py::erased_codec<Codec> erased(codec);
  REQUIRE(erased.device() != nullptr);
  const py::any_device_codec& dev = *erased.device();
  gz::host host;
  owned_stream stream;
  auto exec = py::make_device_executor(0);
  const std::size_t bound = erased.max_compressed_bytes(n);

  std::vector<std::vector<std::byte>> payloads;
  for (std::uint32_t step = 0; step < 3; ++step) {
    const std::vector<float> x = gradzip_tools::synthetic_gradient<float>(n, 11 + step);
    std::vector<std::byte> want(bound);
    want.resize(erased.compress(host, gz::span<const float>(x), gz::span<std::byte>(want), {step, 5}));
    // The gradient arrives by a copy queued on the caller's stream: the call must wait for it.
    device_vector<float> dx(n);
    GRADZIP_CUDA_TRY(cudaMemcpyAsync(dx.data, x.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream.s));
    device_vector<std::byte> dout(bound);
    const std::size_t bytes = dev.compress(*exec, stream.handle(), gz::span<const float>(dx.data, n), dout.view(), {step, 5});
    GRADZIP_CUDA_TRY(cudaStreamSynchronize(stream.s));
    INFO("step " << step);
    REQUIRE(bytes == want.size());
    CHECK(dout.download(bytes) == want);
    payloads.push_back(want);
  }

  std::vector<device_vector<std::byte>> dp;
  std::vector<bytes_view> host_views, device_views;
  for (const auto& p : payloads) {
    dp.emplace_back(p);
    host_views.emplace_back(p);
    device_views.emplace_back(dp.back().data, p.size());
  }
  const std::vector<float> start = gradzip_tools::synthetic_gradient<float>(n, 99);

  // decompress and decompress_add (alpha) of each payload.
  for (std::size_t m = 0; m < payloads.size(); ++m) {
    std::vector<float> want(n);
    erased.decompress(host, host_views[m], gz::span<float>(want));
    device_vector<float> out(n);
    dev.decompress(*exec, stream.handle(), device_views[m], out.view());
    std::vector<float> got = download_on(stream.s, out);
    CHECK(output_difference(got.data(), want.data(), n) == "");

    want = start;
    erased.decompress_add(host, host_views[m], gz::span<float>(want), 0.25f);
    device_vector<float> accum(start);
    dev.decompress_add(*exec, stream.handle(), device_views[m], accum.view(), 0.25f);
    got = download_on(stream.s, accum);
    CHECK(output_difference(got.data(), want.data(), n) == "");
  }

  // decompress_add_all: the device adds payload by payload, each addition rounded.
  std::vector<float> want = start;
  for (const auto& v : host_views) erased.decompress_add(host, v, gz::span<float>(want), 0.5f);
  device_vector<float> accum(start);
  dev.decompress_add_all(*exec, stream.handle(), gz::span<const bytes_view>(device_views), accum.view(), 0.5f);
  std::vector<float> got = download_on(stream.s, accum);
  CHECK(output_difference(got.data(), want.data(), n) == "");

  // decompress_all: the sum of the decodes, the first written, the others added.
  erased.decompress(host, host_views[0], gz::span<float>(want));
  for (std::size_t m = 1; m < host_views.size(); ++m) erased.decompress_add(host, host_views[m], gz::span<float>(want), 1.0f);
  device_vector<float> sum(start);
  dev.decompress_all(*exec, stream.handle(), gz::span<const bytes_view>(device_views), sum.view());
  got = download_on(stream.s, sum);
  CHECK(output_difference(got.data(), want.data(), n) == "");

  // A payload of another format version at position 1 of 3: both multi-payload decodes name it
  // as the host does and leave their output as it was.
  std::vector<std::byte> bad = payloads[1];
  bad[4] = static_cast<std::byte>(0x7f);  // the format version (bytes 4-5): every decoder checks it
  device_vector<std::byte> dbad(bad);
  std::vector<bytes_view> with_bad = device_views;
  with_bad[1] = bytes_view(dbad.data, bad.size());
  std::vector<bytes_view> host_with_bad = host_views;
  host_with_bad[1] = bytes_view(bad);
  gz::wire::format_errc host_code = gz::wire::format_errc::ok;
  std::vector<float> host_accum = start;
  try {
    erased.decompress_add_all(host, gz::span<const bytes_view>(host_with_bad), gz::span<float>(host_accum), 1.0f);
  } catch (const gz::format_error& e) {
    host_code = e.code();
    CHECK(std::string(e.what()).rfind("payload 1 of 3: ", 0) == 0);
  }
  REQUIRE(host_code != gz::wire::format_errc::ok);
  // The host's error, its position and code; the text after them names the device's decoder.
  const auto same_failure = [&](const auto& call) {
    device_vector<float> untouched(start);
    try {
      call(untouched.view());
      FAIL("no error for the bad payload");
    } catch (const gz::format_error& e) {
      CHECK(std::string(e.what()).rfind("payload 1 of 3: ", 0) == 0);
      CHECK(e.code() == host_code);
    }
    CHECK(download_on(stream.s, untouched) == start);
  };
  same_failure([&](gz::span<float> out) {
    dev.decompress_add_all(*exec, stream.handle(), gz::span<const bytes_view>(with_bad), out, 1.0f);
  });
  same_failure([&](gz::span<float> out) { dev.decompress_all(*exec, stream.handle(), gz::span<const bytes_view>(with_bad), out); });
  device_vector<float> untouched(start);
  // A misaligned payload after the bad one is refused while the checks are being queued (an
  // invalid_argument, not the bad payload's format_error): the bad one's recorded failure must
  // not be left for the next call.
  std::vector<bytes_view> then_misaligned = {device_views[0], with_bad[1], bytes_view(dp[2].data + 1, 64)};
  device_vector<float> scratch(start);
  CHECK_THROWS(dev.decompress_all(*exec, stream.handle(), gz::span<const bytes_view>(then_misaligned), scratch.view()));
  // And the executor is usable afterwards: the failure was cleared where it was raised.
  dev.decompress_add_all(*exec, stream.handle(), gz::span<const bytes_view>(device_views), untouched.view(), 0.5f);
  got = download_on(stream.s, untouched);
  want = start;
  for (const auto& v : host_views) erased.decompress_add(host, v, gz::span<float>(want), 0.5f);
  CHECK(output_difference(got.data(), want.data(), n) == "");
}

}  // namespace

TEST_CASE("python module: CUDA calls equal the host calls, codec by codec", "[gpu]") {
  REQUIRE_GPU();
  namespace sp = gz::sparsify;
  namespace q = gz::quantize;
  namespace en = gz::encode;
  const std::size_t n = 5000;
  SECTION("fp16 cast") { check_codec(gz::codec<sp::none, q::cast_fp16, en::none>{}, n); }
  SECTION("QSGD 4-bit (stochastic: keyed by step and tensor id)") {
    check_codec(gz::codec<sp::none, q::qsgd<7>, en::none>{{}, q::qsgd<7>{3}}, n);
  }
  SECTION("top-k 1 %, COO") { check_codec(gz::codec<sp::topk, q::none, en::coo>{sp::topk::ratio(0.01)}, n); }
  SECTION("threshold, automatic index encoding") {
    check_codec(gz::codec<sp::threshold, q::none, en::automatic>{sp::threshold{1.5}}, n);
  }
  SECTION("SimHash (no check-only pass: decoded into a copy)") { check_codec(gz::hash::simhash{1024, 128, 0}, n); }
  SECTION("Hadamard-rotated uniform 8-bit (no check-only pass)") {
    using inner = gz::codec<sp::none, q::uniform<8>, en::none>;
    check_codec(gz::transform::rotated<inner>{inner{}, gz::transform::hadamard{1024, 0x4ad}}, n);
  }
}

TEST_CASE("python module: CUDA error feedback follows the host's, and their states restore on either", "[gpu]") {
  REQUIRE_GPU();
  using codec_t = gz::codec<gz::sparsify::topk, gz::quantize::none, gz::encode::coo>;
  const codec_t codec{gz::sparsify::topk::ratio(0.02)};
  py::erased_codec<codec_t> erased(codec);
  const std::size_t n = 3000;
  gz::host host;
  owned_stream stream;
  auto exec = py::make_device_executor(0);
  auto host_ef = erased.error_feedback(host, n);
  auto dev_ef = erased.device()->error_feedback(*exec, n);
  CHECK(dev_ef->device() == 0);
  const std::size_t bound = erased.max_compressed_bytes(n);
  for (std::uint32_t step = 0; step < 4; ++step) {
    const std::vector<float> g = gradzip_tools::synthetic_gradient<float>(n, 50 + step);
    std::vector<std::byte> want(bound);
    want.resize(host_ef->compress(host, gz::span<const float>(g), gz::span<std::byte>(want), {step, 0}));
    device_vector<float> dg(g);
    device_vector<std::byte> out(bound);
    const std::size_t bytes = dev_ef->compress(*exec, stream.handle(), gz::span<const float>(dg.data, n), out.view(), {step, 0});
    GRADZIP_CUDA_TRY(cudaStreamSynchronize(stream.s));
    INFO("step " << step);
    REQUIRE(bytes == want.size());
    CHECK(out.download(bytes) == want);
  }
  const std::vector<std::byte> saved = dev_ef->save(*exec, stream.handle());
  CHECK(saved == host_ef->save(host));
  // A fresh device feedback restored from the host's state continues as the host does.
  auto resumed = erased.device()->error_feedback(*exec, n);
  resumed->restore(*exec, stream.handle(), gz::span<const std::byte>(saved));
  const std::vector<float> g = gradzip_tools::synthetic_gradient<float>(n, 77);
  std::vector<std::byte> want(bound);
  want.resize(host_ef->compress(host, gz::span<const float>(g), gz::span<std::byte>(want), {9, 0}));
  device_vector<float> dg(g);
  device_vector<std::byte> out(bound);
  const std::size_t bytes = resumed->compress(*exec, stream.handle(), gz::span<const float>(dg.data, n), out.view(), {9, 0});
  GRADZIP_CUDA_TRY(cudaStreamSynchronize(stream.s));
  REQUIRE(bytes == want.size());
  CHECK(out.download(bytes) == want);
  // A state for another size is refused with the library's message, changing nothing.
  auto other = erased.device()->error_feedback(*exec, n + 1);
  CHECK_THROWS_AS(other->restore(*exec, stream.handle(), gz::span<const std::byte>(saved)), gz::format_error);
}
