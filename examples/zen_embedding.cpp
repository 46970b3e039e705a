// zen_embedding: naturally sparse gradients from real data, synchronized three ways under MPI.
//
// The model is a hashed-feature embedding bag on Fashion-MNIST. Each image becomes its set of
// features: (pixel, intensity bin) for every lit pixel, and (pixel, bin, right neighbour's bin)
// for every lit horizontal pair. Each feature hashes to one of R = 2^19 rows of a table E (R x 16
// floats, n = 8.4 M). The model sums the rows of its features, h = sum E[f] / sqrt(|F|) (16 values),
// then logits = V h + b. A step's gradient of E touches only the rows its batch activates.
//
// E's gradient goes through one of:
//   dense     MPI_Allreduce of all n floats (the ring moves 2 (P - 1) / P x 4n bytes per rank)
//   allgather comm::sparse_sync, sparse_scheme::allgather: every rank's nonzeros to every rank
//   zen       comm::sparse_sync, Zen's Balanced Parallelism
//   hierarchy comm::sparse_sync, Zen's Hierarchical Centralization (recursive doubling)
// V and b (170 floats) are allreduced densely in every case.
//
//   mpirun -np 4 build/examples/gradzip_zen_embedding [--steps 20] [--epochs 0]
//       [--schemes dense,allgather,zen,hierarchy] [--data /usr/share/datasets/fashion-mnist]
//       [--csv out.csv] [--model-csv model.csv]
//
// Prints per scheme: density and overlap of the ranks' index sets, bytes sent and received per
// rank per step (averaged over ranks and steps; exact for the sparse schemes, the ring's figure
// for dense), the median time per step of E's synchronization, and, with --epochs, the test
// accuracy after training. Every rank starts from the same seeded table; runs are reproducible.
// When `hierarchy` runs, its steps profile the unions of 1, 2, 4, ... ranks' nonzeros; the cost
// model (comm/sparse_cost.hpp) then gives each scheme's bytes at this rank count, beside the
// measured ones, and extrapolates them to 1,024 ranks (--model-csv writes those).
#include <mpi.h>

#include <gradzip/comm/mpi.hpp>
#include <gradzip/comm/sparse_cost.hpp>
#include <gradzip/comm/sparse_sync.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "fashion_mnist.hpp"

namespace {

namespace gz = gradzip;

constexpr std::uint64_t rows = 1 << 19;
constexpr int dim = 16, classes = 10;
constexpr std::uint64_t n = rows * dim;

/// The rows of image x's features, sorted, with repeats (a feature's weight is its count).
void features(const float* x, std::vector<std::uint64_t>& f) {
  f.clear();
  auto bin = [&](int p) { return std::min(3, static_cast<int>(x[p] * 4.0f)); };
  for (int p = 0; p < 784; ++p) {
    if (x[p] <= 0.0f) continue;
    f.push_back(gz::hash64(11, static_cast<std::uint64_t>(p * 4 + bin(p))) % rows);
    if (p % 28 != 27 && x[p + 1] > 0.0f) {
      f.push_back(gz::hash64(12, static_cast<std::uint64_t>((p * 4 + bin(p)) * 4 + bin(p + 1))) % rows);
    }
  }
  std::sort(f.begin(), f.end());
}

struct model {
  std::vector<float> table, v, b;  // E (rows x dim), V (classes x dim), b
  model() : table(n), v(classes * dim), b(classes, 0.0f) {
    std::mt19937 rng(2025);
    std::normal_distribution<float> e(0.0f, 0.1f), w(0.0f, 0.25f);
    for (float& t : table) t = e(rng);
    for (float& t : v) t = w(rng);
  }
  void forward(const std::vector<std::uint64_t>& f, float* h, float* z) const {
    std::fill(h, h + dim, 0.0f);
    for (std::uint64_t r : f) {
      for (int k = 0; k < dim; ++k) h[k] += table[r * dim + k];
    }
    const float scale = f.empty() ? 0.0f : 1.0f / std::sqrt(static_cast<float>(f.size()));
    for (int k = 0; k < dim; ++k) h[k] *= scale;
    for (int c = 0; c < classes; ++c) {
      float s = b[c];
      for (int k = 0; k < dim; ++k) s += v[c * dim + k] * h[k];
      z[c] = s;
    }
  }
};

/// One batch's gradient: E's as sorted (index, value) pairs, V's and b's densely (170 floats).
void gradient(const model& m, const fashion_mnist::dataset& d, const std::size_t* batch, int size,
              std::vector<std::uint64_t>& idx, std::vector<float>& val, std::vector<float>& small) {
  std::vector<std::uint64_t> f;
  small.assign(classes * dim + classes, 0.0f);
  std::vector<std::pair<std::uint64_t, std::array<float, dim>>> contributions;
  for (int s = 0; s < size; ++s) {
    const float* x = d.images.data() + batch[s] * 784;
    features(x, f);
    float h[dim], z[classes];
    m.forward(f, h, z);
    const float top = *std::max_element(z, z + classes);
    float sum = 0.0f;
    for (int c = 0; c < classes; ++c) sum += (z[c] = std::exp(z[c] - top));
    float dh[dim] = {};
    for (int c = 0; c < classes; ++c) {
      const float dz = (z[c] / sum - (c == d.labels[batch[s]] ? 1.0f : 0.0f)) / static_cast<float>(size);
      for (int k = 0; k < dim; ++k) {
        small[c * dim + k] += dz * h[k];
        dh[k] += dz * m.v[c * dim + k];
      }
      small[classes * dim + c] += dz;
    }
    const float scale = f.empty() ? 0.0f : 1.0f / std::sqrt(static_cast<float>(f.size()));
    for (std::uint64_t r : f) {
      std::array<float, dim> g;
      for (int k = 0; k < dim; ++k) g[k] = dh[k] * scale;
      contributions.emplace_back(r, g);
    }
  }
  std::stable_sort(contributions.begin(), contributions.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  idx.clear();
  val.clear();
  for (std::size_t j = 0; j < contributions.size();) {
    const std::uint64_t r = contributions[j].first;
    std::array<float, dim> g{};
    for (; j < contributions.size() && contributions[j].first == r; ++j) {
      for (int k = 0; k < dim; ++k) g[k] += contributions[j].second[k];
    }
    for (int k = 0; k < dim; ++k) {
      idx.push_back(r * dim + static_cast<std::uint64_t>(k));
      val.push_back(g[k]);
    }
  }
}

double accuracy(const model& m, const fashion_mnist::dataset& d) {
  std::size_t right = 0;
  std::vector<std::uint64_t> f;
  for (std::size_t i = 0; i < d.count; ++i) {
    features(d.images.data() + i * 784, f);
    float h[dim], z[classes];
    m.forward(f, h, z);
    right += static_cast<std::size_t>(std::max_element(z, z + classes) - z) == d.labels[i];
  }
  return 100.0 * static_cast<double>(right) / static_cast<double>(d.count);
}

struct options {
  int steps = 20, epochs = 0, batch = 32;
  float lr = 2.0f;
  std::string data = "/usr/share/datasets/fashion-mnist", csv, model_csv, schemes = "dense,allgather,zen,hierarchy";
};

struct result {
  std::string scheme;
  double density = 0, overlap = 0, sent = 0, received = 0, median_ms = 0, accuracy = -1;
};

/// The hierarchy steps' profiles, averaged (rank 0's).
gz::comm::sparsity_profile profile_sum;
int profiles = 0;

gz::comm::sparse_scheme scheme_of(const std::string& s) {
  if (s == "zen") return gz::comm::sparse_scheme::balanced_parallelism;
  if (s == "hierarchy") return gz::comm::sparse_scheme::hierarchical_centralization;
  return gz::comm::sparse_scheme::allgather;
}

result run(const std::string& scheme, gz::comm::mpi_communicator& comm, const fashion_mnist::dataset& train_set,
           const fashion_mnist::dataset& test_set, const options& o) {
  const int ranks = comm.size(), me = comm.rank();
  gz::host exec(1);
  gz::comm::sparse_sync zen(n, ranks, 3);
  model m;
  const std::size_t shard = train_set.count / static_cast<std::size_t>(ranks);
  std::vector<std::size_t> order(shard);
  std::iota(order.begin(), order.end(), shard * static_cast<std::size_t>(me));
  const std::size_t per_epoch = shard / static_cast<std::size_t>(o.batch);
  const std::size_t total = o.epochs > 0 ? per_epoch * static_cast<std::size_t>(o.epochs) : static_cast<std::size_t>(o.steps);
  std::vector<std::uint64_t> idx;
  std::vector<float> val, small, dense;
  std::vector<double> times;
  double sent = 0, received = 0, density = 0, overlap = 0;
  std::mt19937 rng(1000u + static_cast<unsigned>(me));
  for (std::size_t step = 0; step < total; ++step) {
    if (step % per_epoch == 0) std::shuffle(order.begin(), order.end(), rng);
    gradient(m, train_set, order.data() + (step % per_epoch) * static_cast<std::size_t>(o.batch), o.batch, idx, val, small);
    // Density and overlap: sum of the ranks' nonzeros over the size of their union.
    std::uint64_t mine = idx.size(), all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_UINT64_T, MPI_SUM, comm.native());
    const float alpha = -o.lr / static_cast<float>(ranks);
    MPI_Barrier(comm.native());
    const double start = MPI_Wtime();
    if (scheme == "dense") {
      dense.assign(n, 0.0f);
      for (std::size_t j = 0; j < idx.size(); ++j) dense[idx[j]] = val[j];
      MPI_Allreduce(MPI_IN_PLACE, dense.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm.native());
      for (std::uint64_t i = 0; i < n; ++i) {
        if (dense[i] != 0.0f) m.table[i] = std::fma(alpha, dense[i], m.table[i]);
      }
      sent += 2.0 * (ranks - 1) / ranks * 4.0 * n;
      received += 2.0 * (ranks - 1) / ranks * 4.0 * n;
    } else {
      zen.run(comm, exec, gz::span<const std::uint64_t>(idx), gz::span<const float>(val), gz::span<float>(m.table), alpha,
              scheme_of(scheme));
      sent += static_cast<double>(zen.last_traffic().sent());
      received += static_cast<double>(zen.last_traffic().received());
      if (scheme == "hierarchy" && me == 0) {
        const gz::comm::sparsity_profile p = zen.profile();
        if (profiles++ == 0) {
          profile_sum = p;
        } else {
          profile_sum.nnz += p.nnz;
          for (std::size_t k = 0; k < p.unions.size(); ++k) profile_sum.unions[k] += p.unions[k];
        }
      }
    }
    double seconds = MPI_Wtime() - start;
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, comm.native());
    times.push_back(seconds);
    if (scheme == "dense") {  // the union, from the dense sum's nonzeros
      std::uint64_t united = 0;
      for (float x : dense) united += x != 0.0f;
      overlap += static_cast<double>(all) / static_cast<double>(std::max<std::uint64_t>(united, 1));
    }
    density += static_cast<double>(all) / ranks / static_cast<double>(n);
    MPI_Allreduce(MPI_IN_PLACE, small.data(), static_cast<int>(small.size()), MPI_FLOAT, MPI_SUM, comm.native());
    for (int i = 0; i < classes * dim; ++i) m.v[i] -= o.lr / ranks * small[i];
    for (int c = 0; c < classes; ++c) m.b[c] -= o.lr / ranks * small[classes * dim + c];
  }
  double totals[2] = {sent, received};
  MPI_Allreduce(MPI_IN_PLACE, totals, 2, MPI_DOUBLE, MPI_SUM, comm.native());
  std::sort(times.begin(), times.end());
  result r;
  r.scheme = scheme;
  r.density = density / static_cast<double>(total);
  r.overlap = overlap / static_cast<double>(total);
  r.sent = totals[0] / ranks / static_cast<double>(total);
  r.received = totals[1] / ranks / static_cast<double>(total);
  r.median_ms = 1e3 * times[times.size() / 2];
  if (o.epochs > 0) r.accuracy = accuracy(m, test_set);
  return r;
}

/// The cost model from the averaged profile: bytes at this rank count beside the measured ones,
/// then extrapolated (100 Gb/s links, 5 us a round of messages, 0.5 us a message).
void report_model(int ranks, const std::vector<result>& results, const options& o) {
  gz::comm::sparsity_profile p = profile_sum;
  p.nnz /= profiles;
  for (double& u : p.unions) u /= profiles;
  const gz::comm::link_model link{5e-6, 12.5e9, 5e-7};
  const char* keys[4] = {"dense", "allgather", "zen", "hierarchy"};
  const gz::comm::scheme_costs here = gz::comm::estimate(p, link);
  std::printf("\nCost model (comm/sparse_cost.hpp) from the hierarchy's profile (rank 0, nnz %.0f, unions", p.nnz);
  for (double u : p.unions) std::printf(" %.0f", u);
  std::printf("):\n\n| scheme | received per rank: model | measured (mean of ranks) | model / measured |\n|---|---|---|---|\n");
  for (int s = 0; s < 4; ++s) {
    for (const auto& r : results) {
      if (r.scheme == keys[s]) {
        std::printf("| %s | %.0f B | %.0f B | %.3f |\n", keys[s], here.bytes[s], r.received, here.bytes[s] / r.received);
      }
    }
  }
  std::printf("\nExtrapolated (same nnz per rank; unions from u_k = U (1 - (1 - nnz / U)^k) fitted at %d ranks), "
              "100 Gb/s, 5 us a round, 0.5 us a message:\n\n| ranks | dense | allgather | zen | hierarchy | best |\n|---|---|---|---|---|---|\n",
              ranks);
  FILE* f = o.model_csv.empty() ? nullptr : std::fopen(o.model_csv.c_str(), "w");
  if (f) std::fprintf(f, "ranks,scheme,received_bytes,seconds\n");
  for (int P = 2; P <= 1024; P *= 2) {
    const gz::comm::scheme_costs c = gz::comm::estimate(gz::comm::extrapolate(p, P), link);
    if (P >= 4) {
      std::printf("| %d | %.3g B | %.3g B | %.3g B | %.3g B | %s |\n", P, c.bytes[0], c.bytes[1], c.bytes[2], c.bytes[3],
                  gz::comm::name(c.best));
    }
    for (int s = 0; f && s < 4; ++s) std::fprintf(f, "%d,%s,%.0f,%.6g\n", P, keys[s], c.bytes[s], c.seconds[s]);
  }
  if (f) std::fclose(f);
}

options parse(int argc, char** argv) {
  options o;
  fashion_mnist::parse_options(argc, argv, [&](const std::string& a, const auto& value) {
    if (a == "--steps") o.steps = std::stoi(value());
    else if (a == "--epochs") o.epochs = std::stoi(value());
    else if (a == "--batch") o.batch = std::stoi(value());
    else if (a == "--lr") o.lr = std::stof(value());
    else if (a == "--data") o.data = value();
    else if (a == "--csv") o.csv = value();
    else if (a == "--model-csv") o.model_csv = value();
    else if (a == "--schemes") o.schemes = value();
    else return false;
    return true;
  });
  if (o.steps < 1 || o.epochs < 0 || o.batch < 1 || !(o.lr > 0.0f)) {
    throw std::runtime_error("--steps and --batch must be positive, --epochs >= 0, --lr > 0");
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  try {
    const options o = parse(argc, argv);
    gz::comm::mpi_communicator comm{MPI_COMM_WORLD};
    const auto train_set = fashion_mnist::load(o.data, "train", 60000);
    const auto test_set = fashion_mnist::load(o.data, "t10k", 10000);
    std::vector<result> results;
    std::stringstream list(o.schemes);
    for (std::string s; std::getline(list, s, ',');) {
      if (s != "dense" && s != "allgather" && s != "zen" && s != "hierarchy") throw std::runtime_error("unknown scheme " + s);
      results.push_back(run(s, comm, train_set, test_set, o));
    }
    if (comm.rank() == 0) {
      std::printf("%d ranks, embedding table %llu x %d (n = %llu), batch %d per rank, %s\n\n", comm.size(),
                  static_cast<unsigned long long>(rows), dim, static_cast<unsigned long long>(n), o.batch,
                  o.epochs > 0 ? (std::to_string(o.epochs) + " epochs").c_str() : (std::to_string(o.steps) + " steps").c_str());
      std::printf("| scheme | density per rank | overlap (sum nnz / union) | sent per rank per step | received per rank per step | sync time per step (median) | test accuracy |\n");
      std::printf("|---|---|---|---|---|---|---|\n");
      for (const auto& r : results) {
        std::printf("| %s | %.4f %% | %s | %.0f B | %.0f B | %.2f ms | %s |\n", r.scheme.c_str(), 100.0 * r.density,
                    r.overlap > 0 ? std::to_string(r.overlap).substr(0, 4).c_str() : "", r.sent, r.received, r.median_ms,
                    r.accuracy >= 0 ? (std::to_string(r.accuracy).substr(0, 5) + " %").c_str() : "");
      }
      if (!o.csv.empty()) {
        FILE* f = std::fopen(o.csv.c_str(), "w");
        std::fprintf(f, "ranks,scheme,density,overlap,sent,received,median_ms,accuracy\n");
        for (const auto& r : results) {
          std::fprintf(f, "%d,%s,%.6f,%.4f,%.0f,%.0f,%.3f,%.2f\n", comm.size(), r.scheme.c_str(), r.density, r.overlap,
                       r.sent, r.received, r.median_ms, r.accuracy);
        }
        std::fclose(f);
      }
      if (profiles > 0) report_model(comm.size(), results, o);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zen_embedding: %s\n", e.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
