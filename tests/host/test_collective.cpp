// comm::allreducer over an in-process communicator: P threads, one per rank, sharing buffers
// behind a barrier. Checks the average against a plain reference on both paths (one allreduce
// for summable codecs, gather + decode otherwise), error feedback, and that a peer's bad bytes
// raise an error naming that peer.
#include <catch2/catch.hpp>

#include <condition_variable>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>

#include "common/helpers.hpp"
#include "common/thread_communicator.hpp"
#include "common/synthetic_gradient.hpp"
#include "gradzip/comm/collective.hpp"
#include "gradzip/comm/planned_allreducer.hpp"
#include "gradzip/comm/powersgd.hpp"
#include "gradzip/comm/sparse_cost.hpp"
#include "gradzip/comm/sparse_sync.hpp"
#include "gradzip/comm/sparse_sync_auto.hpp"
#include "../../examples/stochastic_bf16.hpp"

using namespace gradzip;
using gradzip_test::on_ranks;
using gradzip_test::shared_state;
using gradzip_test::sparse_gradient;
using gradzip_test::thread_communicator;

namespace {

std::vector<float> gradient_of(int rank, std::size_t n) { return gradzip_tools::synthetic_gradient<float>(n, 500 + rank); }

/// The reference: the mean over ranks of each rank's decoded payload.
template <class Codec>
std::vector<float> reference_average(const Codec& c, int ranks, std::size_t n) {
  std::vector<float> mean(n, 0.0f);
  host exec(1);
  for (int r = 0; r < ranks; ++r) {
    const auto p = test::compress(c, exec, gradient_of(r, n));
    c.decompress_add(exec, span<const std::byte>(p), span<float>(mean), 1.0f / static_cast<float>(ranks));
  }
  return mean;
}

}  // namespace

TEST_CASE("allreducer averages over ranks through a gather for non-summable codecs", "[collective]") {
  const int ranks = 4;
  const std::size_t n = 30000;
  using topk = codec<sparsify::topk, quantize::none, encode::automatic>;
  const topk c{sparsify::topk::ratio(0.01)};
  static_assert(!comm::allreducer<topk, float, host>::summable_path());
  const auto expected = reference_average(c, ranks, n);
  std::vector<std::vector<float>> got(ranks);
  const auto errors = on_ranks(ranks, -1, [&](int r, comm::communicator& comm) {
    host exec(1);
    comm::allreducer<topk, float, host> all(exec, c, n, ranks, false);
    auto g = gradient_of(r, n);
    all.run(comm, exec, span<float>(g));
    got[static_cast<std::size_t>(r)] = g;
  });
  for (int r = 0; r < ranks; ++r) {
    REQUIRE(errors[r].empty());
    CHECK(got[r] == expected);  // the same order of accumulation as the reference
  }
}

TEST_CASE("allreducer sums summable payloads with one allreduce", "[collective]") {
  const int ranks = 3;
  const std::size_t n = 20000;
  using rk = codec<sparsify::randomk, quantize::none, encode::none>;
  const rk c{sparsify::randomk::ratio(0.02, 11)};
  static_assert(comm::allreducer<rk, float, host>::summable_path());
  std::vector<std::vector<float>> got(ranks);
  const auto errors = on_ranks(ranks, -1, [&](int r, comm::communicator& comm) {
    host exec(1);
    comm::allreducer<rk, float, host> all(exec, c, n, ranks, false);
    auto g = gradient_of(r, n);
    all.run(comm, exec, span<float>(g), {5, 1});
    got[static_cast<std::size_t>(r)] = g;
  });
  // Reference: the summed gradient's payload, decoded and divided by the ranks.
  std::vector<float> sum(n, 0.0f);
  for (int r = 0; r < ranks; ++r) {
    const auto g = gradient_of(r, n);
    for (std::size_t i = 0; i < n; ++i) sum[i] += g[i];
  }
  host exec;
  std::vector<float> expected(n, 0.0f);
  const auto summed = test::compress(c, exec, sum, {5, 1});
  c.decompress_add(exec, span<const std::byte>(summed), span<float>(expected), 1.0f / ranks);
  for (int r = 0; r < ranks; ++r) {
    REQUIRE(errors[r].empty());
    for (std::size_t i = 0; i < n; ++i) REQUIRE(got[r][i] == Approx(expected[i]).margin(1e-6));
  }
}

TEST_CASE("allreducer sums a user stage that declares summed_as with one allreduce", "[collective][extending]") {
  const int ranks = 3;
  const std::size_t n = 4000;
  using c_t = codec<sparsify::none, example::stochastic_bf16, encode::none>;
  const c_t c{{}, example::stochastic_bf16{5}};
  static_assert(comm::allreducer<c_t, float, host>::summable_path());
  // The communicator sums the bf16 values sections (in float, in rank order, rounded to bf16);
  // every rank then decodes the same sum, within bf16 rounding of the true average.
  std::vector<std::vector<float>> got(ranks);
  const auto errors = on_ranks(ranks, -1, [&](int r, comm::communicator& comm) {
    host exec(1);
    comm::allreducer<c_t, float, host> all(exec, c, n, ranks, false);
    auto g = gradient_of(r, n);
    all.run(comm, exec, span<float>(g), {2, 0});
    got[static_cast<std::size_t>(r)] = g;
    RANK_CHECK(all.last_sent_bytes() == all.last_payload_bytes());  // no size exchange: one allreduce
  });
  for (int r = 0; r < ranks; ++r) {
    REQUIRE(errors[r].empty());
    CHECK(got[r] == got[0]);  // every rank decodes the same sum
  }
  // Within bf16 rounding of the true average (each payload within one bf16 step of its input).
  std::vector<float> truth(n, 0.0f);
  for (int r = 0; r < ranks; ++r) {
    const auto g = gradient_of(r, n);
    for (std::size_t i = 0; i < n; ++i) truth[i] += g[i] / ranks;
  }
  for (std::size_t i = 0; i < n; ++i) REQUIRE(std::abs(got[0][i] - truth[i]) <= 0.02f * (1e-3f + std::abs(truth[i])) * ranks);
}

TEST_CASE("alltoallv exchanges personalized parts, through an adapter's own and the default", "[collective][alltoallv]") {
  const int ranks = 4;
  // Rank s sends rank d a part of (s * 7 + d * 3) % 11 bytes (some empty), byte i being
  // s * 64 + d * 8 + i % 8: every byte says where it came from and where it belongs.
  const auto part_size = [](int s, int d) { return static_cast<std::uint64_t>((s * 7 + d * 3) % 11); };
  const auto byte_of = [](int s, int d, std::uint64_t i) { return static_cast<std::byte>(s * 64 + d * 8 + i % 8); };
  for (const bool own : {true, false}) {
    INFO((own ? "the adapter's alltoallv" : "the communicator's default"));
    const auto errors = on_ranks(ranks, -1, [&](int r, comm::communicator& comm) {
      std::vector<std::uint64_t> send_sizes(ranks), recv_sizes(ranks);
      std::vector<std::byte> send;
      for (int d = 0; d < ranks; ++d) {
        send_sizes[d] = part_size(r, d);
        for (std::uint64_t i = 0; i < send_sizes[d]; ++i) send.push_back(byte_of(r, d, i));
      }
      comm.alltoall_sizes(span<const std::uint64_t>(send_sizes), span<std::uint64_t>(recv_sizes));
      std::uint64_t total = 0;
      for (int s = 0; s < ranks; ++s) {
        RANK_CHECK(recv_sizes[s] == part_size(s, r));
        total += recv_sizes[s];
      }
      std::vector<std::byte> recv(total + 5, std::byte{0xEE});  // room to spare stays untouched
      comm.alltoallv_bytes(span<const std::byte>(send), span<const std::uint64_t>(send_sizes), span<std::byte>(recv),
                           span<const std::uint64_t>(recv_sizes));
      std::size_t at = 0;
      for (int s = 0; s < ranks; ++s) {
        for (std::uint64_t i = 0; i < recv_sizes[s]; ++i) RANK_CHECK(recv[at++] == byte_of(s, r, i));
      }
      for (; at < recv.size(); ++at) RANK_CHECK(recv[at] == std::byte{0xEE});
      // Misuse is named before anything moves: a send buffer that disagrees with its sizes.
      send.pop_back();
      RANK_CHECK_THROWS_WITH(comm.alltoallv_bytes(span<const std::byte>(send), span<const std::uint64_t>(send_sizes),
                                                  span<std::byte>(recv), span<const std::uint64_t>(recv_sizes)),
                             "alltoallv_bytes: the parts add up to");
    }, own);
    for (const auto& e : errors) CHECK(e.empty());
  }
}

TEST_CASE("allreducer keeps an error-feedback residual per tensor", "[collective]") {
  const int ranks = 2;
  const std::size_t n = 5000;
  using topk = codec<sparsify::topk>;
  const topk c{sparsify::topk::ratio(0.01)};
  std::vector<std::vector<float>> residual_sum(ranks);
  const auto errors = on_ranks(ranks, -1, [&](int r, comm::communicator& comm) {
    host exec(1);
    comm::allreducer<topk, float, host> all(exec, c, n, ranks, true);
    feedback::error_feedback<topk, float, host> reference(exec, c, n);
    for (std::uint32_t step = 0; step < 3; ++step) {
      auto g = gradient_of(r + 10 * static_cast<int>(step), n);
      std::vector<std::byte> out(reference.max_compressed_bytes<float>());
      reference.compress(exec, span<const float>(g), span<std::byte>(out));
      all.run(comm, exec, span<float>(g), {step, 0});
    }
    // The allreducer's saved residual equals a plain error_feedback's after the same steps.
    RANK_CHECK(all.save(exec) == reference.save(exec));
  });
  for (const auto& e : errors) CHECK(e.empty());
}

TEST_CASE("allreducer with EF21 returns EF21's estimate, the same on every rank", "[collective][ef21]") {
  const int ranks = 3;
  const std::size_t n = 6000;
  using topk = codec<sparsify::topk>;
  const topk c{sparsify::topk::ratio(0.01)};
  // The reference: every rank's EF21 worker run in one place, averaged in rank order.
  host exec(1);
  std::vector<feedback::ef21<topk, float, host>> workers;
  for (int r = 0; r < ranks; ++r) workers.emplace_back(exec, c, n);
  std::vector<std::vector<float>> expected;
  for (std::uint32_t step = 0; step < 4; ++step) {
    std::vector<float> average(n, 0.0f);
    for (int r = 0; r < ranks; ++r) {
      const auto g = gradient_of(r + 10 * static_cast<int>(step), n);
      std::vector<std::byte> out(workers[r].max_compressed_bytes<float>());
      out.resize(workers[r].compress(exec, span<const float>(g), span<std::byte>(out), {step, 0}));
      c.decompress_add(exec, span<const std::byte>(out), span<float>(average), 1.0f / ranks);
    }
    for (auto& w : workers) {
      std::vector<float> a = average;
      w.apply(exec, span<float>(a));
      if (&w == &workers[0]) expected.push_back(a);
    }
  }
  std::vector<std::vector<std::byte>> states(ranks);
  const auto errors = on_ranks(ranks, -1, [&](int r, comm::communicator& comm) {
    host rank_exec(1);
    comm::allreducer<topk, float, host> all(rank_exec, c, n, ranks, comm::feedback_mode::ef21);
    for (std::uint32_t step = 0; step < 4; ++step) {
      auto g = gradient_of(r + 10 * static_cast<int>(step), n);
      all.run(comm, rank_exec, span<float>(g), {step, 0});
      RANK_CHECK(g == expected[step]);
    }
    states[static_cast<std::size_t>(r)] = all.save(rank_exec);
  });
  for (int r = 0; r < ranks; ++r) {
    REQUIRE(errors[r].empty());
    CHECK(states[r] == workers[r].save(exec));  // g_i per rank, and the common g
  }
  comm::allreducer<topk, float, host> none(exec, c, n, 1, comm::feedback_mode::none);
  CHECK_THROWS_WITH(none.save(exec), Catch::Matchers::Contains("allreducer::save: feedback is off"));
}

TEST_CASE("allreducer names the rank whose payload is bad and applies none of it", "[collective]") {
  const int ranks = 4;
  const std::size_t n = 10000;
  using q = codec<sparsify::none, quantize::qsgd<7>, encode::none>;
  const auto errors = on_ranks(ranks, 2, [&](int r, comm::communicator& comm) {
    host exec(1);
    comm::allreducer<q, float, host> all(exec, q{}, n, ranks, false);
    auto g = gradient_of(r, n);
    all.run(comm, exec, span<float>(g));
  });
  for (int r = 0; r < ranks; ++r) {
    INFO(errors[r]);
    CHECK(errors[r].find("payload from rank 2") != std::string::npos);
  }
  CHECK_THROWS_AS((comm::allreducer<q, float, host>(*std::make_unique<host>(), q{}, n, 0, false)), invalid_argument);
}

namespace {
/// A communicator that adds `extra` to rank `liar`'s announced word and forwards the rest.
class lying_sizes final : public comm::communicator {
 public:
  lying_sizes(comm::communicator& inner, int liar, std::uint64_t extra) : inner_(inner), liar_(liar), extra_(extra) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void allreduce_sum(void* data, std::size_t count, element_type type) override { inner_.allreduce_sum(data, count, type); }
  void allgather_sizes(std::uint64_t mine, span<std::uint64_t> sizes) override {
    inner_.allgather_sizes(rank() == liar_ ? mine + extra_ : mine, sizes);
  }
  void allgatherv_bytes(span<const std::byte> mine, span<std::byte> all, span<const std::uint64_t> sizes) override {
    inner_.allgatherv_bytes(mine, all, sizes);
  }

 private:
  comm::communicator& inner_;
  int liar_;
  std::uint64_t extra_;
};
}  // namespace

TEST_CASE("allreducer: every rank throws together, never one while the others wait", "[collective]") {
  const int ranks = 3;
  const std::size_t n = 4000;
  // A rank whose compress fails (sampled top-k's bound: that rank's gradient is all NaN, and
  // non-finite values are always kept). It left before the size exchange, and the others waited
  // in it for ever; now it rethrows its own error and the others name it.
  using dgc = codec<sparsify::sampled_topk>;
  auto errors = on_ranks(ranks, -1, [&](int r, comm::communicator& comm) {
    host exec(1);
    comm::allreducer<dgc, float, host> all(exec, dgc{sparsify::sampled_topk::ratio(0.01)}, n, ranks, true);
    auto g = gradient_of(r, n);
    if (r == 1) std::fill(g.begin(), g.end(), std::numeric_limits<float>::quiet_NaN());
    all.run(comm, exec, span<float>(g));
  });
  CHECK(errors[1].find("the selection exceeds the payload bound") != std::string::npos);
  for (int r : {0, 2}) {
    INFO(errors[r]);
    CHECK(errors[r] == "allreducer: rank 1 could not compress its gradient (its own error says why); no rank applied this step");
  }
  // Ranks built for another n: on the gather path (each rank judged the sizes by its own
  // bound, and one threw while the others gathered) and on the allreduce path (different counts).
  const auto disagreeing = [&](auto codec_value) {
    using C = decltype(codec_value);
    return on_ranks(ranks, -1, [&](int r, comm::communicator& comm) {
      host exec(1);
      const std::size_t mine = r == 2 ? n + 64 : n;
      comm::allreducer<C, float, host> all(exec, codec_value, mine, ranks, false);
      auto g = gradient_of(r, mine);
      all.run(comm, exec, span<float>(g));
    });
  };
  using topk = codec<sparsify::topk>;
  using dense = codec<sparsify::none, quantize::none, encode::none>;
  for (const auto& e : {disagreeing(topk{sparsify::topk::count(40)}), disagreeing(dense{})}) {
    for (int r = 0; r < ranks; ++r) {
      INFO(e[r]);
      CHECK(e[r].rfind("allreducer: rank 2 was built for another tensor or codec than rank 0", 0) == 0);
    }
  }
  // A size that is not a multiple of 16 (later payloads would sit misaligned): refused on every
  // rank before the gather.
  errors = on_ranks(ranks, -1, [&](int r, comm::communicator& comm) {
    lying_sizes liar(comm, 1, ~std::uint64_t{7});  // 8 bytes fewer than its payload
    host exec(1);
    comm::allreducer<topk, float, host> all(exec, topk{sparsify::topk::count(40)}, n, ranks, false);
    auto g = gradient_of(r, n);
    all.run(liar, exec, span<float>(g));
  });
  for (int r = 0; r < ranks; ++r) {
    INFO(errors[r]);
    CHECK(errors[r].find("allreducer: rank 1 announced a ") == 0);
    CHECK(errors[r].find("payloads are multiples of 16 bytes") != std::string::npos);
  }
  // Bad ranks arguments, by name (a negative count threw std::length_error).
  CHECK_THROWS_WITH((comm::allreducer<topk, float, host>(*std::make_unique<host>(), topk{}, n, -1, false)),
                    "allreducer: ranks must be >= 1, got -1");
}

TEST_CASE("decompress_add_all equals decoding the payloads one by one, and names a bad one", "[collective]") {
  const std::size_t n = 70001;
  host exec;
  const auto check_codec = [&](const auto& c) {
    std::vector<std::vector<std::byte>> payloads;
    std::vector<span<const std::byte>> views;
    for (int r = 0; r < 5; ++r) payloads.push_back(test::compress(c, exec, gradient_of(r, n), {1, 0}));
    for (const auto& p : payloads) views.emplace_back(p);
    std::vector<float> fused = gradient_of(9, n), one_by_one = fused;
    c.decompress_add_all(exec, span<const span<const std::byte>>(views), span<float>(fused), 0.2f);
    for (const auto& p : payloads) c.decompress_add(exec, span<const std::byte>(p), span<float>(one_by_one), 0.2f);
    CHECK(fused == one_by_one);
    // A bad third payload: an error naming it, and nothing applied (not even the first two).
    payloads[2][0] ^= std::byte{1};
    const auto before = fused;
    try {
      c.decompress_add_all(exec, span<const span<const std::byte>>(views), span<float>(fused), 0.2f);
      FAIL("accepted");
    } catch (const format_error& e) {
      CHECK(std::string(e.what()).find("payload 2 of 5") != std::string::npos);
    }
    CHECK(fused == before);
  };
  check_codec(codec<sparsify::none, quantize::none, encode::none>{});
  check_codec(codec<sparsify::none, quantize::uniform<4>, encode::none>{});
  check_codec(codec<sparsify::none, quantize::qsgd<7>, encode::none>{{}, quantize::qsgd<7>{3}});
  check_codec(codec<sparsify::topk, quantize::none, encode::automatic>{sparsify::topk::ratio(0.02)});
  check_codec(codec<sparsify::threshold, quantize::none, encode::bitmap>{sparsify::threshold{0.5}});
  check_codec(codec<sparsify::topk, quantize::uniform<4>, encode::delta_varint>{sparsify::topk::ratio(0.02)});
}

TEST_CASE("powersgd_allreducer runs PowerSGD's three allreduces and matches the step done by hand", "[collective][powersgd]") {
  using lowrank::factor;
  const std::vector<std::vector<std::size_t>> shapes{{40, 30}, {40}, {20, 33}, {5}};
  const std::size_t n = 40 * 30 + 40 + 20 * 33 + 5;
  lowrank::powersgd_params params;
  params.rank = 2;
  params.seed = 5;
  const int ranks = 3;
  const auto grad_of = [&](int r, std::uint32_t step) { return gradzip_tools::synthetic_gradient<float>(n, 900 + 10 * step + r); };

  // By hand: three compressors, payloads summed in rank order from zero as the communicator does.
  host exec(1);
  std::vector<lowrank::powersgd<float, host>> by_hand;
  for (int r = 0; r < ranks; ++r) by_hand.emplace_back(exec, shapes, params);
  std::vector<std::vector<float>> expected(2);
  for (std::uint32_t step = 0; step < 2; ++step) {
    std::vector<std::vector<float>> g;
    std::vector<std::vector<std::byte>> p, q;
    for (int r = 0; r < ranks; ++r) {
      g.push_back(grad_of(r, step));
      p.emplace_back(by_hand[0].payload_bytes(factor::p));
      q.emplace_back(by_hand[0].payload_bytes(factor::q));
      by_hand[r].compress_p(exec, span<const float>(g[r]), span<std::byte>(p[r]), {step, 0});
    }
    const auto sum = [&](std::vector<std::vector<std::byte>>& payloads, factor f) {
      std::vector<float> total(by_hand[0].plan().factor_elements(f), 0.0f);
      for (int r = 0; r < ranks; ++r) {
        const auto v = by_hand[r].factors(span<std::byte>(payloads[r]), f);
        for (std::size_t i = 0; i < total.size(); ++i) total[i] += v[i];
      }
      for (int r = 0; r < ranks; ++r) {
        const auto v = by_hand[r].factors(span<std::byte>(payloads[r]), f);
        std::copy(total.begin(), total.end(), v.begin());
      }
    };
    sum(p, factor::p);
    for (int r = 0; r < ranks; ++r) by_hand[r].compress_q(exec, span<const std::byte>(p[r]), span<std::byte>(q[r]));
    sum(q, factor::q);
    std::vector<float> out = g[0];
    for (int r = 0; r < ranks; ++r) by_hand[r].decompress(exec, span<const std::byte>(q[r]), ranks, span<float>(g[r]));
    out = g[0];
    for (const auto& t : by_hand[0].plan().tensors()) {  // the uncompressed tensors: their average
      if (t.compressed()) continue;
      for (std::size_t i = t.offset; i < t.offset + t.size(); ++i) {
        float s = 0.0f;
        for (int r = 0; r < ranks; ++r) s += grad_of(r, step)[i];
        out[i] = s / static_cast<float>(ranks);
      }
    }
    expected[step] = out;
  }

  std::vector<std::vector<float>> got(ranks);
  std::vector<std::vector<std::byte>> states(ranks);
  const auto errors = on_ranks(ranks, -1, [&](int r, comm::communicator& c) {
    host e(1);
    comm::powersgd_allreducer<float, host> ar(e, shapes, params, ranks);
    for (std::uint32_t step = 0; step < 2; ++step) {
      got[r] = grad_of(r, step);
      ar.run(c, e, span<float>(got[r]), {step, 0});
      if (step == 0) {
        std::vector<float> first = got[r];
        RANK_CHECK(first == expected[0]);
      }
    }
    states[r] = ar.save(e);
    RANK_CHECK(ar.sent_bytes() == (40 + 5) * 4 + (40 + 20) * 2 * 4 + (30 + 33) * 2 * 4);
  });
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    CHECK(errors[r].empty());
    CHECK(got[r] == expected[1]);
    CHECK(states[r] == by_hand[r].save(exec));
  }
}


TEST_CASE("sparse_sync (Zen) sums sparse gradients bit for bit as a dense sum in rank order, in fewer bytes",
          "[collective][sparse_sync]") {
  for (const int ranks : {1, 3, 4, 6}) {  // 3 and 6: ranks folded into the hierarchy
    for (const double density : {0.001, 0.02, 0.3}) {  // COO, delta-varint and bitmap parts
      INFO(ranks << " ranks, density " << density);
      const std::uint64_t n = 60001;
      std::vector<std::vector<std::uint64_t>> idx(ranks);
      std::vector<std::vector<float>> val(ranks);
      for (int r = 0; r < ranks; ++r) sparse_gradient(r, n, density, idx[r], val[r]);
      std::vector<float> sum(n, 0.0f);
      for (int r = 0; r < ranks; ++r) {  // in rank order, from zero, as the owner sums
        for (std::size_t j = 0; j < idx[r].size(); ++j) sum[idx[r][j]] += val[r][j];
      }
      std::vector<std::uint64_t> united;
      for (int r = 0; r < ranks; ++r) {
        std::vector<std::uint64_t> next;
        std::set_union(united.begin(), united.end(), idx[r].begin(), idx[r].end(), std::back_inserter(next));
        united.swap(next);
      }
      std::vector<float> start = gradzip_tools::synthetic_gradient<float>(n, 3), expected = start;
      for (std::uint64_t i = 0; i < n; ++i) expected[i] = fmaf(0.25f, sum[i], expected[i]);
      std::vector<std::vector<float>> got(ranks, start), gathered(ranks, start), tree(ranks, start);
      std::vector<comm::sparse_sync_traffic> zen_bytes(ranks), gather_bytes(ranks);
      std::vector<std::vector<std::uint64_t>> levels(ranks);
      comm::sparsity_profile profile;
      const auto errors = on_ranks(ranks, -1, [&](int r, comm::communicator& c) {
        host e(1);
        comm::sparse_sync zen(n, ranks, 99);
        zen.run(c, e, span<const std::uint64_t>(idx[r]), span<const float>(val[r]), span<float>(got[r]), 0.25f);
        zen_bytes[r] = zen.last_traffic();
        zen.run(c, e, span<const std::uint64_t>(idx[r]), span<const float>(val[r]), span<float>(gathered[r]), 0.25f,
                comm::sparse_scheme::allgather);
        gather_bytes[r] = zen.last_traffic();
        zen.run(c, e, span<const std::uint64_t>(idx[r]), span<const float>(val[r]), span<float>(tree[r]), 0.25f,
                comm::sparse_scheme::hierarchical_centralization);
        levels[r] = zen.hierarchy_levels();
        if (r == 0 && (ranks & (ranks - 1)) == 0) profile = zen.profile();
        if (r == 0 && (ranks & (ranks - 1)) != 0) {
          RANK_CHECK_THROWS_WITH(zen.profile(), "needs a power-of-two rank count, got " + std::to_string(ranks));
        }
      });
      // Hierarchical Centralization sums in a tree, ((v0 + v1) + (v2 + v3)) at 4 ranks: within
      // (P - 1) 2^-24 sum |v| of the rank-order sum, and the same bits on every rank.
      for (std::uint64_t i = 0; i < n; ++i) {
        float magnitude = 0.0f;
        for (int r = 0; r < ranks; ++r) {
          const auto it = std::lower_bound(idx[r].begin(), idx[r].end(), i);
          if (it != idx[r].end() && *it == i) magnitude += std::fabs(val[r][static_cast<std::size_t>(it - idx[r].begin())]);
        }
        const double bound = 2.0 * (ranks - 1) * std::ldexp(1.0, -24) * (0.25 * magnitude + std::fabs(start[i])) + 1e-30;
        REQUIRE(std::fabs(static_cast<double>(tree[0][i]) - expected[i]) <= bound);
      }
      for (int r = 0; r < ranks; ++r) {
        INFO("rank " << r << ": Zen received " << zen_bytes[r].received() << " bytes, the allgather "
                     << gather_bytes[r].received());
        CHECK(errors[r].empty());
        CHECK(got[r] == expected);
        CHECK(gathered[r] == expected);  // both schemes sum in rank order
        CHECK(tree[r] == tree[0]);
        CHECK(zen_bytes[r].union_entries == united.size());
        CHECK(gather_bytes[r].union_entries == united.size());
        // Zen receives about (P - 1) / P (nnz + union) entries, the allgather (P - 1) nnz: with
        // these gradients (union near P nnz at density 0.3) Zen wins from 4 ranks on, not at 3.
        // At density 0.001 the frames (about 160 bytes per part) dominate.
        if (ranks == 4 && density >= 0.02) CHECK(zen_bytes[r].received() < gather_bytes[r].received());
      }
      if (ranks == 4) {  // rank 0's aggregate after each doubling: the union of ranks {0, 1}, then of all
        std::vector<std::uint64_t> u01, all;
        std::set_union(idx[0].begin(), idx[0].end(), idx[1].begin(), idx[1].end(), std::back_inserter(u01));
        all = u01;
        for (int r = 2; r < 4; ++r) {
          std::vector<std::uint64_t> next;
          std::set_union(all.begin(), all.end(), idx[r].begin(), idx[r].end(), std::back_inserter(next));
          all.swap(next);
        }
        CHECK(levels[0] == std::vector<std::uint64_t>{u01.size(), all.size()});
        // The cost model, from rank 0's profile, predicts the bytes the ranks received (mean
        // over ranks) within 10 %.
        const comm::scheme_costs model = comm::estimate(profile, comm::link_model{});
        double zen_mean = 0, gather_mean = 0;
        for (int r = 0; r < ranks; ++r) {
          zen_mean += static_cast<double>(zen_bytes[r].received()) / ranks;
          gather_mean += static_cast<double>(gather_bytes[r].received()) / ranks;
        }
        INFO("model: Zen " << model.bytes[2] << " B, allgather " << model.bytes[1] << " B; measured " << zen_mean
                           << " and " << gather_mean);
        CHECK(std::fabs(model.bytes[2] / zen_mean - 1.0) < 0.10);
        CHECK(std::fabs(model.bytes[1] / gather_mean - 1.0) < 0.10);
      }
    }
  }
}

TEST_CASE("auto_sparse_sync profiles, then every rank runs the scheme Zen's model picks, with the same sums",
          "[collective][sparse_sync]") {
  const std::uint64_t n = 60001;
  struct scenario {
    int ranks;
    double density;
    comm::link_model link;
    comm::sync_choice expected;
  };
  const comm::link_model bandwidth{0.0, 12.5e9, 0.0}, latency{50e-6, 12.5e9, 5e-6};
  // sparse_gradient keeps half of the first n / 20 indices on every rank (they overlap) and
  // `density` of the rest independently. Bytes received per rank, in units of n entries:
  const std::vector<scenario> scenarios = {
      // every element on every rank: Balanced Parallelism moves the values plus bitmaps (about
      // 7.1 n bytes at 8 ranks), the dense allreduce 7 n
      {8, 1.0, bandwidth, comm::sync_choice::dense_allreduce},
      // 8 ranks, overlapping: BP about (7 / 8)(nnz + u_8) = 0.2 n, the hierarchy nnz + u_2 + u_4,
      // the allgather 7 nnz = 0.31 n
      {8, 0.02, bandwidth, comm::sync_choice::balanced_parallelism},
      // 4 ranks: the hierarchy's nnz + u_2 = 0.12 n beats BP's (3 / 4)(nnz + u_4) = 0.15 n
      {4, 0.02, bandwidth, comm::sync_choice::hierarchical_centralization},
      // 3 ranks (not a power of two): the allgather's 2 nnz beats BP's (2 / 3)(nnz + u_3)
      {3, 0.02, bandwidth, comm::sync_choice::allgather},
      // few nonzeros, costly rounds and messages: the hierarchy's 3 messages
      {8, 0.001, latency, comm::sync_choice::hierarchical_centralization},
  };
  for (const scenario& sc : scenarios) {
    INFO(sc.ranks << " ranks, density " << sc.density);
    std::vector<std::vector<std::uint64_t>> idx(sc.ranks);
    std::vector<std::vector<float>> val(sc.ranks);
    for (int r = 0; r < sc.ranks; ++r) sparse_gradient(r, n, sc.density, idx[r], val[r]);
    std::vector<float> sum(n, 0.0f);
    for (int r = 0; r < sc.ranks; ++r) {
      for (std::size_t j = 0; j < idx[r].size(); ++j) sum[idx[r][j]] += val[r][j];
    }
    std::vector<float> expected(n, 1.0f);
    for (std::uint64_t i = 0; i < n; ++i) expected[i] = fmaf(0.5f, sum[i], expected[i]);
    std::vector<std::vector<float>> profiled(sc.ranks, std::vector<float>(n, 1.0f)), chosen = profiled;
    std::vector<comm::sync_choice> choice(sc.ranks);
    std::vector<comm::scheme_costs> costs(sc.ranks);
    std::vector<std::uint64_t> dense_bytes(sc.ranks);
    const auto errors = on_ranks(sc.ranks, -1, [&](int r, comm::communicator& c) {
      host e(1);
      comm::auto_sparse_sync zen(n, sc.ranks, sc.link, 7);
      RANK_CHECK_THROWS_WITH(zen.choice(), "still profiling (0 of 1 steps run)");
      zen.run(c, e, span<const std::uint64_t>(idx[r]), span<const float>(val[r]), span<float>(profiled[r]), 0.5f);
      choice[r] = zen.choice();
      costs[r] = zen.costs();
      zen.run(c, e, span<const std::uint64_t>(idx[r]), span<const float>(val[r]), span<float>(chosen[r]), 0.5f);
      dense_bytes[r] = zen.last_dense_bytes();
    });
    const double tree_bound = 2.0 * (sc.ranks - 1) * std::ldexp(1.0, -24);
    for (int r = 0; r < sc.ranks; ++r) {
      INFO("rank " << r << " chose " << comm::name(choice[r]));
      CHECK(errors[r].empty());
      CHECK(choice[r] == sc.expected);
      CHECK(choice[r] == choice[0]);  // the same profile on every rank: no rank waits in another collective
      CHECK(profiled[r] == expected);
      if (choice[r] == comm::sync_choice::hierarchical_centralization) {  // a tree's sums: within its bound
        for (std::uint64_t i = 0; i < n; ++i) {
          REQUIRE(std::fabs(chosen[r][i] - expected[i]) <= tree_bound * (std::fabs(sum[i]) + 1.0f) * 4);
        }
      } else {
        CHECK(chosen[r] == expected);  // dense and the sparse schemes: rank-order sums, the same bits
      }
      CHECK(dense_bytes[r] == (choice[r] == comm::sync_choice::dense_allreduce ? 4 * n : 0));
      for (int s = 0; s < 4; ++s) CHECK(costs[r].seconds[s] == costs[0].seconds[s]);
    }
  }
  CHECK_THROWS_WITH(comm::auto_sparse_sync(10, 2, comm::link_model{}, 0, 0),
                    Catch::Contains("profile_steps must be >= 1, got 0"));
  CHECK_THROWS_WITH(comm::auto_sparse_sync(10, 2, comm::link_model{0.0, 0.0, 0.0}), Catch::Contains("bad link"));
}

TEST_CASE("sparse_sync names the rank whose part or reduced part is bad, on every rank, and changes nothing",
          "[collective][sparse_sync]") {
  const int ranks = 4;
  const std::uint64_t n = 20000;
  struct damage {
    comm::sparse_scheme scheme;
    bool in_exchange;  // the alltoallv (parts, stages), else the allgatherv (reduced parts)
    const char* named;
  };
  for (const int at : {-1, 0, 3}) {  // damaged on the way to every rank, or to rank 0 or 3 only
  for (const damage d : {damage{comm::sparse_scheme::balanced_parallelism, true, "the part from rank 2"},
                         damage{comm::sparse_scheme::balanced_parallelism, false, "reduced part from rank 2"},
                         damage{comm::sparse_scheme::hierarchical_centralization, true, "stage payload from rank 2"},
                         damage{comm::sparse_scheme::allgather, false, "payload from rank 2"}}) {
    INFO("expecting \"" << d.named << "\", damaged at " << at);
    std::vector<std::vector<float>> out(ranks, std::vector<float>(n, 1.0f));
    const auto errors = on_ranks(ranks, 2, [&](int r, comm::communicator& c) {
      host e(1);
      comm::sparse_sync zen(n, ranks, 5);
      std::vector<std::uint64_t> idx;
      std::vector<float> val;
      sparse_gradient(r, n, 0.05, idx, val);
      zen.run(c, e, span<const std::uint64_t>(idx), span<const float>(val), span<float>(out[r]), 1.0f, d.scheme);
    }, true, d.in_exchange, at);
    for (int r = 0; r < ranks; ++r) {
      INFO("rank " << r << ": " << errors[r]);
      CHECK(errors[r].find(d.named) != std::string::npos);
      CHECK(out[r] == std::vector<float>(n, 1.0f));
    }
  }
  }
}

TEST_CASE("sparse_sync rejects bad arguments by name", "[collective][sparse_sync]") {
  CHECK_THROWS_WITH(comm::sparse_sync(10, 0), Catch::Contains("ranks must be >= 1, got 0"));
  const auto errors = on_ranks(2, -1, [&](int, comm::communicator& c) {
    host e(1);
    comm::sparse_sync zen(100, 2);
    std::vector<float> out(100), v = {1.0f, 2.0f};
    std::vector<std::uint64_t> unsorted = {5, 3}, past = {5, 100};
    RANK_CHECK_THROWS_WITH(zen.run(c, e, span<const std::uint64_t>(unsorted), span<const float>(v), span<float>(out)),
                           "index 1 (3) is not increasing");
    RANK_CHECK_THROWS_WITH(zen.run(c, e, span<const std::uint64_t>(past), span<const float>(v), span<float>(out)),
                           "below n = 100");
    std::vector<float> small(99);
    RANK_CHECK_THROWS_WITH(zen.run(c, e, span<const std::uint64_t>(), span<const float>(), span<float>(small)),
                           "output has 99 elements, expected 100");
  });
  for (const auto& e : errors) CHECK(e.empty());
}

TEST_CASE("Zen's cost model reaches the paper's conclusions, and its extrapolation fits what it measured",
          "[collective][sparse_sync]") {
  const std::uint64_t n = 1 << 24;
  const double nnz = 20000;
  const comm::link_model link{0.0, 12.5e9, 0.0};  // the paper's model: bandwidth only
  auto profile = [&](int ranks, bool overlap) {
    comm::sparsity_profile p{n, ranks, nnz, {}};
    for (int k = 1; k <= ranks; k *= 2) p.unions.push_back(overlap ? nnz : nnz * k);
    return p;
  };
  // Full overlap: Balanced Parallelism receives about 2 nnz, the hierarchy log2 P nnz.
  CHECK(comm::estimate(profile(16, true), link).best == comm::sync_choice::balanced_parallelism);
  // No overlap: the hierarchy receives (P - 1) nnz, Balanced Parallelism (P - 1)(1 + 1 / P) nnz.
  const comm::scheme_costs disjoint = comm::estimate(profile(16, false), link);
  CHECK(disjoint.bytes[3] < disjoint.bytes[2]);
  // Every element nonzero on every rank: dense allreduce wins (Balanced Parallelism moves the
  // same values plus bitmaps; at half density it would still win, with bitmaps for indices).
  comm::sparsity_profile dense{n, 16, static_cast<double>(n), std::vector<double>(5, static_cast<double>(n))};
  CHECK(comm::estimate(dense, link).best == comm::sync_choice::dense_allreduce);
  // Messages count: at 1,024 ranks with few nonzeros, the hierarchy's 10 messages beat Balanced
  // Parallelism's 2,046 (0.5 us each) even at full overlap.
  CHECK(comm::estimate(profile(1024, true), comm::link_model{5e-6, 12.5e9, 5e-7}).best ==
        comm::sync_choice::hierarchical_centralization);
  CHECK(comm::estimate(profile(16, true), comm::link_model{5e-6, 12.5e9, 5e-7}).best ==
        comm::sync_choice::balanced_parallelism);
  // The extrapolation reproduces its input's last union, and unions grow with the rank count.
  comm::sparsity_profile measured{n, 8, nnz, {nnz, 30000, 38000, 42000}};
  const comm::sparsity_profile same = comm::extrapolate(measured, 8);
  CHECK(std::fabs(same.unions.back() / 42000.0 - 1.0) < 1e-6);
  const comm::sparsity_profile big = comm::extrapolate(measured, 1024);
  CHECK(big.unions.size() == 11);
  for (std::size_t i = 1; i < big.unions.size(); ++i) CHECK(big.unions[i] >= big.unions[i - 1]);
  CHECK_THROWS_WITH(comm::extrapolate(measured, 0), Catch::Contains("ranks must be >= 1, got 0"));
}

namespace {

/// A cost model naming the codecs the planned_allreducer tests use; costs do not matter here.
schedule::cost_model planned_model() {
  schedule::cost_model m;
  for (const char* name : {"fp32", "topk1", "bf16"}) {
    schedule::codec_cost c;
    c.name = name;
    m.codecs.push_back(c);
  }
  return m;
}

using planned_topk = codec<sparsify::topk, quantize::none, encode::automatic>;
using planned_bf16 = codec<sparsify::none, quantize::cast_bf16, encode::none>;
const planned_topk planned_top1{sparsify::topk::ratio(0.01)};

std::vector<comm::plan_codec<float, host>> planned_codecs(schedule::route topk_route) {
  using entry = comm::plan_codec<float, host>;
  return {entry::uncompressed("fp32"),
          topk_route == schedule::route::sparse_sync
              ? entry::sparse("topk1", planned_top1, comm::feedback_mode::error_feedback, 5)
              : entry::of("topk1", planned_top1, comm::feedback_mode::error_feedback),
          entry::of("bf16", planned_bf16{})};
}

}  // namespace

TEST_CASE("planned_allreducer runs each group as its plan says, as the group's own collective would",
          "[collective][schedule]") {
  const int ranks = 3;
  const std::vector<std::size_t> sizes = {1000, 7, 20000, 513, 9000};  // backprop order
  const fusion::layout l(sizes, {0, 2, 4});
  const std::size_t n = l.total();
  using schedule::route;
  for (const route topk_route : {route::allgather, route::sparse_sync}) {
    DYNAMIC_SECTION("top-k by " << schedule::name(topk_route)) {
      const schedule::plan p{{0, 2, 4}, {{2, route::allreduce}, {1, topk_route}, {0, route::allreduce}}};
      std::vector<std::vector<float>> got(ranks), expected(ranks);
      std::vector<std::size_t> sent(ranks);
      const auto errors = on_ranks(ranks, -1, [&](int r, comm::communicator& comm) {
        host exec(1);
        comm::planned_allreducer<float, host> planned(exec, sizes, p, planned_model(), planned_codecs(topk_route), ranks);
        RANK_CHECK(planned.layout().group_count() == 3);
        // The same steps by hand, each group by its own collective (tensor id = group).
        comm::allreducer<planned_bf16, float, host> bf16(exec, planned_bf16{}, l.group_size(0), ranks, false);
        comm::allreducer<planned_topk, float, host> top(exec, planned_top1, l.group_size(1), ranks, true);
        feedback::error_feedback<planned_topk, float, host> ef(exec, planned_top1, l.group_size(1));
        comm::sparse_sync zen(l.group_size(1), ranks, 5);
        comm::allreducer<codec<sparsify::none, quantize::none, encode::none>, float, host> fp32(exec, {}, l.group_size(2), ranks, false);
        std::vector<float> g, h, payload_values, decoded(l.group_size(1));
        std::vector<std::uint64_t> indices;
        std::vector<std::byte> payload(ef.max_compressed_bytes<float>());
        for (std::uint32_t step = 0; step < 3; ++step) {
          g = gradzip_tools::synthetic_gradient<float>(n, 40 + 3 * step + static_cast<std::uint64_t>(r));
          h = g;
          planned.run(comm, exec, span<float>(g), {step, 10});
          const auto group = [&](std::size_t k) { return span<float>(h).subspan(l.group_offset(k), l.group_size(k)); };
          bf16.run(comm, exec, group(0), {step, 10});
          if (topk_route == route::allgather) {
            top.run(comm, exec, group(1), {step, 11});
          } else {
            const std::size_t bytes = ef.compress(exec, span<const float>(group(1)), span<std::byte>(payload), {step, 11});
            planned_top1.decompress(exec, span<const std::byte>(payload.data(), bytes), span<float>(decoded));
            comm::nonzeros(span<const float>(decoded), indices, payload_values);
            std::fill(group(1).begin(), group(1).end(), 0.0f);
            zen.run(comm, exec, span<const std::uint64_t>(indices), span<const float>(payload_values), group(1),
                    1.0f / ranks);
          }
          fp32.run(comm, exec, group(2), {step, 12});
        }
        got[static_cast<std::size_t>(r)] = g;
        expected[static_cast<std::size_t>(r)] = h;
        sent[static_cast<std::size_t>(r)] = planned.last_sent_bytes();
      });
      for (int r = 0; r < ranks; ++r) REQUIRE(errors[static_cast<std::size_t>(r)].empty());
      for (int r = 0; r < ranks; ++r) {
        REQUIRE(std::memcmp(got[r].data(), expected[r].data(), n * sizeof(float)) == 0);
        REQUIRE(std::memcmp(got[r].data(), got[0].data(), n * sizeof(float)) == 0);  // every rank the same
        // The bf16 group alone sends 2 bytes per element, the fp32 group 4: the top-k group adds a little.
        CHECK(sent[r] > 2 * l.group_size(0) + 4 * l.group_size(2));
        CHECK(sent[r] < 2 * l.group_size(0) + 4 * l.group_size(2) + l.group_size(1));
      }
    }
  }
}

TEST_CASE("nonzeros lists a dense vector's nonzero positions and values, increasing", "[collective][sparse_sync]") {
  const std::vector<float> dense = {0.0f, 1.5f, 0.0f, -0.0f, -2.0f, 0.0f};
  std::vector<std::uint64_t> idx = {7, 8, 9};  // cleared first
  std::vector<float> val = {1.0f};
  comm::nonzeros(span<const float>(dense), idx, val);
  CHECK(idx == std::vector<std::uint64_t>{1, 4});
  CHECK(val == std::vector<float>{1.5f, -2.0f});
}

TEST_CASE("planned_allreducer names the group a bad plan, a bad codec list or a bad payload concerns",
          "[collective][schedule]") {
  const std::vector<std::size_t> sizes = {100, 300, 50};
  const auto model = planned_model();
  const auto codecs = planned_codecs(schedule::route::allgather);
  using schedule::route;
  host exec(1);
  const auto build = [&](const schedule::plan& p, const std::vector<comm::plan_codec<float, host>>& list) {
    comm::planned_allreducer<float, host>(exec, sizes, p, model, list, 2);
  };
  const auto message = [&](const schedule::plan& p, const std::vector<comm::plan_codec<float, host>>& list) {
    try {
      build(p, list);
    } catch (const invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(message({{0, 1}, {{0, route::allreduce}}}, codecs), Catch::Contains("the plan has 2 groups but 1 options"));
  CHECK_THAT(message({{0, 2}, {{0, route::allreduce}, {3, route::allgather}}}, codecs),
             Catch::Contains("group 1 names codec 3, but the cost model has 3"));
  CHECK_THAT(message({{0}, {{1, route::allreduce}}}, codecs),
             Catch::Contains("group 0 sends topk1 by allreduce, but its plan_codec travels by allgather"));
  CHECK_THAT(message({{0}, {{1, route::allgather, schedule::executor_kind::host}}}, codecs),
             Catch::Contains("group 0 (topk1) is offloaded to the host"));
  CHECK_THAT(message({{0, 1}, {{0, route::allreduce}, {2, route::allreduce}}}, {codecs[0], codecs[1]}),
             Catch::Contains("group 1 names codec 'bf16', which has no plan_codec (given: fp32, topk1)"));
  CHECK_THAT(message({{0, 3}, {{0, route::allreduce}, {1, route::allgather}}}, codecs),
             Catch::Contains("group 1 starts at tensor 3, but there are 3 tensors"));
  CHECK(message({{0, 1}, {{0, route::allreduce}, {1, route::allgather}}}, codecs) == "no error");

  // A bad payload in the top-k group names the rank that sent it, on every rank.
  const schedule::plan p{{0, 1}, {{0, route::allreduce}, {1, route::allgather}}};
  const auto errors = on_ranks(3, 2, [&](int r, comm::communicator& comm) {
    host e(1);
    comm::planned_allreducer<float, host> planned(e, sizes, p, model, codecs, 3);
    auto g = gradient_of(r, 450);
    planned.run(comm, e, span<float>(g), {0, 0});
  });
  for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("payload from rank 2"));
  // Zen's route: a part damaged on its way names its sender, and no gradient changes.
  const schedule::plan zen_plan{{0, 1}, {{0, route::allreduce}, {1, route::sparse_sync}}};
  std::vector<int> unchanged(3, 0);
  const auto zen_errors = on_ranks(3, 1, [&](int r, comm::communicator& comm) {
    host e(1);
    comm::planned_allreducer<float, host> planned(e, sizes, zen_plan, model, planned_codecs(route::sparse_sync), 3);
    auto g = gradient_of(r, 450);
    const auto zen_group = span<float>(g).subspan(100, 350);
    const std::vector<float> before(zen_group.begin(), zen_group.end());
    try {
      planned.run(comm, e, span<float>(g), {0, 0});
    } catch (...) {
      unchanged[static_cast<std::size_t>(r)] = std::equal(before.begin(), before.end(), zen_group.begin());
      throw;
    }
  }, true, true);
  for (int r = 0; r < 3; ++r) {
    CHECK_THAT(zen_errors[static_cast<std::size_t>(r)], Catch::Contains("part from rank 1"));
    CHECK(unchanged[static_cast<std::size_t>(r)] == 1);
  }
  const auto sizes_wrong = on_ranks(2, -1, [&](int, comm::communicator& comm) {
    host e(1);
    comm::planned_allreducer<float, host> planned(e, sizes, p, model, codecs, 2);
    std::vector<float> g(449);
    planned.run(comm, e, span<float>(g), {0, 0});
  });
  for (const auto& e : sizes_wrong) CHECK_THAT(e, Catch::Contains("gradient has 449 elements, the plan's tensors 450"));
}
