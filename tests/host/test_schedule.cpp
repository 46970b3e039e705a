// The timeline simulator, Cupcake's scheduler and Espresso's planner: the simulator against
// hand-computed timelines, the planners against exhaustive search.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>

#include "gradzip/schedule/planner.hpp"
#include "gradzip/schedule/serialize.hpp"

using namespace gradzip::schedule;
using Catch::Matchers::Contains;

namespace {

/// fp32; fp16 cast (summable); top-k 1 % (allgather, sparse); QSGD-like 4-bit (allgather).
cost_model test_model(int ranks, double bytes_per_s) {
  cost_model m;
  m.ranks = ranks;
  m.network = {20e-6, bytes_per_s, 1e-6};
  m.pcie = {10e-6, 1.0 / 20e9};
  m.codecs.push_back(codec_cost::uncompressed());
  codec_cost fp16{"fp16", {8e-6, 1.0 / 900e9}, {8e-6, 1.0 / 900e9}, {2e-6, 1.0 / 8e9}, {2e-6, 1.0 / 8e9}, 0.5, 64, 1.0, true, false, {}, {}};
  codec_cost topk{"topk", {40e-6, 1.0 / 300e9}, {10e-6, 1.0 / 2000e9}, {5e-6, 1.0 / 2e9}, {3e-6, 1.0 / 50e9}, 0.02, 96, 0.01, false, false, {}, {}};
  codec_cost qsgd{"qsgd4", {15e-6, 1.0 / 700e9}, {12e-6, 1.0 / 800e9}, {4e-6, 1.0 / 3e9}, {4e-6, 1.0 / 4e9}, 0.133, 96, 1.0, false, false, {}, {}};
  m.codecs.push_back(fp16);
  m.codecs.push_back(topk);
  m.codecs.push_back(qsgd);
  return m;
}

const option fp32_allreduce{0, route::allreduce, executor_kind::device};
const option fp16_allreduce{1, route::allreduce, executor_kind::device};
const option topk_allgather{2, route::allgather, executor_kind::device};
const option topk_sparse{2, route::sparse_sync, executor_kind::device};
const option qsgd_host{3, route::allgather, executor_kind::host};

/// Tensors of 2^6 .. 2^22 elements, each with 20 us .. 3 ms of backward compute (times `scale`).
workload random_workload(std::size_t n, unsigned seed, double scale = 1.0) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> log_size(6, 22);
  std::uniform_real_distribution<double> backward(20e-6 * scale, 3e-3 * scale);
  workload w;
  w.forward_s = 5e-3;
  for (std::size_t t = 0; t < n; ++t) {
    w.sizes.push_back(std::size_t{1} << log_size(rng));
    w.backward_s.push_back(backward(rng));
  }
  return w;
}

}  // namespace

TEST_CASE("simulate: one fp32 group waits for backprop, then one allreduce", "[schedule]") {
  const cost_model m = test_model(4, 1e9);
  const workload w{{1000, 3000}, {1e-3, 2e-3}, 10e-3, 4.0};
  const timeline t = simulate(w, m, plan{{0}, {fp32_allreduce}});
  // 16,000 bytes: 2 log2 4 = 4 rounds of 21 us, 2 (3/4) 16000 B at 1 GB/s = 24 us.
  const double allreduce = 4 * 21e-6 + 24e-6;
  REQUIRE(t.groups.size() == 1);
  CHECK(t.backward_end == Approx(3e-3));
  CHECK(t.groups[0].ready == Approx(3e-3));
  CHECK(t.groups[0].done == Approx(3e-3 + allreduce));
  CHECK(t.iteration_s == Approx(10e-3 + 3e-3 + allreduce));
  CHECK(t.busy[network] == Approx(allreduce));
}

TEST_CASE("simulate: groups queue on the network and overlap backprop", "[schedule]") {
  const cost_model m = test_model(2, 1e8);
  // Two groups; the first group's transfer (400 KB at 100 MB/s: 4 ms) outlasts the second's backprop.
  const workload w{{100000, 10}, {1e-3, 1e-3}, 0.0, 4.0};
  const timeline t = simulate(w, m, plan{{0, 1}, {fp32_allreduce, fp32_allreduce}});
  const double first = 2 * 21e-6 + 1.0 * 400000 / 1e8, second = 2 * 21e-6 + 1.0 * 40 / 1e8;
  CHECK(t.groups[0].done == Approx(1e-3 + first));
  CHECK(t.groups[1].stages[0].start == Approx(1e-3 + first));  // waits for the network, not for its gradient
  CHECK(t.iteration_s == Approx(1e-3 + first + second));
}

TEST_CASE("simulate: a device compress runs between backprop steps and delays the next group", "[schedule]") {
  cost_model m = test_model(2, 1e9);
  const workload w{{1000, 1000}, {1e-3, 1e-3}, 0.0, 4.0};
  const double encode = 40e-6 + 4000.0 / 300e9;  // top-k's device compress of 1000 floats
  timeline t = simulate(w, m, plan{{0, 1}, {topk_allgather, topk_allgather}});
  CHECK(t.groups[0].ready == Approx(1e-3));
  CHECK(t.groups[1].ready == Approx(2e-3 + encode));  // its backprop waited for group 0's compress
  CHECK(t.groups[0].stages[0].on == compute);
  m.encode_on_compute = false;  // a stream that does not compete with backprop
  t = simulate(w, m, plan{{0, 1}, {topk_allgather, topk_allgather}});
  CHECK(t.groups[1].ready == Approx(2e-3));
  CHECK(t.groups[0].stages[0].on == device_encode);
  m.serial = true;  // one thread: the iteration is the sum of everything
  t = simulate(w, m, plan{{0, 1}, {topk_allgather, topk_allgather}});
  double total = 2e-3;
  for (const auto& g : t.groups) {
    for (const auto& st : g.stages) {
      CHECK(st.on == compute);
      total += st.end - st.start;
    }
  }
  CHECK(t.iteration_s == Approx(total));
}

TEST_CASE("simulate: a host-offloaded codec copies down, encodes, sends, decodes per rank, copies up", "[schedule]") {
  const cost_model m = test_model(4, 1e9);
  const workload w{{1 << 20}, {1e-3}, 0.0, 4.0};
  const timeline t = simulate(w, m, plan{{0}, {qsgd_host}});
  REQUIRE(t.groups[0].stages.size() == 5);
  const resource order[5] = {to_host, host_encode, network, host_decode, to_device};
  for (int s = 0; s < 5; ++s) CHECK(t.groups[0].stages[s].on == order[s]);
  const double bytes = 4.0 * (1 << 20);
  CHECK(t.busy[host_decode] == Approx(4 * (4e-6 + bytes / 4e9)));  // one decode per rank
  CHECK(t.busy[to_host] == Approx(10e-6 + bytes / 20e9));
}

TEST_CASE("simulate and the planners reject bad plans and options, naming them", "[schedule]") {
  const cost_model m = test_model(4, 1e9);
  const workload w{{10, 20, 30}, {1e-3, 1e-3, 1e-3}, 0.0, 4.0};
  CHECK_THROWS_WITH(simulate(w, m, plan{{0, 1}, {fp32_allreduce}}), Contains("the plan has 2 groups but 1 options"));
  CHECK_THROWS_WITH(simulate(w, m, plan{{1}, {fp32_allreduce}}), Contains("group_starts[0] is 1"));
  CHECK_THROWS_WITH(simulate(w, m, plan{{0}, {option{2, route::allreduce}}}),
                    Contains("codec 'topk' is not summable, so it cannot travel by allreduce"));
  CHECK_THROWS_WITH(simulate(w, m, plan{{0}, {option{3, route::sparse_sync}}}),
                    Contains("codec 'qsgd4' selects every element (density 1)"));
  CHECK_THROWS_WITH(simulate(w, m, plan{{0}, {option{0, route::allreduce, executor_kind::host}}}),
                    Contains("'fp32' runs no codec"));
  CHECK_THROWS_WITH(simulate(w, m, plan{{0}, {option{7}}}), Contains("option names codec 7 of 4"));
  CHECK_THROWS_WITH(simulate(workload{{1, 2}, {1e-3}, 0.0, 4.0}, m, plan{{0}, {fp32_allreduce}}),
                    Contains("2 tensors but 1 backward times"));
  CHECK_THROWS_WITH(espresso_plan(w, m, {}), Contains("no options to choose from"));
  CHECK_THROWS_WITH(exhaustive_plan(random_workload(13, 1), m, {fp32_allreduce}), Contains("at most 12 tensors, got 13"));
}

TEST_CASE("espresso_plan matches exhaustive search on small cases", "[schedule]") {
  struct small_case {
    std::size_t tensors;
    std::vector<option> options;
    double bytes_per_s;
  };
  const std::vector<small_case> cases = {
      {6, {fp32_allreduce, fp16_allreduce, topk_allgather, topk_sparse, qsgd_host}, 1.25e9},
      {9, {fp32_allreduce, fp16_allreduce, topk_allgather, qsgd_host}, 3.1e9},
      {11, {fp32_allreduce, topk_allgather, qsgd_host}, 12.5e9},
      {12, {fp16_allreduce, topk_sparse}, 1.25e9},
  };
  for (std::size_t c = 0; c < cases.size(); ++c) {
    for (unsigned seed = 0; seed < 3; ++seed) {
      const workload w = random_workload(cases[c].tensors, 100 * c + seed);
      const cost_model m = test_model(8, cases[c].bytes_per_s);
      const planned exact = exhaustive_plan(w, m, cases[c].options);
      const planned dp = espresso_plan(w, m, cases[c].options);
      INFO("case " << c << " seed " << seed << ": exhaustive " << exact.iteration_s << " s, planner " << dp.iteration_s
                   << " s, " << dp.dropped << " clocks dropped");
      CHECK(dp.iteration_s <= 1.02 * exact.iteration_s);
      if (dp.dropped == 0) CHECK(dp.iteration_s == Approx(exact.iteration_s).epsilon(1e-12));
      CHECK(dp.iteration_s >= exact.iteration_s * (1 - 1e-12));  // exhaustive is the optimum
      // The time the planner reports is the simulator's for its plan.
      CHECK(simulate(w, m, dp.chosen).iteration_s == Approx(dp.iteration_s).epsilon(1e-12));
    }
  }
}

TEST_CASE("cupcake_schedule beats layer-wise and single-group compression when overhead and overlap both matter",
          "[schedule]") {
  const cost_model m = test_model(8, 1.25e9);
  const workload w = random_workload(40, 9, 0.05);  // a fast GPU: synchronization dominates
  const planned fused = cupcake_schedule(w, m, topk_allgather);
  std::vector<std::size_t> each(40);
  for (std::size_t t = 0; t < 40; ++t) each[t] = t;
  const double layer_wise = simulate(w, m, plan{each, std::vector<option>(40, topk_allgather)}).iteration_s;
  const double single = simulate(w, m, plan{{0}, {topk_allgather}}).iteration_s;
  INFO("fused " << fused.iteration_s << " s in " << fused.chosen.group_starts.size() << " groups, layer-wise "
                << layer_wise << " s, single " << single << " s");
  CHECK(fused.iteration_s < layer_wise);
  CHECK(fused.iteration_s < single);
  CHECK(fused.chosen.group_starts.size() > 1);
  CHECK(fused.chosen.group_starts.size() < 40);
}

TEST_CASE("a frontier of one clock is a heuristic that reports what it dropped", "[schedule]") {
  const cost_model m = test_model(8, 1.25e9);
  const workload w = random_workload(10, 77);
  const std::vector<option> options = {fp32_allreduce, fp16_allreduce, topk_allgather, qsgd_host};
  const planned greedy = espresso_plan(w, m, options, planner_settings{1, 0});
  const planned exact = exhaustive_plan(w, m, options);
  CHECK(greedy.dropped > 0);
  CHECK(greedy.iteration_s >= exact.iteration_s * (1 - 1e-12));
  CHECK_THROWS_WITH(espresso_plan(w, m, options, planner_settings{0, 0}), Contains("settings.frontier must be >= 1, got 0"));
}

TEST_CASE("json reads and writes what the scheduler's files hold, and names what it cannot read", "[schedule]") {
  const json v = json::parse(R"( {"a": [1, -2.5e-3, true, null], "b": "x\"\u00e9\ud83d\ude00", "c": {}} )");
  CHECK(v.at("a").size() == 4);
  CHECK(v.at("a")[1].number() == -2.5e-3);
  CHECK(v.at("a")[2].boolean());
  CHECK(v.at("a")[3].type() == json::kind::null);
  CHECK(v.at("b").text() == "x\"\xc3\xa9\xf0\x9f\x98\x80");
  CHECK(json::parse(v.dump()).dump() == v.dump());
  CHECK(json::parse("0.1").number() == 0.1);
  CHECK(json(0.1).dump() == "0.10000000000000001");  // 17 digits: reads back exactly
  CHECK_THROWS_WITH(json::parse("{\"a\": 1,}"), Contains("a key that is not a string at byte 8"));
  CHECK_THROWS_WITH(json::parse("[1 2]"), Contains("a missing ',' or ']' at byte 3"));
  CHECK_THROWS_WITH(json::parse("01"), Contains("a number with a leading zero"));
  CHECK_THROWS_WITH(json::parse("[1] x"), Contains("text after the value at byte 4"));
  CHECK_THROWS_WITH(json::parse("\"\\ud800\""), Contains("a lone surrogate"));
  CHECK_THROWS_WITH(json::parse("1e999"), Contains("a number out of range"));
  CHECK_THROWS_WITH(json::parse(std::string(65, '[') + std::string(65, ']')), Contains("nesting deeper than 64"));
  CHECK_THROWS_WITH(json::parse("\"abc"), Contains("an unterminated string"));
  CHECK_THROWS_WITH(v.at("zz"), Contains("no key \"zz\""));
  CHECK_THROWS_WITH(v.at("b").number(), Contains("number needs a number, the value is a string"));
  // Typed lookups name the key.
  CHECK(v.array_at("a").size() == 4);
  CHECK(v.text_at("b") == v.at("b").text());
  CHECK_THROWS_WITH(v.number_at("b"), Contains("json: \"b\" must be a number, got a string"));
  CHECK_THROWS_WITH(v.array_at("c"), Contains("json: \"c\" must be an array, got an object"));
  CHECK_THROWS_WITH(v.boolean_or("a", false), Contains("json: \"a\" must be a boolean, got an array"));
  CHECK(v.boolean_or("zz", true));
  CHECK(v.at("c").size() == 0);
  CHECK_THROWS_WITH(v.at("c").items(), Contains("items needs an array, the value is an object"));
  // A key twice in one object: neither value is taken.
  CHECK_THROWS_WITH(json::parse(R"({"ranks": 8, "x": {}, "ranks": 64})"),
                    Contains("the key \"ranks\" appears twice in one object, again at byte 22"));
  CHECK(json::parse(R"({"a": {"k": 1}, "b": {"k": 2}})").at("b").number_at("k") == 2);  // per object
}

TEST_CASE("simulate: the sparse route adds its own calibrated work before the network", "[schedule]") {
  cost_model m = test_model(4, 1e9);
  const workload w{{1 << 20}, {1e-3}, 0.0, 4.0};
  const double without = simulate(w, m, plan{{0}, {topk_sparse}}).iteration_s;
  m.codecs[2].device_sparse_sync = {20e-6, 1e-10};
  const timeline t = simulate(w, m, plan{{0}, {topk_sparse}});
  REQUIRE(t.groups[0].stages.size() == 4);  // compress, the sparse work, the network, the decodes
  CHECK(t.groups[0].stages[1].on == compute);
  const double bytes = 4.0 * (1 << 20);
  CHECK(t.iteration_s == Approx(without + 20e-6 + 1e-10 * bytes));
  const cost_model back = cost_model_from_json(json::parse(to_json(m).dump()));
  CHECK(back.codecs[2].device_sparse_sync.alpha == 20e-6);
  CHECK(back.codecs[2].host_sparse_sync.alpha == 0.0);  // not written, read as zero
  CHECK(to_json(m).dump().find("host_sparse_sync") == std::string::npos);
}

TEST_CASE("cost models and plans go to JSON and back", "[schedule]") {
  cost_model m = test_model(8, 3.1e9);
  m.codecs[3].device_compress = linear_cost::unknown();  // calibrated without a GPU
  const cost_model back = cost_model_from_json(json::parse(to_json(m).dump()));
  CHECK(to_json(back).dump() == to_json(m).dump());
  CHECK(back.network.bytes_per_s == 3.1e9);
  CHECK_FALSE(back.codecs[3].device_compress.known());
  CHECK_THROWS_WITH(back.check(option{3, route::allgather, executor_kind::device}),
                    Contains("codec 'qsgd4' has no device costs (calibrate it there)"));

  const workload w = random_workload(20, 5);
  const planned p = espresso_plan(w, m, {fp32_allreduce, fp16_allreduce, topk_sparse, qsgd_host});
  const plan read = plan_from_json(json::parse(to_json(p.chosen, m).dump()), m);
  CHECK(read.group_starts == p.chosen.group_starts);
  CHECK(simulate(w, m, read).iteration_s == Approx(p.iteration_s).epsilon(1e-12));

  CHECK_THROWS_WITH(plan_from_json(json::parse(R"({"group_starts": [0], "groups": [{"codec": "lz4", "route": "allreduce", "executor": "device"}]})"), m),
                    Contains("unknown codec 'lz4'"));
  CHECK_THROWS_WITH(plan_from_json(json::parse(R"({"group_starts": [0.5], "groups": []})"), m),
                    Contains("group start 0.5 is not a tensor index"));
  CHECK_THROWS_WITH(plan_from_json(json::parse(R"({"group_starts": [0], "groups": [{"codec": "topk", "route": "allreduce", "executor": "device"}]})"), m),
                    Contains("not summable"));
  CHECK_THROWS_WITH(cost_model_from_json(json::parse(R"({"codecs": [{"name": "x", "ratio": 1, "density": 0}]})")),
                    Contains("codec 'x' has ratio 1, fixed 0 and density 0"));
}

TEST_CASE("cost models read from JSON are checked, naming the key or the field", "[schedule]") {
  const auto read = [](const std::string& text) { return cost_model_from_json(json::parse(text)); };
  const std::string fp32 = R"({"name": "fp32", "ratio": 1, "summable": true, "identity": true})";
  CHECK(read(R"({"ranks": 8, "codecs": [)" + fp32 + "]}").ranks == 8);
  // ranks: a whole number in [1, 2^20], not truncated, not converted out of int's range.
  CHECK_THROWS_WITH(read(R"({"ranks": 8.9, "codecs": []})"), Contains("ranks must be a whole number in [1, 1048576], got 8.9"));
  CHECK_THROWS_WITH(read(R"({"ranks": 1e10, "codecs": []})"), Contains("got 10000000000"));
  CHECK_THROWS_WITH(read(R"({"ranks": 2147483647, "codecs": []})"), Contains("got 2147483647"));
  CHECK_THROWS_WITH(read(R"({"ranks": 1048577, "codecs": []})"), Contains("got 1048577"));
  CHECK_THROWS_WITH(read(R"({"ranks": 0, "codecs": []})"), Contains("got 0"));
  CHECK_THROWS_WITH(read(R"({"ranks": "8", "codecs": []})"), Contains("json: \"ranks\" must be a number, got a string"));
  // Negative costs would let a plan gain time by running more stages.
  CHECK_THROWS_WITH(read(R"({"pcie": {"alpha": -1, "beta": 1e-9}, "codecs": []})"),
                    Contains("cost model: pcie must be two finite costs >= 0, got alpha -1 and beta 1e-09"));
  CHECK_THROWS_WITH(read(R"({"codecs": [{"name": "topk1", "ratio": 0.02, "host_compress": {"alpha": -5, "beta": 0}}]})"),
                    Contains("cost model: codec 'topk1': host_compress must be unmeasured (NaN) or two finite costs >= 0, got alpha -5"));
  CHECK_THROWS_WITH(read(R"({"network": {"latency_s": 1e-6, "bytes_per_s": 0}, "codecs": []})"),
                    Contains("bytes_per_s must be finite and > 0"));
  // Names must differ: a plan names its codecs.
  CHECK_THROWS_WITH(read(R"({"codecs": [)" + fp32 + "," + fp32 + "]}"), Contains("codecs 0 and 1 are both named 'fp32'"));
  // Arrays where arrays belong.
  CHECK_THROWS_WITH(read(R"({"codecs": {"a": )" + fp32 + "}}"), Contains("json: \"codecs\" must be an array, got an object"));
  // Each error says where: the section, the codec, the key.
  CHECK_THROWS_WITH(read(R"({"network": {"latency_s": 1e-6, "bytes_per_s": "1e9"}, "codecs": []})"),
                    Contains("cost model: network: json: \"bytes_per_s\" must be a number, got a string"));
  CHECK_THROWS_WITH(read(R"({"codecs": [{"name": "a", "ratio": 1}, {"name": "b", "ratio": 1, "summable": 1}]})"),
                    Contains("cost model: codec 'b': json: \"summable\" must be a boolean, got a number"));
  CHECK_THROWS_WITH(read(R"({"codecs": [{"name": "a", "ratio": 1, "host_compress": {"alpha": 1e-6}}]})"),
                    Contains("cost model: codec 'a': host_compress: json: no key \"beta\""));
  CHECK_THROWS_WITH(read(R"({"codecs": [)" + fp32 + R"(, {"ratio": 1}]})"), Contains("cost model: codecs[1]: json: no key \"name\""));
  CHECK_THROWS_WITH(read(R"({"codecs": [7]})"), Contains("cost model: codecs[0]: json: a key lookup needs an object"));
  CHECK_THROWS_WITH(read(R"({"codecs": [{"name": "", "ratio": 1}]})"), Contains("a codec has no name"));
}

TEST_CASE("plans read from JSON name the group and the key they cannot take", "[schedule]") {
  const cost_model m = test_model(4, 1e9);
  const auto read = [&](const std::string& text) { return plan_from_json(json::parse(text), m); };
  const std::string fp32 = R"({"codec": "fp32", "route": "allreduce", "executor": "device"})";
  CHECK(read(R"({"group_starts": [0, 2], "groups": [)" + fp32 + "," + fp32 + "]}").options.size() == 2);
  CHECK_THROWS_WITH(read(R"({"group_starts": [0, "2"], "groups": []})"),
                    Contains("plan: group_starts[1]: json: number needs a number, the value is a string"));
  CHECK_THROWS_WITH(read(R"({"group_starts": [0, 1048577.5], "groups": []})"), Contains("group start 1048577.5 is not a tensor index"));
  CHECK_THROWS_WITH(read(R"({"group_starts": [0], "groups": [7]})"), Contains("plan: groups[0]: json: a key lookup needs an object"));
  CHECK_THROWS_WITH(read(R"({"group_starts": [0, 1], "groups": [)" + fp32 + R"(, {"codec": "fp16", "executor": "device"}]})"),
                    Contains("plan: groups[1]: json: no key \"route\""));
  CHECK_THROWS_WITH(read(R"({"group_starts": [0], "groups": [{"codec": "fp16", "route": "ring", "executor": "device"}]})"),
                    Contains("plan: groups[0]: unknown route 'ring'"));
  CHECK_THROWS_WITH(read(R"({"group_starts": {"a": 0}, "groups": []})"), Contains("json: \"group_starts\" must be an array"));
}

TEST_CASE("simulate and the planners check the model and the workload they are given", "[schedule]") {
  const workload w{{10, 20, 30}, {1e-3, 1e-3, 1e-3}, 0.0, 4.0};
  const plan one{{0}, {fp32_allreduce}};
  cost_model m = test_model(4, 1e9);
  m.network.bytes_per_s = 0.0;  // an allreduce would take forever, a 0-byte one NaN
  CHECK_THROWS_WITH(simulate(w, m, one), Contains("bytes_per_s must be finite and > 0"));
  CHECK_THROWS_WITH(espresso_plan(w, m, {fp32_allreduce}), Contains("bytes_per_s must be finite and > 0"));
  m = test_model(4, -1e9);
  CHECK_THROWS_WITH(simulate(w, m, one), Contains("bytes_per_s -1e+09"));
  m = test_model(cost_model::max_ranks + 1, 1e9);
  CHECK_THROWS_WITH(simulate(w, m, one), Contains("ranks must be in [1, 1048576], got 1048577"));
  m = test_model(4, 1e9);
  m.codecs[2].name = "fp16";
  CHECK_THROWS_WITH(simulate(w, m, one), Contains("codecs 1 and 2 are both named 'fp16'"));
  CHECK_THROWS_WITH(to_json(one, m), Contains("codecs 1 and 2 are both named 'fp16'"));
  m = test_model(4, 1e9);
  m.codecs[3].host_decompress_add.beta = -1e-9;
  CHECK_THROWS_WITH(simulate(w, m, one), Contains("codec 'qsgd4': host_decompress_add must be unmeasured (NaN)"));
  m = test_model(4, 1e9);
  m.pcie = linear_cost::unknown();
  CHECK_THROWS_WITH(simulate(w, m, one), Contains("pcie must be two finite costs >= 0, got alpha nan"));
  m = test_model(4, 1e9);
  CHECK_THROWS_WITH(espresso_plan(w, m, {fp32_allreduce}, planner_settings{8, 0, std::nan("")}),
                    Contains("settings.tolerance must be finite (negative: the default), got nan"));
  m = test_model(4, 1e9);
  CHECK_THROWS_WITH(simulate(workload{w.sizes, w.backward_s, std::nan(""), 4.0}, m, one), Contains("forward_s is nan"));
  CHECK_THROWS_WITH(simulate(workload{w.sizes, w.backward_s, 0.0, 0.0}, m, one), Contains("element_bytes is 0"));
  CHECK_THROWS_WITH(simulate(workload{w.sizes, {1e-3, INFINITY, 1e-3}, 0.0, 4.0}, m, one),
                    Contains("backward time of tensor 1 is inf"));
  // The largest model still times: the rank loop of the sparse route ends.
  m = test_model(cost_model::max_ranks, 1e9);
  CHECK(std::isfinite(simulate(w, m, plan{{0}, {topk_sparse}}).iteration_s));
}

TEST_CASE("espresso_plan: a group limit of SIZE_MAX is no limit", "[schedule]") {
  const cost_model m = test_model(8, 1.25e9);
  const workload w = random_workload(12, 31);
  const std::vector<option> options = {fp32_allreduce, fp16_allreduce, topk_allgather};
  const planned unlimited = espresso_plan(w, m, options);
  const planned huge = espresso_plan(w, m, options, planner_settings{8, SIZE_MAX});
  CHECK(huge.chosen.group_starts == unlimited.chosen.group_starts);
  CHECK(huge.iteration_s == unlimited.iteration_s);
  CHECK(huge.chosen.group_starts.size() > 1);  // the limit did not force one group
  // A real limit still binds.
  const planned two = espresso_plan(w, m, options, planner_settings{8, 2});
  for (std::size_t g = 0; g < two.chosen.group_starts.size(); ++g) {
    const std::size_t end = g + 1 < two.chosen.group_starts.size() ? two.chosen.group_starts[g + 1] : 12;
    CHECK(end - two.chosen.group_starts[g] <= 2);
  }
}
