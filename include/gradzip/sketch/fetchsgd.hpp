/**
 * @file fetchsgd.hpp
 * @brief `sketch::fetchsgd`: momentum and error accumulation in sketch space (FetchSGD,
 * Rothchild et al., ICML 2020), a stateful wrapper around `count_sketch` with save and restore.
 *
 * Every worker sends the sketch of its gradient (`count_sketch::compress`); the sketches are
 * summed (an allreduce of the tables: sketches are linear). Then, on the sum S, identically on
 * every rank (or once, on a parameter server):
 *
 *     S_u <- rho S_u + scale S          momentum, in sketch space
 *     S_e <- S_e + lr S_u               error accumulation, in sketch space
 *     delta <- top-k(unsketch(S_e))     the update, k median-of-rows estimates
 *     S_u, S_e <- 0 at every cell an element of delta maps to
 *
 * and the model takes w <- w - delta. The state is two r x c tables, not two n-vectors: that is
 * FetchSGD's point, since momentum and error feedback on the workers would need the unsketched
 * dense vectors. The last line follows the authors' code (the cells of delta's coordinates are
 * zeroed in both tables; their comment says subtracting sketch(delta) from S_e diverged) rather
 * than the paper's S_e <- S_e - sketch(delta). The second communication round of the paper's
 * variant (fetching exact values of the k coordinates) is not provided.
 *
 * Deterministic: every step is a fixed-order function of the state and S, so ranks that apply
 * the same summed sketch keep identical states. `save` writes the state as a payload (codec id
 * 00 06 00 00 with three sections: the sketch's params, S_u, S_e) and `restore` validates it
 * fully against this configuration before touching the state. `fetchsgd<Exec>` keeps its state
 * in the executor's memory: on the host (the default, `fetchsgd fs{cs, n, k}`), or on the GPU
 * (`fetchsgd fs{cuda_exec, cs, n, k}`: every step stream-ordered, the summed sketch validated on
 * the device, failures reported by exec.check(); the same bytes as the host's). The momentum
 * and error updates are one fmaf each on every executor.
 *
 * @code
 * gradzip::sketch::count_sketch cs{5, n / 50, seed};
 * gradzip::sketch::fetchsgd fs{cs, n, n / 100, 0.9f};
 * std::vector<std::byte> table(cs.payload_bytes(n));
 * cs.compress(exec, gradzip::span<const float>(grad), table);   // then allreduce (sum) the table
 * std::vector<std::byte> delta(fs.max_update_bytes());
 * delta.resize(fs.step(exec, table, delta, 1.0f / workers, lr));
 * gradzip::codec<gradzip::sparsify::topk>{gradzip::sparsify::topk::count(n / 100)}.decompress_add(
 *     exec, gradzip::span<const std::byte>(delta), gradzip::span<float>(weights), -1.0f);
 * @endcode
 */
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "gradzip/codec.hpp"
#include "gradzip/core/error.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/detail/host/parallel.hpp"
#include "gradzip/feedback/dense_state.hpp"
#include "gradzip/sketch/count_sketch.hpp"
#include "gradzip/wire/reader.hpp"
#include "gradzip/wire/writer.hpp"

namespace gradzip::detail {
/// Executors other than the host's (detail/cuda/fetchsgd.cuh for `cuda`).
template <class Exec>
struct fetchsgd_backend;
}  // namespace gradzip::detail

namespace gradzip::sketch {

template <class Exec = host>
class fetchsgd {
  using ops = gradzip::detail::executor_ops<Exec>;

 public:
  /// Zero state for a tensor of n elements, in exec's memory; k coordinates per update
  /// (1 <= k <= n), momentum in [0, 1).
  fetchsgd(Exec& exec, count_sketch cs, std::uint64_t n, std::uint64_t k, float momentum = 0.9f)
      : cs_(checked(cs, n, k, momentum)),
        n_(n),
        k_(k),
        momentum_(momentum),
        velocity_(ops::template allocate_zeroed<float>(exec, cells())),
        error_sketch_(ops::template allocate_zeroed<std::byte>(exec, cs.payload_bytes(n))),
        delta_(ops::template allocate_zeroed<float>(exec, n)) {
    const std::vector<std::byte> zero = zero_sketch();
    ops::copy_from_host(exec, zero.data(), error_sketch_);
  }
  /// On the host no executor is needed to set up.
  template <class E = Exec, std::enable_if_t<std::is_same_v<E, host>, int> = 0>
  fetchsgd(count_sketch cs, std::uint64_t n, std::uint64_t k, float momentum = 0.9f)
      : fetchsgd(setup_executor(), cs, n, k, momentum) {}

  const count_sketch& sketch() const noexcept { return cs_; }
  std::uint64_t size() const noexcept { return n_; }
  std::uint64_t k() const noexcept { return k_; }
  std::size_t max_update_bytes() const { return cs_.max_unsketch_bytes(n_, k_); }

  /// The accumulated error S_e as a sketch payload, and the momentum S_u (rows x columns
  /// floats), in the executor's memory (read-only; for inspection and tests).
  span<const std::byte> error_sketch() const { return span<const std::byte>(error_sketch_.data(), error_sketch_.size()); }
  span<const float> velocity() const { return span<const float>(velocity_.data(), velocity_.size()); }

  /// The per-cell update, S_u <- rho S_u + scale S then S_e <- S_e + lr S_u, with one fmaf each;
  /// a NaN as count_sketch::poisoned_cell (an x86 fmaf keeps an operand's NaN bits, a GPU's makes
  /// its own: the saved states and the update payloads would differ).
  struct cell_state {
    float velocity, error;
  };
  GRADZIP_HOST_DEVICE static cell_state accumulate(cell_state c, float incoming, float momentum, float scale, float lr) {
    const float u = count_sketch::canonical(fmaf(momentum, c.velocity, scale * incoming));
    return {u, count_sketch::canonical(fmaf(lr, u, c.error))};
  }

  /// One step on `summed` (the sum of the workers' sketches, validated against this
  /// configuration and n): writes delta, a codec<sparsify::topk> payload of k elements, into
  /// `update` (max_update_bytes) and returns its size. `scale` multiplies the sum (1 / workers
  /// for the mean), `lr` the momentum added to the error.
  std::size_t step(Exec& exec, span<const std::byte> summed, span<std::byte> update, float scale = 1.0f,
                   float lr = 1.0f) {
    // Checked before the state changes (the summed sketch is validated before any cell is).
    feedback::detail::expect_output(update, max_update_bytes(), "fetchsgd::step");
    if constexpr (std::is_same_v<Exec, host>) {
      const std::uint8_t* incoming = cs_.table_of(summed, &n_);
      std::uint8_t* error = error_table();
      each_cell(exec, [&](std::uint64_t j) {
        const cell_state c = accumulate({velocity_[j], count_sketch::load_cell(error, j)},
                                        count_sketch::load_cell(incoming, j), momentum_, scale, lr);
        velocity_[j] = c.velocity;
        count_sketch::store_cell(error, j, c.error);
      });
    } else {
      gradzip::detail::fetchsgd_backend<Exec>::accumulate(exec, cs_, n_, summed, ops::view(velocity_), error_table(),
                                                          momentum_, scale, lr);
    }
    const std::size_t bytes = cs_.unsketch(exec, error_sketch(), n_, k_, update);
    forget_sent(exec, span<const std::byte>(update.data(), bytes));
    return bytes;
  }

  /// The state (S_u and S_e) as a payload, for checkpoints. Synchronous.
  std::vector<std::byte> save(Exec& exec) const {
    const wire::payload_layout l = state_layout();
    std::vector<std::byte> bytes(l.total_bytes());
    auto* base = reinterpret_cast<std::uint8_t*>(bytes.data());
    wire::write_header(base, l, element_type::f32, count_sketch::id, n_);
    wire::zero_section_padding(base, l);
    count_sketch::write_params(base + l.at(0).offset, cs_.rows(), cs_.columns(), cs_.seed());
    ops::copy_to_host(exec, velocity_, reinterpret_cast<float*>(base + l.at(1).offset));  // sections are aligned
    std::vector<std::byte> error(error_sketch_.size());
    ops::copy_to_host(exec, error_sketch_, error.data());
    std::memcpy(base + l.at(2).offset, error.data() + cs_.layout().at(1).offset, cells() * sizeof(float));
    return bytes;
  }

  /// Restores a state saved by `save` for this configuration and n (validated before any
  /// change). Synchronous.
  void restore(Exec& exec, span<const std::byte> bytes) {
    constexpr const char* what = "fetchsgd::restore";
    const wire::header h = wire::read_header(bytes, what);
    wire::expect_whole(h, bytes, what);
    const wire::tag tags[3] = {wire::tag::params, wire::tag::values, wire::tag::values};
    wire::throw_if_failed(wire::expect_frame(h, count_sketch::id.packed(), tags, 3, count_sketch::params_bytes), what);
    if (h.element_count != n_) wire::throw_if_failed(wire::fail(wire::format_errc::size_mismatch, h.element_count, n_), what);
    if (h.type != element_type::f32) {  // the tables are fp32 cells
      wire::throw_if_failed(wire::fail(wire::format_errc::element_type_mismatch, static_cast<std::uint64_t>(h.type),
                                       static_cast<std::uint64_t>(element_type::f32)),
                            what);
    }
    const wire::payload_layout l = state_layout();
    for (int s = 1; s < 3; ++s) {
      if (h.sections[s].size != l.at(s).size) {
        wire::throw_if_failed(wire::fail(wire::format_errc::bad_section_size, static_cast<std::uint64_t>(s),
                                         h.sections[s].size, l.at(s).size),
                              what);
      }
    }
    const auto* base = reinterpret_cast<const std::uint8_t*>(bytes.data());
    std::uint8_t params[count_sketch::params_bytes];
    count_sketch::write_params(params, cs_.rows(), cs_.columns(), cs_.seed());
    for (std::uint64_t i = 0; i < count_sketch::params_bytes; ++i) {  // the first byte that differs
      if (base[h.sections[0].offset + i] != params[i]) {
        wire::throw_if_failed(wire::fail(wire::format_errc::bad_params, h.sections[0].offset + i,
                                         base[h.sections[0].offset + i], params[i]),
                              what);
      }
    }
    // The caller's bytes may sit at any address: stage both tables on the host.
    std::vector<std::byte> error = zero_sketch();
    auto* frame = reinterpret_cast<std::uint8_t*>(error.data());
    std::vector<float> velocity(cells());
    std::memcpy(velocity.data(), base + h.sections[1].offset, cells() * sizeof(float));
    std::memcpy(frame + cs_.layout().at(1).offset, base + h.sections[2].offset, cells() * sizeof(float));
    ops::copy_from_host(exec, velocity.data(), velocity_);
    ops::copy_from_host(exec, error.data(), error_sketch_);
  }

 private:
  static count_sketch checked(const count_sketch& cs, std::uint64_t n, std::uint64_t k, float momentum) {
    GRADZIP_EXPECTS(n <= count_sketch::max_unsketch_elements, "fetchsgd: n = ", n, " exceeds ",
                    count_sketch::max_unsketch_elements, " elements");
    GRADZIP_EXPECTS(k >= 1 && k <= n, "fetchsgd: k must be in [1, n = ", n, "], got ", k);
    GRADZIP_EXPECTS(momentum >= 0.0f && momentum < 1.0f, "fetchsgd: momentum must be in [0, 1), got ", momentum);
    return cs;
  }
  /// The host constructor's executor: setting up only allocates and copies, with no scratch.
  static host& setup_executor() {
    static host serial(1);
    return serial;
  }

  std::uint64_t cells() const { return static_cast<std::uint64_t>(cs_.rows()) * cs_.columns(); }

  /// The sketch of n zeros (frame, params, zero table), built on the host.
  std::vector<std::byte> zero_sketch() const {
    std::vector<std::byte> bytes(cs_.payload_bytes(n_));
    count_sketch::write_frame(reinterpret_cast<std::uint8_t*>(bytes.data()), n_, cs_.rows(), cs_.columns(), cs_.seed());
    return bytes;
  }

  /// S_e's table inside its own sketch payload (at the offset of cs_'s layout: the payload is
  /// written by zero_sketch, so nothing needs parsing).
  std::uint8_t* error_table() { return reinterpret_cast<std::uint8_t*>(error_sketch_.data()) + cs_.layout().at(1).offset; }

  wire::payload_layout state_layout() const {
    wire::payload_layout l;
    l.add(wire::tag::params, count_sketch::params_bytes);
    l.add(wire::tag::values, cells() * sizeof(float));
    l.add(wire::tag::values, cells() * sizeof(float));
    return l;
  }

  /// Zeroes S_u and S_e at every cell a coordinate of delta maps to (delta decoded densely:
  /// the k coordinates in index order, whatever the top-k payload's index encoding).
  void forget_sent(Exec& exec, span<const std::byte> delta_bytes) {
    const codec<sparsify::topk> top{sparsify::topk::count(k_)};
    const span<float> delta = ops::view(delta_);
    top.decompress(exec, delta_bytes, delta);
    if constexpr (std::is_same_v<Exec, host>) {
      std::uint8_t* error = error_table();
      // Serial in i: two coordinates may share a cell, and a zero is the same whoever writes
      // it, but a data race is undefined behaviour whatever it writes.
      for (std::uint64_t i = 0; i < n_; ++i) {
        if (delta[i] == 0.0f) continue;
        for (std::uint32_t r = 0; r < cs_.rows(); ++r) {
          const std::uint64_t j = cs_.cell_of(r, i);
          velocity_[j] = 0.0f;
          count_sketch::store_cell(error, j, 0.0f);
        }
      }
    } else {
      gradzip::detail::fetchsgd_backend<Exec>::forget_sent(exec, cs_, span<const float>(delta), ops::view(velocity_),
                                                           error_table());
    }
  }

  template <class F>
  void each_cell(host& exec, F f) const {
    const std::size_t chunks = gradzip::detail::chunk_count(exec, cells());
    gradzip::detail::for_each_chunk(exec, chunks, [&](std::size_t c) {
      const auto r = gradzip::detail::chunk_of(cells(), chunks, c);
      for (std::uint64_t j = r.begin; j < r.end; ++j) f(j);
    });
  }

  count_sketch cs_;
  std::uint64_t n_;
  std::uint64_t k_;
  float momentum_;
  typename ops::template buffer<float> velocity_;           // S_u
  typename ops::template buffer<std::byte> error_sketch_;   // S_e, as a sketch payload (unsketch reads it)
  typename ops::template buffer<float> delta_;              // delta, decoded densely
};

}  // namespace gradzip::sketch
