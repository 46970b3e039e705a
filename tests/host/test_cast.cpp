#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"
#include "gradzip/detail/host/cast.hpp"

using namespace gradzip;

namespace {
using dense_raw = codec<sparsify::none, quantize::none, encode::none>;
using dense_fp16 = codec<sparsify::none, quantize::cast_fp16, encode::none>;
using dense_bf16 = codec<sparsify::none, quantize::cast_bf16, encode::none>;
using topk_fp16 = codec<sparsify::topk, quantize::cast_fp16, encode::coo>;

using test::round_trip;

float half_value(float f) { return detail::half_bits_to_float(quantize::float_to_half_bits(f)); }
float bf16_value(float f) { return detail::bf16_bits_to_float(quantize::float_to_bf16_bits(f)); }
}  // namespace

static_assert(dense_raw::summable);
static_assert(dense_fp16::summable);
static_assert(!codec<sparsify::topk>::summable);
static_assert(!topk_fp16::summable);

TEST_CASE("fp16 rounding edges follow IEEE round to nearest even", "[cast]") {
  CHECK(half_value(65504.0f) == 65504.0f);
  CHECK(half_value(65519.996f) == 65504.0f);
  CHECK(std::isinf(half_value(65520.0f)));
  CHECK(std::isinf(half_value(-1e30f)));
  CHECK(half_value(std::ldexp(1.0f, -24)) == std::ldexp(1.0f, -24));       // smallest subnormal
  CHECK(half_value(std::ldexp(1.0f, -25)) == 0.0f);                         // halfway: to even (0)
  CHECK(half_value(std::ldexp(1.5f, -25)) == std::ldexp(1.0f, -24));        // above halfway
  CHECK(half_value(1.0f + std::ldexp(1.0f, -11)) == 1.0f);                  // tie to even
  CHECK(half_value(1.0f + std::ldexp(3.0f, -11)) == 1.0f + std::ldexp(1.0f, -9));
  CHECK(std::signbit(half_value(-0.0f)));
  CHECK(std::isnan(half_value(std::numeric_limits<float>::quiet_NaN())));
  CHECK(quantize::float_to_half_bits(-std::numeric_limits<float>::quiet_NaN()) == 0xFE00);
  CHECK(bf16_value(1.0f + std::ldexp(1.0f, -8)) == 1.0f);                   // tie to even
  CHECK(bf16_value(1.0f + std::ldexp(3.0f, -8)) == 1.0f + std::ldexp(1.0f, -6));
  CHECK(std::isinf(bf16_value(std::numeric_limits<float>::max())));
  CHECK(std::isnan(bf16_value(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("the host's vector casts of a run equal the scalar conversions bit for bit", "[cast]") {
  // Every 4099th float bit pattern (NaNs of both signs and all payloads, infinities, half
  // subnormals, every rounding tie region), in runs of 1,027 so that the vector loop and its
  // scalar tail both see them. With -mavx2 -mf16c (the avx2 suite) this is vcvtps2ph's path.
  std::vector<float> x(1027);
  std::vector<std::uint8_t> f16(2 * x.size()), bf16(2 * x.size());
  std::uint64_t mismatches = 0, pattern = 0;
  while (pattern < (std::uint64_t{1} << 32)) {
    for (float& v : x) {
      v = detail::bit_cast<float>(static_cast<std::uint32_t>(pattern));
      pattern += 4099;
    }
    detail::cast_run_f16(x.data(), x.size(), f16.data());
    detail::cast_run_bf16(x.data(), x.size(), bf16.data());
    for (std::size_t i = 0; i < x.size(); ++i) {
      std::uint16_t h, b;
      std::memcpy(&h, &f16[2 * i], 2);
      std::memcpy(&b, &bf16[2 * i], 2);
      mismatches += h != quantize::float_to_half_bits(x[i]);
      mismatches += b != quantize::float_to_bf16_bits(x[i]);
    }
  }
  CHECK(mismatches == 0);
  // And through the codec: a dense fp16 / bf16 payload's values are the scalar conversions.
  x = gradzip_tools::synthetic_gradient<float>(100003, 8);
  x[5] = -std::numeric_limits<float>::quiet_NaN();
  x[6] = std::numeric_limits<float>::infinity();
  x[7] = 65520.0f;
  x[8] = 1e-6f;
  host exec{2};
  const auto p16 = test::compress(dense_fp16{}, exec, x);
  const auto pb = test::compress(dense_bf16{}, exec, x);
  const std::uint64_t values_at = dense_fp16::layout(element_type::f32, x.size(), x.size()).offset(1);
  REQUIRE(pb.size() == p16.size());
  std::uint64_t payload_mismatches = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::uint16_t h, b;
    std::memcpy(&h, &p16[values_at + 2 * i], 2);
    std::memcpy(&b, &pb[values_at + 2 * i], 2);
    payload_mismatches += h != quantize::float_to_half_bits(x[i]);
    payload_mismatches += b != quantize::float_to_bf16_bits(x[i]);
  }
  CHECK(payload_mismatches == 0);
}

#if GRADZIP_HAS_HALF
TEST_CASE("fp16 and bf16 conversions equal CUDA's on a dense sweep of float bit patterns", "[cast]") {
  std::uint64_t mismatches = 0;
  for (std::uint64_t b = 0; b < (std::uint64_t{1} << 32); b += 13) {
    const float f = detail::bit_cast<float>(static_cast<std::uint32_t>(b));
    if (std::isnan(f)) continue;  // NaN payload bits are gradzip's own (documented)
    mismatches += quantize::float_to_half_bits(f) != detail::bit_cast<std::uint16_t>(__float2half_rn(f));
    mismatches += quantize::float_to_bf16_bits(f) != detail::bit_cast<std::uint16_t>(__float2bfloat16_rn(f));
  }
  CHECK(mismatches == 0);
}

TEST_CASE("fp16 decoding equals CUDA's on all 65536 patterns", "[cast]") {
  int mismatches = 0;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float ours = detail::half_bits_to_float(static_cast<std::uint16_t>(h));
    const float theirs = __half2float(detail::bit_cast<__half>(static_cast<std::uint16_t>(h)));
    mismatches += std::isnan(theirs) ? !std::isnan(ours)
                                     : detail::bit_cast<std::uint32_t>(ours) != detail::bit_cast<std::uint32_t>(theirs);
  }
  CHECK(mismatches == 0);
}
#endif

TEST_CASE("dense none round trips exactly with n values and no indices", "[cast]") {
  const auto g = gradzip_tools::synthetic_gradient<float>(1001, 3);
  CHECK(round_trip(dense_raw{}, g) == g);
  CHECK(dense_raw{}.max_compressed_bytes<float>(1001) == 96 + 16 + 4016);  // 2 sections
  host exec;
  const auto p = test::compress(dense_raw{}, exec, g);
  const auto h = wire::read_header(span<const std::byte>(p));
  CHECK(h.section_count == 2);
  CHECK(h.codec.packed() == 0);
  std::vector<float> acc(g.size(), 1.0f);
  dense_raw{}.decompress_add(exec, span<const std::byte>(p), span<float>(acc), 2.0f);
  for (std::size_t i = 0; i < g.size(); ++i) REQUIRE(acc[i] == std::fma(2.0f, g[i], 1.0f));
}

TEST_CASE("dense casts decode to the rounded values within their error bounds", "[cast]") {
  auto g = gradzip_tools::synthetic_gradient<float>(70001, 4);
  g[0] = 1e6f;  // overflows fp16
  g[1] = std::numeric_limits<float>::quiet_NaN();
  const auto h = round_trip(dense_fp16{}, g);
  const auto b = round_trip(dense_bf16{}, g);
  CHECK(std::isinf(h[0]));
  CHECK(std::isnan(h[1]));
  CHECK(b[0] == 999424.0f);  // bf16 keeps the range
  CHECK(std::isnan(b[1]));
  for (std::size_t i = 2; i < g.size(); ++i) {
    REQUIRE(h[i] == half_value(g[i]));
    REQUIRE(b[i] == bf16_value(g[i]));
    if (std::abs(g[i]) >= std::ldexp(1.0f, -14)) REQUIRE(std::abs(h[i] - g[i]) <= std::ldexp(std::abs(g[i]), -11));
    REQUIRE(std::abs(b[i] - g[i]) <= std::ldexp(std::abs(g[i]), -8));
  }
  host exec;
  CHECK(test::compress(dense_bf16{}, exec, g).size() == 96 + 16 + 140016);
}

TEST_CASE("casts of double half and bfloat16 tensors", "[cast]") {
  const std::vector<double> d = {1.0, -2.5, 1e-3, 3.0e5};
  const auto h = round_trip(dense_fp16{}, d);
  CHECK(h[1] == -2.5f);
  CHECK(h[2] == half_value(1e-3f));
  CHECK(std::isinf(h[3]));
#if GRADZIP_HAS_HALF
  std::vector<__nv_bfloat16> bf = {__float2bfloat16_rn(1.5f), __float2bfloat16_rn(-3.0f)};
  CHECK(round_trip(dense_fp16{}, bf) == std::vector<float>{1.5f, -3.0f});
  std::vector<__half> hv = {__float2half_rn(0.25f)};
  CHECK(round_trip(dense_raw{}, hv) == std::vector<float>{0.25f});
#endif
}

TEST_CASE("top-k with fp16 values keeps top-k's indices and rounds the values", "[cast]") {
  const auto g = gradzip_tools::synthetic_gradient<float>(50000, 8);
  host exec;
  const topk_fp16 c{sparsify::topk::ratio(0.01)};
  const auto p = test::compress(c, exec, g);
  const auto idx = test::payload_indices(p);
  CHECK(idx == test::reference_topk(g, 500));
  CHECK(p.size() == 128 + 32 + 2000 + 1008);  // header, params (24 -> 32), u32 indices, fp16 values
  std::vector<float> out(g.size());
  c.decompress(exec, span<const std::byte>(p), span<float>(out));
  for (auto i : idx) REQUIRE(out[i] == half_value(g[i]));
}

TEST_CASE("dense payloads are summable", "[cast]") {
  // Integer-valued inputs: sums are exact in float, so decode(a) + decode(b) == decode(a + b).
  std::vector<float> a(1000), b(1000), ab(1000);
  for (int i = 0; i < 1000; ++i) {
    a[i] = static_cast<float>(i % 37 - 18);
    b[i] = static_cast<float>((i * 7) % 23 - 11);
    ab[i] = a[i] + b[i];
  }
  for (int which = 0; which < 2; ++which) {
    std::vector<float> da = which ? round_trip(dense_fp16{}, a) : round_trip(dense_raw{}, a);
    const auto db = which ? round_trip(dense_fp16{}, b) : round_trip(dense_raw{}, b);
    const auto dab = which ? round_trip(dense_fp16{}, ab) : round_trip(dense_raw{}, ab);
    for (int i = 0; i < 1000; ++i) REQUIRE(da[i] + db[i] == dab[i]);
  }
}

TEST_CASE("malformed dense and cast payloads are rejected", "[cast]") {
  host exec;
  const std::vector<float> x(10, 1.0f);
  std::vector<float> out(10);
  auto expect = [&](const auto& decoder, const std::vector<std::byte>& bytes, wire::format_errc code) {
    test::expect_rejected(decoder, exec, bytes, out, code);
  };
  // Header 96 bytes (entries at 48 and 72); params at 96: count u64, target u8, 7 zero bytes.
  const auto fp16 = test::compress(dense_fp16{}, exec, x);
  expect(dense_bf16{}, fp16, wire::format_errc::bad_params);  // same stage id, other target
  expect(dense_raw{}, fp16, wire::format_errc::codec_mismatch);
  expect(codec<sparsify::topk>{}, fp16, wire::format_errc::codec_mismatch);
  auto p = fp16;
  wire::detail::store_le(reinterpret_cast<std::uint8_t*>(p.data()) + 96, 9, 8);  // count != n
  expect(dense_fp16{}, p, wire::format_errc::bad_params);
  p = fp16;
  p[105] = std::byte{1};  // reserved byte of the cast parameters
  expect(dense_fp16{}, p, wire::format_errc::nonzero_reserved);
  p = fp16;
  wire::detail::store_le(reinterpret_cast<std::uint8_t*>(p.data()) + 72 + 16, 18, 8);  // values section size 20 -> 18
  expect(dense_fp16{}, p, wire::format_errc::bad_section_size);
  p = fp16;
  p[7] = std::byte{3};  // a third section the header size cannot hold
  expect(dense_fp16{}, p, wire::format_errc::bad_header_size);
}
