#include <catch2/catch.hpp>

#include <cmath>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"

using namespace gradzip;
using topk_codec = codec<sparsify::topk>;
using ef_t = feedback::error_feedback<topk_codec, float, host>;

TEST_CASE("error feedback sent + residual equals the sum of gradients", "[feedback]") {
  const std::size_t n = 20000;
  host exec;
  ef_t ef(exec, topk_codec{sparsify::topk::ratio(0.01)}, n);
  std::vector<double> sent(n, 0.0), total(n, 0.0);
  std::vector<std::byte> out(ef.max_compressed_bytes<float>());
  for (std::uint32_t step = 0; step < 20; ++step) {
    const auto g = gradzip_tools::synthetic_gradient<float>(n, 100 + step);
    for (std::size_t i = 0; i < n; ++i) total[i] += g[i];
    const std::size_t bytes = ef.compress(exec, span<const float>(g), span<std::byte>(out));
    std::vector<float> decoded(n);
    ef.codec().decompress(exec, span<const std::byte>(out.data(), bytes), span<float>(decoded));
    for (std::size_t i = 0; i < n; ++i) sent[i] += decoded[i];
  }
  const auto e = ef.residual();
  double worst = 0.0;
  for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(sent[i] + e[i] - total[i]));
  CHECK(worst < 1e-5);  // float rounding of the running residual only
}

TEST_CASE("error feedback zeroes the residual where it sent values", "[feedback]") {
  host exec;
  ef_t ef(exec, topk_codec{sparsify::topk::count(1)}, 3);
  std::vector<float> g = {1.0f, -2.0f, 0.5f};
  std::vector<std::byte> out(ef.max_compressed_bytes<float>());
  ef.compress(exec, span<const float>(g), span<std::byte>(out));
  auto e = ef.residual();
  CHECK(std::vector<float>(e.begin(), e.end()) == std::vector<float>{1.0f, 0.0f, 0.5f});
  ef.compress(exec, span<const float>(g), span<std::byte>(out));  // p = {2, -2, 1}: index 0 wins
  e = ef.residual();
  CHECK(std::vector<float>(e.begin(), e.end()) == std::vector<float>{0.0f, -2.0f, 1.0f});
}

TEST_CASE("error feedback state saves and restores", "[feedback]") {
  host exec;
  const std::size_t n = 1000;
  ef_t a(exec, topk_codec{sparsify::topk::ratio(0.1)}, n);
  std::vector<std::byte> out(a.max_compressed_bytes<float>());
  const auto g = gradzip_tools::synthetic_gradient<float>(n, 5);
  a.compress(exec, span<const float>(g), span<std::byte>(out));
  const auto state = a.save(exec);

  ef_t b(exec, topk_codec{sparsify::topk::ratio(0.1)}, n);
  b.restore(exec, span<const std::byte>(state));
  const auto ra = a.residual();
  const auto rb = b.residual();
  CHECK(std::equal(ra.begin(), ra.end(), rb.begin()));
  // Same state, same input: same next payload.
  std::vector<std::byte> out_b(out.size());
  CHECK(a.compress(exec, span<const float>(g), span<std::byte>(out)) ==
        b.compress(exec, span<const float>(g), span<std::byte>(out_b)));
  CHECK(out == out_b);
}

TEST_CASE("error feedback restore rejects foreign state", "[feedback]") {
  host exec;
  ef_t a(exec, topk_codec{}, 100);
  const auto state = a.save(exec);
  ef_t wrong_size(exec, topk_codec{}, 99);
  CHECK_THROWS_AS(wrong_size.restore(exec, span<const std::byte>(state)), format_error);
  feedback::error_feedback<topk_codec, double, host> wrong_type(exec, topk_codec{}, 100);
  CHECK_THROWS_WITH(wrong_type.restore(exec, span<const std::byte>(state)),
                    "error_feedback::restore: element type differs from the expected one: it holds f32, expected f64");
  auto truncated = state;
  truncated.resize(state.size() - 16);
  CHECK_THROWS_AS(a.restore(exec, span<const std::byte>(truncated)), format_error);
  // A top-k payload is not a residual.
  std::vector<float> g(100, 1.0f);
  const auto payload = test::compress(topk_codec{}, exec, g);
  CHECK_THROWS_AS(a.restore(exec, span<const std::byte>(payload)), format_error);
  CHECK_THROWS_WITH(a.compress(exec, span<const float>(g.data(), 50), span<std::byte>()),
                    "error_feedback: gradient has 50 elements, the residual 100");
}

TEST_CASE("error feedback passes the step to a stochastic values stage", "[feedback]") {
  using q = quantize::uniform<2, quantize::rounding::stochastic>;
  using codec_t = codec<sparsify::none, q, encode::none>;
  host exec;
  const auto g = gradzip_tools::synthetic_gradient<float>(4096, 12);
  feedback::error_feedback<codec_t, float, host> a(exec, codec_t{{}, q{5}}, g.size());
  feedback::error_feedback<codec_t, float, host> b(exec, codec_t{{}, q{5}}, g.size());
  std::vector<std::byte> pa(a.max_compressed_bytes<float>()), pb(pa.size());
  a.compress(exec, span<const float>(g), span<std::byte>(pa), {1, 0});
  b.compress(exec, span<const float>(g), span<std::byte>(pb), {2, 0});
  CHECK(pa != pb);  // different steps draw different roundings
  // Error feedback keeps sent + residual equal to the gradient for a quantizer too.
  std::vector<float> sent(g.size());
  codec_t{{}, q{5}}.decompress(exec, span<const std::byte>(pa), span<float>(sent));
  const auto e = a.residual();
  for (std::size_t i = 0; i < g.size(); ++i) REQUIRE(std::abs(sent[i] + e[i] - g[i]) <= 1e-6f * (1 + std::abs(g[i])));
}

namespace {

/// A wrapper whose compress throws (a too-small output) keeps its state: save() is unchanged,
/// and a retry gives the bytes a wrapper that never failed gives.
template <class Wrapper, class Step>
void check_throw_changes_nothing(Wrapper& w, Wrapper& twin, Step step) {
  host exec;
  const auto before = w.save(exec);
  CHECK_THROWS_AS(step(w, 1), invalid_argument);  // one byte short of the bound
  CHECK(w.save(exec) == before);
  CHECK(step(w, 0) == step(twin, 0));
  CHECK(w.save(exec) == twin.save(exec));
}

}  // namespace

TEST_CASE("stateful wrappers change nothing when compress throws", "[host]") {
  host exec;
  const std::size_t n = 5000;
  const auto g = gradzip_tools::synthetic_gradient<float>(n, 17);
  const topk_codec c{sparsify::topk::ratio(0.01)};
  // Each step: compress into a buffer `short_by` bytes smaller than the bound; returns the bytes.
  const auto stepper = [&](auto bound) {
    return [&, bound](auto& w, std::size_t short_by) {
      std::vector<std::byte> out(bound - short_by);
      const std::size_t bytes = w.compress(exec, span<const float>(g), span<std::byte>(out));
      out.resize(bytes);
      return out;
    };
  };
  SECTION("error feedback") {
    ef_t a(exec, c, n), b(exec, c, n);
    check_throw_changes_nothing(a, b, stepper(a.max_compressed_bytes<float>()));
  }
  SECTION("momentum correction") {
    feedback::momentum_correction<topk_codec, float, host> a(exec, c, n, 0.9f), b(exec, c, n, 0.9f);
    check_throw_changes_nothing(a, b, stepper(a.max_compressed_bytes<float>()));
  }
  SECTION("signum") {
    using sign_codec = codec<sparsify::none, quantize::sign<false>, encode::none>;
    feedback::signum<sign_codec, float, host> a(exec, sign_codec{}, n), b(exec, sign_codec{}, n);
    check_throw_changes_nothing(a, b, stepper(a.max_compressed_bytes<float>()));
  }
  SECTION("fetchsgd") {
    const sketch::count_sketch cs{3, 500, 4};
    sketch::fetchsgd a{cs, n, 50, 0.9f}, b{cs, n, 50, 0.9f};
    std::vector<std::byte> summed(cs.payload_bytes(n));
    cs.compress(exec, span<const float>(g), span<std::byte>(summed));
    check_throw_changes_nothing(a, b, [&](auto& w, std::size_t short_by) {
      std::vector<std::byte> update(w.max_update_bytes() - short_by);
      update.resize(w.step(exec, span<const std::byte>(summed), span<std::byte>(update)));
      return update;
    });
  }
}

TEST_CASE("saved states: edited bytes raise format_error and change nothing", "[feedback][hostile]") {
  // Issue 22: a state whose element-type byte (offset 6) was edited, and momentum correction's
  // trailing bytes, raised invalid_argument; docs/format.md promises format_error for bad bytes.
  host exec;
  const std::size_t n = 64;
  const std::vector<float> g(n, 0.5f);
  const auto expect = [](auto restore, wire::format_errc code) {
    try {
      restore();
      FAIL("accepted");
    } catch (const format_error& e) {
      INFO(e.what());
      CHECK(e.code() == code);
    }
  };
  const auto retyped = [](std::vector<std::byte> state) {
    state[6] = std::byte{2};  // f32 -> f64; the later state of momentum correction keeps its own
    return state;
  };
  ef_t ef(exec, topk_codec{}, n);
  std::vector<std::byte> out(ef.max_compressed_bytes<float>());
  ef.compress(exec, span<const float>(g), span<std::byte>(out));
  const auto ef_state = ef.save(exec);
  const auto ef_retyped = retyped(ef_state);
  expect([&] { ef.restore(exec, span<const std::byte>(ef_retyped)); }, wire::format_errc::element_type_mismatch);
  CHECK(ef.save(exec) == ef_state);

  using sparse = codec<sparsify::topk>;
  feedback::momentum_correction<sparse, float, host> mc(exec, sparse{sparsify::topk::count(4)}, n, 0.5f);
  mc.compress(exec, span<const float>(g), span<std::byte>(out));
  const auto mc_state = mc.save(exec);
  const auto mc_retyped = retyped(mc_state);
  expect([&] { mc.restore(exec, span<const std::byte>(mc_retyped)); }, wire::format_errc::element_type_mismatch);
  auto longer = mc_state;
  longer.resize(longer.size() + 16);
  expect([&] { mc.restore(exec, span<const std::byte>(longer)); }, wire::format_errc::trailing_bytes);
  CHECK(mc.save(exec) == mc_state);

  using sign_codec = codec<sparsify::none, quantize::sign<false>, encode::none>;
  feedback::signum<sign_codec, float, host> sg(exec, sign_codec{}, n, 0.9f);
  sg.compress(exec, span<const float>(g), span<std::byte>(out));
  const auto sg_state = sg.save(exec);
  const auto sg_retyped = retyped(sg_state);
  expect([&] { sg.restore(exec, span<const std::byte>(sg_retyped)); }, wire::format_errc::element_type_mismatch);
  CHECK(sg.save(exec) == sg_state);

  // A state read back is one state, whole: momentum correction's two (u, then v) are not a
  // residual or a momentum, and bytes after a state are not part of it.
  expect([&] { ef.restore(exec, span<const std::byte>(mc_state)); }, wire::format_errc::trailing_bytes);
  expect([&] { sg.restore(exec, span<const std::byte>(mc_state)); }, wire::format_errc::trailing_bytes);
  auto ef_longer = ef_state;
  ef_longer.resize(ef_longer.size() + 4096);
  expect([&] { ef.restore(exec, span<const std::byte>(ef_longer)); }, wire::format_errc::trailing_bytes);
  auto sg_longer = sg_state;
  sg_longer.resize(sg_longer.size() + 4096);
  expect([&] { sg.restore(exec, span<const std::byte>(sg_longer)); }, wire::format_errc::trailing_bytes);
  CHECK(ef.save(exec) == ef_state);
  CHECK(sg.save(exec) == sg_state);
  // The header's errors name the restore too.
  CHECK_THROWS_WITH(ef.restore(exec, span<const std::byte>(ef_state).subspan(0, 40)),
                    Catch::Matchers::StartsWith("error_feedback::restore: payload truncated"));
}
