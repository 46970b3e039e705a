// Host index encodings, one core: COO, bitmap and delta-varint encode (sorted indices -> the
// indices section) and decode (section -> validated indices), at densities of 0.1 %, 1 % and
// 10 % of 2^24 elements (the synthetic gradient's top-k). Each reports indices/s, the dense fp32
// tensor's GB/s (input_GBps: n * 4 bytes per call) and the section's bytes per selected index.
#include <cmath>
#include <functional>

#include "common.hpp"
#include "gradzip/gradzip.hpp"

namespace {

constexpr std::size_t tensor = std::size_t{1} << 24;

/// The sorted indices of the top `permille` / 1000 of the synthetic gradient.
const std::vector<std::uint64_t>& selected(std::int64_t permille) {
  static std::map<std::int64_t, std::vector<std::uint64_t>> cache;
  auto it = cache.find(permille);
  if (it != cache.end()) return it->second;
  const auto& g = gradzip_bench::gradient(tensor);
  const gradzip::codec<gradzip::sparsify::topk> c{gradzip::sparsify::topk::ratio(permille / 1000.0)};
  gradzip::host exec;
  std::vector<std::byte> p(c.max_compressed_bytes<float>(tensor));
  p.resize(c.compress(exec, gradzip::span<const float>(g), gradzip::span<std::byte>(p)));
  const auto h = gradzip::wire::read_header(gradzip::span<const std::byte>(p));
  std::vector<std::uint64_t> idx(h.sections[1].size / 4);
  for (std::size_t j = 0; j < idx.size(); ++j) {
    idx[j] = gradzip::encode::coo::load(reinterpret_cast<const std::uint8_t*>(p.data()) + h.sections[1].offset, 4, j);
  }
  return cache[permille] = idx;
}

template <class Indices>
std::vector<std::uint8_t> encoded(gradzip::host& exec, const std::vector<std::uint64_t>& idx, std::vector<std::byte>& ws,
                                  std::uint8_t& encoding) {
  ws.resize(gradzip::detail::index_encoder<gradzip::host>::workspace_bytes(exec, idx.size()));
  const std::uint64_t bytes =
      gradzip::detail::index_encoder<gradzip::host>::plan<Indices>(exec, idx.data(), idx.size(), tensor, ws.data(), encoding);
  std::vector<std::uint8_t> section(bytes + 16);  // + 16: room for the decoder's wide loads
  gradzip::detail::index_encoder<gradzip::host>::encode(exec, encoding, idx.data(), idx.size(), tensor, ws.data(),
                                                        section.data());
  section.resize(bytes);
  return section;
}

/// Times `body` (gradzip_bench::run_timed: input GB/s of the dense fp32 tensor) and adds
/// indices/s, the section's bytes per index and the density.
template <class Body>
void run(benchmark::State& state, gradzip::host& exec, std::size_t k, std::size_t section_bytes, Body&& body) {
  gradzip_bench::run_timed(state, exec, tensor * sizeof(float), [&] {
    body();
    benchmark::ClobberMemory();
  });
  state.counters["indices_per_s"] = benchmark::Counter(static_cast<double>(k) * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["bytes_per_index"] = static_cast<double>(section_bytes) / static_cast<double>(k);
  state.counters["density"] = static_cast<double>(k) / tensor;
}

template <class Indices>
void BM_encode(benchmark::State& state) {
  gradzip::host exec(1);
  const auto& idx = selected(state.range(0));
  std::vector<std::byte> ws;
  std::uint8_t encoding = 0;
  auto section = encoded<Indices>(exec, idx, ws, encoding);
  run(state, exec, idx.size(), section.size(), [&] {
    gradzip::detail::index_encoder<gradzip::host>::plan<Indices>(exec, idx.data(), idx.size(), tensor, ws.data(), encoding);
    gradzip::detail::index_encoder<gradzip::host>::encode(exec, encoding, idx.data(), idx.size(), tensor, ws.data(),
                                                          section.data());
  });
}

void BM_decode_coo(benchmark::State& state) {
  gradzip::host exec(1);
  const auto& idx = selected(state.range(0));
  std::vector<std::byte> ws;
  std::uint8_t encoding = 0;
  const auto section = encoded<gradzip::encode::coo>(exec, idx, ws, encoding);
  std::vector<std::uint64_t> out(idx.size());
  run(state, exec, idx.size(), section.size(), [&] {
    std::uint64_t previous = 0;
    bool ok = true;
    for (std::size_t j = 0; j < out.size(); ++j) {  // the checks COO's decoder makes
      const std::uint64_t i = gradzip::encode::coo::load(section.data(), 4, j);
      ok &= i < tensor && (j == 0 || i > previous);
      out[j] = previous = i;
    }
    benchmark::DoNotOptimize(ok);
  });
}

void BM_decode_bitmap(benchmark::State& state) {
  gradzip::host exec(1);
  const auto& idx = selected(state.range(0));
  std::vector<std::byte> ws;
  std::uint8_t encoding = 0;
  const auto section = encoded<gradzip::encode::bitmap>(exec, idx, ws, encoding);
  std::vector<std::uint64_t> out(idx.size());
  const std::uint64_t words = gradzip::encode::bitmap::words(tensor);
  run(state, exec, idx.size(), section.size(), [&] {
    std::uint64_t bits = 0;
    const auto s = gradzip::encode::bitmap::count_bits(section.data(), tensor, 0, words, bits);
    benchmark::DoNotOptimize(s);
    std::uint64_t* y = out.data();
    gradzip::encode::bitmap::for_each_index(section.data(), 0, words, 0, [&](std::uint64_t j, std::uint64_t i) { y[j] = i; });
  });
  if (out != idx) state.SkipWithError("bitmap decode disagrees with the indices");
}

void BM_decode_delta_varint(benchmark::State& state) {
  gradzip::host exec(1);
  const auto& idx = selected(state.range(0));
  std::vector<std::byte> ws;
  std::uint8_t encoding = 0;
  const auto section = encoded<gradzip::encode::delta_varint>(exec, idx, ws, encoding);
  std::vector<std::uint64_t> out(idx.size());
  const std::uint64_t chunks = gradzip::encode::delta_varint::chunks(idx.size());
  run(state, exec, idx.size(), section.size(), [&] {
    std::uint64_t* y = out.data();
    for (std::uint64_t c = 0; c < chunks; ++c) {
      const auto s = gradzip::encode::delta_varint::decode_chunk(section.data(), section.size(), idx.size(), tensor, 4, c,
                                                                 [&](std::uint64_t j, std::uint64_t i) { y[j] = i; });
      benchmark::DoNotOptimize(s);
    }
  });
  if (out != idx) state.SkipWithError("delta-varint decode disagrees with the indices");
}

void densities(benchmark::internal::Benchmark* b) {
  for (std::int64_t permille : {1, 10, 100}) b->Arg(permille);
}

}  // namespace

BENCHMARK_TEMPLATE(BM_encode, gradzip::encode::coo)->Apply(densities)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_encode, gradzip::encode::bitmap)->Apply(densities)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_encode, gradzip::encode::delta_varint)->Apply(densities)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_encode, gradzip::encode::automatic)->Apply(densities)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_coo)->Apply(densities)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_bitmap)->Apply(densities)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_delta_varint)->Apply(densities)->UseRealTime()->Unit(benchmark::kMicrosecond);
