// lowrank::powersgd on the host: PyTorch's compress/skip rule, a plain reference step for step
// (bit for bit, including the canonical sum order), exact recovery of low-rank matrices, the
// power iteration's convergence with warm start, error feedback, checkpoints, bad payloads and
// bad parameters.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "common/synthetic_gradient.hpp"
#include "gradzip/lowrank/powersgd.hpp"

using namespace gradzip;
using lowrank::factor;

namespace {

using shapes_t = std::vector<std::vector<std::size_t>>;
using bytes_t = std::vector<std::byte>;

/// The canonical sum, written plainly: term t into lane t % 32, then the butterfly.
template <class Term>
float plain_sum(std::size_t n, Term term) {
  float lanes[32] = {};
  for (std::size_t t = 0; t < n; ++t) lanes[t % 32] += term(t);
  for (int offset = 16; offset >= 1; offset /= 2) {
    for (int l = 0; l < offset; ++l) lanes[l] += lanes[l + offset];
  }
  return lanes[0];
}

/// Gram-Schmidt as PyTorch's _orthogonalize_gram_schmidt, on columns of `length` floats.
void plain_orthogonalize(std::vector<float>& a, std::size_t length, int rank, float eps) {
  for (int k = 0; k < rank; ++k) {
    float* col = a.data() + k * length;
    const float d = std::sqrt(plain_sum(length, [&](std::size_t i) { return col[i] * col[i]; })) + eps;
    for (std::size_t i = 0; i < length; ++i) col[i] = d == 0.0f ? 0.0f : col[i] / d;
    for (int o = k + 1; o < rank; ++o) {
      float* rest = a.data() + o * length;
      const float dot = plain_sum(length, [&](std::size_t i) { return col[i] * rest[i]; });
      for (std::size_t i = 0; i < length; ++i) rest[i] -= dot * col[i];
    }
  }
}

/// One rank's state in the reference: a single rows x cols matrix.
struct plain_worker {
  std::size_t rows, cols;
  int rank;
  std::vector<float> residual, m;
};

/// The reference step over `workers` (each its own gradient), shared Q: returns the output and
/// updates the residuals and q (the warm start).
std::vector<float> plain_step(std::vector<plain_worker>& workers, const std::vector<std::vector<float>>& grads,
                              std::vector<float>& q, float eps, bool error_feedback) {
  const std::size_t rows = workers[0].rows, cols = workers[0].cols;
  const int r = workers[0].rank;
  std::vector<float> q0 = q;
  plain_orthogonalize(q0, cols, r, eps);
  std::vector<float> p_sum(rows * r, 0.0f);
  for (std::size_t w = 0; w < workers.size(); ++w) {
    auto& wk = workers[w];
    wk.m.resize(rows * cols);
    for (std::size_t i = 0; i < rows * cols; ++i) wk.m[i] = error_feedback ? grads[w][i] + wk.residual[i] : grads[w][i];
    for (int c = 0; c < r; ++c) {
      for (std::size_t i = 0; i < rows; ++i) {
        p_sum[c * rows + i] += plain_sum(cols, [&](std::size_t j) { return wk.m[i * cols + j] * q0[c * cols + j]; });
      }
    }
  }
  plain_orthogonalize(p_sum, rows, r, eps);
  std::vector<float> q_sum(cols * r, 0.0f);
  for (auto& wk : workers) {
    for (int c = 0; c < r; ++c) {
      for (std::size_t j = 0; j < cols; ++j) {
        q_sum[c * cols + j] += plain_sum(rows, [&](std::size_t i) { return wk.m[i * cols + j] * p_sum[c * rows + i]; });
      }
    }
  }
  for (std::size_t k = 0; k < q.size(); ++k) q[k] = q_sum[k] / static_cast<float>(workers.size());
  std::vector<float> out(rows * cols);
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < cols; ++j) {
      float v = 0.0f;
      for (int c = 0; c < r; ++c) v += p_sum[c * rows + i] * q[c * cols + j];
      out[i * cols + j] = v;
    }
  }
  for (auto& wk : workers) {
    if (error_feedback) {
      for (std::size_t i = 0; i < rows * cols; ++i) wk.residual[i] = wk.m[i] - out[i];
    }
  }
  return out;
}

using ps_t = lowrank::powersgd<float, host>;

/// One step of `ranks` compressors sharing one host, summing payloads in rank order as an
/// allreduce would: every rank's output (the same), written into grads.
void step_all(host& exec, std::vector<ps_t>& ranks, std::vector<std::vector<float>>& grads, std::uint32_t step) {
  const std::size_t k = ranks.size();
  std::vector<bytes_t> p(k, bytes_t(ranks[0].payload_bytes(factor::p))), q(k, bytes_t(ranks[0].payload_bytes(factor::q)));
  for (std::size_t r = 0; r < k; ++r) {
    ranks[r].compress_p(exec, span<const float>(grads[r]), span<std::byte>(p[r]), {step, 3});
  }
  auto sum_into_all = [&](std::vector<bytes_t>& payloads, factor f) {
    span<float> first = ranks[0].factors(span<std::byte>(payloads[0]), f);
    std::vector<float> total(first.begin(), first.end());
    for (std::size_t r = 1; r < k; ++r) {
      span<float> v = ranks[r].factors(span<std::byte>(payloads[r]), f);
      for (std::size_t i = 0; i < total.size(); ++i) total[i] += v[i];
    }
    for (std::size_t r = 0; r < k; ++r) {
      span<float> v = ranks[r].factors(span<std::byte>(payloads[r]), f);
      std::copy(total.begin(), total.end(), v.begin());
    }
  };
  sum_into_all(p, factor::p);
  for (std::size_t r = 0; r < k; ++r) ranks[r].compress_q(exec, span<const std::byte>(p[r]), span<std::byte>(q[r]));
  sum_into_all(q, factor::q);
  for (std::size_t r = 0; r < k; ++r) {
    ranks[r].decompress(exec, span<const std::byte>(q[r]), static_cast<int>(k), span<float>(grads[r]));
  }
}

double relative_error(const std::vector<float>& approx, const std::vector<float>& exact, std::size_t begin,
                      std::size_t n) {
  double e = 0.0, s = 0.0;
  for (std::size_t i = begin; i < begin + n; ++i) {
    e += (static_cast<double>(approx[i]) - exact[i]) * (static_cast<double>(approx[i]) - exact[i]);
    s += static_cast<double>(exact[i]) * exact[i];
  }
  return std::sqrt(e / s);
}

/// A rows x cols matrix of rank `rank`: sum over c of sin((c+1)(0.01 i + 1)) cos((c+2)(0.02 j) + c).
std::vector<float> low_rank_matrix(std::size_t rows, std::size_t cols, int rank) {
  std::vector<float> m(rows * cols, 0.0f);
  for (int c = 0; c < rank; ++c) {
    for (std::size_t i = 0; i < rows; ++i) {
      for (std::size_t j = 0; j < cols; ++j) {
        m[i * cols + j] += static_cast<float>(std::sin((c + 1) * (0.01 * i + 1)) * std::cos((c + 2) * 0.02 * j + c));
      }
    }
  }
  return m;
}

}  // namespace

TEST_CASE("powersgd plans tensors as PyTorch's hook does", "[powersgd]") {
  lowrank::powersgd_params params;
  params.rank = 4;
  const lowrank::powersgd_plan plan({{128, 784}, {128}, {10, 128}, {10}, {}, {0, 5}, {3, 4, 5}}, params);
  const auto& t = plan.tensors();
  REQUIRE(t.size() == 7);
  CHECK(t[0].compressed());  // (128 + 784) 4 2 < 100352
  CHECK(t[0].rank == 4);
  CHECK_FALSE(t[1].compressed());  // 1-D: (128 + 1) 1 2 > 128
  CHECK(t[2].compressed());        // (10 + 128) 4 2 = 1104 < 1280
  CHECK_FALSE(t[3].compressed());
  CHECK(t[4].rows == 1);  // 0-D: one element
  CHECK(t[4].cols == 1);
  CHECK_FALSE(t[5].compressed());  // no elements
  CHECK(t[6].rows == 3);
  CHECK(t[6].cols == 20);
  CHECK_FALSE(t[6].compressed());  // rank min(3, 20, 4) = 3: 23 3 2 > 60
  CHECK(t[2].offset == 128 * 784 + 128);
  CHECK(plan.size() == 128 * 784 + 128 + 1280 + 10 + 1 + 0 + 60);
  CHECK(plan.matrices() == 2);
  CHECK(plan.compressed_elements() == 128 * 784 + 1280);
  CHECK(plan.dense_elements() == 128 + 10 + 1 + 60);
  CHECK(plan.factor_elements(factor::p) == (128 + 10) * 4);
  CHECK(plan.factor_elements(factor::q) == (784 + 128) * 4);
  CHECK(t[2].p_offset == 128 * 4);
  CHECK(t[2].q_offset == 784 * 4);

  params.rank = 8;  // (10 + 128) 8 2 = 2208 > 1280: now dense
  CHECK_FALSE(lowrank::powersgd_plan({{10, 128}}, params).tensors()[0].compressed());
  params.min_compression_rate = 0.5f;
  CHECK(lowrank::powersgd_plan({{10, 128}}, params).tensors()[0].rank == 8);
}

TEST_CASE("powersgd names a bad parameter and its value", "[powersgd]") {
  host exec(1);
  auto make = [&](lowrank::powersgd_params p) { ps_t ps(exec, {{8, 8}}, p); };
  lowrank::powersgd_params p;
  p.rank = 0;
  CHECK_THROWS_WITH(make(p), Catch::Contains("rank must be >= 1, got 0"));
  p = {};
  p.min_compression_rate = -1.0f;
  CHECK_THROWS_WITH(make(p), Catch::Contains("min_compression_rate must be finite and >= 0, got -1"));
  p = {};
  p.epsilon = std::nanf("");
  CHECK_THROWS_WITH(make(p), Catch::Contains("epsilon must be finite and >= 0"));
  p = {};
  p.rank = 2;
  ps_t ps(exec, {{16, 16}}, p);
  std::vector<float> g(256, 1.0f), small(255);
  bytes_t out(ps.payload_bytes(factor::p)), q(ps.payload_bytes(factor::q));
  CHECK_THROWS_WITH(ps.compress_p(exec, span<const float>(small), span<std::byte>(out)),
                    Catch::Contains("gradient has 255 elements, the bucket 256"));
  CHECK_THROWS_WITH(ps.compress_p(exec, span<const float>(g), span<std::byte>(out.data(), out.size() - 16)),
                    Catch::Contains("the P payload needs"));
  CHECK_THROWS_WITH(ps.compress_q(exec, span<const std::byte>(out), span<std::byte>(q)),
                    Catch::Contains("no compress_p since the last decompress"));
  ps.compress_p(exec, span<const float>(g), span<std::byte>(out));
  CHECK_THROWS_WITH(ps.decompress(exec, span<const std::byte>(q), 1, span<float>(g)),
                    Catch::Contains("no compress_q since the last compress_p"));
  ps.compress_q(exec, span<const std::byte>(out), span<std::byte>(q));
  CHECK_THROWS_WITH(ps.decompress(exec, span<const std::byte>(q), 0, span<float>(g)),
                    Catch::Contains("ranks must be >= 1, got 0"));
}

TEST_CASE("powersgd follows a plain reference bit for bit over three ranks and four steps", "[powersgd]") {
  const std::size_t rows = 70, cols = 45;  // neither a multiple of 32
  for (const bool warm : {true, false}) {
    for (const bool ef : {true, false}) {
      for (const int r : {1, 3, 6}) {
        INFO("warm start " << warm << ", error feedback " << ef << ", rank " << r);
        lowrank::powersgd_params params;
        params.rank = r;
        params.warm_start = warm;
        params.error_feedback = ef;
        params.seed = 11;
        params.epsilon = 1e-8f;
        host exec(2);
        std::vector<ps_t> ranks;
        std::vector<plain_worker> plain;
        for (int k = 0; k < 3; ++k) {
          ranks.emplace_back(exec, shapes_t{{rows, cols}}, params);
          plain.push_back({rows, cols, r, std::vector<float>(rows * cols, 0.0f), {}});
        }
        std::vector<float> q(cols * r);
        for (std::uint32_t step = 0; step < 4; ++step) {
          std::vector<std::vector<float>> grads;
          for (int k = 0; k < 3; ++k) grads.push_back(gradzip_tools::synthetic_gradient<float>(rows * cols, 40 + 3 * step + k));
          if (step == 0 || !warm) {
            for (std::size_t k = 0; k < q.size(); ++k) q[k] = lowrank::initial_q(11, step, 3, k);
          }
          const auto expected = plain_step(plain, grads, q, 1e-8f, ef);
          step_all(exec, ranks, grads, step);
          for (int k = 0; k < 3; ++k) REQUIRE(grads[k] == expected);
          if (ef) {
            bytes_t state = ranks[1].save(exec);  // residual first
            const auto h = wire::read_header(span<const std::byte>(state));
            std::vector<float> residual(rows * cols);
            std::memcpy(residual.data(), state.data() + h.sections[0].offset, residual.size() * 4);
            REQUIRE(residual == plain[1].residual);
          }
        }
      }
    }
  }
}

TEST_CASE("powersgd recovers a rank-r matrix in one step, and converges to the best rank-r error with warm start",
          "[powersgd]") {
  host exec;
  for (const int r : {1, 2, 4}) {
    INFO("rank " << r);
    const std::size_t rows = 96, cols = 200;
    lowrank::powersgd_params params;
    params.rank = r;
    params.error_feedback = false;
    ps_t ps(exec, {{rows, cols}}, params);
    std::vector<float> g = low_rank_matrix(rows, cols, r), out = g;
    bytes_t p(ps.payload_bytes(factor::p)), q(ps.payload_bytes(factor::q));
    ps.compress_p(exec, span<const float>(g), span<std::byte>(p));
    ps.compress_q(exec, span<const std::byte>(p), span<std::byte>(q));
    ps.decompress(exec, span<const std::byte>(q), 1, span<float>(out));
    CHECK(relative_error(out, g, 0, g.size()) < 1e-5);
  }
  // M = sum_k s_k u_k v_k^T with orthonormal u, v and s = 1, 0.8, 0.6, 0.4, 0.2: the best rank-2
  // error is sqrt(0.36 + 0.16 + 0.04) / sqrt(2.2). Power iteration with warm start reaches it.
  const std::size_t rows = 64, cols = 80;
  const double s[5] = {1.0, 0.8, 0.6, 0.4, 0.2};
  std::vector<float> u = gradzip_tools::synthetic_gradient<float>(rows * 5, 7), v =
                                                                                  gradzip_tools::synthetic_gradient<float>(cols * 5, 8);
  host one(1);
  auto orthonormal = [&](std::vector<float>& a, std::size_t length) {
    gradzip::detail::lowrank_backend<host>::orthogonalize(one, a.data(), length, 5, 0.0f, nullptr);
  };
  orthonormal(u, rows);
  orthonormal(v, cols);
  std::vector<float> m(rows * cols, 0.0f);
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < cols; ++j) {
      double x = 0.0;
      for (int k = 0; k < 5; ++k) x += s[k] * u[k * rows + i] * v[k * cols + j];
      m[i * cols + j] = static_cast<float>(x);
    }
  }
  const double best = std::sqrt(0.36 + 0.16 + 0.04) / std::sqrt(2.2);
  lowrank::powersgd_params params;
  params.rank = 2;
  params.error_feedback = false;
  ps_t ps(exec, {{rows, cols}}, params);
  bytes_t p(ps.payload_bytes(factor::p)), q(ps.payload_bytes(factor::q));
  double first = 0.0, last = 0.0;
  for (std::uint32_t step = 0; step < 30; ++step) {
    std::vector<float> out = m;
    ps.compress_p(exec, span<const float>(m), span<std::byte>(p), {step, 0});
    ps.compress_q(exec, span<const std::byte>(p), span<std::byte>(q));
    ps.decompress(exec, span<const std::byte>(q), 1, span<float>(out));
    (step == 0 ? first : last) = relative_error(out, m, 0, m.size());
  }
  INFO("first step " << first << ", step 30 " << last << ", best " << best);
  CHECK(last < first);
  CHECK(last < best * 1.001);
}

TEST_CASE("powersgd leaves uncompressed tensors alone, handles every element type and any thread count",
          "[powersgd]") {
  lowrank::powersgd_params params;
  params.rank = 6;  // two rank tiles
  // 700 x 200: 140,000 elements, two chunks of rows (and of 128-column blocks) on two threads.
  const shapes_t shapes{{700, 200}, {40}, {20, 33}};
  const std::size_t first_size = 700 * 200, n = first_size + 40 + 20 * 33;
  const auto g = gradzip_tools::synthetic_gradient<float>(n, 9);
  auto run = [&](int threads) {
    host exec(threads);
    ps_t ps(exec, shapes, params);
    bytes_t p(ps.payload_bytes(factor::p)), q(ps.payload_bytes(factor::q));
    std::vector<float> out = g;
    ps.compress_p(exec, span<const float>(g), span<std::byte>(p), {5, 1});
    ps.compress_q(exec, span<const std::byte>(p), span<std::byte>(q));
    ps.decompress(exec, span<const std::byte>(q), 1, span<float>(out));
    return std::make_pair(p, out);
  };
  const auto one = run(1), two = run(2);
  CHECK(one.first == two.first);
  CHECK(one.second == two.second);
  for (std::size_t i = first_size; i < first_size + 40; ++i) REQUIRE(one.second[i] == g[i]);  // the 1-D tensor

  // bf16 and double gradients: the matrices are the gradients as floats, the output rounded back.
  auto typed = [&](auto zero) {
    using T = decltype(zero);
    host exec(1);
    lowrank::powersgd<T, host> ps(exec, shapes, params);
    std::vector<T> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = gradzip::from_double<T>(g[i]);
    std::vector<float> as_float(n);
    for (std::size_t i = 0; i < n; ++i) as_float[i] = static_cast<float>(to_float(x[i]));
    bytes_t p(ps.payload_bytes(factor::p)), q(ps.payload_bytes(factor::q));
    ps.compress_p(exec, span<const T>(x), span<std::byte>(p), {5, 1});
    ps.compress_q(exec, span<const std::byte>(p), span<std::byte>(q));
    ps.decompress(exec, span<const std::byte>(q), 1, span<T>(x));
    ps_t reference(exec, shapes, params);
    bytes_t rp(p.size()), rq(q.size());
    reference.compress_p(exec, span<const float>(as_float), span<std::byte>(rp), {5, 1});
    reference.compress_q(exec, span<const std::byte>(rp), span<std::byte>(rq));
    reference.decompress(exec, span<const std::byte>(rq), 1, span<float>(as_float));
    CHECK(rp == p);
    for (std::size_t i = 0; i < first_size; ++i) {
      REQUIRE(to_float(x[i]) == to_float(gradzip::from_double<T>(as_float[i])));
    }
  };
  typed(__nv_bfloat16{});
  typed(0.0);
  // Uncompressed elements are averaged in their own precision: double stays double.
  CHECK(lowrank::averaged(1.0 + 1e-12, 1.0f) == 1.0 + 1e-12);
  CHECK(lowrank::averaged(0.1, 4.0f) == 0.1 / 4.0);
  CHECK(lowrank::averaged(0.1f, 4.0f) == 0.1f / 4.0f);
}

TEST_CASE("powersgd checkpoints: a restored state continues bit for bit", "[powersgd]") {
  for (const bool warm : {true, false}) {
    for (const bool ef : {true, false}) {
      INFO("warm start " << warm << ", error feedback " << ef);
      lowrank::powersgd_params params;
      params.rank = 3;
      params.warm_start = warm;
      params.error_feedback = ef;
      host exec(1);
      const shapes_t shapes{{50, 60}};
      ps_t a(exec, shapes, params);
      std::vector<float> g;
      bytes_t p(a.payload_bytes(factor::p)), q(a.payload_bytes(factor::q));
      auto step = [&](ps_t& ps, std::uint32_t s) {
        g = gradzip_tools::synthetic_gradient<float>(3000, 70 + s);
        ps.compress_p(exec, span<const float>(g), span<std::byte>(p), {s, 0});
        ps.compress_q(exec, span<const std::byte>(p), span<std::byte>(q));
        ps.decompress(exec, span<const std::byte>(q), 1, span<float>(g));
        return g;
      };
      CHECK(a.save(exec).empty() == !ef);  // nothing to save before a step without error feedback
      step(a, 0);
      step(a, 1);
      const bytes_t state = a.save(exec);
      ps_t b(exec, shapes, params);
      b.restore(exec, span<const std::byte>(state));
      CHECK(b.save(exec) == state);
      for (std::uint32_t s = 2; s < 4; ++s) CHECK(step(a, s) == step(b, s));

      if (!state.empty()) {  // damaged states change nothing
        bytes_t bad = state;
        bad.push_back(std::byte{0});
        ps_t c(exec, shapes, params);
        const bytes_t before = c.save(exec);
        CHECK_THROWS_AS(c.restore(exec, span<const std::byte>(bad)), format_error);
        bad = state;
        bad[16] = std::byte{0x7F};  // the element count
        CHECK_THROWS_AS(c.restore(exec, span<const std::byte>(bad)), format_error);
        CHECK(c.save(exec) == before);
      }
    }
  }
}

TEST_CASE("powersgd rejects a payload that is not this bucket's factor, and changes nothing", "[powersgd]") {
  lowrank::powersgd_params params;
  params.rank = 2;
  host exec(1);
  const shapes_t shapes{{32, 48}};
  ps_t ps(exec, shapes, params);
  const auto g = gradzip_tools::synthetic_gradient<float>(32 * 48, 3);
  bytes_t p(ps.payload_bytes(factor::p)), q(ps.payload_bytes(factor::q));
  ps.compress_p(exec, span<const float>(g), span<std::byte>(p));
  // The Q payload of a step where a P payload belongs: the factor byte differs.
  ps.compress_q(exec, span<const std::byte>(p), span<std::byte>(q));
  std::vector<float> out = g;
  const bytes_t before = ps.save(exec);
  CHECK_THROWS_WITH(ps.decompress(exec, span<const std::byte>(p), 1, span<float>(out)),
                    Catch::Contains("powersgd::decompress (Q payload)"));
  struct damage {
    std::size_t at;
    std::uint8_t value;
    const char* what;
  };
  for (const damage d : {damage{0, 0x00, "magic"}, damage{9, 1, "codec"}, damage{96, 0, "parameter"},
                         damage{100, 3, "parameter"}, damage{16, 99, "element count"}}) {
    INFO(d.what);
    bytes_t bad = q;
    bad[d.at] = static_cast<std::byte>(d.value);
    CHECK_THROWS_AS(ps.decompress(exec, span<const std::byte>(bad), 1, span<float>(out)), format_error);
  }
  CHECK_THROWS_AS(ps.decompress(exec, span<const std::byte>(q.data(), q.size() - 16), 1, span<float>(out)),
                  format_error);
  CHECK(out == g);                    // nothing was written
  CHECK(ps.save(exec) == before);     // neither the residual nor the warm-start Q moved
  // A received payload may sit at any address on the host; payloads written here must be aligned.
  bytes_t shifted(q.size() + 1);
  std::copy(q.begin(), q.end(), shifted.begin() + 1);
  ps.decompress(exec, span<const std::byte>(shifted.data() + 1, q.size()), 1, span<float>(out));  // completes
  CHECK(out != g);
  ps.compress_p(exec, span<const float>(g), span<std::byte>(p));
  bytes_t room(p.size() + 1);
  CHECK_THROWS_WITH(ps.compress_q(exec, span<const std::byte>(p), span<std::byte>(room.data() + 1, q.size())),
                    Catch::Contains("must be 4-byte aligned"));
}
