/**
 * @file powersgd.hpp
 * @brief `lowrank::powersgd<T, Exec>`: PowerSGD (Vogels, Karimireddy, Jaggi, NeurIPS 2019,
 * "PowerSGD: Practical Low-Rank Gradient Compression for Distributed Optimization"), with the
 * behaviour of PyTorch's `powerSGD_hook` over one bucket of tensors.
 *
 * Each tensor of the bucket is viewed as a matrix as PyTorch does (rows = its first dimension,
 * cols = the product of the others). A matrix M gains when (rows + cols) r min_compression_rate
 * < rows cols, with r = min(rows, cols, rank); the others go uncompressed, through one dense
 * allreduce (at a rate of 1 or more, every 1-D tensor does). For the compressed ones, with
 * error feedback e and a shared Q (cols x r), one step is
 *
 *     M  <- grad + e
 *     P  <- M Q                            allreduce P (payload 1)
 *     P  <- orthogonalize(P)               Gram-Schmidt, column k divided by |P_k| + epsilon
 *     Q  <- M^T P                          allreduce Q (payload 2), then Q <- Q / ranks
 *     grad <- P Q^T,   e <- M - P Q^T
 *
 * With warm start, the next step starts from this Q, orthogonalized; else (and on the first step)
 * from a random Q, orthogonalized. Both payloads are summable: every rank's frame is the same and
 * the sum of the values sections is the factor of the sum, so each is one allreduce of floats
 * (`comm::powersgd_allreducer` runs the whole step over a communicator).
 *
 * Determinism. Every sum has a fixed order on both executors (lane j of 32 adds terms j, j + 32,
 * ... in order, then the 32 partials combine in an xor butterfly, as bucket statistics do), and
 * each product and sum is rounded on its own. The initial Q is uniform on [-1, 1) from Philox,
 * keyed by (seed, step, tensor id): exact integer arithmetic, where PyTorch draws N(0, 1)
 * through libm functions whose last bit differs between the CPU and CUDA. The power iteration
 * needs only a start that is not orthogonal to the top singular vectors, which any continuous
 * distribution gives with probability 1. So the payloads, the residual and the output are the
 * same bytes on the host, on CUDA, and for any thread count (docs/lowrank.md).
 *
 * @code
 * gradzip::lowrank::powersgd_params params;
 * params.rank = 4;
 * gradzip::lowrank::powersgd<float, gradzip::host> ps(exec, {{128, 784}, {128}, {10, 128}, {10}}, params);
 * std::vector<std::byte> p(ps.payload_bytes(gradzip::lowrank::factor::p)), q(ps.payload_bytes(gradzip::lowrank::factor::q));
 * ps.compress_p(exec, grad, p, {step, 0});     // allreduce ps.factors(p) (floats) over the ranks
 * ps.compress_q(exec, p, q);                   // allreduce ps.factors(q)
 * ps.decompress(exec, q, workers, grad);       // the compressed tensors of grad now hold P Q^T
 * @endcode
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "gradzip/core/element_type.hpp"
#include "gradzip/core/error.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/core/span.hpp"
#include "gradzip/feedback/dense_state.hpp"
#include "gradzip/quantize/bucket_stats.hpp"
#include "gradzip/random/philox.hpp"
#include "gradzip/wire/reader.hpp"
#include "gradzip/wire/writer.hpp"

namespace gradzip::lowrank {

/// PowerSGD's settings; the names are PyTorch's PowerSGDState's where it has them.
struct powersgd_params {
  int rank = 1;                       ///< matrix_approximation_rank, >= 1 (each matrix uses min(rows, cols, rank))
  float min_compression_rate = 2.0f;  ///< compress a matrix only when it shrinks more than this
  float epsilon = 0.0f;               ///< orthogonalization_epsilon: column k is divided by |P_k| + epsilon
  bool warm_start = true;             ///< start each step from the last step's Q
  bool error_feedback = true;         ///< use_error_feedback
  std::uint64_t seed = 0;             ///< keys the initial Q (the same on every rank)

  void validate() const {
    GRADZIP_EXPECTS(rank >= 1, "powersgd: rank must be >= 1, got ", rank);
    GRADZIP_EXPECTS(std::isfinite(min_compression_rate) && min_compression_rate >= 0.0f,
                    "powersgd: min_compression_rate must be finite and >= 0, got ", min_compression_rate);
    GRADZIP_EXPECTS(std::isfinite(epsilon) && epsilon >= 0.0f, "powersgd: epsilon must be finite and >= 0, got ",
                    epsilon);
  }
};

/// The two payloads of a step.
enum class factor : std::uint8_t { p = 0, q = 1 };

/// Structure id of PowerSGD's factor payloads (docs/format.md).
inline constexpr std::uint8_t structure_id = 9;

/// Where one tensor of a bucket lies, and how it is compressed.
struct tensor_plan {
  std::size_t offset = 0;  ///< first element in the bucket's flat buffer
  std::size_t rows = 0;    ///< the tensor's first dimension (1 for a 0-D tensor)
  std::size_t cols = 0;    ///< the product of its other dimensions (1 for a 1-D tensor)
  int rank = 0;            ///< min(rows, cols, rank) when compressed; 0 when it goes dense
  std::size_t m_offset = 0, p_offset = 0, q_offset = 0;  ///< in M (rows x cols), P (rows x r) and Q (cols x r)
  std::size_t size() const { return rows * cols; }
  bool compressed() const { return rank != 0; }
};

/// A bucket's tensors in order, laid out back to back in one flat buffer, as PyTorch's bucket
/// is: which are compressed and where their matrices and factors live.
class powersgd_plan {
 public:
  powersgd_plan() = default;
  /// `shapes`: each tensor's dimensions, in the bucket's order.
  powersgd_plan(const std::vector<std::vector<std::size_t>>& shapes, const powersgd_params& params) {
    params.validate();
    tensors_.reserve(shapes.size());
    for (std::size_t t = 0; t < shapes.size(); ++t) {
      tensor_plan p;
      p.offset = size_;
      p.rows = shapes[t].empty() ? 1 : shapes[t][0];
      p.cols = 1;
      for (std::size_t d = 1; d < shapes[t].size(); ++d) p.cols = checked_product(p.cols, shapes[t][d], t);
      const std::size_t n = checked_product(p.rows, p.cols, t);
      const std::size_t r = std::min<std::size_t>({p.rows, p.cols, static_cast<std::size_t>(params.rank)});
      // PyTorch's _should_compress: (rows + cols) r rate < rows cols, in floating point.
      if (r != 0 && static_cast<double>(p.rows + p.cols) * static_cast<double>(r) * params.min_compression_rate <
                        static_cast<double>(n)) {
        p.rank = static_cast<int>(r);
        p.m_offset = m_elements_;
        p.p_offset = p_elements_;
        p.q_offset = q_elements_;
        m_elements_ += n;
        p_elements_ += p.rows * r;
        q_elements_ += p.cols * r;
        ++matrices_;
      } else {
        dense_elements_ += n;
      }
      size_ = checked_sum(size_, n, t);
      tensors_.push_back(p);
    }
  }

  const std::vector<tensor_plan>& tensors() const noexcept { return tensors_; }
  std::size_t size() const noexcept { return size_; }                      ///< elements of the bucket
  std::size_t matrices() const noexcept { return matrices_; }              ///< tensors compressed
  std::size_t compressed_elements() const noexcept { return m_elements_; }
  std::size_t dense_elements() const noexcept { return dense_elements_; }  ///< elements allreduced as they are
  std::size_t factor_elements(factor f) const noexcept { return f == factor::p ? p_elements_ : q_elements_; }

 private:
  static std::size_t checked_product(std::size_t a, std::size_t b, std::size_t t) {
    GRADZIP_EXPECTS(b == 0 || a <= std::numeric_limits<std::size_t>::max() / b, "powersgd: tensor ", t,
                    " has more elements than a size_t holds");
    return a * b;
  }
  static std::size_t checked_sum(std::size_t a, std::size_t b, std::size_t t) {
    GRADZIP_EXPECTS(a <= std::numeric_limits<std::size_t>::max() - b, "powersgd: the bucket overflows a size_t at tensor ",
                    t);
    return a + b;
  }

  std::vector<tensor_plan> tensors_;
  std::size_t size_ = 0, matrices_ = 0, m_elements_ = 0, p_elements_ = 0, q_elements_ = 0, dense_elements_ = 0;
};

// ---------------------------------------------------------------------------------------------
// The math, shared by both executors.

/// Entry k of the bucket's initial Q: uniform on [-1, 1), exactly 2u - 1 for Philox's 24-bit u.
GRADZIP_HOST_DEVICE inline float initial_q(std::uint64_t seed, std::uint32_t step, std::uint32_t tensor_id,
                                           std::uint64_t k) {
  const float u = uniform_float(random_word(seed, step, tensor_id, k));
  return gradzip::detail::add_rn(gradzip::detail::mul_rn(2.0f, u), -1.0f);  // both exact
}

/// Column k of Gram-Schmidt: the divisor |P_k| + epsilon, from the canonical sum of squares.
/// Zero (a zero column with epsilon 0) means: set the column to zero rather than to NaN.
GRADZIP_HOST_DEVICE inline float normalizer(float sum_of_squares, float epsilon) {
  return gradzip::detail::add_rn(gradzip::detail::sqrt_rn(sum_of_squares), epsilon);
}

/// An uncompressed element's average, x / ranks, in x's precision: double for double, float for
/// the others (PyTorch divides in the tensor's type; its 16-bit division computes in float).
template <class T>
GRADZIP_HOST_DEVICE inline T averaged(T x, float ranks) {
  if constexpr (std::is_same_v<T, double>) {
    return x / static_cast<double>(ranks);
  } else {
    return from_double<T>(gradzip::detail::div_rn(static_cast<float>(to_float(x)), ranks));
  }
}

// ---------------------------------------------------------------------------------------------
// The payload frame: a params section and the factor's floats.
//
// | params byte | field |
// | 0 | u8 factor: 0 P, 1 Q |
// | 1-3 | zero |
// | 4 | u32 rank (the requested one) |
// | 8 | u32 matrices compressed |
// | 12 | u32 zero |

inline constexpr std::uint64_t params_bytes = 16;

struct frame {
  factor which = factor::p;
  std::uint32_t rank = 0;
  std::uint32_t matrices = 0;
  std::uint64_t elements = 0;  ///< floats in the values section

  GRADZIP_HOST_DEVICE wire::payload_layout layout() const {
    wire::payload_layout l;
    l.add(wire::tag::params, params_bytes);
    l.add(wire::tag::values, elements * sizeof(float));
    return l;
  }
  GRADZIP_HOST_DEVICE std::uint64_t total_bytes() const { return layout().total_bytes(); }
  GRADZIP_HOST_DEVICE std::uint64_t values_offset() const { return layout().at(1).offset; }
  GRADZIP_HOST_DEVICE static constexpr wire::codec_id codec() { return wire::codec_id{0, structure_id, 0, 0}; }

  /// Header, section table, params and padding (the values are the caller's).
  GRADZIP_HOST_DEVICE void write(std::uint8_t* out) const {
    const wire::payload_layout l = layout();
    wire::write_header(out, l, element_type::f32, codec(), elements);
    wire::zero_section_padding(out, l);
    std::uint8_t* params = out + l.at(0).offset;
    for (std::uint64_t i = 0; i < params_bytes; ++i) params[i] = 0;
    params[0] = static_cast<std::uint8_t>(which);
    wire::detail::store_le(params + 4, rank, 4);
    wire::detail::store_le(params + 8, matrices, 4);
  }

  /// Validates a payload against this frame: everything but the values must be what `write`
  /// wrote.
  GRADZIP_HOST_DEVICE wire::status check(const std::uint8_t* bytes, std::uint64_t size) const {
    wire::header h;
    wire::status s = wire::parse_header(bytes, size, h);
    if (!s.ok()) return s;
    const wire::tag tags[2] = {wire::tag::params, wire::tag::values};
    s = wire::expect_frame(h, codec().packed(), tags, 2, params_bytes);
    if (!s.ok()) return s;
    if (h.type != element_type::f32) {
      return wire::fail(wire::format_errc::element_type_mismatch, static_cast<std::uint64_t>(h.type),
                        static_cast<std::uint64_t>(element_type::f32));
    }
    if (h.element_count != elements) return wire::fail(wire::format_errc::size_mismatch, h.element_count, elements);
    const wire::param_field fields[5] = {{0, 1, static_cast<std::uint64_t>(which)}, {1, 3, 0}, {4, 4, rank},
                                         {8, 4, matrices}, {12, 4, 0}};
    s = wire::expect_params(bytes, h.sections[0].offset, fields, 5);
    if (!s.ok()) return s;
    if (h.sections[1].size != elements * sizeof(float)) {
      return wire::fail(wire::format_errc::bad_section_size, 1, h.sections[1].size, elements * sizeof(float));
    }
    return {};
  }
};

}  // namespace gradzip::lowrank

namespace gradzip::detail {
/// Loops (host, detail/host/lowrank.hpp) and kernels (CUDA, detail/cuda/lowrank.cuh).
template <class Exec>
struct lowrank_backend;
}  // namespace gradzip::detail

#include "gradzip/detail/host/lowrank.hpp"

namespace gradzip::lowrank {

/**
 * PowerSGD over one bucket: its state (the residual e, the warm-start Q, and a step's M and P)
 * sized at construction, in the executor's memory. The three calls of a step come in order
 * (compress_p, compress_q, decompress); the first two change no state, so a step abandoned
 * before decompress (a failed collective) can simply start over. T is the gradient's type; the
 * matrices and factors are float.
 */
template <class T, class Exec>
class powersgd {
  static_assert(is_element_v<T>, "powersgd<T, Exec>: T must be float, double, __half or __nv_bfloat16");
  using ops = gradzip::detail::executor_ops<Exec>;
  using backend = gradzip::detail::lowrank_backend<Exec>;

 public:
  powersgd(Exec& exec, const std::vector<std::vector<std::size_t>>& shapes, powersgd_params params)
      : params_(params),
        plan_(shapes, params),
        residual_(ops::template allocate_zeroed<float>(exec, params.error_feedback ? plan_.compressed_elements() : 0)),
        m_(ops::template allocate_zeroed<float>(exec, plan_.compressed_elements())),
        p_(ops::template allocate_zeroed<float>(exec, plan_.factor_elements(factor::p))),
        q_(ops::template allocate_zeroed<float>(exec, plan_.factor_elements(factor::q))),
        q_start_(ops::template allocate_zeroed<float>(exec, plan_.factor_elements(factor::q))),
        flags_(ops::template allocate_zeroed<std::uint32_t>(exec, 2)) {}

  const powersgd_params& params() const noexcept { return params_; }
  const powersgd_plan& plan() const noexcept { return plan_; }
  std::size_t size() const noexcept { return plan_.size(); }

  /// The frame of a step's P or Q payload.
  frame frame_of(factor f) const {
    return frame{f, static_cast<std::uint32_t>(params_.rank), static_cast<std::uint32_t>(plan_.matrices()),
                 plan_.factor_elements(f)};
  }
  std::size_t payload_bytes(factor f) const { return static_cast<std::size_t>(frame_of(f).total_bytes()); }

  /// The summable part of a P or Q payload: its values, plan().factor_elements(f) floats, which
  /// the ranks sum (in the memory the payload is in).
  span<float> factors(span<std::byte> payload, factor f) const {
    const frame fr = frame_of(f);
    GRADZIP_EXPECTS(payload.size() >= fr.total_bytes(), "powersgd::factors: the payload holds ", payload.size(),
                    " bytes, the ", f == factor::p ? "P" : "Q", " frame ", fr.total_bytes());
    expect_aligned(payload.data(), "powersgd::factors");
    return span<float>(reinterpret_cast<float*>(payload.data() + fr.values_offset()), fr.elements);
  }

  /// Step 1: M <- grad's compressed tensors (+ e), P <- M Q, written as the P payload into `out`
  /// (payload_bytes(factor::p) bytes). Returns its size. `ctx` keys the random Q (its step is
  /// used when a fresh Q is drawn: the first step, or every step without warm start).
  std::size_t compress_p(Exec& exec, span<const T> grad, span<std::byte> out, quantize::compress_context ctx = {}) {
    GRADZIP_EXPECTS(grad.size() == plan_.size(), "powersgd::compress_p: gradient has ", grad.size(),
                    " elements, the bucket ", plan_.size());
    const frame fr = frame_of(factor::p);
    GRADZIP_EXPECTS(out.size() >= fr.total_bytes(), "powersgd::compress_p: the output holds ", out.size(),
                    " bytes, the P payload needs ", fr.total_bytes());
    expect_aligned(out.data(), "powersgd::compress_p");
    quantize::check_context(ctx, "powersgd::compress_p");
    auto* bytes = reinterpret_cast<std::uint8_t*>(out.data());
    backend::write_frame(exec, bytes, fr);
    float* p_out = reinterpret_cast<float*>(bytes + fr.values_offset());
    span<float> q_start = ops::view(q_start_);
    backend::start_q(exec, q_start.data(), params_.warm_start ? ops::view(q_).data() : nullptr, flags(),
                     q_start.size(), params_.seed, static_cast<std::uint32_t>(ctx.step),
                     static_cast<std::uint32_t>(ctx.tensor_id));
    const float* residual = params_.error_feedback ? ops::view(residual_).data() : nullptr;
    for (const tensor_plan& t : plan_.tensors()) {
      if (!t.compressed()) continue;
      float* m = ops::view(m_).data() + t.m_offset;
      backend::load(exec, grad.data() + t.offset, residual ? residual + t.m_offset : nullptr, m, t.size());
      float* q = q_start.data() + t.q_offset;
      backend::orthogonalize(exec, q, t.cols, t.rank, params_.epsilon, nullptr);
      backend::project(exec, m, t.rows, t.cols, q, t.rank, p_out + t.p_offset);
    }
    phase_ = phase::p_sent;
    return static_cast<std::size_t>(fr.total_bytes());
  }

  /// Step 2: `p_sum` is the P payload with its factors summed over the ranks. P <- its
  /// orthogonalization, Q <- M^T P, written as the Q payload into `out`. Returns its size. A
  /// payload whose frame is not this bucket's P frame throws format_error (on CUDA: at the
  /// next exec.check(), and nothing is computed: start the step over from compress_p).
  std::size_t compress_q(Exec& exec, span<const std::byte> p_sum, span<std::byte> out) {
    GRADZIP_EXPECTS(phase_ != phase::idle, "powersgd::compress_q: no compress_p since the last decompress");
    const frame fp = frame_of(factor::p), fq = frame_of(factor::q);
    GRADZIP_EXPECTS(out.size() >= fq.total_bytes(), "powersgd::compress_q: the output holds ", out.size(),
                    " bytes, the Q payload needs ", fq.total_bytes());
    expect_aligned(out.data(), "powersgd::compress_q");
    if constexpr (!std::is_same_v<Exec, host>) expect_aligned(p_sum.data(), "powersgd::compress_q (P payload)");
    const wire::status* st = backend::check_frame(exec, p_sum, fp, "powersgd::compress_q (P payload)");
    auto* bytes = reinterpret_cast<std::uint8_t*>(out.data());
    backend::write_frame(exec, bytes, fq);
    const float* sum = reinterpret_cast<const float*>(p_sum.data() + fp.values_offset());
    float* q_out = reinterpret_cast<float*>(bytes + fq.values_offset());
    span<float> p = ops::view(p_);
    backend::take_p(exec, sum, p.data(), p.size(), flags(), st);
    for (const tensor_plan& t : plan_.tensors()) {
      if (!t.compressed()) continue;
      backend::orthogonalize(exec, p.data() + t.p_offset, t.rows, t.rank, params_.epsilon, st);
      backend::project_transposed(exec, ops::view(m_).data() + t.m_offset, t.rows, t.cols, p.data() + t.p_offset,
                                  t.rank, q_out + t.q_offset, st);
    }
    phase_ = phase::q_sent;
    return static_cast<std::size_t>(fq.total_bytes());
  }

  /// Step 3: `q_sum` is the Q payload with its factors summed over `ranks` ranks. Q <- Q / ranks
  /// (kept for the warm start), each compressed tensor of `grad` <- P Q^T, and e <- M - P Q^T.
  /// The uncompressed tensors of `grad` are left as they are. A bad frame throws format_error
  /// and changes nothing (on CUDA: at the next exec.check(); start the step over from
  /// compress_p).
  void decompress(Exec& exec, span<const std::byte> q_sum, int ranks, span<T> grad) {
    GRADZIP_EXPECTS(phase_ == phase::q_sent, "powersgd::decompress: no compress_q since the last compress_p");
    GRADZIP_EXPECTS(ranks >= 1, "powersgd::decompress: ranks must be >= 1, got ", ranks);
    GRADZIP_EXPECTS(grad.size() == plan_.size(), "powersgd::decompress: gradient has ", grad.size(),
                    " elements, the bucket ", plan_.size());
    const frame fq = frame_of(factor::q);
    if constexpr (!std::is_same_v<Exec, host>) expect_aligned(q_sum.data(), "powersgd::decompress (Q payload)");
    const wire::status* st = backend::check_frame(exec, q_sum, fq, "powersgd::decompress (Q payload)");
    const float* sum = reinterpret_cast<const float*>(q_sum.data() + fq.values_offset());
    span<float> q = ops::view(q_);
    backend::average(exec, sum, q.data(), flags(), q.size(), static_cast<float>(ranks), st);
    float* residual = params_.error_feedback ? ops::view(residual_).data() : nullptr;
    for (const tensor_plan& t : plan_.tensors()) {
      if (!t.compressed()) continue;
      backend::reconstruct(exec, ops::view(p_).data() + t.p_offset, q.data() + t.q_offset, t.rows, t.cols, t.rank,
                           ops::view(m_).data() + t.m_offset, residual ? residual + t.m_offset : nullptr,
                           grad.data() + t.offset, st);
    }
    phase_ = phase::idle;
  }

  /// The state, for checkpoints: the residual (with error feedback), then the warm-start Q
  /// (once a step has completed with warm start on), each a dense-state payload of floats.
  /// Synchronous.
  std::vector<std::byte> save(Exec& exec) const {
    std::vector<std::byte> bytes;
    if (params_.error_feedback) {
      bytes = feedback::detail::save_dense_state<float>(exec, residual_, plan_.compressed_elements());
    }
    if (params_.warm_start && q_valid(exec)) {
      const auto q = feedback::detail::save_dense_state<float>(exec, q_, plan_.factor_elements(factor::q));
      bytes.insert(bytes.end(), q.begin(), q.end());
    }
    return bytes;
  }

  /// Restores what `save` wrote (for the same shapes and parameters); everything is validated
  /// before anything changes. A step in flight is dropped. Synchronous.
  void restore(Exec& exec, span<const std::byte> bytes) {
    const char* what = "powersgd::restore";
    span<const std::byte> residual, q;
    if (params_.error_feedback) {
      wire::header h;
      wire::throw_if_failed(wire::parse_header(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size(), h),
                            what);
      residual = bytes.subspan(0, h.total_bytes);
      feedback::detail::check_dense_state<float>(residual, plan_.compressed_elements(), what);
      bytes = bytes.subspan(h.total_bytes, bytes.size() - h.total_bytes);
    }
    if (!bytes.empty() && !params_.warm_start) {  // nothing may follow the residual
      wire::throw_if_failed(wire::fail(wire::format_errc::trailing_bytes, bytes.size(), 0), what);
    }
    if (!bytes.empty()) {
      feedback::detail::check_dense_state<float>(bytes, plan_.factor_elements(factor::q), what);  // and nothing after
      q = bytes;
    }
    if (params_.error_feedback) {
      feedback::detail::restore_dense_state<float>(exec, residual, residual_, plan_.compressed_elements(), what);
    }
    if (!q.empty()) feedback::detail::restore_dense_state<float>(exec, q, q_, plan_.factor_elements(factor::q), what);
    const std::uint32_t f[2] = {q.empty() ? 0u : 1u, 0u};
    ops::copy_from_host(exec, f, flags_);
    phase_ = phase::idle;
  }

 private:
  /// Two flags in the executor's memory, so that device work can consult them without a
  /// synchronization: [0] q_ holds a completed step's Q (set by averaging a well-formed Q
  /// payload); [1] this step's P was accepted (cleared by compress_p, set by compress_q when the
  /// P payload passed its check, required by decompress).
  std::uint32_t* flags() { return ops::view(flags_).data(); }
  bool q_valid(Exec& exec) const {
    std::uint32_t f[2] = {0, 0};
    ops::copy_to_host(exec, flags_, f);
    return f[0] != 0;
  }

  enum class phase { idle, p_sent, q_sent };

  /// Payloads this object writes hold floats that collectives sum in place: 4-byte aligned. On
  /// the host, received payloads may sit anywhere (they are read with memcpy); the device reads
  /// them as floats, so there they must be aligned too.
  static void expect_aligned(const void* payload, const char* what) {
    GRADZIP_EXPECTS(reinterpret_cast<std::uintptr_t>(payload) % alignof(float) == 0, what,
                    ": the payload buffer must be 4-byte aligned (its factors are floats), it starts at ", payload);
  }

  powersgd_params params_;
  powersgd_plan plan_;
  typename ops::template buffer<float> residual_;  // e, per compressed tensor (empty without error feedback)
  typename ops::template buffer<float> m_;         // M = grad + e, during a step
  typename ops::template buffer<float> p_;         // the orthogonalized P sum, during a step
  typename ops::template buffer<float> q_;         // the last averaged Q: the warm start
  typename ops::template buffer<float> q_start_;   // this step's orthogonalized starting Q
  typename ops::template buffer<std::uint32_t> flags_;  // see flags()
  phase phase_ = phase::idle;
};

}  // namespace gradzip::lowrank
