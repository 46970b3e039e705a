#include <catch2/catch.hpp>

#include <cmath>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"
#include "gradzip/gradzip.hpp"

using namespace gradzip;

namespace {
using sign_codec = test::dense<quantize::sign<false>>;
using signum_t = feedback::signum<sign_codec, float, host>;
}  // namespace

TEST_CASE("signum sends the sign of the running momentum", "[signum]") {
  const std::size_t n = 700;
  host exec;
  signum_t s(exec, sign_codec{}, n, 0.9f);
  std::vector<float> m(n, 0.0f);
  std::vector<std::byte> out(s.max_compressed_bytes<float>());
  for (std::uint32_t step = 0; step < 5; ++step) {
    const auto g = gradzip_tools::synthetic_gradient<float>(n, 40 + step);
    for (std::size_t i = 0; i < n; ++i) m[i] = std::fma(0.9f, m[i], (1.0f - 0.9f) * g[i]);
    const std::size_t bytes = s.compress(exec, span<const float>(g), span<std::byte>(out), {step, 0});
    std::vector<float> decoded(n);
    s.codec().decompress(exec, span<const std::byte>(out.data(), bytes), span<float>(decoded));
    const auto kept = s.momentum();
    for (std::size_t i = 0; i < n; ++i) {
      REQUIRE(kept[i] == m[i]);
      REQUIRE(decoded[i] == (m[i] < 0 ? -1.0f : 1.0f));
    }
  }
  host other;
  signum_t restored(other, sign_codec{}, n, 0.9f);
  const auto state = s.save(exec);
  restored.restore(other, span<const std::byte>(state));
  for (std::size_t i = 0; i < n; ++i) REQUIRE(restored.momentum()[i] == m[i]);
  CHECK_THROWS_AS(signum_t(exec, sign_codec{}, n, 1.0f), invalid_argument);
  CHECK_THROWS_AS(signum_t(exec, sign_codec{}, n, -0.1f), invalid_argument);
  std::vector<float> short_grad(n - 1);
  CHECK_THROWS_AS(s.compress(exec, span<const float>(short_grad), span<std::byte>(out)), invalid_argument);
}

TEST_CASE("majority vote is the sign of the summed signs with ties at zero", "[signum]") {
  host exec;
  const std::vector<std::vector<float>> workers = {
      {1.0f, -2.0f, 3.0f, -0.5f, 0.0f}, {-1.0f, -1.0f, 2.0f, 0.5f, -1.0f}, {2.0f, 1.0f, -1.0f, -4.0f, -1.0f}};
  std::vector<std::vector<std::byte>> payloads;
  for (const auto& w : workers) payloads.push_back(test::compress(sign_codec{}, exec, w));
  std::vector<span<const std::byte>> views(payloads.begin(), payloads.end());
  std::vector<float> out(5, 42.0f);
  quantize::majority_vote(exec, sign_codec{}, span<const span<const std::byte>>(views), span<float>(out));
  CHECK(out == std::vector<float>{1.0f, -1.0f, 1.0f, -1.0f, -1.0f});  // zero voted +1
  views.pop_back();  // two workers: ties give 0
  quantize::majority_vote(exec, sign_codec{}, span<const span<const std::byte>>(views), span<float>(out));
  CHECK(out == std::vector<float>{0.0f, -1.0f, 1.0f, 0.0f, 0.0f});
}

TEST_CASE("majority vote validates payloads and the vote count", "[signum]") {
  host exec;
  const std::vector<float> x(64, 1.0f);
  auto p = test::compress(sign_codec{}, exec, x);
  std::vector<span<const std::byte>> many(300, span<const std::byte>(p));
#if GRADZIP_HAS_HALF
  std::vector<__nv_bfloat16> narrow(64);
  CHECK_THROWS_AS(quantize::majority_vote(exec, sign_codec{}, span<const span<const std::byte>>(many),
                                          span<__nv_bfloat16>(narrow)),
                  invalid_argument);
#endif
  std::vector<float> out(64, 0.0f);
  quantize::majority_vote(exec, sign_codec{}, span<const span<const std::byte>>(many), span<float>(out));
  CHECK(out[0] == 1.0f);
  p[5] = std::byte{0xFF};  // corrupt the header
  std::vector<span<const std::byte>> bad = {span<const std::byte>(p)};
  CHECK_THROWS_AS(quantize::majority_vote(exec, sign_codec{}, span<const span<const std::byte>>(bad),
                                          span<float>(out)),
                  format_error);
  CHECK_THROWS_AS(quantize::majority_vote(exec, sign_codec{}, span<const span<const std::byte>>(),
                                          span<float>(out)),
                  invalid_argument);
}

TEST_CASE("majority vote leaves the output unchanged when any payload is bad", "[signum][hostile]") {
  // Issue 22's reproducer: a valid 7-element sign payload, then 16 zero bytes. The vote decoded
  // payload 0 into `out` before it read payload 1 (out[0] went from 42 to 1).
  host exec;
  const auto good = test::compress(sign_codec{}, exec, std::vector<float>{1, -1, 1, -1, 1, -1, 1});
  const std::vector<std::byte> zeros(16);
  for (const bool bad_first : {false, true}) {
    std::vector<span<const std::byte>> views = {span<const std::byte>(good), span<const std::byte>(zeros)};
    if (bad_first) std::swap(views[0], views[1]);
    std::vector<float> out(7, 42.0f);
    try {
      quantize::majority_vote(exec, sign_codec{}, span<const span<const std::byte>>(views), span<float>(out));
      FAIL("accepted 16 zero bytes");
    } catch (const format_error& e) {
      CHECK_THAT(e.what(), Catch::Contains(bad_first ? "payload 0 of 2" : "payload 1 of 2"));
    }
    CHECK(out == std::vector<float>(7, 42.0f));
  }
}
