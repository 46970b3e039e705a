// What gradzip_calibrate (host) and gradzip_calibrate_cuda share: the codecs both calibrate,
// the timing, the fit of alpha + beta * bytes, and the JSON they write (a cost model's codecs,
// include/gradzip/schedule/serialize.hpp, with every point fitted).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "gradzip/gradzip.hpp"

namespace gradzip_calibration {

namespace gz = gradzip;
using gz::schedule::json;
using gz::schedule::linear_cost;

struct settings {
  int threads = 0;  // host only
  std::string out;
  int runs = 5;
  double seconds = 0.02;
};

inline settings parse(int argc, char** argv, const char* tool) {
  settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      s.runs = 3;
      s.seconds = 0.005;
    } else if ((a == "--threads" || a == "--out") && i + 1 < argc) {
      if (a == "--threads") s.threads = std::stoi(argv[++i]);
      else s.out = argv[++i];
    } else {
      throw std::invalid_argument(std::string(tool) + ": unknown argument '" + a + "' (usage: " + tool +
                                  " [--threads N] [--out FILE] [--quick])");
    }
  }
  return s;
}

/// The median wall time of `body` over at least s.runs runs and s.seconds (body must finish its
/// work before returning: device calls synchronize).
template <class Body>
double median_seconds(const settings& s, Body&& body) {
  std::vector<double> times;
  const auto begin = std::chrono::steady_clock::now();
  while (static_cast<int>(times.size()) < s.runs ||
         std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count() < s.seconds) {
    const auto start = std::chrono::steady_clock::now();
    body();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2), times.end());
  return times[times.size() / 2];
}

/// Weighted least squares of t = alpha + beta x with weights 1 / t^2 (relative error). A
/// negative slope (the noise of a flat, launch-bound call) is refitted as alpha alone, a
/// negative alpha as beta alone: cost models take no negative cost (`codec_cost::check`).
inline linear_cost fit(const std::vector<double>& x, const std::vector<double>& t) {
  double sw = 0, sx = 0, st = 0, sxx = 0, sxt = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double w = 1.0 / (t[i] * t[i]);
    sw += w;
    sx += w * x[i];
    st += w * t[i];
    sxx += w * x[i] * x[i];
    sxt += w * x[i] * t[i];
  }
  const double beta = (sw * sxt - sx * st) / (sw * sxx - sx * sx);
  if (beta < 0.0) return {st / sw, 0.0};  // then alpha = (st - beta sx) / sw > 0
  const double alpha = (st - beta * sx) / sw;
  if (alpha >= 0.0) return {alpha, beta};
  return {0.0, sxt / sxx};
}

inline json points_json(const std::vector<double>& x, const std::vector<double>& t) {
  json a = json::array();
  for (std::size_t i = 0; i < x.size(); ++i) a.push(json::array().push(x[i]).push(t[i]));
  return a;
}

/// Timings of one codec at several sizes; `sparse_sync`, where measured, is the sparse route's
/// own work (the group's time by sparse sync less its compress).
struct measured {
  std::vector<double> bytes, payload, compress, decompress_add, sparse_sync;
};

/// The codec's cost from its timings, on executor `where` (the other executor's costs unknown).
inline json codec_json(const char* name, bool summable, double density, const measured& m,
                       gz::schedule::executor_kind where) {
  gz::schedule::codec_cost c;
  c.name = name;
  c.summable = summable;
  c.density = density;
  const std::size_t last = m.bytes.size() - 1;
  c.ratio = (m.payload[last] - m.payload[last - 1]) / (m.bytes[last] - m.bytes[last - 1]);
  c.fixed = std::max(0.0, m.payload[last] - c.ratio * m.bytes[last]);
  c.host_compress = c.host_decompress_add = c.device_compress = c.device_decompress_add = linear_cost::unknown();
  const bool host = where == gz::schedule::executor_kind::host;
  (host ? c.host_compress : c.device_compress) = fit(m.bytes, m.compress);
  (host ? c.host_decompress_add : c.device_decompress_add) = fit(m.bytes, m.decompress_add);
  if (!m.sparse_sync.empty()) (host ? c.host_sparse_sync : c.device_sparse_sync) = fit(m.bytes, m.sparse_sync);
  const std::string prefix = host ? "host_" : "device_";
  json out = gz::schedule::to_json(c)
                 .set(prefix + "compress_points", points_json(m.bytes, m.compress))
                 .set(prefix + "decompress_add_points", points_json(m.bytes, m.decompress_add));
  if (!m.sparse_sync.empty()) out.set(prefix + "sparse_sync_points", points_json(m.bytes, m.sparse_sync));
  return out;
}

/// The codecs calibrated, in the names gradzip_plan and mpi_train use: f(name, codec, density).
template <class F>
void for_each_codec(F&& f) {
  using gz::encode::none;
  f("fp16", gz::codec<gz::sparsify::none, gz::quantize::cast_fp16, none>{}, 1.0);
  f("bf16", gz::codec<gz::sparsify::none, gz::quantize::cast_bf16, none>{}, 1.0);
  f("topk1", gz::codec<gz::sparsify::topk>{gz::sparsify::topk::ratio(0.01)}, 0.01);
  f("qsgd4", gz::codec<gz::sparsify::none, gz::quantize::qsgd<7>, none>{}, 1.0);
  f("scaled_sign", gz::codec<gz::sparsify::none, gz::quantize::scaled_sign, none>{}, 1.0);
}

/// Writes {"executor": ..., "codecs": [fp32, then `codecs`]} to s.out, or stdout.
inline void write(const settings& s, json head, const json& codecs) {
  json all = json::array();
  all.push(gz::schedule::to_json(gz::schedule::codec_cost::uncompressed()));
  for (const json& c : codecs.items()) all.push(c);
  head.set("codecs", std::move(all));
  const std::string text = head.dump() + "\n";
  if (s.out.empty()) {
    std::fputs(text.c_str(), stdout);
  } else {
    std::ofstream(s.out) << text;
  }
}

}  // namespace gradzip_calibration
