// Test helpers: a plain reference top-k and small utilities.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "gradzip/gradzip.hpp"
#include "gradzip/hash/partition.hpp"

namespace test {

/// The reference: sort all indices by (|x| desc, index asc) with the documented NaN rule, take k,
/// return them sorted ascending.
template <class T>
std::vector<std::uint64_t> reference_topk(const std::vector<T>& x, std::uint64_t k) {
  std::vector<std::uint64_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::uint64_t a, std::uint64_t b) {
    return gradzip::magnitude_key(x[a]) > gradzip::magnitude_key(x[b]);
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

/// x with a NaN (key 0x7FC00000) at each of sampled top-k `s`'s sample positions, then, at the other
/// positions from the start, 100 infinities (every 7th) among target_count(n) NaNs of a larger key:
/// the sample's bracket floor is a NaN's key, and the threshold, capped at the largest finite
/// float, lies below it.
inline std::vector<float> nan_floor_input(const gradzip::sparsify::sampled_topk& s, std::vector<float> x) {
  const std::uint64_t n = x.size(), size = s.sample_size(n);
  const auto nan = [](std::uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  };
  std::vector<bool> sampled(n, false);
  for (std::uint64_t j = 0; j < size; ++j) {
    const std::uint64_t i = gradzip::sparsify::sampled_topk::sample_position(s.seed(), n, size, j);
    sampled[i] = true;
    x[i] = nan(0x7FC00000u);
  }
  std::uint64_t nans = 0, infinities = 0;
  for (std::uint64_t i = 0; i < n && nans < s.target_count(n); ++i) {
    if (sampled[i]) continue;
    if (infinities < 100 && i % 7 == 0) {
      x[i] = std::numeric_limits<float>::infinity();
      ++infinities;
    } else {
      x[i] = nan(0x7FC00001u);
      ++nans;
    }
  }
  return x;
}

/// Indices stored in a top-k + COO payload (read through the public reader).
inline std::vector<std::uint64_t> payload_indices(const std::vector<std::byte>& payload) {
  const auto h = gradzip::wire::read_header(gradzip::span<const std::byte>(payload));
  const auto& s = h.sections[1];
  const int width = gradzip::encode::coo::index_width(h.element_count);
  std::vector<std::uint64_t> out(s.size / width);
  const auto* p = reinterpret_cast<const std::uint8_t*>(payload.data()) + s.offset;
  for (std::size_t j = 0; j < out.size(); ++j) out[j] = gradzip::encode::coo::load(p, width, j);
  return out;
}

template <class Codec, class T>
std::vector<std::byte> compress(const Codec& c, gradzip::host& exec, const std::vector<T>& x,
                                gradzip::quantize::compress_context ctx = {}) {
  std::vector<std::byte> out(c.template max_compressed_bytes<T>(x.size()));
  const std::size_t bytes = c.compress(exec, gradzip::span<const T>(x.data(), x.size()),
                                       gradzip::span<std::byte>(out), ctx);
  out.resize(bytes);
  return out;
}

/// A dense codec (every element, no indices) with the given values stage.
template <class Values>
using dense = gradzip::codec<gradzip::sparsify::none, Values, gradzip::encode::none>;

/// Compresses x on the host (with `threads`, 0 = default) and decodes it into floats.
template <class Codec, class T>
std::vector<float> round_trip(const Codec& c, const std::vector<T>& x,
                              gradzip::quantize::compress_context ctx = {}, int threads = 0) {
  gradzip::host exec(threads);
  std::vector<std::byte> p(c.template max_compressed_bytes<T>(x.size()));
  const auto bytes = c.compress(exec, gradzip::span<const T>(x.data(), x.size()),
                                gradzip::span<std::byte>(p), ctx);
  std::vector<float> out(x.size());
  c.decompress(exec, gradzip::span<const std::byte>(p.data(), bytes), gradzip::span<float>(out));
  return out;
}

/// Decodes `payload` with `decoder` into `out` and checks that it is rejected with `code` and
/// that `out` is left untouched.
template <class Codec>
void expect_rejected(const Codec& decoder, gradzip::host& exec, const std::vector<std::byte>& payload,
                     std::vector<float>& out, gradzip::wire::format_errc code) {
  const std::vector<float> before = out;
  try {
    decoder.decompress(exec, gradzip::span<const std::byte>(payload), gradzip::span<float>(out));
    FAIL("accepted");
  } catch (const gradzip::format_error& e) {
    INFO(e.what());
    CHECK(e.code() == code);
  }
  CHECK(out == before);
}

/// Part p's members below n, in increasing order, and every third of them (a result to encode).
struct part_members {
  std::vector<std::uint64_t> all, every_third;
  part_members(const gradzip::hash::partition& zen, std::uint32_t p, std::uint64_t n) {
    for (std::uint64_t i = 0; i < n; ++i) {
      if (zen.part_of(i) == p) all.push_back(i);
    }
    for (std::size_t j = 0; j < all.size(); j += 3) every_third.push_back(all[j]);
  }
};

}  // namespace test
