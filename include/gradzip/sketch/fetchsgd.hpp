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
 * fully against this configuration before touching the state. Host executor.
 *
 * @code
 * gradzip::sketch::count_sketch cs{5, n / 50, seed};
 * gradzip::sketch::fetchsgd fs{cs, n, n / 100, 0.9f};
 * cs.compress(exec, grad, table);                        // then allreduce (sum) the table
 * std::vector<std::byte> delta(fs.max_update_bytes());
 * delta.resize(fs.step(exec, table, delta, 1.0f / workers, lr));
 * codec<sparsify::topk>{sparsify::topk::count(n / 100)}.decompress_add(exec, delta, weights, -1.0f);
 * @endcode
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gradzip/codec.hpp"
#include "gradzip/core/error.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/detail/host/parallel.hpp"
#include "gradzip/sketch/count_sketch.hpp"
#include "gradzip/wire/reader.hpp"
#include "gradzip/wire/writer.hpp"

namespace gradzip::sketch {

class fetchsgd {
 public:
  /// Zero state for a tensor of n elements; k coordinates per update (1 <= k <= n).
  fetchsgd(count_sketch cs, std::uint64_t n, std::uint64_t k, float momentum = 0.9f)
      : cs_(cs), n_(n), k_(k), momentum_(momentum), velocity_(cells(), 0.0f), error_sketch_(cs.payload_bytes(n)),
        delta_(n, 0.0f) {
    GRADZIP_EXPECTS(k >= 1 && k <= n, "fetchsgd: k must be in [1, n = ", n, "], got ", k);
    GRADZIP_EXPECTS(momentum >= 0.0f && momentum < 1.0f, "fetchsgd: momentum must be in [0, 1), got ", momentum);
    host one(1);
    cs_.compress(one, span<const float>(delta_), span<std::byte>(error_sketch_));  // a zero table
  }

  const count_sketch& sketch() const noexcept { return cs_; }
  std::uint64_t size() const noexcept { return n_; }
  std::uint64_t k() const noexcept { return k_; }
  std::size_t max_update_bytes() const { return cs_.max_unsketch_bytes(n_, k_); }

  /// The accumulated error S_e as a sketch payload (read-only; for inspection and tests).
  span<const std::byte> error_sketch() const { return span<const std::byte>(error_sketch_.data(), error_sketch_.size()); }
  span<const float> velocity() const { return span<const float>(velocity_.data(), velocity_.size()); }

  /// One step on `summed` (the sum of the workers' sketches, validated against this
  /// configuration and n): writes delta, a codec<sparsify::topk> payload of k elements, into
  /// `update` (max_update_bytes) and returns its size. `scale` multiplies the sum (1 / workers
  /// for the mean), `lr` the momentum added to the error.
  std::size_t step(host& exec, span<const std::byte> summed, span<std::byte> update, float scale = 1.0f,
                   float lr = 1.0f) {
    const std::uint8_t* incoming = cs_.table_of(summed, &n_);
    std::uint8_t* error = error_table();
    each_cell(exec, [&](std::uint64_t j) {
      const float u = momentum_ * velocity_[j] + scale * count_sketch::load_cell(incoming, j);
      velocity_[j] = u;
      count_sketch::store_cell(error, j, count_sketch::load_cell(error, j) + lr * u);
    });
    const std::size_t bytes = cs_.unsketch(exec, error_sketch(), k_, update);
    forget_sent(exec, span<const std::byte>(update.data(), bytes));
    return bytes;
  }

  /// The state (S_u and S_e) as a payload, for checkpoints.
  std::vector<std::byte> save(host& /*exec*/) const {
    const wire::payload_layout l = state_layout();
    std::vector<std::byte> bytes(l.total_bytes());
    auto* base = reinterpret_cast<std::uint8_t*>(bytes.data());
    wire::write_header(base, l, element_type::f32, count_sketch::id, n_);
    wire::zero_section_padding(base, l);
    std::memcpy(base + l.at(0).offset, sketch_params(), count_sketch::params_bytes);
    for (std::uint64_t j = 0; j < cells(); ++j) count_sketch::store_cell(base + l.at(1).offset, j, velocity_[j]);
    std::memcpy(base + l.at(2).offset, error_table(), cells() * sizeof(float));
    return bytes;
  }

  /// Restores a state saved by `save` for this configuration and n (validated before any change).
  void restore(host& /*exec*/, span<const std::byte> bytes) {
    constexpr const char* what = "fetchsgd::restore";
    const wire::header h = wire::read_header(bytes);
    const wire::tag tags[3] = {wire::tag::params, wire::tag::values, wire::tag::values};
    wire::throw_if_failed(wire::expect_frame(h, count_sketch::id.packed(), tags, 3, count_sketch::params_bytes), what);
    if (h.element_count != n_) wire::throw_if_failed(wire::fail(wire::format_errc::size_mismatch, h.element_count, n_), what);
    const wire::payload_layout l = state_layout();
    for (int s = 1; s < 3; ++s) {
      if (h.sections[s].size != l.at(s).size) {
        wire::throw_if_failed(wire::fail(wire::format_errc::bad_section_size, static_cast<std::uint64_t>(s),
                                         h.sections[s].size, l.at(s).size),
                              what);
      }
    }
    const auto* base = reinterpret_cast<const std::uint8_t*>(bytes.data());
    if (std::memcmp(base + h.sections[0].offset, sketch_params(), count_sketch::params_bytes) != 0) {
      wire::throw_if_failed(wire::fail(wire::format_errc::bad_params, 0, 0), what);
    }
    for (std::uint64_t j = 0; j < cells(); ++j) velocity_[j] = count_sketch::load_cell(base + h.sections[1].offset, j);
    std::memcpy(error_table(), base + h.sections[2].offset, cells() * sizeof(float));
  }

 private:
  std::uint64_t cells() const { return static_cast<std::uint64_t>(cs_.rows()) * cs_.columns(); }

  /// S_e's params and table inside its own sketch payload (written by cs_.compress: at the
  /// offsets of cs_'s layout, so nothing needs parsing).
  const std::uint8_t* sketch_params() const {
    return reinterpret_cast<const std::uint8_t*>(error_sketch_.data()) + cs_.layout().at(0).offset;
  }
  std::uint8_t* error_table() { return reinterpret_cast<std::uint8_t*>(error_sketch_.data()) + cs_.layout().at(1).offset; }
  const std::uint8_t* error_table() const {
    return reinterpret_cast<const std::uint8_t*>(error_sketch_.data()) + cs_.layout().at(1).offset;
  }

  wire::payload_layout state_layout() const {
    wire::payload_layout l;
    l.add(wire::tag::params, count_sketch::params_bytes);
    l.add(wire::tag::values, cells() * sizeof(float));
    l.add(wire::tag::values, cells() * sizeof(float));
    return l;
  }

  /// Zeroes S_u and S_e at every cell a coordinate of delta maps to (delta decoded densely:
  /// the k coordinates in index order, whatever the top-k payload's index encoding).
  void forget_sent(host& exec, span<const std::byte> delta) {
    const codec<sparsify::topk> top{sparsify::topk::count(k_)};
    top.decompress(exec, delta, span<float>(delta_));
    std::uint8_t* error = error_table();
    // Serial in i: two coordinates may share a cell, and a zero is the same whoever writes it,
    // but a data race is undefined behaviour whatever it writes.
    for (std::uint64_t i = 0; i < n_; ++i) {
      if (delta_[i] == 0.0f) continue;
      for (std::uint32_t r = 0; r < cs_.rows(); ++r) {
        const std::uint64_t j = cs_.cell_of(r, i);
        velocity_[j] = 0.0f;
        count_sketch::store_cell(error, j, 0.0f);
      }
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
  std::vector<float> velocity_;            // S_u
  std::vector<std::byte> error_sketch_;    // S_e, as a sketch payload (unsketch reads it directly)
  std::vector<float> delta_;               // delta, decoded densely (zeros at construction)
};

}  // namespace gradzip::sketch
