/**
 * @file cost_model.hpp
 * @brief `schedule::cost_model`: what compressing, moving and decoding a fusion group costs, as
 * calibrated on the machine at hand; and `schedule::option`, one way to synchronize a group.
 *
 * Each codec's compress and `decompress_add` on each executor cost α + β · bytes (α a fixed
 * cost per call, β per input byte: the dense gradient's bytes), fitted by `gradzip_calibrate`
 * (docs/scheduling.md) from timings at several sizes. Its payload is `ratio` bytes per input
 * byte plus `fixed` bytes. The network is comm::link_model (a latency per round, a cost per
 * message, a bandwidth), the same model as Zen's sparse synchronization (comm/sparse_cost.hpp):
 *
 * - allreduce of b bytes (Rabenseifner: reduce-scatter then allgather): 2 log2 P rounds and
 *   messages, 2 (P - 1) / P · b bytes;
 * - allgather of b bytes from each rank: log2 P rounds, P - 1 messages, (P - 1) · b bytes;
 * - sparse synchronization: comm::estimate's cheapest of Zen's two schemes, for ranks whose
 *   nonzeros are drawn independently (union of k ranks: n (1 - (1 - d)^k) at density d).
 *
 * Offloading to the host adds a copy of the group's gradient to the host and of the decoded
 * update back, over `pcie` (a latency and a bandwidth each way).
 *
 * @code
 * gradzip::schedule::cost_model m;
 * m.ranks = 8;
 * m.network = {5e-6, 12.5e9, 5e-7};                       // 100 Gb/s
 * m.codecs.push_back(gradzip::schedule::codec_cost::uncompressed());
 * double s = m.allreduce_seconds(4.0 * 25.6e6);          // fp32 ResNet-50 in one allreduce
 * @endcode
 */
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gradzip/comm/sparse_cost.hpp"
#include "gradzip/core/error.hpp"

namespace gradzip::schedule {

/// alpha + beta · bytes seconds. A cost not measured (a device cost calibrated without a GPU)
/// holds NaN, and options that need it are rejected.
struct linear_cost {
  double alpha = 0.0;  ///< seconds per call
  double beta = 0.0;   ///< seconds per input byte
  double operator()(double bytes) const { return alpha + beta * bytes; }
  bool known() const { return std::isfinite(alpha) && std::isfinite(beta); }
  static linear_cost unknown() { return {std::nan(""), std::nan("")}; }
  /// Whether both terms are finite and >= 0: a negative time would let a plan gain by running
  /// more stages.
  bool valid() const { return known() && alpha >= 0.0 && beta >= 0.0; }
  /// Whether it is not measured: both terms NaN.
  bool unmeasured() const { return std::isnan(alpha) && std::isnan(beta); }
};

/// Where a codec runs.
enum class executor_kind { device, host };

/// How a group's payload travels.
enum class route {
  allreduce,    ///< one allreduce of the payload (summable codecs, and uncompressed fp32)
  allgather,    ///< every rank's payload to every rank, each decoded
  sparse_sync,  ///< Zen's sparse synchronization (sparsifying codecs)
};

inline const char* name(route r) {
  switch (r) {
    case route::allreduce: return "allreduce";
    case route::allgather: return "allgather";
    case route::sparse_sync: return "sparse_sync";
  }
  return "?";
}
inline const char* name(executor_kind e) { return e == executor_kind::device ? "device" : "host"; }

/// What one codec costs, on each executor.
struct codec_cost {
  std::string name;
  linear_cost device_compress, device_decompress_add;
  linear_cost host_compress, host_decompress_add;
  double ratio = 1.0;      ///< payload bytes per input byte
  double fixed = 0.0;      ///< payload bytes per payload (header, frame)
  double density = 1.0;    ///< the fraction of elements it selects (sparse_sync's nonzeros)
  bool summable = false;   ///< may travel by allreduce
  bool identity = false;   ///< no codec call at all: the gradient itself travels (fp32)
  /// The sparse_sync route's own work beyond compress, the network and the decodes (finding
  /// the payload's entries, Zen's split into parts, the part encodings and merges), per input
  /// byte. Zero where not calibrated (gradzip_calibrate measures the host's). Last, so that
  /// aggregate initializations written before it still mean what they meant.
  linear_cost device_sparse_sync, host_sparse_sync;

  /// The gradient as it is: no compress, no decode, 4 bytes per fp32 element, summable.
  static codec_cost uncompressed() {
    codec_cost c;
    c.name = "fp32";
    c.summable = true;
    c.identity = true;
    return c;
  }

  double payload_bytes(double input_bytes) const { return ratio * input_bytes + fixed; }
  const linear_cost& compress(executor_kind e) const { return e == executor_kind::device ? device_compress : host_compress; }
  const linear_cost& decompress_add(executor_kind e) const {
    return e == executor_kind::device ? device_decompress_add : host_decompress_add;
  }
  const linear_cost& sparse_sync(executor_kind e) const {
    return e == executor_kind::device ? device_sparse_sync : host_sparse_sync;
  }

  /// Its six costs with their JSON keys, in the order a cost model file writes them.
  std::array<std::pair<const char*, const linear_cost*>, 6> named_costs() const {
    return {{{"host_compress", &host_compress},
             {"host_decompress_add", &host_decompress_add},
             {"device_compress", &device_compress},
             {"device_decompress_add", &device_decompress_add},
             {"host_sparse_sync", &host_sparse_sync},
             {"device_sparse_sync", &device_sparse_sync}}};
  }

  /// Throws naming the codec and the field unless its sizes and costs are in range.
  void check() const {
    GRADZIP_EXPECTS(std::isfinite(ratio) && std::isfinite(fixed) && ratio >= 0.0 && fixed >= 0.0 && density > 0.0 &&
                        density <= 1.0,
                    "cost model: codec '", name, "' has ratio ", ratio, ", fixed ", fixed, " and density ", density,
                    " (ratio and fixed must be finite and >= 0, density in (0, 1])");
    GRADZIP_EXPECTS(!name.empty(), "cost model: a codec has no name (a plan names its codecs)");
    for (const auto& [key, cost] : named_costs()) {
      GRADZIP_EXPECTS(cost->unmeasured() || cost->valid(), "cost model: codec '", name, "': ", key,
                      " must be unmeasured (NaN) or two finite costs >= 0, got alpha ", cost->alpha, " and beta ",
                      cost->beta);
    }
  }
};

/// One way to synchronize a group: a codec (an index into cost_model::codecs), its route and
/// where it runs.
struct option {
  std::size_t codec = 0;
  route path = route::allreduce;
  executor_kind where = executor_kind::device;
};

/// The machine: ranks, network, host link, and each codec's costs.
struct cost_model {
  /// The most ranks a model may have: 2^20, beyond any training job, so that sums over ranks
  /// and rank counts stay exact in the model's int and double arithmetic.
  static constexpr int max_ranks = 1 << 20;

  int ranks = 1;
  comm::link_model network;
  linear_cost pcie{10e-6, 1.0 / 25e9};  ///< one copy between device and host (each way)
  /// A device compress runs on backprop's resource (it competes for the SMs): timeline.hpp.
  bool encode_on_compute = true;
  /// Every stage runs on backprop's resource, one after another: a training loop on one CPU
  /// thread that synchronizes its groups in turn (examples/mpi_train.cpp), with no overlap.
  bool serial = false;
  std::vector<codec_cost> codecs;

  double allreduce_seconds(double bytes) const {
    if (ranks <= 1) return 0.0;
    const double P = ranks, rounds = 2.0 * std::ceil(std::log2(P));
    return rounds * (network.latency_s + network.message_s) + 2.0 * (P - 1.0) / P * bytes / network.bytes_per_s;
  }
  double allgather_seconds(double bytes_each) const {
    if (ranks <= 1) return 0.0;
    const double P = ranks;
    return std::ceil(std::log2(P)) * network.latency_s + (P - 1.0) * network.message_s +
           (P - 1.0) * bytes_each / network.bytes_per_s;
  }
  /// Zen's cheaper scheme for `elements` fp32 values at `density`, ranks independent.
  double sparse_sync_seconds(double elements, double density) const {
    if (ranks <= 1) return 0.0;
    comm::sparsity_profile p{static_cast<std::uint64_t>(elements), ranks, density * elements, {}};
    for (long long k = 1; k <= ranks; k *= 2) {  // long long: k reaches 2 · ranks without overflow
      p.unions.push_back(elements * (1.0 - std::pow(1.0 - density, static_cast<double>(k))));
    }
    if ((ranks & (ranks - 1)) != 0) p.unions.push_back(elements * (1.0 - std::pow(1.0 - density, ranks)));
    const comm::scheme_costs c = comm::estimate(p, network);
    return std::fmin(c.seconds[static_cast<int>(comm::sync_choice::balanced_parallelism)],
                     c.seconds[static_cast<int>(comm::sync_choice::hierarchical_centralization)]);
  }

  /// Throws naming the field unless the model is one the simulator can time: ranks in
  /// [1, max_ranks], a network with a finite bandwidth > 0 and finite latencies >= 0, a known host
  /// link with costs >= 0, each codec's fields in range (`codec_cost::check`), and codec names
  /// that differ (a plan names its codecs).
  void validate() const {
    GRADZIP_EXPECTS(ranks >= 1 && ranks <= max_ranks, "cost model: ranks must be in [1, ", max_ranks, "], got ", ranks);
    GRADZIP_EXPECTS(std::isfinite(network.bytes_per_s) && network.bytes_per_s > 0.0 && std::isfinite(network.latency_s) &&
                        network.latency_s >= 0.0 && std::isfinite(network.message_s) && network.message_s >= 0.0,
                    "cost model: bad network (latency_s ", network.latency_s, ", bytes_per_s ", network.bytes_per_s,
                    ", message_s ", network.message_s, "): bytes_per_s must be finite and > 0, the latencies finite and >= 0");
    GRADZIP_EXPECTS(pcie.valid(), "cost model: pcie must be two finite costs >= 0, got alpha ", pcie.alpha,
                    " and beta ", pcie.beta);
    std::map<std::string, std::size_t> named;  // each name's first codec
    for (std::size_t c = 0; c < codecs.size(); ++c) {
      codecs[c].check();
      const auto [first, fresh] = named.emplace(codecs[c].name, c);
      GRADZIP_EXPECTS(fresh, "cost model: codecs ", first->second, " and ", c, " are both named '", codecs[c].name,
                      "' (a plan names its codecs)");
    }
  }

  /// Throws unless `o` names a codec of this model that can take its route.
  void check(const option& o) const {
    GRADZIP_EXPECTS(o.codec < codecs.size(), "cost_model: option names codec ", o.codec, " of ", codecs.size());
    const codec_cost& c = codecs[o.codec];
    GRADZIP_EXPECTS(o.path != route::allreduce || c.summable, "cost_model: codec '", c.name,
                    "' is not summable, so it cannot travel by allreduce");
    GRADZIP_EXPECTS(o.path != route::sparse_sync || c.density < 1.0, "cost_model: codec '", c.name,
                    "' selects every element (density ", c.density, "), so sparse_sync does not apply");
    GRADZIP_EXPECTS(c.identity || (c.compress(o.where).known() && c.decompress_add(o.where).known()),
                    "cost_model: codec '", c.name, "' has no ", name(o.where), " costs (calibrate it there)");
    GRADZIP_EXPECTS(!c.identity || (o.where == executor_kind::device && o.path == route::allreduce), "cost_model: '",
                    c.name, "' runs no codec: it travels by allreduce, on the device");
  }
};

}  // namespace gradzip::schedule
