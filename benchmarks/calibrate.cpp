// gradzip_calibrate: measures each codec's compress and decompress_add on this machine's host
// executor at 2^12 .. 2^22 fp32 elements, fits alpha + beta * bytes to each (the scheduler's
// cost model, include/gradzip/schedule/cost_model.hpp), and writes the codecs of a cost model
// as JSON (schedule/serialize.hpp), with every timing it fitted.
//
//   gradzip_calibrate [--threads N] [--out calibration.json] [--quick]
//
// Each point is the median of at least 5 runs and 20 ms (--quick: 3 runs, 5 ms, for tests).
// The fit minimizes the squared *relative* error, so small sizes (where alpha shows) weigh as
// much as large ones. Device costs come from gradzip_calibrate_cuda (benchmarks/
// calibrate_cuda.cu) on a GPU; gradzip_plan --device-calibration merges them.
//
// For a sparsifying codec (density below 1) it also times the sparse_sync route's own work:
// the group as comm::planned_allreducer runs it by Zen's sparse sync (plan_codec::sparse),
// on one rank, less the codec's compress. One rank does the per-entry work of every rank (the
// split, the encodings, the merge, the decode) over its own entries; what more ranks add is
// the network's, which the link model prices.
#include "calibration.hpp"
#include "common/synthetic_gradient.hpp"

namespace {

using namespace gradzip_calibration;

/// A communicator of one rank: every collective leaves this rank's data where it is.
struct single_rank final : gz::comm::communicator {
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce_sum(void*, std::size_t, gz::element_type) override {}
  void allgather_sizes(std::uint64_t mine, gz::span<std::uint64_t> sizes) override { sizes[0] = mine; }
  void allgatherv_bytes(gz::span<const std::byte> mine, gz::span<std::byte> all, gz::span<const std::uint64_t>) override {
    std::copy(mine.begin(), mine.end(), all.begin());
  }
};

template <class Codec>
measured measure(const settings& s, const Codec& c) {
  gz::host exec(s.threads);
  measured m;
  for (int log2 = 12; log2 <= 22; log2 += 2) {
    const std::size_t n = std::size_t{1} << log2;
    const auto g = gradzip_tools::synthetic_gradient<float>(n, 2024);
    std::vector<std::byte> out(c.template max_compressed_bytes<float>(n));
    exec.reserve(c.template workspace_bytes<float>(exec, n));
    std::size_t size = 0;
    std::uint32_t step = 0;
    m.compress.push_back(median_seconds(s, [&] {
      size = c.compress(exec, gz::span<const float>(g), gz::span<std::byte>(out), {step++, 0});
    }));
    std::vector<float> accum(n, 0.0f);
    m.decompress_add.push_back(median_seconds(s, [&] {
      c.decompress_add(exec, gz::span<const std::byte>(out.data(), size), gz::span<float>(accum));
    }));
    m.bytes.push_back(4.0 * static_cast<double>(n));
    m.payload.push_back(static_cast<double>(size));
    if constexpr (Codec::has_indices) {
      single_rank one;
      const auto group = gz::comm::plan_codec<float, gz::host>::sparse("", c).build(exec, n, 1);
      std::vector<float> work(n);
      const double whole = median_seconds(s, [&] {
        std::copy(g.begin(), g.end(), work.begin());
        group->run(one, exec, gz::span<float>(work), {step++, 0});
      });
      m.sparse_sync.push_back(std::max(whole - m.compress.back(), 1e-9));
    }
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) try {
  const settings s = parse(argc, argv, "gradzip_calibrate");
  json codecs = json::array();
  for_each_codec([&](const char* name, auto codec, double density) {
    codecs.push(codec_json(name, decltype(codec)::summable, density, measure(s, codec), gz::schedule::executor_kind::host));
  });
  write(s, json::object().set("executor", "host").set("threads", gz::host(s.threads).threads()), codecs);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
