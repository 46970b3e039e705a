// gradzip_powersgd_compare: PowerSGD's math on one matrix read from a file, for the side-by-side
// with PyTorch's powerSGD_hook math in benchmarks/powersgd_vs_torch.py (which writes the file,
// runs the same steps in torch, and prints the table of docs/lowrank.md).
//
//   gradzip_powersgd_compare FILE ROWS COLS RANK [THREADS] [REPEATS] [WARM_STEPS]
//
// FILE holds ROWS x COLS float32, row-major. Prints one JSON object:
// - error_one_step: |P Q^T - M| / |M| after one step from a random Q (no warm start, no error feedback);
// - error_warm: the same after WARM_STEPS steps with warm start on the same M;
// - median_ms: the median time of a training step (error feedback and warm start on), one rank.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gradzip/lowrank/powersgd.hpp"

namespace gz = gradzip;
using gz::lowrank::factor;

namespace {

struct runner {
  gz::host& exec;
  gz::lowrank::powersgd<float, gz::host> ps;
  std::vector<std::byte> p, q;
  runner(gz::host& e, std::size_t rows, std::size_t cols, const gz::lowrank::powersgd_params& params)
      : exec(e), ps(e, {{rows, cols}}, params), p(ps.payload_bytes(factor::p)), q(ps.payload_bytes(factor::q)) {}
  void step(const std::vector<float>& m, std::vector<float>& out, std::uint32_t s) {
    ps.compress_p(exec, gz::span<const float>(m), gz::span<std::byte>(p), {s, 0});
    ps.compress_q(exec, gz::span<const std::byte>(p), gz::span<std::byte>(q));
    ps.decompress(exec, gz::span<const std::byte>(q), 1, gz::span<float>(out));
  }
};

double relative_error(const std::vector<float>& a, const std::vector<float>& m) {
  double e = 0.0, s = 0.0;
  for (std::size_t i = 0; i < m.size(); ++i) {
    e += (static_cast<double>(a[i]) - m[i]) * (static_cast<double>(a[i]) - m[i]);
    s += static_cast<double>(m[i]) * m[i];
  }
  return std::sqrt(e / s);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s FILE ROWS COLS RANK [THREADS] [REPEATS] [WARM_STEPS]\n", argv[0]);
    return 2;
  }
  const std::size_t rows = std::stoul(argv[2]), cols = std::stoul(argv[3]);
  const int rank = std::stoi(argv[4]);
  const int threads = argc > 5 ? std::stoi(argv[5]) : 1;
  const int repeats = argc > 6 ? std::stoi(argv[6]) : 20;
  const int warm_steps = argc > 7 ? std::stoi(argv[7]) : 10;
  std::vector<float> m(rows * cols), out(rows * cols);
  std::ifstream in(argv[1], std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(m.data()), static_cast<std::streamsize>(m.size() * sizeof(float)))) {
    std::fprintf(stderr, "%s: cannot read %zu floats\n", argv[1], m.size());
    return 1;
  }
  gz::host exec(threads);
  gz::lowrank::powersgd_params params;
  params.rank = rank;
  params.min_compression_rate = 0.0f;  // the comparison wants every matrix compressed

  params.warm_start = false;
  params.error_feedback = false;
  runner cold(exec, rows, cols, params);
  cold.step(m, out, 0);
  const double one_step = relative_error(out, m);

  params.warm_start = true;
  runner warm(exec, rows, cols, params);
  for (int s = 0; s < warm_steps; ++s) warm.step(m, out, static_cast<std::uint32_t>(s));
  const double warmed = relative_error(out, m);

  params.error_feedback = true;
  runner timed(exec, rows, cols, params);
  std::vector<double> ms;
  for (int s = 0; s < repeats + 2; ++s) {
    const auto start = std::chrono::steady_clock::now();
    timed.step(m, out, static_cast<std::uint32_t>(s));
    const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (s >= 2) ms.push_back(t);  // two warm-up steps
  }
  std::sort(ms.begin(), ms.end());
  std::printf("{\"rows\": %zu, \"cols\": %zu, \"rank\": %d, \"threads\": %d, \"error_one_step\": %.6f, "
              "\"error_warm\": %.6f, \"median_ms\": %.4f}\n",
              rows, cols, rank, threads, one_step, warmed, ms[ms.size() / 2]);
  return 0;
}
