// transform::hadamard and rotated<Codec>: the rotation is orthogonal (its own inverse up to
// scale, exactly on integer inputs), rotated quantization round trips, and it lowers the error
// of uniform 4-bit on the heavy-tailed gradient, and reports QSGD's (docs/sketching.md).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"
#include "gradzip/transform/hadamard.hpp"

using namespace gradzip;

namespace {

double relative_error(const std::vector<float>& truth, const std::vector<float>& approx) {
  double err = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < truth.size(); ++i) {
    err += (truth[i] - approx[i]) * static_cast<double>(truth[i] - approx[i]);
    norm += static_cast<double>(truth[i]) * truth[i];
  }
  return std::sqrt(err / norm);
}

template <class Codec>
std::vector<float> rotated_round_trip(const transform::rotated<Codec>& c, const std::vector<float>& x) {
  host exec;
  std::vector<std::byte> out(c.template max_compressed_bytes<float>(x.size()));
  out.resize(c.compress(exec, span<const float>(x), span<std::byte>(out), {1, 0}));
  std::vector<float> back(x.size(), 7.0f);
  c.decompress(exec, span<const std::byte>(out), span<float>(back));
  return back;
}

}  // namespace

TEST_CASE("the Walsh-Hadamard transform is its own inverse up to scale, exactly on integers", "[hadamard]") {
  for (std::uint32_t size : {2u, 8u, 256u, 4096u}) {
    std::vector<float> v(size), original(size);
    for (std::uint32_t i = 0; i < size; ++i) original[i] = v[i] = static_cast<float>(static_cast<int>(i * 37 % 101) - 50);
    transform::hadamard::walsh_hadamard(v.data(), size);
    transform::hadamard::walsh_hadamard(v.data(), size);
    for (std::uint32_t i = 0; i < size; ++i) REQUIRE(v[i] == original[i] * static_cast<float>(size));
  }
}

TEST_CASE("the randomized rotation is orthogonal and inverts", "[hadamard]") {
  host exec;
  const transform::hadamard r{1024, 5};
  const auto x = gradzip_tools::synthetic_gradient<float>(5000, 1);  // not whole blocks: padded
  std::vector<float> y(r.padded(x.size()));
  r.forward(exec, span<const float>(x), span<float>(y));
  double nx = 0.0, ny = 0.0;
  for (float v : x) nx += static_cast<double>(v) * v;
  for (float v : y) ny += static_cast<double>(v) * v;
  CHECK(ny == Approx(nx).epsilon(1e-5));  // orthogonal: the norm is kept
  r.inverse(exec, span<float>(y));
  for (std::size_t i = 0; i < x.size(); ++i) REQUIRE(y[i] == Approx(x[i]).margin(1e-5));
  for (std::size_t i = x.size(); i < y.size(); ++i) REQUIRE(std::abs(y[i]) < 1e-5);
  CHECK_THROWS_AS(transform::hadamard(1000, 1), invalid_argument);
}

TEST_CASE("rotation lowers uniform 4-bit's error on heavy-tailed gradients (QSGD's: reported)", "[hadamard]") {
  const auto x = gradzip_tools::synthetic_gradient<float>(1 << 18, 2);
  using u4 = codec<sparsify::none, quantize::uniform<4>, encode::none>;
  using q = codec<sparsify::none, quantize::qsgd<7>, encode::none>;
  const transform::hadamard r{1024, 9};
  const double u4_plain = relative_error(x, test::round_trip(u4{}, x));
  const double u4_rotated = relative_error(x, rotated_round_trip(transform::rotated<u4>{u4{}, r}, x));
  const double q_plain = relative_error(x, test::round_trip(q{{}, quantize::qsgd<7>{3}}, x, {1, 0}));
  const double q_rotated = relative_error(x, rotated_round_trip(transform::rotated<q>{q{{}, quantize::qsgd<7>{3}}, r}, x));
  WARN("relative L2 error, uniform 4-bit: " << u4_plain << " plain, " << u4_rotated << " rotated; QSGD 4-bit: "
                                            << q_plain << " plain, " << q_rotated << " rotated");
  CHECK(u4_rotated < 0.6 * u4_plain);  // max-min ranges shrink once each block's energy is spread
  // QSGD's error is relative to each bucket's L2 norm, which a rotation keeps overall; spreading a
  // block over 8 buckets of 128 evens the norms, which helps little here (docs/sketching.md).
  CHECK(q_rotated < 1.2 * q_plain);
}

TEST_CASE("rotated payloads are validated", "[hadamard]") {
  host exec;
  using u4 = codec<sparsify::none, quantize::uniform<4>, encode::none>;
  const transform::rotated<u4> c{u4{}, transform::hadamard{256, 1}};
  const auto x = gradzip_tools::synthetic_gradient<float>(1000, 3);
  std::vector<std::byte> p(c.max_compressed_bytes<float>(x.size()));
  p.resize(c.compress(exec, span<const float>(x), span<std::byte>(p)));
  std::vector<float> out(1000, 1.0f);
  const transform::rotated<u4> other_seed{u4{}, transform::hadamard{256, 2}};
  CHECK_THROWS_AS(other_seed.decompress_add(exec, span<const std::byte>(p), span<float>(out)), format_error);
  const transform::rotated<u4> other_block{u4{}, transform::hadamard{512, 1}};
  CHECK_THROWS_AS(other_block.decompress_add(exec, span<const std::byte>(p), span<float>(out)), format_error);
  std::vector<float> wrong(999);
  CHECK_THROWS_AS(c.decompress_add(exec, span<const std::byte>(p), span<float>(wrong)), format_error);
  // The plain codec refuses the nested payload (its codec id has the transform byte set).
  CHECK_THROWS_AS(u4{}.decompress_add(exec, span<const std::byte>(p), span<float>(out)), format_error);
  auto truncated = p;
  truncated.resize(p.size() - 16);
  CHECK_THROWS_AS(c.decompress_add(exec, span<const std::byte>(truncated), span<float>(out)), format_error);
  CHECK(out == std::vector<float>(1000, 1.0f));
  // An inner payload that the outer frame accepts but the inner codec refuses (its count, the
  // first parameter byte): decompress, which overwrites, must not have written anything either.
  auto bad_inner = p;
  const wire::header outer = wire::read_header(span<const std::byte>(p));
  const auto inner_at = outer.sections[1].offset;
  const wire::header inner = wire::read_header(span<const std::byte>(p).subspan(inner_at, outer.sections[1].size));
  bad_inner[inner_at + inner.sections[0].offset] ^= std::byte{1};
  CHECK_THROWS_AS(c.decompress(exec, span<const std::byte>(bad_inner), span<float>(out)), format_error);
  CHECK_THROWS_AS(c.decompress_add(exec, span<const std::byte>(bad_inner), span<float>(out)), format_error);
  CHECK(out == std::vector<float>(1000, 1.0f));
  // The inner payload moved 16 bytes later (the outer total and section offset moved with it):
  // the CUDA decoder reads it where compress puts it, so neither executor takes it.
  std::vector<std::byte> moved(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(inner_at));
  moved.insert(moved.end(), 16, std::byte{0});
  moved.insert(moved.end(), p.begin() + static_cast<std::ptrdiff_t>(inner_at), p.end());
  const auto bump = [&](std::size_t at) {
    std::uint64_t v;
    std::memcpy(&v, moved.data() + at, 8);
    v += 16;
    std::memcpy(moved.data() + at, &v, 8);
  };
  bump(24);           // total_bytes
  bump(48 + 24 + 8);  // section 1's offset
  CHECK(wire::read_header(span<const std::byte>(moved)).sections[1].offset == inner_at + 16);
  CHECK_THROWS_WITH(c.decompress_add(exec, span<const std::byte>(moved), span<float>(out)),
                    "rotated: section misaligned: section 1 at offset " + std::to_string(inner_at + 16));
  CHECK(out == std::vector<float>(1000, 1.0f));
}

TEST_CASE("rotated decoding into double accumulates in double, as every codec does", "[hadamard]") {
  host exec;
  using u4 = codec<sparsify::none, quantize::uniform<4>, encode::none>;
  const transform::rotated<u4> c{u4{}, transform::hadamard{64, 1}};
  const std::vector<double> zeros(64, 0.0);  // a payload that decodes to 0
  std::vector<std::byte> p(c.max_compressed_bytes<double>(64));
  p.resize(c.compress(exec, span<const double>(zeros), span<std::byte>(p)));
  std::vector<double> accum(64, 1.0000000000010001), plain = accum;
  c.decompress_add(exec, span<const std::byte>(p), span<double>(accum));
  CHECK(accum == plain);  // in float, 1.0000000000010001 became 1
  std::vector<std::byte> q(u4{}.max_compressed_bytes<double>(64));
  q.resize(u4{}.compress(exec, span<const double>(zeros), span<std::byte>(q)));
  u4{}.decompress_add(exec, span<const std::byte>(q), span<double>(plain));
  CHECK(accum == plain);
  std::vector<float> f(64, 3.0f);  // float outputs keep their one rounding
  c.decompress_add(exec, span<const std::byte>(p), span<float>(f), 0.5f);
  CHECK(f == std::vector<float>(64, 3.0f));
}
