// Malformed payloads: every way the bytes can lie is rejected with a precise code, and a
// rejected payload leaves the output untouched.
#include <catch2/catch.hpp>

#include <functional>
#include <random>
#include <string>

#include "common/helpers.hpp"
#include "common/two_faults.hpp"

using namespace gradzip;
using errc = wire::format_errc;

namespace {

// Base payload: top-3 of 10 floats -> indices {1, 3, 5}. Layout: header 128 bytes (3 sections),
// params at 128 (16 bytes: k u64, width u8, 7 zero), indices at 144 (12), values at 160 (12),
// total 176. Section table entries at 48, 72, 96: tag u32, reserved u32, offset u64, size u64.
const std::vector<float> base_input = {0.1f, -9, 0.2f, 8, 0.3f, 7, 0.4f, 0.5f, 0.6f, 0.7f};
const codec<sparsify::topk> topk3{sparsify::topk::count(3)};

std::vector<std::byte> base_payload() {
  host exec;
  return test::compress(topk3, exec, base_input);
}

void put(std::vector<std::byte>& b, std::size_t at, std::uint64_t v, int bytes) {
  wire::detail::store_le(reinterpret_cast<std::uint8_t*>(b.data()) + at, v, bytes);
}

struct bad_case {
  const char* name;
  std::function<void(std::vector<std::byte>&)> corrupt;
  errc expected;
  std::size_t output_size = 10;
};

constexpr std::size_t entry(int i) { return 48 + 24 * static_cast<std::size_t>(i); }

}  // namespace

TEST_CASE("the base payload has the documented layout", "[malformed]") {
  const auto p = base_payload();
  REQUIRE(p.size() == 176);
  CHECK(test::payload_indices(p) == std::vector<std::uint64_t>{1, 3, 5});
}

TEST_CASE("malformed payloads are rejected with a precise error", "[malformed]") {
  const std::vector<bad_case> cases = {
      {"empty buffer", [](auto& b) { b.clear(); }, errc::truncated},
      {"shorter than the fixed header", [](auto& b) { b.resize(47); }, errc::truncated},
      {"shorter than the header's section table", [](auto& b) { b.resize(100); }, errc::truncated},
      {"shorter than total_bytes", [](auto& b) { b.resize(170); }, errc::truncated},
      {"wrong magic", [](auto& b) { b[0] = std::byte{'X'}; }, errc::bad_magic},
      {"future version", [](auto& b) { put(b, 4, 2, 2); }, errc::unsupported_version},
      {"version zero", [](auto& b) { put(b, 4, 0, 2); }, errc::unsupported_version},
      {"unknown element type", [](auto& b) { b[6] = std::byte{9}; }, errc::unknown_element_type},
      {"element type zero", [](auto& b) { b[6] = std::byte{0}; }, errc::unknown_element_type},
      {"too many sections", [](auto& b) { b[7] = std::byte{17}; }, errc::bad_section_count},
      {"section count disagrees with header size", [](auto& b) { b[7] = std::byte{2}; },
       errc::bad_header_size},
      {"unknown flag bit", [](auto& b) { put(b, 12, 4, 4); }, errc::unknown_flags},
      {"reserved header word set", [](auto& b) { b[40] = std::byte{1}; }, errc::nonzero_reserved},
      {"checksum without its flag", [](auto& b) { put(b, 32, 0x1234, 4); }, errc::nonzero_reserved},
      {"header_bytes off the rule", [](auto& b) { put(b, 36, 120, 4); }, errc::bad_header_size},
      {"total_bytes beyond the buffer", [](auto& b) { put(b, 24, std::uint64_t{1} << 40, 8); },
       errc::truncated},
      {"total_bytes smaller than the header", [](auto& b) { put(b, 24, 96, 8); },
       errc::bad_total_size},
      {"total_bytes not a multiple of 16", [](auto& b) { put(b, 24, 170, 8); }, errc::bad_total_size},
      {"section reserved word set", [](auto& b) { put(b, entry(1) + 4, 1, 4); },
       errc::nonzero_reserved},
      {"misaligned section", [](auto& b) { put(b, entry(1) + 8, 145, 8); }, errc::section_misaligned},
      {"section size wraps around", [](auto& b) { put(b, entry(2) + 16, ~std::uint64_t{7}, 8); },
       errc::section_out_of_range},
      {"section far past the end", [](auto& b) { put(b, entry(2) + 8, std::uint64_t{1} << 62, 8); },
       errc::section_out_of_range},
      {"section inside the header", [](auto& b) { put(b, entry(0) + 8, 96, 8); },
       errc::section_out_of_range},
      {"overlapping sections", [](auto& b) { put(b, entry(1) + 8, 128, 8); }, errc::section_overlap},
      {"unexpected section tag", [](auto& b) { put(b, entry(1), 7, 4); }, errc::bad_section_tag},
      {"payload of another codec", [](auto& b) { b[9] = std::byte{9}; }, errc::codec_mismatch},
      {"params section of the wrong size", [](auto& b) { put(b, entry(0) + 16, 8, 8); },
       errc::bad_section_size},
      {"more selected than elements", [](auto& b) { put(b, 128, 11, 8); }, errc::count_overflow},
      {"count disagrees with the index section", [](auto& b) { put(b, 128, 4, 8); },
       errc::bad_section_size},
      {"index width not the rule's", [](auto& b) { b[136] = std::byte{8}; }, errc::bad_params},
      {"params reserved byte set", [](auto& b) { b[140] = std::byte{1}; }, errc::nonzero_reserved},
      {"count times width overflows",
       [](auto& b) {
         put(b, 16, std::uint64_t{1} << 63, 8);  // n = 2^63 needs 8-byte indices
         b[136] = std::byte{8};
         put(b, 128, std::uint64_t{1} << 62, 8);  // k = 2^62: k x 8 overflows
       },
       errc::count_overflow},
      {"index equal to n", [](auto& b) { put(b, 144 + 4, 10, 4); }, errc::index_out_of_range},
      {"index far out of range", [](auto& b) { put(b, 144 + 8, 0xFFFFFFFF, 4); },
       errc::index_out_of_range},
      {"duplicate index", [](auto& b) { put(b, 144 + 8, 3, 4); }, errc::index_not_increasing},
      {"unsorted indices", [](auto& b) { put(b, 144, 4, 4); }, errc::index_not_increasing},
      {"output of another size", [](auto&) {}, errc::size_mismatch, 11},
  };
  REQUIRE(cases.size() >= 15);
  host exec;
  for (const auto& c : cases) {
    SECTION(c.name) {
      auto payload = base_payload();
      c.corrupt(payload);
      std::vector<float> accum(c.output_size, 1.0f);
      try {
        topk3.decompress_add(exec, span<const std::byte>(payload), span<float>(accum));
        FAIL("accepted: " << c.name);
      } catch (const format_error& e) {
        INFO(e.what());
        CHECK(e.code() == c.expected);
        CHECK(std::string(e.what()).rfind("decompress: ", 0) == 0);
      }
      CHECK(accum == std::vector<float>(c.output_size, 1.0f));  // untouched
    }
  }
}

TEST_CASE("a payload with two faults is refused for the first, as the CUDA decoder refuses it", "[malformed]") {
  namespace tf = test::two_faults;
  const auto message = [](const auto& codec, const std::vector<std::byte>& bytes, int threads) {
    host exec(threads);
    std::vector<float> out(tf::n, 1.0f);
    try {
      codec.decompress_add(exec, span<const std::byte>(bytes), span<float>(out));
    } catch (const format_error& e) {
      CHECK(out == std::vector<float>(tf::n, 1.0f));
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    const auto coo = tf::codec<tf::coo_codec>();
    // COO: the first failing element; at one element its code before its index. A bad code
    // after a bad index was reported first: the chunk's codes were all checked before its indices.
    CHECK(message(coo, tf::coo(5, 100), threads) == "decompress: indices not strictly increasing: index[5] = 20 after 20");
    CHECK(message(coo, tf::coo(100, 5), threads) ==
          "decompress: value code out of range: value 5 has code 3, the stage's largest is 2");
    CHECK(message(coo, tf::coo(5, 5), threads) ==
          "decompress: value code out of range: value 5 has code 3, the stage's largest is 2");
    // Bitmap and delta-varint: their indices, then the codes.
    CHECK(message(tf::codec<tf::bitmap_codec>(), tf::bitmap(), threads) ==
          "decompress: bitmap sets a bit past the element count: bit 1002 is set, n = 1001");
    CHECK(message(tf::codec<tf::delta_codec>(), tf::delta(), threads).rfind("decompress: chunk table disagrees with the data", 0) == 0);
  }
}

TEST_CASE("index encodings' errors name the slot, the chunk, the parameter and the bound they break", "[malformed]") {
  const std::size_t n = 3001 * 3 + 2;
  const std::uint64_t k = 3001;  // 3 delta-varint chunks; the last control group has one slot
  std::vector<float> x(n, 0.0f);
  for (std::uint64_t j = 0; j < k; ++j) x[3 * j] = 1.0f + static_cast<float>(j);
  host exec;
  const auto refused = [&](const auto& codec, const std::vector<std::byte>& bytes) {
    std::vector<float> out(n);
    try {
      codec.decompress(exec, span<const std::byte>(bytes), span<float>(out));
    } catch (const format_error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const codec<sparsify::topk, quantize::none, encode::delta_varint> delta{sparsify::topk::count(k)};
  const auto good = test::compress(delta, exec, x);
  const auto h = wire::read_header(span<const std::byte>(good));
  const std::size_t indices = h.sections[1].offset, control = 3 * encode::delta_varint::entry_bytes;
  // The last group's unused slot 2 set (slot 1 clear): it named slot 1 and its code 0.
  auto unused = good;
  reinterpret_cast<std::uint8_t&>(unused[indices + control + (k + 3) / 4 - 1]) |= 0x30;
  CHECK(refused(delta, unused) == "decompress: non-canonical varint: gap 3002 uses length code 3, its value needs code 0");
  // Chunk 1's data offset past the data: it blamed chunk 0's entry.
  auto far = good;
  put(far, indices + encode::delta_varint::entry_bytes + 8, std::uint64_t{1} << 40, 8);
  const std::uint64_t data_size = h.sections[1].size - encode::delta_varint::data_at(k);
  CHECK(refused(delta, far) == "decompress: chunk table disagrees with the data: chunk 1 entry holds 1099511627776, "
                               "the data give " + std::to_string(data_size));
  // A parameter: its payload offset (it said "params byte 136") and the value expected.
  const codec<sparsify::topk, quantize::none, encode::coo> coo{sparsify::topk::count(k)};
  auto wide = test::compress(coo, exec, x);
  const std::size_t width_at = wire::read_header(span<const std::byte>(wide)).sections[0].offset + 8;
  wide[width_at] = std::byte{8};
  CHECK(refused(coo, wide) == "decompress: invalid codec parameters: the parameter at payload byte " +
                                  std::to_string(width_at) + " has value 8, expected 4");
  // Delta-varint's section size against the bound it breaks (it said "expected k" or the least).
  CHECK(wire::message(encode::check_section_size(encode::delta_varint::id, 100, 1000, 50, 1)) ==
        "section size disagrees with its count: section 1 has 50 bytes, expected " +
            std::to_string(encode::delta_varint::min_section_bytes(100)));
  CHECK(wire::message(encode::check_section_size(encode::delta_varint::id, 100, 1000, 120, 1)) ==
        "section size disagrees with its count: section 1 has 120 bytes, expected " +
            std::to_string(encode::delta_varint::min_section_bytes(100)));
  CHECK(wire::message(encode::check_section_size(encode::delta_varint::id, 10, 100, 1000, 1)) ==
        "section size disagrees with its count: section 1 has 1000 bytes, expected " +
            std::to_string(encode::delta_varint::max_section_bytes(10, 100)));
  CHECK(encode::check_section_size(encode::delta_varint::id, 10, 100, encode::delta_varint::max_section_bytes(10, 100), 1).ok());
  CHECK(wire::message(encode::check_section_size(encode::delta_varint::id, ~std::uint64_t{0}, ~std::uint64_t{0}, 64, 1)) ==
        "section size disagrees with its count: section 1 has 64 bytes, expected 18446744073709551615");
  // COO's k x 8 past 64 bits: the count against the largest that fits (it named n as the limit).
  CHECK(wire::message(encode::check_section_size(encode::coo::id, (std::uint64_t{1} << 61) + 1, std::uint64_t{1} << 62, 0, 1)) ==
        "count overflow: count 2305843009213693953 exceeds the limit 2305843009213693951");
}

TEST_CASE("a payload of another codec is named by its stages", "[malformed]") {
  host exec;
  const auto payload = base_payload();  // topk/none/coo
  using qsgd4 = quantize::qsgd<7>;
  const codec<sparsify::none, qsgd4, encode::none> q{{}, qsgd4{1}};
  std::vector<float> accum(10);
  try {
    q.decompress_add(exec, span<const std::byte>(payload), span<float>(accum));
    FAIL("accepted a top-k payload");
  } catch (const format_error& e) {
    CHECK(e.code() == errc::codec_mismatch);
    CHECK_THAT(e.what(), Catch::Contains("expected none/qsgd/none, got topk/none/coo"));
  }
  CHECK(wire::codec_name(wire::codec_id{1, 7, 2, 4}.packed()) == "hadamard+hashed_topk/uniform/automatic");
  CHECK(wire::codec_name(wire::codec_id{9, 99, 0, 0}.packed()) == "unknown transform 9+unknown structure 99/none/none");
  CHECK(wire::codec_name(wire::codec_id{0, 10, 0, 1}.packed()) == "zen_part/none/coo");  // a sparse_sync message
}

TEST_CASE("random corruption never escapes as anything but format_error", "[malformed]") {
  const auto good = base_payload();
  host exec;
  std::mt19937_64 rng(12345);
  int accepted = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    auto payload = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) payload[rng() % payload.size()] ^= std::byte(1u << (rng() % 8));
    if (rng() % 8 == 0) payload.resize(rng() % payload.size());
    std::vector<float> accum(10, 0.0f);
    try {
      topk3.decompress_add(exec, span<const std::byte>(payload), span<float>(accum));
      ++accepted;  // flips in values or padding-free spots can still be valid payloads
    } catch (const format_error&) {
    }
  }
  CHECK(accepted < 20000);
}
