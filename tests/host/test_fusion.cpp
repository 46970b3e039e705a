// fusion::layout, flat_buffer and fused_compressor: a group's payload is the codec's payload of
// the group's elements, and fused state evolves exactly as per-group state would.
#include <catch2/catch.hpp>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"
#include "gradzip/fusion/flat_buffer.hpp"
#include "gradzip/fusion/fused_compressor.hpp"

using namespace gradzip;
using Catch::Matchers::Contains;
using topk_codec = codec<sparsify::topk>;
using qsgd_codec = codec<sparsify::none, quantize::qsgd<7>, encode::none>;

namespace {
const std::vector<std::size_t> sizes = {1000, 10, 1, 4096, 0, 333, 2048};

template <class Codec>
std::vector<std::byte> compress_copy(const Codec& c, const std::vector<float>& x, quantize::compress_context ctx) {
  host exec;
  std::vector<std::byte> out(c.template max_compressed_bytes<float>(x.size()));
  out.resize(c.compress(exec, span<const float>(x), span<std::byte>(out), ctx));
  return out;
}

std::vector<float> slice(span<const float> flat, const fusion::layout& l, std::size_t g) {
  return std::vector<float>(flat.begin() + l.group_offset(g), flat.begin() + l.group_offset(g) + l.group_size(g));
}

/// One step of every group, fused and through each group's own wrapper: the payloads must be
/// equal (the wrapper gets tensor id = group). Returns the fused payloads.
template <class Fused, class PerGroup>
std::vector<std::vector<std::byte>> expect_same_step(Fused& fc, std::vector<PerGroup>& per_group, std::uint32_t step,
                                                     std::uint64_t salt) {
  host exec;
  const fusion::layout& l = fc.shape();
  const auto g = gradzip_tools::synthetic_gradient<float>(l.total(), salt);
  std::vector<std::vector<std::byte>> payloads;
  for (std::size_t group = 0; group < l.group_count(); ++group) {
    std::vector<std::byte> a(fc.max_compressed_bytes(group)), b(a.size());
    a.resize(fc.compress(exec, group, span<const float>(g), span<std::byte>(a), {step, 0}));
    const auto x = slice(span<const float>(g), l, group);
    b.resize(per_group[group].compress(exec, span<const float>(x), span<std::byte>(b), {step, group}));
    REQUIRE(a == b);
    payloads.push_back(a);
  }
  return payloads;
}
}  // namespace

TEST_CASE("fusion::layout places tensors back to back and cuts groups", "[fusion]") {
  const fusion::layout l(sizes, {0, 2, 4});
  CHECK(l.tensor_count() == 7);
  CHECK(l.total() == 7488);
  CHECK(l.offset(3) == 1011);
  CHECK(l.group_count() == 3);
  CHECK(l.group_offset(1) == 1010);
  CHECK(l.group_size(0) == 1010);
  CHECK(l.group_size(1) == 4097);
  CHECK(l.group_size(2) == 2381);
  CHECK(l.end_tensor(2) == 7);
  CHECK(l.largest_group() == 4097);
  CHECK(l.group_starts() == std::vector<std::size_t>{0, 2, 4});

  CHECK(fusion::layout(sizes).group_count() == 1);
  CHECK(fusion::layout::per_tensor(sizes).group_count() == 7);
  // Greedy: close a group once it holds 1500 elements.
  CHECK(fusion::layout::by_elements(sizes, 1500).group_starts() == std::vector<std::size_t>{0, 4});
  // The empty tensor 4 fills nothing: tensor 5 joins its group.
  CHECK(fusion::layout::by_elements(sizes, 1).group_starts() == std::vector<std::size_t>{0, 1, 2, 3, 4, 6});
  CHECK(fusion::layout().group_count() == 0);
  CHECK(fusion::layout().total() == 0);
}

TEST_CASE("fusion::layout rejects bad group starts, naming them", "[fusion]") {
  CHECK_THROWS_WITH(fusion::layout(sizes, {1, 3}), Contains("group_starts[0] is 1: the first group must start at tensor 0"));
  CHECK_THROWS_WITH(fusion::layout(sizes, {0, 3, 3}), Contains("group_starts[2] is 3, not after the group before it"));
  CHECK_THROWS_WITH(fusion::layout(sizes, {0, 7}), Contains("group 1 starts at tensor 7, but there are 7 tensors"));
  CHECK_THROWS_WITH(fusion::layout::by_elements(sizes, 0), Contains("min_elements must be >= 1, got 0"));
  CHECK_THROWS_WITH(fusion::layout(sizes).group_size(1), Contains("group 1 of 1"));
  // Tensors too: a gradzip::invalid_argument naming the tensor, not std::out_of_range.
  CHECK(fusion::layout(sizes).offset(7) == 7488);  // the end
  CHECK_THROWS_AS(fusion::layout(sizes).offset(8), gradzip::invalid_argument);
  CHECK_THROWS_WITH(fusion::layout(sizes).offset(8), Contains("the offset of tensor 8 of 7 (offsets go up to 7, the end)"));
  CHECK_THROWS_AS(fusion::layout(sizes).size(7), gradzip::invalid_argument);
  CHECK_THROWS_WITH(fusion::layout(sizes).size(7), Contains("tensor 7 of 7"));
}

TEST_CASE("fusion::flat_buffer views each tensor and group inside one allocation", "[fusion]") {
  host exec;
  fusion::flat_buffer<float, host> b(exec, fusion::layout(sizes, {0, 3}));
  CHECK(b.all().size() == 7488);
  CHECK(b.tensor(3).data() == b.all().data() + 1011);
  CHECK(b.tensor(3).size() == 4096);
  CHECK(b.group(1).data() == b.tensor(3).data());
  CHECK(b.group(1).size() == 4096 + 333 + 2048);
  CHECK(std::all_of(b.all().begin(), b.all().end(), [](float v) { return v == 0.0f; }));
}

TEST_CASE("a fused group's payload is the codec's payload of the group's elements", "[fusion]") {
  host exec;
  const fusion::layout l(sizes, {0, 2, 4});
  const auto g = gradzip_tools::synthetic_gradient<float>(l.total(), 7);
  const qsgd_codec q{};
  fusion::fused_compressor<qsgd_codec, float, host> fc(exec, q, l, fusion::state::none);
  std::vector<float> accum(l.total(), 0.0f);
  for (std::size_t group = 0; group < l.group_count(); ++group) {
    std::vector<std::byte> out(fc.max_compressed_bytes(group));
    const std::size_t bytes = fc.compress(exec, group, span<const float>(g), span<std::byte>(out), {3, 10});
    out.resize(bytes);
    // Group g draws tensor id 10 + g.
    CHECK(out == compress_copy(q, slice(span<const float>(g), l, group), {3, 10 + group}));
    fc.decompress_add(exec, group, span<const std::byte>(out), span<float>(accum), 0.5f);
    // The decode landed in the group's slice only.
    std::vector<float> expect(l.group_size(group), 0.0f);
    q.decompress_add(exec, span<const std::byte>(out), span<float>(expect), 0.5f);
    CHECK(slice(span<const float>(accum), l, group) == expect);
    for (std::size_t i = l.group_offset(group) + l.group_size(group); i < l.total(); ++i) REQUIRE(accum[i] == 0.0f);
  }
}

TEST_CASE("fused error feedback evolves exactly as error feedback per group", "[fusion]") {
  host exec;
  const fusion::layout l(sizes, {0, 3, 5});
  const topk_codec c{sparsify::topk::ratio(0.05)};
  fusion::fused_compressor<topk_codec, float, host> fc(exec, c, l, fusion::state::error_feedback);
  std::vector<feedback::error_feedback<topk_codec, float, host>> per_group;
  for (std::size_t group = 0; group < l.group_count(); ++group) per_group.emplace_back(exec, c, l.group_size(group));
  std::vector<std::byte> saved;
  std::vector<std::vector<std::byte>> step3;  // step 3's payloads, to replay after restore
  for (std::uint32_t step = 0; step < 5; ++step) {
    if (step == 3) saved = fc.save(exec);
    const auto payloads = expect_same_step(fc, per_group, step, 40 + step);
    if (step == 3) step3 = payloads;
  }
  // Restored to step 3's state, step 3 gives the same payloads again.
  fusion::fused_compressor<topk_codec, float, host> resumed(exec, c, l, fusion::state::error_feedback);
  resumed.restore(exec, span<const std::byte>(saved));
  const auto g3 = gradzip_tools::synthetic_gradient<float>(l.total(), 43);
  for (std::size_t group = 0; group < l.group_count(); ++group) {
    std::vector<std::byte> a(resumed.max_compressed_bytes(group));
    a.resize(resumed.compress(exec, group, span<const float>(g3), span<std::byte>(a), {3, 0}));
    CHECK(a == step3[group]);
  }
}

TEST_CASE("fused momentum correction evolves exactly as momentum correction per group", "[fusion]") {
  host exec;
  const fusion::layout l(sizes, {0, 4});
  const topk_codec c{sparsify::topk::ratio(0.02)};
  fusion::fused_compressor<topk_codec, float, host> fc(exec, c, l, fusion::state::momentum_correction, 0.9f);
  std::vector<feedback::momentum_correction<topk_codec, float, host>> per_group;
  for (std::size_t group = 0; group < l.group_count(); ++group) per_group.emplace_back(exec, c, l.group_size(group), 0.9f);
  for (std::uint32_t step = 0; step < 4; ++step) expect_same_step(fc, per_group, step, 70 + step);
  // u then v, whole: what per-group state holds, concatenated.
  fusion::fused_compressor<topk_codec, float, host> other(exec, c, l, fusion::state::momentum_correction, 0.9f);
  const std::vector<std::byte> state = fc.save(exec);
  other.restore(exec, span<const std::byte>(state));
  CHECK(other.save(exec) == state);
}

TEST_CASE("fused_compressor rejects bad arguments before its state changes", "[fusion]") {
  host exec;
  const fusion::layout l(sizes, {0, 3});
  const topk_codec c{sparsify::topk::ratio(0.05)};
  fusion::fused_compressor<topk_codec, float, host> fc(exec, c, l, fusion::state::error_feedback);
  const std::vector<std::byte> before = fc.save(exec);
  std::vector<float> g(l.total(), 1.0f), short_g(l.total() - 1, 1.0f);
  std::vector<std::byte> out(fc.max_compressed_bytes(1));
  CHECK_THROWS_WITH(fc.compress(exec, 1, span<const float>(short_g), span<std::byte>(out)),
                    Contains("fused_compressor::compress: the flat buffer has 7487 elements, the layout 7488"));
  CHECK_THROWS_WITH(fc.compress(exec, 1, span<const float>(g), span<std::byte>(out.data(), out.size() - 1)),
                    Contains("fused_compressor::compress: the output buffer holds"));
  CHECK_THROWS_WITH(fc.compress(exec, 2, span<const float>(g), span<std::byte>(out)), Contains("group 2 of 2"));
  CHECK(fc.save(exec) == before);
  CHECK_THROWS_WITH((fusion::fused_compressor<topk_codec, float, host>(exec, c, l, fusion::state::momentum_correction, 1.0f)),
                    Contains("momentum must be in [0, 1), got 1"));
  fusion::fused_compressor<topk_codec, float, host> none(exec, c, l, fusion::state::none);
  CHECK_THROWS_WITH(none.save(exec), Contains("the state is none"));
  fusion::fused_compressor<topk_codec, float, host> smaller(exec, c, fusion::layout({5, 5}), fusion::state::error_feedback);
  CHECK_THROWS_AS(smaller.restore(exec, span<const std::byte>(before)), format_error);
}
