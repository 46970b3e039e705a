// Host quantizers, dense, 2^16 .. 2^26 elements of fp32 and bf16: compress, and decompress_add
// (fused dequantize-accumulate into an fp32 buffer). Each reports input GB/s (input_GBps: the
// dense tensor's bytes, for both directions), its fraction of a plain copy of those bytes with
// the same threads measured in the same run (roofline), and payload bytes per element.
#include "common.hpp"

#if defined(__F16C__) && defined(__AVX2__)
#include <immintrin.h>
#endif
#include "gradzip/gradzip.hpp"

namespace {

namespace q = gradzip::quantize;
template <class Values>
using dense = gradzip::codec<gradzip::sparsify::none, Values, gradzip::encode::none>;

template <class T>
const std::vector<T>& input(std::size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return gradzip_bench::gradient(n);
  } else {
    static std::map<std::size_t, std::vector<T>> cache;
    auto it = cache.find(n);
    if (it == cache.end()) {
      const auto& g = gradzip_bench::gradient(n);
      std::vector<T> converted(n);
      for (std::size_t i = 0; i < n; ++i) converted[i] = gradzip::from_double<T>(g[i]);
      it = cache.emplace(n, std::move(converted)).first;
    }
    return it->second;
  }
}

template <class Values, class T>
void BM_compress(benchmark::State& state) {
  gradzip::host exec;
  const auto& x = input<T>(static_cast<std::size_t>(state.range(0)));
  const dense<Values> c{{}, Values{7}};
  std::vector<std::byte> out(c.template max_compressed_bytes<T>(x.size()));
  std::uint32_t step = 0;
  gradzip_bench::run_timed(state, exec, x.size() * sizeof(T), [&] {
    benchmark::DoNotOptimize(c.compress(exec, gradzip::span<const T>(x), gradzip::span<std::byte>(out), {step++, 0}));
  });
  state.counters["bytes_per_element"] = static_cast<double>(out.size()) / x.size();
}

template <class Values, class T>
void BM_decompress_add(benchmark::State& state) {
  gradzip::host exec;
  const auto& x = input<T>(static_cast<std::size_t>(state.range(0)));
  const dense<Values> c{{}, Values{7}};
  std::vector<std::byte> payload(c.template max_compressed_bytes<T>(x.size()));
  payload.resize(c.compress(exec, gradzip::span<const T>(x), gradzip::span<std::byte>(payload)));
  std::vector<float> accum(x.size(), 0.0f);
  gradzip_bench::run_timed(state, exec, x.size() * sizeof(T), [&] {
    c.decompress_add(exec, gradzip::span<const std::byte>(payload), gradzip::span<float>(accum));
    benchmark::ClobberMemory();
  });
  state.counters["bytes_per_element"] = static_cast<double>(payload.size()) / x.size();
}

/// The ceiling of every stochastic quantizer: only the random bits of n fp32 elements (16 each,
/// one Philox evaluation per eight elements, as the stages draw them), in the same 256-element
/// batches and threads, with nothing read or written. Its roofline is the best a stochastic
/// compress could reach here.
void BM_philox_words(benchmark::State& state) {
  gradzip::host exec;
  const auto n = static_cast<std::uint64_t>(state.range(0));
  const std::size_t chunks = std::max<std::size_t>(1, gradzip::detail::chunk_count(exec, n));
  std::vector<std::uint32_t> sink(chunks);
  std::uint32_t step = 0;
  gradzip_bench::run_timed(state, exec, n * sizeof(float), [&] {
    const gradzip::quantize::compress_context ctx{step++, 0};
    gradzip::detail::for_each_chunk(exec, chunks, [&](std::size_t c) {
      const auto r = gradzip::detail::chunk_of(n / 256, chunks, c);
      std::uint32_t words[256], folded = 0;
      for (std::uint64_t b = r.begin; b < r.end; ++b) {
        gradzip::detail::consecutive_half_words(7, ctx, b * 256, 256, words);
        folded ^= words[b & 255];
      }
      sink[c] = folded;
    });
    benchmark::DoNotOptimize(sink.data());
  });
}
BENCHMARK(BM_philox_words)->Name("philox_words_only/f32")->Apply(gradzip_bench::size_axis)->UseRealTime();

#if defined(__F16C__) && defined(__AVX2__)
/// What `torch`'s `.half()` and `.bfloat16()` compile to on this machine: a plain loop of
/// vcvtps2ph (fp16), or of AVX2 integer round-to-nearest-even without NaN handling (bf16, as
/// c10's vectorized conversion), over the same chunks and threads. The casts' reference.
template <bool Half>
void BM_plain_conversion(benchmark::State& state) {
  gradzip::host exec;
  const auto& x = gradzip_bench::gradient(static_cast<std::size_t>(state.range(0)));
  std::vector<std::uint16_t> out(x.size());
  const std::size_t chunks = gradzip::detail::chunk_count(exec, x.size());
  gradzip_bench::run_timed(state, exec, x.size() * sizeof(float), [&] {
    gradzip::detail::for_each_chunk(exec, chunks, [&](std::size_t c) {
      const auto r = gradzip::detail::chunk_of(x.size(), chunks, c);
      for (std::size_t i = r.begin; i + 8 <= r.end; i += 8) {
        const __m256 v = _mm256_loadu_ps(x.data() + i);
        __m128i h;
        if constexpr (Half) {
          h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        } else {
          const __m256i b = _mm256_castps_si256(v);
          const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
          const __m256i r16 = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7FFF)), odd), 16);
          h = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r16, r16), 0x08));
        }
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out.data() + i), h);
      }
    });
    benchmark::ClobberMemory();
  });
}
BENCHMARK_TEMPLATE(BM_plain_conversion, true)->Name("plain_f16c_loop/f32")->Apply(gradzip_bench::size_axis)->UseRealTime();
BENCHMARK_TEMPLATE(BM_plain_conversion, false)->Name("plain_bf16_loop/f32")->Apply(gradzip_bench::size_axis)->UseRealTime();
#endif

/// Every quantizer with a seed constructor; casts and `none` get one through this wrapper.
template <class Values>
struct seeded : Values {
  constexpr seeded() = default;
  explicit constexpr seeded(std::uint64_t) {}
};

using uniform4 = q::uniform<4>;
using uniform4_stochastic = q::uniform<4, q::rounding::stochastic>;
using qsgd4 = q::qsgd<7>;
using terngrad = q::terngrad<>;
using sign = seeded<q::sign<false>>;
using scaled_sign = seeded<q::scaled_sign>;
using onebit = seeded<q::onebit<>>;
using natural8 = q::natural<8>;

}  // namespace

#define GRADZIP_QUANTIZER_BENCH_TYPE(name, values, T, tname)                                     \
  BENCHMARK_TEMPLATE(BM_compress, values, T)->Name("compress/" name "/" tname)                  \
      ->Apply(gradzip_bench::size_axis)->UseRealTime();                                         \
  BENCHMARK_TEMPLATE(BM_decompress_add, values, T)->Name("decompress_add/" name "/" tname)      \
      ->Apply(gradzip_bench::size_axis)->UseRealTime()
#if GRADZIP_HAS_HALF
#define GRADZIP_QUANTIZER_BENCH(name, values)                      \
  GRADZIP_QUANTIZER_BENCH_TYPE(name, values, float, "f32");        \
  GRADZIP_QUANTIZER_BENCH_TYPE(name, values, __nv_bfloat16, "bf16")
#else
#define GRADZIP_QUANTIZER_BENCH(name, values) GRADZIP_QUANTIZER_BENCH_TYPE(name, values, float, "f32")
#endif

GRADZIP_QUANTIZER_BENCH("cast_fp16", seeded<q::cast_fp16>);
GRADZIP_QUANTIZER_BENCH("cast_bf16", seeded<q::cast_bf16>);
GRADZIP_QUANTIZER_BENCH("cast_fp8_e4m3", seeded<q::cast_fp8_e4m3>);
GRADZIP_QUANTIZER_BENCH("uniform4", seeded<uniform4>);
GRADZIP_QUANTIZER_BENCH("uniform4_stochastic", uniform4_stochastic);
GRADZIP_QUANTIZER_BENCH("qsgd4", qsgd4);
GRADZIP_QUANTIZER_BENCH("terngrad", terngrad);
GRADZIP_QUANTIZER_BENCH("sign", sign);
GRADZIP_QUANTIZER_BENCH("scaled_sign", scaled_sign);
GRADZIP_QUANTIZER_BENCH("onebit", onebit);
GRADZIP_QUANTIZER_BENCH("natural8", natural8);
