// Sparse payloads with two faults each (an index fault and a bad value code), for the check that
// every executor reports the same one: the index structure's (bitmap, delta-varint) before the
// codes, and for COO the first failing element, its code before its index.
#pragma once

#include <cstring>
#include <vector>

#include "gradzip/gradzip.hpp"

namespace test::two_faults {

using coo_codec = gradzip::codec<gradzip::sparsify::topk, gradzip::quantize::terngrad<>, gradzip::encode::coo>;
using bitmap_codec = gradzip::codec<gradzip::sparsify::topk, gradzip::quantize::terngrad<>, gradzip::encode::bitmap>;
using delta_codec = gradzip::codec<gradzip::sparsify::topk, gradzip::quantize::terngrad<>, gradzip::encode::delta_varint>;

inline constexpr std::size_t n = 1001;
inline constexpr std::uint64_t k = 200;

/// k nonzeros, at 0, 5, 10, ...
inline std::vector<float> input() {
  std::vector<float> x(n, 0.0f);
  for (std::size_t i = 0; i < k; ++i) x[5 * i] = 1.0f + static_cast<float>(i % 7);
  return x;
}

template <class Codec>
Codec codec() {
  return Codec{gradzip::sparsify::topk::count(k)};
}

/// The host's payload of input(), and where its indices and values sections start.
template <class Codec>
struct payload {
  std::vector<std::byte> bytes;
  std::size_t indices = 0, values = 0;

  payload() {
    gradzip::host exec;
    const auto x = input();
    bytes.resize(codec<Codec>().template max_compressed_bytes<float>(n));
    bytes.resize(codec<Codec>().compress(exec, gradzip::span<const float>(x), gradzip::span<std::byte>(bytes)));
    gradzip::detail::payload_view v;
    const auto* base = reinterpret_cast<const std::uint8_t*>(bytes.data());
    REQUIRE(gradzip::detail::frame<Codec>::parse(base, bytes.size(), v).ok());
    indices = static_cast<std::size_t>(v.indices - base);
    values = static_cast<std::size_t>(v.values - base);
  }

  /// Value j's 2-bit TernGrad code becomes 3, above the stage's largest (2): both planes' bit.
  void bad_code(std::uint64_t j) {
    for (std::uint64_t plane = 0; plane < 2; ++plane) {
      const std::size_t word = values + static_cast<std::size_t>(((j / 32) * 2 + plane) * 4);
      std::uint32_t w;
      std::memcpy(&w, &bytes[word], 4);
      w |= std::uint32_t{1} << (j % 32);
      std::memcpy(&bytes[word], &w, 4);
    }
  }
};

/// COO: index j repeats index j - 1, and value `code_at`'s code is bad.
inline std::vector<std::byte> coo(std::uint64_t repeated_at, std::uint64_t code_at) {
  payload<coo_codec> p;
  gradzip::detail::payload_view v;
  REQUIRE(gradzip::detail::frame<coo_codec>::parse(reinterpret_cast<const std::uint8_t*>(p.bytes.data()),
                                                   p.bytes.size(), v).ok());
  const auto width = static_cast<std::size_t>(v.index_width);
  std::memcpy(&p.bytes[p.indices + repeated_at * width], &p.bytes[p.indices + (repeated_at - 1) * width], width);
  p.bad_code(code_at);
  return p.bytes;
}

/// Bitmap: a bit set past n, and value 0's code is bad.
inline std::vector<std::byte> bitmap() {
  payload<bitmap_codec> p;
  reinterpret_cast<std::uint8_t&>(p.bytes[p.indices + (n + 1) / 8]) |= static_cast<std::uint8_t>(1u << ((n + 1) % 8));
  p.bad_code(0);
  return p.bytes;
}

/// Delta-varint: chunk 0's base is 1 (it must be 0), and value 0's code is bad.
inline std::vector<std::byte> delta() {
  payload<delta_codec> p;
  p.bytes[p.indices] = std::byte{1};
  p.bad_code(0);
  return p.bytes;
}

}  // namespace test::two_faults
