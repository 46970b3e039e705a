// libFuzzer target: any byte string given to the reader and the sparse decoders either decodes or
// raises gradzip::format_error; AddressSanitizer and UBSan catch any out-of-bounds access.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <vector>

#include "gradzip/gradzip.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const gradzip::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  gradzip::host exec(1);
  const gradzip::codec<gradzip::sparsify::topk> codec{};
  // Decode into the size the header claims when that is modest, else into a small tensor (which
  // exercises the size check); never allocate from an untrusted size without a cap.
  std::size_t n = 16;
  try {
    const auto h = gradzip::wire::read_header(bytes);
    if (h.element_count <= (std::uint64_t{1} << 20)) n = static_cast<std::size_t>(h.element_count);
  } catch (const gradzip::format_error&) {
  }
  std::vector<float> accum(n, 0.0f);
  try {
    codec.decompress_add(exec, bytes, gradzip::span<float>(accum), 0.5f);
  } catch (const gradzip::format_error&) {
  }
  std::vector<double> dense(n);
  try {
    codec.decompress(exec, bytes, gradzip::span<double>(dense));
  } catch (const gradzip::format_error&) {
  }
  // The staged index encodings (the automatic decoder reads all three) and a bucketed stage
  // over them; the golden seeds include bitmap, delta-varint and automatic payloads.
  namespace gz = gradzip;
  const auto attempt = [&](const auto& c) {
    try {
      c.decompress_add(exec, bytes, gradzip::span<float>(accum), 0.5f);
    } catch (const gradzip::format_error&) {
    }
  };
  attempt(gz::codec<gz::sparsify::topk, gz::quantize::none, gz::encode::automatic>{});
  attempt(gz::codec<gz::sparsify::topk, gz::quantize::none, gz::encode::bitmap>{});
  attempt(gz::codec<gz::sparsify::topk, gz::quantize::none, gz::encode::delta_varint>{});
  attempt(gz::codec<gz::sparsify::topk, gz::quantize::uniform<4>, gz::encode::automatic>{});
  // Natural compression's decode reads a bucket exponent that a hostile payload sets freely.
  attempt(gz::codec<gz::sparsify::none, gz::quantize::natural<8, 64>, gz::encode::none>{});
  // A bucketed stage over random-k's implicit indices (golden: randomk100_uniform2_stochastic).
  attempt(gz::codec<gz::sparsify::randomk, gz::quantize::uniform<2, gz::quantize::rounding::stochastic, 64>,
                    gz::encode::none>{});
  // The sketching family, in the golden payloads' configurations (so the fuzzer starts from
  // payloads these readers accept): SimHash, a Hadamard-rotated quantizer, a Count Sketch's
  // estimate, and FetchSGD's state restored from the same bytes.
  attempt(gz::hash::simhash{64, 16, 9});
  using u4 = gz::codec<gz::sparsify::none, gz::quantize::uniform<4>, gz::encode::none>;
  attempt(gz::transform::rotated<u4>{u4{}, gz::transform::hadamard{256, 5}});
  // A sketch's (and a state's) size does not depend on n, so a tiny payload may ask for a long
  // estimate: only small n are estimated, which keeps the fuzzer's runs fast.
  const gz::sketch::count_sketch cs{3, 100, 9};
  const std::size_t small = n <= 4096 ? n : 16;
  try {
    cs.estimate(exec, bytes, gradzip::span<float>(accum.data(), small));
  } catch (const gradzip::format_error&) {
  }
  if (n > 0 && n <= 4096) {
    gz::sketch::fetchsgd fs{cs, n, 1};
    try {
      fs.restore(exec, bytes);
    } catch (const gradzip::format_error&) {
    }
  }
  // Zen's hash bitmap: the bytes as up to 64 words of part 3 of 8 over at most 4,096 indices.
  std::vector<std::uint64_t> words(std::min<std::size_t>(size / 8, 64));
  if (!words.empty()) std::memcpy(words.data(), data, words.size() * 8);
  try {
    (void)gz::hash::partition{8, 11}.decode_bitmap(3, small, gradzip::span<const std::uint64_t>(words));
  } catch (const gradzip::format_error&) {
  }
  return 0;
}
