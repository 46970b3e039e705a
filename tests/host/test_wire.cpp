#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "common/helpers.hpp"

using namespace gradzip;

TEST_CASE("crc32c matches the standard check value", "[wire]") {
  const char* text = "123456789";
  CHECK(wire::crc32c(reinterpret_cast<const std::uint8_t*>(text), 9) == 0xE3069283u);
  CHECK(wire::crc32c(nullptr, 0) == 0u);
}

TEST_CASE("payload_layout aligns every section to 16 bytes", "[wire]") {
  wire::payload_layout l;
  l.add(wire::tag::params, 16);
  l.add(wire::tag::indices, 12);
  l.add(wire::tag::values, 12);
  CHECK(l.header_bytes() == 128);  // 48 + 3 x 24 = 120, rounded up
  CHECK(l.at(0).offset == 128);
  CHECK(l.at(1).offset == 144);
  CHECK(l.at(2).offset == 160);
  CHECK(l.total_bytes() == 176);
  wire::payload_layout empty;
  CHECK(empty.total_bytes() == 48);
}

TEST_CASE("header written by write_header parses back to the same fields", "[wire]") {
  wire::payload_layout l;
  l.add(wire::tag::values, 40);
  std::vector<std::uint8_t> bytes(l.total_bytes(), 0xAA);
  wire::write_header(bytes.data(), l, element_type::f64, wire::codec_id{1, 2, 3, 4}, 5);
  wire::zero_section_padding(bytes.data(), l);
  wire::header h;
  REQUIRE(wire::parse_header(bytes.data(), bytes.size(), h).ok());
  CHECK(h.type == element_type::f64);
  CHECK(h.codec == wire::codec_id{1, 2, 3, 4});
  CHECK(h.element_count == 5);
  CHECK(h.total_bytes == 128);
  CHECK(h.section_count == 1);
  CHECK(h.sections[0].offset == 80);
  CHECK(h.sections[0].size == 40);
  CHECK(bytes[120] == 0);  // padding after the 40-byte section is zeroed
  CHECK(bytes[127] == 0);
  CHECK(std::memcmp(bytes.data(), "GRDZ", 4) == 0);
}

TEST_CASE("seal adds a checksum that read_header verifies", "[wire]") {
  codec<sparsify::topk> c{sparsify::topk::count(2)};
  host exec;
  std::vector<float> x = {1, 2, 3, 4};
  auto payload = test::compress(c, exec, x);
  wire::seal(span<std::byte>(payload));
  const auto h = wire::read_header(span<const std::byte>(payload));
  CHECK((h.flags & wire::flag_checksum) != 0);
  std::vector<float> out(4);
  c.decompress(exec, span<const std::byte>(payload), span<float>(out));
  CHECK(out == std::vector<float>{0, 0, 3, 4});

  payload.back() = std::byte{0x01};  // a flipped padding byte is caught by the checksum
  try {
    wire::read_header(span<const std::byte>(payload));
    FAIL("corruption not detected");
  } catch (const format_error& e) {
    CHECK(e.code() == wire::format_errc::checksum_mismatch);
  }
  CHECK_THROWS_AS(c.decompress(exec, span<const std::byte>(payload), span<float>(out)), format_error);
}

TEST_CASE("seal rejects spans that cannot hold the payload", "[wire]") {
  std::vector<std::byte> tiny(10);
  CHECK_THROWS_AS(wire::seal(span<std::byte>(tiny)), gradzip::invalid_argument);
}
