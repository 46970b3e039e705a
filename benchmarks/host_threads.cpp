// Host threads under contention (docs/performance.md): while another process spins on one of
// the cores, each iteration runs the same compress on one thread and on two, and reports the
// mean of each (t1_ms, t2_ms) and their ratio. Means, not medians: the cost of a collapse is
// the occasional call that waits a whole scheduler slice. Issue 16's target: ratio <= 1.5.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.hpp"
#include "gradzip/gradzip.hpp"

namespace {

namespace q = gradzip::quantize;

/// A child process that spins until destroyed: another process busy on a core.
class busy_process {
 public:
  busy_process() : pid_(fork()) {
    if (pid_ == 0) {
      volatile unsigned long spin = 0;
      for (;;) spin = spin + 1;
    }
  }
  busy_process(const busy_process&) = delete;
  busy_process& operator=(const busy_process&) = delete;
  ~busy_process() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }

 private:
  pid_t pid_;
};

template <class Codec>
void BM_contended(benchmark::State& state) {
  const auto& x = gradzip_bench::gradient(static_cast<std::size_t>(state.range(0)));
  const auto c = Codec::make();
  std::vector<std::byte> out(c.template max_compressed_bytes<float>(x.size()));
  gradzip::host one{1}, two{2};
  const auto call = [&](gradzip::host& exec) {
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(c.compress(exec, gradzip::span<const float>(x), gradzip::span<std::byte>(out)));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  call(one);
  call(two);  // starts the pool's helper before the busy process exists
  busy_process busy;
  double t1 = 0.0, t2 = 0.0;
  for (auto _ : state) {
    t1 += call(one);
    t2 += call(two);
  }
  const auto iterations = static_cast<double>(state.iterations());
  state.counters["t1_ms"] = t1 / iterations * 1e3;
  state.counters["t2_ms"] = t2 / iterations * 1e3;
  state.counters["ratio"] = t2 / t1;
}

struct sign {
  static auto make() { return gradzip::codec<gradzip::sparsify::none, q::sign<false>, gradzip::encode::none>{}; }
};
struct qsgd4 {
  static auto make() { return gradzip::codec<gradzip::sparsify::none, q::qsgd<7>, gradzip::encode::none>{}; }
};
struct topk1 {
  static auto make() { return gradzip::codec<gradzip::sparsify::topk>{gradzip::sparsify::topk::ratio(0.01)}; }
};

void sizes(benchmark::internal::Benchmark* b) {
  for (int log2 : {16, 20, 24}) b->Arg(std::int64_t{1} << log2);
}

}  // namespace

BENCHMARK_TEMPLATE(BM_contended, sign)->Name("contended/sign/f32")->Apply(sizes)->UseRealTime()->MinTime(1.0);
BENCHMARK_TEMPLATE(BM_contended, qsgd4)->Name("contended/qsgd4/f32")->Apply(sizes)->UseRealTime()->MinTime(1.0);
BENCHMARK_TEMPLATE(BM_contended, topk1)->Name("contended/topk1/f32")->Apply(sizes)->UseRealTime()->MinTime(1.0);
