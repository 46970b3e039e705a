/**
 * @file timeline.hpp
 * @brief `schedule::simulate`: one training iteration's timeline, with backprop, compression,
 * the network and decoding overlapped, for a plan that cuts the gradients into fusion groups
 * and synchronizes each group its own way.
 *
 * The model (docs/scheduling.md):
 * - Backprop runs on the `compute` resource, tensor by tensor in backprop order, each taking
 *   its backward time; a group is ready when its last tensor's gradient is.
 * - A group then passes through its stages in order (cost_model.hpp gives their durations):
 *   compress on the device, or a copy to the host and compress there; the network; decode
 *   (once after an allreduce, once per rank after an allgather, twice for Zen's sparse
 *   synchronization); and after host decoding a copy back to the device.
 * - Each stage runs on one resource: the device's encode and decode streams, the host's encode
 *   and decode threads, the two directions of the host link, and the network. A resource
 *   serves one stage at a time, in group order (the order a framework issues them).
 * - A device compress competes with backprop for the GPU's SMs. With
 *   `cost_model::encode_on_compute` (the default) it runs on the `compute` resource, between
 *   the backprop of its group and of the next: every call's fixed cost delays the gradients
 *   that follow, which is what makes layer-wise compression slow (Cupcake's observation).
 *   Decoding, which mostly runs after backprop, has a stream of its own.
 * - With `cost_model::serial`, every stage runs on `compute`: nothing overlaps (a CPU training
 *   loop that synchronizes each group in turn).
 * - The iteration takes the forward time plus the time until every resource is done.
 *
 * Because every resource serves groups in order and each stage starts at the later of its
 * input's end and its resource's last end, one pass over the groups in order computes the
 * timeline exactly (the discrete-event simulation needs no event queue). The planners
 * (planner.hpp) advance the same state.
 *
 * @code
 * gradzip::schedule::workload w{sizes, backward_seconds, forward_seconds};
 * gradzip::schedule::plan p{{0}, {{0, gradzip::schedule::route::allreduce}}};  // one fp32 group
 * double t = gradzip::schedule::simulate(w, model, p).iteration_s;
 * @endcode
 */
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <vector>

#include "gradzip/core/error.hpp"
#include "gradzip/fusion/layout.hpp"
#include "gradzip/schedule/cost_model.hpp"

namespace gradzip::schedule {

enum resource : int {
  compute,
  device_encode,
  device_decode,
  host_encode,
  host_decode,
  to_host,
  to_device,
  network,
  resource_count
};

inline const char* name(resource r) {
  static const char* const names[resource_count] = {"compute", "device_encode", "device_decode", "host_encode",
                                                     "host_decode", "to_host", "to_device", "network"};
  return names[r];
}

/// One iteration's work: the tensors in backprop order, each with its backward time.
struct workload {
  std::vector<std::size_t> sizes;  ///< elements per tensor, backprop order
  std::vector<double> backward_s;  ///< seconds of backward compute that produce each tensor's gradient
  double forward_s = 0.0;          ///< seconds of the forward pass (not overlapped)
  double element_bytes = 4.0;      ///< bytes per gradient element (fp32)

  /// Throws naming the field unless every time is finite and >= 0 and element_bytes finite and > 0.
  void check() const {
    GRADZIP_EXPECTS(sizes.size() == backward_s.size(), "workload: ", sizes.size(), " tensors but ",
                    backward_s.size(), " backward times");
    for (std::size_t t = 0; t < backward_s.size(); ++t) {
      GRADZIP_EXPECTS(std::isfinite(backward_s[t]) && backward_s[t] >= 0.0, "workload: backward time of tensor ", t,
                      " is ", backward_s[t], " (must be finite and >= 0)");
    }
    GRADZIP_EXPECTS(std::isfinite(forward_s) && forward_s >= 0.0, "workload: forward_s is ", forward_s,
                    " (must be finite and >= 0)");
    GRADZIP_EXPECTS(std::isfinite(element_bytes) && element_bytes > 0.0, "workload: element_bytes is ", element_bytes,
                    " (must be finite and > 0)");
  }
};

/// Fusion groups (each group's first tensor, as fusion::layout takes them) and each group's option.
struct plan {
  std::vector<std::size_t> group_starts;
  std::vector<option> options;
};

/// A stage: its resource and duration.
struct stage {
  resource on = network;
  double seconds = 0.0;
};

/// At most this many stages per group (host offload by sparse sync: down, compress, its own work,
/// the network, decode, up).
inline constexpr int max_stages = 6;

/// The stages of synchronizing `elements` elements by `o`, into `out`; returns their count.
inline int group_stages(const cost_model& m, const option& o, double elements, double element_bytes,
                        stage (&out)[max_stages]) {
  const codec_cost& c = m.codecs[o.codec];
  const double bytes = elements * element_bytes;
  const bool host = o.where == executor_kind::host;
  int k = 0;
  if (!c.identity) {
    if (host) out[k++] = {to_host, m.pcie(bytes)};
    out[k++] = {host ? host_encode : m.encode_on_compute ? compute : device_encode, c.compress(o.where)(bytes)};
  }
  const double payload = c.identity ? bytes : c.payload_bytes(bytes);
  double decodes = 1.0;
  switch (o.path) {
    case route::allreduce: out[k++] = {network, m.allreduce_seconds(payload)}; break;
    case route::allgather:
      out[k++] = {network, m.allgather_seconds(payload)};
      decodes = m.ranks;
      break;
    case route::sparse_sync:
      // Its own host (or device) work, before the network's: a stage only where calibrated.
      if (const double work = c.sparse_sync(o.where)(bytes); work > 0.0) {
        out[k++] = {host ? host_encode : m.encode_on_compute ? compute : device_encode, work};
      }
      out[k++] = {network, m.sparse_sync_seconds(elements, c.density)};
      decodes = 2.0;  // the received parts into the rank's reduced part, then every reduced part
      break;
  }
  if (!c.identity) {
    const linear_cost& d = c.decompress_add(o.where);
    out[k++] = {host ? host_decode : device_decode, decodes * d(bytes)};
    if (host) out[k++] = {to_device, m.pcie(bytes)};
  }
  if (m.serial) {
    for (int s = 0; s < k; ++s) out[s].on = compute;
  }
  return k;
}

/// When each resource is next free.
using resource_clock = std::array<double, resource_count>;

/// Runs backprop for a group (`backward` seconds on `compute`), then the group through its
/// stages on `clock`; returns when it is done. `record` (may be null) receives when its
/// gradients were ready, then each stage's start and end.
inline double advance(resource_clock& clock, double backward, const stage* stages, int count, double* record = nullptr) {
  clock[compute] += backward;
  double t = clock[compute];
  if (record != nullptr) *record++ = t;
  for (int s = 0; s < count; ++s) {
    const double start = t > clock[stages[s].on] ? t : clock[stages[s].on];
    t = start + stages[s].seconds;
    clock[stages[s].on] = t;
    if (record != nullptr) {
      record[2 * s] = start;
      record[2 * s + 1] = t;
    }
  }
  return t;
}

/// The iteration's length once every group has gone through `clock` (times from the start of
/// backprop).
inline double iteration_seconds(const workload& w, const resource_clock& clock) {
  double end = 0.0;
  for (double t : clock) end = t > end ? t : end;
  return w.forward_s + end;
}

struct stage_span {
  resource on;
  double start, end;
};
struct group_timeline {
  double ready = 0.0;  ///< when its last gradient is produced
  double done = 0.0;   ///< when its last stage ends
  std::vector<stage_span> stages;
};
/// Times in a timeline count from the start of backprop.
struct timeline {
  double iteration_s = 0.0;   ///< forward, plus backprop and whatever synchronization outlasts it
  double backward_end = 0.0;  ///< when the last gradient was produced
  std::vector<group_timeline> groups;
  std::array<double, resource_count> busy{};  ///< seconds each resource works
};

/// The timeline of one iteration of `w` under plan `p` (checked against w and m).
inline timeline simulate(const workload& w, const cost_model& m, const plan& p) {
  w.check();
  m.validate();
  const fusion::layout l(w.sizes, p.group_starts);
  GRADZIP_EXPECTS(p.options.size() == l.group_count(), "simulate: the plan has ", l.group_count(), " groups but ",
                  p.options.size(), " options");
  timeline out;
  resource_clock clock{};  // times from the start of backprop
  std::size_t tensor = 0;
  for (std::size_t g = 0; g < l.group_count(); ++g) {
    m.check(p.options[g]);
    double backward = 0.0;
    for (; tensor < l.end_tensor(g); ++tensor) backward += w.backward_s[tensor];
    stage stages[max_stages];
    const int count = group_stages(m, p.options[g], static_cast<double>(l.group_size(g)), w.element_bytes, stages);
    double record[1 + 2 * max_stages];
    group_timeline gt;
    gt.done = advance(clock, backward, stages, count, record);
    gt.ready = record[0];
    for (int s = 0; s < count; ++s) {
      gt.stages.push_back({stages[s].on, record[1 + 2 * s], record[2 + 2 * s]});
      out.busy[stages[s].on] += stages[s].seconds;
    }
    out.busy[compute] += backward;
    out.groups.push_back(std::move(gt));
  }
  out.backward_end = out.groups.empty() ? 0.0 : out.groups.back().ready;
  out.iteration_s = iteration_seconds(w, clock);
  return out;
}

}  // namespace gradzip::schedule
