// Golden payloads: any change to the wire format, or to which elements top-k picks, fails here.
// The inputs use integer arithmetic only (no libm), so they are the same on every platform.
// To regenerate after an intended format change (bump the format version!):
//   GRADZIP_WRITE_GOLDEN=1 ./gradzip_host_tests "[golden]"
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "common/helpers.hpp"
#include "gradzip/hash/simhash.hpp"
#include "gradzip/lowrank/powersgd.hpp"
#include "gradzip/sketch/count_sketch.hpp"
#include "gradzip/transform/hadamard.hpp"

using namespace gradzip;

namespace {

template <class T>
std::vector<T> golden_input(std::size_t n, std::uint64_t seed) {
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto r = static_cast<std::int64_t>(hash64(seed, i) >> 40) - (std::int64_t{1} << 23);
    x[i] = static_cast<T>(static_cast<double>(r) / (1 << 20));  // exact in float and double
  }
  return x;
}

void check_golden(const std::string& name, const std::vector<std::byte>& bytes) {
  const std::string path = std::string(GRADZIP_GOLDEN_DIR) + "/" + name;
  if (std::getenv("GRADZIP_WRITE_GOLDEN") != nullptr) {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  const std::vector<char> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  INFO(name);
  REQUIRE(file.size() == bytes.size());
  CHECK(std::memcmp(file.data(), bytes.data(), bytes.size()) == 0);
}

}  // namespace

TEST_CASE("golden payloads are byte-stable", "[golden]") {
  host exec;
  check_golden("topk3_f32_n10.grdz",
               test::compress(codec<sparsify::topk>{sparsify::topk::count(3)}, exec,
                              std::vector<float>{0.1f, -9, 0.2f, 8, 0.3f, 7, 0.4f, 0.5f, 0.6f, 0.7f}));
  check_golden("topk1pct_f32_n4096.grdz",
               test::compress(codec<sparsify::topk>{sparsify::topk::ratio(0.01)}, exec,
                              golden_input<float>(4096, 9)));
  check_golden("topk5_f64_n64.grdz", test::compress(codec<sparsify::topk>{sparsify::topk::count(5)},
                                                    exec, golden_input<double>(64, 4)));
  auto sealed = test::compress(codec<sparsify::topk>{sparsify::topk::count(4)}, exec,
                               golden_input<float>(100, 2));
  wire::seal(span<std::byte>(sealed));
  check_golden("topk4_f32_n100_sealed.grdz", sealed);

  check_golden("dense_bf16_f32_n33.grdz",
               test::compress(codec<sparsify::none, quantize::cast_bf16, encode::none>{}, exec,
                              golden_input<float>(33, 6)));
  check_golden("topk7_fp16_f32_n200.grdz",
               test::compress(codec<sparsify::topk, quantize::cast_fp16>{sparsify::topk::count(7)},
                              exec, golden_input<float>(200, 7)));

  {
    using q2 = quantize::uniform<2, quantize::rounding::stochastic, 64>;
    check_golden("dense_uniform2_stochastic_f32_n150.grdz", test::compress(codec<sparsify::none, q2, encode::none>{{}, q2{99}}, exec,
                                          golden_input<float>(150, 8), {3, 4}));
    // The same stage over random-k's k = 100 values of 2,000: selection and rounding both keyed
    // by (seed, step, tensor id).
    check_golden("randomk100_uniform2_stochastic_f32_n2000.grdz",
                 test::compress(codec<sparsify::randomk, q2, encode::none>{sparsify::randomk::count(100, 21), q2{99}},
                                exec, golden_input<float>(2000, 18), {5, 6}));
  }
  check_golden("dense_uniform4_f32_n1000.grdz",
               test::compress(codec<sparsify::none, quantize::uniform<4>, encode::none>{}, exec,
                              golden_input<float>(1000, 9)));

  {
    using q = quantize::qsgd<7>;
    check_golden("dense_qsgd7_f32_n300.grdz", test::compress(codec<sparsify::none, q, encode::none>{{}, q{5}}, exec,
                                          golden_input<float>(300, 10), {1, 2}));
  }
  check_golden("dense_scaled_sign_f32_n600.grdz",
               test::compress(codec<sparsify::none, quantize::scaled_sign, encode::none>{}, exec,
                              golden_input<float>(600, 11)));

  {
    using t = quantize::terngrad<true, 64>;
    check_golden("dense_terngrad_clip_f32_n200.grdz", test::compress(codec<sparsify::none, t, encode::none>{{}, t{8}}, exec,
                                          golden_input<float>(200, 12), {2, 1}));
  }
  check_golden("dense_onebit_f32_n700.grdz",
               test::compress(codec<sparsify::none, quantize::onebit<>, encode::none>{}, exec,
                              golden_input<float>(700, 13)));

  check_golden("dense_fp8_e4m3_f32_n77.grdz",
               test::compress(codec<sparsify::none, quantize::cast_fp8_e4m3, encode::none>{}, exec,
                              golden_input<float>(77, 14)));
  {
    using nat = quantize::natural<8, 64>;
    check_golden("dense_natural8_f32_n130.grdz", test::compress(codec<sparsify::none, nat, encode::none>{{}, nat{6}}, exec,
                                          golden_input<float>(130, 15), {4, 3}));
  }

  // Index encodings: bitmap, delta-varint (three chunks), automatic (its choice recorded), and
  // DGC's sampled top-k.
  check_golden("topk40_bitmap_f32_n300.grdz",
               test::compress(codec<sparsify::topk, quantize::none, encode::bitmap>{sparsify::topk::count(40)}, exec,
                              golden_input<float>(300, 16)));
  check_golden("topk2500_delta_varint_f32_n9000.grdz",
               test::compress(codec<sparsify::topk, quantize::none, encode::delta_varint>{sparsify::topk::count(2500)},
                              exec, golden_input<float>(9000, 17)));
  check_golden("topk60_automatic_f32_n5000.grdz",
               test::compress(codec<sparsify::topk, quantize::none, encode::automatic>{sparsify::topk::count(60)}, exec,
                              golden_input<float>(5000, 18)));
  check_golden("sampled_topk_ratio5pct_f32_n4000.grdz",
               test::compress(codec<sparsify::sampled_topk>{sparsify::sampled_topk::ratio(0.05)}, exec,
                              golden_input<float>(4000, 19)));

  // The sketching family: SimHash, a Count Sketch table, and a Hadamard-rotated uniform 4-bit
  // payload (float adds, exact products and a correctly rounded sqrt only: platform-stable).
  {
    const hash::simhash sh{64, 16, 9};
    const auto x = golden_input<float>(300, 21);
    std::vector<std::byte> out(sh.max_compressed_bytes<float>(x.size()));
    out.resize(sh.compress(exec, span<const float>(x), span<std::byte>(out), {3, 1}));
    check_golden("simhash_b64_m16_f32_n300.grdz", out);
    const sketch::count_sketch cs{3, 100, 9};
    const auto y = golden_input<float>(500, 22);
    std::vector<std::byte> table(cs.payload_bytes(y.size()));
    cs.compress(exec, span<const float>(y), span<std::byte>(table));
    check_golden("count_sketch_r3_c100_f32_n500.grdz", table);
    using u4 = codec<sparsify::none, quantize::uniform<4>, encode::none>;
    const transform::rotated<u4> rotated{u4{}, transform::hadamard{256, 5}};
    check_golden("rotated_uniform4_b256_f32_n700.grdz", test::compress(rotated, exec, golden_input<float>(700, 23)));
  }

  using ef_t = feedback::error_feedback<codec<sparsify::topk>, float, host>;
  ef_t ef(exec, codec<sparsify::topk>{sparsify::topk::count(2)}, 8);
  const auto g = golden_input<float>(8, 5);
  std::vector<std::byte> out(ef.max_compressed_bytes<float>());
  ef.compress(exec, span<const float>(g), span<std::byte>(out));
  check_golden("error_feedback_state_f32_n8.grdz", ef.save(exec));

  // PowerSGD's two factor payloads for a 12 x 20 matrix at rank 2 (the 1-D tensor goes dense),
  // from Philox's initial Q: they pin the frame, the random start, the canonical sums and the
  // Gram-Schmidt (sqrt and division are correctly rounded everywhere).
  lowrank::powersgd_params params;
  params.rank = 2;
  params.seed = 21;
  lowrank::powersgd<float, host> ps(exec, {{12, 20}, {12}}, params);
  const auto m = golden_input<float>(252, 6);
  std::vector<std::byte> p(ps.payload_bytes(lowrank::factor::p)), q(ps.payload_bytes(lowrank::factor::q));
  ps.compress_p(exec, span<const float>(m), span<std::byte>(p), {3, 1});
  check_golden("powersgd_p_r2_f32_12x20.grdz", p);
  ps.compress_q(exec, span<const std::byte>(p), span<std::byte>(q));
  check_golden("powersgd_q_r2_f32_12x20.grdz", q);
}

TEST_CASE("golden payloads decode to their inputs' top-k", "[golden]") {
  std::ifstream in(std::string(GRADZIP_GOLDEN_DIR) + "/topk3_f32_n10.grdz", std::ios::binary);
  const std::vector<char> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(file.size() == 176);
  host exec;
  std::vector<float> out(10);
  codec<sparsify::topk>{}.decompress(
      exec, span<const std::byte>(reinterpret_cast<const std::byte*>(file.data()), file.size()),
      span<float>(out));
  CHECK(out == std::vector<float>{0, -9, 0, 8, 0, 7, 0, 0, 0, 0});
}
