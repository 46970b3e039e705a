// A tensor above 2^31 elements (8.6 GB of floats): sizes, chunking and positions are 64-bit.
// Needs about 11 GB of memory; skipped (reported as such) when the machine has less.
#include <catch2/catch.hpp>

#include <unistd.h>

#include "common/helpers.hpp"

using namespace gradzip;

namespace {
std::uint64_t physical_memory_bytes() {
  return static_cast<std::uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<std::uint64_t>(sysconf(_SC_PAGE_SIZE));
}
}  // namespace

TEST_CASE("topk over more than 2^31 elements", "[large]") {
  const std::size_t n = (std::size_t{1} << 31) + 977;
  if (physical_memory_bytes() < (std::uint64_t{16} << 30)) {
    WARN("GRADZIP_SKIP_LARGE: needs 16 GiB of memory");
    return;
  }
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 1021) * 1e-3f;  // <= 1.02
  // Plant the winners on both sides of 2^31, the last one at the very end.
  const std::vector<std::uint64_t> planted = {5, (std::uint64_t{1} << 31) - 1, std::uint64_t{1} << 31,
                                              (std::uint64_t{1} << 31) + 500, n - 1};
  for (std::size_t j = 0; j < planted.size(); ++j) x[planted[j]] = -10.0f - static_cast<float>(j);
  host exec;
  const codec<sparsify::topk> c{sparsify::topk::count(planted.size())};
  const auto payload = test::compress(c, exec, x);
  CHECK(test::payload_indices(payload) == planted);
  CHECK(wire::read_header(span<const std::byte>(payload)).element_count == n);
  // Decode-accumulate into the large tensor: only the planted entries change.
  c.decompress_add(exec, span<const std::byte>(payload), span<float>(x), -1.0f);
  for (auto i : planted) CHECK(x[i] == 0.0f);
  CHECK(x[n - 2] == static_cast<float>((n - 2) % 1021) * 1e-3f);
}
