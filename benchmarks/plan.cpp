// gradzip_plan: plans one training iteration of ResNet-50 or BERT-base (tools/common/
// model_profiles.hpp) with the Cupcake scheduler and the Espresso planner
// (include/gradzip/schedule/planner.hpp), and prints the simulated iteration time at several
// link speeds for four strategies:
//   fp32       no compression: fp32 allreduce in DDP's 25 MB buckets;
//   layerwise  compress everything, one tensor at a time, with one codec (--codec);
//   cupcake    the same codec in the fusion groups Cupcake's scheduler picks;
//   plan       Espresso's planner: groups, and per group fp32 or fp16 allreduce, a codec through
//              allgather, top-k through Zen's sparse synchronization, on the device or offloaded
//              to the host.
//
//   gradzip_plan --model resnet50|bert-base|mlp [--calibration FILE] [--ranks 8] [--samples 64]
//                [--tflops 50] [--gbps 10,25,100,2400 | --link FILE] [--codec topk1] [--csv FILE]
//                [--plan-out FILE --plan-gbps 25] [--cost-out FILE --cost-gbps 25] [--cpu-only]
//                [--device-calibration FILE]
//
// --cpu-only plans a training loop that runs on one CPU thread per rank and synchronizes its
// groups one after another (examples/mpi_train.cpp): the calibrated host costs become the
// "device" costs, and nothing is offloaded or overlapped (cost_model::serial). --link reads a measured network ({"network": {...}}, as
// gradzip_mpi_train --measure-link writes it) instead of the --gbps list.
//
// Backward times: twice each layer's forward FLOPs (model_profiles.hpp) for --samples samples
// (images; BERT: sequences of 128 tokens) at --tflops. Host codec costs come from
// gradzip_calibrate's file (without one, nothing is offloaded). Device codec costs come from
// gradzip_calibrate_cuda's file (--device-calibration) where one is given; otherwise from the
// H100 calibration of 2026-11-25 (device_costs below).
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/model_profiles.hpp"
#include "gradzip/schedule/planner.hpp"
#include "gradzip/schedule/serialize.hpp"

namespace {

using namespace gradzip::schedule;

struct settings {
  std::string model = "resnet50", calibration, csv, plan_out, cost_out, codec = "topk1", link, device_calibration;
  bool cpu_only = false;
  int ranks = 8;
  double samples = 64, tflops = 50;
  std::vector<double> gbps = {10, 25, 100, 2400};
  double plan_gbps = 25, cost_gbps = 25;
};

/// Device costs measured on one H100 80GB HBM3 (2026-11-25, `gradzip_calibrate_cuda --quick`,
/// benchmarks/results/h100-2026-11-25/device_calibration.json): alpha + beta x input bytes, fitted
/// from 2^12 to 2^24 fp32 elements. alpha is mostly the call's launches and, for compress, the
/// synchronization that returns the payload size; the top-k sparse_sync route is its own work
/// less the compress (about 9 synchronizations a step). --device-calibration FILE replaces them.
void device_costs(codec_cost& c) {
  if (c.name == "fp16") {
    c.device_compress = {12.79e-6, 1.590e-12};
    c.device_decompress_add = {13.23e-6, 0.721e-12};
  } else if (c.name == "bf16") {
    c.device_compress = {12.39e-6, 1.593e-12};
    c.device_decompress_add = {12.89e-6, 0.704e-12};
  } else if (c.name == "topk1") {
    c.device_compress = {43.79e-6, 3.409e-12};
    c.device_decompress_add = {19.08e-6, 0.042e-12};
    c.device_sparse_sync = {467.5e-6, 42.29e-12};
  } else if (c.name == "qsgd4") {
    c.device_compress = {14.54e-6, 1.978e-12};
    c.device_decompress_add = {14.27e-6, 0.836e-12};
  } else if (c.name == "scaled_sign") {
    c.device_compress = {13.51e-6, 0.412e-12};
    c.device_decompress_add = {13.31e-6, 0.722e-12};
  }
}

/// Payload shape where no calibration gives it.
codec_cost default_codec(const std::string& name) {
  codec_cost c;
  c.name = name;
  if (name == "fp16" || name == "bf16") {
    c.ratio = 0.5, c.fixed = 112, c.summable = true;
  } else if (name == "topk1") {
    c.ratio = 0.02, c.fixed = 112, c.density = 0.01;
  } else if (name == "qsgd4") {
    c.ratio = 0.1328, c.fixed = 112;
  } else if (name == "scaled_sign") {
    c.ratio = 0.0332, c.fixed = 112;
  } else {
    throw std::invalid_argument("gradzip_plan: no codec '" + name + "'");
  }
  c.host_compress = c.host_decompress_add = linear_cost::unknown();
  return c;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::invalid_argument("gradzip_plan: cannot read " + path);
  std::stringstream text;
  text << f.rdbuf();
  return text.str();
}

cost_model make_model(const settings& s, double gbps) {
  cost_model m;
  if (!s.calibration.empty()) {
    m = cost_model_from_json(json::parse(read_text(s.calibration)));
  } else {
    m.codecs.push_back(codec_cost::uncompressed());
    for (const char* name : {"fp16", "topk1", "qsgd4", "scaled_sign"}) m.codecs.push_back(default_codec(name));
  }
  for (codec_cost& c : m.codecs) {
    if (s.cpu_only) {  // the CPU that computes is the "device"; nothing is offloaded
      c.device_compress = c.host_compress;
      c.device_decompress_add = c.host_decompress_add;
      c.device_sparse_sync = c.host_sparse_sync;
      c.host_compress = c.host_decompress_add = linear_cost::unknown();
    } else {
      device_costs(c);
    }
  }
  if (!s.device_calibration.empty()) {  // measured device costs replace the modeled ones
    const cost_model device = cost_model_from_json(json::parse(read_text(s.device_calibration)));
    for (const codec_cost& d : device.codecs) {
      for (codec_cost& c : m.codecs) {
        if (c.name == d.name && !c.identity) {
          c.device_compress = d.device_compress;
          c.device_decompress_add = d.device_decompress_add;
        }
      }
    }
  }
  m.ranks = s.ranks;
  m.serial = s.cpu_only;
  // Ethernet / InfiniBand: 5 us a round, 1 us a message; NVLink-class: 2 us and 0.5 us.
  m.network = gbps >= 1000 ? gradzip::comm::link_model{2e-6, gbps / 8 * 1e9, 0.5e-6}
                           : gradzip::comm::link_model{5e-6, gbps / 8 * 1e9, 1e-6};
  if (!s.link.empty()) {
    const json link = json::parse(read_text(s.link)).at("network");
    m.network = {link.number_at("latency_s"), link.number_at("bytes_per_s"), link.number_at("message_s")};
  }
  m.pcie = {10e-6, 1.0 / 25e9};
  return m;
}

std::size_t codec_index(const cost_model& m, const std::string& name) {
  for (std::size_t c = 0; c < m.codecs.size(); ++c) {
    if (m.codecs[c].name == name) return c;
  }
  throw std::invalid_argument("gradzip_plan: the cost model has no codec '" + name + "'");
}

/// Every option the planner may choose: each codec by every route it allows, on the device,
/// and offloaded to the host where the host's costs are known.
std::vector<option> all_options(const cost_model& m) {
  std::vector<option> out;
  for (std::size_t c = 0; c < m.codecs.size(); ++c) {
    for (route r : {route::allreduce, route::allgather, route::sparse_sync}) {
      for (executor_kind e : {executor_kind::device, executor_kind::host}) {
        const option o{c, r, e};
        const codec_cost& k = m.codecs[c];
        if (r == route::allgather && k.summable) continue;  // a summable codec goes by allreduce
        try {
          m.check(o);
        } catch (const gradzip::invalid_argument&) {
          continue;
        }
        out.push_back(o);
      }
    }
  }
  return out;
}

/// Bytes this rank puts on the wire for a plan (payloads; an allreduce counts its payload once).
double payload_bytes(const workload& w, const cost_model& m, const plan& p) {
  const gradzip::fusion::layout l(w.sizes, p.group_starts);
  double bytes = 0;
  for (std::size_t g = 0; g < l.group_count(); ++g) {
    const codec_cost& c = m.codecs[p.options[g].codec];
    const double in = w.element_bytes * static_cast<double>(l.group_size(g));
    bytes += c.identity ? in : c.payload_bytes(in);
  }
  return bytes;
}

std::string describe(const cost_model& m, const plan& p) {
  std::ostringstream out;
  std::vector<std::string> seen;
  for (const option& o : p.options) {
    std::string key = m.codecs[o.codec].name + " " + name(o.path) + (o.where == executor_kind::host ? " (host)" : "");
    bool found = false;
    for (const auto& k : seen) found = found || k == key;
    if (!found) seen.push_back(key);
  }
  for (std::size_t i = 0; i < seen.size(); ++i) out << (i ? ", " : "") << seen[i];
  return out.str();
}

std::vector<double> parse_list(const std::string& text) {
  std::vector<double> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stod(item));
  return out;
}

settings parse(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--cpu-only") {
      s.cpu_only = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument("gradzip_plan: " + a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--model") s.model = v;
    else if (a == "--calibration") s.calibration = v;
    else if (a == "--ranks") s.ranks = std::stoi(v);
    else if (a == "--samples") s.samples = std::stod(v);
    else if (a == "--tflops") s.tflops = std::stod(v);
    else if (a == "--gbps") s.gbps = parse_list(v);
    else if (a == "--codec") s.codec = v;
    else if (a == "--csv") s.csv = v;
    else if (a == "--plan-out") s.plan_out = v;
    else if (a == "--plan-gbps") s.plan_gbps = std::stod(v);
    else if (a == "--cost-out") s.cost_out = v;
    else if (a == "--cost-gbps") s.cost_gbps = std::stod(v);
    else if (a == "--link") s.link = v;
    else if (a == "--device-calibration") s.device_calibration = v;
    else throw std::invalid_argument("gradzip_plan: unknown argument '" + a + "'");
  }
  if (s.ranks < 1 || !(s.samples > 0) || !(s.tflops > 0)) {
    throw std::invalid_argument("gradzip_plan: --ranks, --samples and --tflops must be positive");
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) try {
  const settings s = parse(argc, argv);
  std::vector<gradzip_tools::parameter> params;
  double samples = s.samples;
  if (s.model == "resnet50") {
    params = gradzip_tools::resnet50_parameters();
  } else if (s.model == "bert-base") {
    params = gradzip_tools::bert_base_parameters(128);
    samples = s.samples * 128;  // FLOPs are per token
  } else if (s.model == "mlp") {
    params = gradzip_tools::mlp_parameters();
  } else {
    throw std::invalid_argument("gradzip_plan: --model must be resnet50, bert-base or mlp, got '" + s.model + "'");
  }
  std::vector<double> speeds = s.gbps;
  if (!s.link.empty()) speeds = {8e-9 * json::parse(read_text(s.link)).at("network").number_at("bytes_per_s")};
  workload w;
  w.sizes = gradzip_tools::backprop_order(params);
  w.backward_s = gradzip_tools::backward_seconds(params, samples, s.tflops * 1e12);
  w.forward_s = gradzip_tools::forward_flops(params) * samples / (s.tflops * 1e12);
  double backward = 0;
  for (double t : w.backward_s) backward += t;
  std::printf("%s: %zu tensors, %.1f M parameters; forward %.2f ms, backward %.2f ms (%g samples at %g TFLOP/s); "
              "%d ranks; codec %s; device costs %s\n\n",
              s.model.c_str(), w.sizes.size(), 1e-6 * [&] { double n = 0; for (auto z : w.sizes) n += z; return n; }(),
              1e3 * w.forward_s, 1e3 * backward, s.samples, s.tflops, s.ranks, s.codec.c_str(),
              s.cpu_only ? "the host's" : s.device_calibration.empty() ? "the H100's of 2026-11-25" : "calibrated");
  std::printf("| link | fp32 (DDP buckets) | %s layer-wise | %s + Cupcake | Espresso plan | plan vs best baseline | the plan's choices |\n",
              s.codec.c_str(), s.codec.c_str());
  std::printf("|---|---|---|---|---|---|---|\n");
  std::ofstream csv;
  if (!s.csv.empty()) {
    csv.open(s.csv);
    csv << "model,gbps,strategy,iteration_ms,groups,payload_MB\n";
  }
  for (double gbps : speeds) {
    const cost_model m = make_model(s, gbps);
    const option codec{codec_index(m, s.codec), m.codecs[codec_index(m, s.codec)].summable ? route::allreduce : route::allgather};
    const option fp32{codec_index(m, "fp32"), route::allreduce};
    struct row {
      const char* name;
      plan p;
      double seconds;
    };
    std::vector<row> rows;
    const auto add = [&](const char* label, plan p) {
      const double t = simulate(w, m, p).iteration_s;
      rows.push_back({label, std::move(p), t});
    };
    const gradzip::fusion::layout ddp = gradzip::fusion::layout::by_elements(w.sizes, 25u * 1024 * 1024 / 4);
    add("fp32", plan{ddp.group_starts(), std::vector<option>(ddp.group_count(), fp32)});
    const gradzip::fusion::layout each = gradzip::fusion::layout::per_tensor(w.sizes);
    add("layerwise", plan{each.group_starts(), std::vector<option>(each.group_count(), codec)});
    add("cupcake", cupcake_schedule(w, m, codec).chosen);
    const planned best = espresso_plan(w, m, all_options(m));
    add("plan", best.chosen);
    const double baseline = std::min({rows[0].seconds, rows[1].seconds, rows[2].seconds});
    std::printf("| %g Gb/s | %.2f ms | %.2f ms | %.2f ms (%zu groups) | %.2f ms (%zu groups) | %.2fx | %s |\n", gbps,
                1e3 * rows[0].seconds, 1e3 * rows[1].seconds, 1e3 * rows[2].seconds, rows[2].p.group_starts.size(),
                1e3 * rows[3].seconds, rows[3].p.group_starts.size(), baseline / rows[3].seconds,
                describe(m, best.chosen).c_str());
    for (const row& r : rows) {
      if (csv.is_open()) {
        csv << s.model << ',' << gbps << ',' << r.name << ',' << 1e3 * r.seconds << ',' << r.p.group_starts.size() << ','
            << payload_bytes(w, m, r.p) / 1e6 << '\n';
      }
    }
    const bool chosen = !s.link.empty() || gbps == s.plan_gbps;
    if (!s.plan_out.empty() && chosen) std::ofstream(s.plan_out) << to_json(best.chosen, m).dump() << '\n';
    if (!s.cost_out.empty() && (!s.link.empty() || gbps == s.cost_gbps)) std::ofstream(s.cost_out) << to_json(m).dump() << '\n';
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
