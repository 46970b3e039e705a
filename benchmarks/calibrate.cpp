// gradzip_calibrate: measures each codec's compress and decompress_add on this machine's host
// executor at 2^12 .. 2^22 fp32 elements, fits alpha + beta * bytes to each (the scheduler's
// cost model, include/gradzip/schedule/cost_model.hpp), and writes the codecs of a cost model
// as JSON (schedule/serialize.hpp), with every timing it fitted.
//
//   gradzip_calibrate [--threads N] [--out calibration.json] [--quick]
//
// Each point is the median of at least 5 runs and 20 ms (--quick: 3 runs, 5 ms, for tests).
// The fit minimizes the squared *relative* error, so small sizes (where alpha shows) weigh as
// much as large ones; a negative alpha (noise) is refitted as beta alone. Device costs need a
// GPU: a calibration from here leaves them unknown, and the planner then keeps codecs off the
// device.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/synthetic_gradient.hpp"
#include "gradzip/gradzip.hpp"

namespace {

namespace gz = gradzip;
using namespace gradzip::schedule;

struct settings {
  int threads = 0;
  std::string out;
  int runs = 5;
  double seconds = 0.02;
};

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
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

/// Weighted least squares of t = alpha + beta x with weights 1 / t^2; alpha >= 0.
linear_cost fit(const std::vector<double>& x, const std::vector<double>& t) {
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
  const double alpha = (st - beta * sx) / sw;
  if (alpha >= 0.0) return {alpha, beta};
  return {0.0, sxt / sxx};
}

json points_json(const std::vector<double>& x, const std::vector<double>& t) {
  json a = json::array();
  for (std::size_t i = 0; i < x.size(); ++i) a.push(json::array().push(x[i]).push(t[i]));
  return a;
}

template <class Codec>
json calibrate(const settings& s, const char* name, Codec c, double density) {
  gz::host exec(s.threads);
  std::vector<double> bytes, compress, decode, payload;
  for (int log2 = 12; log2 <= 22; log2 += 2) {
    const std::size_t n = std::size_t{1} << log2;
    const auto g = gradzip_tools::synthetic_gradient<float>(n, 2024);
    std::vector<std::byte> out(c.template max_compressed_bytes<float>(n));
    exec.reserve(c.template workspace_bytes<float>(exec, n));
    std::size_t size = 0;
    std::uint32_t step = 0;
    compress.push_back(median_seconds(s, [&] {
      size = c.compress(exec, gz::span<const float>(g), gz::span<std::byte>(out), {step++, 0});
    }));
    std::vector<float> accum(n, 0.0f);
    decode.push_back(median_seconds(s, [&] {
      c.decompress_add(exec, gz::span<const std::byte>(out.data(), size), gz::span<float>(accum));
    }));
    bytes.push_back(4.0 * static_cast<double>(n));
    payload.push_back(static_cast<double>(size));
  }
  codec_cost cost;
  cost.name = name;
  cost.summable = Codec::summable;
  cost.density = density;
  const std::size_t last = bytes.size() - 1;
  cost.ratio = (payload[last] - payload[last - 1]) / (bytes[last] - bytes[last - 1]);
  cost.fixed = std::max(0.0, payload[last] - cost.ratio * bytes[last]);
  cost.host_compress = fit(bytes, compress);
  cost.host_decompress_add = fit(bytes, decode);
  cost.device_compress = cost.device_decompress_add = linear_cost::unknown();
  return to_json(cost)
      .set("host_compress_points", points_json(bytes, compress))
      .set("host_decompress_add_points", points_json(bytes, decode));
}

settings parse(int argc, char** argv) {
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
      throw std::invalid_argument("gradzip_calibrate: unknown argument '" + a +
                                  "' (usage: gradzip_calibrate [--threads N] [--out FILE] [--quick])");
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) try {
  const settings s = parse(argc, argv);
  json codecs = json::array();
  codecs.push(to_json(codec_cost::uncompressed()));
  codecs.push(calibrate(s, "fp16", gz::codec<gz::sparsify::none, gz::quantize::cast_fp16, gz::encode::none>{}, 1.0));
  codecs.push(calibrate(s, "bf16", gz::codec<gz::sparsify::none, gz::quantize::cast_bf16, gz::encode::none>{}, 1.0));
  codecs.push(calibrate(s, "topk1", gz::codec<gz::sparsify::topk>{gz::sparsify::topk::ratio(0.01)}, 0.01));
  codecs.push(calibrate(s, "qsgd4", gz::codec<gz::sparsify::none, gz::quantize::qsgd<7>, gz::encode::none>{}, 1.0));
  codecs.push(calibrate(s, "scaled_sign",
                        gz::codec<gz::sparsify::none, gz::quantize::scaled_sign, gz::encode::none>{}, 1.0));
  json out = json::object().set("executor", "host").set("threads", gz::host(s.threads).threads());
  out.set("codecs", std::move(codecs));
  const std::string text = out.dump() + "\n";
  if (s.out.empty()) {
    std::fputs(text.c_str(), stdout);
  } else {
    std::ofstream(s.out) << text;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
