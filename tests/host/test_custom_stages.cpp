// Stages written outside the library (examples/, docs/extending.md) through codec<...>: what each
// promises, on the host. tests/device/test_device.cu checks the CUDA executor's bytes for the
// values stages.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "../../examples/gaussian_k.hpp"
#include "../../examples/log_scale4.hpp"
#include "../../examples/stochastic_bf16.hpp"
#include "common/helpers.hpp"
#include "common/top_level_stage.hpp"
#include "common/synthetic_gradient.hpp"

using namespace gradzip;

namespace {
template <class Codec>
std::vector<float> round_trip(const Codec& c, host& exec, const std::vector<float>& x, quantize::compress_context ctx = {}) {
  const auto payload = test::compress(c, exec, x, ctx);
  std::vector<float> out(x.size());
  c.decompress(exec, span<const std::byte>(payload), span<float>(out));
  return out;
}
using nat = quantize::natural<8>;

// Its own encode and both encode paths, its own decode beside natural's decode_in_range: neither
// fast path is wholly the class's that its in_range_class names (natural), so neither is taken.
struct own_encode_paths : nat {
  unsigned encode(float v, const record& r, std::uint32_t random) const { return nat::encode(v, r, random); }
  unsigned encode_in_range(float v, const record& r, std::uint32_t random) const {
    return nat::encode_in_range(v, r, random);
  }
  static std::uint32_t in_range_floor(const record& r) { return nat::in_range_floor(r); }
  static float decode(unsigned code, const record& r) { return nat::decode(code, r); }
};

// A stage that writes all six and names itself keeps both.
struct own_paths : own_encode_paths {
  using in_range_class = own_paths;
  unsigned encode(float v, const record& r, std::uint32_t random) const { return nat::encode(v, r, random); }
  unsigned encode_in_range(float v, const record& r, std::uint32_t random) const {
    return nat::encode_in_range(v, r, random);
  }
  static std::uint32_t in_range_floor(const record& r) { return nat::in_range_floor(r); }
  static float decode(unsigned code, const record& r) { return nat::decode(code, r); }
  static float decode_in_range(unsigned code, const record& r) { return nat::decode_in_range(code, r); }
  static unsigned in_range_code_floor(const record& r) { return nat::in_range_code_floor(r); }
};

// An overloaded decode: no fast decode (and it compiles).
struct overloaded_decode : nat {
  static float decode(unsigned code, const record& r) { return nat::decode(code, r); }
  static float decode(unsigned code, const record& r, float scale) { return scale * nat::decode(code, r); }
};

}  // namespace

TEST_CASE("a user's log-scale values stage keeps its bound and poisons non-finite buckets", "[extending]") {
  host exec;
  const codec<sparsify::none, example::log_scale4, encode::none> c;
  auto x = gradzip_tools::synthetic_gradient<float>(1000, 3);
  x[300] = NAN;
  const auto y = round_trip(c, exec, x);
  for (std::size_t b = 0; b < x.size(); b += 128) {
    const std::size_t end = std::min(x.size(), b + 128);
    float s = 0.0f;
    for (std::size_t i = b; i < end; ++i) s = std::fmax(s, std::fabs(x[i]));
    for (std::size_t i = b; i < end; ++i) {
      INFO("element " << i);
      if (b <= 300 && 300 < end) {
        REQUIRE(std::isnan(y[i]));  // the bucket with the NaN is poisoned, not silently wrong
      } else if (std::fabs(x[i]) >= std::ldexp(s, -6)) {
        REQUIRE(std::fabs(y[i] - x[i]) <= std::fabs(x[i]) / 3.0f);
      } else {
        REQUIRE(std::fabs(y[i] - x[i]) <= std::ldexp(s, -7));
      }
    }
  }
  // Its parameters are checked like a built-in stage's: a changed format byte is refused.
  auto payload = test::compress(c, exec, x);
  const auto h = wire::read_header(span<const std::byte>(payload));
  payload[h.sections[0].offset + 8] = std::byte{2};  // the format byte, after the u64 count
  std::vector<float> out(x.size(), 5.0f);
  CHECK_THROWS_AS(c.decompress(exec, span<const std::byte>(payload), span<float>(out)), format_error);
  CHECK(out == std::vector<float>(x.size(), 5.0f));
}

TEST_CASE("a stage's encoder, where it declares one beside its encode, is what the host encodes a bucket with", "[extending]") {
  static_assert(quantize::has_encoder<quantize::uniform<4>>::value && quantize::has_encoder<quantize::qsgd<7>>::value);
  static_assert(!quantize::has_encoder<example::log_scale4>::value && !quantize::has_encoder<quantize::terngrad<>>::value);
  static_assert(quantize::has_encoder<gradzip_test::top_level_uniform>::value);
  static_assert(!quantize::has_encoder<gradzip_test::bottom_level_uniform>::value);  // an inherited encoder
  host exec;
  const auto x = gradzip_tools::synthetic_gradient<float>(1000, 5);
  // uniform's own encode, then the stage whose encoder codes every value as L: each value
  // decodes to its bucket's lo + L step, whatever encode would have said.
  const auto plain = round_trip(codec<sparsify::none, quantize::uniform<4>, encode::none>{}, exec, x);
  const auto top = round_trip(codec<sparsify::none, gradzip_test::top_level_uniform, encode::none>{}, exec, x);
  // And a derived stage's own encode (every value at level 0) over the encoder it inherits.
  const auto bottom = round_trip(codec<sparsify::none, gradzip_test::bottom_level_uniform, encode::none>{}, exec, x);
  constexpr std::size_t bucket = quantize::uniform<4>::bucket;
  for (std::size_t b = 0; b < x.size(); b += bucket) {
    const std::size_t end = std::min(x.size(), b + bucket);
    const auto [lo, hi] = std::minmax_element(x.begin() + static_cast<std::ptrdiff_t>(b), x.begin() + static_cast<std::ptrdiff_t>(end));
    const auto r = quantize::uniform<4>::make_record(*lo, *hi, true);
    for (std::size_t i = b; i < end; ++i) {
      INFO("element " << i);
      REQUIRE(top[i] == quantize::uniform<4>::decode(15, r));
      REQUIRE(bottom[i] == quantize::uniform<4>::decode(0, r));
    }
    CHECK(std::count(plain.begin() + static_cast<std::ptrdiff_t>(b), plain.begin() + static_cast<std::ptrdiff_t>(end), top[b]) < 64);
  }
}

TEST_CASE("a stage derived from natural compression with its own encode or decode is coded by them, not by the fast paths it inherits", "[extending]") {
  static_assert(detail::has_in_range_encode<nat> && detail::has_in_range_decode<nat>);
  static_assert(!detail::has_in_range_encode<gradzip_test::zero_natural>);  // its own encode
  static_assert(detail::has_in_range_decode<gradzip_test::zero_natural>);   // natural's decode, both paths
  static_assert(detail::has_in_range_encode<gradzip_test::half_natural>);   // natural's encode, both paths
  static_assert(!detail::has_in_range_decode<gradzip_test::half_natural>);  // its own decode
  static_assert(!detail::has_in_range_encode<own_encode_paths> && !detail::has_in_range_decode<own_encode_paths>);
  static_assert(detail::has_in_range_encode<own_paths> && detail::has_in_range_decode<own_paths>);
  static_assert(!detail::has_in_range_encode<quantize::uniform<4>> && !detail::has_in_range_decode<quantize::qsgd<7>>);
  static_assert(!detail::has_in_range_decode<overloaded_decode> && detail::has_in_range_encode<overloaded_decode>);
  host exec;
  const auto x = gradzip_tools::synthetic_gradient<float>(3000, 6);  // every value in natural's fast range
  const quantize::compress_context ctx{4, 1};
  const auto plain = round_trip(codec<sparsify::none, nat, encode::none>{{}, nat{77}}, exec, x, ctx);
  const auto zero = round_trip(codec<sparsify::none, gradzip_test::zero_natural, encode::none>{{}, gradzip_test::zero_natural{77}},
                               exec, x, ctx);
  const auto half = round_trip(codec<sparsify::none, gradzip_test::half_natural, encode::none>{{}, gradzip_test::half_natural{77}},
                               exec, x, ctx);
  std::size_t nonzero = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("element " << i);
    REQUIRE(zero[i] == 0.0f);
    REQUIRE(half[i] == 0.5f * plain[i]);  // the same codes, decoded by its own decode
    nonzero += plain[i] != 0.0f;
  }
  CHECK(nonzero > x.size() / 2);  // natural's own codes are not all zero: the checks above could fail
}

TEST_CASE("a user's Gaussian-k structure stage keeps exactly |x| >= tau, NaN included", "[extending]") {
  host exec;
  const example::gaussian_k gk{1.5f};
  auto x = gradzip_tools::synthetic_gradient<float>(20000, 8);
  x[123] = NAN;
  const float tau = gk.tau(span<const float>(x));
  const codec<example::gaussian_k, quantize::none, encode::automatic> c{gk};
  const auto y = round_trip(c, exec, x);
  std::size_t kept = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("element " << i);
    if (std::isnan(x[i])) {
      REQUIRE(std::isnan(y[i]));
    } else {
      REQUIRE(y[i] == (std::fabs(x[i]) >= tau ? x[i] : 0.0f));
    }
    kept += std::fabs(x[i]) >= tau || std::isnan(x[i]) ? 1 : 0;
  }
  const auto payload = test::compress(c, exec, x);
  const auto h = wire::read_header(span<const std::byte>(payload));
  std::uint64_t count = 0;
  std::memcpy(&count, payload.data() + h.sections[0].offset, 8);
  CHECK(count == kept);
  CHECK(h.codec.structure == stage::first_user_id);
}

TEST_CASE("a user's stochastic element-wise stage is unbiased and keyed by seed and context", "[extending]") {
  host exec;
  const codec<sparsify::none, example::stochastic_bf16, encode::none> c{{}, example::stochastic_bf16{11}};
  const std::size_t n = 64;
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = 1.0f + static_cast<float>(i) / 97.0f;  // between bf16 values
  // The same key gives the same bytes; another step, other bytes.
  CHECK(test::compress(c, exec, x, {4, 1}) == test::compress(c, exec, x, {4, 1}));
  CHECK(test::compress(c, exec, x, {4, 1}) != test::compress(c, exec, x, {5, 1}));
  // Unbiased: over S steps each element's mean is within 5 standard deviations of x. One bf16
  // step here is 2^-7 (values in [1, 2)), so a rounding's deviation is at most 2^-8.
  const int steps = 4000;
  std::vector<double> mean(n, 0.0);
  for (int s = 0; s < steps; ++s) {
    const auto y = round_trip(c, exec, x, {static_cast<std::uint64_t>(s), 0});
    for (std::size_t i = 0; i < n; ++i) {
      REQUIRE((y[i] == std::floor(x[i] * 128.0f) / 128.0f || y[i] == std::ceil(x[i] * 128.0f) / 128.0f));
      mean[i] += y[i] / steps;
    }
  }
  const double bound = 5.0 * std::ldexp(1.0, -8) / std::sqrt(static_cast<double>(steps));
  for (std::size_t i = 0; i < n; ++i) REQUIRE(std::abs(mean[i] - x[i]) <= bound);
  // Infinities and NaN are kept, never rounded into something else.
  const std::vector<float> special{INFINITY, -INFINITY, NAN, 3.3895314e38f};
  const auto y = round_trip(c, exec, special);
  CHECK(y[0] == INFINITY);
  CHECK(y[1] == -INFINITY);
  CHECK(std::isnan(y[2]));
  CHECK(std::isfinite(y[3]));  // the largest finite bf16 region does not round to infinity
  static_assert(stage::summed_as<example::stochastic_bf16>(element_type::f32) == element_type::bf16);
}
