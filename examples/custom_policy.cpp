// custom_policy: two stages written outside the library, used through gradzip::codec like the
// built-in ones (docs/extending.md):
//   example::gaussian_k  a structure stage: |x| >= mean + z * deviation of |x|  (gaussian_k.hpp)
//   example::log_scale4  a values stage: sign and 3-bit log2 level per value     (log_scale4.hpp)
// It compresses a synthetic gradient with each alone and with both, checks what each promises,
// runs error feedback around the pair, and exits non-zero if any check fails (CI runs it).
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <gradzip/gradzip.hpp>

#include "gaussian_k.hpp"
#include "log_scale4.hpp"

namespace {

namespace gz = gradzip;

int failures = 0;

void check(bool ok, const char* what) {
  std::printf("  [%s] %s\n", ok ? "ok" : "FAILED", what);
  failures += ok ? 0 : 1;
}

std::vector<float> gradient(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<float> g(n);
  for (auto& v : g) v = normal(rng);
  return g;
}

template <class Codec>
std::vector<std::byte> compress(const Codec& c, gz::host& exec, const std::vector<float>& g) {
  std::vector<std::byte> out(c.template max_compressed_bytes<float>(g.size()));
  out.resize(c.compress(exec, gz::span<const float>(g), gz::span<std::byte>(out)));
  return out;
}

/// log_scale4's promise: a value of magnitude >= 2^-6 s comes back within a third of itself,
/// a smaller one within 2^-7 s, where s is its bucket's max |v|.
bool within_log_scale_bound(const std::vector<float>& sent, const std::vector<float>& got) {
  const std::size_t bucket = example::log_scale4::bucket;
  for (std::size_t b = 0; b < sent.size(); b += bucket) {
    float s = 0.0f;
    for (std::size_t i = b; i < std::min(sent.size(), b + bucket); ++i) s = std::fmax(s, std::fabs(sent[i]));
    for (std::size_t i = b; i < std::min(sent.size(), b + bucket); ++i) {
      const float error = std::fabs(got[i] - sent[i]);
      const float bound = std::fabs(sent[i]) >= std::ldexp(s, -6) ? std::fabs(sent[i]) / 3.0f : std::ldexp(s, -7);
      if (!(error <= bound)) return false;
    }
  }
  return true;
}

}  // namespace

int main() {
  gz::host exec;
  const std::size_t n = 1 << 16;
  const auto g = gradient(n, 7);

  std::printf("values stage log_scale4 on every element (n = %zu):\n", n);
  const gz::codec<gz::sparsify::none, example::log_scale4, gz::encode::none> dense;
  const auto dense_payload = compress(dense, exec, g);
  std::vector<float> decoded(n);
  dense.decompress(exec, gz::span<const std::byte>(dense_payload), gz::span<float>(decoded));
  std::printf("  %zu bytes (%.2f bits per value)\n", dense_payload.size(), 8.0 * dense_payload.size() / n);
  check(within_log_scale_bound(g, decoded), "every value within log_scale4's bound");

  std::printf("structure stage gaussian_k (z = 2):\n");
  const example::gaussian_k gk{2.0f};
  const gz::codec<example::gaussian_k, gz::quantize::none, gz::encode::automatic> sparse{gk};
  const auto sparse_payload = compress(sparse, exec, g);
  std::vector<float> kept(n, 0.0f);
  sparse.decompress(exec, gz::span<const std::byte>(sparse_payload), gz::span<float>(kept));
  const float tau = gk.tau(gz::span<const float>(g));
  std::size_t count = 0;
  bool exact = true;
  for (std::size_t i = 0; i < n; ++i) {
    const bool pass = std::fabs(g[i]) >= tau;
    count += pass ? 1 : 0;
    exact = exact && kept[i] == (pass ? g[i] : 0.0f);
  }
  std::printf("  tau = %.3g, kept %zu of %zu (%.2f %%), %zu bytes\n", static_cast<double>(tau), count, n,
              100.0 * count / n, sparse_payload.size());
  check(exact, "kept exactly the elements with |x| >= tau, values unchanged");
  check(count > n / 100 && count < n / 10, "kept between 1 % and 10 % (about 5 % for Gaussian data)");

  std::printf("both, with error feedback, 20 steps of one gradient:\n");
  using pair_codec = gz::codec<example::gaussian_k, example::log_scale4, gz::encode::automatic>;
  gz::feedback::error_feedback<pair_codec, float, gz::host> ef(exec, pair_codec{gk}, n);
  std::vector<std::byte> out(ef.max_compressed_bytes<float>());
  std::vector<double> sent(n, 0.0);
  std::size_t bytes = 0;
  for (std::uint32_t step = 0; step < 20; ++step) {
    const std::size_t size = ef.compress(exec, gz::span<const float>(g), gz::span<std::byte>(out), {step, 0});
    std::vector<float> d(n, 0.0f);
    pair_codec{gk}.decompress(exec, gz::span<const std::byte>(out.data(), size), gz::span<float>(d));
    for (std::size_t i = 0; i < n; ++i) sent[i] += d[i];
    bytes += size;
  }
  double worst = 0.0;
  const auto e = ef.residual();
  for (std::size_t i = 0; i < n; ++i) {
    worst = std::fmax(worst, std::fabs(sent[i] + e[i] - 20.0 * g[i]) / (20.0 * 1e-3));
  }
  std::printf("  %.1f bytes per step (%.3f of fp32); sent + residual = 20 g to %.1e (in units of 20 sigma)\n",
              static_cast<double>(bytes) / 20, static_cast<double>(bytes) / 20 / (4.0 * n), worst);
  check(worst < 1e-4, "nothing lost: what was sent plus the residual is every gradient added");

  std::printf(failures == 0 ? "custom policy: all checks passed\n" : "custom policy: %d checks FAILED\n", failures);
  return failures == 0 ? 0 : 1;
}
