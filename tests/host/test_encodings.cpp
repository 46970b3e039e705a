// Sparse index encodings: bitmap, delta-varint and automatic against COO, their sizes, and a
// table of malformed encodings that must be rejected.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"

using namespace gradzip;

namespace {

template <class Indices, class Values = quantize::none>
using topk_with = codec<sparsify::topk, Values, Indices>;

/// Indices section of a payload, through the public reader.
wire::section index_section(const std::vector<std::byte>& p) {
  return wire::read_header(span<const std::byte>(p)).sections[1];
}

std::uint8_t indices_param(const std::vector<std::byte>& p, std::uint64_t at) {
  const auto h = wire::read_header(span<const std::byte>(p));
  return static_cast<std::uint8_t>(p[h.sections[0].offset + at]);
}

/// Every density from 0 to 100 %: the decoded tensor equals COO's.
template <class Indices, class Values = quantize::none>
void check_against_coo(std::size_t n, double density, int threads) {
  const auto x = gradzip_tools::synthetic_gradient<float>(n, 7 + n);
  const std::uint64_t k = static_cast<std::uint64_t>(density * static_cast<double>(n));
  const topk_with<Indices, Values> c{sparsify::topk::count(k)};
  const topk_with<encode::coo, Values> reference{sparsify::topk::count(k)};
  host exec(threads);
  const auto p = test::compress(c, exec, x);
  const auto q = test::compress(reference, exec, x);
  REQUIRE(p.size() <= c.template max_compressed_bytes<float>(n));
  std::vector<float> got(n, 3.0f), want(n, 3.0f);
  c.decompress(exec, span<const std::byte>(p), span<float>(got));
  reference.decompress(exec, span<const std::byte>(q), span<float>(want));
  REQUIRE(got == want);
  c.decompress_add(exec, span<const std::byte>(p), span<float>(got), 0.5f);
  reference.decompress_add(exec, span<const std::byte>(q), span<float>(want), 0.5f);
  REQUIRE(got == want);
}

}  // namespace

TEST_CASE("bitmap, delta-varint and automatic decode to COO's tensor at densities 0-100 %", "[encodings]") {
  for (std::size_t n : {std::size_t{1}, std::size_t{63}, std::size_t{64}, std::size_t{1001}, std::size_t{70000}}) {
    for (double density : {0.0, 0.001, 0.01, 0.1, 0.5, 0.97, 1.0}) {
      for (int threads : {1, 2}) {
        INFO("n = " << n << ", density " << density << ", threads " << threads);
        check_against_coo<encode::bitmap>(n, density, threads);
        check_against_coo<encode::delta_varint>(n, density, threads);
        check_against_coo<encode::automatic>(n, density, threads);
        check_against_coo<encode::automatic, quantize::uniform<4>>(n, density, threads);
        check_against_coo<encode::delta_varint, quantize::qsgd<4>>(n, density, threads);
      }
    }
  }
}

TEST_CASE("threshold over a bitmap keeps the data-dependent count", "[encodings]") {
  const auto x = gradzip_tools::synthetic_gradient<float>(100000, 3);
  const codec<sparsify::threshold, quantize::none, encode::bitmap> c{sparsify::threshold{0.02}};
  host exec;
  const auto p = test::compress(c, exec, x);
  const std::uint64_t kept = static_cast<std::uint64_t>(
      std::count_if(x.begin(), x.end(), [](float v) { return std::abs(v) >= 0.02f; }));
  CHECK(p.size() == decltype(c)::layout(element_type::f32, x.size(), kept).total_bytes());
  std::vector<float> out(x.size());
  c.decompress(exec, span<const std::byte>(p), span<float>(out));
  for (std::size_t i = 0; i < x.size(); ++i) REQUIRE(out[i] == (std::abs(x[i]) >= 0.02f ? x[i] : 0.0f));
}

TEST_CASE("encoded index sections have the documented sizes", "[encodings]") {
  const std::size_t n = 1 << 20;
  const auto x = gradzip_tools::synthetic_gradient<float>(n, 11);
  host exec;
  for (double density : {0.001, 0.01, 0.1}) {
    const auto s = sparsify::topk::count(static_cast<std::uint64_t>(density * n));
    const std::uint64_t k = s.selected_count(n);
    const auto bitmap = test::compress(topk_with<encode::bitmap>{s}, exec, x);
    const auto delta = test::compress(topk_with<encode::delta_varint>{s}, exec, x);
    const auto coo = test::compress(topk_with<encode::coo>{s}, exec, x);
    const auto chosen = test::compress(topk_with<encode::automatic>{s}, exec, x);
    CHECK(index_section(bitmap).size == n / 8);
    CHECK(index_section(coo).size == 4 * k);
    const std::uint64_t delta_bytes = index_section(delta).size;
    CHECK(delta_bytes >= encode::delta_varint::min_section_bytes(k));
    CHECK(delta_bytes <= encode::delta_varint::max_section_bytes(k, n));
    // automatic takes the smallest of the three, and says which in its parameters.
    const std::uint64_t best = std::min({delta_bytes, std::uint64_t{n / 8}, 4 * k});
    CHECK(index_section(chosen).size == best);
    const std::uint8_t expected = best == 4 * k ? encode::coo::id : best == n / 8 ? encode::bitmap::id
                                                                                  : encode::delta_varint::id;
    CHECK(indices_param(chosen, topk_with<encode::automatic>::indices_params_at) == expected);
  }
  // Gaps near 1/density: at 1 % most fit one byte, so delta-varint beats 4-byte COO by ~3x.
  const auto one_percent = sparsify::topk::count(n / 100);
  const auto delta = test::compress(topk_with<encode::delta_varint>{one_percent}, exec, x);
  CHECK(static_cast<double>(index_section(delta).size) / (n / 100) < 1.6);
}

TEST_CASE("automatic picks COO, delta-varint and the bitmap as density grows", "[encodings]") {
  const std::size_t n = 1 << 20;
  const auto x = gradzip_tools::synthetic_gradient<float>(n, 12);
  host exec;
  const auto choice = [&](std::uint64_t k) {
    const auto p = test::compress(topk_with<encode::automatic>{sparsify::topk::count(k)}, exec, x);
    return indices_param(p, topk_with<encode::automatic>::indices_params_at);
  };
  CHECK(choice(3) == encode::coo::id);                 // 12 bytes: delta-varint needs at least 20
  CHECK(choice(n / 100) == encode::delta_varint::id);  // 1 %
  CHECK(choice(n / 4) == encode::bitmap::id);          // 25 %
}

TEST_CASE("delta-varint round trips 8-byte gaps when n >= 2^32", "[encodings]") {
  // The format functions alone: a tensor this large is not needed to exercise them.
  const std::uint64_t n = std::uint64_t{1} << 40;
  std::vector<std::uint64_t> idx;
  std::mt19937_64 rng(5);
  std::uint64_t at = 0;
  for (int j = 0; j < 3000; ++j) {
    const int shift = static_cast<int>(rng() % 30);  // gaps from 0 to ~2^30 and a few huge
    at += (j % 500 == 7 ? (std::uint64_t{1} << 33) : (rng() >> (34 + shift)));
    idx.push_back(at++);
  }
  const std::uint64_t k = idx.size();
  const int width = encode::delta_varint::gap_width(n);
  REQUIRE(width == 8);
  std::vector<std::uint64_t> offsets;
  std::uint64_t data = 0;
  for (std::uint64_t c = 0; c < encode::delta_varint::chunks(k); ++c) {
    offsets.push_back(data);
    data += encode::delta_varint::chunk_data_bytes(idx.data(), k, width, c);
  }
  std::vector<std::uint8_t> section(encode::delta_varint::data_at(k) + data);
  for (std::uint64_t c = 0; c < offsets.size(); ++c) {
    encode::delta_varint::write_chunk(section.data(), idx.data(), k, width, c, offsets[c]);
  }
  std::vector<std::uint64_t> back;
  for (std::uint64_t c = 0; c < offsets.size(); ++c) {
    const auto s = encode::delta_varint::decode_chunk(section.data(), section.size(), k, n, width, c,
                                                      [&](std::uint64_t j, std::uint64_t i) {
      REQUIRE(j == back.size());
      back.push_back(i);
    });
    REQUIRE(s.ok());
  }
  CHECK(back == idx);
}

// ---------------------------------------------------------------------------------------------
// Malformed encodings: each row edits a valid payload and names the error it must produce.

namespace {

struct malformed_case {
  const char* what;
  wire::format_errc expected;
  std::function<void(std::vector<std::byte>&, std::uint64_t params_at, std::uint64_t indices_at)> edit;
};

std::uint8_t& byte_at(std::vector<std::byte>& p, std::uint64_t at) {
  return reinterpret_cast<std::uint8_t&>(p[at]);
}

void put_u64(std::vector<std::byte>& p, std::uint64_t at, std::uint64_t v) { std::memcpy(&p[at], &v, 8); }
std::uint64_t get_u64(const std::vector<std::byte>& p, std::uint64_t at) {
  std::uint64_t v;
  std::memcpy(&v, &p[at], 8);
  return v;
}

template <class Codec>
void run_table(const Codec& c, std::size_t n, std::uint64_t k, const std::vector<malformed_case>& table) {
  // Indices 0, 3, 6, ...: gaps of 2 (one byte each), and index 0 itself.
  std::vector<float> x(n, 0.0f);
  for (std::uint64_t j = 0; j < k; ++j) x[3 * j] = 1.0f + static_cast<float>(j);
  host exec;
  const auto valid = test::compress(c, exec, x);
  const auto h = wire::read_header(span<const std::byte>(valid));
  for (const auto& row : table) {
    INFO(row.what);
    auto bad = valid;
    row.edit(bad, h.sections[0].offset + Codec::indices_params_at, h.sections[1].offset);
    std::vector<float> out(n, 2.0f);
    test::expect_rejected(c, exec, bad, out, row.expected);
  }
}

}  // namespace

TEST_CASE("malformed bitmap and delta-varint payloads are rejected with a clear error", "[encodings][malformed]") {
  using wire::format_errc;
  const std::size_t n = 3001 * 3 + 2;  // not a multiple of 64: the last word has unused bits
  const std::uint64_t k = 3001;        // three delta-varint chunks, the last group one slot
  run_table(topk_with<encode::bitmap>{sparsify::topk::count(k)}, n, k, {
    {"bitmap: a bit past n", format_errc::bitmap_bit_past_end,
     [&](auto& p, auto, auto ix) { byte_at(p, ix + (n + 1) / 8) |= std::uint8_t(1u << ((n + 1) % 8)); }},
    {"bitmap: one bit more than the count", format_errc::bitmap_count_mismatch,
     [](auto& p, auto, auto ix) { byte_at(p, ix) |= 2; }},
    {"bitmap: one bit fewer than the count", format_errc::bitmap_count_mismatch,
     [](auto& p, auto, auto ix) { byte_at(p, ix) &= std::uint8_t(~1u); }},
    {"bitmap: a nonzero reserved parameter byte", format_errc::nonzero_reserved,
     [](auto& p, auto pa, auto) { byte_at(p, pa + 3) = 1; }},
  });
  using dv = topk_with<encode::delta_varint>;
  const std::uint64_t table = 3 * encode::delta_varint::entry_bytes;  // at 33 % automatic picks the bitmap
  const std::uint64_t control = table;                 // control bytes follow the chunk table
  const std::uint64_t data = table + (k + 3) / 4;      // then the data
  run_table(dv{sparsify::topk::count(k)}, n, k, {
    {"delta: gap width parameter is not the one n needs", format_errc::bad_params,
     [](auto& p, auto pa, auto) { byte_at(p, pa) = 8; }},
    {"delta: chunk size parameter is not 2^10", format_errc::bad_params,
     [](auto& p, auto pa, auto) { byte_at(p, pa + 1) = 12; }},
    {"delta: a one-byte gap stored in two bytes (overlong)", format_errc::non_canonical_varint,
     [&](auto& p, auto, auto ix) {
       byte_at(p, ix + control) |= 1;  // slot 0 (gap 0): code 0 -> 1, two bytes ...
       byte_at(p, ix + data + 1) = 0;  // ... both zero
     }},
    {"delta: an unused slot of the last group is set", format_errc::non_canonical_varint,
     [&](auto& p, auto, auto ix) { byte_at(p, ix + control + (k + 3) / 4 - 1) |= 0x40; }},
    {"delta: chunk 1's base disagrees with chunk 0's last index", format_errc::bad_chunk_table,
     [&](auto& p, auto, auto ix) { put_u64(p, ix + 16, get_u64(p, ix + 16) + 3); }},
    {"delta: chunk 1's data offset points past its start", format_errc::varint_overrun,
     [&](auto& p, auto, auto ix) { put_u64(p, ix + 16 + 8, get_u64(p, ix + 16 + 8) + 1); }},
    {"delta: chunk 2's data offset lies past the section", format_errc::bad_chunk_table,
     [&](auto& p, auto, auto ix) { put_u64(p, ix + 32 + 8, std::uint64_t{1} << 40); }},
    {"delta: chunk 0's base is not 0", format_errc::bad_chunk_table,
     [&](auto& p, auto, auto ix) { put_u64(p, ix, 1); }},
    {"delta: a gap runs past n", format_errc::index_out_of_range,
     [&](auto& p, auto, auto ix) {
       // The last gap (one byte) becomes 255: index 3 (k - 1) + 255 >= n.
       const auto h = wire::read_header(span<const std::byte>(p));
       byte_at(p, ix + h.sections[1].size - 1) = 255;
     }},
    {"delta: a gap's byte changed keeps sizes but breaks the next chunk's base", format_errc::bad_chunk_table,
     [&](auto& p, auto, auto ix) { byte_at(p, ix + data + 5) = 3; }},
  });
  run_table(topk_with<encode::automatic>{sparsify::topk::count(k)}, n, k, {
    {"automatic: unknown encoding choice", format_errc::bad_params,
     [](auto& p, auto pa, auto) { byte_at(p, pa) = 9; }},
    {"automatic: a nonzero reserved byte", format_errc::nonzero_reserved,
     [](auto& p, auto pa, auto) { byte_at(p, pa + 4) = 1; }},
    {"automatic: says COO over its bitmap section", format_errc::bad_section_size,
     [](auto& p, auto pa, auto) {
       byte_at(p, pa) = encode::coo::id;
       byte_at(p, pa + 8) = 4;  // COO's own parameter: its index width
     }},
  });
}

TEST_CASE("delta-varint decodes every control byte and rejects overlong gaps in each slot", "[encodings]") {
  // Gaps of 1, 2, 3 and 4 bytes in every order: all 256 control bytes appear.
  const std::uint64_t widths[4] = {0x11, 0x1234, 0x123456, 0x1234567};
  std::vector<std::uint64_t> idx;
  std::uint64_t at = 0;
  for (int round = 0; round < 3; ++round) {  // three chunks: the last one decodes byte by byte
    for (unsigned ctrl = 0; ctrl < 256; ++ctrl) {
      for (unsigned s = 0; s < 4; ++s) {
        at += widths[(ctrl >> (2 * s)) & 3];
        idx.push_back(at++);
      }
    }
  }
  const std::uint64_t n = at + 100, k = idx.size();
  std::vector<std::uint64_t> offsets;
  std::uint64_t data = 0;
  for (std::uint64_t c = 0; c < encode::delta_varint::chunks(k); ++c) {
    offsets.push_back(data);
    data += encode::delta_varint::chunk_data_bytes(idx.data(), k, 4, c);
  }
  std::vector<std::uint8_t> section(encode::delta_varint::data_at(k) + data);
  for (std::uint64_t c = 0; c < offsets.size(); ++c) encode::delta_varint::write_chunk(section.data(), idx.data(), k, 4, c, offsets[c]);
  const auto decode = [&](const std::vector<std::uint8_t>& bytes, std::vector<std::uint64_t>& out) {
    out.clear();
    for (std::uint64_t c = 0; c < offsets.size(); ++c) {
      const auto s = encode::delta_varint::decode_chunk(bytes.data(), bytes.size(), k, n, 4, c,
                                                        [&](std::uint64_t, std::uint64_t i) { out.push_back(i); });
      if (!s.ok()) return s;
    }
    return wire::status{};
  };
  std::vector<std::uint64_t> back;
  REQUIRE(decode(section, back).ok());
  CHECK(back == idx);
  // Zero the top byte of the first 2-, 3- and 4-byte gap: each becomes overlong.
  const std::uint64_t data_at = encode::delta_varint::data_at(k);
  for (unsigned code = 1; code < 4; ++code) {
    auto bad = section;
    std::uint64_t byte = data_at;
    for (std::uint64_t j = 0; j < k; ++j) {
      const unsigned c = (bad[encode::delta_varint::chunks(k) * 16 + j / 4] >> (2 * (j % 4))) & 3;
      if (c == code) {
        bad[byte + c] = 0;
        break;
      }
      byte += c + 1;
    }
    const auto s = decode(bad, back);
    INFO("code " << code);
    CHECK(s.code == wire::format_errc::non_canonical_varint);
  }
}
