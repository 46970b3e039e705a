// mpi_train: data-parallel training of a 784-128-10 MLP on Fashion-MNIST under MPI, with every
// gradient averaged through gradzip::comm::allreducer (or comm::powersgd_allreducer) and one
// codec per run. Prints, per codec, the final test accuracy, the bytes each rank sends per step
// relative to an fp32 allreduce, and the wall time.
//
//   mpirun -np 4 build/examples/gradzip_mpi_train [--epochs 3] [--train 60000] [--codecs a,b,...]
//                                                 [--data /usr/share/datasets/fashion-mnist]
//                                                 [--csv results.csv] [--check]
//
// Each rank owns a contiguous shard of the (first --train) training images, and draws its
// batches from it in an order seeded by (epoch, rank): runs are reproducible. Every rank starts
// from the same seeded initialization and applies the same averaged gradient, so the ranks'
// parameters stay identical. --check (for CI) exits non-zero unless top-k 1 % with error
// feedback, QSGD 4-bit and PowerSGD rank 4 end within 2 points of the fp32 run, and sign
// without error feedback is reported as hurting.
#include <mpi.h>
#include <zlib.h>

#include <gradzip/comm/mpi.hpp>
#include <gradzip/gradzip.hpp>

#include "fashion_mnist.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace gz = gradzip;
using fashion_mnist::dataset;
using fashion_mnist::load;

// ---------------------------------------------------------------------------------------------
// The model: 784 -> 128 (ReLU) -> 10 (softmax cross-entropy), parameters in one flat vector.

constexpr int in = 784, hidden = 128, out = 10;
constexpr std::size_t w1 = 0, b1 = w1 + hidden * in, w2 = b1 + hidden, b2 = w2 + out * hidden, parameters = b2 + out;

std::vector<float> initial_parameters() {
  std::vector<float> p(parameters, 0.0f);
  std::mt19937 rng(2024);
  std::normal_distribution<float> first(0.0f, std::sqrt(2.0f / in)), second(0.0f, std::sqrt(2.0f / hidden));
  for (std::size_t i = w1; i < b1; ++i) p[i] = first(rng);
  for (std::size_t i = w2; i < b2; ++i) p[i] = second(rng);
  return p;
}

/// Forward pass of one image: hidden activations and logits.
void forward(const std::vector<float>& p, const float* x, float* h, float* z) {
  for (int j = 0; j < hidden; ++j) {
    const float* row = p.data() + w1 + static_cast<std::size_t>(j) * in;
    float s = p[b1 + j];
    for (int i = 0; i < in; ++i) s += row[i] * x[i];
    h[j] = s > 0.0f ? s : 0.0f;
  }
  for (int c = 0; c < out; ++c) {
    const float* row = p.data() + w2 + static_cast<std::size_t>(c) * hidden;
    float s = p[b2 + c];
    for (int j = 0; j < hidden; ++j) s += row[j] * h[j];
    z[c] = s;
  }
}

/// grad <- the mean cross-entropy gradient over the batch.
void gradient(const std::vector<float>& p, const dataset& d, const std::size_t* batch, int size, std::vector<float>& grad) {
  std::fill(grad.begin(), grad.end(), 0.0f);
  float h[hidden], z[out], dz[out], dh[hidden];
  for (int b = 0; b < size; ++b) {
    const float* x = d.images.data() + batch[b] * in;
    forward(p, x, h, z);
    const float top = *std::max_element(z, z + out);
    float total = 0.0f;
    for (int c = 0; c < out; ++c) total += (dz[c] = std::exp(z[c] - top));
    for (int c = 0; c < out; ++c) dz[c] = (dz[c] / total - (c == d.labels[batch[b]] ? 1.0f : 0.0f)) / size;
    std::fill(dh, dh + hidden, 0.0f);
    for (int c = 0; c < out; ++c) {
      float* g = grad.data() + w2 + static_cast<std::size_t>(c) * hidden;
      const float* row = p.data() + w2 + static_cast<std::size_t>(c) * hidden;
      for (int j = 0; j < hidden; ++j) {
        g[j] += dz[c] * h[j];
        dh[j] += dz[c] * row[j];
      }
      grad[b2 + c] += dz[c];
    }
    for (int j = 0; j < hidden; ++j) {
      if (h[j] <= 0.0f) continue;
      float* g = grad.data() + w1 + static_cast<std::size_t>(j) * in;
      for (int i = 0; i < in; ++i) g[i] += dh[j] * x[i];
      grad[b1 + j] += dh[j];
    }
  }
}

double accuracy(const std::vector<float>& p, const dataset& d) {
  float h[hidden], z[out];
  std::size_t right = 0;
  for (std::size_t s = 0; s < d.count; ++s) {
    forward(p, d.images.data() + s * in, h, z);
    right += static_cast<std::size_t>(std::max_element(z, z + out) - z) == d.labels[s] ? 1 : 0;
  }
  return 100.0 * static_cast<double>(right) / static_cast<double>(d.count);
}

// ---------------------------------------------------------------------------------------------
// The codecs compared: each an allreducer behind one small interface.

struct reducer {
  virtual ~reducer() = default;
  /// Averages grad over the ranks; returns the bytes this rank sent.
  virtual std::size_t reduce(gz::comm::communicator& comm, gz::host& exec, std::vector<float>& grad, std::uint32_t step) = 0;
  /// A line about the run, for the report (collective; empty for most).
  virtual std::string note(gz::comm::mpi_communicator&) { return {}; }
};

template <class Codec>
struct codec_reducer final : reducer {
  gz::comm::allreducer<Codec, float, gz::host> all;
  codec_reducer(gz::host& exec, Codec c, int ranks, gz::comm::feedback_mode feedback)
      : all(exec, c, parameters, ranks, feedback) {}
  std::size_t reduce(gz::comm::communicator& comm, gz::host& exec, std::vector<float>& grad, std::uint32_t step) override {
    all.run(comm, exec, gz::span<float>(grad), {step, 0});
    return all.last_sent_bytes();
  }
};

template <class Codec>
std::unique_ptr<reducer> make(gz::host& exec, Codec c, int ranks, gz::comm::feedback_mode feedback) {
  return std::make_unique<codec_reducer<Codec>>(exec, c, ranks, feedback);
}

template <class Codec>
std::unique_ptr<reducer> make(gz::host& exec, Codec c, int ranks, bool error_feedback) {
  return make(exec, c, ranks, error_feedback ? gz::comm::feedback_mode::error_feedback : gz::comm::feedback_mode::none);
}

/// FetchSGD: each rank sketches its gradient, the tables are summed in one allreduce, and every
/// rank runs the same sketch-space momentum and error step on the sum (identical states), then
/// applies the k unsketched coordinates. Momentum is dampened, S_u <- rho S_u + (1 - rho) S / P,
/// so the learning rate means what it means for the other rows.
struct fetchsgd_reducer final : reducer {
  float rho;
  gz::sketch::count_sketch cs;
  gz::sketch::fetchsgd<> fs;
  gz::codec<gz::sparsify::topk> top;
  std::vector<std::byte> table, delta;
  int ranks;
  fetchsgd_reducer(std::uint32_t rows, std::uint64_t columns, std::uint64_t k, float momentum, int r)
      : rho(momentum), cs(rows, columns, 4242), fs(cs, parameters, k, momentum), top(gz::sparsify::topk::count(k)),
        table(cs.payload_bytes(parameters)), delta(fs.max_update_bytes()), ranks(r) {}
  std::size_t reduce(gz::comm::communicator& comm, gz::host& exec, std::vector<float>& grad, std::uint32_t) override {
    cs.compress(exec, gz::span<const float>(grad), gz::span<std::byte>(table));
    auto* cells = const_cast<std::uint8_t*>(cs.table_of(gz::span<const std::byte>(table)));
    comm.allreduce_sum(cells, static_cast<std::size_t>(cs.rows()) * cs.columns(), gz::element_type::f32);
    const std::size_t bytes = fs.step(exec, gz::span<const std::byte>(table), gz::span<std::byte>(delta),
                                      (1.0f - rho) / static_cast<float>(ranks), 1.0f);
    top.decompress(exec, gz::span<const std::byte>(delta.data(), bytes), gz::span<float>(grad));
    return table.size();
  }
};

/// PowerSGD over the model's four tensors, as PyTorch's hook would see them in one bucket: W1
/// (128 x 784) and W2 (10 x 128) compressed at `rank`, the biases allreduced as they are.
struct powersgd_reducer final : reducer {
  gz::comm::powersgd_allreducer<float, gz::host> all;
  powersgd_reducer(gz::host& exec, int rank, int ranks)
      : all(exec, {{hidden, in}, {hidden}, {out, hidden}, {out}}, params(rank), ranks) {}
  static gz::lowrank::powersgd_params params(int rank) {
    gz::lowrank::powersgd_params p;
    p.rank = rank;
    p.seed = 31;
    return p;
  }
  std::size_t reduce(gz::comm::communicator& comm, gz::host& exec, std::vector<float>& grad, std::uint32_t step) override {
    all.run(comm, exec, gz::span<float>(grad), {step, 0});
    return all.sent_bytes();
  }
};

/// Top-k 1 % with error feedback, the selected entries summed by Zen's Balanced Parallelism
/// (comm::sparse_sync) instead of the allreducer's allgather. Reports what it sends, and keeps
/// the density and overlap of the ranks' index sets and the bytes each rank received, against
/// what the allgather of the same payloads would have delivered.
struct zen_topk_reducer final : reducer {
  using topk = gz::codec<gz::sparsify::topk, gz::quantize::none, gz::encode::coo>;
  topk top{gz::sparsify::topk::ratio(0.01)};
  gz::feedback::error_feedback<topk, float, gz::host> ef;
  gz::comm::sparse_sync zen;
  std::vector<std::byte> payload;
  std::vector<float> decoded, values;
  std::vector<std::uint64_t> indices, sizes;
  double received = 0, allgather_received = 0, nnz = 0, unions = 0;
  std::uint64_t steps = 0;
  zen_topk_reducer(gz::host& exec, int ranks)
      : ef(exec, top, parameters), zen(parameters, ranks, 5), payload(ef.max_compressed_bytes<float>()),
        decoded(parameters), sizes(static_cast<std::size_t>(ranks)) {}
  std::size_t reduce(gz::comm::communicator& comm, gz::host& exec, std::vector<float>& grad, std::uint32_t) override {
    const std::size_t bytes = ef.compress(exec, gz::span<const float>(grad), gz::span<std::byte>(payload));
    top.decompress(exec, gz::span<const std::byte>(payload.data(), bytes), gz::span<float>(decoded));
    indices.clear();
    values.clear();
    for (std::size_t i = 0; i < parameters; ++i) {
      if (decoded[i] != 0.0f) {
        indices.push_back(i);
        values.push_back(decoded[i]);
      }
    }
    std::fill(grad.begin(), grad.end(), 0.0f);
    zen.run(comm, exec, gz::span<const std::uint64_t>(indices), gz::span<const float>(values), gz::span<float>(grad),
            1.0f / static_cast<float>(comm.size()));
    // What the allgather of the same top-k payloads would deliver to this rank.
    comm.allgather_sizes(bytes, gz::span<std::uint64_t>(sizes));
    for (int r = 0; r < comm.size(); ++r) allgather_received += r == comm.rank() ? 0.0 : static_cast<double>(sizes[r]);
    received += static_cast<double>(zen.last_traffic().received());
    nnz += static_cast<double>(indices.size());
    unions += static_cast<double>(zen.last_traffic().union_entries);
    ++steps;
    // What this rank puts in, as the table counts for the allgather path (its payload once): its
    // parts for the other owners, and its reduced part once.
    const gz::comm::sparse_sync_traffic& t = zen.last_traffic();
    return static_cast<std::size_t>(t.scatter_sent + t.gather_sent / static_cast<std::uint64_t>(comm.size() > 1 ? comm.size() - 1 : 1));
  }
  std::string note(gz::comm::mpi_communicator& comm) override {
    double totals[4] = {received, allgather_received, nnz, unions};
    MPI_Allreduce(MPI_IN_PLACE, totals, 4, MPI_DOUBLE, MPI_SUM, comm.native());
    const double p = comm.size(), s = static_cast<double>(steps);
    std::ostringstream out;
    out << "top-k 1 % through Zen: density " << 100.0 * totals[2] / p / s / parameters << " % per rank, overlap (sum nnz / union) "
        << totals[2] / (totals[3] / p) << ", received per rank per step " << totals[0] / p / s
        << " B, against " << totals[1] / p / s << " B for the allgather of the same payloads";
    return out.str();
  }
};

struct candidate {
  std::string key, name;
  std::function<std::unique_ptr<reducer>(gz::host&, int)> build;
};

std::vector<candidate> candidates() {
  using gz::encode::none;
  using dense_fp32 = gz::codec<gz::sparsify::none, gz::quantize::none, none>;
  using dense_fp16 = gz::codec<gz::sparsify::none, gz::quantize::cast_fp16, none>;
  using topk = gz::codec<gz::sparsify::topk, gz::quantize::none, gz::encode::automatic>;
  using randomk = gz::codec<gz::sparsify::randomk, gz::quantize::none, none>;
  using qsgd4 = gz::codec<gz::sparsify::none, gz::quantize::qsgd<7>, none>;
  using scaled_sign = gz::codec<gz::sparsify::none, gz::quantize::scaled_sign, none>;
  using sign = gz::codec<gz::sparsify::none, gz::quantize::sign<false>, none>;
  const auto top1 = gz::sparsify::topk::ratio(0.01);
  return {
      {"fp32", "fp32 allreduce (no compression)", [](gz::host& e, int r) { return make(e, dense_fp32{}, r, false); }},
      {"fp16", "fp16 cast", [](gz::host& e, int r) { return make(e, dense_fp16{}, r, false); }},
      {"topk", "top-k 1 %", [=](gz::host& e, int r) { return make(e, topk{top1}, r, false); }},
      {"topk-ef", "top-k 1 % + error feedback", [=](gz::host& e, int r) { return make(e, topk{top1}, r, true); }},
      {"topk-ef21", "top-k 1 % + EF21",
       [=](gz::host& e, int r) { return make(e, topk{top1}, r, gz::comm::feedback_mode::ef21); }},
      {"randomk-ef", "random-k 1 % (shared seed) + error feedback",
       [](gz::host& e, int r) { return make(e, randomk{gz::sparsify::randomk::ratio(0.01, 77, false)}, r, true); }},
      {"qsgd4", "QSGD 4-bit (bucket 128)", [](gz::host& e, int r) { return make(e, qsgd4{{}, gz::quantize::qsgd<7>{99}}, r, false); }},
      {"scaled-sign-ef", "scaled sign + error feedback", [](gz::host& e, int r) { return make(e, scaled_sign{}, r, true); }},
      {"sign", "sign, no error feedback", [](gz::host& e, int r) { return make(e, sign{}, r, false); }},
      {"powersgd1", "PowerSGD rank 1 + error feedback, warm start",
       [](gz::host& e, int r) -> std::unique_ptr<reducer> { return std::make_unique<powersgd_reducer>(e, 1, r); }},
      {"powersgd4", "PowerSGD rank 4 + error feedback, warm start",
       [](gz::host& e, int r) -> std::unique_ptr<reducer> { return std::make_unique<powersgd_reducer>(e, 4, r); }},
      {"topk-ef-zen", "top-k 1 % + error feedback, summed by Zen (sparse_sync)",
       [](gz::host& e, int r) -> std::unique_ptr<reducer> { return std::make_unique<zen_topk_reducer>(e, r); }},
      {"fetchsgd", "count sketch 3 x n/30, top n/300, error in sketch space (FetchSGD, no momentum)",
       [](gz::host&, int r) -> std::unique_ptr<reducer> {
         return std::make_unique<fetchsgd_reducer>(3, parameters / 30, parameters / 300, 0.0f, r);
       }},
      {"fetchsgd-momentum", "as above, with sketch-space momentum 0.9 (FetchSGD)",
       [](gz::host&, int r) -> std::unique_ptr<reducer> {
         return std::make_unique<fetchsgd_reducer>(3, parameters / 30, parameters / 300, 0.9f, r);
       }},
  };
}

struct result {
  std::string key, name;
  double accuracy = 0.0, bytes_ratio = 0.0, seconds = 0.0;
  std::string note;
};

result train(const candidate& c, gz::comm::mpi_communicator& comm, const dataset& train_set, const dataset& test_set,
             int epochs, int batch, float lr) {
  gz::host exec(1);  // one thread per rank: the ranks share the cores
  auto r = c.build(exec, comm.size());
  std::vector<float> params = initial_parameters(), grad(parameters);
  const std::size_t shard = train_set.count / static_cast<std::size_t>(comm.size());
  std::vector<std::size_t> order(shard);
  std::iota(order.begin(), order.end(), shard * static_cast<std::size_t>(comm.rank()));
  const std::size_t steps_per_epoch = shard / static_cast<std::size_t>(batch);
  std::uint64_t sent = 0;
  std::uint32_t step = 0;
  MPI_Barrier(comm.native());
  const double start = MPI_Wtime();
  for (int epoch = 0; epoch < epochs; ++epoch) {
    std::mt19937 rng(1000u * static_cast<unsigned>(epoch) + static_cast<unsigned>(comm.rank()));
    std::shuffle(order.begin(), order.end(), rng);
    for (std::size_t s = 0; s < steps_per_epoch; ++s, ++step) {
      gradient(params, train_set, order.data() + s * static_cast<std::size_t>(batch), batch, grad);
      sent += r->reduce(comm, exec, grad, step);
      for (std::size_t i = 0; i < parameters; ++i) params[i] -= lr * grad[i];
    }
  }
  double seconds = MPI_Wtime() - start;
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, comm.native());
  result out{c.key, c.name, accuracy(params, test_set), 0.0, seconds, r->note(comm)};
  out.bytes_ratio = static_cast<double>(sent) / step / (parameters * sizeof(float));
  return out;
}

struct options {
  int epochs = 3, batch = 32;
  float lr = 0.1f;
  std::size_t train = 60000;
  std::string data = "/usr/share/datasets/fashion-mnist", csv, codecs;
  bool check = false;
};

options parse(int argc, char** argv) {
  options o;
  fashion_mnist::parse_options(argc, argv, [&](const std::string& a, const auto& value) {
    if (a == "--epochs") o.epochs = std::stoi(value());
    else if (a == "--batch") o.batch = std::stoi(value());
    else if (a == "--lr") o.lr = std::stof(value());
    else if (a == "--train") o.train = std::stoul(value());
    else if (a == "--data") o.data = value();
    else if (a == "--csv") o.csv = value();
    else if (a == "--codecs") o.codecs = value();
    else if (a == "--check") o.check = true;
    else return false;
    return true;
  });
  if (o.epochs < 1 || o.batch < 1 || !(o.lr > 0.0f)) throw std::runtime_error("--epochs, --batch and --lr must be positive");
  return o;
}

int run(int argc, char** argv) {
  const options o = parse(argc, argv);
  gz::comm::mpi_communicator comm{MPI_COMM_WORLD};
  const dataset train_set = load(o.data, "train", o.train), test_set = load(o.data, "t10k", 10000);
  if (train_set.count / static_cast<std::size_t>(comm.size()) < static_cast<std::size_t>(o.batch)) {
    throw std::runtime_error("fewer training images per rank than one batch");
  }
  std::vector<result> results;
  for (const auto& c : candidates()) {
    if (!o.codecs.empty() && ("," + o.codecs + ",").find("," + c.key + ",") == std::string::npos) continue;
    results.push_back(train(c, comm, train_set, test_set, o.epochs, o.batch, o.lr));
    if (comm.rank() == 0) {
      std::printf("  %-45s %6.2f %% test accuracy, %.4f bytes/step vs fp32, %.1f s\n", results.back().name.c_str(),
                  results.back().accuracy, results.back().bytes_ratio, results.back().seconds);
      std::fflush(stdout);
    }
  }
  const auto base = std::find_if(results.begin(), results.end(), [](const result& r) { return r.key == "fp32"; });
  const auto verdict = [&](const result& r) -> std::string {
    if (base == results.end()) return "";
    return r.accuracy >= base->accuracy - 2.0 ? "ok" : "hurts";
  };
  int status = 0;
  if (comm.rank() == 0) {
    std::printf("\n%d ranks, %zu training images (%zu per rank), %d epochs, batch %d per rank, SGD lr %g, %zu parameters\n\n",
                comm.size(), train_set.count, train_set.count / static_cast<std::size_t>(comm.size()), o.epochs, o.batch,
                static_cast<double>(o.lr), parameters);
    std::printf("| codec | test accuracy | vs fp32 | bytes sent per step vs fp32 | wall time | verdict |\n");
    std::printf("|---|---|---|---|---|---|\n");
    for (const auto& r : results) {
      std::printf("| %s | %.2f %% | %+.2f | %.4f (%.0fx less) | %.1f s | %s |\n", r.name.c_str(), r.accuracy,
                  base == results.end() ? 0.0 : r.accuracy - base->accuracy, r.bytes_ratio, 1.0 / r.bytes_ratio,
                  r.seconds, verdict(r).c_str());
    }
    for (const auto& r : results) {
      if (!r.note.empty()) std::printf("\n%s\n", r.note.c_str());
    }
    if (!o.csv.empty()) {
      std::FILE* f = std::fopen(o.csv.c_str(), "w");
      if (f == nullptr) throw std::runtime_error("cannot write " + o.csv);
      std::fprintf(f, "key,name,accuracy,bytes_ratio,seconds\n");
      for (const auto& r : results) {
        std::fprintf(f, "%s,\"%s\",%.4f,%.6f,%.3f\n", r.key.c_str(), r.name.c_str(), r.accuracy, r.bytes_ratio, r.seconds);
      }
      std::fclose(f);
    }
    if (o.check) {
      const auto find = [&](const std::string& key) {
        return std::find_if(results.begin(), results.end(), [&](const result& r) { return r.key == key; });
      };
      for (const char* key : {"fp32", "topk-ef", "qsgd4", "powersgd4", "sign"}) {
        if (find(key) == results.end()) {
          std::printf("check: codec %s was not run\n", key);
          status = 1;
        }
      }
      for (const char* key : {"topk-ef", "qsgd4", "powersgd4"}) {
        if (find(key) != results.end() && verdict(*find(key)) != "ok") {
          std::printf("check FAILED: %s is more than 2 points below fp32\n", key);
          status = 1;
        }
      }
      if (find("sign") != results.end() && verdict(*find("sign")) != "hurts") {
        std::printf("check FAILED: sign without error feedback was not reported as hurting\n");
        status = 1;
      }
      if (status == 0) std::printf("\ncheck passed: top-k 1 %% + EF, QSGD 4-bit and PowerSGD rank 4 within 2 points of fp32; sign without EF reported as hurting\n");
    }
  }
  MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  try {
    status = run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradzip_mpi_train: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return status;
}
