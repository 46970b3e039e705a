/**
 * @file count_sketch.hpp
 * @brief `sketch::count_sketch`: a rows x columns Count Sketch of a gradient (Charikar et al.
 * 2002; FetchSGD, Rothchild et al. 2020), mergeable by summing, unsketched to its heavy hitters.
 *
 * Row r adds s_r(i) x_i into column h_r(i) of its row, for every element i. The bucket h_r(i)
 * and the sign s_r(i) come from one 64-bit hash of (seed, r, i), computed on the fly: the high
 * bits pick the bucket (multiply-shift onto [0, columns)), bit 0 the sign. SplitMix64's
 * finalizer is not a proven 2- or 4-wise independent family, but it is a bijection with full
 * avalanche; tests/host/test_count_sketch.cpp checks the properties the estimator relies on
 * (linearity, unbiased estimates, recall of planted heavy hitters). Nothing is precomputed:
 * FetchSGD's reference code stores r x n hash tables (about 12 bytes per element per row).
 *
 * Sketches of the same (rows, columns, seed) and n sum element-wise to the sketch of the summed
 * gradients (`summable`: an allreduce of the table is the sketch of the sum; `merge` adds two on
 * the host). `estimate` gives every element's median-of-rows estimate; `unsketch` returns the k
 * largest estimates as a top-k payload (`codec<sparsify::topk>`), so any gradzip decoder applies
 * it. Each column is summed in increasing element order, so a sketch's bytes do not depend on
 * the thread count.
 *
 * Payload: codec id 00 06 00 00; params (u32 rows, u32 0, u64 columns, u64 seed), then the table
 * as rows x columns fp32, row-major. The header's element count is n. Host executor, and on
 * CUDA `compress`, `merge`, `estimate` and `unsketch` (detail/cuda/count_sketch.cuh: a stable
 * sort by column instead of float atomics, the host's bytes).
 *
 * @code
 * gradzip::sketch::count_sketch cs{5, n / 100, seed};
 * std::vector<std::byte> table(cs.payload_bytes(n));
 * cs.compress(exec, grad, table);                    // then allreduce the table, or merge
 * std::vector<std::byte> top(cs.max_unsketch_bytes(n, k));
 * top.resize(cs.unsketch(exec, table, k, top));      // a codec<sparsify::topk> payload
 * @endcode
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gradzip/codec.hpp"
#include "gradzip/core/error.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/detail/host/hash_avx2.hpp"
#include "gradzip/detail/host/parallel.hpp"
#include "gradzip/random/hash.hpp"
#include "gradzip/wire/reader.hpp"
#include "gradzip/wire/writer.hpp"

namespace gradzip::detail {
/// Executors other than the host's (detail/cuda/count_sketch.cuh for `cuda`).
template <class Exec>
struct count_sketch_backend;
}  // namespace gradzip::detail

namespace gradzip::sketch {

class count_sketch {
 public:
  static constexpr std::uint8_t structure_id = 6;
  static constexpr wire::codec_id id{0, structure_id, 0, 0};
  static constexpr bool summable = true;
  static constexpr std::uint32_t max_rows = 31;
  static constexpr std::uint64_t params_bytes = 24;

  count_sketch(std::uint32_t rows, std::uint64_t columns, std::uint64_t seed)
      : rows_(rows), columns_(columns), seed_(seed) {
    GRADZIP_EXPECTS(rows >= 1 && rows <= max_rows, "count_sketch: rows must be in [1, ", max_rows, "], got ", rows);
    GRADZIP_EXPECTS(columns >= 1 && columns <= (std::uint64_t{1} << 40), "count_sketch: columns must be in [1, 2^40], got ",
                    columns);
  }

  std::uint32_t rows() const noexcept { return rows_; }
  std::uint64_t columns() const noexcept { return columns_; }
  std::uint64_t seed() const noexcept { return seed_; }

  /// The hash of element i in row r: bucket from the high bits, sign from bit 0.
  GRADZIP_HOST_DEVICE static std::uint64_t hash_of(std::uint64_t seed, std::uint32_t row, std::uint64_t i) {
    return hash64(hash64(seed, row), i);
  }
  GRADZIP_HOST_DEVICE static std::uint64_t bucket_of(std::uint64_t hash, std::uint64_t columns) {
    return hash_to_range(hash, columns);
  }
  GRADZIP_HOST_DEVICE static float sign_of(std::uint64_t hash) { return (hash & 1) != 0 ? -1.0f : 1.0f; }
  /// sign_of(hash) * v as a flip of v's sign bit: compilers turn a multiply by +-1 into a branch
  /// between two constants, which mispredicts on every other element. Every executor uses it.
  GRADZIP_HOST_DEVICE static float apply_sign(float v, std::uint64_t hash) {
    const auto bits = gradzip::detail::bit_cast<std::uint32_t>(v) ^ (static_cast<std::uint32_t>(hash & 1) << 31);
    return gradzip::detail::bit_cast<float>(bits);
  }

  /// The payload layout for a sketch of n elements (its size does not depend on n).
  GRADZIP_HOST_DEVICE static wire::payload_layout layout_for(std::uint32_t rows, std::uint64_t columns) {
    wire::payload_layout l;
    l.add(wire::tag::params, params_bytes);
    l.add(wire::tag::values, static_cast<std::uint64_t>(rows) * columns * sizeof(float));
    return l;
  }
  wire::payload_layout layout() const { return layout_for(rows_, columns_); }

  /// Header, params and padding of a sketch of n elements (the table follows).
  GRADZIP_HOST_DEVICE static void write_frame(std::uint8_t* base, std::uint64_t n, std::uint32_t rows,
                                              std::uint64_t columns, std::uint64_t seed) {
    const wire::payload_layout l = layout_for(rows, columns);
    wire::write_header(base, l, element_type::f32, id, n);
    write_params(base + l.at(0).offset, rows, columns, seed);
    wire::zero_section_padding(base, l);
  }
  /// The params section's params_bytes: u32 rows, u32 0, u64 columns, u64 seed.
  GRADZIP_HOST_DEVICE static void write_params(std::uint8_t* params, std::uint32_t rows, std::uint64_t columns,
                                               std::uint64_t seed) {
    for (std::uint64_t b = 0; b < params_bytes; ++b) params[b] = 0;
    wire::detail::store_le(params, rows, 4);
    wire::detail::store_le(params + 8, columns, 8);
    wire::detail::store_le(params + 16, seed, 8);
  }

  /// Checks a parsed header against (rows, columns, seed) and, unless `n` is null, the element
  /// count; `table` receives the table's offset.
  GRADZIP_HOST_DEVICE static wire::status check_frame(const wire::header& h, const std::uint8_t* base,
                                                      const std::uint64_t* n, std::uint32_t rows, std::uint64_t columns,
                                                      std::uint64_t seed, std::uint64_t& table) {
    const wire::tag tags[2] = {wire::tag::params, wire::tag::values};
    const wire::status frame_ok = wire::expect_frame(h, id.packed(), tags, 2, params_bytes);
    if (!frame_ok.ok()) return frame_ok;
    if (h.type != element_type::f32) return wire::fail(wire::format_errc::bad_params, 0, static_cast<std::uint64_t>(h.type));
    const std::uint8_t* p = base + h.sections[0].offset;
    const wire::param_field fields[3] = {{0, 4, rows}, {8, 8, columns}, {16, 8, seed}};
    const wire::status params_ok = wire::expect_params(p, fields, 3);
    if (!params_ok.ok()) return params_ok;
    if (wire::detail::load_le(p + 4, 4) != 0) return wire::fail(wire::format_errc::nonzero_reserved, 4);
    const std::uint64_t table_bytes = static_cast<std::uint64_t>(rows) * columns * sizeof(float);
    if (h.sections[1].size != table_bytes) return wire::fail(wire::format_errc::bad_section_size, 1, h.sections[1].size, table_bytes);
    if (n != nullptr && h.element_count != *n) return wire::fail(wire::format_errc::size_mismatch, h.element_count, *n);
    table = h.sections[1].offset;
    return wire::status{};
  }
  std::size_t payload_bytes(std::size_t /*n*/) const { return layout().total_bytes(); }

  /// On another executor (CUDA: device buffers, asynchronous; bad sketches reach exec.check()).
  template <class T, class Exec, std::enable_if_t<!std::is_same_v<Exec, host>, int> = 0>
  std::size_t workspace_bytes(Exec& exec, std::size_t n) const {
    return gradzip::detail::count_sketch_backend<Exec>::template workspace_bytes<T>(*this, exec, n);
  }
  template <class Exec, class T, std::enable_if_t<!std::is_same_v<Exec, host>, int> = 0>
  std::size_t compress(Exec& exec, span<const T> x, span<std::byte> out) const {
    return gradzip::detail::count_sketch_backend<Exec>::compress(*this, exec, x, out);
  }
  template <class Exec, class T, std::enable_if_t<!std::is_same_v<Exec, host>, int> = 0>
  void estimate(Exec& exec, span<const std::byte> sketch, span<T> estimates) const {
    gradzip::detail::count_sketch_backend<Exec>::estimate(*this, exec, sketch, estimates);
  }
  template <class Exec, std::enable_if_t<!std::is_same_v<Exec, host>, int> = 0>
  void merge(Exec& exec, span<std::byte> into, span<const std::byte> other) const {
    gradzip::detail::count_sketch_backend<Exec>::merge(*this, exec, into, other);
  }
  /// On another executor n is an argument (the payload's copy lives in device memory) and is
  /// checked against the payload's on the device.
  template <class Exec, std::enable_if_t<!std::is_same_v<Exec, host>, int> = 0>
  std::size_t unsketch(Exec& exec, span<const std::byte> sketch, std::uint64_t n, std::uint64_t k,
                       span<std::byte> out) const {
    return gradzip::detail::count_sketch_backend<Exec>::unsketch(*this, exec, sketch, n, k, out);
  }

  /// Sketches x into `out` (payload_bytes bytes); returns the payload's size.
  template <class T>
  std::size_t compress(host& exec, span<const T> x, span<std::byte> out) const {
    const wire::payload_layout l = layout();
    GRADZIP_EXPECTS(out.size() >= l.total_bytes(), "count_sketch::compress: output holds ", out.size(),
                    " bytes, the sketch needs ", l.total_bytes());
    auto* base = reinterpret_cast<std::uint8_t*>(out.data());
    write_frame(base, x.size(), rows_, columns_, seed_);
    sketch_rows(exec, x, base + l.at(1).offset);
    return l.total_bytes();
  }

  /// into <- into + other: both sketches of this configuration and the same n (validated).
  void merge(host& exec, span<std::byte> into, span<const std::byte> other) const {
    const view a = parse(span<const std::byte>(into.data(), into.size()), nullptr);
    const view b = parse(other, nullptr);
    if (a.n != b.n) wire::throw_if_failed(wire::fail(wire::format_errc::size_mismatch, b.n, a.n), "count_sketch::merge");
    auto* to = const_cast<std::uint8_t*>(a.table);
    const std::uint64_t cells = static_cast<std::uint64_t>(rows_) * columns_;
    const std::size_t chunks = gradzip::detail::chunk_count(exec, cells);
    gradzip::detail::for_each_chunk(exec, chunks, [&](std::size_t c) {
      const auto r = gradzip::detail::chunk_of(cells, chunks, c);
      for (std::uint64_t j = r.begin; j < r.end; ++j) store_cell(to, j, load_cell(to, j) + load_cell(b.table, j));
    });
  }

  /// estimates[i] <- the median over rows of s_r(i) table[r][h_r(i)]; estimates.size() must be
  /// the sketch's n.
  template <class T>
  void estimate(host& exec, span<const std::byte> sketch, span<T> estimates) const {
    const std::uint64_t n = estimates.size();
    const view v = parse(sketch, &n);
    const std::size_t chunks = gradzip::detail::chunk_count(exec, n);
    gradzip::detail::for_each_chunk(exec, chunks, [&](std::size_t c) {
      const auto r = gradzip::detail::chunk_of(n, chunks, c);
      std::uint64_t i = r.begin;
      for (; i + lanes <= r.end; i += lanes) estimate_lanes_at(v.table, i, estimates.data() + i);
      float row_values[max_rows];
      for (; i < r.end; ++i) {
        for (std::uint32_t row = 0; row < rows_; ++row) {
          const std::uint64_t h = hash_of(seed_, row, i);
          row_values[row] = apply_sign(load_cell(v.table, row * columns_ + bucket_of(h, columns_)), h);
        }
        estimates[i] = from_double<T>(median(row_values, rows_));
      }
    });
  }

  /// The table of a validated sketch of this configuration (of n elements, if given): rows x
  /// columns little-endian fp32 cells, row-major, inside `sketch`.
  const std::uint8_t* table_of(span<const std::byte> sketch, const std::uint64_t* n = nullptr) const {
    return parse(sketch, n).table;
  }
  /// Cell j of a table (little-endian fp32, possibly unaligned: it lives in a payload).
  static float load_cell(const std::uint8_t* table, std::uint64_t j) {
    float v;
    std::memcpy(&v, table + 4 * j, 4);
    return v;
  }
  static void store_cell(std::uint8_t* table, std::uint64_t j, float v) { std::memcpy(table + 4 * j, &v, 4); }

  /// The cell (row x columns + column) that element i adds into in row r.
  std::uint64_t cell_of(std::uint32_t row, std::uint64_t i) const {
    return row * columns_ + bucket_of(hash_of(seed_, row, i), columns_);
  }

  /// Bytes `unsketch` may write for k of n elements (a codec<sparsify::topk> payload).
  std::size_t max_unsketch_bytes(std::size_t n, std::uint64_t k) const {
    return codec<sparsify::topk>{sparsify::topk::count(k)}.max_compressed_bytes<float>(n);
  }

  /// The k heavy hitters: the k largest |estimates| (top-k's rules) as a codec<sparsify::topk>
  /// payload of estimated values; returns its size. Scratch: n floats in `exec`.
  std::size_t unsketch(host& exec, span<const std::byte> sketch, std::uint64_t k, span<std::byte> out) const {
    return unsketch(exec, sketch, parse(sketch, nullptr).n, k, out);
  }
  /// The same for a sketch that must be of n elements (the form every executor has).
  std::size_t unsketch(host& exec, span<const std::byte> sketch, std::uint64_t n, std::uint64_t k,
                       span<std::byte> out) const {
    parse(sketch, &n);
    const codec<sparsify::topk> top{sparsify::topk::count(k)};
    // Scratch: top-k's own, then the n estimates (sized together: growing discards contents).
    const std::size_t at = gradzip::detail::scratch_aligned(top.workspace_bytes<float>(exec, n));
    auto* estimates = reinterpret_cast<float*>(exec.scratch(at + n * sizeof(float)) + at);
    estimate(exec, sketch, span<float>(estimates, n));
    return top.compress(exec, span<const float>(estimates, n), out);
  }

  /// Median of r values (the mean of the two middle ones for even r); sorts v. An odd-even
  /// transposition network of branch-free compare-exchanges, shared by every executor: a
  /// branchy sort mispredicts on every other comparison (an insertion sort made `estimate` cost
  /// 53 ns per element at r = 5), and the fixed sequence of selects gives the same result on
  /// the host, its vector lanes and the device, NaN included.
  GRADZIP_HOST_DEVICE static float median(float* v, std::uint32_t r) {
    transposition_sort<1>(v, r);
    return median_of_sorted(v, r);
  }
  /// Sorts each of the `Lanes` columns of v (r rows x Lanes, row-major) by the same network of
  /// compare-exchanges: the host runs 8 lanes at once, the device and the tail one.
  template <int Lanes>
  GRADZIP_HOST_DEVICE static void transposition_sort(float* v, std::uint32_t r) {
    for (std::uint32_t pass = 0; pass < r; ++pass) {
      for (std::uint32_t j = pass & 1; j + 1 < r; j += 2) {
        for (int l = 0; l < Lanes; ++l) compare_exchange(v[j * Lanes + l], v[(j + 1) * Lanes + l]);
      }
    }
  }
  /// (a, b) <- (min, max) by one comparison, so that a NaN leaves the pair as it was.
  GRADZIP_HOST_DEVICE static void compare_exchange(float& a, float& b) {
    const bool swap = b < a;
    const float low = swap ? b : a, high = swap ? a : b;
    a = low;
    b = high;
  }
  GRADZIP_HOST_DEVICE static float median_of_sorted(const float* v, std::uint32_t r) {
    return r % 2 == 1 ? v[r / 2] : 0.5f * (v[r / 2 - 1] + v[r / 2]);
  }

 private:
  struct view {
    const std::uint8_t* table = nullptr;
    std::uint64_t n = 0;
  };

  /// Validates a sketch payload of this configuration (and of n elements, if given).
  view parse(span<const std::byte> bytes, const std::uint64_t* n) const {
    const wire::header h = wire::read_header(bytes);
    const auto* base = reinterpret_cast<const std::uint8_t*>(bytes.data());
    std::uint64_t table = 0;
    wire::throw_if_failed(check_frame(h, base, n, rows_, columns_, seed_, table), "count_sketch");
    return {base + table, h.element_count};
  }

  /// Rows in parallel, each into a float row in scratch (a row's columns are summed in
  /// increasing element order, whatever the thread count).
  template <class T>
  void sketch_rows(host& exec, span<const T> x, std::uint8_t* table) const {
    const int threads = std::max(1, std::min(exec.threads(), static_cast<int>(rows_)));
    auto* scratch = reinterpret_cast<float*>(exec.scratch(static_cast<std::size_t>(threads) * columns_ * sizeof(float)));
    gradzip::detail::for_each_chunk(exec, static_cast<std::size_t>(threads), [&](std::size_t t) {
      for (std::uint32_t row = static_cast<std::uint32_t>(t); row < rows_; row += static_cast<std::uint32_t>(threads)) {
        float* cells = scratch + t * columns_;
        std::fill(cells, cells + columns_, 0.0f);
        add_row(x.data(), x.size(), hash64(seed_, row), cells);
        std::memcpy(table + static_cast<std::uint64_t>(row) * columns_ * sizeof(float), cells, columns_ * sizeof(float));
      }
    });
  }

  /// Elements hashed (and estimated) together.
  static constexpr int lanes = 8;

  /// cells[h(i)] += s(i) x_i for i = 0, 1, ..., n - 1 of one row (hashed eight indices per
  /// step under AVX2: the same buckets and signs).
  template <class T>
  void add_row(const T* data, std::uint64_t n, std::uint64_t row_seed, float* cells) const {
    std::uint64_t i = 0;
#if defined(__AVX2__)
    if (columns_ < (std::uint64_t{1} << 32)) {
      const gradzip::detail::hash64_avx2 hasher(row_seed, columns_);
      __m256i index = _mm256_setr_epi64x(0, 1, 2, 3);
      alignas(32) std::uint64_t hashes[lanes], buckets[lanes];
      for (; i + lanes <= n; i += lanes) {
        index = hash_8(hasher, index, hashes, buckets);
        for (int l = 0; l < lanes; ++l) cells[buckets[l]] += apply_sign(static_cast<float>(to_float(data[i + l])), hashes[l]);
      }
    }
#endif
    for (; i < n; ++i) {
      const std::uint64_t h = hash64(row_seed, i);
      cells[bucket_of(h, columns_)] += apply_sign(static_cast<float>(to_float(data[i])), h);
    }
  }

#if defined(__AVX2__)
  /// Hashes and buckets of the eight indices `index`, `index` + 4 (four lanes each) into aligned
  /// arrays; returns the next eight's first four.
  static __m256i hash_8(const gradzip::detail::hash64_avx2& hasher, __m256i index, std::uint64_t* hashes,
                        std::uint64_t* buckets) {
    const __m256i four = _mm256_set1_epi64x(4);
    const __m256i high = _mm256_add_epi64(index, four);
    const __m256i h0 = hasher.hash(index), h1 = hasher.hash(high);
    _mm256_store_si256(reinterpret_cast<__m256i*>(hashes), h0);
    _mm256_store_si256(reinterpret_cast<__m256i*>(hashes + 4), h1);
    _mm256_store_si256(reinterpret_cast<__m256i*>(buckets), hasher.to_range(h0));
    _mm256_store_si256(reinterpret_cast<__m256i*>(buckets + 4), hasher.to_range(h1));
    return _mm256_add_epi64(high, four);
  }
#endif

  /// Estimates of elements first .. first + 7: each row's eight cells side by side, then
  /// `median`'s network over the rows, all lanes at once (the compiler vectorizes across lanes).
  template <class T>
  void estimate_lanes_at(const std::uint8_t* table, std::uint64_t first, T* out) const {
    float values[max_rows][lanes];
    for (std::uint32_t row = 0; row < rows_; ++row) {
      const std::uint64_t row_seed = hash64(seed_, row);
      const std::uint8_t* cells = table + static_cast<std::uint64_t>(row) * columns_ * sizeof(float);
      alignas(32) std::uint64_t hashes[lanes], buckets[lanes];
      hash_lanes(row_seed, first, hashes, buckets);
      for (int l = 0; l < lanes; ++l) values[row][l] = apply_sign(load_cell(cells, buckets[l]), hashes[l]);
    }
    transposition_sort<lanes>(&values[0][0], rows_);
    for (int l = 0; l < lanes; ++l) {
      float sorted[max_rows];
      for (std::uint32_t row = 0; row < rows_; ++row) sorted[row] = values[row][l];
      out[l] = from_double<T>(median_of_sorted(sorted, rows_));
    }
  }

  /// The hashes and buckets of elements first .. first + 7 in one row.
  void hash_lanes(std::uint64_t row_seed, std::uint64_t first, std::uint64_t* hashes, std::uint64_t* buckets) const {
#if defined(__AVX2__)
    if (columns_ < (std::uint64_t{1} << 32)) {
      const auto start = static_cast<long long>(first);
      hash_8(gradzip::detail::hash64_avx2(row_seed, columns_), _mm256_setr_epi64x(start, start + 1, start + 2, start + 3),
             hashes, buckets);
      return;
    }
#endif
    for (int l = 0; l < lanes; ++l) {
      hashes[l] = hash64(row_seed, first + static_cast<std::uint64_t>(l));
      buckets[l] = bucket_of(hashes[l], columns_);
    }
  }

  std::uint32_t rows_;
  std::uint64_t columns_;
  std::uint64_t seed_;
};

}  // namespace gradzip::sketch
