// mpi_train: data-parallel training of a 784-128-10 MLP on Fashion-MNIST under MPI, with every
// gradient averaged through gradzip::comm::allreducer (or comm::powersgd_allreducer) and one
// codec per run. Prints, per codec, the final test accuracy, the bytes each rank sends per step
// relative to an fp32 allreduce, and the wall time.
//
//   mpirun -np 4 build/examples/gradzip_mpi_train [--epochs 3] [--train 60000] [--codecs a,b,...]
//                                                 [--data /usr/share/datasets/fashion-mnist]
//                                                 [--csv results.csv] [--check]
//                                                 [--plan plan.json --cost cost.json]
//                                                 [--evals 4 [--target 84] [--curve curve.csv]]
//   mpirun -np 4 build/examples/gradzip_mpi_train --measure-link link.json
//
// --plan runs one more codec, "plan": the gradient in fusion groups, each synchronized as the
// plan says (gradzip_plan writes it; docs/scheduling.md), and prints the synchronization time
// per step the cost model --cost predicts beside the one measured. --measure-link times
// MPI's allreduce and allgather at several sizes, fits the scheduler's link model to them, and
// writes it (the "network" of a cost model) for gradzip_plan --link. --evals N measures the test
// accuracy N times per epoch with the clock stopped and times each step's synchronization (from
// a barrier after backprop); --target A adds each run's training time to A % test accuracy to
// the table, and --curve writes every measurement.
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
#include <gradzip/comm/planned_allreducer.hpp>
#include <gradzip/gradzip.hpp>
#include <gradzip/schedule/serialize.hpp>

#include "fashion_mnist.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
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

/// Test accuracy in percent over images [first, last) of d.
double accuracy(const std::vector<float>& p, const dataset& d, std::size_t first, std::size_t last) {
  float h[hidden], z[out];
  std::size_t right = 0;
  for (std::size_t s = first; s < last; ++s) {
    forward(p, d.images.data() + s * in, h, z);
    right += static_cast<std::size_t>(std::max_element(z, z + out) - z) == d.labels[s] ? 1 : 0;
  }
  return 100.0 * static_cast<double>(right) / static_cast<double>(last - first);
}

double accuracy(const std::vector<float>& p, const dataset& d) { return accuracy(p, d, 0, d.count); }

/// The test accuracy, each rank evaluating its share of the images (collective).
double shared_accuracy(const std::vector<float>& p, const dataset& d, gz::comm::mpi_communicator& comm) {
  const std::size_t P = static_cast<std::size_t>(comm.size()), r = static_cast<std::size_t>(comm.rank());
  const std::size_t first = d.count * r / P, last = d.count * (r + 1) / P;
  double right[2] = {first < last ? accuracy(p, d, first, last) * static_cast<double>(last - first) / 100.0 : 0.0,
                     static_cast<double>(last - first)};
  MPI_Allreduce(MPI_IN_PLACE, right, 2, MPI_DOUBLE, MPI_SUM, comm.native());
  return 100.0 * right[0] / right[1];
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
    gz::comm::nonzeros(gz::span<const float>(decoded), indices, values);
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

/// A plan's fusion groups (gradzip_plan, docs/scheduling.md): the four tensors copied in
/// backprop order (b2, W2, b1, W1) into one flat buffer, and each group synchronized by
/// comm::planned_allreducer with the codec and route the plan names (top-k and scaled sign with
/// error feedback, as above). The note compares the synchronization time per step that the
/// cost model predicts for the plan (schedule::simulate, no compute) with the median measured,
/// from a barrier after backprop to the averaged flat buffer.
struct planned_reducer final : reducer {
  static constexpr std::size_t order[4] = {b2, w2, b1, w1};  // backprop order, into the flat layout
  std::unique_ptr<gz::comm::planned_allreducer<float, gz::host>> planned;
  std::vector<float> flat = std::vector<float>(parameters);
  std::vector<double> seconds;
  double predicted = 0.0;

  planned_reducer(gz::host& exec, const std::string& plan_path, const std::string& cost_path, int ranks) {
    gz::schedule::cost_model model = gz::schedule::cost_model_from_json(gz::schedule::json::parse(read_text(cost_path)));
    model.ranks = ranks;
    const gz::schedule::plan plan = gz::schedule::plan_from_json(gz::schedule::json::parse(read_text(plan_path)), model);
    const std::vector<std::size_t> sizes = {out, out * hidden, hidden, hidden * in};
    planned = std::make_unique<gz::comm::planned_allreducer<float, gz::host>>(exec, sizes, plan, model, codecs(), ranks);
    gz::schedule::workload w{sizes, std::vector<double>(4, 0.0), 0.0, 4.0};
    predicted = gz::schedule::simulate(w, model, plan).iteration_s;
  }

  /// The codecs gradzip_plan's cost models name.
  static std::vector<gz::comm::plan_codec<float, gz::host>> codecs() {
    using gz::encode::none;
    using entry = gz::comm::plan_codec<float, gz::host>;
    const gz::codec<gz::sparsify::topk> top1{gz::sparsify::topk::ratio(0.01)};
    const auto ef = gz::comm::feedback_mode::error_feedback;
    return {entry::uncompressed("fp32"),
            entry::of("fp16", gz::codec<gz::sparsify::none, gz::quantize::cast_fp16, none>{}),
            entry::of("bf16", gz::codec<gz::sparsify::none, gz::quantize::cast_bf16, none>{}),
            entry::of("topk1", top1, ef),
            entry::sparse("topk1", top1, ef, 5),
            entry::of("qsgd4", gz::codec<gz::sparsify::none, gz::quantize::qsgd<7>, none>{}),
            entry::of("scaled_sign", gz::codec<gz::sparsify::none, gz::quantize::scaled_sign, none>{}, ef)};
  }

  static std::string read_text(const std::string& path) {
    std::ifstream f(path);
    if (!f) throw std::runtime_error("cannot read " + path);
    std::stringstream text;
    text << f.rdbuf();
    return text.str();
  }

  std::size_t reduce(gz::comm::communicator& comm, gz::host& exec, std::vector<float>& grad, std::uint32_t step) override {
    const gz::fusion::layout& l = planned->layout();
    for (std::size_t t = 0; t < 4; ++t) {
      std::copy_n(grad.begin() + static_cast<std::ptrdiff_t>(order[t]), l.size(t), flat.begin() + static_cast<std::ptrdiff_t>(l.offset(t)));
    }
    // The clock starts when every rank has its gradient in the flat buffer: it times the
    // synchronization the model predicts, not the wait for a slower rank's backprop (the
    // copies above are not timed).
    MPI_Barrier(static_cast<gz::comm::mpi_communicator&>(comm).native());
    const double start = MPI_Wtime();
    planned->run(comm, exec, gz::span<float>(flat), {step, 0});
    seconds.push_back(MPI_Wtime() - start);
    for (std::size_t t = 0; t < 4; ++t) {
      std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>(l.offset(t)), l.size(t), grad.begin() + static_cast<std::ptrdiff_t>(order[t]));
    }
    return planned->last_sent_bytes();
  }

  std::string note(gz::comm::mpi_communicator& comm) override {
    std::vector<double> sorted = seconds;
    std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2), sorted.end());
    double measured = sorted.empty() ? 0.0 : sorted[sorted.size() / 2];
    MPI_Allreduce(MPI_IN_PLACE, &measured, 1, MPI_DOUBLE, MPI_MAX, comm.native());
    std::ostringstream text;
    const gz::fusion::layout& layout = planned->layout();
    text << "plan: " << layout.group_count() << " groups (";
    for (std::size_t g = 0; g < layout.group_count(); ++g) text << (g ? ", " : "") << layout.group_size(g) << " elements";
    text << "); synchronization per step: predicted " << 1e3 * predicted << " ms, measured " << 1e3 * measured
         << " ms (median, slowest rank), measured / predicted " << measured / predicted;
    return text.str();
  }
};

/// Least squares on the relative error of t_i = sum_j rows[i][j] x[j], for the first k
/// unknowns: the normal equations by Gaussian elimination with partial pivoting. False when
/// they are singular.
bool solve_link(const std::vector<std::array<double, 3>>& rows, const std::vector<double>& times, int k, double* x) {
  double a[3][4] = {};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const double w = 1.0 / (times[i] * times[i]);
    for (int j = 0; j < k; ++j) {
      a[j][k] += w * rows[i][j] * times[i];
      for (int l = 0; l < k; ++l) a[j][l] += w * rows[i][j] * rows[i][l];
    }
  }
  for (int c = 0; c < k; ++c) {
    int pivot = c;
    for (int r = c + 1; r < k; ++r) pivot = std::abs(a[r][c]) > std::abs(a[pivot][c]) ? r : pivot;
    if (!(std::abs(a[pivot][c]) > 1e-12 * std::abs(a[0][0]))) return false;
    for (int l = 0; l <= k; ++l) std::swap(a[c][l], a[pivot][l]);
    for (int r = 0; r < k; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (int l = 0; l <= k; ++l) a[r][l] -= f * a[c][l];
    }
  }
  for (int c = 0; c < k; ++c) x[c] = a[c][k] / a[c][c];
  return true;
}

/// Times MPI's allreduce and allgather at 1 KiB .. 4 MiB per rank (median of 20 each) and fits
/// the link model of schedule::cost_model by least squares on the relative error: each timing
/// is linear in (latency, cost per message, seconds per byte) by the collectives' formulas in
/// schedule/cost_model.hpp. Returns {"network": {...}} with the points it fitted.
gz::schedule::json measure_link(gz::comm::mpi_communicator& comm) {
  const double P = comm.size(), rounds = std::ceil(std::log2(P));
  std::vector<std::array<double, 3>> rows;  // coefficients of (latency, message, 1 / bandwidth)
  std::vector<double> times;
  gz::schedule::json points = gz::schedule::json::array();
  for (std::size_t bytes = 1024; bytes <= (std::size_t{4} << 20); bytes *= 4) {
    std::vector<float> data(bytes / 4, 1.0f);
    std::vector<std::byte> all(bytes * static_cast<std::size_t>(comm.size()));
    std::vector<std::uint64_t> sizes(static_cast<std::size_t>(comm.size()), bytes);
    for (int collective = 0; collective < 2; ++collective) {
      std::vector<double> t;
      for (int rep = 0; rep < 21; ++rep) {
        MPI_Barrier(comm.native());
        const double start = MPI_Wtime();
        if (collective == 0) {
          comm.allreduce_sum(data.data(), data.size(), gz::element_type::f32);
        } else {
          comm.allgatherv_bytes(gz::span<const std::byte>(reinterpret_cast<const std::byte*>(data.data()), bytes),
                                gz::span<std::byte>(all), gz::span<const std::uint64_t>(sizes));
        }
        double elapsed = MPI_Wtime() - start;
        MPI_Allreduce(MPI_IN_PLACE, &elapsed, 1, MPI_DOUBLE, MPI_MAX, comm.native());
        if (rep > 0) t.push_back(elapsed);  // the first is a warm-up
      }
      std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
      const double b = static_cast<double>(bytes);
      rows.push_back(collective == 0 ? std::array<double, 3>{2 * rounds, 2 * rounds, 2 * (P - 1) / P * b}
                                     : std::array<double, 3>{rounds, P - 1, (P - 1) * b});
      times.push_back(t[t.size() / 2]);
      points.push(gz::schedule::json::array().push(collective == 0 ? "allreduce" : "allgather").push(b).push(times.back()));
    }
  }
  // Weighted least squares for (latency, message, 1 / bandwidth); at 2 ranks, and whenever the
  // fit is ill-conditioned or negative, the message cost folds into the latency.
  double x[3] = {0, 0, 0};
  if (!solve_link(rows, times, 3, x) || x[0] < 0 || x[1] < 0 || !(x[2] > 0)) {
    for (auto& row : rows) row = {row[0] + row[1], row[2], 0.0};
    double y[3] = {0, 0, 0};
    if (!solve_link(rows, times, 2, y) || !(y[1] > 0)) throw std::runtime_error("measure-link: the timings fit no link");
    x[0] = std::max(0.0, y[0]);
    x[1] = 0.0;
    x[2] = y[1];
  }
  const gz::comm::link_model link{x[0], 1.0 / x[2], x[1]};
  return gz::schedule::json::object()
      .set("ranks", comm.size())
      .set("network", gz::schedule::json::object()
                          .set("latency_s", link.latency_s)
                          .set("bytes_per_s", link.bytes_per_s)
                          .set("message_s", link.message_s))
      .set("points", std::move(points));
}

struct candidate {
  std::string key, name;
  std::function<std::unique_ptr<reducer>(gz::host&, int)> build;
};

std::vector<candidate> candidates(const std::string& plan, const std::string& cost) {
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
      {"plan", "the plan's fusion groups (--plan)",
       [=](gz::host& e, int r) -> std::unique_ptr<reducer> {
         if (plan.empty() || cost.empty()) throw std::runtime_error("codec plan needs --plan and --cost");
         return std::make_unique<planned_reducer>(e, plan, cost, r);
       }},
  };
}

/// A test accuracy reached after `seconds` of training (evaluation not counted).
struct checkpoint {
  double epochs = 0.0, seconds = 0.0, accuracy = 0.0;
};

struct result {
  std::string key, name;
  double accuracy = 0.0, bytes_ratio = 0.0, seconds = 0.0;
  std::string note;
  std::vector<checkpoint> curve;  ///< with --evals: the test accuracy as training went
  std::uint32_t steps = 0;
  double sync_s = 0.0;  ///< with --evals: the median synchronization per step, slowest rank
  /// Training seconds until the test accuracy first reached `target` (NaN: never).
  double time_to(double target) const {
    for (const checkpoint& c : curve) {
      if (c.accuracy >= target) return c.seconds;
    }
    return std::nan("");
  }
};

/// Trains with candidate c. With evals > 0, the test accuracy is measured `evals` times per
/// epoch, every rank evaluating its share of the test set, with the clock stopped: the
/// seconds reported are training only (backprop, synchronization, the update). Each step's
/// synchronization is then timed too, from a barrier after backprop (so that it excludes
/// waiting for a slower rank's backprop) to the averaged gradient.
result train(const candidate& c, gz::comm::mpi_communicator& comm, const dataset& train_set, const dataset& test_set,
             int epochs, int batch, float lr, int evals) {
  gz::host exec(1);  // one thread per rank: the ranks share the cores
  auto r = c.build(exec, comm.size());
  std::vector<float> params = initial_parameters(), grad(parameters);
  const std::size_t shard = train_set.count / static_cast<std::size_t>(comm.size());
  std::vector<std::size_t> order(shard);
  std::iota(order.begin(), order.end(), shard * static_cast<std::size_t>(comm.rank()));
  const std::size_t steps_per_epoch = shard / static_cast<std::size_t>(batch);
  // Evaluations after steps j * steps_per_epoch / evals_per_epoch, j = 1 .. evals_per_epoch.
  const std::size_t evals_per_epoch = std::min(static_cast<std::size_t>(evals), steps_per_epoch);
  std::uint64_t sent = 0;
  std::uint32_t step = 0;
  std::vector<checkpoint> curve;
  std::vector<double> sync;
  double trained = 0.0;  // seconds of training, evaluations left out
  MPI_Barrier(comm.native());
  double start = MPI_Wtime();
  for (int epoch = 0; epoch < epochs; ++epoch) {
    std::mt19937 rng(1000u * static_cast<unsigned>(epoch) + static_cast<unsigned>(comm.rank()));
    std::shuffle(order.begin(), order.end(), rng);
    std::size_t next_eval = 1;
    for (std::size_t s = 0; s < steps_per_epoch; ++s, ++step) {
      gradient(params, train_set, order.data() + s * static_cast<std::size_t>(batch), batch, grad);
      if (evals_per_epoch != 0) MPI_Barrier(comm.native());
      const double synchronizing = MPI_Wtime();
      sent += r->reduce(comm, exec, grad, step);
      if (evals_per_epoch != 0) sync.push_back(MPI_Wtime() - synchronizing);
      for (std::size_t i = 0; i < parameters; ++i) params[i] -= lr * grad[i];
      if (evals_per_epoch != 0 && s + 1 == steps_per_epoch * next_eval / evals_per_epoch) {
        ++next_eval;
        double elapsed = MPI_Wtime() - start;  // the slowest rank's clock
        MPI_Allreduce(MPI_IN_PLACE, &elapsed, 1, MPI_DOUBLE, MPI_MAX, comm.native());
        trained += elapsed;
        curve.push_back({epoch + static_cast<double>(s + 1) / static_cast<double>(steps_per_epoch), trained,
                         shared_accuracy(params, test_set, comm)});
        MPI_Barrier(comm.native());
        start = MPI_Wtime();
      }
    }
  }
  double elapsed = MPI_Wtime() - start;
  MPI_Allreduce(MPI_IN_PLACE, &elapsed, 1, MPI_DOUBLE, MPI_MAX, comm.native());
  trained += elapsed;
  result out{c.key, c.name, accuracy(params, test_set), 0.0, trained, r->note(comm), std::move(curve), step};
  out.bytes_ratio = static_cast<double>(sent) / step / (parameters * sizeof(float));
  if (!sync.empty()) {
    std::nth_element(sync.begin(), sync.begin() + static_cast<std::ptrdiff_t>(sync.size() / 2), sync.end());
    out.sync_s = sync[sync.size() / 2];
    MPI_Allreduce(MPI_IN_PLACE, &out.sync_s, 1, MPI_DOUBLE, MPI_MAX, comm.native());
  }
  return out;
}

struct options {
  int epochs = 3, batch = 32, evals = 0;
  float lr = 0.1f;
  double target = 0.0;  // percent; 0: no time-to-accuracy column
  std::size_t train = 60000;
  std::string data = "/usr/share/datasets/fashion-mnist", csv, curve, codecs, plan, cost, measure_link;
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
    else if (a == "--curve") o.curve = value();
    else if (a == "--evals") o.evals = std::stoi(value());
    else if (a == "--target") o.target = std::stod(value());
    else if (a == "--codecs") o.codecs = value();
    else if (a == "--check") o.check = true;
    else if (a == "--plan") o.plan = value();
    else if (a == "--cost") o.cost = value();
    else if (a == "--measure-link") o.measure_link = value();
    else return false;
    return true;
  });
  if (o.epochs < 1 || o.batch < 1 || !(o.lr > 0.0f)) throw std::runtime_error("--epochs, --batch and --lr must be positive");
  if (o.evals < 0) throw std::runtime_error("--evals must be >= 0, got " + std::to_string(o.evals));
  if (!(o.target >= 0.0 && o.target <= 100.0)) throw std::runtime_error("--target must be a percentage in [0, 100]");
  if ((o.target > 0.0 || !o.curve.empty()) && o.evals == 0) throw std::runtime_error("--target and --curve need --evals N");
  return o;
}

int run(int argc, char** argv) {
  const options o = parse(argc, argv);
  gz::comm::mpi_communicator comm{MPI_COMM_WORLD};
  if (!o.measure_link.empty()) {
    const std::string text = measure_link(comm).dump();
    if (comm.rank() == 0) {
      std::ofstream(o.measure_link) << text << "\n";
      std::printf("%s\n", text.c_str());
    }
    return 0;
  }
  const dataset train_set = load(o.data, "train", o.train), test_set = load(o.data, "t10k", 10000);
  if (train_set.count / static_cast<std::size_t>(comm.size()) < static_cast<std::size_t>(o.batch)) {
    throw std::runtime_error("fewer training images per rank than one batch");
  }
  std::vector<result> results;
  for (const auto& c : candidates(o.plan, o.cost)) {
    if (o.codecs.empty() ? c.key == "plan" && o.plan.empty()
                         : ("," + o.codecs + ",").find("," + c.key + ",") == std::string::npos) {
      continue;
    }
    results.push_back(train(c, comm, train_set, test_set, o.epochs, o.batch, o.lr, o.evals));
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
    char reach[64] = "";
    if (o.evals > 0) std::snprintf(reach, sizeof reach, " sync ms per step |");
    if (o.target > 0.0) std::snprintf(reach, sizeof reach, " sync ms per step | time to %g %% |", o.target);
    std::printf("| codec | test accuracy | vs fp32 | bytes sent per step vs fp32 | wall time | ms per step |%s verdict |\n",
                reach);
    std::printf("|---|---|---|---|---|---|%s%s---|\n", o.evals > 0 ? "---|" : "", o.target > 0.0 ? "---|" : "");
    for (const auto& r : results) {
      char to[96] = "";
      if (o.evals > 0) {
        const double t = r.time_to(o.target);
        if (o.target <= 0.0) {
          std::snprintf(to, sizeof to, " %.3f |", 1e3 * r.sync_s);
        } else if (std::isnan(t)) {
          std::snprintf(to, sizeof to, " %.3f | not reached |", 1e3 * r.sync_s);
        } else {
          std::snprintf(to, sizeof to, " %.3f | %.2f s |", 1e3 * r.sync_s, t);
        }
      }
      std::printf("| %s | %.2f %% | %+.2f | %.4f (%.0fx less) | %.1f s | %.2f |%s %s |\n", r.name.c_str(), r.accuracy,
                  base == results.end() ? 0.0 : r.accuracy - base->accuracy, r.bytes_ratio, 1.0 / r.bytes_ratio,
                  r.seconds, 1e3 * r.seconds / r.steps, to, verdict(r).c_str());
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
    if (!o.curve.empty()) {
      std::FILE* f = std::fopen(o.curve.c_str(), "w");
      if (f == nullptr) throw std::runtime_error("cannot write " + o.curve);
      std::fprintf(f, "key,epochs,seconds,accuracy\n");
      for (const auto& r : results) {
        for (const checkpoint& c : r.curve) std::fprintf(f, "%s,%.4f,%.4f,%.4f\n", r.key.c_str(), c.epochs, c.seconds, c.accuracy);
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
