/**
 * @file serialize.hpp
 * @brief Cost models and plans to and from JSON (schedule/json.hpp): the calibration that
 * `gradzip_calibrate` writes, and the plan that `gradzip_plan` writes for the fusion buffer and
 * the training loop to read.
 *
 * A cost model:
 *
 *     {"ranks": 8,
 *      "network": {"latency_s": 5e-6, "bytes_per_s": 12.5e9, "message_s": 5e-7},
 *      "pcie": {"alpha": 1e-5, "beta": 4e-11}, "encode_on_compute": true, "serial": false,
 *      "codecs": [{"name": "topk1", "ratio": 0.0201, "fixed": 96, "density": 0.01,
 *                  "summable": false, "identity": false,
 *                  "host_compress": {"alpha": 3e-6, "beta": 5e-10},
 *                  "host_decompress_add": {...}, "device_compress": {...},
 *                  "device_decompress_add": {...}}]}
 *
 * A cost that is absent is unknown (NaN, see cost_model.hpp); `ranks`, `network`, `pcie`,
 * `encode_on_compute` and `serial` take their defaults when absent, so a calibration file alone is a cost model. A plan names
 * its codecs, so that whoever runs it maps names to its own codec objects:
 *
 *     {"group_starts": [0, 12, 40],
 *      "groups": [{"codec": "fp32", "route": "allreduce", "executor": "device"}, ...]}
 */
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gradzip/schedule/cost_model.hpp"
#include "gradzip/schedule/json.hpp"
#include "gradzip/schedule/timeline.hpp"

namespace gradzip::schedule {

inline json to_json(const linear_cost& c) {
  return json::object().set("alpha", c.alpha).set("beta", c.beta);
}

inline json to_json(const codec_cost& c) {
  json o = json::object();
  o.set("name", c.name).set("ratio", c.ratio).set("fixed", c.fixed).set("density", c.density);
  o.set("summable", c.summable).set("identity", c.identity);
  for (const auto& [key, cost] : c.named_costs()) {
    const bool zero_sparse = (cost == &c.host_sparse_sync || cost == &c.device_sparse_sync) && cost->alpha == 0.0 &&
                             cost->beta == 0.0;  // the default: not written
    if (cost->known() && !zero_sparse) o.set(key, to_json(*cost));
  }
  return o;
}

inline json to_json(const cost_model& m) {
  json codecs = json::array();
  for (const codec_cost& c : m.codecs) codecs.push(to_json(c));
  return json::object()
      .set("ranks", m.ranks)
      .set("network", json::object()
                          .set("latency_s", m.network.latency_s)
                          .set("bytes_per_s", m.network.bytes_per_s)
                          .set("message_s", m.network.message_s))
      .set("pcie", to_json(m.pcie))
      .set("encode_on_compute", m.encode_on_compute)
      .set("serial", m.serial)
      .set("codecs", std::move(codecs));
}

namespace detail {

/// f(), with `where` put before the message of the invalid_argument it throws: the reader's
/// errors name a key, this names the codec it belongs to.
template <class F>
auto in_context(const std::string& where, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const gradzip::invalid_argument& e) {
    throw gradzip::invalid_argument(where + ": " + e.what());
  }
}

/// v with up to 15 significant digits: 1048577 and 8.5 as they were written, not as 1.04858e+06.
inline std::string shown(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.15g", v);
  return text;
}

inline linear_cost cost_from_json(const json& o, const char* key) {
  if (!o.contains(key)) return linear_cost::unknown();
  return in_context(key, [&] {
    const json& c = o.at(key);
    return linear_cost{c.number_at("alpha"), c.number_at("beta")};
  });
}

}  // namespace detail

/// One codec's costs. Throws naming the key (or the field, `codec_cost::check`) it cannot take.
inline codec_cost codec_cost_from_json(const json& o) {
  codec_cost c;
  c.name = o.text_at("name");
  detail::in_context("cost model: codec '" + c.name + "'", [&] {
    c.ratio = o.number_at("ratio");
    c.fixed = o.number_or("fixed", 0.0);
    c.density = o.number_or("density", 1.0);
    c.summable = o.boolean_or("summable", false);
    c.identity = o.boolean_or("identity", false);
    c.host_compress = detail::cost_from_json(o, "host_compress");
    c.host_decompress_add = detail::cost_from_json(o, "host_decompress_add");
    c.device_compress = detail::cost_from_json(o, "device_compress");
    c.device_decompress_add = detail::cost_from_json(o, "device_decompress_add");
    // The sparse route's own work: zero where a calibration has not measured it.
    c.host_sparse_sync = o.contains("host_sparse_sync") ? detail::cost_from_json(o, "host_sparse_sync") : linear_cost{};
    c.device_sparse_sync = o.contains("device_sparse_sync") ? detail::cost_from_json(o, "device_sparse_sync") : linear_cost{};
  });
  c.check();
  return c;
}

/// A cost model (`cost_model::validate`d). Throws naming the key or the field it cannot take:
/// `ranks` must be a whole number in [1, cost_model::max_ranks], every cost finite and >= 0 (or
/// absent), codec names distinct.
inline cost_model cost_model_from_json(const json& o) {
  cost_model m;
  const double ranks = o.number_or("ranks", 1.0);
  GRADZIP_EXPECTS(ranks >= 1.0 && ranks <= cost_model::max_ranks && ranks == std::floor(ranks),
                  "cost model: ranks must be a whole number in [1, ", cost_model::max_ranks, "], got ",
                  detail::shown(ranks));
  m.ranks = static_cast<int>(ranks);
  if (o.contains("network")) {
    detail::in_context("cost model: network", [&] {
      const json& n = o.at("network");
      m.network = {n.number_at("latency_s"), n.number_at("bytes_per_s"), n.number_or("message_s", 0.0)};
    });
  }
  if (o.contains("pcie")) m.pcie = detail::in_context("cost model", [&] { return detail::cost_from_json(o, "pcie"); });
  m.encode_on_compute = o.boolean_or("encode_on_compute", m.encode_on_compute);
  m.serial = o.boolean_or("serial", m.serial);
  const std::vector<json>& codecs = o.array_at("codecs");
  for (std::size_t c = 0; c < codecs.size(); ++c) {
    // A codec is named by its name once it has one, by its place before.
    detail::in_context(gradzip::detail::concat("cost model: codecs[", c, "]"), [&] { codecs[c].text_at("name"); });
    m.codecs.push_back(codec_cost_from_json(codecs[c]));
  }
  m.validate();
  return m;
}

inline json to_json(const plan& p, const cost_model& m) {
  m.validate();  // distinct names: the plan is read back by them
  json starts = json::array(), groups = json::array();
  for (std::size_t s : p.group_starts) starts.push(s);
  for (const option& o : p.options) {
    m.check(o);
    groups.push(json::object()
                    .set("codec", m.codecs[o.codec].name)
                    .set("route", name(o.path))
                    .set("executor", name(o.where)));
  }
  return json::object().set("group_starts", std::move(starts)).set("groups", std::move(groups));
}

namespace detail {

/// One group's option, its codec found by name among m's (and checked against m).
inline option option_from_json(const json& g, const cost_model& m) {
  option opt;
  const std::string& codec = g.text_at("codec");
  opt.codec = m.codecs.size();
  for (std::size_t c = 0; c < m.codecs.size() && opt.codec == m.codecs.size(); ++c) {
    if (m.codecs[c].name == codec) opt.codec = c;  // the only one: validate() keeps names distinct
  }
  GRADZIP_EXPECTS(opt.codec < m.codecs.size(), "unknown codec '", codec, "'");
  const std::string& path = g.text_at("route");
  if (path == "allreduce") {
    opt.path = route::allreduce;
  } else if (path == "allgather") {
    opt.path = route::allgather;
  } else {
    GRADZIP_EXPECTS(path == "sparse_sync", "unknown route '", path, "'");
    opt.path = route::sparse_sync;
  }
  const std::string& where = g.text_at("executor");
  GRADZIP_EXPECTS(where == "device" || where == "host", "unknown executor '", where, "'");
  opt.where = where == "device" ? executor_kind::device : executor_kind::host;
  m.check(opt);
  return opt;
}

}  // namespace detail

/// A plan, its codecs resolved by name against `m`'s (m validated, each option checked against m).
/// Throws naming the group and the key it cannot take.
inline plan plan_from_json(const json& o, const cost_model& m) {
  m.validate();
  plan p;
  const std::vector<json>& starts = o.array_at("group_starts");
  for (std::size_t i = 0; i < starts.size(); ++i) {
    const double s = detail::in_context(gradzip::detail::concat("plan: group_starts[", i, "]"),
                                        [&] { return starts[i].number(); });
    GRADZIP_EXPECTS(s >= 0 && s == std::floor(s) && s < 9.007199254740992e15, "plan: group start ", detail::shown(s),
                    " is not a tensor index");
    p.group_starts.push_back(static_cast<std::size_t>(s));
  }
  const std::vector<json>& groups = o.array_at("groups");
  for (std::size_t i = 0; i < groups.size(); ++i) {
    p.options.push_back(detail::in_context(gradzip::detail::concat("plan: groups[", i, "]"),
                                           [&] { return detail::option_from_json(groups[i], m); }));
  }
  GRADZIP_EXPECTS(p.options.size() == p.group_starts.size(), "plan: ", p.group_starts.size(), " group starts but ",
                  p.options.size(), " groups");
  return p;
}

}  // namespace gradzip::schedule
